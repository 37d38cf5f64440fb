"""How big a cache: the hit rate each eviction policy is predicted to reach at every cache
size, and what each size costs in device memory and traffic, before any training.

Hits and misses count distinct rows per batch, as `RowCache.stats` does. Every curve
comes from one pass over what is known about the accesses:

- **a trace** (the training batches, in order): per id, the number of batches it appears
  in (`n`), and how many of those follow a batch holding it too (`consecutive`); for
  `lru`, stack distances as below.
- **only the id frequencies** (meta.json's counts `f` over `B` batches of the epoch): if
  an id's `f` occurrences fall into batches independently and uniformly, the chance that
  a given batch holds it is `p = 1 - (1 - 1/B)^f`, so it appears in `n = B p` batches
  (`B (1 - (1 - 1/B)^f)`), `(B - 1) p^2` of them right after one that held it too, and in
  at least one batch for sure (it is in the training data).

`freq` (and `lfu`) as frequency ranking: the cache holds the ids ranked highest by
`ids_freq` (their keys, prior + online count, keep that order, and every rank below is
colder than a row just missed), except for the last batch's misses, which were admitted
and are the next victims. So of `C` slots, `K` hold the top `K` ranks and `C - K` the
churn, where `C - K` is the misses per batch of the ranks from `K` on; `K + churn(K)` only
grows with `K` (an id is in at most every batch), so one sort and one cumulative sum per
quantity give `K` and the hit count for every `C` at once. An id ranked below the warm-up
(the top `floor(warmup_ratio * C)` ids with a count) misses once, at its first use; a
churn id used again in the very next batch hits. `lfu` ranks by online counts alone: the
same curve without the warm-up's help (its warm-up rows start with a count of 0 and go
first).

`lru` from a trace: Mattson's stack distances at batch granularity. The cache after a
batch holds the `C` most recently used ids; an id last used in batch `t'` is resident at
batch `t` if fewer than `C` ids were used more recently, the `e` ids whose last use was
`t'` too sharing the boundary (a fraction `(C - d) / e` of them resident, `d` = ids used
more recently). `d` is a prefix sum over last-use batches in a Fenwick tree, so all sizes
come from one pass. The warm-up sits below batch 1 in the stack, hottest first, with one
empty slot after every `1 / (1 - warmup_ratio)` rows, so that the top `C` of the initial
stack is exactly the warm-up of a cache of `C` rows. `lru` from frequencies: Che's
approximation (the cache holds the ids used in the last `T` batches, `T` such that they
are `C` ids).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

POLICIES = ("freq", "lfu", "lru")
DEFAULT_RATIOS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.025, 0.05, 0.10, 0.25)
# Device bytes besides the rows, read off `RowCache`: per slot, slot_to_id (int64), dirty
# (bool), holds (int32) and the policy's slot_last and slot_primary (float64); per id of the
# table, the slot map's id_to_slot (int64), plus the online counts (int32) of lfu/freq and
# freq's prior (float64).
SLOT_BOOKKEEPING_BYTES = 8 + 1 + 4 + 8 + 8
ID_BOOKKEEPING_BYTES = {"lru": 8, "lfu": 8 + 4, "freq": 8 + 4 + 8}
FLOAT32_BYTES = 4


# ---------------------------------------------------------------------------- memory
@dataclass(frozen=True)
class Footprint:
    """What `num_rows` rows of `dim` floats with `optimizer` state cost where they live.

    Example:
        >>> f = Footprint(num_rows=1000, dim=16, optimizer="adagrad", eviction="freq")
        >>> f.row_bytes, f.host_bytes(), f.device_bytes(10)
        (128, 128000, 21570)
    """

    num_rows: int
    dim: int
    optimizer: str = "adagrad"
    eviction: str = "freq"

    @property
    def row_bytes(self) -> int:
        """A row with its optimizer state: what one row moved between host and device costs
        (`RowOptimizer.init_state`: float32 tables, sgd none, rowwise_adagrad one column,
        adagrad one per element, adam two)."""
        from embcache.cache.optimizers import make_optimizer

        widths = make_optimizer(self.optimizer, 1.0).state_widths(self.dim)
        return FLOAT32_BYTES * (self.dim + sum(widths.values()))

    def host_bytes(self) -> int:
        """The host store: every row and its state, in id order."""
        return self.num_rows * self.row_bytes

    def device_bytes(self, cache_rows) -> np.ndarray | int:
        """The cache of `cache_rows` rows: rows, state and bookkeeping on the device."""
        per_id = ID_BOOKKEEPING_BYTES[self.eviction] * self.num_rows
        return per_id + np.asarray(cache_rows, dtype=np.int64) * (self.row_bytes + SLOT_BOOKKEEPING_BYTES) \
            if not isinstance(cache_rows, int) else per_id + cache_rows * (self.row_bytes + SLOT_BOOKKEEPING_BYTES)

    def largest_cache(self, memory: int) -> int:
        """The most rows (at most all of them) whose cache fits in `memory` bytes; 0 when the
        per-id bookkeeping alone does not fit."""
        spare = memory - ID_BOOKKEEPING_BYTES[self.eviction] * self.num_rows
        return int(max(0, min(self.num_rows, spare // (self.row_bytes + SLOT_BOOKKEEPING_BYTES))))


# ---------------------------------------------------------------------------- access profiles
@dataclass
class AccessProfile:
    """Per id: `batches` (how many batches hold it), `consecutive` (how many of those follow
    a batch holding it), `seen` (whether it appears at all); over `num_batches` batches.
    From a trace the counts are whole numbers, from frequencies expectations."""

    freq: np.ndarray
    batches: np.ndarray
    consecutive: np.ndarray
    seen: np.ndarray
    num_batches: int
    max_unique: float  # the most distinct ids one batch needs (expected, from frequencies)

    @property
    def accesses(self) -> float:
        """Distinct ids per batch, summed over the batches: what the hit rate divides."""
        return float(self.batches.sum())


def expected_profile(freq: np.ndarray, num_batches: int) -> AccessProfile:
    """The profile of `num_batches` batches if each id's occurrences fall into batches
    independently and uniformly (see the module's docstring)."""
    freq = np.asarray(freq, dtype=np.float64)
    b = int(num_batches)
    p = -np.expm1(freq * math.log1p(-1.0 / b)) if b > 1 else (freq > 0).astype(np.float64)
    batches = b * p
    return AccessProfile(freq, batches, (b - 1) * p * p, freq > 0, b, float(p.sum()))


class TraceProfile:
    """Accumulates, batch by batch, the profile of a trace and (for `lru`) its stack
    distances: `add(ids)` once per batch, then `profile()` and `lru`."""

    def __init__(self, freq: np.ndarray, warmup_ratio: float, max_batches: int):
        self.freq = np.asarray(freq, dtype=np.float64)
        n = self.freq.size
        self.batches = np.zeros(n, dtype=np.int64)
        self.consecutive = np.zeros(n, dtype=np.int64)
        self.last = np.full(n, -2, dtype=np.int64)
        self.t = 0
        self.max_unique = 0
        self.lru = LruStack(self.freq, warmup_ratio, max_batches)

    def add(self, ids) -> None:
        """One batch's ids (any shape, any order, repeats allowed)."""
        u = np.unique(np.asarray(ids, dtype=np.int64))
        self.batches[u] += 1
        self.consecutive[u] += self.last[u] == self.t - 1
        self.last[u] = self.t
        self.max_unique = max(self.max_unique, u.size)
        self.lru.add(u)
        self.t += 1

    def profile(self) -> AccessProfile:
        return AccessProfile(self.freq, self.batches, self.consecutive, self.batches > 0, self.t,
                             float(self.max_unique))


def rank_order(freq: np.ndarray) -> np.ndarray:
    """Ids hottest first, as the warm-up loads them (ties by id)."""
    return np.argsort(-np.asarray(freq, dtype=np.float64), kind="stable")


# ---------------------------------------------------------------------------- freq / lfu
def ranked_hits(profile: AccessProfile, sizes, warmup_ratio: float, warm: bool = True) -> np.ndarray:
    """Predicted hits (distinct rows per batch, summed) of frequency ranking at every cache
    size in `sizes`: `freq` (`warm`), or `lfu`, whose warm-up rows keep their first use
    only while the empty slots last (they start with a count of 0 and go first): a share
    `empty slots / misses` of that help, capped at all of it."""
    sizes = np.asarray(sizes, dtype=np.int64)
    order = rank_order(profile.freq)
    n = _cumulative(profile.batches[order])
    seen = _cumulative(profile.seen[order])
    cons = _cumulative(profile.consecutive[order])
    b = profile.num_batches
    # churn(K): misses per batch of the ids ranked K and below (less their next-batch hits)
    churn = ((n[-1] - n) - (cons[-1] - cons)) / b
    k = np.searchsorted(np.arange(n.size) + churn, sizes, side="right") - 1
    k = np.clip(k, 0, np.minimum(sizes, n.size - 1))
    loaded = np.minimum(np.floor(warmup_ratio * sizes).astype(np.int64), int(np.count_nonzero(profile.freq > 0)))
    w = np.minimum(loaded, k)
    # the churn slots keep the last batch's misses: a fraction of them when fewer than they
    room = np.divide(sizes - k, churn[k], out=np.ones(k.size), where=churn[k] > 0)
    hits = n[k] - (seen[k] - seen[w]) + (cons[-1] - cons[k]) * np.clip(room, 0.0, 1.0)
    if warm:
        return hits
    help_ = seen[w]  # first uses the warm-up turns into hits
    misses = np.maximum(n[-1] - hits, 1.0)
    return hits - help_ + help_ * np.minimum(1.0, (sizes - loaded) / misses)


def _cumulative(values: np.ndarray) -> np.ndarray:
    """`out[k]` = sum of the first k values (float64, length + 1)."""
    out = np.zeros(values.size + 1, dtype=np.float64)
    np.cumsum(values, out=out[1:])
    return out


# ---------------------------------------------------------------------------- lru
class _Fenwick:
    """Prefix sums of int64 counts with point updates, both vectorised over index arrays."""

    def __init__(self, counts: np.ndarray):
        n = counts.size
        prefix = _cumulative(counts).astype(np.int64)
        i = np.arange(n)
        self.tree = prefix[i + 1] - prefix[i & (i + 1)]

    def prefix(self, idx: np.ndarray) -> np.ndarray:
        """Sums of counts[0..idx] (inclusive; idx -1 gives 0)."""
        out = np.zeros(idx.size, dtype=np.int64)
        i = idx.astype(np.int64, copy=True)
        live = i >= 0
        while live.any():
            out[live] += self.tree[i[live]]
            i[live] = (i[live] & (i[live] + 1)) - 1
            live = i >= 0
        return out

    def add(self, idx: np.ndarray, delta: np.ndarray) -> None:
        i = idx.astype(np.int64, copy=True)
        d = np.broadcast_to(delta, i.shape).astype(np.int64)
        live = i < self.tree.size
        while live.any():
            np.add.at(self.tree, i[live], d[live])
            i[live] = i[live] | (i[live] + 1)
            live = i < self.tree.size


class LruStack:
    """Mattson's stack distances of a batched trace (see the module's docstring).

    Slot `s` of the tree counts the ids whose last use is `s`: slots below `depth` are the
    initial stack (one entry each, the top of the stack at `depth - 1`), slot `depth + t`
    is batch t. `ramp` accumulates, per access, the second difference of its expected hit
    at each cache size, so `hits` is two cumulative sums."""

    def __init__(self, freq: np.ndarray, warmup_ratio: float, max_batches: int):
        n = freq.size
        self.depth = n
        position = np.arange(n)
        real = np.floor(warmup_ratio * (position + 1)) > np.floor(warmup_ratio * position)
        hot = rank_order(freq)[: int(np.count_nonzero(freq > 0))]
        warm = np.flatnonzero(real)[: hot.size]
        self.last = np.full(n, -1, dtype=np.int64)
        self.last[hot[: warm.size]] = n - 1 - warm
        self.group = np.zeros(n + int(max_batches), dtype=np.int64)
        self.group[:n] = 1  # warm rows and empty slots alike take a place in the stack
        self.tree = _Fenwick(self.group)
        self.entries = n
        self.ramp = np.zeros(n + 2, dtype=np.float64)
        self.t = 0

    def add(self, unique_ids: np.ndarray) -> None:
        slot = self.depth + self.t
        if slot >= self.group.size:
            raise ValueError(f"LruStack was sized for {self.group.size - self.depth} batches")
        last = self.last[unique_ids]
        known = last >= 0
        prev = last[known]
        above = self.entries - self.tree.prefix(prev)  # ids used more recently than each one
        ties = self.group[prev]
        top = self.ramp.size - 1
        weight = 1.0 / ties
        self.ramp += np.bincount(np.minimum(above + 1, top), weight, minlength=self.ramp.size)
        self.ramp -= np.bincount(np.minimum(above + ties + 1, top), weight, minlength=self.ramp.size)
        moved = np.bincount(prev, minlength=self.group.size) if prev.size else None
        if moved is not None:
            self.group -= moved
            self.tree.add(prev, -1)
        self.group[slot] = unique_ids.size
        self.tree.add(np.array([slot]), unique_ids.size)
        self.entries += int(np.count_nonzero(~known))
        self.last[unique_ids] = slot
        self.t += 1

    def hits(self, sizes) -> np.ndarray:
        sizes = np.minimum(np.asarray(sizes, dtype=np.int64), self.ramp.size - 1)
        return np.cumsum(np.cumsum(self.ramp))[sizes]


def che_lru_hits(profile: AccessProfile, sizes, warmup_ratio: float) -> np.ndarray:
    """Predicted `lru` hits from frequencies alone (Che's approximation at batch
    granularity): the cache holds the ids used in the last `T` batches, `T` the time in
    which `C` distinct ids are used; an id used in a fraction `p` of the batches is then
    resident with probability `h = 1 - (1 - p)^T`. Each use but its first hits with that
    chance, the first one too when the id was warmed up."""
    sizes = np.asarray(sizes, dtype=np.float64)
    values, mult = np.unique(profile.freq[profile.freq > 0], return_counts=True)
    values, mult = values[::-1], mult[::-1].astype(np.float64)  # hottest first, as the warm-up
    b = profile.num_batches
    p = -np.expm1(values * math.log1p(-1.0 / b)) if b > 1 else np.ones_like(values)
    log_miss = np.log1p(-np.minimum(p, 1 - 1e-15))
    lo, hi = np.full(sizes.size, -30.0), np.full(sizes.size, 40.0)  # bounds of log T
    for _ in range(80):
        mid = (lo + hi) / 2
        distinct = (mult * -np.expm1(np.exp(mid)[:, None] * log_miss)).sum(1)
        below = distinct < sizes
        lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
    h = -np.expm1(np.exp(hi)[:, None] * log_miss)
    h[sizes >= mult.sum()] = 1.0
    warm = np.minimum(np.floor(warmup_ratio * sizes), mult.sum())
    before = np.concatenate([[0.0], np.cumsum(mult)[:-1]])
    warm_per_value = np.clip(warm[:, None] - before, 0.0, mult)
    return (h * (mult * (b * p - 1) + warm_per_value)).sum(1)


# ---------------------------------------------------------------------------- the plan
@dataclass
class Prediction:
    """Predicted hits per policy at each of `sizes` (cache rows), over `profile`."""

    sizes: np.ndarray
    hits: dict[str, np.ndarray]
    profile: AccessProfile

    def hit_rate(self, policy: str) -> np.ndarray:
        return self.hits[policy] / max(self.profile.accesses, 1.0)

    def misses_per_batch(self, policy: str) -> np.ndarray:
        return (self.profile.accesses - self.hits[policy]) / max(self.profile.num_batches, 1)


def predict(profile: AccessProfile, sizes, warmup_ratio: float, lru: LruStack | None = None) -> Prediction:
    """Every policy's predicted hits at `sizes`: `lru` by stack distances when the trace's
    `lru` stack is given, by Che's approximation otherwise."""
    sizes = np.asarray(sizes, dtype=np.int64)
    hits = {"freq": ranked_hits(profile, sizes, warmup_ratio),
            "lfu": ranked_hits(profile, sizes, warmup_ratio, warm=False),
            "lru": lru.hits(sizes) if lru is not None else che_lru_hits(profile, sizes, warmup_ratio)}
    return Prediction(sizes, hits, profile)


# ---------------------------------------------------------------------------- data
def table_frequencies(data_dir) -> tuple[np.ndarray, dict]:
    """meta.json and the id counts of every feature, concatenated in meta.json's order:
    the one id space of the trainer's shared cache. A data set without counts is a
    DataFormatError naming the file."""
    from pathlib import Path

    from embcache.data.ctr_format import load_id_frequencies, read_meta
    from embcache.errors import format_error

    meta = read_meta(data_dir)
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


@dataclass
class CachePlan:
    """A data set's cache plan: the prediction at each of `ratios`, the memory each costs,
    and the largest cache `device_memory` holds."""

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
    lru: LruStack | None = None  # the trace's stack, which answers any cache size

    @property
    def num_batches(self) -> int:
        return self.prediction.profile.num_batches

    def assumption(self) -> str:
        """What the prediction rests on, in one sentence."""
        b = self.num_batches
        if self.traced:
            return (f"a replay of the first {b:,} training batches of {self.batch_size:,} rows, in the order "
                    f"the trainer reads them (seed {self.seed}); lru by stack distances")
        return (f"meta.json's id counts alone, over one epoch of {b:,} batches of {self.batch_size:,} rows: an id "
                f"counted f times is taken to fall into batches independently, so it appears in "
                f"B(1-(1-1/B)^f) of them; lru by Che's approximation")

    def moved_per_batch(self, policy: str) -> tuple[np.ndarray, np.ndarray]:
        """Bytes (host->device, device->host) per batch: every miss comes in; once the
        warm-up's empty slots are taken, every miss evicts a row, dirty since trained."""
        pred, row = self.prediction, self.footprint.row_bytes
        misses = pred.misses_per_batch(policy)
        loaded = np.minimum(np.floor(self.warmup_ratio * pred.sizes), np.count_nonzero(pred.profile.freq))
        free = (pred.sizes - loaded) / max(self.num_batches, 1)
        return misses * row, np.maximum(misses - free, 0.0) * row

    def overflows(self) -> np.ndarray:
        """Sizes smaller than some batch's distinct rows: the rest is served beside the cache
        each step, and the prediction there is rough."""
        return self.prediction.sizes < self.prediction.profile.max_unique

    def to_json(self) -> dict:
        pred, fp = self.prediction, self.footprint
        rows = []
        for i, (ratio, size) in enumerate(zip(self.ratios, pred.sizes)):
            moved = {p: dict(zip(("h2d", "d2h"), (float(v[i]) for v in self.moved_per_batch(p)))) for p in POLICIES}
            rows.append({"ratio": ratio, "cache_rows": int(size), "fits": bool(size <= self.largest_rows),
                         "overflow": bool(self.overflows()[i]),
                         "hit_rate": {p: float(pred.hit_rate(p)[i]) for p in POLICIES},
                         "device_bytes": int(fp.device_bytes(int(size))), "bytes_per_batch": moved})
        return {"data": self.data_dir, "num_rows": fp.num_rows, "embedding_dim": fp.dim, "optimizer": fp.optimizer,
                "eviction_bookkeeping": fp.eviction, "row_bytes": fp.row_bytes, "host_bytes": fp.host_bytes(),
                "batch_size": self.batch_size, "batches": self.num_batches, "traced": self.traced,
                "assumption": self.assumption(), "distinct_rows_per_batch": pred.profile.accesses / max(
                    self.num_batches, 1), "device_memory": self.device_memory, "largest_cache_rows": self.largest_rows,
                "largest_cache_ratio": self.largest_rows / fp.num_rows, "rows": rows}


def cache_sizes(ratios, num_rows: int) -> np.ndarray:
    """Rows of a cache at each ratio, as the cache computes them (`ceil(ratio * N)`)."""
    return np.array([math.ceil(r * num_rows) for r in ratios], dtype=np.int64)


def profile_data(data_dir, freq: np.ndarray, meta: dict, batch_size: int, warmup_ratio: float,
                 trace: int | None = None, seed: int = 0) -> tuple[AccessProfile, LruStack | None]:
    """The access profile of one epoch from the counts, or of the first `trace` batches
    replayed (with their `lru` stack)."""
    rows = int(meta["splits"]["train"]["rows"])
    epoch = max(1, -(-rows // batch_size))
    if not trace:
        return expected_profile(freq, epoch), None
    traced = TraceProfile(freq, warmup_ratio, min(trace, epoch))
    for ids in trace_batches(data_dir, batch_size, min(trace, epoch), seed):
        traced.add(ids)
    return traced.profile(), traced.lru


def plan_cache(data_dir, *, embedding_dim: int, optimizer: str, device_memory: int, batch_size: int,
               warmup_ratio: float = 0.7, eviction: str = "freq", trace: int | None = None, seed: int = 0,
               ratios=DEFAULT_RATIOS) -> CachePlan:
    """Read `data_dir` (meta.json's counts; with `trace`, its first batches too) and
    predict every policy at each ratio."""
    freq, meta = table_frequencies(data_dir)
    profile, lru = profile_data(data_dir, freq, meta, batch_size, warmup_ratio, trace, seed)
    footprint = Footprint(freq.size, embedding_dim, optimizer, eviction)
    ratios = sorted(float(r) for r in ratios)
    return CachePlan(str(data_dir), footprint, batch_size, warmup_ratio, bool(trace), seed, device_memory,
                     footprint.largest_cache(device_memory), ratios,
                     predict(profile, cache_sizes(ratios, freq.size), warmup_ratio, lru), lru)


def smallest_within(freq_profile: AccessProfile, largest: int, warmup_ratio: float, policy: str = "freq",
                    tolerance: float = 0.01) -> tuple[int, float, float]:
    """The smallest cache whose predicted hit rate is within `tolerance` of the one of
    `largest` rows: (rows, its hit rate, the largest's hit rate). `lru` is judged on Che's
    curve, the others on their ranking curves."""
    sizes = np.arange(1, largest + 1, dtype=np.int64)
    if policy == "lru":
        grid = np.unique(np.geomspace(1, largest, 256).astype(np.int64))
        rates = np.interp(sizes, grid, che_lru_hits(freq_profile, grid, warmup_ratio)) / freq_profile.accesses
    else:
        rates = ranked_hits(freq_profile, sizes, warmup_ratio, warm=policy == "freq") / freq_profile.accesses
    best = float(rates[-1])
    pick = int(np.argmax(rates >= best - tolerance))
    return int(sizes[pick]), float(rates[pick]), best


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


def auto_cache_ratio(data_dir, *, embedding_dim: int, optimizer: str, eviction: str, batch_size: int,
                     warmup_ratio: float, device_memory: int, tolerance: float = 0.01) -> tuple[float, str]:
    """The smallest cache ratio whose predicted hit rate (of `eviction`, from meta.json's
    counts over one epoch) is within `tolerance` of the largest cache that fits
    `device_memory`; returns it with one line saying why."""
    from embcache.errors import UserFacingError

    freq, meta = table_frequencies(data_dir)
    profile, _ = profile_data(data_dir, freq, meta, batch_size, warmup_ratio)
    footprint = Footprint(freq.size, embedding_dim, optimizer, eviction)
    largest = footprint.largest_cache(device_memory)
    if largest < 1:
        raise UserFacingError(f"--device-memory {format_bytes(device_memory)} holds no cache: the {eviction} "
                              f"bookkeeping of {freq.size:,} rows alone needs {format_bytes(footprint.device_bytes(0))}")
    rows, rate, best = smallest_within(profile, largest, warmup_ratio, eviction, tolerance)
    ratio = rows / freq.size
    return ratio, (f"cache ratio auto: {ratio:.3%} ({rows:,} rows), predicted {eviction} hit rate {rate:.3f}: the "
                   f"smallest within {100 * tolerance:g} point of {best:.3f}, the largest cache that fits "
                   f"{format_bytes(device_memory)} ({largest / freq.size:.2%}; {format_bytes(footprint.device_bytes(largest))})")


def format_bytes(n: float) -> str:
    """`3.2 GiB`, `512.0 KiB`, `12 B`."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n:,.0f} B"
