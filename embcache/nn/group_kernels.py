"""A batch's features in a cache group's id space, in one parallel pass (CPU, numba).

A collection's forward turns a KeyedJaggedTensor into each group's 1-D ids and offsets:
every feature's ids shifted by its table's first row, checked against its table, and the
lengths of its samples turned into bag starts. As tensor ops that is a `cat`, a
`repeat_interleave` of the row offsets, another of the bounds, comparisons, an `any`, a
`cumsum`: each a full pass over the batch's ids, about 7 ms a batch of 16,384 x 26 on one
core. Here the ids are copied, shifted and checked in one pass split into chunks over the
threads, and the offsets made per feature with each sample's length checked, which makes
offsets that no later check needs to read again: they start at 0 and never decrease.

Only CPU tensors come here; ids elsewhere take the tensor ops (`cached_collection`).
"""
from __future__ import annotations

import numba
import numpy as np
import torch
from numba import prange

_CHUNK = 1 << 15  # ids per unit of parallel work


@numba.njit(parallel=True, cache=True, nogil=True)
def _shift_and_check(values, src_start, dst_start, row_offset, rows, out):
    """`out[dst_start[f] + j] = values[src_start[f] + j] + row_offset[f]` for every feature
    f; returns the first position of `out` whose id is outside [0, rows[f]) (-1: none)."""
    total = dst_start[-1]
    n_chunks = (total + _CHUNK - 1) // _CHUNK
    first_bad = np.full(max(n_chunks, 1), -1, dtype=np.int64)
    for c in prange(n_chunks):
        lo = c * _CHUNK
        hi = min(lo + _CHUNK, total)
        f = np.searchsorted(dst_start, lo, side="right") - 1
        bad = -1
        i = lo
        while i < hi:
            while dst_start[f + 1] <= i:
                f += 1
            end = min(hi, dst_start[f + 1])
            shift = src_start[f] - dst_start[f]
            off, bound = row_offset[f], rows[f]
            for j in range(i, end):
                v = values[shift + j]
                if (v < 0 or v >= bound) and bad < 0:
                    bad = j
                out[j] = v + off
            i = end
        first_bad[c] = bad
    for c in range(n_chunks):
        if first_bad[c] >= 0:
            return first_bad[c]
    return -1


@numba.njit(parallel=True, cache=True, nogil=True)
def _bag_offsets(lengths, length_rows, dst_start, batch, out):
    """Bag starts of every feature k (its samples' lengths are row `length_rows[k]` of
    `lengths`, [features, batch] flattened): `out[k * batch + b]`. Returns the first
    (feature, sample) whose length is negative, or (-1, -1)."""
    n = length_rows.shape[0]
    bad_sample = np.full(n, -1, dtype=np.int64)
    for k in prange(n):
        acc = dst_start[k]
        base = length_rows[k] * batch
        for b in range(batch):
            out[k * batch + b] = acc
            length = lengths[base + b]
            if length < 0 and bad_sample[k] < 0:
                bad_sample[k] = b
            acc += length
    for k in range(n):
        if bad_sample[k] >= 0:
            return k, bad_sample[k]
    return -1, -1


def concat_features(values: torch.Tensor, lengths: torch.Tensor, src_start: list[int], counts: list[int],
                    length_rows: list[int], row_offsets: list[int], rows: list[int], batch: int):
    """The ids of a group's features (feature k: `counts[k]` ids from `values[src_start[k]:]`,
    shifted by `row_offsets[k]`, each below `rows[k]`) as one int64 tensor, and the bag
    offsets of their samples (feature k's lengths are row `length_rows[k]` of the
    `[features, batch]` `lengths`). Returns (ids, offsets, first bad id position or -1,
    (feature, sample) of the first negative length or (-1, -1))."""
    dst = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=dst[1:])
    ids = np.empty(int(dst[-1]), dtype=np.int64)
    bad_id = _shift_and_check(values.numpy(), np.asarray(src_start, dtype=np.int64), dst,
                              np.asarray(row_offsets, dtype=np.int64), np.asarray(rows, dtype=np.int64), ids)
    offsets = np.empty(len(counts) * batch, dtype=np.int64)
    bad_length = _bag_offsets(lengths.reshape(-1).numpy(), np.asarray(length_rows, dtype=np.int64), dst, batch,
                              offsets)
    return torch.from_numpy(ids), torch.from_numpy(offsets), int(bad_id), (int(bad_length[0]), int(bad_length[1]))
