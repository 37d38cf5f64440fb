"""The canonical CTR format every converter writes and the DLRM trainer reads.

A dataset directory holds::

    meta.json                    what is below, and how it was made
    id_freq.npz                  per-feature id counts over the train split
    train/part-00000.parquet     shards of each split (also val/, test/)

Columns: `label` int8; `dense_0..dense_{k-1}` float32; `sparse_0..sparse_{m-1}` int64 ids already
in `[0, cardinality)`, or `list<int64>` for a multi-hot feature. meta.json::

    {"format": "embcache-ctr", "version": 1, "num_dense": k,
     "sparse": [{"name": "sparse_0", "cardinality": c, "multi_hot": false}, ...],
     "splits": {"train": {"files": ["train/part-00000.parquet"], "rows": n}, "val": ..., "test": ...},
     "id_frequency_file": "id_freq.npz", "source": "...", "bad_rows": {file: {count, first_lines, ...}}}

plus converter-specific keys (e.g. "oracle_auc", "id_mapping"). meta.json is written last and
atomically, so a directory with a meta.json is a complete data set. Writing streams: a converter
hands `CTRDatasetWriter.write` one chunk at a time, and shards are cut at `rows_per_shard`.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from embcache.errors import (
    DataFormatError,
    DataOutputError,
    check_whole,
    first_line,
    format_error,
    writing,
)
from embcache.data.frequency import IdFrequency, load_frequency_file

FORMAT = "embcache-ctr"
VERSION = 1
SPLITS = ("train", "val", "test")
META = "meta.json"
FREQ = "id_freq.npz"


@dataclass(frozen=True)
class SparseFeature:
    """One categorical feature: its column name, number of ids, and whether a row holds a
    list of ids (multi-hot) rather than exactly one."""

    name: str
    cardinality: int
    multi_hot: bool = False


def arrow_schema(num_dense: int, sparse: list[SparseFeature]) -> pa.Schema:
    fields = [pa.field("label", pa.int8())]
    fields += [pa.field(f"dense_{j}", pa.float32()) for j in range(num_dense)]
    fields += [pa.field(f.name, pa.list_(pa.int64()) if f.multi_hot else pa.int64()) for f in sparse]
    return pa.schema(fields)


def multi_hot(offsets: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The chunk form of a multi-hot column for `write`: CSR offsets `[n+1]` and flat ids."""
    return np.asarray(offsets, dtype=np.int32), np.asarray(values, dtype=np.int64)


