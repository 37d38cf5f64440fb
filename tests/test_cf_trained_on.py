"""`cf evaluate` scores a model on the split it was trained on (issue 45): the model file
records its data, columns and split, evaluation defaults to them, a different split is
refused, and a model without the record is scored only on pairs it never trained on."""
from __future__ import annotations

import json

import numpy as np
import pytest

from embcache.cf.model import CFModel
from embcache.cli import main

FLAGS = ["--negatives", "4", "--dim", "8", "--threads", "1", "--no-progress"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """clicks.csv (string ids, a time column) and a model trained on it split by time,
    saved whole (.npz) and as embeddings (.parquet), with a checkpoint."""
    d = tmp_path_factory.mktemp("trained_on")
    rng = np.random.default_rng(0)
    rows = [(f"u{u}", f"i{rng.integers(0, 40)}", int(rng.integers(0, 10**6))) for u in range(60) for _ in range(12)]
    (d / "clicks.csv").write_text("user,item,ts\n" + "".join(f"{u},{i},{t}\n" for u, i, t in rows))
    data = ["--data", str(d / "clicks.csv"), "--user-col", "user", "--item-col", "item", "--time-col", "ts"]
    assert main(["cf", "train", *data, *FLAGS, "--epochs", "2", "--save", str(d / "model.npz"),
                 "--checkpoint-dir", str(d / "ck")]) == 0
    assert main(["cf", "train", *data, *FLAGS, "--epochs", "0", "--load", str(d / "model.npz"),
                 "--save", str(d / "emb.parquet")]) == 0
    return d, data


def _evaluate(argv, capsys):
    rc = main(["cf", "evaluate", *map(str, argv)])
    out = capsys.readouterr()
    return rc, out.out, out.err.strip()


def _result(out: str) -> dict:
    return json.loads(out.splitlines()[-1])


def test_the_model_alone_is_evaluated_on_the_data_and_split_it_was_trained_on(trained, capsys, monkeypatch):
    d, data = trained
    rc, out, err = _evaluate([d / "model.npz", *data], capsys)
    assert rc == 0, err
    full = _result(out)
    assert full["recall@20"] is not None and full["users"] > 0
    monkeypatch.chdir(d.parent)  # the record holds the file's whole path
    for what in (d / "model.npz", d / "emb.parquet", d / "ck"):
        rc, out, err = _evaluate([what], capsys)
        assert rc == 0 and "does not record" not in err, err
        assert out.splitlines()[0].startswith("clicks.csv: 60 users") and _result(out) == full
    # the case: --time-col left out drew a random split; now it is the model's time split
    rc, out, err = _evaluate([d / "model.npz", *data[:-2]], capsys)
    assert rc == 0 and _result(out) == full, err


@pytest.mark.parametrize("flags, named", [
    (["--split", "random"], "--split random (the model's: time)"),
    (["--test-fraction", "0.3"], "--test-fraction 0.3 (the model's: 0.2)"),
    (["--time-col", "user"], "--time-col user (the model's: ts)"),
])
def test_a_split_other_than_the_models_is_refused_in_one_line(trained, capsys, flags, named):
    d, data = trained
    rc, out, err = _evaluate([d / "model.npz", *data, *flags], capsys)
    assert rc == 1 and err.count("\n") == 0 and "Traceback" not in err and "Recall" not in out
    assert f"{d / 'model.npz'} was trained on clicks.csv split by --time-col ts" in err and named in err


def test_data_that_changed_since_training_is_refused(trained, tmp_path, capsys):
    d, data = trained
    grown = tmp_path / "clicks.csv"
    grown.write_text((d / "clicks.csv").read_text() + "u1,i3,5\nu2,i7,6\n")
    rc, _, err = _evaluate([d / "model.npz", "--data", grown], capsys)
    assert rc == 1 and err.count("\n") == 0 and "was trained on other data" in err and "60 users, 40 items" in err


def test_a_model_saved_without_the_record_notes_it_and_never_scores_its_training_pairs(trained, tmp_path, capsys):
    d, data = trained
    model = CFModel.load(d / "model.npz")
    model.trained_on = None  # as `cf train --save` wrote it before the record
    old = model.save(tmp_path / "old.npz")
    full = _result(_evaluate([d / "model.npz"], capsys)[1])
    rc, out, err = _evaluate([old, *data], capsys)  # the right split: the same numbers, and a note
    assert rc == 0 and _result(out) == full
    assert err.count("\n") == 0 and f"note: {old} does not record the data it was trained on" in err
    rc, out, err = _evaluate([old, *data[:-2], "--split", "random"], capsys)  # another split: overlaps
    assert rc == 0, err
    notes = err.splitlines()
    assert len(notes) == 2 and "test interactions are among the" in notes[1] and "it never saw" in notes[1]
    dropped = int(notes[1].split("note: ")[1].split(" ")[0].replace(",", ""))
    assert dropped > 0
    from embcache.cf.data.sources import read_interactions

    split = read_interactions(str(d / "clicks.csv"), "random", columns={"user": "user", "item": "item"})
    assert f"the model is scored on the {split.num_test - dropped:,} it never saw" in notes[1]


def test_the_record_of_a_random_split_refuses_another_seed_or_a_time_column():
    from embcache.cf.trained_on import evaluation_settings, resolved_split
    from embcache.errors import UserFacingError

    saved = {"data": "/data/clicks.csv", "user_col": "user", "item_col": "item", "time_col": None,
             "rating_col": None, "split": "random", "test_fraction": 0.2, "split_seed": 0, "min_rating": 0,
             "skip_bad_lines": False}
    with pytest.raises(UserFacingError) as refused:
        evaluation_settings("m.npz", {"split_seed": 4, "time_col": "ts"}, saved)
    assert str(refused.value) == (
        "m.npz was trained on clicks.csv split at random (seed 0), 0.2 held out per user; --time-col ts (the "
        "model's: none), --split-seed 4 (the model's: 0) would test it on rows it trained on: leave them out to use "
        "the model's split")
    same = evaluation_settings("m.npz", {"split_seed": 0, "split": "auto", "data": "/moved/clicks.csv"}, saved)
    assert resolved_split(same) == "random" and same["data"] == "/moved/clicks.csv" and same["user_col"] == "user"
    lightgcn = {"data": "/data/gowalla", "skip_bad_lines": False}  # its files are the split: no option changes it
    assert evaluation_settings("m.npz", {"split_seed": 9}, lightgcn)["split_seed"] == 9
