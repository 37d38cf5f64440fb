"""Avazu click logs (Kaggle "Click-Through Rate Prediction", `train.csv` or `train.gz`:
40.4M rows, 10 days, 2014-10-21..30) -> the canonical CTR format.

CSV with a header: id, click, hour (YYMMDDHH), then 21 categorical columns. `id` is dropped;
`click` is the label; `hour` becomes two categorical features, hour of day and weekday, and
the one dense feature DLRM needs (hour of day / 23: Avazu has no numeric columns). The 21
categorical columns follow as sparse_2..sparse_22, ids as in `vocabulary`.

Splits: "random" (default) sends each row to train / val / test with probability 8:1:1 by a
seeded hash of its position (the common 8:1:1 random protocol; streams, reproducible); "time"
holds out the last two days present: the day before the last is val, the last is test.
Malformed rows (wrong field count, label other than 0/1, an hour that is not YYMMDDHH, empty
lines) are skipped, counted per file and stored in meta.json. With `keys="raw"` the sparse
columns hold each value's 64-bit key instead (hour + 1 and weekday + 1 for the two derived
features, `delimited.string_keys` for the others; 0 = missing), no vocabulary, and the random
split needs no first pass.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from embcache.errors import check_whole
from embcache.data.converter import (
    Parsed,
    RowChecks,
    TextSource,
    convert,
    hashed_fraction,
)
from embcache.data.delimited import parse_label, string_keys

CATEGORICAL = ["C1", "banner_pos", "site_id", "site_domain", "site_category", "app_id", "app_domain",
               "app_category", "device_id", "device_ip", "device_model", "device_type", "device_conn_type",
               "C14", "C15", "C16", "C17", "C18", "C19", "C20", "C21"]
COLUMNS = ["id", "click", "hour", *CATEGORICAL]
SPLIT_METHODS = ("random", "time")


def parse_avazu_block(block: pa.RecordBatch) -> Parsed:
    checks = RowChecks(block)
    label, ok = parse_label(block.column("click"))
    checks.require(ok, "bad label", "click")
    hour_text = block.column("hour")
    well_formed = pc.match_substring_regex(hour_text, r"^[0-9]{8}$").to_numpy(zero_copy_only=False)
    stamp = pc.strptime(pc.if_else(pa.array(well_formed), hour_text, "00010100"), format="%y%m%d%H",
                        unit="s", error_is_null=True)
    valid_time = well_formed & pc.is_valid(stamp).to_numpy(zero_copy_only=False)
    checks.require(valid_time, "bad hour (expected YYMMDDHH)", "hour")
    good = checks.ok
    stamp = pc.filter(stamp, pa.array(good))
    hour = pc.hour(stamp).to_numpy(zero_copy_only=False).astype(np.int64)
    weekday = pc.day_of_week(stamp).to_numpy(zero_copy_only=False).astype(np.int64)
    day = (pc.cast(stamp, pa.int64()).to_numpy(zero_copy_only=False) // 86_400).astype(np.int64)
    keys = [(hour + 1).astype(np.uint64), (weekday + 1).astype(np.uint64)]  # key 0 means missing
    keys += [string_keys(block.column(name))[good] for name in CATEGORICAL]
    return Parsed(good, label[good], (hour / 23.0).astype(np.float32)[:, None], np.stack(keys, 1),
                  checks.reasons, aux={"day": day})


def convert_avazu(input_path: str | os.PathLike, out_dir: str | os.PathLike, split: str = "random", seed: int = 0,
                  min_count: int = 1, max_ids: int | None = None, progress: bool = True, **kwargs) -> dict:
    """Convert Avazu's `train.csv` / `train.gz`; returns meta. `kwargs` go to `convert`."""
    if split not in SPLIT_METHODS:
        raise ValueError(f"split must be one of {SPLIT_METHODS}, got {split!r}")
    check_whole("seed", seed, 0, 2**32)
    last_day = [None]

    def observe(aux, line_of):
        if len(aux["day"]):
            top = int(aux["day"].max())
            last_day[0] = top if last_day[0] is None else max(last_day[0], top)

    def assign(file_index, rows, good_per_file, aux):
        if split == "random":
            u = hashed_fraction(seed, file_index, rows)
            return np.where(u < 0.8, 0, np.where(u < 0.9, 1, 2))
        day = aux["day"]
        return np.where(day < last_day[0] - 1, 0, np.where(day == last_day[0] - 1, 1, 2))

    path = Path(input_path)
    src = TextSource(files=[path], columns=COLUMNS, delimiter=",", header=True,
                     dense_names=["hour of day / 23"],
                     sparse_names=["hour of day", "weekday (0 = Monday)", *CATEGORICAL],
                     parse=parse_avazu_block, assign=assign, observe=observe,
                     sparse_columns=[None, None, *CATEGORICAL], sparse_keys=["int+1", "int+1"] + ["string"] * 21,
                     prescan=[] if split == "random" else None)
    protocol = ("random 8:1:1 by a hash of (seed, row position)" if split == "random"
                else "by day: the last day is test, the day before val, the rest train")
    return convert(src, out_dir, source=f"Avazu ({path.name})", min_count=min_count, max_ids=max_ids,
                   progress=progress, extra_meta={"split_protocol": protocol, "split_seed": seed if split == "random" else None},
                   **kwargs)
