"""Per-feature counts over the training split: what the cache warms up with, what its `freq`
eviction policy ranks by and what `cache plan` predicts from. Accumulated chunk by chunk while a
converter writes, so they never cost a second pass over the data.

Two kinds of file, both `.npz`:

* id counts (`IdFrequency`, vocabulary ids): one int64 count per id, an array per feature
  named after it, of the feature's cardinality.
* key counts (`KeyCounter`, raw 64-bit keys, or any ids counted sparsely): per feature two
  arrays, `<name>.keys` (int64, ascending and distinct) and `<name>.counts` (int64, > 0).
  Exact up to `max_keys` distinct keys per feature; past that the counter keeps the most
  frequent keys it holds and forgets the others (see `KeyCounter`), and says so.
"""
from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

from embcache.data.defaults import MAX_COUNTED_KEYS
from embcache.data.delimited import splitmix64
from embcache.integrity import open_verified, save_npz

DEFAULT_MAX_COUNTED_KEYS = MAX_COUNTED_KEYS  # per feature: 64 MiB of (key, count) pairs
_MERGE_MIN = 1 << 20


def merge_counts(keys: np.ndarray, counts: np.ndarray, pending: list) -> tuple[np.ndarray, np.ndarray]:
    """(ascending distinct keys, their int64 counts) of `keys`/`counts` and the `pending`
    (keys, counts) batches together: a counter's periodic merge."""
    keys = np.concatenate([keys] + [k for k, _ in pending])
    counts = np.concatenate([counts] + [c for _, c in pending])
    merged, inverse = np.unique(keys, return_inverse=True)
    totals = np.zeros(len(merged), dtype=np.int64)
    np.add.at(totals, inverse, counts)
    return merged, totals


class IdFrequency:
    """Running int64 counts of every id of every feature.

    Args:
        cardinalities: `{feature name: number of ids}`; counts have exactly that length.

    Example:
        >>> f = IdFrequency({"sparse_0": 4})
        >>> f.update("sparse_0", np.array([1, 1, 3]))
        >>> f.counts["sparse_0"].tolist()
        [0, 2, 0, 1]
    """

    def __init__(self, cardinalities: dict[str, int]):
        self.counts = {name: np.zeros(int(c), dtype=np.int64) for name, c in cardinalities.items()}

    def update(self, name: str, ids: np.ndarray) -> None:
        """Add one chunk of ids (already in `[0, cardinality)`) of feature `name`."""
        counts = self.counts[name]
        if len(ids):
            counts += np.bincount(ids, minlength=len(counts))[: len(counts)]

    def save(self, path: str | os.PathLike) -> None:
        """Write an `.npz` keyed by feature name (written to a temporary name, then renamed)."""
        _save_npz(path, self.counts)


