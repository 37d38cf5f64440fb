"""`data prepare own`: a user's CSV / TSV / Parquet with named columns becomes the canonical
format, split at random, by a time column or at the file's tail, with bad rows named by line,
and trains."""
from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from embcache.cli import main
from embcache.data.ctr_format import read_meta, read_shard

ROWS = 1_000


def table() -> pa.Table:
    """ROWS rows: `pos` is the row's place in the file, `ts` a shuffled time (a permutation of
    0..ROWS-1, so every quantile is exact), `pos_id` and `ts_id` the same as categories (read
    back through raw_values to check a split), one column no one asks for."""
    rng = np.random.default_rng(0)
    ts = rng.permutation(ROWS)
    return pa.table({"pos": [str(i) for i in range(ROWS)], "ts": ts.astype(str).tolist(),
                     "click": rng.integers(0, 2, ROWS).astype(str).tolist(),
                     "price": [f"{x:.2f}" for x in rng.random(ROWS) * 50],
                     "user": [f"u{x}" for x in rng.integers(0, 40, ROWS)],
                     "ts_id": ts.astype(str).tolist(), "pos_id": [str(i) for i in range(ROWS)],
                     "unused": ["x"] * ROWS})


def write_text(path, t: pa.Table, delimiter: str) -> None:
    lines = [delimiter.join(t.column_names)]
    lines += [delimiter.join(str(v) for v in row.values()) for row in t.to_pylist()]
    path.write_text("\n".join(lines) + "\n")


def prepare(source, out, split: str, *extra: str) -> int:
    return main(["data", "prepare", "own", "--input", str(source), "--out", str(out), "--label-col", "click",
                 "--dense-cols", "price", "--sparse-cols", "user,ts_id,pos_id", "--split", split, "--no-progress",
                 *extra])


def values_by_split(out, feature: str) -> dict[str, list[int]]:
    """Each split's raw values of `feature` (integers), read back through raw_values/."""
    meta = read_meta(out)
    column = next(f["name"] for f in meta["sparse"] if meta["features"][f["name"]] == feature)
    raw = pq.read_table(out / meta["raw_values"]["features"][column]["file"]).column("value").to_pylist()
    got = {}
    for split, info in meta["splits"].items():
        ids = []
        for rel in info["files"]:
            for batch in read_shard(pq.ParquetFile(out / rel), out / rel):
                ids += batch.column(column).to_pylist()
        got[split] = [int(raw[i]) for i in ids]
    return got


def test_time_split_holds_out_the_latest_rows(tmp_path, capsys):
    source = tmp_path / "clicks.csv"
    write_text(source, table(), ",")
    assert prepare(source, tmp_path / "out", "time:ts") == 0
    times = values_by_split(tmp_path / "out", "ts_id")
    assert sorted(times["train"]) == list(range(800)) and sorted(times["val"]) == list(range(800, 900))
    assert sorted(times["test"]) == list(range(900, 1000))
    meta = read_meta(tmp_path / "out")
    assert meta["features"]["dense_0"] == "price" and meta["columns"]["time"] == "ts"
    assert meta["dense_transform"] == "log1p(max(x, 0))"


def test_tail_and_random_splits(tmp_path):
    source = tmp_path / "clicks.tsv"
    write_text(source, table(), "\t")
    assert prepare(source, tmp_path / "tail", "tail", "--held-out", "0.1") == 0
    places = values_by_split(tmp_path / "tail", "pos_id")
    assert places == {"train": list(range(900)), "val": list(range(900, 950)), "test": list(range(950, 1000))}
    assert prepare(source, tmp_path / "random", "random", "--seed", "3") == 0
    places = values_by_split(tmp_path / "random", "pos_id")
    assert sorted(sum(places.values(), [])) == list(range(ROWS))
    assert 700 < len(places["train"]) < 900 and max(places["train"]) > min(places["val"] + places["test"])


def test_parquet_gives_the_csv_s_data(tmp_path):
    """Parquet columns of other types (int64 times, a float price) give the ids and rows the
    text file gives."""
    t = table()
    typed = t.set_column(1, "ts", pa.array(np.asarray(t.column("ts").to_pylist(), dtype=np.int64)))
    pq.write_table(typed, tmp_path / "clicks.parquet")
    write_text(tmp_path / "clicks.csv", t, ",")
    for name in ("clicks.parquet", "clicks.csv"):
        assert prepare(tmp_path / name, tmp_path / name.replace(".", "_"), "time:ts") == 0
    a, b = values_by_split(tmp_path / "clicks_parquet", "ts_id"), values_by_split(tmp_path / "clicks_csv", "ts_id")
    assert a == b


