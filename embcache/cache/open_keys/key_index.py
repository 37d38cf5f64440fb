"""The host index of an open table: raw 64-bit key -> row of the host table (CPU, numba).

An open table has no vocabulary: a key (`embcache.keys`) gets a row the first time it is
seen, and under a bound on rows the caller retires its coldest keys, whose rows are reused.
The index is three arrays, at most 24 bytes of host memory per live key (`nbytes()`):

- `slots`, int32 [2**b]: an open-addressing hash table with linear probing; a slot holds a
  row (-1: empty). The table doubles when more than 0.7 of it is used, so it is 0.35 to
  0.7 full: 5.7 to 11.4 bytes a key.
- `row_key`, int64 [>= num_rows]: row -> key, the host table's own bookkeeping, which a
  probe compares against; it grows by a quarter when full (amortised O(1) a row, at most
  10 bytes a row).
- `free`, int32: the retired rows, a stack (the last row retired is the first reused); it
  holds what was retired and not yet reused, and gives memory back when mostly empty.

So at most 11.4 + 10 = 21.4 bytes a key while few rows are free (measured: 16.7 at 1 M
keys, 20.9 at worst from 10 k to 1 M). Retiring many rows at once raises the figure until
they are reused: `row_key` spans every row ever allocated, as the host table does.

Why rows, not keys, in the slots: the key is stored once, in `row_key`, which the host table
needs anyway; a slot of (key, row) would be 12 to 16 bytes, and at a load of 0.35 to 0.7
that alone is 17 to 46 bytes a key. The price is one more memory read per probe step
(`row_key[row]`), which the lookups hide by prefetching a few dozen keys ahead.

Why backward-shift deletion: retiring is routine (a bounded table retires keys all the
time), and tombstones would fill the table with dead slots that lengthen every probe until a
rebuild. Shifting the rest of the probe chain back into the hole leaves the table as if the
key had never been inserted, so probe lengths depend on the live keys alone.

The hash is splitmix64's finaliser of the key plus a per-index random salt: consecutive keys
spread over the table, and keys chosen to collide in one process do not collide in another.
The salt decides only where keys sit in `slots`, never which row a key gets: rows are handed
out in order of first occurrence, so results (and `state_dict`) do not depend on it.

Not thread-safe: one writer, and no reader while it writes.
"""
from __future__ import annotations

import secrets

import numba
import numpy as np

from embcache.errors import CheckpointError, check_whole
from embcache.cache.open_keys.key_index_kernels import (  # the numba kernels and their constants
    _MAX_LOAD,
    _MAX_ROWS,
    _MIN_FREE_CAP,
    _MIN_SLOTS,
    _PARALLEL_CHUNK,
    _ROW_GROWTH,
    _DONE,
    _GROW_SLOTS,
    _ROW_FREE,
    _ROW_OK,
    _ROW_OUT_OF_RANGE,
    _ROW_TWICE,
    _build,
    _check_rows,
    _insert,
    _live_mask,
    _lookup,
    _lookup_chunks,
    _rehash,
    _retire,
    _unseen,
)

class TableFull(ValueError):
    """An insert needs more new rows than the bound (`max_rows`) leaves free; raised before
    anything changes."""


# ------------------------------------------------------------------------ the index
def _slot_bits(keys: int) -> int:
    """log2 of the smallest hash table (>= _MIN_SLOTS slots) holding `keys` at load <= 0.7."""
    bits = _MIN_SLOTS.bit_length() - 1
    while keys > _MAX_LOAD * (1 << bits):
        bits += 1
    return bits


def _as_keys(keys, name: str = "keys") -> np.ndarray:
    """A 1-D C-contiguous int64 array (uint64 keys keep their bits)."""
    a = np.asarray(keys)
    if a.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {a.shape}")
    if a.dtype == np.uint64:
        a = a.view(np.int64)
    elif a.dtype.kind not in "iu" and not (a.dtype.kind == "f" and a.size == 0):
        raise TypeError(f"{name} must be integers, got {a.dtype}")
    return np.ascontiguousarray(a, dtype=np.int64)


