"""The data a saved CF model was trained on, and how it was split. `cf train --save` records
it with the model (the whole model's .npz, the .npy's .json, the Parquet schema; a
checkpoint's settings hold it already), so that `cf evaluate FILE` scores the model on that
split's test rows by default: a different split would draw test rows the model trained on
and print a Recall that means nothing. A split option given on the command line that
differs from the record is refused; a model saved before records were kept is evaluated as
the flags say, with a note.

Example:
    >>> shaping("ml-100k")
    ('split', 'test_fraction', 'split_seed', 'min_rating')
    >>> resolved_split({"data": "clicks.csv", "split": "auto", "time_col": "ts"})
    'time'
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from embcache.errors import UserFacingError

SPLITTING = ("split", "test_fraction", "split_seed", "min_rating")
COLUMNS = ("user_col", "item_col", "time_col", "rating_col")
SYNTHETIC = ("test_fraction", "split_seed", "synthetic_users", "synthetic_items", "synthetic_interactions")
RECORDED = ("data", *COLUMNS, *SPLITTING, *SYNTHETIC[2:], "skip_bad_lines")  # the flags a record gives


def data_kind(spec: str) -> str:
    """'ml-100k', 'synthetic', 'lightgcn', 'table' (your CSV/TSV/Parquet) or 'ratings'."""
    from embcache.cf.data.table import is_table

    if spec in ("ml-100k", "synthetic"):
        return spec
    path = Path(spec)
    if path.is_dir() and ((path / "train.txt").exists() or (path / "test.txt").exists()):
        return "lightgcn"
    return "table" if is_table(path) else "ratings"


def shaping(kind: str) -> tuple[str, ...]:
    """The settings that decide which rows of data of `kind` are test rows."""
    return {"table": (*COLUMNS, *SPLITTING), "ratings": SPLITTING, "ml-100k": SPLITTING, "synthetic": SYNTHETIC,
            "lightgcn": ()}[kind]


def resolved_split(values: dict) -> str:
    """--split as `read_interactions` takes it: 'auto' is by time where a table file has a
    time column, else random."""
    from embcache.cf.data.table import is_table

    split = values.get("split") or "auto"
    if split == "auto":
        return "time" if values.get("time_col") and is_table(values["data"]) else "random"
    return split


def record(cfg, data) -> dict:
    """What `cfg` (its data settings) read and split into `data`, for the model file."""
    from embcache.cf.trainer import data_fingerprint

    kind = data_kind(cfg.data)
    values = {name: getattr(cfg, name) for name in shaping(kind)}
    if "split" in values:
        values["split"] = resolved_split({"data": cfg.data, "split": cfg.split, "time_col": cfg.time_col})
    where = cfg.data if kind in ("ml-100k", "synthetic") else str(Path(cfg.data).resolve())
    return {"data": where, **values, "skip_bad_lines": bool(cfg.skip_bad_lines),
            "fingerprint": data_fingerprint(data)}


def read_saved(path) -> tuple[dict | None, tuple | None, bool]:
    """(the record saved with the embeddings file `path`, or None; (train_indptr,
    train_indices) where `path` is a whole model, else None; whether `path` could be read at
    all). A file that cannot be read is left to the loader, which names what is wrong with
    it. A checkpoint's record is `checkpoint_record`'s, from the checkpoint loaded first."""
    found = _read_saved(Path(path))
    record = found[0]
    if record is not None and not (isinstance(record, dict) and isinstance(record.get("data"), str)):
        raise UserFacingError(f"{path}: its record of the data it was trained on is not one embcache writes "
                              f"({str(record)[:80]}); not used")
    if found[1] is not None and not _pairs_fit(*found[1]):
        raise UserFacingError(f"{path}: its training items do not fit together (a damaged file?); not used")
    return found


def _pairs_fit(indptr: np.ndarray, indices: np.ndarray) -> bool:
    """Whether a model's (train_indptr, train_indices) are a CSR matrix: else removing its
    training pairs from the test split stops in a numpy traceback."""
    return (indptr.ndim == indices.ndim == 1 and len(indptr) > 0 and indptr.dtype.kind in "iu"
            and indices.dtype.kind in "iu" and indptr[0] == 0 and indptr[-1] == len(indices)
            and bool((np.diff(indptr) >= 0).all()) and (indices.size == 0 or int(indices.min()) >= 0))


def _read_saved(path: Path) -> tuple[dict | None, tuple | None, bool]:
    """`read_saved`'s reading, whose record may hold anything when the file is from someone else."""
    try:
        if path.suffix == ".npy" and Path(str(path) + ".json").is_file():
            return json.loads(Path(str(path) + ".json").read_text()).get("trained_on"), None, True
        if path.suffix == ".parquet" and path.is_file():
            import pyarrow.parquet as pq

            return json.loads(pq.read_schema(path).metadata[b"embcache_cf"]).get("trained_on"), None, True
        if path.suffix == ".npz" and path.is_file():
            return _npz_record(path)
    except Exception:  # numpy, zipfile, pyarrow, json and torch each raise their own: the loader says what
        pass
    return None, None, False