class CTRDatasetWriter:
    """Writes a data set in the canonical format, chunk by chunk.

    Args:
        out_dir: created if missing. Old shards, meta.json and id_freq.npz there are removed
            first, so a half-rewritten directory never looks complete.
        num_dense: number of dense columns.
        sparse: the categorical features, in column order.
        source: one line saying where the data came from (stored in meta.json).
        rows_per_shard: a new Parquet file every this many rows of a split.
        row_group_rows: Parquet row-group size; the loader's memory is bounded by it.

    Example:
        >>> w = CTRDatasetWriter(tmp, num_dense=1, sparse=[SparseFeature("sparse_0", 3)], source="doc")  # doctest: +SKIP
        >>> w.write("train", np.array([1, 0]), np.zeros((2, 1)), [np.array([2, 0])])  # doctest: +SKIP
        >>> w.finish()  # doctest: +SKIP
    """

    def __init__(self, out_dir: str | os.PathLike, num_dense: int, sparse: list[SparseFeature],
                 source: str, rows_per_shard: int = 2_000_000, row_group_rows: int = 65_536):
        check_whole("rows_per_shard", rows_per_shard, 1)
        check_whole("row_group_rows", row_group_rows, 1)
        self.out = Path(out_dir)
        self.num_dense, self.sparse, self.source = num_dense, list(sparse), source
        self.rows_per_shard, self.row_group_rows = int(rows_per_shard), int(row_group_rows)
        self.schema = arrow_schema(num_dense, self.sparse)
        self.frequency = IdFrequency({f.name: f.cardinality for f in self.sparse})
        self.splits: dict[str, dict] = {s: {"files": [], "rows": 0} for s in SPLITS}
        # one open shard per split, so interleaved writes to several splits (a random split)
        # still fill every shard to rows_per_shard: split -> [writer, rows in its shard]
        self._open: dict[str, list] = {}
        self._prepare_directory()

    def _prepare_directory(self) -> None:
        with writing(self.out):
            self.out.mkdir(parents=True, exist_ok=True)
            for name in (META, FREQ):
                (self.out / name).unlink(missing_ok=True)
            for split in SPLITS:
                for old in (self.out / split).glob("part-*.parquet"):
                    old.unlink()

    def write(self, split: str, label, dense, sparse: list) -> None:
        """Append one chunk of rows to `split`.

        Args:
            label: `[n]` 0/1.
            dense: `[n, num_dense]` (already transformed; stored as float32).
            sparse: one entry per feature: `[n]` int ids for a one-hot feature, or the
                `(offsets, values)` pair of `multi_hot` for a multi-hot one.
        Ids outside `[0, cardinality)` raise ValueError: a converter bug, not bad input.
        """
        if split not in self.splits:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        label = np.asarray(label, dtype=np.int8)
        n = len(label)
        if n == 0:
            return
        dense = np.asarray(dense, dtype=np.float32).reshape(n, self.num_dense)
        if len(sparse) != len(self.sparse):
            raise ValueError(f"{len(sparse)} sparse columns, expected {len(self.sparse)}")
        columns = [pa.array(label)] + [pa.array(dense[:, j]) for j in range(self.num_dense)]
        for feature, col in zip(self.sparse, sparse):
            if feature.multi_hot:
                offsets, ids = multi_hot(*col)
            else:
                ids = np.asarray(col, dtype=np.int64)
            if len(ids) and (ids.min() < 0 or ids.max() >= feature.cardinality):
                raise ValueError(f"{feature.name}: ids in [{ids.min()}, {ids.max()}] outside "
                                 f"[0, {feature.cardinality})")
            if feature.multi_hot:
                if len(offsets) != n + 1 or offsets[0] != 0 or offsets[-1] != len(ids):
                    raise ValueError(f"{feature.name}: offsets do not describe {n} rows of {len(ids)} ids")
                columns.append(pa.ListArray.from_arrays(pa.array(offsets), pa.array(ids)))
            else:
                if len(ids) != n:
                    raise ValueError(f"{feature.name}: {len(ids)} ids for {n} rows")
                columns.append(pa.array(ids))
            if split == "train":
                self.frequency.update(feature.name, ids)
        table = pa.Table.from_arrays(columns, schema=self.schema)
        start = 0
        while start < n:  # cut at shard boundaries
            shard = self._open.get(split)
            if shard is None or shard[1] >= self.rows_per_shard:
                shard = self._open_shard(split)
            take = min(n - start, self.rows_per_shard - shard[1])
            with writing(self.out / self.splits[split]["files"][-1]):
                shard[0].write_table(table.slice(start, take), row_group_size=self.row_group_rows)
            shard[1] += take
            self.splits[split]["rows"] += take
            start += take

    def _open_shard(self, split: str) -> list:
        """Close `split`'s full shard (if any) and open its next one; the others stay open."""
        self._close_shard(split)
        relative = f"{split}/part-{len(self.splits[split]['files']):05d}.parquet"
        with writing(self.out / relative):
            (self.out / split).mkdir(parents=True, exist_ok=True)
            self._open[split] = [pq.ParquetWriter(self.out / relative, self.schema, compression="zstd"), 0]
        self.splits[split]["files"].append(relative)
        return self._open[split]

    def _close_shard(self, split: str) -> None:
        shard = self._open.pop(split, None)
        if shard is not None:
            with writing(self.out / self.splits[split]["files"][-1]):
                shard[0].close()

    def finish(self, bad_rows: dict | None = None, **extra) -> dict:
        """Close the open shards, write id_freq.npz, then meta.json (atomically); return meta."""
        for split in list(self._open):
            self._close_shard(split)
        meta = {"format": FORMAT, "version": VERSION, "num_dense": self.num_dense,
                "sparse": [asdict(f) for f in self.sparse], "splits": self.splits,
                "id_frequency_file": FREQ, "source": self.source, "bad_rows": bad_rows or {}, **extra}
        with writing(self.out):
            self.frequency.save(self.out / FREQ)
            tmp = self.out / f".{META}.tmp-{os.getpid()}"
            tmp.write_text(json.dumps(meta, indent=1) + "\n")
            os.replace(tmp, self.out / META)
        return meta