class KeyIndex:
    """Raw 64-bit key -> row of a host table, rows handed out on first sight.

    `max_rows` bounds the rows ever allocated (None: up to 2**31 - 1, the int32 limit);
    `capacity` is the number of keys held before the first resize.

    Example:
        >>> index = KeyIndex(max_rows=3)
        >>> rows, new_rows, new_keys = index.insert(np.array([7, -1, 7, 0]))
        >>> rows.tolist(), new_rows.tolist(), new_keys.tolist()
        ([0, 1, 0, 2], [0, 1, 2], [7, -1, 0])
        >>> index.retire(np.array([1, 0]))
        >>> index.insert(np.array([5, 9]))[0].tolist()  # the last row retired comes first
        [0, 1]
        >>> index.lookup(np.array([7, 5, 0])).tolist()
        [-1, 0, 2]
    """

    def __init__(self, max_rows: int | None = None, capacity: int = 1024):
        if max_rows is not None:
            check_whole("max_rows", max_rows, 0, _MAX_ROWS + 1)
        check_whole("capacity", capacity, 1)
        self._max_rows = None if max_rows is None else int(max_rows)
        capacity = min(int(capacity), self._row_limit)
        self._salt = np.uint64(secrets.randbits(64))
        self._set_slots(np.full(1 << _slot_bits(capacity), -1, dtype=np.int32))
        self._row_key = np.zeros(capacity, dtype=np.int64)
        self._free = np.zeros(0, dtype=np.int32)
        self._meta = np.zeros(4, dtype=np.int64)  # num_rows, live, free count, scratch

    # ----------------------------------------------------------------- sizes
    @property
    def max_rows(self) -> int | None:
        return self._max_rows

    @property
    def num_rows(self) -> int:
        """Rows ever allocated: the host table's length."""
        return int(self._meta[0])

    @property
    def live(self) -> int:
        """Keys held."""
        return int(self._meta[1])

    @property
    def free_rows(self) -> int:
        """Retired rows not yet reused."""
        return int(self._meta[2])

    def __len__(self) -> int:
        return self.live

    def nbytes(self) -> int:
        """Host memory of all the index's arrays."""
        return self._slots.nbytes + self._row_key.nbytes + self._free.nbytes + self._meta.nbytes

    @property
    def _row_limit(self) -> int:
        return _MAX_ROWS if self._max_rows is None else self._max_rows

    def _set_slots(self, slots: np.ndarray) -> None:
        self._slots = slots
        self._shift = np.uint64(64 - (slots.shape[0].bit_length() - 1))
        self._max_live = int(_MAX_LOAD * slots.shape[0])

    # ----------------------------------------------------------------- queries
    def lookup(self, keys) -> np.ndarray:
        """int64 rows of `keys`, -1 for unknown ones. Changes nothing."""
        keys = _as_keys(keys)
        out = np.empty(keys.shape[0], dtype=np.int64)
        threads = numba.get_num_threads()
        if threads > 1 and keys.shape[0] >= 2 * _PARALLEL_CHUNK:
            chunk = max(_PARALLEL_CHUNK, -(-keys.shape[0] // (4 * threads)))
            _lookup_chunks(keys, self._slots, self._row_key, self._salt, self._shift, out, chunk)
        else:
            _lookup(keys, self._slots, self._row_key, self._salt, self._shift, out)
        return out

    def unseen(self, keys) -> np.ndarray:
        """The distinct keys not in the index, in order of first occurrence. Changes nothing."""
        return _unseen(_as_keys(keys), self._slots, self._row_key, self._salt, self._shift)

    def keys_of(self, rows) -> np.ndarray:
        """int64 keys of live `rows` (ValueError for a row out of range or free)."""
        rows = _as_keys(rows, "rows")
        self._check_rows(rows, unique=False)
        return self._row_key[rows]

    def live_mask(self) -> np.ndarray:
        """bool [num_rows]: the rows that hold a key."""
        return _live_mask(self._slots, self.num_rows)

    # ----------------------------------------------------------------- changes
    def insert(self, keys) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every key's row, new keys given rows in order of first occurrence: from the free
        stack first (the last row retired first), then the next never-used row. Returns
        (rows [n], new_rows [k], new_keys [k]). TableFull, with nothing changed, if the new
        keys need more rows than `max_rows` leaves."""
        keys = _as_keys(keys)
        n = keys.shape[0]
        available = self.free_rows + self._row_limit - self.num_rows
        if n > available:  # maybe too many: count exactly
            needed = self.unseen(keys).shape[0]
            if needed > available:
                bound = (f"max_rows={self._max_rows}" if self._max_rows is not None
                         else f"the int32 row limit {_MAX_ROWS}")
                raise TableFull(f"key index full: {needed} new keys need rows, {available} are free "
                                f"({self.free_rows} retired, {self._row_limit - self.num_rows} never used "
                                f"under {bound})")
        rows = np.empty(n, dtype=np.int64)
        new_rows = np.empty(n, dtype=np.int64)
        new_keys = np.empty(n, dtype=np.int64)
        self._meta[3] = 0
        i = 0
        while True:
            i, stop = _insert(keys, i, self._slots, self._row_key, self._free, self._meta, self._max_live,
                              rows, new_rows, new_keys, self._salt, self._shift)
            if stop == _DONE:
                break
            if stop == _GROW_SLOTS:
                self._grow_slots()
            else:
                self._grow_rows()
        k = int(self._meta[3])
        self._fit_free(self.free_rows)
        return rows, new_rows[:k].copy(), new_keys[:k].copy()

    def retire(self, rows) -> None:
        """Remove the keys of `rows`, which go on the free stack in the order given.
        ValueError, with nothing changed, if a row is out of range, free or listed twice."""
        rows = _as_keys(rows, "rows")
        self._check_rows(rows, unique=True)
        self._fit_free(self.free_rows + rows.shape[0])
        stopped = _retire(rows, self._slots, self._row_key, self._free, self._meta, self._salt, self._shift)
        if stopped >= 0:
            raise AssertionError(f"key index: row {int(rows[stopped])} passed the checks but is not in the table")

    def _check_rows(self, rows: np.ndarray, unique: bool) -> None:
        # the bitmap for repeats: zeroed pages cost nothing until touched (calloc)
        seen = np.zeros((self.num_rows + 63) >> 6 if unique and rows.shape[0] > 1 else 0, dtype=np.uint64)
        finding, i = _check_rows(rows, self._slots, self._row_key, self.num_rows, self._salt, self._shift, seen)
        if finding != _ROW_OK:
            what = {_ROW_OUT_OF_RANGE: f"out of range [0, {self.num_rows})", _ROW_FREE: "free (holds no key)",
                    _ROW_TWICE: "listed twice"}[finding]
            raise ValueError(f"row {int(rows[i])} (at {i}) is {what}")

    def _grow_slots(self) -> None:
        old = self._slots
        self._set_slots(np.full(2 * old.shape[0], -1, dtype=np.int32))
        _rehash(old, self._row_key, self._slots, self._salt, self._shift)

    def _grow_rows(self) -> None:
        cap = self._row_key.shape[0]
        new_cap = min(self._row_limit, max(cap + 16, int(cap * _ROW_GROWTH)))
        if new_cap <= cap:  # insert checks the bound first: never, unless that check is wrong
            raise AssertionError(f"key index: row_key cannot grow past {cap} rows")
        grown = np.zeros(new_cap, dtype=np.int64)
        grown[:cap] = self._row_key
        self._row_key = grown

    def _fit_free(self, count: int) -> None:
        """Room for `count` free rows: grown to at least double when short, halved when a
        quarter full (never below a small minimum)."""
        cap = self._free.shape[0]
        if count > cap:
            new_cap = max(count, 2 * cap, _MIN_FREE_CAP)
        elif cap > _MIN_FREE_CAP and count < cap // 4:
            new_cap = max(2 * count, _MIN_FREE_CAP)
        else:
            return
        grown = np.zeros(new_cap, dtype=np.int32)
        used = self.free_rows
        grown[:used] = self._free[:used]
        self._free = grown

    # ----------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict:
        """{"row_key": int64 [num_rows] (a free row keeps the key it last held),
        "free_rows": int32 [free] (the stack, bottom first), "max_rows": int (-1: none)}."""
        return {"row_key": self._row_key[:self.num_rows].copy(),
                "free_rows": self._free[:self.free_rows].copy(),
                "max_rows": -1 if self._max_rows is None else self._max_rows}

    def load_state_dict(self, state: dict) -> None:
        """Become the index `state` describes (same rows, same future allocations; the hash
        table is rebuilt). CheckpointError, with nothing changed, for a damaged state."""
        def fail(what):
            raise CheckpointError(f"key index state: {what}")

        if not isinstance(state, dict) or set(state) != {"row_key", "free_rows", "max_rows"}:
            fail(f"expected the entries row_key, free_rows, max_rows, got "
                 f"{sorted(state) if isinstance(state, dict) else type(state).__name__}")
        row_key, free, max_rows = state["row_key"], state["free_rows"], state["max_rows"]
        for name, a, dtype in (("row_key", row_key, np.int64), ("free_rows", free, np.int32)):
            if not isinstance(a, np.ndarray) or a.dtype != dtype or a.ndim != 1:
                fail(f"{name} must be a 1-D {np.dtype(dtype)} array, got "
                     + (f"{a.dtype} of shape {a.shape}" if isinstance(a, np.ndarray) else type(a).__name__))
        if isinstance(max_rows, (bool, np.bool_)) or not isinstance(max_rows, (int, np.integer)) \
                or not -1 <= max_rows <= _MAX_ROWS:
            fail(f"max_rows must be -1 (none) or a row count up to {_MAX_ROWS}, got {max_rows!r}")
        max_rows = None if max_rows == -1 else int(max_rows)
        num_rows = row_key.shape[0]
        limit = _MAX_ROWS if max_rows is None else max_rows
        if num_rows > limit:
            fail(f"{num_rows} rows, more than max_rows={limit}")
        if free.shape[0] > num_rows:
            fail(f"{free.shape[0]} free rows of {num_rows}")
        row_key = np.ascontiguousarray(row_key).copy()
        free = np.ascontiguousarray(free).copy()
        live = num_rows - free.shape[0]
        salt = np.uint64(secrets.randbits(64))
        slots = np.full(1 << _slot_bits(live), -1, dtype=np.int32)
        shift = np.uint64(64 - (slots.shape[0].bit_length() - 1))
        fault, a, b = _build(row_key, free, slots, salt, shift)
        if fault == 1:
            fail(f"free row {int(free[a])} (at {a}) is out of range [0, {num_rows})")
        if fault == 2:
            fail(f"free row {int(free[a])} is listed twice")
        if fault == 3:
            fail(f"rows {a} and {b} hold the same key {int(row_key[a])}")
        self._max_rows = max_rows
        self._salt = salt
        self._set_slots(slots)
        self._row_key = row_key
        self._free = free
        self._meta = np.array([num_rows, live, free.shape[0], 0], dtype=np.int64)
