"""Bad rows that were bare tracebacks or lines without a place: `dlrm predict` on a CSV or
Parquet file names file and line (row) and what is wrong; `cf train` on a CSV with a short
line names it, or with --skip-bad-lines counts it (and the interactions a skipped LightGCN
line held); `dlrm train --readers`; the cache-fit line's numbers are the ones compared."""
from __future__ import annotations

import csv
import json
import math
import re
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from embcache.cli import main
from embcache.dlrm.export import export_checkpoint
from tests.test_dlrm_export import run  # noqa: F401 (the export fixture)
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
    data = tmp_path / "data"
    shutil.copytree(run["root"] / "data", data)
    meta = json.loads((data / "meta.json").read_text())
    del meta["raw_values"]
    (data / "meta.json").write_text(json.dumps(meta))
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
