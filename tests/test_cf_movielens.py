"""On MovieLens-100k, HEAT and the PyTorch reference reach the same accuracy in the same
epochs, far above the popularity baseline; HEAT's runs kernel (a user's samples in runs)
keeps the accuracy of the per-sample kernel it replaced; negatives that are not the user's
own items beat negatives from all items."""
from __future__ import annotations

import dataclasses

import pytest

from cpu_kernels.model import CFConfig
from embcache.cf.data.ratings import load_ml100k
from embcache.cf import evaluation as metrics
from embcache.cf.trainer import CFTrainConfig, CFTrainer
from tests.offline_data import load_or_skip

EPOCHS = 10
# K=32 keeps the torch engine at ~2 s an epoch on 2 cores; default learning rates
CONFIG = dataclasses.replace(CFConfig(), negatives=32)


@pytest.fixture(scope="module")
def ml100k():
    return load_or_skip(load_ml100k)


@pytest.fixture(scope="module")
def metrics_of(ml100k) -> dict[str, dict]:
    """Recall@20 and NDCG@20 after EPOCHS epochs: torch, HEAT's runs kernel (the default),
    HEAT's per-sample kernel, and the runs kernel with negatives from all items. One thread each: HEAT is then reproducible, and torch's
    intra-op threads do not spin against other work on a busy machine (5x slower, seen)."""
    out = {}
    for name, settings in (("torch", {"engine": "torch"}), ("runs", {"engine": "heat"}),
                           ("sample", {"engine": "heat", "kernel": "sample"}),
                           ("runs, all items", {"engine": "heat", "negatives_from": "all"})):
        trainer = CFTrainer(CFTrainConfig.for_model(CONFIG, epochs=EPOCHS, eval_every=EPOCHS, progress=False,
                                                    threads=1, **settings), ml100k)
        trainer.fit()
        out[name] = trainer.history[-1]
    return out


def test_ml100k_split(ml100k):
    assert (ml100k.num_users, ml100k.num_items) == (943, 1682)
    assert ml100k.num_train + ml100k.num_test == 100_000
    assert ml100k.num_test == pytest.approx(20_000, rel=0.01)


def test_heat_matches_torch_and_beats_popularity(ml100k, metrics_of):
    heat, ref = metrics_of["runs"]["recall@20"], metrics_of["torch"]["recall@20"]
    u, v = metrics.popularity_scores(ml100k.train_indices, ml100k.num_users, ml100k.num_items)
    pop = metrics.evaluate(u, v, ml100k.train_indptr, ml100k.train_indices, ml100k.test_indptr,
                           ml100k.test_indices, cosine=False)["recall@20"]
    assert abs(heat - ref) <= 0.05 * ref, (heat, ref)
    assert heat > 1.4 * pop and ref > 1.4 * pop, (heat, ref, pop)


@pytest.mark.parametrize("metric", ["recall@20", "ndcg@20"])
def test_runs_kernel_keeps_the_accuracy_of_the_per_sample_kernel_and_of_torch(metrics_of, metric):
    """Issue 14's bound: within 2 % (relative) of the per-sample kernel, and no more than 2 %
    below torch (HEAT is usually above it)."""
    runs, sample, ref = (metrics_of[k][metric] for k in ("runs", "sample", "torch"))
    assert abs(runs - sample) <= 0.02 * sample, (runs, sample)
    assert runs >= 0.98 * ref, (runs, ref)


@pytest.mark.parametrize("metric", ["recall@20", "ndcg@20"])
def test_negatives_that_are_not_the_users_items_are_more_accurate(metrics_of, metric):
    """Issue 23: never pushing a user's own training items away is what lifted Recall@20 from
    ~0.306 to ~0.334 (NDCG@20 ~0.34 to ~0.40) at the defaults; at K=32 and 10 epochs the gap
    is smaller but must stay clear."""
    unseen, old = metrics_of["runs"][metric], metrics_of["runs, all items"][metric]
    assert unseen >= 1.03 * old, (unseen, old)
