"""Raw keys turned into ids of closed tables: the two ways a fixed-size table meets a
stream of new values, which an open table is measured against (`embcache bench vocab`).

- `HashedKeys`: feature f's key goes to row `splitmix64(key) % rows[f]`: every value has a
  row, and values that collide share it.
- `FirstDayVocabulary`: the keys of one split (the first training day) get ids
  `1..len(keys)` in key order; any other key (a value that came later) is id 0, one row
  shared by everything new.

Both work on a batch's ids as the loader holds them: one int64 array, feature after
feature (`counts[f]` ids each), so one call maps a whole batch without a Python loop over
ids.
"""
from __future__ import annotations

import hashlib

import numpy as np

from embcache.data.delimited import splitmix64


class KeyMap:
    """Maps a batch's raw keys (feature by feature) to closed tables' ids."""

    def rows(self) -> list[int]:
        """Each feature's table size."""
        raise NotImplementedError

    def map_feature(self, f: int, keys: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def record(self) -> dict:
        """What identifies the map (its rule and what it was built from), small enough for a
        checkpoint: an export rebuilds the map from the data and compares, so that it
        serves keys exactly as training mapped them."""
        raise NotImplementedError

    def __call__(self, ids: np.ndarray, counts: list[int]) -> np.ndarray:
        out = np.empty_like(ids)
        at = 0
        for f, n in enumerate(counts):
            out[at: at + n] = self.map_feature(f, ids[at: at + n])
            at += n
        return out


class HashedKeys(KeyMap):
    """`rows[f]` hash buckets for feature f.

    Example:
        >>> m = HashedKeys([10, 3])
        >>> ids = m(np.array([5, 5, -7, 12], dtype=np.int64), [2, 2])
        >>> bool(ids[0] == ids[1]), bool((ids[:2] < 10).all() and (ids[2:] < 3).all())
        (True, True)
    """

    def __init__(self, rows: list[int]):
        if any(int(r) < 1 for r in rows):
            raise ValueError(f"every hashed table needs at least one row, got {rows}")
        self._rows = [int(r) for r in rows]

    def rows(self) -> list[int]:
        return list(self._rows)

    def map_feature(self, f: int, keys: np.ndarray) -> np.ndarray:
        return (splitmix64(keys.view(np.uint64)) % np.uint64(self._rows[f])).astype(np.int64)

    def record(self) -> dict:
        return {"rule": "hash", "rows": self.rows()}


class FirstDayVocabulary(KeyMap):
    """Ids from one split's keys per feature (distinct; given in any order, numbered in
    int64 order); unseen keys -> 0.

    Example:
        >>> m = FirstDayVocabulary([np.array([-3, 8, 20])])
        >>> m(np.array([8, 9, -3], dtype=np.int64), [3]).tolist(), m.rows()
        ([2, 0, 1], [4])
    """

    def __init__(self, keys: list[np.ndarray]):
        self._keys = [np.unique(np.asarray(k, dtype=np.int64)) for k in keys]

    def rows(self) -> list[int]:
        return [k.size + 1 for k in self._keys]

    def keys(self, f: int) -> np.ndarray:
        """Feature f's keys owning ids 1.. in id order (ascending as int64)."""
        return self._keys[f]

    def record(self) -> dict:
        """The rule, the table sizes and a SHA-256 of the keys (all features, in id order)."""
        digest = hashlib.sha256()
        for keys in self._keys:
            digest.update(np.int64(keys.size).tobytes())
            digest.update(np.ascontiguousarray(keys).tobytes())
        return {"rule": "first-day", "rows": self.rows(), "keys_sha256": digest.hexdigest()}

    def map_feature(self, f: int, keys: np.ndarray) -> np.ndarray:
        vocab = self._keys[f]
        if vocab.size == 0:
            return np.zeros_like(keys)
        at = np.minimum(np.searchsorted(vocab, keys), vocab.size - 1)
        return np.where(vocab[at] == keys, at + 1, 0).astype(np.int64)
