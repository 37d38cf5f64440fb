"""The numba kernels of `key_index` (an open table's host index: raw key -> row), and the
constants they share with it: the hash, probes with prefetching, insert, rehash, the row
checks, retire with backward-shift deletion, build. The design is `key_index`'s docstring."""
from __future__ import annotations

import numba
import numpy as np

from cpu_kernels.intrinsics import prefetch_entry

_MAX_ROWS = (1 << 31) - 1  # rows are int32 in the slots
_MAX_LOAD = 0.7  # the hash table doubles beyond this share of used slots
_MIN_SLOTS = 8
_MIN_FREE_CAP = 64
_ROW_GROWTH = 1.25  # row_key's growth factor
# a probe reads a slot, then the key stored for its row: two dependent random reads, which
# the kernels ask for ahead: the first slot of the key _AHEAD places on, and the stored key
# of the row in the first slot of the key _AHEAD_ROW places on (written out in each kernel:
# a shared helper measured slower). 100 k lookups of known keys among 8 M, 2 shared cores,
# best of 40: 5.0 ms without prefetching, 5.0 with the slot's alone, 3.6 with both. Each
# key's first slot is hashed once, when it is asked for, and kept in a ring of the next
# _RING homes until its turn (hashing it again there and at its probe cost more than the
# reads: a multi-hot batch's 3.5 M lookups among 624 k keys, 74 -> 41 ms)
_AHEAD = 32
_AHEAD_ROW = 16
_RING = 64  # a power of two above _AHEAD
_PARALLEL_CHUNK = 32_768  # lookups a thread takes at least (smaller batches look up on one thread)

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)

# the insert kernel's stops: done, the hash table must grow, row_key must grow
_DONE, _GROW_SLOTS, _GROW_ROWS = 0, 1, 2
# the row checks' findings
_ROW_OK, _ROW_OUT_OF_RANGE, _ROW_FREE, _ROW_TWICE = 0, 1, 2, 3


@numba.njit(cache=True, nogil=True)
def _home(key, salt, shift):
    """The key's first slot: the top bits of splitmix64's finaliser of `key + salt`."""
    x = np.uint64(key) + salt
    x = (x ^ (x >> _S30)) * _M1
    x = (x ^ (x >> _S27)) * _M2
    x = x ^ (x >> _S31)
    return np.int64(x >> shift)


@numba.njit(cache=True, nogil=True)
def _find_from(key, j, slots, row_key):
    """(the key's row or -1, the slot where the probe stopped), probing from slot `j`, the
    key's first (hashed already by the batch kernels, which keep a ring of them)."""
    mask = slots.shape[0] - 1
    while True:
        r = slots[j]
        if r < 0 or row_key[r] == key:
            return r, j
        j = (j + 1) & mask


@numba.njit(cache=True, nogil=True)
def _find(key, slots, row_key, salt, shift):
    """`_find_from` the key's first slot."""
    return _find_from(key, _home(key, salt, shift), slots, row_key)


@numba.njit(cache=True, nogil=True)
def _ring_start(keys, start, salt, shift):
    """The ring of first slots, holding those of keys[start : start + _AHEAD]."""
    ring = np.empty(_RING, np.int64)
    for p in range(start, min(start + _AHEAD, keys.shape[0])):
        ring[p & (_RING - 1)] = _home(keys[p], salt, shift)
    return ring


@numba.njit(cache=True, nogil=True)
def _lookup(keys, slots, row_key, salt, shift, out):
    """out[i] = the row of keys[i], -1 if unknown."""
    n = keys.shape[0]
    ring = _ring_start(keys, 0, salt, shift)
    for i in range(n):
        if i + _AHEAD < n:
            h = _home(keys[i + _AHEAD], salt, shift)
            ring[(i + _AHEAD) & (_RING - 1)] = h
            prefetch_entry(slots, h)
        if i + _AHEAD_ROW < n:
            ahead = slots[ring[(i + _AHEAD_ROW) & (_RING - 1)]]
            if ahead >= 0:
                prefetch_entry(row_key, ahead)
        out[i] = _find_from(keys[i], ring[i & (_RING - 1)], slots, row_key)[0]


