"""How big a cache: the hit rate each eviction policy is predicted to reach at each cache
size, and what each size costs in device memory and traffic, before any training.

Hits and misses count distinct rows per batch, as `RowCache.stats` does. The prediction
replays a trace once, every cache size of interest at the same time: the training batches
themselves (`--trace N`), or, from meta.json's counts alone, a surrogate trace drawn from
them (below).

**The model.** Every policy keeps the rows with the highest keys (`freq`: the id's count
in the data + its online count; `lfu`: the online count; `lru`: the batch of its last
use), except that the rows of the held batches are all resident: the last batch's (its
misses were admitted and only other rows are evicted), and under the trainer the one
before too (it admits the next batch while the current one trains, and evicts neither).
Keys never fall while a row waits, so an idle row stays resident as long as fewer than
`K` admitted rows rank above it, `K = C - churn` where the churn is the held rows outside
that top `K` (a fixed point, solved per size). For each row a batch needs, the number of rows ranking above it is a prefix sum in
a Fenwick tree over key levels (independent of the cache size: Mattson's stack distance,
at batch granularity; for `lru` the levels are batches); rows of equal key share the
boundary (`(K - d) / e` of them resident). "Admitted" depends on the size in one way: the
warm-up loads the `floor(warmup_ratio * C)` ids hottest by count, with keys that rank
below any accessed row of equal key (they are the least recent), so the warm-up rows not
yet used that rank above a row are counted by a second Fenwick tree, over warm-up ranks,
at each size's warm-up boundary. A row used for the first time hits only if it was warmed
up and still ranks within `K`. When a batch has more distinct rows than the cache
(overflow), the cache keeps that batch's hits and admits its misses in id order (the
order `torch.unique` gives them) until it is full. With admission control (`freq` and
`lfu`; the cache's default) a missed row gets in only if it is hotter than the row it
would evict, so no row is held below the top: the cache is the top `C` by key, `K = C`. Measured against real `RowCache` runs:
see the README's "How big a cache".

**From the counts alone** the order of the accesses is unknown. The surrogate trace
assumes each of an id's `f` occurrences falls into one of the epoch's `B` batches
independently and uniformly (seeded): then a batch holds the id with probability
`1 - (1 - 1/B)^f`, so a batch needs `sum(1 - (1 - 1/B)^f)` distinct rows on average,
which the report states. Past `MAX_SURROGATE_BATCHES` batches only the first ones are
drawn (each occurrence kept with probability `S / B`), which weighs the warm-up's first
misses more than a whole epoch would.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np

POLICIES = ("freq", "lfu", "lru")
DEFAULT_RATIOS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.025, 0.05, 0.10, 0.25)
MAX_SURROGATE_BATCHES = 512
# Device bytes besides the rows, read off `RowCache`: per slot, slot_to_id (int64), dirty
# (bool), holds (int32) and the policy's slot_last and slot_primary (float64); per id of the
# table, the slot map's id_to_slot (int64), plus the online counts (int32) of lfu/freq and
# freq's prior (float64).
SLOT_BOOKKEEPING_BYTES = 8 + 1 + 4 + 8 + 8
ID_BOOKKEEPING_BYTES = {"lru": 8, "lfu": 8 + 4, "freq": 8 + 4 + 8}
FLOAT32_BYTES = 4
# key levels of `freq` (count + online count): exact below this, then PER_OCTAVE per doubling
EXACT_LEVELS = 4096
PER_OCTAVE = 64


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

    def device_bytes(self, cache_rows: int) -> int:
        """The cache of `cache_rows` rows: rows, state and bookkeeping on the device."""
        return ID_BOOKKEEPING_BYTES[self.eviction] * self.num_rows \
            + int(cache_rows) * (self.row_bytes + SLOT_BOOKKEEPING_BYTES)

    def largest_cache(self, memory: int) -> int:
        """The most rows (at most all of them) whose cache fits in `memory` bytes; 0 when the
        per-id bookkeeping alone does not fit."""
        spare = memory - ID_BOOKKEEPING_BYTES[self.eviction] * self.num_rows
        return int(max(0, min(self.num_rows, spare // (self.row_bytes + SLOT_BOOKKEEPING_BYTES))))


class _Fenwick:
    """Prefix sums of int64 counts with point updates, both vectorised over index arrays."""

    def __init__(self, counts: np.ndarray):
        if not counts.any():
            self.tree = np.zeros(counts.size, dtype=np.int64)
            return
        prefix = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
        i = np.arange(counts.size)
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


# ---------------------------------------------------------------------------- the model
def rank_order(freq: np.ndarray) -> np.ndarray:
    """Ids hottest first, as the warm-up loads them (ties by id)."""
    return np.argsort(-np.asarray(freq, dtype=np.float64), kind="stable")


def key_level(keys: np.ndarray) -> np.ndarray:
    """Fenwick level of a `freq` key: the key itself below EXACT_LEVELS, then log buckets
    (rows that hot are far inside any cache; their exact order does not matter)."""
    keys = np.asarray(keys, dtype=np.float64)
    out = keys.astype(np.int64)
    big = keys >= EXACT_LEVELS
    if big.any():
        out[big] = EXACT_LEVELS + (PER_OCTAVE * np.log2(keys[big] / EXACT_LEVELS)).astype(np.int64)
    return out


class RankedCache:
    """One policy's predicted hits at each cache size in `sizes`, fed one batch at a time
    (`add`); see the module's docstring.

    Args:
        policy: "freq" | "lfu" | "lru".
        freq: per-id counts (`ids_freq`): the warm-up's order, and `freq`'s prior.
        sizes: cache sizes in rows.
        warmup_ratio: as the cache's.
        max_batches: at least the number of batches to come (sizes the key levels).
        held: batches whose rows cannot be evicted when a batch's misses come in: 1 (the
            batch itself, looked up one after another), 2 (the trainer, which admits the
            next batch while the current one trains).
        admission: the cache's admission control (`freq` and `lfu` only).
    """

    def __init__(self, policy: str, freq: np.ndarray, sizes, warmup_ratio: float, max_batches: int,
                 held: int = 1, admission: bool = False):
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
        freq = np.asarray(freq, dtype=np.float64)
        n = freq.size
        self.policy, self.sizes = policy, np.asarray(sizes, dtype=np.int64)
        self.admission = bool(admission) and policy != "lru"
        self.prior = freq if policy == "freq" else np.zeros(n)
        order = rank_order(freq)
        self.rank = np.empty(n, dtype=np.int64)
        self.rank[order] = np.arange(n)
        self.prior_desc = -self.prior[order]  # ascending: for "how many priors exceed v"
        self.warm = np.minimum(np.floor(warmup_ratio * self.sizes), np.count_nonzero(freq)).astype(np.int64)
        self.count = np.zeros(n, dtype=np.int64)  # batches that used the id so far
        self.last = np.full(n, -2, dtype=np.int64)  # the last of them
        top = int(key_level([self.prior.max() + max_batches + 1])[0]) + 2
        self.levels, self.level_count = _Fenwick(np.zeros(top, dtype=np.int64)), np.zeros(top, dtype=np.int64)
        self.ranks = _Fenwick(np.zeros(n, dtype=np.int64))  # accessed ids, by warm-up rank
        self.accessed = 0
        self.hits = np.zeros(self.sizes.size)
        self.accesses = self.t = 0
        self.recent: deque[tuple[np.ndarray, np.ndarray]] = deque(maxlen=int(held))  # (ids, hit), newest last

    def _level(self, ids: np.ndarray, later: int = 0) -> np.ndarray:
        """Key levels of accessed `ids` now (`later=1`: after this batch's use)."""
        if self.policy == "lru":
            return self.last[ids] + 1 if not later else np.full(ids.size, self.t + 1)
        if self.policy == "lfu":
            return self.count[ids] + later
        return key_level(self.prior[ids] + self.count[ids] + later)

    def _unused_warm_above(self, rank) -> np.ndarray:
        """Ids ranked above `rank` by the warm-up's order and never used so far."""
        rank = np.asarray(rank, dtype=np.int64)
        return rank - self.ranks.prefix(rank - 1)

    def _above(self, ids: np.ndarray, unused_warm: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For accessed `ids`: admitted rows ranking above each at every size `[ids, sizes]`,
        and the rows sharing its key level."""
        level = self._level(ids)
        above = (self.accessed - self.levels.prefix(level)).astype(np.float64)[:, None]
        if self.policy == "freq":  # unused warm-up rows whose count alone is higher
            higher = np.searchsorted(self.prior_desc, -(self.prior[ids] + self.count[ids]), side="left")
            above = above + np.minimum(self._unused_warm_above(higher)[:, None], unused_warm)
        return above, self.level_count[level].astype(np.float64)[:, None]

    def _hot_region(self, held: np.ndarray, unused_warm: np.ndarray) -> np.ndarray:
        """`K` per size: the slots left once the `held` rows outside the top `K` are
        counted (the smallest churn c with c >= #{positions >= C - c})."""
        if held.size == 0:
            return self.sizes.astype(np.float64)
        above, ties = self._above(held, unused_warm)
        gap = np.sort(self.sizes[None, :] - (above + ties / 2), axis=0)  # C - position, ascending
        enough = gap >= np.arange(1, gap.shape[0] + 1)[:, None]
        churn = np.where(enough.any(0), enough.argmax(0), gap.shape[0])
        return np.maximum(self.sizes - churn, 0).astype(np.float64)

    def _held(self, unused_warm: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(`K` per size, where all held batches' rows fit). Where they do not, the older
        batches' rows are not held any more when the newest batch's misses come in (the
        trainer admits what its prefetch could not once the batch in training is
        released), so only the newest batch is held there."""
        if not self.recent or self.admission:
            return self.sizes.astype(np.float64), np.ones(self.sizes.size, dtype=bool)
        union = np.unique(np.concatenate([ids for ids, _ in self.recent]))
        fits = self.sizes >= union.size
        hot = self._hot_region(union, unused_warm)
        if len(self.recent) > 1 and not fits.all():
            hot = np.where(fits, hot, self._hot_region(self.recent[-1][0], unused_warm))
        return hot, fits

    def add(self, ids: np.ndarray) -> None:
        """One batch: its distinct ids, sorted (`np.unique`)."""
        unused_warm = self._unused_warm_above(self.warm)[None, :]
        hot, fits = self._held(unused_warm)
        hot = hot[None, :]
        hit = np.zeros((ids.size, self.sizes.size))
        used = self.count[ids] > 0
        newest = (self.last[ids] == self.t - 1) & (not self.admission)
        older = used & ~newest & (self.last[ids] >= self.t - len(self.recent)) & (not self.admission)
        if newest.any():
            hit[newest] = self._forced(ids[newest], *self.recent[-1])
        idle = used & ~newest
        if idle.any():
            above, ties = self._above(ids[idle], unused_warm)
            hit[idle] = np.clip((hot - above) / ties, 0.0, 1.0)
        first = ~used
        if first.any():
            hit[first] = self._first_use(ids[first], hot)
        if not fits.all():  # where the held rows do not fit, every other row was evicted
            hit[idle | first] *= fits[None, :]
        if older.any():
            hit[older] = np.where(fits[None, :], self._forced_older(ids[older]),
                                  self._older_by_key(ids[older], unused_warm))
        self.hits += hit.sum(0)
        self.accesses += ids.size
        self._update(ids, used)
        self.recent.append((ids, hit))

    def _older_by_key(self, ids: np.ndarray, unused_warm: np.ndarray) -> np.ndarray:
        """Where the held rows do not fit: the previous batch's rows not used since keep
        the slots the newest batch leaves, highest keys first (the trainer evicts the
        others to admit the newest batch once the previous one is released)."""
        newest, older = self.recent[-1][0], self.recent[-2][0]
        older = older[self.last[older] == self.t - 2]
        above, ties = self._above(older, unused_warm)
        order = np.argsort(np.argsort(above + ties / 2, axis=0, kind="stable"), axis=0)
        resident = order < (self.sizes - np.minimum(self.sizes, newest.size))[None, :]
        return resident[np.searchsorted(older, ids)].astype(np.float64)

    def _forced_older(self, ids: np.ndarray) -> np.ndarray:
        """Hit chance of rows an older held batch used last (where all held rows fit)."""
        out = np.zeros((ids.size, self.sizes.size))
        for back in range(2, len(self.recent) + 1):
            mine = self.last[ids] == self.t - back
            if mine.any():
                out[mine] = self._forced(ids[mine], *self.recent[-back])
        return out

    def _forced(self, ids: np.ndarray, prev_ids: np.ndarray, prev_hit: np.ndarray) -> np.ndarray:
        """Hit chance of rows a held batch (`prev_ids`, its hit chances) used last:
        resident if they were hits then, or among its misses admitted in id order while
        slots lasted."""
        where = np.searchsorted(prev_ids, ids)
        miss = 1.0 - prev_hit
        room = self.sizes[None, :] - prev_hit.sum(0)[None, :]
        admitted = (np.cumsum(miss, axis=0) - miss / 2) <= room
        return prev_hit[where] + miss[where] * admitted[where]

    def _first_use(self, ids: np.ndarray, hot: np.ndarray) -> np.ndarray:
        """A row never used: a hit where it was warmed up and still ranks within `K`
        (accessed rows of equal or higher key and unused warm-up rows before it rank above)."""
        rank = self.rank[ids]
        if self.policy == "freq":
            above = self.accessed - self.levels.prefix(key_level(self.prior[ids]) - 1)
        else:
            above = np.full(ids.size, self.accessed)
        above = (above + self._unused_warm_above(rank))[:, None]
        return ((rank[:, None] < self.warm[None, :]) & (above < hot)).astype(np.float64)

    def _update(self, ids: np.ndarray, used: np.ndarray) -> None:
        if used.any():
            old = self._level(ids[used])
            self.levels.add(old, -1)
            np.subtract.at(self.level_count, old, 1)
        if (~used).any():
            self.ranks.add(self.rank[ids[~used]], 1)
            self.accessed += int(np.count_nonzero(~used))
        new = self._level(ids, later=1)
        self.levels.add(new, 1)
        np.add.at(self.level_count, new, 1)
        self.count[ids] += 1
        self.last[ids] = self.t
        self.t += 1


@dataclass
class Prediction:
    """Predicted hits per policy at each of `sizes` (cache rows) over `batches` batches
    needing `accesses` distinct rows in all, `max_unique` at most in one."""

    sizes: np.ndarray
    hits: dict[str, np.ndarray]
    accesses: int
    batches: int
    max_unique: int

    def hit_rate(self, policy: str) -> np.ndarray:
        return self.hits[policy] / max(self.accesses, 1)

    def misses_per_batch(self, policy: str) -> np.ndarray:
        return (self.accesses - self.hits[policy]) / max(self.batches, 1)


def replay(batches, freq: np.ndarray, sizes, warmup_ratio: float, max_batches: int,
           policies=POLICIES, held: int = 1, admission: bool = False) -> Prediction:
    """One pass over `batches` (arrays of ids, any shape) predicting every policy at every
    size at once (`held`: see `RankedCache`)."""
    models = [RankedCache(p, freq, sizes, warmup_ratio, max_batches, held, admission) for p in policies]
    count = most = 0
    for ids in batches:
        unique = np.unique(np.asarray(ids, dtype=np.int64))
        for model in models:
            model.add(unique)
        count, most = count + 1, max(most, unique.size)
    accesses = models[0].accesses if models else 0
    return Prediction(np.asarray(sizes, dtype=np.int64), {m.policy: m.hits for m in models}, accesses, count, most)


def expected_distinct(freq: np.ndarray, num_batches: int) -> float:
    """Distinct rows a batch needs on average if each occurrence falls into one of
    `num_batches` batches uniformly: `sum(1 - (1 - 1/B)^f)`."""
    freq = np.asarray(freq, dtype=np.float64)
    if num_batches <= 1:
        return float(np.count_nonzero(freq))
    return float(-np.expm1(freq * math.log1p(-1.0 / num_batches)).sum())


def surrogate_batches(freq: np.ndarray, num_batches: int, limit: int = MAX_SURROGATE_BATCHES, seed: int = 0):
    """The first `min(num_batches, limit)` batches of an epoch of `num_batches` whose
    occurrences (`freq` of each id) fell into batches independently and uniformly."""
    rng = np.random.default_rng(seed)
    counts = np.asarray(freq, dtype=np.int64)
    drawn = min(int(num_batches), int(limit))
    if drawn < num_batches:
        counts = rng.binomial(counts, drawn / num_batches)
    ids = np.repeat(np.arange(counts.size, dtype=np.int64), counts)
    batch = rng.integers(0, drawn, ids.size)
    ids = ids[np.argsort(batch, kind="stable")]
    return np.split(ids, np.cumsum(np.bincount(batch, minlength=drawn))[:-1])


# ---------------------------------------------------------------------------- data
def table_frequencies(data_dir) -> tuple[np.ndarray, dict]:
    """meta.json and the id counts of every feature, concatenated in meta.json's order:
    the one id space of the trainer's shared cache. A data set without counts is a
    DataFormatError naming the file."""
    from pathlib import Path

    from embcache.data.ctr_format import load_id_frequencies, read_meta
    from embcache.errors import format_error

    meta = read_meta(data_dir)
    if not meta["splits"].get("train", {}).get("rows"):
        raise format_error(Path(data_dir) / "meta.json", None, "has no training rows: nothing to predict from")
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
    prefetch: bool = True
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
                "eviction_bookkeeping": fp.eviction, "row_bytes": fp.row_bytes, "host_bytes": fp.host_bytes(),
                "batch_size": self.batch_size, "batches": pred.batches, "epoch_batches": self.epoch_batches,
                "traced": self.traced, "prefetch": self.prefetch, "admission": self.admission,
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
    epoch = max(1, -(-int(meta["splits"]["train"]["rows"]) // batch_size))
    if trace:
        count = min(trace, epoch)
        return trace_batches(data_dir, batch_size, count, seed), count, epoch
    batches = surrogate_batches(freq, epoch, seed=seed)
    return batches, len(batches), epoch


def plan_cache(data_dir, *, embedding_dim: int, optimizer: str, device_memory: int, batch_size: int,
               warmup_ratio: float = 0.7, eviction: str = "freq", trace: int | None = None, seed: int = 0,
               ratios=DEFAULT_RATIOS, prefetch: bool = True, admission: bool | None = None) -> CachePlan:
    """Read `data_dir` (meta.json's counts; with `trace`, its first batches too) and
    predict every policy at each ratio and on a grid of sizes, in one replay, for the
    trainer (`prefetch`: it admits the next batch while the current one trains;
    `admission`: None for the cache's default)."""
    freq, meta = table_frequencies(data_dir)
    footprint = Footprint(freq.size, embedding_dim, optimizer, eviction)
    ratios = sorted(float(r) for r in ratios)
    largest = footprint.largest_cache(device_memory)
    sizes = np.unique(np.concatenate([cache_sizes(ratios, freq.size), size_grid(freq.size),
                                      [largest] if largest else []])).astype(np.int64)
    batches, count, epoch = access_batches(data_dir, freq, meta, batch_size, trace, seed)
    admission = default_admission() if admission is None else bool(admission)
    prediction = replay(batches, freq, sizes, warmup_ratio, count, held=2 if prefetch else 1, admission=admission)
    return CachePlan(str(data_dir), footprint, batch_size, warmup_ratio, bool(trace), seed, device_memory,
                     largest, ratios, prediction, epoch, expected_distinct(freq, epoch), int(np.count_nonzero(freq)),
                     prefetch, admission)


# ---------------------------------------------------------------------------- the trainer's choice
DEFAULT_DEVICE_MEMORY = 16 * 2**30  # what a cache on a CPU device may use unless told


def default_admission() -> bool:
    """Whether a cache the trainer builds uses admission control: `CachedEmbeddingBag`'s
    default, read off its signature so the plan follows it."""
    import inspect

    from embcache.nn.cached_embedding_bag import CachedEmbeddingBag

    return bool(inspect.signature(CachedEmbeddingBag.__init__).parameters["admission"].default)


def default_device_memory(device) -> tuple[int, str]:
    """The memory `--cache-ratio auto` sizes the cache for when none is given, and where
    that figure comes from: a CUDA device's free memory now, else DEFAULT_DEVICE_MEMORY."""
    import torch

    if getattr(device, "type", str(device)) == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free), f"the free memory of {device}"
    return DEFAULT_DEVICE_MEMORY, "the default for a CPU device"


def smallest_within(sizes: np.ndarray, rates: np.ndarray, tolerance: float = 0.01) -> tuple[int, float, float]:
    """The smallest cache whose hit rate is within `tolerance` of the largest's (the last
    of `sizes`), read off the curve with linear interpolation between its points:
    (rows, its hit rate, the largest's hit rate)."""
    best = float(rates[-1])
    target = best - tolerance
    i = int(np.argmax(rates >= target))
    if i == 0 or rates[i] <= target:
        return int(sizes[i]), float(rates[i]), best
    lo, hi = int(sizes[i - 1]), int(sizes[i])
    share = (target - rates[i - 1]) / (rates[i] - rates[i - 1])
    rows = min(hi, max(lo + 1, math.ceil(lo + share * (hi - lo))))
    return rows, float(np.interp(rows, [lo, hi], [rates[i - 1], rates[i]])), best


def auto_cache_ratio(data_dir, *, embedding_dim: int, optimizer: str, eviction: str, batch_size: int,
                     warmup_ratio: float, device_memory: int, tolerance: float = 0.01, seed: int = 0,
                     prefetch: bool = True, admission: bool | None = None) -> tuple[float, str]:
    """The smallest cache ratio whose predicted hit rate (of `eviction`, from meta.json's
    counts) is within `tolerance` of the one of the largest cache that fits
    `device_memory`; returns it with one line saying why."""
    from embcache.errors import UserFacingError

    freq, meta = table_frequencies(data_dir)
    footprint = Footprint(freq.size, embedding_dim, optimizer, eviction)
    largest = footprint.largest_cache(device_memory)
    if largest < 1:
        raise UserFacingError(f"--device-memory {format_bytes(device_memory)} holds no cache: the {eviction} "
                              f"bookkeeping of {freq.size:,} rows alone needs "
                              f"{format_bytes(footprint.device_bytes(0))}")
    batches, count, _ = access_batches(data_dir, freq, meta, batch_size, None, seed)
    sizes = size_grid(freq.size, 96, largest)
    admission = default_admission() if admission is None else bool(admission)
    curve = replay(batches, freq, sizes, warmup_ratio, count, policies=(eviction,), held=2 if prefetch else 1,
                   admission=admission)
    rows, rate, best = smallest_within(sizes, curve.hit_rate(eviction), tolerance)
    ratio = rows / freq.size
    return ratio, (f"cache ratio auto: {ratio:.3%} ({rows:,} rows), predicted {eviction} hit rate {rate:.3f}: the "
                   f"smallest within {100 * tolerance:g} point of {best:.3f}, the largest cache that fits "
                   f"{format_bytes(device_memory)} ({largest / freq.size:.2%}; "
                   f"{format_bytes(footprint.device_bytes(largest))})")


def format_bytes(n: float) -> str:
    """`3.2 GiB`, `512.0 KiB`, `12 B`."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n:,.0f} B"
