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

Raw keys (`"keys": "raw"` in meta.json; absent or "ids" is the format above): the sparse
columns hold int64 keys, any int64 (a value's 64-bit code, `embcache.keys`; 0 = missing),
for a table without a vocabulary. Then "cardinality" is the number of distinct keys counted
(informational: it bounds nothing), and "id_frequency_file" (key_freq.npz) holds per-key
counts, `<name>.keys` and `<name>.counts` (`frequency.KeyCounter`; read them with
`load_key_frequencies`), described by meta.json's "key_counts" (exact, or capped at
"max_keys_per_feature"). Splits are named freely (`day_0`, `day_1`, ... for data made day by
day, listed in order by "day_splits": `[{"split": "day_0", "rows": n}, ...]`), and a split may
list files another lists too (a day of the train split); a split whose own counts were written
names its file in "split_frequency_files".
"""
from __future__ import annotations

import contextlib
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
from embcache.integrity import ChecksumError
from embcache.data.shard_check import META_KEY as SHARD_CRCS, record_shard
from embcache.data.frequency import (
    DEFAULT_MAX_COUNTED_KEYS,
    IdFrequency,
    KeyCounter,
    load_frequency_file,
    load_key_counts,
    save_key_counts,
)

FORMAT = "embcache-ctr"
VERSION = 1
SPLITS = ("train", "val", "test")
META = "meta.json"
FREQ = "id_freq.npz"
KEY_FREQ = "key_freq.npz"
SPLIT_FREQ_DIR = "freq"  # per-split key counts: freq/<split>.npz
KEY_MODES = ("ids", "raw")
SHARD_CODECS = ("lz4", "zstd", "snappy", "none")  # Parquet codecs a shard may be written with
SHARD_CODEC = "lz4"  # decoding bounds the loader: lz4 reads as fast as no codec (`bench/shard_codecs.py`)


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


def is_raw_keys(meta: dict) -> bool:
    """Whether a data set's sparse columns hold raw int64 keys (meta.json's `"keys": "raw"`)
    rather than vocabulary ids in `[0, cardinality)`.

    Example:
        >>> is_raw_keys({"keys": "raw"}), is_raw_keys({"keys": "ids"}), is_raw_keys({})
        (True, False, False)
    """
    return meta.get("keys", "ids") == "raw"


class CTRDatasetWriter:
    """Writes a data set in the canonical format, chunk by chunk.

    Args:
        out_dir: created if missing. Old shards, meta.json and id_freq.npz there are removed
            first, so a half-rewritten directory never looks complete.
        num_dense: number of dense columns.
        sparse: the categorical features, in column order (in raw mode their cardinality is
            not used: meta.json gets the distinct keys counted).
        source: one line saying where the data came from (stored in meta.json).
        rows_per_shard: a new Parquet file every this many rows of a split.
        row_group_rows: Parquet row-group size; the loader's memory is bounded by it.
        keys: "ids" (vocabulary ids, checked against the cardinality) or "raw" (any int64
            key; counted per key by a `KeyCounter`; meta.json gets `"keys": "raw"`).
        splits: the split names (directories) written to.
        counted: the splits whose rows the frequency file counts.
        split_counts: also write each counted split's own key counts (`freq/<split>.npz`,
            ids counted as keys in ids mode), saved and freed when `end_split` is called.
        max_counted_keys: the cap of every `KeyCounter` (None: exact, unbounded).
        compression: the shards' Parquet codec (`SHARD_CODECS`; lz4 decodes as fast as none, and
            decoding bounds the loader: `python bench/shard_codecs.py`).

    Example:
        >>> w = CTRDatasetWriter(tmp, num_dense=1, sparse=[SparseFeature("sparse_0", 3)], source="doc")  # doctest: +SKIP
        >>> w.write("train", np.array([1, 0]), np.zeros((2, 1)), [np.array([2, 0])])  # doctest: +SKIP
        >>> w.finish()  # doctest: +SKIP
    """

    def __init__(self, out_dir: str | os.PathLike, num_dense: int, sparse: list[SparseFeature],
                 source: str, rows_per_shard: int = 2_000_000, row_group_rows: int = 65_536,
                 keys: str = "ids", splits: tuple[str, ...] | list[str] = SPLITS,
                 counted: tuple[str, ...] | list[str] = ("train",), split_counts: bool = False,
                 max_counted_keys: int | None = DEFAULT_MAX_COUNTED_KEYS, compression: str = SHARD_CODEC):
        check_whole("rows_per_shard", rows_per_shard, 1)
        if compression not in SHARD_CODECS:
            raise ValueError(f"compression must be one of {SHARD_CODECS}, got {compression!r}")
        check_whole("row_group_rows", row_group_rows, 1)
        if keys not in KEY_MODES:
            raise ValueError(f"keys must be one of {KEY_MODES}, got {keys!r}")
        splits = list(splits)
        for split in splits:
            if not isinstance(split, str) or not split.isidentifier() or split in (SPLIT_FREQ_DIR, "raw_values"):
                raise ValueError(f"split names must be identifiers such as day_0, got {split!r}")
        if len(set(splits)) != len(splits) or not set(counted) <= set(splits):
            raise ValueError(f"splits {splits} must be distinct and hold the counted ones {list(counted)}")
        self.out, self.compression = Path(out_dir), compression
        self.num_dense, self.sparse, self.source = num_dense, list(sparse), source
        self.rows_per_shard, self.row_group_rows = int(rows_per_shard), int(row_group_rows)
        self.schema = arrow_schema(num_dense, self.sparse)
        self.shard_crcs: dict[str, int] = {}  # each closed shard's CRC-32, for meta.json
        self.raw = keys == "raw"
        self.counted, self.max_counted_keys = tuple(counted), max_counted_keys
        if self.raw:
            self.key_counts = {f.name: KeyCounter(max_counted_keys) for f in self.sparse}
        else:
            self.frequency = IdFrequency({f.name: f.cardinality for f in self.sparse})
        # split -> feature -> its own counter, until `end_split` saves it
        self._split_counts = {s: {f.name: KeyCounter(max_counted_keys) for f in self.sparse}
                              for s in self.counted} if split_counts else {}
        self.split_files: dict[str, dict] = {}  # split -> meta.json's entry of its saved counts
        self.splits: dict[str, dict] = {s: {"files": [], "rows": 0} for s in splits}
        self.views: dict[str, dict] = {}  # splits made of other splits' files (`add_view`)
        # one open shard per split, so interleaved writes to several splits (a random split)
        # still fill every shard to rows_per_shard: split -> [writer, rows in its shard]
        self._open: dict[str, list] = {}
        self._prepare_directory()

    def _prepare_directory(self) -> None:
        with writing(self.out):
            self.out.mkdir(parents=True, exist_ok=True)
            for name in (META, FREQ, KEY_FREQ):
                (self.out / name).unlink(missing_ok=True)
            for split in self.splits:
                for old in (self.out / split).glob("part-*.parquet"):
                    old.unlink()
                (self.out / SPLIT_FREQ_DIR / f"{split}.npz").unlink(missing_ok=True)

    def write(self, split: str, label, dense, sparse: list) -> None:
        """Append one chunk of rows to `split`.

        Args:
            label: `[n]` 0/1.
            dense: `[n, num_dense]` (already transformed; stored as float32).
            sparse: one entry per feature: `[n]` int ids for a one-hot feature, or the
                `(offsets, values)` pair of `multi_hot` for a multi-hot one (int64 keys in
                raw mode).
        Ids outside `[0, cardinality)` raise ValueError: a converter bug, not bad input
        (raw keys may be any int64).
        """
        if split not in self.splits:
            raise ValueError(f"split must be one of {tuple(self.splits)}, got {split!r}")
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
            if not self.raw and len(ids) and (ids.min() < 0 or ids.max() >= feature.cardinality):
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
            if split in self._split_counts:
                self._split_counts[split][feature.name].update(ids)
            elif split in self.counted and self.raw:
                self.key_counts[feature.name].update(ids)
            if split in self.counted and not self.raw:
                self.frequency.update(feature.name, ids)
        table = pa.Table.from_arrays(columns, schema=self.schema)
        start = 0
        while start < n:  # cut at shard boundaries
            shard = self._open.get(split)
            if shard is None or shard[1] >= self.rows_per_shard:
                shard = self._open_shard(split)
            take = min(n - start, self.rows_per_shard - shard[1])
            with self._writing(self.out / self.splits[split]["files"][-1]):
                shard[0].write_table(table.slice(start, take), row_group_size=self.row_group_rows)
            shard[1] += take
            self.splits[split]["rows"] += take
            start += take

    def _open_shard(self, split: str) -> list:
        """Close `split`'s full shard (if any) and open its next one; the others stay open."""
        self._close_shard(split)
        relative = f"{split}/part-{len(self.splits[split]['files']):05d}.parquet"
        with self._writing(self.out / relative):
            (self.out / split).mkdir(parents=True, exist_ok=True)
            # each page with its CRC: a damaged shard's row group can be named (`shard_check`)
            self._open[split] = [pq.ParquetWriter(self.out / relative, self.schema, compression=self.compression,
                                                  write_page_checksum=True), 0]
        self.splits[split]["files"].append(relative)
        return self._open[split]

    def _close_shard(self, split: str) -> None:
        shard = self._open.pop(split, None)
        if shard is not None:
            try:
                with self._writing(self.out / self.splits[split]["files"][-1]):
                    shard[0].close()
            finally:
                shard[0].is_open = False  # closed or failed: never again from its __del__
            record_shard(self.shard_crcs, self.out, self.splits[split]["files"][-1])

    @contextlib.contextmanager
    def _writing(self, path: Path):
        """`writing(path)`, and on its error every open shard abandoned: a full disk fails
        the others too, and each writer's `__del__` would print a traceback of its own
        beside the one-line error (the staged output is removed anyway)."""
        try:
            with writing(path):
                yield
        except DataOutputError:
            self.abandon()
            raise

    def abandon(self) -> None:
        """Close every open shard, quietly: the data set will not be finished."""
        shards, self._open = self._open, {}
        for writer, _ in shards.values():
            with contextlib.suppress(OSError, pa.ArrowException):
                writer.close()
            writer.is_open = False

    def cut(self) -> None:
        """Close every open shard: the next rows of any split start a new file (so a run of
        files holds exactly the rows written in between: one input day, say)."""
        for split in list(self._open):
            self._close_shard(split)

    def add_view(self, name: str, files: list[str], rows: int) -> None:
        """Declare split `name`: files other splits wrote (whole files: `cut` between the
        writes it is made of), listed in meta.json after the written splits."""
        if name in self.splits or name in self.views:
            raise ValueError(f"split {name!r} exists already")
        known = {f for info in self.splits.values() for f in info["files"]}
        if not set(files) <= known:
            raise ValueError(f"split {name!r}: {sorted(set(files) - known)[:3]} are no written files")
        self.views[name] = {"files": list(files), "rows": int(rows)}

    def end_split(self, split: str) -> None:
        """No more rows come for `split`: close its shard and save (then free) its own key
        counts; its counts join the frequency file's in raw mode."""
        self._close_shard(split)
        counters = self._split_counts.pop(split, None)
        if counters is None:
            return
        path = self.out / SPLIT_FREQ_DIR / f"{split}.npz"
        with writing(path):
            path.parent.mkdir(parents=True, exist_ok=True)
            save_key_counts(path, {name: c.result() for name, c in counters.items()})
        self.split_files[split] = {"file": f"{SPLIT_FREQ_DIR}/{split}.npz",
                                   "exact": all(c.exact for c in counters.values())}
        if self.raw:
            for name, counter in counters.items():
                self.key_counts[name].absorb(counter)

    def finish(self, bad_rows: dict | None = None, **extra) -> dict:
        """Close the open shards, write the frequency file(s), then meta.json (atomically);
        return meta."""
        for split in list(self._open):
            self._close_shard(split)
        for split in list(self._split_counts):
            self.end_split(split)
        sparse = [asdict(f) for f in self.sparse]
        keyed = {}
        if self.raw:
            for entry in sparse:
                entry["cardinality"] = self.key_counts[entry["name"]].distinct()
            keyed = {"keys": "raw",
                     "key_counts": {"splits": list(self.counted), "max_keys_per_feature": self.max_counted_keys,
                                    "exact": all(c.exact for c in self.key_counts.values()),
                                    "features": {n: c.summary() for n, c in self.key_counts.items()}}}
        if self.split_files:
            keyed["split_frequency_files"] = dict(self.split_files)
        meta = {"format": FORMAT, "version": VERSION, "num_dense": self.num_dense,
                "sparse": sparse, "splits": {**self.splits, **self.views},
                "id_frequency_file": KEY_FREQ if self.raw else FREQ, "source": self.source,
                "bad_rows": bad_rows or {}, SHARD_CRCS: self.shard_crcs, **keyed, **extra}
        with writing(self.out):
            if self.raw:
                save_key_counts(self.out / KEY_FREQ, {n: c.result() for n, c in self.key_counts.items()})
            else:
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
    it lists exists inside the data directory (a meta.json from someone else naming `../x` or
    `/x` is refused). Raises DataFormatError (one line naming the file) otherwise."""
    from embcache.safe_load import inside, read_json_object

    path = Path(data_dir) / META
    if not path.is_file():
        raise format_error(path, None, "missing; prepare the data with `embcache data prepare ...`")
    meta = read_json_object(path, "meta.json")
    if meta.get("format") != FORMAT:
        raise format_error(path, None, f"not an {FORMAT} meta.json (format={meta.get('format')!r})")
    if meta.get("version") != VERSION:
        raise format_error(path, None, f"version {meta.get('version')!r}; this code reads version {VERSION}")
    for key in ("num_dense", "sparse", "splits", "id_frequency_file"):
        if key not in meta:
            raise format_error(path, None, f"lacks the key {key!r}")
    if meta.get("keys", "ids") not in KEY_MODES:
        raise format_error(path, None, f"keys {meta.get('keys')!r}: expected one of {', '.join(KEY_MODES)}")
    splits, freq_files = meta["splits"], meta.get("split_frequency_files") or {}
    if not isinstance(splits, dict) or not isinstance(freq_files, dict) or not all(
            isinstance(i, dict) and isinstance(i.get("files", []), list) for i in splits.values()):
        raise format_error(path, None, "its splits are not {split: {\"files\": [...]}}")
    shards = [(rel, f"split {split!r}") for split, info in splits.items() for rel in info.get("files", [])]
    counts = [(v.get("file") if isinstance(v, dict) else v, f"the counts of split {k!r}")
              for k, v in freq_files.items()]
    for rel, what in shards + counts + [(meta["id_frequency_file"], "its id frequencies")]:
        if not inside(rel):
            raise format_error(path, None, f"lists {str(rel)[:200]!r} ({what}), outside the data directory; a "
                                           f"prepared data set names only files inside it, so it is not used")
    for rel, what in shards:
        if not (Path(data_dir) / rel).is_file():
            raise format_error(path, None, f"lists {rel} ({what}) but that file is missing")
    return meta


def load_id_frequencies(data_dir: str | os.PathLike) -> dict:
    """`{feature name: int64 torch.Tensor of counts}` over the train split, one count per id.
    Data with raw keys has no ids: DataFormatError (use `load_key_frequencies`)."""
    import torch

    meta = read_meta(data_dir)
    path = Path(data_dir) / meta["id_frequency_file"]
    if is_raw_keys(meta):
        raise format_error(Path(data_dir) / META, None, "holds raw keys (\"keys\": \"raw\"), not ids: its "
                                                        "counts are per key (load_key_frequencies)")
    try:
        counts = load_frequency_file(path)
    except ChecksumError:  # names the file already
        raise
    except (OSError, ValueError) as err:
        raise format_error(path, None, f"cannot read id frequencies: {err}") from None
    for f in meta["sparse"]:
        if f["name"] not in counts:
            raise format_error(path, None, f"has no counts for {f['name']}")
        if len(counts[f["name"]]) != f["cardinality"]:
            raise format_error(path, None, f"{f['name']} has {len(counts[f['name']])} counts, "
                                           f"cardinality is {f['cardinality']}")
    return {f["name"]: torch.from_numpy(counts[f["name"]]) for f in meta["sparse"]}


def load_key_frequencies(data_dir: str | os.PathLike, split: str | None = None) -> dict:
    """`{feature name: (keys, counts)}`, two int64 torch tensors: the keys (ascending, distinct)
    and how often each was seen, over the counted splits (meta.json's "key_counts"; the train
    split unless the data says otherwise), or over `split` alone where its counts were saved
    ("split_frequency_files"). Raw-key data holds keys; for ids data the keys are the ids seen
    (a count of 0 is left out). Counts may be capped: see "key_counts" / the split's "exact".
    A missing or damaged file is a DataFormatError naming it."""
    import torch

    meta = read_meta(data_dir)
    if split is None:
        path = Path(data_dir) / meta["id_frequency_file"]
    else:
        files = meta.get("split_frequency_files", {})
        if split not in files:
            raise format_error(Path(data_dir) / META, None, f"has no counts of split {split!r} of its own"
                               + (f" (it has: {', '.join(files)})" if files else ""))
        path = Path(data_dir) / files[split]["file"]
    try:
        if split is None and not is_raw_keys(meta):
            dense = load_frequency_file(path)
            counts = {}
            for name, c in dense.items():
                ids = np.flatnonzero(c)
                counts[name] = (ids.astype(np.int64), c[ids])
        else:
            counts = load_key_counts(path)
    except ChecksumError:
        raise
    except (OSError, ValueError) as err:
        raise format_error(path, None, f"cannot read key frequencies: {err}") from None
    for f in meta["sparse"]:
        if f["name"] not in counts:
            raise format_error(path, None, f"has no counts for {f['name']}")
    return {f["name"]: tuple(torch.from_numpy(np.ascontiguousarray(a)) for a in counts[f["name"]])
            for f in meta["sparse"]}


def day_splits(meta: dict) -> list[str]:
    """The names of a data set's day splits in day order (meta.json's "day_splits", present in
    data written day by day: `embcache data synthetic --days`, Terabyte's `--day-splits`);
    [] for data that has none. Each opens as any split: `CTRBatches(dir, "day_3", ...)`.

    Example:
        >>> day_splits({"day_splits": [{"split": "day_0", "rows": 5}, {"split": "day_1", "rows": 4}]})
        ['day_0', 'day_1']
    """
    return [entry["split"] for entry in meta.get("day_splits", [])]


# how raw dense values become the stored ones: Criteo's counts (and the synthetic Criteo-shaped
# data made like them) are clamped at 0, then log(x + 1); other sources store derived values
DENSE_LOG1P = "log1p(max(x, 0))"


def dense_transform(meta: dict) -> str | None:
    """`DENSE_LOG1P` for data whose dense columns are Criteo-style counts after their
    transform; None where the stored values are the inputs themselves (Avazu's hour,
    MovieLens' age and year, already scaled).

    Example:
        >>> dense_transform({"source": "Criteo Kaggle (train.txt)"}), dense_transform({"source": "Avazu"})
        ('log1p(max(x, 0))', None)
    """
    if "dense_transform" in meta:  # recorded by the converter (`data prepare own`)
        return meta["dense_transform"]
    source = str(meta.get("source", ""))
    return DENSE_LOG1P if source.startswith(("Criteo", "synthetic Criteo")) else None


def held_out_days(meta: dict) -> list[str]:
    """The day splits whose rows are also the val / test splits (Terabyte with `--day-splits`:
    the last day listed is held out); [] where every day only trains (`data synthetic --days`).

    Example:
        >>> meta = {"splits": {"train": {}, "val": {}, "test": {}, "day_0": {}, "day_1": {}},
        ...         "day_splits": [{"split": "day_0", "rows": 5}, {"split": "day_1", "rows": 4}]}
        >>> held_out_days(meta)
        ['day_1']
    """
    days = day_splits(meta)
    held = set(meta.get("splits", {})) & {"val", "test"}
    return days[-1:] if days and held else []


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


__all__ = ["FORMAT", "VERSION", "SPLITS", "KEY_MODES", "SparseFeature", "CTRDatasetWriter", "arrow_schema",
           "multi_hot", "read_meta", "is_raw_keys", "day_splits", "held_out_days", "dense_transform", "DENSE_LOG1P",
           "load_id_frequencies", "load_key_frequencies", "sparse_features", "read_shard", "head_rows",
           "DataFormatError", "DataOutputError", "check_output_dir"]
