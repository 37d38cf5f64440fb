"""What an outside reader of the DLRM side met: `dlrm predict` on a file with no rows and on a
Criteo label written 1.0; the end-of-run warning of a run that peaked in the middle of its
only epoch; a whole-table cache's hit rate; `--epochs` beside `--days`."""
from __future__ import annotations

from types import SimpleNamespace

import pyarrow.csv as pcsv
import pytest

from embcache.cli import main
from embcache.errors import UserFacingError
from tests.test_s5_dlrm_user import own_export  # noqa: F401 (the export fixture)


def test_predict_of_a_header_only_file_writes_its_columns_and_says_so(own_export, tmp_path, capsys):  # noqa: F811
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