def test_bad_rows_are_named_by_line_and_wrong_columns_by_name(tmp_path, capsys):
    source = tmp_path / "clicks.csv"
    write_text(source, table(), ",")
    lines = source.read_text().splitlines()
    fields = lines[5].split(",")
    fields[2] = "yes"  # the label
    lines[5] = ",".join(fields)
    fields = lines[9].split(",")
    fields[1] = ""  # no time
    lines[9] = ",".join(fields)
    source.write_text("\n".join(lines) + "\n")
    assert prepare(source, tmp_path / "out", "time:ts") == 0
    meta = read_meta(tmp_path / "out")
    assert sum(s["rows"] for s in meta["splits"].values()) == ROWS - 2
    err = capsys.readouterr().err
    assert "line 6: bad label (expected 0 or 1): click='yes'" in err and "2 malformed row(s)" in err, err
    assert prepare(source, tmp_path / "x", "time:when") == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no column 'when'; it has pos, ts, click" in err, err
    assert prepare(source, tmp_path / "y", "weekly") == 1
    assert "expected random, tail or time:COLUMN" in capsys.readouterr().err


def test_a_parquet_file_s_bad_rows_are_named_by_row(tmp_path, capsys):
    t = table()
    clicks = t.column("click").to_pylist()
    clicks[4] = "yes"  # row 5, counting from 1
    pq.write_table(t.set_column(2, "click", pa.array(clicks)), tmp_path / "clicks.parquet")
    assert prepare(tmp_path / "clicks.parquet", tmp_path / "out", "time:ts") == 0
    err = capsys.readouterr().err
    assert "row 5: bad label (expected 0 or 1): click='yes'" in err and "line 5" not in err, err


def test_prepared_own_data_trains_and_serves_the_files_own_columns(tmp_path, capsys):
    """Prepared, trained (no cache warning), exported, and the original file scored by
    `dlrm predict` through its own column names (the others left out), as `predict` scores
    the same rows by feature."""
    source = tmp_path / "clicks.csv"
    write_text(source, table(), ",")
    assert prepare(source, tmp_path / "out", "random", "--dense-transform", "none") == 0
    capsys.readouterr()
    assert main(["dlrm", "train", "--data", str(tmp_path / "out"), "--max-steps", "2", "--batch-size", "256",
                 "--embedding-dim", "4", "--dense-arch", "8", "--over-arch", "8", "--device", "cpu",
                 "--checkpoint-dir", str(tmp_path / "ck"), "--no-progress"]) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out.strip().splitlines()[-1])
    assert summary["steps"] == 2 and summary["overflow_rows"] == 0, summary
    assert "a batch needs" not in captured.err
    assert main(["dlrm", "export", str(tmp_path / "ck"), "--out", str(tmp_path / "export")]) == 0
    assert main(["dlrm", "predict", str(tmp_path / "export"), "--input", str(source), "--out",
                 str(tmp_path / "p.parquet"), "--no-progress"]) == 0
    got = pq.read_table(tmp_path / "p.parquet")
    from embcache.serve import load_export

    model = load_export(tmp_path / "export")
    assert model.manifest["dense_transform"] is None
    rows = [{"sparse_0": r["user"], "sparse_1": r["ts_id"], "sparse_2": r["pos_id"], "dense": [float(r["price"])]}
            for r in table().to_pylist()]
    np.testing.assert_allclose(got.column("probability").to_numpy(), model.predict(rows), rtol=1e-6)
    assert got.column("label").to_pylist() == [int(v) for v in table().column("click").to_pylist()]
    write_text(tmp_path / "no_user.csv", table().drop_columns(["user"]), ",")
    assert main(["dlrm", "predict", str(tmp_path / "export"), "--input", str(tmp_path / "no_user.csv"), "--out",
                 str(tmp_path / "q.csv"), "--no-progress"]) == 1
    assert "no column 'user': the model was trained on user, ts_id, pos_id, price" in capsys.readouterr().err
