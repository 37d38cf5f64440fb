"""cf (HEAT) as a user meets it: the held-out split at large test fractions, ml-100k's
malformed lines, the throughput figure with the first epoch timed apart."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from embcache.cf.data.ratings import split_ratings
from embcache.cli import main
from embcache.data.movielens import load_ml100k
from embcache.errors import DataFormatError
from tests.test_data_movielens import write_atomic, write_standard


def test_large_test_fraction_leaves_every_user_a_training_interaction():
    # users with 2..5 interactions: at 0.75 and up the rounded share was all of a 2-interaction user's
    ratings = np.array([[u, i, 5, i] for u in range(40) for i in range(2 + u % 4)], dtype=np.int64)
    for fraction in (0.75, 0.9, 0.99):
        for how in ("random", "time"):
            data = split_ratings(ratings, how, test_fraction=fraction, seed=3)
            train_counts, test_counts = np.diff(data.train_indptr), np.diff(data.test_indptr)
            assert (train_counts >= 1).all(), (fraction, how)
            assert (test_counts >= 1).all()  # each user of two or more still has a test item
            assert data.num_train + data.num_test == len(ratings)


def test_default_fraction_split_is_unchanged():
    """The cap only bites where the share rounded to all of a user's items: 0.2 splits stay as they were."""
    ratings = np.array([[u, i, 5, i] for u in range(30) for i in range(1 + u % 7)], dtype=np.int64)
    data = split_ratings(ratings, "time", test_fraction=0.2)
    counts = np.array([1 + u % 7 for u in range(30)])
    expected = np.where(counts >= 2, np.maximum(1, np.rint(counts * 0.2)), 0)
    assert np.diff(data.test_indptr).tolist() == expected.tolist()


def _damaged_standard(d):
    """The tiny GroupLens files with a rating that is no number (line 2), a short line
    (line 6), a repeated user (u.user line 4) and a rating of a user u.user lacks (line 7)."""
    d.mkdir()
    write_standard(d)
    lines = (d / "u.data").read_text(encoding="latin-1").splitlines()
    lines[1] = "2\t7\tfive\t881250950"
    lines += ["3\t9", "4\t7\t1\t881250999"]
    (d / "u.data").write_text("\n".join(lines) + "\n", encoding="latin-1")
    with open(d / "u.user", "a", encoding="latin-1") as f:
        f.write("5|40|F|writer|11111\n")
    return d


def test_prepare_ml100k_skips_and_counts_malformed_lines(tmp_path, capsys):
    src = _damaged_standard(tmp_path / "src")
    rc = main(["data", "prepare", "ml-100k", "--input", str(src), "--out", str(tmp_path / "out")])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert "bad rows    4 skipped" in out.out
    assert "u.data: skipped 3 malformed row(s)" in out.err and "line 2: rating 'five' is not an integer" in out.err
    assert "u.user: skipped 1 malformed row(s)" in out.err
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert meta["bad_rows"][str(src / "u.data")]["first_lines"] == [2, 6, 7]
    assert meta["bad_rows"][str(src / "u.item")]["count"] == 0
    assert sum(s["rows"] for s in meta["splits"].values()) == 4  # 5 ratings less the one on line 2


def test_prepare_ml100k_strict_stops_at_the_first_naming_file_and_line(tmp_path, capsys):
    src = _damaged_standard(tmp_path / "src")
    rc = main(["data", "prepare", "ml-100k", "--input", str(src), "--out", str(tmp_path / "out"), "--strict"])
    err = capsys.readouterr().err
    assert rc != 0 and not (tmp_path / "out").exists()
    assert err.strip().splitlines() == [f"embcache data: error: {src / 'u.user'}:4: user id 5 appears again "
                                        f"(first on line 3)"]


def test_atomic_layout_skips_the_same_way(tmp_path):
    d = tmp_path / "atomic"
    d.mkdir()
    write_atomic(d)
    with open(d / "ml-100k.inter", "a", encoding="utf-8") as f:
        f.write("2\t7\t9\t881250960\n")  # rating outside 1..5, on line 7
    with pytest.raises(DataFormatError, match=r"ml-100k\.inter:7: rating 9 outside 1\.\.5"):
        load_ml100k(d)
    from embcache.data.bad_rows import BadRowLog

    log = BadRowLog()
    assert len(load_ml100k(d, log).ratings) == 5 and log.total == 1
    assert log.to_json()[str(d / "ml-100k.inter")]["first_reasons"] == ["rating 9 outside 1..5"]


