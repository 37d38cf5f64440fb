"""`data prepare own --split time:COL` on times with a zone (`Z`, `+02:00`, `+0200`, `-05`): they
were no time at all (pyarrow's formats had no zone), every row skipped, "no usable rows"; now
each is its UTC instant, as a Parquet timestamp with a tz is. A column holding times with and
without a zone is refused in one line naming both, across blocks. Tiny files: a second or two."""
from __future__ import annotations

import datetime as dt

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from embcache.cli import main
from embcache.data.ctr_format import read_meta, read_shard
from embcache.data.own import convert_own
from embcache.errors import DataFormatError

# instant k is 2024-03-01 0k:00 UTC; written in zones whose clocks do not keep that order
ZONED = ["2024-03-01T02:00:00+02:00", "2024-03-01T01:00:00Z", "2024-03-01T04:00:00+0200", "2024-02-29T22:00:00-05",
         "2024-03-01 04:00:00z", "2024-03-01T05:00:00+00:00", "2024-03-01T01:00:00-05:00", "2024-03-01T10:30:00+03:30"]
UTC = [f"2024-03-01T{k:02d}:00:00" for k in range(8)]  # the same instants without a zone
ORDER = [5, 2, 7, 0, 3, 6, 1, 4]  # the file's row order: instant ORDER[i] on row i


def _csv(path, times: list[str]):
    path.write_text("click,price,rank,ts\n" + "".join(f"{i % 2},{i}.5,{k},{times[k]}\n" for i, k in enumerate(ORDER)))
    return path


def _prepare(source, out) -> int:
    return main(["data", "prepare", "own", "--input", str(source), "--out", str(out), "--label-col", "click",
                 "--dense-cols", "price", "--sparse-cols", "rank", "--split", "time:ts", "--held-out", "0.5",
                 "--no-progress"])


def _ranks_by_split(out) -> dict[str, list[int]]:
    """Each split's instants (the `rank` column's raw values), sorted."""
    meta = read_meta(out)
    raw = pq.read_table(out / meta["raw_values"]["features"]["sparse_0"]["file"]).column("value").to_pylist()
    got = {}
    for split, info in meta["splits"].items():
        ids = [i for rel in info["files"] for batch in read_shard(pq.ParquetFile(out / rel), out / rel)
               for i in batch.column("sparse_0").to_pylist()]
        got[split] = sorted(int(raw[i]) for i in ids)
    return got


# held out 0.5: the latest quarter (instants 6, 7) test, the quarter before (4, 5) val
SPLIT = {"train": [0, 1, 2, 3], "val": [4, 5], "test": [6, 7]}


@pytest.mark.parametrize("times", [ZONED, UTC], ids=["zoned", "zoneless"])
def test_times_with_zones_are_split_as_their_utc_instants(tmp_path, times, capsys):
    assert _prepare(_csv(tmp_path / "clicks.csv", times), tmp_path / "out") == 0, capsys.readouterr().err
    assert _ranks_by_split(tmp_path / "out") == SPLIT
    assert "malformed" not in capsys.readouterr().err


def test_a_parquet_timestamp_with_a_tz_is_split_as_its_utc_instants(tmp_path):
    base = dt.datetime(2024, 3, 1, tzinfo=dt.timezone.utc)
    instants = [base + dt.timedelta(hours=k) for k in ORDER]
    path = tmp_path / "clicks.parquet"
    pq.write_table(pa.table({"click": [str(i % 2) for i in range(8)], "price": np.arange(8.0), "rank": ORDER,
                             "ts": pa.array(instants, pa.timestamp("us", tz="America/New_York"))}), path)
    assert _prepare(path, tmp_path / "out") == 0
    assert _ranks_by_split(tmp_path / "out") == SPLIT


def test_a_column_of_times_with_and_without_a_zone_is_refused_in_one_line(tmp_path, capsys):
    times = [*UTC[:6], *ZONED[6:]]  # rows 0..5 of ORDER hold 5, 2, 7, 0, 3, 6: row 2 (line 4) has the first zone
    path = _csv(tmp_path / "clicks.csv", times)
    assert _prepare(path, tmp_path / "out") == 1
    err = capsys.readouterr().err
    assert err == (f"embcache data: error: {path}:4: 'ts' mixes times with and without a time zone: "
                   f"'{ZONED[7]}' has one, '{UTC[5]}' (line 2) has none; give every time a zone (Z or +hh:mm), "
                   f"or none\n"), err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_the_refusal_names_the_first_time_across_blocks(tmp_path, suffix):
    """Blocks of a row or two: the first time's kind is kept from the block that read it."""
    times = [*ZONED[:6], *UTC[6:]]
    path = _csv(tmp_path / "clicks.csv", times)
    where = "line"
    if suffix == ".parquet":
        pq.write_table(pacsv.read_csv(path, convert_options=pacsv.ConvertOptions(
            column_types={c: pa.string() for c in ("click", "price", "rank", "ts")})), tmp_path / "clicks.parquet")
        path, where = tmp_path / "clicks.parquet", "row"
    first = 2 if where == "line" else 1
    with pytest.raises(DataFormatError) as err:
        convert_own(path, tmp_path / "out", label="click", dense=["price"], sparse=["rank"], split="time:ts",
                    progress=False, block_bytes=40)
    assert str(err.value) == (f"{path}:{first + 2}: 'ts' mixes times with and without a time zone: '{UTC[7]}' has "
                              f"none, '{ZONED[5]}' ({where} {first}) has one; give every time a zone (Z or +hh:mm), "
                              f"or none")
