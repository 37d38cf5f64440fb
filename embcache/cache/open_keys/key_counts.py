"""An open table's keys' counts in the training data (`KeyCounts`): sorted keys and their
counts, looked up by binary search for the keys given rows, as the `freq` prior (see
`open_table`)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class KeyCounts:
    """One table's counted keys (int64, ascending, distinct) and their counts (float64, as
    the policy keeps a prior): the `freq` prior of the rows its keys take."""

    keys: np.ndarray
    counts: np.ndarray

    @classmethod
    def of(cls, pair, table: str) -> "KeyCounts":
        """`(keys, counts)` tensors or arrays checked (ValueError naming `table`)."""
        if isinstance(pair, KeyCounts):
            return pair
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise ValueError(f"key_freq of {table} must be (keys, counts), got {type(pair).__name__}")
        keys, counts = (np.asarray(a.cpu() if torch.is_tensor(a) else a) for a in pair)
        if keys.ndim != 1 or keys.shape != counts.shape or keys.dtype.kind not in "iu":
            raise ValueError(f"key_freq of {table} must be 1-D integer keys and as many counts, got "
                             f"{keys.dtype} {keys.shape} and {counts.shape}")
        keys, counts = keys.astype(np.int64), counts.astype(np.float64)
        if keys.size > 1 and not bool((keys[1:] > keys[:-1]).all()):
            raise ValueError(f"key_freq of {table}: keys must be ascending and distinct")
        if not bool(np.isfinite(counts).all()) or bool((counts < 0).any()):
            raise ValueError(f"key_freq of {table}: counts must be finite and non-negative")
        return cls(keys, counts)

    def lookup(self, keys: np.ndarray) -> np.ndarray:
        """Each key's count, 0 for a key not counted (a binary search a key)."""
        if self.keys.size == 0:
            return np.zeros(keys.size, np.float64)
        at = np.minimum(np.searchsorted(self.keys, keys), self.keys.size - 1)
        return np.where(self.keys[at] == keys, self.counts[at], 0.0)


def _key_counts(key_freq, tables: int) -> list[KeyCounts | None] | None:
    """`key_freq` one entry a table (None: no counts for any): a `(keys, counts)` pair for
    a table of its own, or a list of pairs (or None) one a table sharing the index."""
    if key_freq is None:
        return None
    one = isinstance(key_freq, KeyCounts) or (isinstance(key_freq, tuple) and len(key_freq) == 2 and all(
        torch.is_tensor(a) or isinstance(a, np.ndarray) for a in key_freq))
    per_table = [key_freq] if one else list(key_freq)
    if len(per_table) != tables:
        raise ValueError(f"key_freq: one (keys, counts) or None a table, {tables} tables, got {len(per_table)}")
    out = [None if kf is None else KeyCounts.of(kf, f"table {t}") for t, kf in enumerate(per_table)]
    return None if all(kc is None for kc in out) else out