def test_cf_train_skip_bad_lines_reaches_an_ml100k_directory(tmp_path, capsys):
    """`cf train --skip-bad-lines` was not passed to the MovieLens-100k reader: it stopped anyway."""
    d = tmp_path / "atomic"
    d.mkdir()
    write_atomic(d)
    with open(d / "ml-100k.inter", "a", encoding="utf-8") as f:
        f.write("2\t7\n")
    args = ["cf", "train", "--data", str(d), "--epochs", "1", "--negatives", "2", "--threads", "1", "--no-progress"]
    assert main(args) != 0
    assert "ml-100k.inter:7: 2 fields" in capsys.readouterr().err
    assert main([*args, "--skip-bad-lines"]) == 0
    out = capsys.readouterr()
    assert "skipped 1 malformed line(s)" in out.out and "ml-100k.inter: skipped 1 malformed row(s)" in out.err


def _summary(capsys, *args):
    """The printed summary rows and the JSON line of a small `cf train` on a synthetic set."""
    rc = main(["cf", "train", "--data", "synthetic", "--synthetic-users", "60", "--synthetic-items", "80",
               "--synthetic-interactions", "1200", "--negatives", "4", "--threads", "1", "--no-progress", *args])
    out = capsys.readouterr().out
    assert rc == 0
    lines = out.strip().splitlines()
    return "\n".join(lines[:-1]), json.loads(lines[-1])


def test_cf_summary_times_the_first_epoch_apart(capsys):
    text, s = _summary(capsys, "--epochs", "3")
    assert s["steady_epochs"] == 2 and s["first_epoch_seconds"] > 0 and s["compile_seconds"] is not None
    n = s["train_samples_per_s"] * s["train_seconds"] / 3  # every epoch, as before: the benches read it
    assert s["steady_samples_per_s"] == pytest.approx(2 * n / s["steady_seconds"])
    assert s["train_seconds"] == pytest.approx(s["first_epoch_seconds"] + s["steady_seconds"])
    row = next(line for line in text.splitlines() if "training throughput" in line)
    assert f"{s['steady_samples_per_s']:,.0f} samples/s over 2 epoch(s) after the first" in row
    assert "timed apart" in row and "step" not in row
    assert "the HEAT kernels, compiled or loaded from numba's cache, took" in row
    assert "a sample after the first epoch" in text


def test_cf_summary_of_one_epoch_says_its_warm_up_is_in_the_figure(capsys):
    text, s = _summary(capsys, "--epochs", "1", "--engine", "torch")
    assert s["steady_epochs"] == 0 and s["steady_samples_per_s"] is None and s["compile_seconds"] is None
    row = next(line for line in text.splitlines() if "training throughput" in line)
    assert "one epoch (its warm-up included)" in row and "HEAT" not in row


def _lightgcn(d):
    d.mkdir()
    (d / "train.txt").write_text("0 1 2 3\n1 2 3\n2 0 3\n")
    (d / "test.txt").write_text("0 0\n1 1\n2 1\n")
    return d


SMALL_SYNTHETIC = ["--synthetic-users", "40", "--synthetic-items", "50", "--synthetic-interactions", "400"]


@pytest.mark.parametrize("data, extra, told", [
    ("lightgcn", ["--split", "time", "--test-fraction", "0.5", "--min-rating", "3"],
     "--split time, --test-fraction 0.5, --min-rating 3 ignored (a LightGCN directory is split already"),
    ("synthetic", ["--min-rating", "4", "--split", "time"],
     "synthetic: --min-rating 4, --split time ignored (the synthetic set is split at random and has no ratings)"),
])
def test_options_the_data_cannot_use_are_told_not_dropped(data, extra, told, tmp_path, capsys):
    spec = str(_lightgcn(tmp_path / "lg")) if data == "lightgcn" else data
    args = ["cf", "train", "--data", spec, "--epochs", "1", "--negatives", "2", "--threads", "1", "--no-progress",
            *(SMALL_SYNTHETIC if data == "synthetic" else [])]  # the set's sizes are options it uses
    assert main([*args, *extra]) == 0
    assert told in capsys.readouterr().err
    assert main(args) == 0
    assert "ignored" not in capsys.readouterr().err  # the defaults are never "given"


