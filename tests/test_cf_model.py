"""CF on your own interactions, then used: a CSV of string ids -> `cf train --save` ->
`CFModel.load` -> recommend / similar items / fold in a new user / `cf recommend`."""
import numpy as np
import pyarrow.parquet as pq
import pytest

from embcache.cf import CFModel
from embcache.cli import main
from embcache.cf.data.synthetic import power_law_interactions


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A CSV of string ids drawn from a power-law set, and the model trained on it."""
    d = tmp_path_factory.mktemp("cf")
    data = power_law_interactions(num_users=120, num_items=200, interactions=3000, communities=4, seed=3)
    users, items = data.train_pairs()
    csv = d / "clicks.csv"
    lines = ["customer,product,ts"] + [f"c-{u:03d},p{i},{t}" for t, (u, i) in enumerate(zip(users, items))]
    csv.write_text("\n".join(lines) + "\n")
    model = d / "model.npz"
    assert main(["cf", "train", "--data", str(csv), "--user-col", "customer", "--item-col", "product",
                 "--time-col", "ts", "--epochs", "3", "--no-progress", "--save", str(model)]) == 0
    return csv, model


def _brute(model, user):
    z = model.user_vectors(model.user_index([user]))[0]
    v = model.params.I / np.linalg.norm(model.params.I, axis=1, keepdims=True)
    return v @ z


def test_recommend_gives_your_ids_leaves_out_seen_items_and_ranks_by_cosine(trained):
    _, path = trained
    model = CFModel.load(path)
    assert model.user_ids.dtype.kind == "U" and model.user_ids[0] == "c-000"
    assert all(i.startswith("p") for i in model.item_ids)
    u = model.user_index(["c-007"])[0]
    seen = set(model.item_ids[model.train_indices[model.train_indptr[u]:model.train_indptr[u + 1]]])
    items, scores = model.recommend("c-007", k=10)
    assert not seen & set(items) and len(seen) > 0
    brute = _brute(model, "c-007")
    brute[model.item_index(sorted(seen))] = -np.inf
    best = np.argsort(-brute, kind="stable")[:10]
    assert list(items) == list(model.item_ids[best])
    np.testing.assert_allclose(scores, brute[best], rtol=1e-5)
    with_seen, _ = model.recommend("c-007", k=10, exclude_seen=False)
    assert list(with_seen) == list(model.item_ids[np.argsort(-_brute(model, "c-007"), kind="stable")[:10]])


def test_unknown_ids_are_named(trained):
    model = CFModel.load(trained[1])
    with pytest.raises(KeyError, match="'nobody'"):
        model.recommend(["c-001", "nobody"])


def test_similar_items_leave_out_the_item_and_rank_by_cosine(trained):
    model = CFModel.load(trained[1])
    items, scores = model.similar_items("p5", k=5)
    assert "p5" not in set(items) and list(scores) == sorted(scores, reverse=True)
    v = model.params.I / np.linalg.norm(model.params.I, axis=1, keepdims=True)
    cos = v @ v[model.item_index(["p5"])[0]]
    cos[model.item_index(["p5"])[0]] = -np.inf
    assert list(items) == list(model.item_ids[np.argsort(-cos, kind="stable")[:5]])


def test_a_folded_in_user_gets_what_a_trained_user_with_those_items_gets(trained):
    model = CFModel.load(trained[1])
    u = model.user_index(["c-010"])[0]
    theirs = model.item_ids[model.train_indices[model.train_indptr[u]:model.train_indptr[u + 1]]]
    before, _ = model.recommend("c-010", k=20)
    model.fold_in(theirs, user_id="newcomer")
    after, _ = model.recommend("newcomer", k=20)
    assert not set(after) & set(theirs)
    assert len(set(before) & set(after)) >= 10  # the same taste: measured 17 of 20 on MovieLens
    with pytest.raises(ValueError, match="already"):
        model.fold_in(theirs, user_id="newcomer")


def test_cf_recommend_writes_every_users_top_k(trained, tmp_path, capsys):
    _, path = trained
    out = tmp_path / "rec.parquet"
    assert main(["cf", "recommend", str(path), "--all", "--k", "4", "--out", str(out)]) == 0
    table = pq.read_table(out).to_pydict()
    model = CFModel.load(path)
    assert len(table["user"]) == 4 * model.num_users and table["rank"][:4] == [1, 2, 3, 4]
    first = [i for u, i in zip(table["user"], table["item"]) if u == "c-007"]
    assert first == list(model.recommend("c-007", k=4)[0])
    assert main(["cf", "recommend", str(path), "--users", "c-007", "--k", "2"]) == 0
    assert capsys.readouterr().out.splitlines()[-3:] == ["user,rank,item,score"] + [
        f"c-007,{r},{i},{s:.6f}" for r, (i, s) in enumerate(zip(*model.recommend("c-007", k=2)), 1)]


def test_a_model_saved_and_loaded_recommends_the_same(trained, tmp_path):
    model = CFModel.load(trained[1])
    again = CFModel.load(model.save(tmp_path / "copy.npz"))
    assert np.array_equal(again.recommend(["c-001", "c-002"], k=5)[0], model.recommend(["c-001", "c-002"], k=5)[0])


def test_a_damaged_or_foreign_file_is_refused_by_name(trained, tmp_path):
    broken = tmp_path / "broken.npz"
    broken.write_bytes(trained[1].read_bytes()[:500])
    with pytest.raises(ValueError, match="broken.npz"):
        CFModel.load(broken)
    assert main(["cf", "recommend", str(broken), "--users", "c-001"]) != 0


def test_bad_rows_stop_with_file_and_line_or_are_counted(tmp_path, capsys):
    csv = tmp_path / "bad.csv"
    csv.write_text("user_id,item_id,rating\nu1,a,5\nu2,,4\nu1,b,x\nu2,b,3\nu3,a,4\nu3,c,2\n")
    assert main(["cf", "train", "--data", str(csv), "--rating-col", "rating", "--epochs", "1", "--no-progress"]) != 0
    assert "bad.csv:3: empty 'item_id'" in capsys.readouterr().err
    assert main(["cf", "train", "--data", str(csv), "--rating-col", "rating", "--epochs", "1", "--no-progress",
                 "--skip-bad-lines"]) == 0
    out = capsys.readouterr()
    assert "skipped 2 malformed line(s)" in out.out + out.err


def test_faiss_asked_for_but_missing_is_one_line(monkeypatch):
    import sys

    from embcache.errors import UserFacingError
    from embcache.cf.evaluation import topk_backend

    monkeypatch.setitem(sys.modules, "faiss", None)  # as where faiss is not installed
    with pytest.raises(UserFacingError, match=r"--topk faiss needs faiss: pip install 'embcache\[faiss\]'"):
        topk_backend(np.zeros((3, 2), np.float32), "faiss")
    assert topk_backend(np.zeros((3, 2), np.float32), "auto") is not None  # auto needs none
