"""What outside walkthroughs of the DLRM side met, a test for each: their own file in the
formats `data prepare own` takes, scored by `dlrm predict` (a file with no rows, a label
written 1.0 included); data written day by day, trained with the default cache size and
evaluated day by day, and `--epochs` beside `--days`; an empty batch given to
`embcache.serve`; the end-of-run warning of a run that peaked in the middle of its only
epoch; a whole-table cache's hit rate."""
from __future__ import annotations

import gzip
import json
from types import SimpleNamespace

import numpy as np
import pyarrow.csv as pcsv
import pytest

from embcache.cli import main
from embcache.errors import UserFacingError

ROWS = 600


def write_clicks(path, delimiter: str = ",") -> None:
    """ROWS rows of a click log with a header: user and item (categorical), price (dense), clicked."""
    rng = np.random.default_rng(0)
    lines = [delimiter.join(["user", "item", "price", "clicked"])]
    lines += [delimiter.join([f"u{rng.integers(0, 30)}", f"i{rng.integers(0, 20)}", f"{rng.random() * 50:.2f}",
                              str(int(rng.random() < 0.3))]) for _ in range(ROWS)]
    path.write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def own_export(tmp_path_factory):
    """A CSV prepared with `data prepare own`, trained 2 steps and exported: (dir, the CSV)."""
    root = tmp_path_factory.mktemp("own")
    source = root / "clicks.csv"
    write_clicks(source)
    assert main(["data", "prepare", "own", "--input", str(source), "--out", str(root / "data"), "--label-col",
                 "clicked", "--dense-cols", "price", "--sparse-cols", "user,item", "--no-progress"]) == 0
    assert main(["dlrm", "train", "--data", str(root / "data"), "--max-steps", "2", "--batch-size", "128",
                 "--embedding-dim", "4", "--dense-arch", "8", "--over-arch", "8", "--device", "cpu",
                 "--checkpoint-dir", str(root / "ck"), "--no-progress"]) == 0
    assert main(["dlrm", "export", str(root / "ck"), "--out", str(root / "export")]) == 0
    return root, source


def predicted(export, source, out) -> list[float]:
    assert main(["dlrm", "predict", str(export), "--input", str(source), "--out", str(out), "--no-progress"]) == 0
    return pcsv.read_csv(out).column("probability").to_pylist()


@pytest.mark.parametrize("name", ["clicks.csv.gz", "clicks.tsv", "clicks.txt", "clicks.tsv.gz"])
def test_predict_reads_every_text_file_data_prepare_own_reads(own_export, tmp_path, name, capsys):
    """The file a model was prepared from scores as it is: `data prepare own` takes a .gz CSV
    and tab-separated .tsv / .txt, and `dlrm predict` took them for Criteo text and refused them."""
    root, source = own_export
    want = predicted(root / "export", source, tmp_path / "csv.csv")
    path = tmp_path / name
    write_clicks(path.with_suffix("") if name.endswith(".gz") else path, "," if ".csv" in name else "\t")
    if name.endswith(".gz"):
        plain = path.with_suffix("")
        path.write_bytes(gzip.compress(plain.read_bytes()))
    capsys.readouterr()
    assert predicted(root / "export", path, tmp_path / "got.csv") == want
    assert len(want) == ROWS


@pytest.fixture(scope="module")
def days_run(tmp_path_factory):
    """Data written day by day with ids (`data synthetic --days 3`: day_0..day_2, no train,
    val or test split), trained `--days 0-1 --eval-next-day` at the default cache size
    (`--cache-ratio fit`): (root, the run's summary)."""
    from embcache.data.synthetic import generate_synthetic

    root = tmp_path_factory.mktemp("days")
    generate_synthetic(root / "data", rows=400, scale=0.0005, seed=0, days=3)
    summary = root / "summary.json"
    code = main(["dlrm", "train", "--data", str(root / "data"), "--days", "0-1", "--eval-next-day",
                 "--batch-size", "128", "--embedding-dim", "4", "--dense-arch", "8", "--over-arch", "8",
                 "--device", "cpu", "--no-progress", "--checkpoint-dir", str(root / "ck"),
                 "--metrics-out", str(summary)])
    records = [json.loads(line) for line in summary.read_text().splitlines()] if summary.exists() else []
    return root, code, next((r for r in records if r.get("event") == "summary"), None)


def test_day_data_with_ids_trains_at_the_default_cache_size(days_run):
    """`--cache-ratio fit` read the train split's rows only, so day data (ids counted over
    every day) read as "no training rows: nothing to predict from" and the default run stopped."""
    _, code, summary = days_run
    assert code == 0 and summary is not None
    assert summary["steps"] == 8 and 0 < summary["cache_ratio"] <= 1


