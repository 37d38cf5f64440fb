"""CF commands that used to succeed with a quiet surprise (issue 45): `recommend` past a
user's unseen items, an empty file or time, repeated rows merged unseen, `--save` over a
model, a many-line `repr`, and `embcache cf --help` silent about the user's own files."""
from __future__ import annotations

import logging

import numpy as np
import pytest

from cpu_kernels.model import CFConfig, CFParams
from embcache.cf.data.interactions import from_pairs
from embcache.cf.model import CFModel
from embcache.cli import main


@pytest.fixture
def small_model(tmp_path):
    """Ann has seen 3 of 5 items, Bob 1: a model of fresh rows (no training needed)."""
    data = from_pairs([0, 0, 0, 1], [0, 1, 2, 3], [], [], num_users=2, num_items=5)
    data.user_ids, data.item_ids = np.array(["ann", "bob"]), np.array(list("abcde"))
    params = CFParams.init(CFConfig(dim=8, history=4), 2, 5, data.train_indptr, data.train_indices)
    model = CFModel.from_training(params, data)
    return model, model.save(tmp_path / "model.npz")


def test_recommend_stops_at_the_unseen_items_and_says_so_once(small_model, caplog):
    model, _ = small_model
    with caplog.at_level(logging.WARNING, logger="embcache"):
        items, scores = model.recommend("ann", k=1000)
    assert sorted(items.tolist()) == ["d", "e"] and np.isfinite(scores).all()
    warned = [r.getMessage() for r in caplog.records]
    assert warned == ["k=1000 is more than the 2 item(s) user 'ann' has not seen: 2 returned per user"]
    items, scores = model.recommend(["ann", "bob"], k=50)  # the fewest unseen (ann's 2) for both
    assert items.shape == (2, 2) and np.isfinite(scores).all() and "a" not in items[0]
    items, scores = model.recommend("ann", k=4, exclude_seen=False)  # seen items asked for: all 4 scored
    assert len(items) == 4 and np.isfinite(scores).all()


def test_cf_recommend_k_beyond_the_unseen_items_gives_each_user_their_unseen_ones(small_model, capsys):
    _, path = small_model
    assert main(["cf", "recommend", str(path), "--all", "--k", "500"]) == 0
    out = capsys.readouterr()
    rows = [line.split(",") for line in out.out.splitlines()[1:]]
    assert sorted(r[2] for r in rows if r[0] == "ann") == ["d", "e"]
    assert sorted(r[2] for r in rows if r[0] == "bob") == ["a", "b", "c", "e"]
    assert "inf" not in out.out
    assert out.err.count("\n") == 1 and "--k 500 is more than the items 2 user(s) have not seen" in out.err
    assert main(["cf", "recommend", str(path), "--all", "--k", "2"]) == 0
    out = capsys.readouterr()
    assert len(out.out.splitlines()) == 1 + 4 and out.err == ""


def test_repr_of_a_model_is_one_line(small_model):
    text = repr(small_model[0])
    assert text == "CFModel(simplex, 2 users x 5 items, d=8, 4 training interactions, your ids)"


def _train(argv, capsys):
    rc = main(["cf", "train", "--no-progress", "--epochs", "0", "--negatives", "2", "--dim", "4", "--threads", "1",
               *map(str, argv)])
    out = capsys.readouterr()
    return rc, out.out, out.err.strip()


def test_an_empty_csv_is_named_as_empty(tmp_path, capsys):
    (tmp_path / "empty.csv").write_text("")
    rc, _, err = _train(["--data", tmp_path / "empty.csv", "--user-col", "user", "--item-col", "item"], capsys)
    assert rc == 1 and err.count("\n") == 0
    assert f"{tmp_path / 'empty.csv'}: the file is empty: expected a header naming the columns 'user', 'item'" in err


def test_an_empty_time_names_its_line(tmp_path, capsys):
    csv = tmp_path / "clicks.csv"
    csv.write_text("user,item,ts\nu1,a,1\nu1,b,\nu2,a,3\nu2,b,4\n")
    rc, _, err = _train(["--data", csv, "--user-col", "user", "--item-col", "item", "--time-col", "ts"], capsys)
    assert rc == 1 and err.count("\n") == 0 and f"{csv}:3: empty 'ts'" in err and "None" not in err


def test_repeated_interactions_are_counted_and_never_split_across_train_and_test(tmp_path, capsys):
    csv = tmp_path / "clicks.csv"
    rows = [(f"u{u}", f"i{(u + j) % 9}", t) for t, (u, j) in enumerate((u, j) for u in range(6) for j in range(5))]
    rows += [(u, i, 100 + t) for t, (u, i, _) in enumerate(rows[::3])]  # 10 repeats, later in time
    csv.write_text("user,item,ts\n" + "".join(f"{u},{i},{t}\n" for u, i, t in rows))
    rc, out, err = _train(["--data", csv, "--user-col", "user", "--item-col", "item", "--time-col", "ts"], capsys)
    assert rc == 0, err
    assert "30 train" not in out and "merged 10 repeated (user, item) row(s)" in out.splitlines()[0]
    from embcache.cf.data.sources import read_interactions

    data = read_interactions(str(csv), "time", columns={"user": "user", "item": "item", "time": "ts"})
    assert data.num_train + data.num_test == 30 and data.duplicates == 10
    for u in range(data.num_users):  # a repeat (later in time) does not put its pair in test too
        train = set(data.train_indices[data.train_indptr[u]:data.train_indptr[u + 1]])
        assert not train & set(data.test_indices[data.test_indptr[u]:data.test_indptr[u + 1]])


def test_train_save_refuses_to_replace_a_model_without_force(tmp_path, capsys):
    csv = tmp_path / "clicks.csv"
    csv.write_text("user,item\n" + "".join(f"u{u},i{(u * 3 + j) % 7}\n" for u in range(5) for j in range(4)))
    model = tmp_path / "model.npz"
    common = ["--data", csv, "--user-col", "user", "--item-col", "item", "--save", model]
    assert _train(common, capsys)[0] == 0
    before = model.read_bytes()
    rc, _, err = _train([*common, "--seed", "7"], capsys)
    assert rc == 1 and err.count("\n") == 0 and f"{model} already exists" in err and "--force" in err
    assert model.read_bytes() == before
    assert _train([*common, "--seed", "7", "--force"], capsys)[0] == 0
    assert model.read_bytes() != before


def test_cf_help_names_your_own_files(capsys):
    with pytest.raises(SystemExit):
        main(["cf", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "your own CSV, TSV or Parquet file" in text and "--user-col" in text
