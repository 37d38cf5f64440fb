"""Batches of a prepared CTR data set for training: dense features, a `KeyedJaggedTensor`
of ids (torchrec's, or its stand-in without torchrec: `embcache.sparse_types`) and float
labels, streamed from the Parquet shards.

Memory stays bounded whatever the file sizes: rows are read with `ParquetFile.iter_batches`, a
record batch (of one row group) at a time, and only the rows of the batch being assembled are
held. Batches run across shard boundaries, so every row is in exactly one batch per epoch and
only the last batch may be short. Resume is cheap: starting at batch i skips whole shards and row groups from the
Parquet footers without reading them.

Under several ranks (`part`) each rank reads only its slice of every global batch: its rows
are cut (zero-copy: numpy views of the record batch's columns) out of the record batches
before they are checked, converted or pinned, and row groups holding none of its rows are
not read at all. A row group holding some of its rows is read and decoded by pyarrow whole,
other ranks' rows included: Parquet can skip no less. The global batches, their sizes and
the end of the epoch come from the footers, so every rank yields the same number of batches;
a bad row is reported by the rank whose slice holds it, with the same file and row as one
process reports.
"""
from __future__ import annotations

import bisect
import os
from pathlib import Path
from collections import deque
from typing import Iterator, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch
from embcache.data.background import BackgroundIterator
from embcache.data.batch import Batch
from embcache.errors import format_error
from embcache.data.ctr_format import is_raw_keys, read_meta, read_shard, sparse_features
from embcache.data.shard_check import verify_shard
from embcache.partition import slice_bounds
from embcache.sparse_types import KeyedJaggedTensor