def test_evaluate_scores_a_day_split(days_run, capsys):
    """A `--days` run's data has only day splits: `dlrm evaluate --split day_N` scores one (the
    same score as the run's next-day evaluation), and a day the run trained on is said to be one."""
    root, code, summary = days_run
    assert code == 0
    capsys.readouterr()
    assert main(["dlrm", "evaluate", str(root / "ck"), "--split", "day_2", "--device", "cpu"]) == 0
    out, err = capsys.readouterr()
    result = json.loads(out.strip().splitlines()[-1])
    assert result["split"] == "day_2" and result["samples"] == 400
    next_day = {d["split"]: d for d in summary["next_day"]}
    assert result["auc"] == pytest.approx(next_day["day_2"]["auc"], abs=1e-6)
    assert "warning" not in err
    assert main(["dlrm", "evaluate", str(root / "ck"), "--split", "day_1", "--device", "cpu"]) == 0
    assert "warning: day_1 is one of the days this run trains on (--days 0-1)" in capsys.readouterr().err


def test_serve_scores_an_empty_batch_as_no_rows(own_export):
    """A server's batch can be empty: `predict([])` gives no probabilities, where it refused
    with "dense: 0 rows, expected 1" (an empty batch pooled as one row)."""
    from embcache.serve import load_export

    model = load_export(own_export[0] / "export")
    got = model.predict([])
    assert got.shape == (0,)
    assert model.pooled({f: [] for f in model.features}).shape[0] == 0
    assert model.predict([{"sparse_0": "u1", "sparse_1": "i2", "dense": [3.5]}]).shape == (1,)


def test_a_float_label_column_is_read_as_its_parquet_twin_is(tmp_path, capsys):
    """pandas writes a float label column as 1.0 / 0.0: `data prepare own` skipped every such
    row of a CSV as a bad label (while a Parquet float column's 1.0 was read as 1); now both
    read the labels of the integer file, and 0.5 is still refused by line."""
    from embcache.data.ctr_format import head_rows

    ints, floats = tmp_path / "ints.csv", tmp_path / "floats.csv"
    write_clicks(ints)
    lines = ints.read_text().splitlines()
    body = [line.rsplit(",", 1) for line in lines[1:]]
    floats.write_text("\n".join([lines[0], *(f"{rest},{label}.0" for rest, label in body), "u1,i1,2.5,0.5"]) + "\n")
    for source in (ints, floats):
        assert main(["data", "prepare", "own", "--input", str(source), "--out", str(tmp_path / source.stem),
                     "--label-col", "clicked", "--dense-cols", "price", "--sparse-cols", "user,item",
                     "--no-progress"]) == 0
    assert f"{floats.name}: skipped 1 malformed row(s)" in capsys.readouterr().err
    bad = next(iter(json.loads((tmp_path / "floats" / "meta.json").read_text())["bad_rows"].values()))
    assert bad["count"] == 1 and bad["first_lines"] == [ROWS + 2]
    for split in ("train", "val", "test"):
        assert head_rows(tmp_path / "floats", split, ROWS) == head_rows(tmp_path / "ints", split, ROWS)


@pytest.mark.parametrize("flags, said", [
    (["--days", "0-1", "--eval-every", "2"], "--eval-every in a --days run scores the next day: add --eval-next-day"),
    (["--eval-next-day"], "--eval-next-day needs --days A-B"),
    (["--allow-test-days"], "--allow-test-days needs --days A-B")])
def test_day_options_that_would_do_nothing_are_refused_before_any_work(tmp_path, capsys, flags, said):
    """`--eval-every` in a `--days` run without `--eval-next-day` printed "trained (no next day
    evaluated)" every N steps and evaluated nothing; `--allow-test-days` without `--days` passed
    unremarked. Refused in one line before the data is read (--data names no directory)."""
    code = main(["dlrm", "train", "--data", str(tmp_path / "absent"), "--device", "cpu", "--no-progress", *flags])
    err = capsys.readouterr().err
    assert code == 1 and said in err and err.count("\n") == 1, err


def test_predict_names_own_data_s_unseen_values_by_the_file_s_columns(own_export, tmp_path, capsys):
    """The user's file says `user`; the counts of values never seen, and --strict's refusal,
    said only `sparse_0`."""
    root, source = own_export
    new = tmp_path / "new.csv"
    new.write_text("user,item,price,clicked\nu-new,i1,3.5,1\n")
    args = ["dlrm", "predict", str(root / "export"), "--input", str(new), "--out", str(tmp_path / "p.csv"),
            "--no-progress"]
    capsys.readouterr()
    assert main(args) == 0
    assert "scored as missing: user (sparse_0) 1 (of 1 rows" in capsys.readouterr().out
    assert main([*args, "--strict"]) == 1
    assert f"{new}:2: user (sparse_0) value 'u-new' is not in the export's vocabulary" in capsys.readouterr().err


