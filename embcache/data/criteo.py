"""Criteo click logs -> the canonical CTR format.

Both releases share one line layout: label, 13 integer counts (I1-I13), 26 categorical values
(C1-C26, 8 hex digits), tab-separated, an empty field where a value is missing.

* Kaggle Display Advertising Challenge `train.txt` (45.8M lines, 7 days in order). Split as the
  DLRM reference does: the last seventh of the rows (the last day) is held out, its first half
  is val and its second half test; the rest is train, in file order.
* Terabyte `day_0` .. `day_23` (optionally `.gz`). Days 0-22 are train, day 23 is held out and
  split in halves (first val, then test). `days` may select fewer; the last one listed is the
  held-out day.

Dense values: negatives clamped to 0, then log(x + 1); missing -> 0. Categorical values ->
contiguous ids per feature (see `vocabulary`: id 0 = missing or rarer than `min_count`), or with
`keys="raw"` each value's own 64-bit key (`delimited.string_keys`: the 8 hex digits' bytes;
0 = missing), no vocabulary. Terabyte with `day_splits`: each input day is also a split,
`day_<n>` (n as in the file's name), over the same shards.
Malformed lines (wrong field count, label other than 0/1, a count that is not a number, empty
lines) are skipped, counted per file with their first line numbers, printed and stored in meta.json.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pyarrow as pa

from embcache.errors import DataFormatError, format_error
from embcache.data.converter import Parsed, RowChecks, TextSource, convert
from embcache.data.delimited import parse_count_feature, parse_label, string_keys

DENSE = [f"I{j}" for j in range(1, 14)]
CATEGORICAL = [f"C{j}" for j in range(1, 27)]
COLUMNS = ["label", *DENSE, *CATEGORICAL]
TERABYTE_DAYS = 24


def parse_criteo_block(block: pa.RecordBatch) -> Parsed:
    checks = RowChecks(block)
    label, ok = parse_label(block.column("label"))
    checks.require(ok, "bad label", "label")
    dense = []
    for name in DENSE:
        values, ok = parse_count_feature(block.column(name))
        checks.require(ok, "unparsable number", name)
        dense.append(values)
    keys = np.stack([string_keys(block.column(name)) for name in CATEGORICAL], 1)
    good = checks.ok
    return Parsed(good, label[good], np.stack(dense, 1)[good], keys[good], checks.reasons)


def _source(files: list[Path], assign, prescan: list[int] | None = None,
            day_splits: list[str] | None = None) -> TextSource:
    return TextSource(files=files, columns=COLUMNS, delimiter="\t", header=False,
                      dense_names=[f"log(max({n},0)+1), missing -> 0" for n in DENSE],
                      sparse_names=[f"{n} id" for n in CATEGORICAL], parse=parse_criteo_block, assign=assign,
                      sparse_columns=list(CATEGORICAL), prescan=prescan, day_splits=day_splits)


def kaggle_split(total: int) -> tuple[int, int]:
    """(end of train, end of val) row indices: the last `total // 7` rows are the held-out day,
    halved into val then test."""
    held_out = total // 7
    train_end = total - held_out
    return train_end, train_end + held_out // 2


def convert_criteo_kaggle(input_path: str | os.PathLike, out_dir: str | os.PathLike, min_count: int = 1,
                          max_ids: int | None = None, progress: bool = True, **kwargs) -> dict:
    """Convert Kaggle's `train.txt` (or `train.txt.gz`); returns meta. `kwargs` go to `convert`."""
    def assign(file_index, rows, good_per_file, aux):
        train_end, val_end = kaggle_split(good_per_file[0])
        return np.where(rows < train_end, 0, np.where(rows < val_end, 1, 2))

    path = Path(input_path)
    return convert(_source([path], assign), out_dir, source=f"Criteo Kaggle ({path.name})",
                   min_count=min_count, max_ids=max_ids, progress=progress,
                   extra_meta={"split_protocol": "last 1/7 of rows held out: first half val, second half test"},
                   **kwargs)


def parse_days(spec: str) -> list[int]:
    """'0-22,23' -> [0, ..., 23]; order kept, duplicates and days outside 0-23 refused."""
    days: list[int] = []
    for part in spec.split(","):
        m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if not m:
            raise DataFormatError(f"--days {spec!r}: expected numbers and ranges such as 0-22,23")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if hi < lo:
            raise DataFormatError(f"--days {spec!r}: range {lo}-{hi} runs backwards")
        if hi >= TERABYTE_DAYS:
            raise DataFormatError(f"--days {spec!r}: day {hi} does not exist (the Terabyte set has days "
                                  f"0-{TERABYTE_DAYS - 1})")
        days += range(lo, hi + 1)
    if len(set(days)) != len(days):
        raise DataFormatError(f"--days {spec!r}: a day is listed twice")
    return days


def terabyte_files(input_dir: str | os.PathLike, days: list[int]) -> list[Path]:
    """`day_N` or `day_N.gz` for each day; a missing one is a one-line error."""
    directory = Path(input_dir)
    if not directory.is_dir():
        raise format_error(directory, None, "no such directory")
    files = []
    for d in days:
        for name in (f"day_{d}", f"day_{d}.gz"):
            if (directory / name).is_file():
                files.append(directory / name)
                break
        else:
            raise format_error(directory / f"day_{d}", None, "missing (neither it nor its .gz is here)")
    return files


def convert_criteo_terabyte(input_dir: str | os.PathLike, out_dir: str | os.PathLike, days: list[int] | str | None = None,
                            min_count: int = 1, max_ids: int | None = None, progress: bool = True,
                            day_splits: bool = False, **kwargs) -> dict:
    """Convert Terabyte days (default all 24); the last listed day is split into val / test.
    With `day_splits`, each day is a split too (`day_<n>`, the whole day, the held-out one as
    val then test), over the same shards (cut at each day's end), and meta.json's
    "day_splits" lists them in order: `[{"split": "day_0", "rows": ...}, ...]`."""
    days = list(range(TERABYTE_DAYS)) if days is None else parse_days(days) if isinstance(days, str) else list(days)
    if len(days) < 2:
        raise DataFormatError("--days: need at least two days (training days, then the held-out day)")
    files = terabyte_files(input_dir, days)
    last = len(files) - 1

    def assign(file_index, rows, good_per_file, aux):
        if file_index < last:
            return np.zeros(len(rows), dtype=np.int64)
        return np.where(rows < good_per_file[last] // 2, 1, 2)

    names = [f"day_{d}" for d in days] if day_splits else None
    return convert(_source(files, assign, prescan=[last], day_splits=names), out_dir,
                   source=f"Criteo Terabyte (days {days})", min_count=min_count, max_ids=max_ids, progress=progress,
                   extra_meta={"days": days, "split_protocol": f"days {days[:-1]} train; day {days[-1]}: "
                                                                f"first half val, second half test"},
                   **kwargs)