def _npz_record(path: Path) -> tuple[dict | None, tuple | None, bool]:
    from embcache.cf.model import FORMAT
    from embcache.integrity import open_verified

    with open_verified(path, "CF model") as f, np.load(f, allow_pickle=False) as z:  # no zip bomb inflates here
        meta = json.loads(str(z["meta"]))
        pairs = (z["train_indptr"], z["train_indices"]) if meta.get("format") == FORMAT else None
    return meta.get("trained_on"), pairs, True


def checkpoint_record(saved: dict) -> dict | None:
    """The data settings of a checkpoint whose settings are `saved` (None before they held
    the data's)."""
    if "data" not in saved:
        return None
    values = {name: saved[name] for name in shaping(data_kind(saved["data"])) if name in saved}
    if "split" in values:
        values["split"] = resolved_split(saved)
    return {"data": saved["data"], **values, "skip_bad_lines": bool(saved.get("skip_bad_lines"))}


def evaluation_settings(path, given: dict, saved: dict | None) -> dict:
    """The data settings to evaluate `path` with: those `given` on the command line over the
    `saved` record. A given setting that splits the data otherwise than the record is
    refused in one line: the test rows it draws would include rows the model trained on."""
    if saved is None:
        return dict(given)
    differ = []
    for name in shaping(data_kind(saved["data"])):
        if name in given and name in saved:
            mine = resolved_split({**saved, **given}) if name == "split" else given[name]
            if mine != saved[name]:
                was = "none" if saved[name] is None else saved[name]
                differ.append(f"--{name.replace('_', '-')} {mine} (the model's: {was})")
    if differ:
        raise UserFacingError(f"{path} was trained on {describe(saved)}; {', '.join(differ)} would test it on rows "
                              f"it trained on: leave {'it' if len(differ) == 1 else 'them'} out to use the model's "
                              f"split")
    return {**{name: saved[name] for name in RECORDED if name in saved}, **given}


def describe(saved: dict) -> str:
    """"clicks.csv split by time (20 % held out per user)", from a record."""
    name = saved["data"] if saved["data"] in ("ml-100k", "synthetic") else Path(saved["data"]).name
    if "split" not in saved:
        return name if "split_seed" not in saved else f"{name} (split seed {saved['split_seed']})"
    how = f"by --time-col {saved['time_col']}" if saved["split"] == "time" and saved.get("time_col") else \
        ("at random" + (f" (seed {saved['split_seed']})" if "split_seed" in saved else "") if saved["split"] == "random"
         else f"by {saved['split']}")
    return f"{name} split {how}, {saved['test_fraction']:g} held out per user"


def check_same_data(path, saved: dict | None, data) -> None:
    """Refuse `data` in one line when it is not the split recorded with `path`."""
    from embcache.cf.trainer import data_fingerprint, other_data

    was = (saved or {}).get("fingerprint")
    now = data_fingerprint(data)
    if was is not None and was != now:
        raise UserFacingError(f"{path} was trained on other data ({describe(saved)}: "
                              f"{other_data(was, now, data.name or 'this data')})")


def drop_trained_pairs(data, train_indptr: np.ndarray, train_indices: np.ndarray) -> int:
    """Remove from `data`'s test split the pairs the model trained on (a whole model knows
    them); how many. Without this a split other than the model's scores it on rows it
    has seen."""
    from embcache.cf.data.interactions import to_csr

    if len(train_indptr) != data.num_users + 1 or not len(data.test_indices):
        return 0  # other data altogether: the loader refuses the shapes
    n = max(data.num_items, int(train_indices.max(initial=-1)) + 1)
    users = np.repeat(np.arange(data.num_users, dtype=np.int64), np.diff(data.test_indptr))
    keys = users * n + data.test_indices
    seen = np.repeat(np.arange(data.num_users, dtype=np.int64), np.diff(train_indptr)) * n + train_indices
    trained = np.isin(keys, seen)
    if trained.any():
        data.test_indptr, data.test_indices = to_csr(users[~trained], data.test_indices[~trained], data.num_users)
    return int(trained.sum())