def check_output_dir(out_dir: str | os.PathLike) -> Path:
    """Create `out_dir` if needed and make sure a file can be written there, so that a converter
    fails at once, not after an hour-long first pass. DataOutputError (one line) otherwise."""
    out = Path(out_dir)
    with writing(out):
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    return out


def read_meta(data_dir: str | os.PathLike) -> dict:
    """meta.json of a prepared data set, checked: format, version, keys, and that every shard
    it lists exists. Raises DataFormatError (one line naming the file) otherwise."""
    path = Path(data_dir) / META
    if not path.is_file():
        raise format_error(path, None, "missing; prepare the data with `embcache data prepare ...`")
    try:
        meta = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as err:
        raise format_error(path, None, f"cannot read: {err}") from None
    except json.JSONDecodeError as err:
        raise format_error(path, err.lineno, f"not JSON: {err.msg}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise format_error(path, None, f"not an {FORMAT} meta.json (format={meta.get('format')!r})"
                           if isinstance(meta, dict) else f"not an {FORMAT} meta.json")
    if meta.get("version") != VERSION:
        raise format_error(path, None, f"version {meta.get('version')!r}; this code reads version {VERSION}")
    for key in ("num_dense", "sparse", "splits", "id_frequency_file"):
        if key not in meta:
            raise format_error(path, None, f"lacks the key {key!r}")
    for split, info in meta["splits"].items():
        for rel in info.get("files", []):
            if not (Path(data_dir) / rel).is_file():
                raise format_error(path, None, f"lists {rel} (split {split!r}) but that file is missing")
    return meta


def load_id_frequencies(data_dir: str | os.PathLike) -> dict:
    """`{feature name: int64 torch.Tensor of counts}` over the train split, one count per id."""
    import torch

    meta = read_meta(data_dir)
    path = Path(data_dir) / meta["id_frequency_file"]
    try:
        counts = load_frequency_file(path)
    except (OSError, ValueError) as err:
        raise format_error(path, None, f"cannot read id frequencies: {err}") from None
    for f in meta["sparse"]:
        if f["name"] not in counts:
            raise format_error(path, None, f"has no counts for {f['name']}")
        if len(counts[f["name"]]) != f["cardinality"]:
            raise format_error(path, None, f"{f['name']} has {len(counts[f['name']])} counts, "
                                           f"cardinality is {f['cardinality']}")
    return {f["name"]: torch.from_numpy(counts[f["name"]]) for f in meta["sparse"]}


def sparse_features(meta: dict) -> list[SparseFeature]:
    return [SparseFeature(f["name"], int(f["cardinality"]), bool(f.get("multi_hot", False)))
            for f in meta["sparse"]]


def read_shard(pf: pq.ParquetFile, path: str | os.PathLike, **kwargs) -> Iterator[pa.RecordBatch]:
    """`pf.iter_batches(**kwargs)`, a damaged or truncated shard being one line naming `path`."""
    batches = pf.iter_batches(**kwargs)
    while True:
        try:
            record = next(batches)
        except StopIteration:
            return
        except (OSError, pa.ArrowException) as err:
            raise format_error(path, None,
                               f"cannot read Parquet shard (damaged or truncated?): {first_line(err)}") from None
        yield record


def head_rows(data_dir: str | os.PathLike, split: str, n: int = 5) -> list[dict]:
    """The first `n` rows of a split as dicts (reads one record batch, whatever the size)."""
    meta = read_meta(data_dir)
    rows: list[dict] = []
    if n <= 0:
        return rows
    for rel in meta["splits"].get(split, {}).get("files", []):
        path = Path(data_dir) / rel
        try:
            pf = pq.ParquetFile(path)
        except (OSError, pa.ArrowException) as err:
            raise format_error(path, None, f"cannot read Parquet shard: {first_line(err)}") from None
        for batch in read_shard(pf, path, batch_size=n):
            rows += batch.to_pylist()[: n - len(rows)]
            if len(rows) >= n:
                return rows
    return rows


__all__ = ["FORMAT", "VERSION", "SPLITS", "SparseFeature", "CTRDatasetWriter", "arrow_schema",
           "multi_hot", "read_meta", "load_id_frequencies", "sparse_features", "read_shard", "head_rows",
           "DataFormatError", "DataOutputError", "check_output_dir"]
