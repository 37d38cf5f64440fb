"""`cf --split time` on a file's own times: a time with a zone (`Z`, `+02:00`, a Parquet
timestamp with a tz) is ordered by its UTC instant, without numpy's two-line warning of a zone
it reads (deprecated there); a column holding times with and without a zone was read, the
zoneless ones as UTC, a guess, and is refused in one line; numpy's "now" was read as a time.
Tiny files: well under a second."""
from __future__ import annotations

import datetime as dt
import warnings

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from embcache.cf.data.sources import read_interactions
from embcache.errors import DataFormatError

COLUMNS = {"user": "user", "item": "item", "time": "ts"}


def _latest_item(path) -> str:
    """The item the time split holds out for the file's one user (the latest of three)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's "no explicit representation of timezones" was printed
        data = read_interactions(str(path), "time", test_fraction=0.3, columns=COLUMNS)
    assert data.num_test == 1
    return str(data.item_ids[data.test_indices[0]])


def _csv(tmp_path, times: list[str], name: str = "clicks.csv"):
    path = tmp_path / name
    path.write_text("user,item,ts\n" + "".join(f"u,i{k},{t}\n" for k, t in enumerate(times)))
    return path


@pytest.mark.parametrize("times", [
    # 10:00+02:00 is 08:00 UTC: the latest instant is i1's, though i0's clock reads later
    ["2024-03-01T10:00:00+02:00", "2024-03-01T09:30:00Z", "2024-03-01T09:00:00+00:00"],
    ["2024-03-01 10:00:00+0200", "2024-03-01T04:30:00-05:00", "2024-03-01T09:00z"],
])
def test_times_with_zones_are_ordered_as_instants(tmp_path, times):
    assert _latest_item(_csv(tmp_path, times)) == "i1"


def test_a_parquet_timestamp_column_with_a_zone_is_ordered_as_instants(tmp_path):
    # the night Berlin's clocks go back: in UTC 00:30, 01:10, 00:00; on Berlin's clocks 02:30, 02:10, 02:00
    utc = [dt.datetime(2024, 10, 27, 0, 30), dt.datetime(2024, 10, 27, 1, 10), dt.datetime(2024, 10, 27, 0, 0)]
    berlin = pa.array(utc, pa.timestamp("us", tz="Europe/Berlin"))  # stored as UTC
    path = tmp_path / "clicks.parquet"
    pq.write_table(pa.table({"user": ["u"] * 3, "item": ["i0", "i1", "i2"], "ts": berlin}), path)
    assert _latest_item(path) == "i1"


@pytest.mark.parametrize("skip", [False, True])
def test_a_column_of_times_with_and_without_a_zone_is_refused_naming_the_first_unlike_one(tmp_path, skip):
    path = _csv(tmp_path, ["2024-03-01T10:00:00+02:00", "2024-03-01T09:40:00Z", "2024-03-01T09:30:00"])
    with pytest.raises(DataFormatError) as err:
        read_interactions(str(path), "time", columns=COLUMNS, skip_bad_lines=skip)
    text = str(err.value)
    assert text.startswith(f"{path}:4: 'ts' mixes times with and without a time zone: '2024-03-01T09:30:00' has "
                           f"none, '2024-03-01T10:00:00+02:00' (line 2) has one") and "\n" not in text


@pytest.mark.parametrize("value", ["now", "today", "soon"])
def test_a_word_for_a_time_is_no_time(tmp_path, value):
    path = _csv(tmp_path, ["2024-03-01T10:00:00", value, "2024-03-01T09:30:00"])
    with pytest.raises(DataFormatError, match=f"^{path}:3: 'ts' is not a time: '{value}'"):
        read_interactions(str(path), "time", columns=COLUMNS)
