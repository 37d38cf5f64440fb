"""Full-ranking Recall@k / NDCG@k against a direct numpy computation on a hand-built example."""
from __future__ import annotations

import numpy as np
import pytest

from embcache.cf.data.interactions import to_csr
from embcache.cf import evaluation as metrics


def _direct(scores: np.ndarray, train: dict, test: dict, k: int) -> tuple[float, float]:
    """The textbook definitions, one user at a time: mask train items, sort, count hits."""
    recalls, ndcgs = [], []
    for u, truth in test.items():
        if not truth:
            continue
        s = scores[u].astype(np.float64).copy()
        s[list(train.get(u, ()))] = -np.inf
        ranked = list(np.argsort(-s, kind="stable")[:k])
        hits = [1.0 if i in truth else 0.0 for i in ranked]
        recalls.append(sum(hits) / len(truth))
        dcg = sum(h / np.log2(r + 2) for r, h in enumerate(hits))
        idcg = sum(1 / np.log2(r + 2) for r in range(min(len(truth), k)))
        ndcgs.append(dcg / idcg)
    return float(np.mean(recalls)), float(np.mean(ndcgs))


def _csr(sets: dict, n: int):
    pairs = [(u, i) for u, items in sets.items() for i in items]
    users, items = (np.array(x, dtype=np.int64) for x in zip(*pairs))
    return to_csr(users, items, n)


# 5 users, 8 items. User 3 has no test items (not evaluated); user 4 has no training items.
TRAIN = {0: {0, 1}, 1: {2}, 2: {0, 5, 7}, 3: {1}}
TEST = {0: {2, 6}, 1: {0, 1, 3}, 2: {6}, 4: {4, 7}}


@pytest.fixture
def example():
    # distinct scores (no ties, so both back-ends must give the same ranking); the best-scored
    # items of users 0 and 2 are training items, which must not count
    rng = np.random.default_rng(7)
    user_vecs = rng.standard_normal((5, 4)).astype(np.float32)
    item_vecs = rng.standard_normal((8, 4)).astype(np.float32)
    item_vecs[0] = 3 * user_vecs[0]
    item_vecs[5] = 3 * user_vecs[2]
    for u, best in ((0, 0), (2, 5)):
        assert np.argmax(item_vecs @ user_vecs[u]) == best and best in TRAIN[u]
    return user_vecs, item_vecs


@pytest.mark.parametrize("backend", metrics.BACKENDS)
@pytest.mark.parametrize("cosine", [True, False])
def test_metrics_equal_a_direct_computation(example, backend, cosine):
    user_vecs, item_vecs = example
    u, v = user_vecs, item_vecs
    if cosine:
        u = u / np.linalg.norm(u, axis=1, keepdims=True)
        v = v / np.linalg.norm(v, axis=1, keepdims=True)
    scores = u @ v.T
    got = metrics.evaluate(user_vecs, item_vecs, *_csr(TRAIN, 5), *_csr(TEST, 5), ks=(1, 3, 20),
                           backend=backend, cosine=cosine, batch_size=2)
    assert got["users"] == 4
    for k in (1, 3, 20):
        recall, ndcg = _direct(scores, TRAIN, TEST, k)
        assert got[f"recall@{k}"] == pytest.approx(recall, abs=1e-12), k
        assert got[f"ndcg@{k}"] == pytest.approx(ndcg, abs=1e-12), k


def test_training_items_are_masked_and_values_by_hand():
    # one user, items scored 5 > 4 > 3 > 2 > 1 (item 0 best); item 0 is a training item
    user_vecs = np.ones((1, 1), np.float32)
    item_vecs = np.array([[5.0], [4.0], [3.0], [2.0], [1.0]], np.float32)
    train, test = _csr({0: {0}}, 1), _csr({0: {2, 4}}, 1)
    for backend in metrics.BACKENDS:
        got = metrics.evaluate(user_vecs, item_vecs, *train, *test, ks=(2, 3), backend=backend, cosine=False)
        # ranking without item 0: 1, 2, 3, 4 -> hits at ranks 2 and 4
        assert got["recall@2"] == pytest.approx(0.5)
        assert got["ndcg@2"] == pytest.approx((1 / np.log2(3)) / (1 + 1 / np.log2(3)))
        assert got["recall@3"] == pytest.approx(0.5)


def test_popularity_baseline_ranks_by_training_degree():
    train = _csr({0: {0}, 1: {0, 1}, 2: {0, 1, 2}}, 4)
    test = _csr({3: {1, 3}}, 4)
    u, v = metrics.popularity_scores(train[1], 4, 5)
    got = metrics.evaluate(u, v, *train, *test, ks=(1, 2), cosine=False)
    # item 0 (3 users) then item 1 (2 users): user 3's test item 1 is second
    assert got["recall@1"] == 0 and got["recall@2"] == pytest.approx(0.5)


def test_no_test_users_gives_none_not_zero_and_k_must_be_positive():
    train, empty = _csr({0: {0}}, 2), (np.zeros(3, dtype=np.int64), np.zeros(0, dtype=np.int64))
    u, v = np.ones((2, 2), np.float32), np.ones((4, 2), np.float32)
    got = metrics.evaluate(u, v, *train, *empty, ks=(1, 20))
    assert got == {"recall@1": None, "ndcg@1": None, "recall@20": None, "ndcg@20": None, "users": 0}
    for ks in ((0,), (20, -1), ()):
        with pytest.raises(ValueError, match="cut-off k must be >= 1"):
            metrics.evaluate(u, v, *train, *_csr({1: {2}}, 2), ks=ks)
