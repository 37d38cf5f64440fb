"""Bad rows that were bare tracebacks or lines without a place: `dlrm predict` on a CSV or
Parquet file names file and line (row) and what is wrong; `cf train` on a CSV with a short
line names it, or with --skip-bad-lines counts it (and the interactions a skipped LightGCN
line held); `dlrm train --readers`; the cache-fit line's numbers are the ones compared."""
from __future__ import annotations

import csv
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from embcache.cli import main
from embcache.dlrm.export import export_checkpoint
from tests.test_dlrm_export import data_without_raw_values, run  # noqa: F401 (run: the export fixture)
from tests.test_dlrm_predict_unseen import known_row


def _write_rows(path, rows: list[dict]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def _csv_rows(run, n: int = 3) -> list[dict]:
    """n labelled raw rows of the export's columns (label, dense_0.., sparse_0..)."""
    row = known_row(run)
    dense = {f"dense_{j}": "" if v is None else "1" for j, v in enumerate(row.pop("dense"))}
    return [{"label": "1", **dense, **{f: "" if v is None else v for f, v in row.items()}} for _ in range(n)]


def _predict(export, source, tmp_path, capsys) -> str:
    """`dlrm predict`'s one error line (it must fail, write nothing and print one line)."""
    out = tmp_path / "p.csv"
    assert main(["dlrm", "predict", str(export), "--input", str(source), "--out", str(out), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and not out.exists(), err
    return err


@pytest.mark.parametrize("edit, want", [
    (lambda line: ",".join(line.split(",")[:3]), ":3: wrong column count: 3 fields, expected 40"),
    (lambda line: line.replace(",1,", ",xyz,", 1), ":3: dense_0 'xyz' is not a number"),
    (lambda line: "x" + line[1:], ":3: label 'x' is not 0 or 1"),
], ids=["fields", "dense", "label"])
def test_a_bad_csv_row_names_its_line(run, tmp_path, capsys, edit, want):
    source = tmp_path / "rows.csv"
    _write_rows(source, _csv_rows(run))
    lines = source.read_text().splitlines()
    assert main(["dlrm", "predict", str(run["out"]), "--input", str(source), "--out", str(tmp_path / "ok.csv"),
                 "--no-progress"]) == 0
    lines[2] = edit(lines[2])
    source.write_text("\n".join(lines) + "\n")
    assert f"{source}{want}" in _predict(run["out"], source, tmp_path, capsys)


def test_a_bad_parquet_value_names_its_row(run, tmp_path, capsys):
    rows = _csv_rows(run)
    rows[1]["dense_0"] = "xyz"
    source = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist(rows), source)
    assert f"{source}: row 2: dense_0 'xyz' is not a number" in _predict(run["out"], source, tmp_path, capsys)


def test_an_id_outside_its_table_names_its_line_and_value(run, tmp_path, capsys):
    """Data whose values are the ids (no raw values): an id outside the table, or one that
    is not a whole number, names its line and the value, not the batch's range."""
    data = data_without_raw_values(run, tmp_path / "data")
    export_checkpoint(run["ck"], tmp_path / "out", data=str(data))
    rows = [{**r, **{f"sparse_{c}": "1" for c in range(26)}} for r in _csv_rows(run, 4)]
    source = tmp_path / "ids.csv"
    rows[2]["sparse_3"] = "99999"
    _write_rows(source, rows)
    err = _predict(tmp_path / "out", source, tmp_path, capsys)
    assert re.search(rf"{re.escape(str(source))}:4: sparse_3: ids must lie in \[0, \d+\), got 99999$", err), err
    rows[2]["sparse_3"], rows[1]["sparse_5"] = "1", "a"
    _write_rows(source, rows)
    err = _predict(tmp_path / "out", source, tmp_path, capsys)
    assert f"{source}:3: sparse_5: ids are whole numbers (the value is the id), got 'a'" in err, err


def test_a_short_csv_line_names_its_line_or_is_skipped_and_counted(tmp_path, capsys):
    from embcache.cf.data.sources import read_interactions

    source = tmp_path / "bad.csv"
    rows = [f"u{i % 4},movie-{i % 5},{i}" for i in range(12)]
    rows[3] = "u3,movie-4"  # line 5
    source.write_text("user_id,item_id,ts\n" + "\n".join(rows) + "\n\n")  # an empty line is no row
    columns = {"user": "user_id", "item": "item_id", "time": "ts"}
    with pytest.raises(ValueError, match=rf"^{re.escape(str(source))}:5: wrong column count: 2 fields, expected 3 "):
        read_interactions(str(source), columns=columns)
    data = read_interactions(str(source), columns=columns, skip_bad_lines=True)
    assert data.num_train + data.num_test == 11 and data.bad_rows.total == 1
    assert data.bad_rows.to_json()[str(source)]["first_lines"] == [5]
    assert "skipped 1 malformed row(s) (1 wrong column count); first: line 5" in capsys.readouterr().err
    rows[3], rows[6] = "u3,,3", "u1,movie-1,x"  # lines 5 and 8: the rows after the skipped line keep their lines
    rows.insert(1, "u1,movie-1")  # line 3
    source.write_text("user_id,item_id,ts\n" + "\n".join(rows) + "\n")
    data = read_interactions(str(source), columns=columns, skip_bad_lines=True)
    assert data.bad_rows.to_json()[str(source)]["first_lines"] == [3, 6, 9], data.bad_rows.to_json()


def test_a_skipped_lightgcn_line_counts_its_interactions(tmp_path, capsys):
    from embcache.cf.data.lightgcn import read_lightgcn

    (tmp_path / "train.txt").write_text("0 1 2 3\n1 2 x 4 5 6\n2 0 1\n3 4\n")
    (tmp_path / "test.txt").write_text("0 4\n1 -1 5\n")
    data = read_lightgcn(tmp_path, skip_bad=True)
    assert data.bad_rows.total == 2 and data.bad_rows.carried == 7
    assert "skipped 2 malformed line(s) with 7 interaction(s) in them" in data.summary(), data.summary()
    data.bad_rows.report()
    err = capsys.readouterr().err
    assert "skipped 1 malformed row(s) (1 non-integer token 'x'), with 5 interaction(s) in them" in err, err
    from embcache.data.bad_rows import BadRowLog

    saved = BadRowLog()
    saved.load_json(data.bad_rows.to_json())
    assert saved.carried == 7


def test_dlrm_train_readers_reaches_the_loader(tmp_path, capsys, monkeypatch):
    """`--readers N` (docs/dlrm.md, `DLRMConfig.readers`) is a flag of `dlrm train`, shown
    with the config's default, and the pipelined loader reads with N readers."""
    import embcache.dlrm.trainer as trainer
    from embcache.dlrm.cli import build_parser

    parser = build_parser("embcache dlrm")
    assert parser.parse_args(["train", "--readers", "2"]).readers == 2
    assert parser.parse_args(["train"]).readers is trainer.DLRMConfig().readers
    with pytest.raises(SystemExit):
        main(["dlrm", "train", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--readers N pipelined runs: threads reading" in help_text and "default: half this rank's cores" in help_text
    used = []

    class Spy(trainer.ParallelBatches):
        def __init__(self, loader, readers, *args, **kwargs):
            used.append(readers)
            super().__init__(loader, readers, *args, **kwargs)

    monkeypatch.setattr(trainer, "ParallelBatches", Spy)
    assert main(["dlrm", "train", "--synthetic-rows", "2000", "--synthetic-scale", "0.0005", "--data-cache",
                 str(tmp_path), "--batch-size", "256", "--max-steps", "2", "--embedding-dim", "4", "--dense-arch", "8",
                 "--over-arch", "8", "--device", "cpu", "--no-progress", "--readers", "2"]) == 0
    assert used and set(used) == {2}, used


@pytest.mark.parametrize("rows, scale, batch, compared", [(4_000, 0.005, 256, "more"), (4_000, 0.02, 128, "no more")])
def test_the_cache_fit_line_shows_the_numbers_it_compares(tmp_path, rows, scale, batch, compared):
    """The rows held in flight, the twice-that the rule compares, and 1.5 %'s rows: the line
    says "more than" exactly when the number it shows is larger. The first case holds fewer
    rows in flight than 1.5 % (1,633 < 2,533) but twice that more: the line showed the 1,633."""
    from embcache.data.synthetic import generate_synthetic
    from embcache.dlrm.cache_fit import fit_cache_ratio

    generate_synthetic(tmp_path / "d", rows=rows, scale=scale, seed=1, progress=False)
    _, why = fit_cache_ratio(tmp_path / "d", batch_size=batch, prefetch_depth=1, embedding_dim=4, optimizer="adagrad",
                             eviction="freq", bookkeeping="host", device_memory=16 * 2**30)
    found = re.search(r"hold ([\d,]+) distinct rows .* wants 2x that, ([\d,]+) .*, (no more|more) than 0\.015's "
                      r"([\d,]+)", why)
    assert found, why
    held, want, word, base = found.groups()
    held, want, base = (int(v.replace(",", "")) for v in (held, want, base))
    assert abs(want - 2 * held) <= 1 and word == compared and (want > base) == (word == "more"), why