def load_frequency_file(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """`{feature name: int64 counts}` from a file written by `IdFrequency.save`."""
    with open_verified(path) as f, np.load(f, allow_pickle=False) as data:
        return {name: data[name].astype(np.int64, copy=False) for name in data.files}


class DistinctSketch:
    """A HyperLogLog sketch of the number of distinct int64 keys (2**14 one-byte registers,
    about 1 % standard error): what `KeyCounter` reports once its cap made it forget keys."""

    BITS = 14

    def __init__(self):
        self.registers = np.zeros(1 << self.BITS, dtype=np.uint8)

    def update(self, keys: np.ndarray) -> None:
        if not len(keys):
            return
        h = splitmix64(np.asarray(keys, dtype=np.int64).view(np.uint64))
        index = (h >> np.uint64(64 - self.BITS)).astype(np.intp)
        rest = (h << np.uint64(self.BITS)) | np.uint64(1 << (self.BITS - 1))  # a guard bit: never 0
        high, low = (rest >> np.uint64(32)).astype(np.float64), (rest & np.uint64(0xFFFFFFFF)).astype(np.float64)
        # position of the highest set bit, exactly: frexp of a 32-bit half (floats hold it exactly)
        top = np.where(high > 0, np.frexp(high)[1] + 31, np.frexp(low)[1] - 1)
        np.maximum.at(self.registers, index, (64 - top).astype(np.uint8))  # leading zeros + 1

    def merge(self, other: "DistinctSketch") -> None:
        np.maximum(self.registers, other.registers, out=self.registers)

    def estimate(self) -> int:
        m = float(len(self.registers))
        raw = 0.7213 / (1 + 1.079 / m) * m * m / float(np.sum(np.ldexp(1.0, -self.registers.astype(np.int64))))
        zeros = int(np.count_nonzero(self.registers == 0))
        if raw <= 2.5 * m and zeros:
            return int(round(m * math.log(m / zeros)))  # few keys: linear counting
        return int(round(raw))


class KeyCounter:
    """Counts of int64 keys (raw keys, any int64, 0 included; or ids counted sparsely).

    Exact while at most `max_keys` distinct keys were seen (None: no cap, memory grows with
    the distinct keys, 16 bytes each). Past the cap, every merge keeps the `max_keys` keys with
    the highest counts (ties: the smaller key) and forgets the others; a forgotten key seen
    again counts from 0. The kept counts are then lower bounds, `exact` is False and
    `forgotten` says how many occurrences were let go; the hot keys, the ones a cache plan
    needs, are kept. Memory: about `max_keys` pairs held plus as many waiting to be merged.
    `distinct()` is exact while `exact`, a HyperLogLog estimate after.

    Example:
        >>> c = KeyCounter(max_keys=2)
        >>> c.update(np.array([-5, 7, 7, 2**62, 7, -5]))
        >>> keys, counts = c.result()
        >>> keys.tolist(), counts.tolist(), c.exact, c.forgotten
        ([-5, 7], [2, 3], False, 1)
    """

    def __init__(self, max_keys: int | None = DEFAULT_MAX_COUNTED_KEYS):
        if max_keys is not None and (isinstance(max_keys, bool) or int(max_keys) != max_keys or max_keys < 1):
            raise ValueError(f"max_keys must be a whole number >= 1 or None, got {max_keys!r}")
        self.max_keys = None if max_keys is None else int(max_keys)
        self._merge_min = _MERGE_MIN if self.max_keys is None else min(_MERGE_MIN, self.max_keys)
        self.keys = np.zeros(0, dtype=np.int64)
        self.counts = np.zeros(0, dtype=np.int64)
        self._pending: list[tuple[np.ndarray, np.ndarray]] = []
        self._pending_size = 0
        self.occurrences = 0  # keys counted in all
        self.forgotten = 0    # occurrences of keys the cap let go
        self.exact = True
        self.sketch = DistinctSketch()

    def update(self, keys: np.ndarray) -> None:
        """Count one chunk of keys."""
        keys = np.asarray(keys, dtype=np.int64).reshape(-1)
        if not len(keys):
            return
        self.occurrences += len(keys)
        self.sketch.update(keys)
        unique, counts = np.unique(keys, return_counts=True)
        self._add(unique, counts.astype(np.int64))

    def absorb(self, other: "KeyCounter") -> None:
        """Add everything `other` counted (its result: a forgotten key of it stays forgotten)."""
        keys, counts = other.result()
        self.occurrences += other.occurrences
        self.forgotten += other.forgotten
        self.exact &= other.exact
        self.sketch.merge(other.sketch)
        self._add(keys, counts)

    def _add(self, keys: np.ndarray, counts: np.ndarray) -> None:
        self._pending.append((keys, counts))
        self._pending_size += len(keys)
        if self._pending_size > max(len(self.keys), self._merge_min):
            self._merge()

    def _merge(self) -> None:
        if not self._pending:
            return
        self.keys, self.counts = merge_counts(self.keys, self.counts, self._pending)
        self._pending, self._pending_size = [], 0
        if self.max_keys is not None and len(self.keys) > self.max_keys:
            keep = np.sort(np.lexsort((self.keys, -self.counts))[: self.max_keys])
            self.forgotten += int(self.counts.sum() - self.counts[keep].sum())
            self.keys, self.counts = self.keys[keep], self.counts[keep]
            self.exact = False

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        """(ascending distinct keys, their int64 counts)."""
        self._merge()
        return self.keys, self.counts

    def distinct(self) -> int:
        """Distinct keys seen: exact while `exact`, else the sketch's estimate (never fewer
        than the keys held)."""
        keys, _ = self.result()
        return len(keys) if self.exact else max(len(keys), self.sketch.estimate())

    def summary(self) -> dict:
        """What meta.json records of a feature's counts."""
        keys, _ = self.result()
        return {"distinct": self.distinct(), "distinct_exact": self.exact, "counted_keys": len(keys),
                "occurrences": self.occurrences, "forgotten_occurrences": self.forgotten}


def save_key_counts(path: str | os.PathLike, counts: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
    """Write `{feature name: (keys, counts)}` as an `.npz` of `<name>.keys` and `<name>.counts`."""
    arrays = {}
    for name, (keys, n) in counts.items():
        arrays[f"{name}.keys"] = np.asarray(keys, dtype=np.int64)
        arrays[f"{name}.counts"] = np.asarray(n, dtype=np.int64)
    _save_npz(path, arrays)


def load_key_counts(path: str | os.PathLike) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """`{feature name: (int64 ascending keys, int64 counts)}` from `save_key_counts`'s file;
    ValueError when the arrays do not pair up."""
    out = {}
    with open_verified(path) as f, np.load(f, allow_pickle=False) as data:
        names = [f[: -len(".keys")] for f in data.files if f.endswith(".keys")]
        for name in names:
            if f"{name}.counts" not in data.files:
                raise ValueError(f"{name} has keys but no counts")
            keys, counts = data[f"{name}.keys"].astype(np.int64, copy=False), data[f"{name}.counts"].astype(np.int64, copy=False)
            if keys.ndim != 1 or keys.shape != counts.shape:
                raise ValueError(f"{name}: {keys.shape} keys but {counts.shape} counts")
            if len(keys) > 1 and not np.all(keys[1:] > keys[:-1]):
                raise ValueError(f"{name}: keys are not ascending and distinct")
            out[name] = (keys, counts)
    return out


def _save_npz(path: str | os.PathLike, arrays: dict[str, np.ndarray]) -> None:
    save_npz(path, arrays)  # sealed with its CRC-32
