"""Predicted hit rates of the embedding cache's eviction policies at many cache sizes in one
pass over a trace: what `embcache cache plan` and `dlrm train --cache-ratio auto` stand on.
Hits and misses count distinct rows per batch, as `RowCache.stats` does. One replay serves
every size (rather than one simulated cache per size), so a plan costs one pass however many
sizes it shows.

**The model.** Every policy keeps the rows with the highest keys (`freq`: the id's count
in the data + its online count; `lfu`: the online count; `lru`: the batch of its last
use), except that the rows of the held batches are all resident: the last batch's (its
misses were admitted and only other rows are evicted), and under the trainer the D
before it too (at prefetch depth D it admits the next D batches while the current one
trains, and evicts none of their rows).
Keys never fall while a row waits, so an idle row stays resident as long as fewer than
`K` admitted rows rank above it, `K = C - churn` where the churn is the held rows
outside that top `K` (a fixed point, solved per size). For each row a batch needs, the
number of rows ranking above it is a prefix sum in a Fenwick tree over key levels
(independent of the cache size: Mattson's stack distance, at batch granularity; for
`lru` the levels are batches); rows of equal key share the boundary (`(K - d) / e` of
them resident). "Admitted" depends on the size in one way: the warm-up loads the
`floor(warmup_ratio * C)` ids hottest by count, with keys that rank below any accessed
row of equal key (they are the least recent), so the warm-up rows not yet used that rank
above a row are counted by a second Fenwick tree, over warm-up ranks, at each size's
warm-up boundary. A row used for the first time hits only if it was warmed up and still
ranks within `K`. When a batch has more distinct rows than the cache (overflow), the
cache keeps that batch's hits and admits its misses in id order (the order
`torch.unique` gives them) until it is full; under the trainer, where the held batches'
rows do not fit, every other row is evicted to admit the newest batch and the older held
batches keep what is left, highest keys first. There the model is a lower bound: a real
cache admits a prefetched batch's rows once, at its prefetch, and serves what did not fit
beside it rather than evicting for it again at its forward, so it keeps more of the older
rows (measured 3.5 points under at depth 1, 4-6 at depth 2-4, for a cache smaller than one
batch's rows). With admission control (`freq` and `lfu`;
the cache's default) a missed row gets in only if it is hotter than the row it would
evict, so no row is held below the top: the cache is the top `C` by key, `K = C`.
Measured against real `RowCache` runs: see docs/planning.md.

**From the counts alone** the order of the accesses is unknown. The surrogate trace
assumes each of an id's `f` occurrences falls into one of the epoch's `B` batches
independently and uniformly (seeded): then a batch holds the id with probability
`1 - (1 - 1/B)^f`, so a batch needs `sum(1 - (1 - 1/B)^f)` distinct rows on average, which
the report states. Past `MAX_SURROGATE_BATCHES` batches only the first ones are drawn
(each occurrence kept with probability `S / B`), which weighs the warm-up's first misses
more than a whole epoch would.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from embcache.cache.choices import POLICIES

MAX_SURROGATE_BATCHES = 256
# key levels of `freq` (count + online count): exact below this, then PER_OCTAVE per doubling
EXACT_LEVELS = 4096
PER_OCTAVE = 64


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
            batch itself, looked up one after another), 1 + D (the trainer at prefetch
            depth D, which admits the next D batches while the current one trains).
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
        """Where the held rows do not fit: the older held batches' rows not used since
        keep the slots the newest batch leaves, highest keys first (the trainer evicts the
        others to admit the newest batch once the older ones are released)."""
        newest = self.recent[-1][0]
        older = np.unique(np.concatenate([b for b, _ in list(self.recent)[:-1]]))
        older = older[(self.last[older] < self.t - 1) & (self.last[older] >= self.t - len(self.recent))]
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
    size at once (`held`: see `RankedCache`).

    Example (an LRU cache of 1 row keeps id 0, the lowest, of each batch; one of 3 rows
    holds them all):
        >>> import numpy as np
        >>> batches = [np.array([0, 1]), np.array([0, 2]), np.array([0, 1])]
        >>> p = replay(batches, np.array([3.0, 2.0, 1.0]), [1, 3], 0.0, 3, policies=("lru",))
        >>> p.hit_rate("lru").round(3).tolist()
        [0.333, 0.5]
    """
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
