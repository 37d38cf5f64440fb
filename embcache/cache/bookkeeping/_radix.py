"""Stable sorts for the compiled admission: least-significant-digit radix sorts.

The admission sorts a few tens of thousands of keys a step (the eviction candidates by
key, the missing ids by value), and numba's comparison sorts took longer than every
other part of choosing the victims (3.2 ms for 33 k float keys, one thread). A radix sort
does it in a few linear passes over data that fits the L2 cache, and it is stable, which
is the order the tensor path defines: equal keys stay in their given (ascending slot)
order. Passes whose digit is the same for every key (the high bits of small ids, the
exponent of keys of one magnitude) are skipped.
"""
from __future__ import annotations

import numba
import numpy as np

_DIGIT_BITS = 11
_BUCKETS = 1 << _DIGIT_BITS
_SIGN = np.uint64(1) << np.uint64(63)


@numba.njit(cache=True, nogil=True)
def _order_of_bits(bits):
    """The stable ascending order of unsigned 64-bit `bits` (a permutation of indices);
    `bits` is used as scratch. The keys travel with their indices, so each pass reads
    both in sequence."""
    n = bits.shape[0]
    order = np.arange(n)
    moved = np.empty(n, dtype=np.int64)
    moved_bits = np.empty(n, dtype=np.uint64)
    counts = np.empty(_BUCKETS + 1, dtype=np.int64)
    mask = np.uint64(_BUCKETS - 1)
    for shift in range(0, 64, _DIGIT_BITS):
        s = np.uint64(shift)
        counts[:] = 0
        for i in range(n):
            counts[np.int64((bits[i] >> s) & mask) + 1] += 1
        if counts.max() == n:  # one digit for all: this pass would not move anything
            continue
        for d in range(_BUCKETS):
            counts[d + 1] += counts[d]
        for i in range(n):
            d = np.int64((bits[i] >> s) & mask)
            j = counts[d]
            moved[j] = order[i]
            moved_bits[j] = bits[i]
            counts[d] = j + 1
        order, moved = moved, order
        bits, moved_bits = moved_bits, bits
    return order


@numba.njit(cache=True, nogil=True)
def stable_order_f64(keys):
    """`np.argsort(keys, kind="mergesort")` for float64 keys without NaN (infinities
    allowed): the IEEE bits, sign-flipped so that unsigned order is numeric order."""
    raw = np.ascontiguousarray(keys).view(np.uint64)
    bits = np.empty(raw.shape[0], dtype=np.uint64)
    for i in range(raw.shape[0]):
        b = raw[i]
        bits[i] = ~b if b & _SIGN else b | _SIGN
    # -0.0 and 0.0 compare equal but differ in bits: make them one key
    for i in range(raw.shape[0]):
        if bits[i] == ~_SIGN:
            bits[i] = _SIGN
    return _order_of_bits(bits)


@numba.njit(cache=True, nogil=True)
def stable_order_i64(values):
    """`np.argsort(values, kind="mergesort")` for int64 values."""
    bits = np.empty(values.shape[0], dtype=np.uint64)
    for i in range(values.shape[0]):
        bits[i] = np.uint64(values[i]) ^ _SIGN
    return _order_of_bits(bits)