def test_predict_of_a_header_only_file_writes_its_columns_and_says_so(own_export, tmp_path, capsys):
    """A header and no rows wrote `probability` alone (the input's label column lost) after a
    "0 rows" progress bar; an empty file printed that bar before its one-line refusal."""
    root, _ = own_export
    header = tmp_path / "header.csv"
    header.write_text("user,item,price,clicked\n")
    out = tmp_path / "p.csv"
    capsys.readouterr()
    assert main(["dlrm", "predict", str(root / "export"), "--input", str(header), "--out", str(out)]) == 0
    printed, err = capsys.readouterr()
    table = pcsv.read_csv(out)
    assert table.column_names == ["label", "probability"] and table.num_rows == 0
    assert printed == f"{header} has no rows: wrote {out} with no predictions (columns label, probability)\n"
    assert "0 rows" not in err, err
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    assert main(["dlrm", "predict", str(root / "export"), "--input", str(empty), "--out", str(tmp_path / "e.csv")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "0 rows" not in err and f"{empty}:1: the file is empty" in err, err


def criteo_line(label: str) -> str:
    return "\t".join([label, *["3"] * 13, *["68fd1e64"] * 26])


def test_a_criteo_label_written_1_0_is_read_as_data_prepare_reads_it(tmp_path):
    """`data prepare criteo` (the shared `parse_label`) reads 1.0 as 1; `dlrm predict`'s Criteo
    text reader refused it (and took a label 2 as it was); 0.5 is still refused by line."""
    from embcache.dlrm.predict import raw_batches

    model = SimpleNamespace(manifest={"num_dense": 13}, features=[f"sparse_{c}" for c in range(26)])
    good = tmp_path / "good.txt"
    good.write_text("".join(criteo_line(v) + "\n" for v in ("1.0", "0.0", "1", "0")))
    (_, _, labels, _), = raw_batches(good, model, 100)
    assert labels.tolist() == [1, 0, 1, 0]
    for value in ("0.5", "2"):
        bad = tmp_path / "bad.txt"
        bad.write_text("".join(criteo_line(v) + "\n" for v in ("1.0", "0", value)))
        with pytest.raises(UserFacingError, match=f"^{bad}:3: the label '{value}' is not 0 or 1$"):
            list(raw_batches(bad, model, 100))


def test_a_one_epoch_run_that_peaked_mid_epoch_is_told_the_step_not_a_further_epoch():
    """The warning blamed "a further epoch over the same data" on a one-epoch run whose best
    was an --eval-every evaluation at step 40; it now names the step to stop at."""
    from embcache.dlrm.trainer import DLRMTrainer
    from embcache.train.best_score import below_best

    history = [{"epoch": 1, "step": 40, "partial": True, "auc": 0.75}, {"epoch": 1, "step": 100, "auc": 0.70}]
    said = below_best(history, DLRMTrainer.headline)
    assert said.startswith("auc 0.7000 after epoch 1 is below the best of the run, 0.7500 at step 40 (epoch 1 in "
                           "progress): ") and "--max-steps 40" in said, said
    assert "further epoch" not in said
    # best at an epoch's end, a later epoch worse: the further epoch is the advice still
    history = [{"epoch": 1, "step": 100, "auc": 0.75}, {"epoch": 2, "step": 200, "auc": 0.70}]
    assert "a further epoch" in below_best(history, DLRMTrainer.headline)


SUMMARY = {"val_auc": 0.7, "val_logloss": 0.5, "sparse": "cached", "device": "cpu", "cache_rows": 52,
           "table_rows": 52, "cache_ratio": 1.0, "hit_rate": 0.86, "bytes_h2d": 448, "bytes_d2h": 0,
           "overflow_rows": 0, "epochs_done": 1, "steps": 2, "train_seconds": 0.1, "train_samples_per_s": 2560.0,
           "peak_host_mib": 100.0}


@pytest.mark.parametrize("change, noted", [({}, True), ({"cache_ratio": 0.5, "cache_rows": 26}, False),
                                           ({"live_keys": 40, "new_keys": 40, "retired_keys": 0,
                                             "key_index_bytes": 1024}, False)])
def test_a_cache_holding_every_row_says_its_misses_are_first_uses(change, noted):
    """0.86 of a cache that holds the whole tables read as a cache too small: each of its
    misses is a row's first use. Not said of a partial cache, nor of open tables."""
    from embcache.dlrm.cli import summary_rows

    rate = dict(summary_rows({**SUMMARY, **change}))["cache hit rate"]
    assert rate == ("0.8600 (every miss a row's first use: the cache holds every row)" if noted else "0.8600")


@pytest.mark.parametrize("epochs, refused", [("3", True), ("2", False)])
def test_epochs_beside_days_that_count_otherwise_is_refused(tmp_path, capsys, epochs, refused):
    """--days 0-1 trains two epochs whatever --epochs says: --epochs 3 beside it was dropped
    without a word. Refused in one line before the data is read (--data names no directory);
    --epochs 2 agrees and passes to the data's own error."""
    code = main(["dlrm", "train", "--data", str(tmp_path / "absent"), "--device", "cpu", "--no-progress",
                 "--days", "0-1", "--epochs", epochs])
    err = capsys.readouterr().err
    said = "--epochs 3 and --days 0-1: a --days run trains one epoch a day (2 here); leave out --epochs"
    assert code == 1 and err.count("\n") == 1 and (said in err) == refused, err