@numba.njit(parallel=True, cache=True, nogil=True)
def _lookup_chunks(keys, slots, row_key, salt, shift, out, chunk):
    """`_lookup` over chunks of `chunk` keys in parallel (read-only: any chunk, the same rows)."""
    n = keys.shape[0]
    for c in numba.prange(-(-n // chunk)):
        lo = c * chunk
        hi = min(n, lo + chunk)
        _lookup(keys[lo:hi], slots, row_key, salt, shift, out[lo:hi])


@numba.njit(cache=True, nogil=True)
def _unseen(keys, slots, row_key, salt, shift):
    """The distinct keys not in the index, in order of first occurrence (deduplicated
    through a scratch table of positions in `keys`)."""
    n = keys.shape[0]
    bits = 3
    while (1 << bits) < 2 * n:
        bits += 1
    seen = np.full(1 << bits, -1, dtype=np.int64)
    seen_shift = np.uint64(64 - bits)
    seen_mask = (1 << bits) - 1
    out = np.empty(n, dtype=np.int64)
    k = 0
    ring = _ring_start(keys, 0, salt, shift)
    for i in range(n):
        if i + _AHEAD < n:
            h = _home(keys[i + _AHEAD], salt, shift)
            ring[(i + _AHEAD) & (_RING - 1)] = h
            prefetch_entry(slots, h)
        if i + _AHEAD_ROW < n:
            ahead = slots[ring[(i + _AHEAD_ROW) & (_RING - 1)]]
            if ahead >= 0:
                prefetch_entry(row_key, ahead)
        key = keys[i]
        if _find_from(key, ring[i & (_RING - 1)], slots, row_key)[0] >= 0:
            continue
        j = _home(key, salt, seen_shift)
        while True:
            p = seen[j]
            if p < 0:
                seen[j] = i
                out[k] = key
                k += 1
                break
            if keys[p] == key:
                break
            j = (j + 1) & seen_mask
    return out[:k]


@numba.njit(cache=True, nogil=True)
def _insert(keys, start, slots, row_key, free, meta, max_live, rows, new_rows, new_keys, salt, shift):
    """Give keys[start:] their rows, until done or until an array must grow first (the
    caller grows it and calls again from the returned position). A new key takes the top of
    the free stack, else row `num_rows`. The caller has made sure that enough rows are free.
    meta = [num_rows, live, free count, new keys so far], updated. Returns (position, stop)."""
    n = keys.shape[0]
    num_rows, live, nfree, k = meta[0], meta[1], meta[2], meta[3]
    stop = _DONE
    i = start
    ring = _ring_start(keys, start, salt, shift)
    while i < n:
        if i + _AHEAD < n:
            h = _home(keys[i + _AHEAD], salt, shift)
            ring[(i + _AHEAD) & (_RING - 1)] = h
            prefetch_entry(slots, h)
        if i + _AHEAD_ROW < n:
            ahead = slots[ring[(i + _AHEAD_ROW) & (_RING - 1)]]
            if ahead >= 0:
                prefetch_entry(row_key, ahead)
        key = keys[i]
        r, j = _find_from(key, ring[i & (_RING - 1)], slots, row_key)
        if r < 0:
            if live >= max_live:
                stop = _GROW_SLOTS
                break
            if nfree > 0:
                nfree -= 1
                r = free[nfree]
            elif num_rows < row_key.shape[0]:
                r = num_rows
                num_rows += 1
            else:
                stop = _GROW_ROWS
                break
            row_key[r] = key
            slots[j] = r
            live += 1
            new_rows[k] = r
            new_keys[k] = key
            k += 1
        rows[i] = r
        i += 1
    meta[0] = num_rows
    meta[1] = live
    meta[2] = nfree
    meta[3] = k
    return i, stop


@numba.njit(cache=True, nogil=True)
def _rehash(old, row_key, slots, salt, shift):
    """Put every row of the old hash table into the (empty, larger) new one."""
    mask = slots.shape[0] - 1
    for s in range(old.shape[0]):
        r = old[s]
        if r >= 0:
            j = _home(row_key[r], salt, shift)
            while slots[j] >= 0:
                j = (j + 1) & mask
            slots[j] = r


@numba.njit(cache=True, nogil=True)
def _prefetch_rows_ahead(rows, i, slots, row_key, num_rows, salt, shift):
    """What a pass over `rows` will read: the stored key of the row _AHEAD places on, and
    the first slot of that key for the row _AHEAD_ROW places on."""
    n = rows.shape[0]
    if i + _AHEAD < n and 0 <= rows[i + _AHEAD] < num_rows:
        prefetch_entry(row_key, rows[i + _AHEAD])
    if i + _AHEAD_ROW < n and 0 <= rows[i + _AHEAD_ROW] < num_rows:
        prefetch_entry(slots, _home(row_key[rows[i + _AHEAD_ROW]], salt, shift))


@numba.njit(cache=True, nogil=True)
def _check_rows(rows, slots, row_key, num_rows, salt, shift, seen):
    """(finding, position): the first row out of range, free or (when `seen`, a zeroed
    bitmap of num_rows bits, is not empty) listed twice; (_ROW_OK, -1) if none. A row is
    live when its key's probe ends at it."""
    unique = seen.shape[0] > 0
    for i in range(rows.shape[0]):
        _prefetch_rows_ahead(rows, i, slots, row_key, num_rows, salt, shift)
        r = rows[i]
        if r < 0 or r >= num_rows:
            return _ROW_OUT_OF_RANGE, i
        if _find(row_key[r], slots, row_key, salt, shift)[0] != r:
            return _ROW_FREE, i
        if unique:
            bit = np.uint64(1) << np.uint64(r & 63)
            if seen[r >> 6] & bit:
                return _ROW_TWICE, i
            seen[r >> 6] |= bit
    return _ROW_OK, -1


@numba.njit(cache=True, nogil=True)
def _retire(rows, slots, row_key, free, meta, salt, shift):
    """Remove the (live, distinct) rows' keys by backward shift and push the rows on the free
    stack. meta = [num_rows, live, free count, ...], updated. Returns -1, or the position of
    a row that is not in the table (the caller's checks make that impossible), where it stopped."""
    mask = slots.shape[0] - 1
    nfree = meta[2]
    for t in range(rows.shape[0]):
        _prefetch_rows_ahead(rows, t, slots, row_key, meta[0], salt, shift)
        r = rows[t]
        hole = _home(row_key[r], salt, shift)
        while slots[hole] != r:
            if slots[hole] < 0:
                meta[1] -= t
                meta[2] = nfree
                return t
            hole = (hole + 1) & mask
        # shift back every entry of the chain after the hole whose first slot is at or
        # before the hole (cyclically): it would not be found past an empty slot
        j = (hole + 1) & mask
        while True:
            s = slots[j]
            if s < 0:
                break
            h = _home(row_key[s], salt, shift)
            if ((j - h) & mask) >= ((j - hole) & mask):
                slots[hole] = s
                hole = j
            j = (j + 1) & mask
        slots[hole] = -1
        free[nfree] = r
        nfree += 1
    meta[1] -= rows.shape[0]
    meta[2] = nfree
    return -1


@numba.njit(cache=True, nogil=True)
def _live_mask(slots, num_rows):
    mask = np.zeros(num_rows, dtype=np.bool_)
    for s in range(slots.shape[0]):
        if slots[s] >= 0:
            mask[slots[s]] = True
    return mask


@numba.njit(cache=True, nogil=True)
def _build(row_key, free, slots, salt, shift):
    """Fill the empty `slots` with every row not in `free`. Returns (0, 0, 0) or the first
    fault: (1, i, 0) free[i] out of range; (2, i, 0) free[i] listed before; (3, a, b) rows a
    and b hold the same key."""
    num_rows = row_key.shape[0]
    is_free = np.zeros(num_rows, dtype=np.bool_)
    for i in range(free.shape[0]):
        f = free[i]
        if f < 0 or f >= num_rows:
            return 1, i, 0
        if is_free[f]:
            return 2, i, 0
        is_free[f] = True
    for r in range(num_rows):
        if is_free[r]:
            continue
        other, j = _find(row_key[r], slots, row_key, salt, shift)
        if other >= 0:
            return 3, other, r
        slots[j] = r
    return 0, 0, 0
