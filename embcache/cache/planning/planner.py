"""How big a cache: the hit rate each eviction policy is predicted to reach at each cache
size, and what each size costs in device memory and traffic, before any training.

Hits and misses count distinct rows per batch, as `RowCache.stats` does. The prediction
replays a trace once, every cache size of interest at the same time: the training
batches themselves (`--trace N`), or, from meta.json's counts alone, a surrogate trace
drawn from them (each occurrence in a batch drawn uniformly: `hit_curves.surrogate_batches`).

How the hit rates are predicted, and why that way: `embcache/cache/planning/hit_curves.py`.
Measured against real runs: docs/planning.md.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from embcache.cache.choices import PLANNED_RATIOS
from embcache.cache.planning.hit_curves import POLICIES, Prediction, expected_distinct, replay, surrogate_batches
from embcache.units import format_bytes

DEFAULT_RATIOS = PLANNED_RATIOS
# The cache's bookkeeping, read off `RowCache`: per slot, slot_to_id (int64), dirty (bool),
# holds (int32) and the policy's slot_last and slot_primary (float64); per id of the table,
# the slot map's id_to_slot (int64), plus the online counts (int32) of lfu/freq and freq's
# prior (float64). The host bookkeeper keeps it on the host (beside the ids it reads), so
# the device holds only rows and their state; the device bookkeeper (`DeviceRowCache`)
# keeps all of it on the device, each array one entry longer (its trash entry), with a
# working table of the cache's rows, a trash row and a region of one batch's lookups for
# the rows that do not fit (each working row with its id, int64).
SLOT_BOOKKEEPING_BYTES = 8 + 1 + 4 + 8 + 8
ID_BOOKKEEPING_BYTES = {"lru": 8, "lfu": 8 + 4, "freq": 8 + 4 + 8}
FLOAT32_BYTES = 4


# ---------------------------------------------------------------------------- memory
@dataclass(frozen=True)
class Footprint:
    """What `num_rows` rows of `dim` floats with `optimizer` state cost where they live.

    Example:
        >>> f = Footprint(num_rows=1000, dim=16, optimizer="adagrad", eviction="freq")
        >>> f.row_bytes, f.host_bytes(), f.device_bytes(10), f.bookkeeping_bytes(10)
        (128, 128000, 1280, 20290)
    """

    num_rows: int
    dim: int
    optimizer: str = "adagrad"
    eviction: str = "freq"
    bookkeeping: str = "host"  # "device": the bookkeeping counts as device memory
    batch_lookups: int = 0  # ids a batch looks up: the device bookkeeper's overflow region

    @property
    def row_bytes(self) -> int:
        """A row with its optimizer state: what one row moved between host and device costs
        (`RowOptimizer.init_state`: float32 tables, sgd none, rowwise_adagrad one column,
        adagrad one per element, adam two)."""
        from embcache.cache.optimizers import make_optimizer

        widths = make_optimizer(self.optimizer, 1.0).state_widths(self.dim)
        return FLOAT32_BYTES * (self.dim + sum(widths.values()))

    def host_bytes(self) -> int:
        """The host store: every row and its state, in id order (the device bookkeeper's
        with a spare row after the last, where its masked writes go)."""
        return (self.num_rows + (self.bookkeeping == "device")) * self.row_bytes

    def device_bytes(self, cache_rows: int) -> int:
        """The cache of `cache_rows` rows on the device: the rows and their state, and with
        the device bookkeeper its bookkeeping and working rows (see above)."""
        rows = int(cache_rows)
        if self.bookkeeping != "device":
            return rows * self.row_bytes
        return self._device_fixed() + rows * self._device_per_row()

    def _device_per_row(self) -> int:
        # its row and state, its id and slot arrays, and its number (the free list is made of)
        return self.row_bytes + SLOT_BOOKKEEPING_BYTES + 8

    def _device_fixed(self) -> int:
        """The device bookkeeper's bytes that do not grow with the cache: the trash entries,
        the overflow region, the per-id arrays."""
        work = 1 + int(self.batch_lookups)  # the trash row, one batch's region
        return (work * (self.row_bytes + 8) + (SLOT_BOOKKEEPING_BYTES - 8)
                + (self.num_rows + 1) * ID_BOOKKEEPING_BYTES[self.eviction])

    def bookkeeping_bytes(self, cache_rows: int) -> int:
        """The host memory the cache's bookkeeping takes besides the host store: per slot
        and per id of the table (the slot map, the eviction policy's counts); none with the
        device bookkeeper, which keeps them on the device (`device_bytes`)."""
        if self.bookkeeping == "device":
            return 0
        return ID_BOOKKEEPING_BYTES[self.eviction] * self.num_rows + int(cache_rows) * SLOT_BOOKKEEPING_BYTES

    def largest_cache(self, memory: int) -> int:
        """The most rows (at most all of them) whose cache fits in `memory` bytes of device
        memory; 0 when not even one row with its state does."""
        if self.bookkeeping == "device":
            return int(max(0, min(self.num_rows, (memory - self._device_fixed()) // self._device_per_row())))
        return int(max(0, min(self.num_rows, memory // self.row_bytes)))


# ---------------------------------------------------------------------------- data
def training_rows(meta: dict) -> int:
    """The rows the counts were taken over: the train split's, or for raw-key data made
    day by day, the counted splits' (`key_counts.splits`), or for id data made day by day
    with no train split (`data synthetic --days N`, whose id counts count every day), the
    days'. Without the last, such data read as having no rows and `--cache-ratio fit`, the
    default, refused it."""
    from embcache.data.ctr_format import is_raw_keys

    counted = meta.get("key_counts", {}).get("splits") if is_raw_keys(meta) else None
    if not counted and "train" not in meta["splits"]:
        counted = [d["split"] for d in meta.get("day_splits", [])]
    names = counted or ["train"]
    return sum(int(meta["splits"].get(n, {}).get("rows", 0)) for n in names)


def table_frequencies(data_dir) -> tuple[np.ndarray, dict]:
    """meta.json and the id counts of every feature, concatenated in meta.json's order:
    the one id space of the trainer's shared cache. Raw-key data's per-key counts serve the
    same way: each key counted is a row of its open table. A data set without counts is a
    DataFormatError naming the file."""
    from pathlib import Path

    from embcache.data.ctr_format import is_raw_keys, load_id_frequencies, load_key_frequencies, read_meta
    from embcache.errors import format_error

    meta = read_meta(data_dir)
    if not training_rows(meta):
        raise format_error(Path(data_dir) / "meta.json", None, "has no training rows: nothing to predict from")
    if is_raw_keys(meta):
        counts = {name: c for name, (_, c) in load_key_frequencies(data_dir).items()}
    else:
        counts = load_id_frequencies(data_dir)
    freq = np.concatenate([counts[f["name"]].numpy() for f in meta["sparse"]]).astype(np.float64)
    if not freq.any():
        raise format_error(Path(data_dir) / meta["id_frequency_file"], None,
                           "holds no id counts (all zero): nothing to predict from")
    return freq, meta


def trace_batches(data_dir, batch_size: int, limit: int, seed: int = 0):
    """The ids of the first `limit` training batches, in the order the trainer's first epoch
    reads them (shards shuffled by `seed`), each batch's ids in the shared id space."""
    from embcache.data.loader import CTRBatches

    batches = CTRBatches(data_dir, "train", batch_size, shuffle_shards=True, seed=seed)
    offsets = np.concatenate([[0], np.cumsum([f.cardinality for f in batches.features])[:-1]]).astype(np.int64)
    for i, batch in enumerate(batches):
        if i >= limit:
            return
        kjt = batch.sparse
        yield kjt.values().numpy() + np.repeat(offsets, kjt.length_per_key())


# ---------------------------------------------------------------------------- the plan
@dataclass
class CachePlan:
    """A data set's cache plan: the prediction at each of `ratios` (and on a grid of sizes
    for the curves), the memory each costs, and the largest cache `device_memory` holds."""

    data_dir: str
    footprint: Footprint
    batch_size: int
    warmup_ratio: float
    traced: bool
    seed: int
    device_memory: int
    largest_rows: int
    ratios: list[float]
    prediction: Prediction
    epoch_batches: int
    distinct_expected: float  # per batch, from the counts
    counted_ids: int  # ids with a count: the most the warm-up loads
    prefetch_depth: int = 1
    admission: bool = True

    def rows(self) -> np.ndarray:
        """Where each of `ratios` sits in `prediction.sizes`."""
        return np.searchsorted(self.prediction.sizes, cache_sizes(self.ratios, self.footprint.num_rows))

    def assumption(self) -> str:
        """What the prediction rests on, in one sentence."""
        b, size = self.prediction.batches, f"{self.batch_size:,}"
        if self.traced:
            return (f"a replay of the first {b:,} training batches of {size} rows, in the order the trainer "
                    f"reads them (seed {self.seed})")
        part = "the epoch's" if b == self.epoch_batches else f"the first {b:,} of the epoch's"
        return (f"meta.json's id counts alone: a trace drawn from them, {part} {self.epoch_batches:,} batches of "
                f"{size} rows, each occurrence of an id in a batch drawn uniformly and independently (seed "
                f"{self.seed}): an id counted f times is then in 1-(1-1/B)^f of the B batches")

    def moved_per_batch(self, policy: str) -> tuple[np.ndarray, np.ndarray]:
        """Bytes (host->device, device->host) per batch: every miss comes in; once the
        warm-up's empty slots are taken, every miss evicts a row, dirty since trained."""
        pred, row = self.prediction, self.footprint.row_bytes
        misses = pred.misses_per_batch(policy)
        loaded = np.minimum(np.floor(self.warmup_ratio * pred.sizes), self.counted_ids)
        free = (pred.sizes - loaded) / max(pred.batches, 1)
        return misses * row, np.maximum(misses - free, 0.0) * row

    def to_json(self) -> dict:
        pred, fp = self.prediction, self.footprint
        moved = {p: self.moved_per_batch(p) for p in POLICIES if p in pred.hits}
        rows = []
        for ratio, i in zip(self.ratios, self.rows()):
            size = int(pred.sizes[i])
            rows.append({"ratio": ratio, "cache_rows": size, "fits": size <= self.largest_rows,
                         "overflow": size < pred.max_unique,
                         "hit_rate": {p: float(pred.hit_rate(p)[i]) for p in pred.hits},
                         "device_bytes": int(fp.device_bytes(size)),
                         "bytes_per_batch": {p: {"h2d": float(v[0][i]), "d2h": float(v[1][i])}
                                             for p, v in moved.items()}})
        return {"data": self.data_dir, "num_rows": fp.num_rows, "embedding_dim": fp.dim, "optimizer": fp.optimizer,
                "eviction_bookkeeping": fp.eviction, "bookkeeping": fp.bookkeeping, "row_bytes": fp.row_bytes,
                "host_bytes": fp.host_bytes(),
                "batch_size": self.batch_size, "batches": pred.batches, "epoch_batches": self.epoch_batches,
                "traced": self.traced, "prefetch": self.prefetch_depth > 0, "prefetch_depth": self.prefetch_depth,
                "admission": self.admission,
                "assumption": self.assumption(),
                "distinct_rows_per_batch": pred.accesses / max(pred.batches, 1),
                "distinct_rows_per_batch_expected": self.distinct_expected,
                "device_memory": self.device_memory, "largest_cache_rows": self.largest_rows,
                "largest_cache_ratio": self.largest_rows / fp.num_rows, "rows": rows,
                "curve": {"cache_rows": pred.sizes.tolist(),
                          "hit_rate": {p: pred.hit_rate(p).tolist() for p in pred.hits}}}


def cache_sizes(ratios, num_rows: int) -> np.ndarray:
    """Rows of a cache at each ratio, as the cache computes them (`ceil(ratio * N)`)."""
    return np.array([math.ceil(r * num_rows) for r in ratios], dtype=np.int64)


def size_grid(num_rows: int, points: int = 48, largest: int | None = None) -> np.ndarray:
    """Cache sizes spread evenly on a log scale from 0.01 % of the rows (one row at least)
    to `largest` (all rows)."""
    top = max(1, min(num_rows, largest or num_rows))
    return np.unique(np.geomspace(max(1.0, min(top, 1e-4 * num_rows)), top, points).astype(np.int64))


def access_batches(data_dir, freq: np.ndarray, meta: dict, batch_size: int, trace: int | None, seed: int):
    """(the batches to replay, how many, the epoch's batches): the first `trace` training
    batches, or the surrogate drawn from the counts."""
    epoch = max(1, -(-training_rows(meta) // batch_size))
    from embcache.data.ctr_format import is_raw_keys

    if trace and is_raw_keys(meta):
        from embcache.errors import UserFacingError

        raise UserFacingError("--trace replays ids of the train split; raw-key data is planned from its per-key "
                              "counts (leave --trace out)")
    if trace:
        count = min(trace, epoch)
        return trace_batches(data_dir, batch_size, count, seed), count, epoch
    batches = surrogate_batches(freq, epoch, seed=seed)
    return batches, len(batches), epoch


def plan_cache(data_dir, *, embedding_dim: int, optimizer: str, device_memory: int, batch_size: int,
               warmup_ratio: float = 0.7, eviction: str = "freq", trace: int | None = None, seed: int = 0,
               ratios=DEFAULT_RATIOS, prefetch_depth: int = 1, admission: bool = False,
               bookkeeping: str = "host") -> CachePlan:
    """Read `data_dir` (meta.json's counts; with `trace`, its first batches too) and
    predict every policy at each ratio and on a grid of sizes, in one replay, for the
    trainer (`prefetch_depth`: the batches it admits ahead while the current one trains,
    all of whose rows stay held; `admission`: whether its cache uses admission control, the
    trainer's `--admission`; `bookkeeping`: "host" or "device", where the bookkeeping's
    bytes count)."""
    freq, meta = table_frequencies(data_dir)
    footprint = Footprint(freq.size, embedding_dim, optimizer, eviction, bookkeeping, batch_size * len(meta["sparse"]))
    ratios = sorted(float(r) for r in ratios)
    largest = footprint.largest_cache(device_memory)
    sizes = np.unique(np.concatenate([cache_sizes(ratios, freq.size), size_grid(freq.size),
                                      [largest] if largest else []])).astype(np.int64)
    batches, count, epoch = access_batches(data_dir, freq, meta, batch_size, trace, seed)
    admission = bool(admission)
    prediction = replay(batches, freq, sizes, warmup_ratio, count, held=1 + prefetch_depth, admission=admission)
    return CachePlan(str(data_dir), footprint, batch_size, warmup_ratio, bool(trace), seed, device_memory,
                     largest, ratios, prediction, epoch, expected_distinct(freq, epoch), int(np.count_nonzero(freq)),
                     prefetch_depth, admission)


# ---------------------------------------------------------------------------- the trainer's choice
DEFAULT_DEVICE_MEMORY = 16 * 2**30  # what a cache on a CPU device may use unless told


def default_device_memory(device) -> tuple[int, str]:
    """The memory `--cache-ratio auto` sizes the cache for when none is given, and where
    that figure comes from: a CUDA device's free memory now, else DEFAULT_DEVICE_MEMORY."""
    import torch

    if getattr(device, "type", str(device)) == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free), f"the free memory of {device}"
    return DEFAULT_DEVICE_MEMORY, "the default for a CPU device"


def first_within(sizes: np.ndarray, rates: np.ndarray, best: float, tolerance: float = 0.01) -> int:
    """Index of the first of `sizes` whose hit rate is within `tolerance` of `best`."""
    return int(np.argmax(rates >= best - tolerance - 1e-12))


def auto_cache_ratio(data_dir, *, embedding_dim: int, optimizer: str, eviction: str, batch_size: int,
                     warmup_ratio: float, device_memory: int, tolerance: float = 0.01, seed: int = 0,
                     prefetch_depth: int = 1, admission: bool = False, bookkeeping: str = "host") -> tuple[float, str]:
    """The smallest cache ratio whose predicted hit rate (of `eviction`, from meta.json's
    counts) is within `tolerance` of the one of the largest cache that fits
    `device_memory`; returns it with one line saying why. Two replays: a coarse grid up to
    the largest cache, then a fine one between the grid point found and the one below it,
    so that the rate stated is the model's at the size chosen. `prefetch_depth` and
    `admission` are the trainer's, as in `plan_cache`."""
    from embcache.errors import UserFacingError

    freq, meta = table_frequencies(data_dir)
    footprint = Footprint(freq.size, embedding_dim, optimizer, eviction, bookkeeping, batch_size * len(meta["sparse"]))
    largest = footprint.largest_cache(device_memory)
    if largest < 1:
        raise UserFacingError(f"--device-memory {format_bytes(device_memory)} holds no cache: one row with its "
                              f"{optimizer} state needs {footprint.row_bytes} B")

    def rates(sizes: np.ndarray) -> np.ndarray:
        batches, count, _ = access_batches(data_dir, freq, meta, batch_size, None, seed)
        return replay(batches, freq, sizes, warmup_ratio, count, policies=(eviction,), held=1 + prefetch_depth,
                      admission=admission).hit_rate(eviction)

    coarse = size_grid(freq.size, 48, largest)
    coarse_rates = rates(coarse)
    best = float(coarse_rates[-1])
    i = first_within(coarse, coarse_rates, best, tolerance)
    fine = np.unique(np.linspace(coarse[i - 1] + 1 if i else 1, coarse[i], 24).astype(np.int64))
    fine_rates = rates(fine)
    j = first_within(fine, fine_rates, best, tolerance)
    rows, rate = int(fine[j]), float(fine_rates[j])
    ratio = rows / freq.size
    return ratio, (f"cache ratio auto: {ratio:.3%} ({rows:,} rows), predicted {eviction} hit rate {rate:.3f}, the "
                   f"smallest within {100 * tolerance:g} point of the {best:.3f} predicted for the largest cache that "
                   f"fits: {largest / freq.size:.2%} of the rows ({format_bytes(footprint.device_bytes(largest))}) in "
                   f"{format_bytes(device_memory)}")