def test_min_rating_on_a_file_without_a_rating_column_is_refused_naming_it(tmp_path, capsys):
    path = tmp_path / "clicks.csv"
    path.write_text("user_id,item_id\n" + "".join(f"u{u},i{i}\n" for u in range(5) for i in range(4)))
    rc = main(["cf", "train", "--data", str(path), "--min-rating", "4", "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert rc == 1 and len(err.splitlines()) == 1
    assert f"{path}: --min-rating 4 needs --rating-col" in err


@pytest.mark.parametrize("name, told", [("gone.npz", "no such embeddings file"),
                                        ("model.txt", "embeddings are loaded from .npy, .npz, .parquet")])
def test_evaluate_names_a_missing_model_before_reading_any_data(name, told, tmp_path, capsys):
    rc = main(["cf", "evaluate", str(tmp_path / name)])
    out = capsys.readouterr()
    assert rc == 1 and out.out == ""  # no data line: MovieLens-100k was read before the file was looked at
    assert out.err.strip() == f"embcache cf: error: {tmp_path / name}: {told}"


@pytest.mark.parametrize("suffix", [".npy", ".parquet"])
def test_recommend_from_an_embeddings_only_file_says_so(suffix, tmp_path, capsys):
    saved = tmp_path / f"emb{suffix}"
    assert main(["cf", "train", "--data", "synthetic", "--synthetic-users", "30", "--synthetic-items", "40",
                 "--synthetic-interactions", "300", "--epochs", "1", "--negatives", "2", "--threads", "1",
                 "--no-progress", "--save", str(saved)]) == 0
    capsys.readouterr()
    assert main(["cf", "recommend", str(saved), "--users", "0"]) == 1
    err = capsys.readouterr().err.strip()  # it said "corrupt or truncated CF model" of a good file
    held = "the ids but not the training items" if suffix == ".parquet" else "neither the ids nor the training items"
    assert err == (f"embcache cf: error: {saved}: holds embeddings only ({suffix} is saved with {held} a model "
                   f"needs): train with --save FILE.npz for a whole model")


def test_a_movielens_model_answers_in_movielens_ids(tmp_path, capsys):
    """MovieLens numbers users and items from 1: the model spoke its 0-based indices, so `--users 1` gave
    the second user's recommendations and the last user was 'not in the model'."""
    src = tmp_path / "ml"
    src.mkdir()
    write_atomic(src)  # users 2, 5, 10; items 1, 3, 7, 9
    ratings = tmp_path / "u.data"
    ratings.write_text("".join(f"{u}\t{i}\t4\t{k}\n" for k, (u, i) in enumerate([(3, 10), (3, 20), (8, 20), (8, 30)])))
    for data, users, items in ((src, [2, 5, 10], {1, 3, 7, 9}), (ratings, [3, 8], {10, 20, 30})):
        model = tmp_path / f"{Path(data).stem}.npz"
        assert main(["cf", "train", "--data", str(data), "--epochs", "1", "--negatives", "2", "--threads", "1",
                     "--no-progress", "--save", str(model)]) == 0
        capsys.readouterr()
        assert main(["cf", "recommend", str(model), "--all", "--k", "1", "--include-seen"]) == 0
        rows = [line.split(",") for line in capsys.readouterr().out.split()[1:]]
        assert [int(r[0]) for r in rows] == users and {int(r[2]) for r in rows} <= items


def test_no_epoch_trained_is_said_not_shown_as_zero_samples_a_second(capsys):
    text, s = _summary(capsys, "--epochs", "0")
    assert s["epochs_done"] == 0 and s["train_samples_per_s"] == 0.0  # the key keeps its meaning
    assert "training throughput  none: no epoch was trained" in text and "0 samples/s" not in text


def test_parquet_float_ids_nan_is_missing_and_fractions_stay_apart(tmp_path):
    """pandas writes integer ids with gaps as floats with NaN: NaN was an id "nan" (and made every id a
    string "1.0"); 1.5 and 1.0 were one id 1."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from embcache.cf.data.table import read_table
    from embcache.data.bad_rows import BadRowLog

    gaps = tmp_path / "gaps.parquet"
    pq.write_table(pa.table({"user_id": [1.0, 2.0, float("nan"), 1.0], "item_id": [7, 8, 9, 8]}), gaps)
    with pytest.raises(DataFormatError, match=r"gaps\.parquet:3: empty 'user_id'"):
        read_table(gaps, "user_id", "item_id")
    log = BadRowLog()
    table = read_table(gaps, "user_id", "item_id", bad_rows=log)
    assert table.user_ids.tolist() == [1, 2] and log.total == 1
    halves = tmp_path / "halves.parquet"
    pq.write_table(pa.table({"user_id": [1.0, 1.5, 1.0, 1.5], "item_id": [1, 2, 2, 1]}), halves)
    assert len(read_table(halves, "user_id", "item_id").user_ids) == 2


def test_a_cut_off_of_every_item_is_told(tmp_path, capsys):
    model = tmp_path / "m.npz"
    assert main(["cf", "train", "--data", "synthetic", "--synthetic-users", "60", "--synthetic-items", "80",
                 "--synthetic-interactions", "1200", "--negatives", "4", "--threads", "1", "--no-progress",
                 "--epochs", "1", "--save", str(model), "--k", "20", "80"]) == 0
    assert "--k 80 is not below the 80 items" in capsys.readouterr().err
    assert main(["cf", "evaluate", str(model), "--k", "10", "80", "200"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out.splitlines()[-1])["recall@200"] == 1.0
    assert ("--k 80 200 is not below the 80 items: such a top k holds every item, so its Recall is 1.0 whatever "
            "the model") in out.err