class CTRBatches:
    """Iterable over the batches of one split of a canonical CTR data set.

    Args:
        data_dir: a directory written by `CTRDatasetWriter` (has meta.json).
        split: any split meta.json lists: "train", "val", "test", or a day ("day_3") of
            data written day by day.
        batch_size: rows per batch; the last batch is shorter unless `drop_last`.
        shuffle_shards: visit the split's shards in a random order drawn from `seed`
            (rows within a shard keep their order). Pass a different seed per epoch.
        seed: makes the order deterministic.
        drop_last: leave out a final short batch.
        device: where the tensors are put (pinned first when it is CUDA).
        sparse_device: where the ids (`sparse`) are put; default: `device`. A cached
            sparse part keeps them on the host (pinned with CUDA): its bookkeeping runs
            there and only rows cross to the device.
        start_batch: begin at this batch index of the epoch (for resume); `len()` then counts
            only the batches still to come.
        read_rows: rows per Parquet read; bounds memory together with `batch_size`.
        part: `(rank, world_size)`: yield only this rank's slice of every global batch of
            `batch_size` rows (`embcache.partition.slice_bounds`), so N ranks together see
            the batches one process sees; only the slice's rows are checked and converted.
        key_map: raw-key data only: turns a batch's keys into closed tables' ids
            (`data.key_maps`: hashing, a first-day vocabulary) as each batch is made.

    Ids outside `[0, cardinality)`, nulls, a shard whose columns or column types differ from
    meta.json (label integer/bool, dense floating point, sparse integer ids), or a damaged shard
    raise DataFormatError naming the file (and the row where there is one). Raw-key data
    (`ctr_format.is_raw_keys`) holds int64 keys, any int64 (the cardinality bounds nothing):
    its ids are not range-checked; every other check stays.

    Example:
        >>> for batch in CTRBatches("datasets/synthetic", "train", 2048):  # doctest: +SKIP
        ...     logits = model(batch.dense, batch.sparse)
    """

    def __init__(self, data_dir: str | os.PathLike, split: str, batch_size: int,
                 shuffle_shards: bool = False, seed: int = 0, drop_last: bool = False,
                 device: torch.device | str = "cpu", start_batch: int = 0, read_rows: int = 65_536,
                 part: tuple[int, int] = (0, 1), sparse_device: torch.device | str | None = None,
                 key_map=None):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if start_batch < 0:
            raise ValueError(f"start_batch must be >= 0, got {start_batch}")
        self.data_dir, self.split = Path(data_dir), split
        self.meta = read_meta(self.data_dir)
        if split not in self.meta["splits"]:
            raise format_error(self.data_dir / "meta.json", None,
                               f"has no split {split!r} (it has {', '.join(self.meta['splits'])})")
        self.batch_size, self.shuffle_shards, self.seed = int(batch_size), shuffle_shards, seed
        self.drop_last, self.device = drop_last, torch.device(device)
        self.sparse_device = self.device if sparse_device is None else torch.device(sparse_device)
        self.start_batch, self.read_rows = int(start_batch), max(int(read_rows), 1)
        self.part = (int(part[0]), int(part[1]))
        self.features = sparse_features(self.meta)
        self.num_dense = int(self.meta["num_dense"])
        self.rows = int(self.meta["splits"][split]["rows"])
        self._columns = (["label"] + [f"dense_{j}" for j in range(self.num_dense)]
                         + [f.name for f in self.features])
        self._multi_hot = {f.name: f.multi_hot for f in self.features}
        self._cardinalities = np.array([f.cardinality for f in self.features], dtype=np.uint64)
        self.raw_keys = is_raw_keys(self.meta)
        if key_map is not None and not self.raw_keys:
            raise ValueError(f"{self.data_dir}: key_map applies to raw-key data (meta.json 'keys': 'raw') only")
        self.key_map = key_map

    # -------------------------------------------------------------- size and order
    def batches_per_epoch(self) -> int:
        full, rest = divmod(self.rows, self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def __len__(self) -> int:
        """Batches this iterable will yield (those of the epoch from `start_batch` on)."""
        return max(self.batches_per_epoch() - self.start_batch, 0)

    def files(self) -> list[Path]:
        """The split's shards in visiting order."""
        files = [self.data_dir / rel for rel in self.meta["splits"][self.split]["files"]]
        if self.shuffle_shards:
            order = np.random.default_rng(self.seed).permutation(len(files))
            files = [files[k] for k in order]
        return files

    def skip(self, batches: int) -> "CTRBatches":
        """The same iterable, starting `batches` further on."""
        return CTRBatches(self.data_dir, self.split, self.batch_size, self.shuffle_shards, self.seed,
                          self.drop_last, self.device, self.start_batch + batches, self.read_rows, self.part,
                          self.sparse_device, self.key_map)

    # -------------------------------------------------------------- iteration
    def __iter__(self) -> Iterator[Batch]:
        for batch in self.host_batches():
            yield self.place(batch)

    def background(self, ahead: int = 2) -> BackgroundIterator[Batch]:
        """The batches, read, decoded, checked and pinned (with CUDA) in a background
        thread at most `ahead` batches before the one taken, then placed on the devices
        (non-blocking from pinned memory) in the thread that takes them. The same batches
        and the same errors as iterating this object; use it in a `with` block, which stops
        the thread however the loop ends.

        Example:
            >>> with CTRBatches("datasets/synthetic", "train", 2048).background() as batches:  # doctest: +SKIP
            ...     for batch in batches:
            ...         logits = model(batch.dense, batch.sparse)
        """
        return _Placed(BackgroundIterator(self.host_batches(), ahead, name=f"embcache-reader-{self.split}"),
                       self.place)

    def host_batches(self, only=None) -> Iterator[Batch]:
        """The batches on the host, pinned when CUDA will take them (`place` moves them).
        Only this rank's rows of each global batch are read, checked and converted. `only`:
        a test of the batch index; the batches it refuses are passed over unread (a parallel
        reader's share: `data.parallel`), the shards opened as they are reached all the same."""
        if self.start_batch >= self.batches_per_epoch():
            return
        rank, world = self.part
        rows = _EpochRows(self, only)
        index = self.start_batch
        while True:
            first = index * self.batch_size
            size = min(self.batch_size, rows.reach(first + self.batch_size) - first)
            if size <= 0 or (size < self.batch_size and self.drop_last):
                return
            start, stop = slice_bounds(size, world, rank)
            if only is None or only(index):
                yield self._host_batch(rows.rows(first + start, first + stop), size)
            if size < self.batch_size:
                return
            index += 1

    def with_next(self) -> Iterator[tuple[Batch, Batch | None]]:
        """`(batch, next batch)` pairs, the last with None: the next batch's ids are known while
        the current one trains, so the trainer can hand them to the cache's `prefetch`."""
        return lookahead(self)

    def _open(self, path: Path) -> pq.ParquetFile:
        # the shard's CRC-32 against meta.json's, before any of its rows is used (once a process)
        verify_shard(self.data_dir, path.relative_to(self.data_dir).as_posix(), self.meta)
        try:
            # pre_buffer (on by default) would read every row group of the file up front:
            # memory would grow with the shard's size.
            # and every page's CRC checked as it is decoded (a file changed after its CRC-32 was)
            pf = pq.ParquetFile(path, pre_buffer=False, page_checksum_verification=True)
        except (OSError, pa.ArrowException) as err:
            raise format_error(path, None, f"cannot read Parquet shard: {err}") from None
        names = set(pf.schema_arrow.names)
        missing = [c for c in self._columns if c not in names]
        if missing:
            raise format_error(path, None, f"lacks column(s) {', '.join(missing[:5])} that meta.json describes")
        schema = pf.schema_arrow
        for name in self._columns:
            kind = schema.field(name).type
            if name == "label":
                ok, want = pa.types.is_integer(kind) or pa.types.is_boolean(kind), "integer or bool"
            elif name.startswith("dense_"):
                ok, want = pa.types.is_floating(kind), "floating point"
            elif self._multi_hot[name]:
                ok = (pa.types.is_list(kind) or pa.types.is_large_list(kind)) and pa.types.is_integer(kind.value_type)
                want = "a list of integer ids"
            else:
                ok, want = pa.types.is_integer(kind), "integer ids"
            if not ok:
                raise format_error(path, None, f"column {name} is {kind}, expected {want}")
        return pf

    def _check(self, record: pa.RecordBatch, path: Path, first_row: int) -> None:
        """Ids in range (raw keys: any) and no nulls; the error names the shard and the row in
        it (0-based).
        The check that names the first bad row: `_host_batch` checks a slice's ids all at
        once and calls this only to name the row when that fails, or first where the record
        batch holds nulls."""
        for name in self._columns:
            if record.column(name).null_count:
                row = int(np.flatnonzero(record.column(name).is_null().to_numpy(zero_copy_only=False))[0])
                raise format_error(path, None, f"row {first_row + row}: {name} is null")
        if self.raw_keys:
            return
        for f in self.features:
            col = record.column(f.name)
            if f.multi_hot:
                ids = pc.list_flatten(col).to_numpy()
                row_of = np.repeat(np.arange(len(col)), pc.list_value_length(col).to_numpy())
            else:
                ids, row_of = col.to_numpy(), None
            bad = (ids < 0) | (ids >= f.cardinality)
            if bad.any():
                k = int(np.flatnonzero(bad)[0])
                row = k if row_of is None else int(row_of[k])
                raise format_error(path, None, f"row {first_row + row}: {f.name} id {int(ids[k])} "
                                               f"outside [0, {f.cardinality})")

    def _host_batch(self, pieces: list[_Rows], global_size: int) -> Batch:
        """This rank's rows of a global batch of `global_size` rows (`pieces`, in order),
        checked and converted into a Batch (pinned when CUDA will take it). The ids of the
        whole slice are checked at once on the converted ids (and a piece of a record batch
        holding nulls is checked by `_check` first); only when that check fails does `_check`
        go over the pieces to name the file and row."""
        for piece in pieces:
            if not piece.source.clean:  # nulls somewhere in its record batch: in these rows?
                self._check(piece.arrow(), piece.source.path, piece.first_row)
        n = sum(len(piece) for piece in pieces)
        labels = np.empty(n, dtype=np.float32)
        at = 0
        for piece in pieces:
            labels[at: at + len(piece)] = piece.numpy(0)
            at += len(piece)
        dense = np.empty((n, self.num_dense), dtype=np.float32)
        for j in range(self.num_dense):
            at = 0
            for piece in pieces:
                dense[at: at + len(piece), j] = piece.numpy(1 + j)
                at += len(piece)
        parts, counts = [], []  # ids in KJT order (key by key, pieces in order); ids per key
        lengths = np.ones(len(self.features) * n, dtype=np.int64)
        for k, f in enumerate(self.features):
            column = 1 + self.num_dense + k
            if f.multi_hot:
                at = k * n
                for ids, sizes in (piece.lists(column) for piece in pieces):
                    parts.append(ids)
                    lengths[at: at + len(sizes)] = sizes
                    at += len(sizes)
                counts.append(int(lengths[k * n: at].sum()))
            else:
                parts += [piece.numpy(column) for piece in pieces]
                counts.append(n)
        ids = _concat([part.astype(np.int64, copy=False) for part in parts], np.int64)
        if not self.raw_keys and _out_of_range(ids, counts, self._cardinalities):
            self._locate(pieces)
        if self.key_map is not None:
            ids = self.key_map(ids, counts)
        sparse = KeyedJaggedTensor(keys=[f.name for f in self.features], values=torch.from_numpy(ids),
                                   lengths=torch.from_numpy(lengths))
        batch = Batch(torch.from_numpy(dense), sparse, torch.from_numpy(labels), global_size)
        if "cuda" in (self.device.type, self.sparse_device.type):
            return Batch(batch.dense.pin_memory(), batch.sparse.pin_memory(), batch.labels.pin_memory(),
                         global_size)
        return batch

    def _locate(self, pieces: list[_Rows]) -> None:
        """Raise `_check`'s error for the first bad row of `pieces` (a slice found bad)."""
        for piece in pieces:
            self._check(piece.arrow(), piece.source.path, piece.first_row)
        raise RuntimeError("a slice failed the batch check but no row of it fails _check")

    def place(self, batch: Batch) -> Batch:
        """A batch of `host_batches` on `device` (its ids on `sparse_device`); from pinned
        memory the copies are non-blocking."""
        if "cuda" in (self.device.type, self.sparse_device.type):  # pinned by `host_batches`
            return batch.to(self.device, non_blocking=True, sparse_device=self.sparse_device)
        if self.device.type == "cpu" and self.sparse_device.type == "cpu":
            return batch
        return batch.to(self.device, sparse_device=self.sparse_device)


def _out_of_range(ids: np.ndarray, counts: list[int], cardinalities: np.ndarray) -> bool:
    """Whether an id of `ids` (KJT order: `counts[k]` ids of feature k) is outside [0, its
    cardinality): one comparison an id, negative ids being huge as uint64, feature by feature
    (a bound repeated for every id cost a sixth of a batch's making)."""
    ids, at = ids.view(np.uint64), 0
    for count, cardinality in zip(counts, cardinalities):
        if count and (ids[at: at + count] >= cardinality).any():
            return True
        at += count
    return False


def _concat(arrays: list[np.ndarray], dtype) -> np.ndarray:
    """The arrays end to end in a new array (none: an empty one of `dtype`)."""
    return np.concatenate(arrays) if arrays else np.zeros(0, dtype=dtype)


class _Record:
    """A record batch read from a shard, with its columns (in the loader's column order) as
    numpy views where Arrow allows one: no copy and no work over its rows, so a rank's rows
    of it are numpy slices of them. A column Arrow cannot view (bool labels), and every
    column of a record batch holding a null anywhere, is converted piece by piece instead."""

    def __init__(self, record: pa.RecordBatch, path: Path, first_row: int, loader: CTRBatches):
        self.record, self.path = record, path
        self.first_row = first_row  # the shard's row that is the record's row 0
        self.stop = first_row + record.num_rows
        self.columns = [record.column(name) for name in loader._columns]
        multi = [loader._multi_hot.get(name, False) for name in loader._columns]
        # Arrow knows a fresh array's null count (the Parquet reader sets it): no pass over the rows
        self.clean = not any(c.null_count or (m and c.values.null_count) for c, m in zip(self.columns, multi))
        self._views = [_view(c, m) if self.clean else None for c, m in zip(self.columns, multi)]

    def numpy(self, column: int, start: int, stop: int) -> np.ndarray:
        """Rows `[start, stop)` of a column as numpy (a view when one was taken)."""
        view = self._views[column]
        if view is not None:
            return view[start:stop]
        return self.columns[column].slice(start, stop - start).to_numpy(zero_copy_only=False)

    def lists(self, column: int, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """Rows `[start, stop)` of a list column: the ids end to end, and the list lengths."""
        view = self._views[column]
        if view is not None:
            offsets, values = view
            offsets = offsets[start: stop + 1]
            return values[offsets[0]: offsets[-1]], np.diff(offsets)
        lists = self.columns[column].slice(start, stop - start)
        return (pc.list_flatten(lists).to_numpy(zero_copy_only=False),
                pc.list_value_length(lists).to_numpy(zero_copy_only=False))


def _view(column: pa.Array, multi_hot: bool):
    """A column with no nulls as a zero-copy numpy view (a list column: its offsets and its
    values, which the offsets index), or None where Arrow has none."""
    try:
        if multi_hot:
            return column.offsets.to_numpy(), column.values.to_numpy()
        return column.to_numpy()
    except pa.ArrowInvalid:  # not zero-copy (bool)
        return None


class _Rows(NamedTuple):
    """Rows `[start, stop)` of a record batch read from a shard: one rank's, or part of them."""

    source: _Record
    start: int
    stop: int

    def __len__(self) -> int:
        return self.stop - self.start

    @property
    def first_row(self) -> int:
        """The shard's row that is the first of these."""
        return self.source.first_row + self.start

    def numpy(self, column: int) -> np.ndarray:
        return self.source.numpy(column, self.start, self.stop)

    def lists(self, column: int) -> tuple[np.ndarray, np.ndarray]:
        return self.source.lists(column, self.start, self.stop)

    def arrow(self) -> pa.RecordBatch:
        """These rows as a record batch (zero-copy)."""
        return self.source.record.slice(self.start, self.stop - self.start)


class _EpochRows:
    """The rows of an epoch: the split's shards end to end in visiting order, each opened
    (footer and column types checked) when the rows asked for reach it, as one process
    reading every row would reach it."""

    def __init__(self, loader: CTRBatches, only=None):
        self.loader, self.only = loader, only  # `only`: the batches read (host_batches')
        self._paths = iter(loader.files())
        self._shards: list[_Shard] = []  # opened and not yet passed
        self.known = 0  # rows of the shards opened so far

    def reach(self, row: int) -> int:
        """Open shards until `row` rows of the epoch are known or none is left; returns the
        rows known (the whole epoch's when fewer than `row`)."""
        while self.known < row:
            path = next(self._paths, None)
            if path is None:
                break
            pf = self.loader._open(path)
            self._shards.append(_Shard(self, path, pf, self.known))
            self.known += pf.metadata.num_rows
        return self.known

    def rows(self, start: int, stop: int) -> list[_Rows]:
        """Rows `[start, stop)` of the epoch (known by `reach`) as parts of record batches;
        later calls ask for later rows."""
        while self._shards and self._shards[0].stop <= start:
            self._shards.pop(0)
        pieces = []
        for shard in self._shards:
            lo, hi = max(start, shard.first), min(stop, shard.stop)
            if lo < hi:
                pieces += shard.rows(lo - shard.first, hi - shard.first)
        return pieces


class _Shard:
    """One shard read forward, for the row ranges asked of it. A range is cut (zero-copy)
    out of the record batches holding it before anything is checked or converted, so rows
    not asked for are never checked or converted, and row groups holding none of this
    rank's rows are never read. Parquet's unit of reading is the row group: one holding an
    asked row is read from disk and decoded by pyarrow whole (it can skip no less), other
    ranks' rows in it included."""

    def __init__(self, epoch: _EpochRows, path: Path, pf: pq.ParquetFile, first: int):
        self._epoch, self._loader, self.path, self._pf = epoch, epoch.loader, path, pf
        self.first = first  # row of the epoch that is the shard's row 0
        self.stop = first + pf.metadata.num_rows
        self._sizes = [pf.metadata.row_group(g).num_rows for g in range(pf.num_row_groups)]
        self._group_starts = np.cumsum([0] + self._sizes[:-1]).tolist() if self._sizes else []
        self._records: Iterator[pa.RecordBatch] | None = None  # of row groups [.., `_run_stop`)
        self._run_stop = 0
        self._next = 0  # shard row where the next record of `_records` starts
        self._record: _Record | None = None

    def rows(self, start: int, stop: int) -> list[_Rows]:
        """Shard rows `[start, stop)` as parts of record batches."""
        pieces = []
        while start < stop:
            if self._record is None or start >= self._record.stop:
                self._seek(start)
            at = self._record.first_row
            end = min(stop, self._record.stop)
            pieces.append(_Rows(self._record, start - at, end - at))
            start = end
        return pieces

    def _seek(self, row: int) -> None:
        """Make `_record` the record batch holding shard row `row`: read on when the reader's
        row groups hold `row`, else start a reader at the row group that does, over it and
        the row groups after it known to hold rows of this rank (a record batch may span row
        groups: it never reaches into one without rows of this rank), or past whole row groups
        not asked for (rows passed over) without decoding them."""
        group = bisect.bisect_right(self._group_starts, row) - 1
        if self._records is None or group >= self._run_stop or self._group_starts[group] > self._next:
            stop = group + 1
            while stop < len(self._sizes) and self._wanted(stop):
                stop += 1
            self._records = read_shard(self._pf, self.path, batch_size=self._loader.read_rows,
                                       row_groups=list(range(group, stop)), columns=self._loader._columns,
                                       use_threads=False)
            self._run_stop, self._next = stop, self._group_starts[group]
        for record in self._records:
            self._record = _Record(record, self.path, self._next, self._loader)
            self._next += record.num_rows
            if self._next > row:
                return
        raise format_error(self.path, None, f"cannot read Parquet shard (damaged or truncated?): its rows "
                                            f"end at {self._next}, before row {row}")

    def _wanted(self, group: int) -> bool:
        """Whether row group `group` holds rows of this rank's slices of global batches known
        to be whole (and read: `host_batches`' `only`). One holding rows of a batch not known
        whole yet (the last batch may be short, and its slices other ones) is not: it is read,
        by a reader of its own, once rows of it are asked for."""
        lo = self.first + self._group_starts[group]  # in rows of the epoch
        hi = lo + self._sizes[group]
        size = self._loader.batch_size
        whole = self._epoch.known // size * size  # the epoch's rows in batches known to be whole
        if hi > whole:
            return False
        if lo == hi:  # an empty row group costs nothing to read on
            return True
        start, stop = slice_bounds(size, self._loader.part[1], self._loader.part[0])
        if start == stop:
            return False
        only = self._epoch.only
        return any((only is None or only(b)) and max(lo, b * size + start) < min(hi, b * size + stop)
                   for b in range(lo // size, (hi - 1) // size + 1))


class _Placed(Iterator[Batch]):
    """A background iterator's host batches, each placed on the devices as it is taken."""

    def __init__(self, host: BackgroundIterator[Batch], place):
        self._host, self._place = host, place

    def __next__(self) -> Batch:
        return self._place(next(self._host))

    def close(self) -> None:
        self._host.close()

    def __enter__(self) -> "_Placed":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def lookahead(items) -> Iterator[tuple[object, object | None]]:
    """`(item, next item)` over any iterable, the last paired with None."""
    for item, following in lookahead_window(items, 1):
        yield item, (following[0] if following else None)


def lookahead_window(items, depth: int) -> Iterator[tuple[object, tuple]]:
    """`(item, the next `depth` items)` over any iterable, fewer near the end (none with
    depth 0): the items ahead are known while the current one is used, so a trainer can
    prefetch for them. Reads at most `depth` items ahead of the one it yields."""
    if depth < 0:
        raise ValueError(f"depth must be >= 0, got {depth}")
    window = deque()
    for item in items:
        window.append(item)
        if len(window) > depth:
            current = window.popleft()
            yield current, tuple(window)
    while window:
        current = window.popleft()
        yield current, tuple(window)
