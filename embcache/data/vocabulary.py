"""Categorical values -> contiguous ids, built from counts over the whole input.

Values are uint64 keys (see `delimited.string_keys`; 0 = missing). Id 0 is shared by missing
values and by values seen fewer than `min_count` times (the DLRM reference's frequency
threshold); kept values get ids 1.. in ascending key order. `max_ids` caps a feature's table:
kept ids are folded onto 1..max_ids-1 by modulo (a hashing cap, as the reference's
`max_ind_range`), so cardinality never exceeds it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


class ValueCounter:
    """Counts of every non-zero key seen, in memory proportional to the distinct keys (16 bytes
    each). Chunk results are merged lazily, when they outgrow the merged arrays, so the total
    cost stays O(n log n) however many chunks arrive."""

    def __init__(self):
        self.keys = np.zeros(0, dtype=np.uint64)
        self.counts = np.zeros(0, dtype=np.int64)
        self._pending: list[tuple[np.ndarray, np.ndarray]] = []
        self._pending_size = 0

    def update(self, keys: np.ndarray) -> None:
        k, c = np.unique(keys[keys != 0], return_counts=True)
        self._pending.append((k, c.astype(np.int64)))
        self._pending_size += len(k)
        if self._pending_size > max(len(self.keys), 1 << 20):
            self._merge()

    def _merge(self) -> None:
        if not self._pending:
            return
        keys = np.concatenate([self.keys] + [k for k, _ in self._pending])
        counts = np.concatenate([self.counts] + [c for _, c in self._pending])
        self.keys, inverse = np.unique(keys, return_inverse=True)
        self.counts = np.zeros(len(self.keys), dtype=np.int64)
        np.add.at(self.counts, inverse, counts)
        self._pending, self._pending_size = [], 0

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        """(ascending keys, their counts)."""
        self._merge()
        return self.keys, self.counts


@dataclass(frozen=True)
class Vocabulary:
    """Maps keys to ids; see the module docstring for the id rules."""

    keys: np.ndarray          # ascending uint64 keys that get their own id (before the cap)
    max_ids: int | None = None

    @classmethod
    def build(cls, keys: np.ndarray, counts: np.ndarray, min_count: int = 1,
              max_ids: int | None = None) -> "Vocabulary":
        if max_ids is not None and max_ids < 2:
            raise ValueError(f"max_ids must be >= 2 (id 0 is missing/rare), got {max_ids}")
        return cls(keys[counts >= max(min_count, 1)], max_ids)

    @property
    def cardinality(self) -> int:
        n = 1 + len(self.keys)
        return n if self.max_ids is None else min(n, self.max_ids)

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """int64 ids of `keys`; missing (0), rare or unknown keys -> 0."""
        if len(self.keys) == 0:
            return np.zeros(len(keys), dtype=np.int64)
        pos = np.minimum(np.searchsorted(self.keys, keys), len(self.keys) - 1)
        ids = np.where(self.keys[pos] == keys, pos + 1, 0).astype(np.int64)
        if self.max_ids is not None and 1 + len(self.keys) > self.max_ids:
            ids = np.where(ids > 0, 1 + (ids - 1) % (self.max_ids - 1), 0)
        return ids
