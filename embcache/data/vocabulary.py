"""Categorical values -> contiguous ids, built from counts over the whole input.

Values are uint64 keys (see `delimited.string_keys`; 0 = missing). Id 0 is shared by missing
values and by values seen fewer than `min_count` times (the DLRM reference's frequency
threshold); kept values get ids 1.. in ascending key order.

`max_ids` caps a feature's table (a hashing cap, as the reference's `max_ind_range`). A feature
with at most `max_ids - 1` distinct values is not touched by it. A feature with more is hashed:
every value goes to the bucket `1 + splitmix64(key) % (max_ids - 1)`, the threshold applies to
bucket counts, and the kept buckets get ids 1.. in ascending bucket order, so the cardinality
never exceeds `max_ids`. `ValueCounter(max_ids)` switches a feature to counting buckets as soon
as it has seen more distinct values than that, so counting memory is bounded by the cap rather
than by the number of distinct values.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from embcache.errors import is_whole
from embcache.data.delimited import splitmix64
from embcache.data.frequency import merge_counts

_MERGE_MIN = 1 << 20


def check_max_ids(max_ids: int | None) -> None:
    if max_ids is not None and not is_whole(max_ids, 2):
        raise ValueError(f"max_ids must be >= 2 (id 0 is missing/rare), got {max_ids}")


def hash_bucket(keys: np.ndarray, max_ids: int) -> np.ndarray:
    """uint64 bucket in `1..max_ids-1` of every non-zero key; key 0 (missing) stays 0."""
    keys = np.asarray(keys, dtype=np.uint64)
    buckets = splitmix64(keys) % np.uint64(max_ids - 1) + np.uint64(1)
    return np.where(keys == 0, np.uint64(0), buckets)


def _bucket_counts(keys: np.ndarray, counts: np.ndarray, max_ids: int) -> np.ndarray:
    """int64 counts of the `max_ids` hash buckets, from the counts of (distinct) keys."""
    buckets = np.zeros(max_ids, dtype=np.int64)
    np.add.at(buckets, hash_bucket(keys, max_ids).astype(np.int64), np.asarray(counts, dtype=np.int64))
    return buckets


class ValueCounter:
    """Counts of every non-zero key seen. Exact, in memory proportional to the distinct keys
    (16 bytes each); with `max_ids`, once more than `max_ids - 1` distinct keys were seen the
    counts move to a dense array of `max_ids` bucket counts (8 bytes each) and stay there.
    Chunk results are merged lazily, when they outgrow the merged arrays, so the total cost
    stays O(n log n) however many chunks arrive."""

    def __init__(self, max_ids: int | None = None):
        check_max_ids(max_ids)
        self.max_ids = max_ids
        # unmerged chunk results wait until they outgrow the merged arrays (amortized merging),
        # but never beyond the cap, so a feature past the cap is noticed in time
        self._merge_min = _MERGE_MIN if max_ids is None else min(_MERGE_MIN, max_ids)
        self.keys = np.zeros(0, dtype=np.uint64)
        self.counts = np.zeros(0, dtype=np.int64)
        self.bucket_counts: np.ndarray | None = None  # set once hashed
        self._pending: list[tuple[np.ndarray, np.ndarray]] = []
        self._pending_size = 0

    @property
    def hashed(self) -> bool:
        return self.bucket_counts is not None

    def update(self, keys: np.ndarray) -> None:
        keys = keys[keys != 0]
        if self.hashed:
            b, c = np.unique(hash_bucket(keys, self.max_ids), return_counts=True)
            self.bucket_counts[b.astype(np.int64)] += c
            return
        k, c = np.unique(keys, return_counts=True)
        self._pending.append((k, c.astype(np.int64)))
        self._pending_size += len(k)
        if self._pending_size > max(len(self.keys), self._merge_min):
            self._merge()

    def _merge(self) -> None:
        if self._pending:
            self.keys, self.counts = merge_counts(self.keys, self.counts, self._pending)
            self._pending, self._pending_size = [], 0
        if self.max_ids is not None and len(self.keys) > self.max_ids - 1:
            self.bucket_counts = _bucket_counts(self.keys, self.counts, self.max_ids)
            self.keys, self.counts = np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.int64)

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        """(ascending keys, their counts); when `hashed` (check it after this call) the keys
        are the occupied buckets."""
        if not self.hashed:
            self._merge()
        if self.hashed:
            buckets = np.flatnonzero(self.bucket_counts)
            return buckets.astype(np.uint64), self.bucket_counts[buckets]
        return self.keys, self.counts


@dataclass(frozen=True)
class Vocabulary:
    """Maps keys to ids; see the module docstring for the id rules.

    Example:
        >>> v = Vocabulary.build(np.array([5, 9], np.uint64), np.array([3, 1]), min_count=2)
        >>> v.lookup(np.array([9, 5, 0, 7], np.uint64)).tolist()
        [0, 1, 0, 0]
        >>> Vocabulary(np.array([0, 5], np.uint64)).lookup(np.array([0, 5, 6]), zero_is_missing=False).tolist()
        [1, 2, 0]
    """

    keys: np.ndarray          # ascending uint64 keys (buckets when hashed) owning ids 1..
    max_ids: int | None = None
    hashed: bool = False      # keys are hash buckets: lookup hashes a value first

    @classmethod
    def build(cls, keys: np.ndarray, counts: np.ndarray, min_count: int = 1,
              max_ids: int | None = None, hashed: bool = False) -> "Vocabulary":
        """From (ascending keys, counts). `hashed`: they are already bucket counts (from a
        hashed `ValueCounter`). Exact counts of more than `max_ids - 1` keys are hashed here."""
        check_max_ids(max_ids)
        if hashed and max_ids is None:
            raise ValueError("hashed counts need the max_ids they were hashed with")
        if not hashed and max_ids is not None and len(keys) > max_ids - 1:
            buckets = _bucket_counts(keys, counts, max_ids)
            keys = np.flatnonzero(buckets).astype(np.uint64)
            counts, hashed = buckets[keys.astype(np.int64)], True
        return cls(keys[counts >= max(min_count, 1)], max_ids, hashed)

    @property
    def cardinality(self) -> int:
        return 1 + len(self.keys)

    def lookup(self, keys: np.ndarray, zero_is_missing: bool = True) -> np.ndarray:
        """int64 ids of `keys`; missing (0), rare or unknown keys -> 0. `zero_is_missing`
        False: key 0 is a key like any other (an open table's keys), found where listed."""
        keys = np.asarray(keys, dtype=np.uint64)
        if len(self.keys) == 0:
            return np.zeros(len(keys), dtype=np.int64)
        if self.hashed:
            keys = hash_bucket(keys, self.max_ids)
        pos = np.minimum(np.searchsorted(self.keys, keys), len(self.keys) - 1)
        found = self.keys[pos] == keys
        return np.where(found & (keys != 0) if zero_is_missing else found, pos + 1, 0).astype(np.int64)
