"""A batch's lookup in the device bookkeeper's cache in two Triton launches after one sort:
each id's slot, the slots the batch touches, and its distinct missing ids ranked, with no
count handed to the host. The tensor ops it replaces (`DeviceRowCache._look_up`'s torch
path) take about twenty launches, each a pass over the batch.

The caller sorts the batch's ids stably (`torch.sort`). Then, over blocks of `BLOCK`
positions:

- `embcache::lookup_counts`, program b: zeroes block b of the touched-slot mask, and counts
  the sorted positions of block b that lead a missing id (an id unlike the one before it,
  whose `id_to_slot` entry is -1). It writes that count and nothing else.
- `embcache::lookup_ranks`, program b: sums the counts of the blocks before b (its prefix)
  and of all blocks (the number of distinct missing ids, m; program 0 writes it). For its
  sorted positions: the id's rank among the missing ones, a running sum of the leaders
  (`tl.cumsum`) past the prefix, written to the batch's original order through the sort's
  permutation, and each leader's id at its rank in the missing list; list entries from m
  on get the trash id. For its positions in the batch's original order: the id's slot and
  hit, and the touched-slot mask set at the slot (the trash entry, index C, for a miss).

Every entry is written by one program, except the mask's, where programs store the same
True: the result is the same run after run, and equals the torch path entry for entry
(tests/test_kernels_lookup.py), so decisions made from it are the host bookkeeper's.
"""
from __future__ import annotations

import torch
from torch.library import triton_op, wrap_triton

from ._triton import jit as _jit, tl, triton

BLOCK = 1024  # positions a program takes


@_jit
def _leaders(sorted_ids, id_to_slot, offs, n):
    """Which of the sorted positions `offs` lead a missing id, and their ids."""
    valid = offs < n
    cur = tl.load(sorted_ids + offs, mask=valid, other=0)
    prev = tl.load(sorted_ids + offs - 1, mask=valid & (offs > 0), other=-1)  # ids are >= 0
    first = valid & (cur != prev)
    slot = tl.load(id_to_slot + cur, mask=first, other=0)
    return first & (slot < 0), cur


@_jit
def _counts_kernel(sorted_ids, id_to_slot, in_batch, counts, n, mask_len, blocks, BLOCK: tl.constexpr):
    b = tl.program_id(0)
    offs = b * BLOCK + tl.arange(0, BLOCK)
    tl.store(in_batch + offs, tl.zeros([BLOCK], dtype=tl.uint8), mask=offs < mask_len)
    if b < blocks:
        leads, _ = _leaders(sorted_ids, id_to_slot, offs, n)
        tl.store(counts + b, tl.sum(leads.to(tl.int64), axis=0))


@_jit
def _ranks_kernel(ids, sorted_ids, perm, id_to_slot, counts, in_batch, slots, hit, missing, where, m_out,
                  n, blocks, trash_slot, trash_id, BLOCK: tl.constexpr):
    b = tl.program_id(0)
    prefix = tl.zeros([], dtype=tl.int64)
    total = tl.zeros([], dtype=tl.int64)
    for start in range(0, blocks, BLOCK):
        o = start + tl.arange(0, BLOCK)
        c = tl.load(counts + o, mask=o < blocks, other=0)
        total += tl.sum(c, axis=0)
        prefix += tl.sum(tl.where(o < b, c, 0), axis=0)
    if b == 0:
        tl.store(m_out, total)
    offs = b * BLOCK + tl.arange(0, BLOCK)
    valid = offs < n
    # sorted positions: ranks among the missing ids, the missing list
    leads, cur = _leaders(sorted_ids, id_to_slot, offs, n)
    rank = prefix + tl.cumsum(leads.to(tl.int64), axis=0) - 1
    tl.store(missing + rank, cur, mask=leads)
    tl.store(missing + offs, tl.zeros([BLOCK], dtype=tl.int64) + trash_id, mask=valid & (offs >= total))
    p = tl.load(perm + offs, mask=valid, other=0)
    tl.store(where + p, tl.maximum(rank, 0), mask=valid)
    # original positions: slots, hits, the touched-slot mask
    i = tl.load(ids + offs, mask=valid, other=0)
    s = tl.load(id_to_slot + i, mask=valid, other=-1)
    tl.store(slots + offs, s, mask=valid)
    tl.store(hit + offs, (s >= 0).to(tl.uint8), mask=valid)
    tl.store(in_batch + tl.where(s >= 0, s, trash_slot), tl.full([BLOCK], 1, tl.uint8), mask=valid)


def _blocks(n: int) -> int:
    return (n + BLOCK - 1) // BLOCK


@triton_op("embcache::lookup_counts", mutates_args={})
def _counts_op(sorted_ids: torch.Tensor, id_to_slot: torch.Tensor, num_slots: int) -> tuple[torch.Tensor,
                                                                                              torch.Tensor]:
    n, dev = sorted_ids.numel(), sorted_ids.device
    in_batch = torch.empty(num_slots + 1, dtype=torch.bool, device=dev)
    counts = torch.empty(_blocks(n), dtype=torch.int64, device=dev)
    grid = (max(_blocks(n), _blocks(num_slots + 1)),)
    wrap_triton(_counts_kernel)[grid](sorted_ids, id_to_slot, in_batch.view(torch.uint8), counts, n, num_slots + 1,
                                      _blocks(n), BLOCK=BLOCK)
    return in_batch, counts


@_counts_op.register_fake
def _(sorted_ids, id_to_slot, num_slots):
    return (sorted_ids.new_empty(num_slots + 1, dtype=torch.bool),
            sorted_ids.new_empty(_blocks(sorted_ids.numel()), dtype=torch.int64))


@triton_op("embcache::lookup_ranks", mutates_args={"in_batch"})
def _ranks_op(ids: torch.Tensor, sorted_ids: torch.Tensor, perm: torch.Tensor, id_to_slot: torch.Tensor,
              counts: torch.Tensor, in_batch: torch.Tensor, trash_id: int) -> tuple[torch.Tensor, torch.Tensor,
                                                                                      torch.Tensor, torch.Tensor,
                                                                                      torch.Tensor]:
    n, dev = ids.numel(), ids.device
    slots, missing, where = (torch.empty(n, dtype=torch.int64, device=dev) for _ in range(3))
    hit = torch.empty(n, dtype=torch.bool, device=dev)
    m = torch.empty((), dtype=torch.int64, device=dev)
    wrap_triton(_ranks_kernel)[(_blocks(n),)](ids, sorted_ids, perm, id_to_slot, counts, in_batch.view(torch.uint8),
                                              slots, hit.view(torch.uint8), missing, where, m, n, _blocks(n),
                                              in_batch.numel() - 1, trash_id, BLOCK=BLOCK)
    return slots, hit, missing, m, where


@_ranks_op.register_fake
def _(ids, sorted_ids, perm, id_to_slot, counts, in_batch, trash_id):
    n = ids.numel()
    return (ids.new_empty(n, dtype=torch.int64), ids.new_empty(n, dtype=torch.bool),
            ids.new_empty(n, dtype=torch.int64), ids.new_empty((), dtype=torch.int64),
            ids.new_empty(n, dtype=torch.int64))


def look_up(ids: torch.Tensor, id_to_slot: torch.Tensor, num_slots: int, trash_id: int):
    """The lookup of `ids` (1-D int64, at least one) in `id_to_slot` (each id's slot or -1,
    one entry past the last id allowed), as `DeviceRowCache._look_up` returns it: (each id's
    slot, -1 absent; whether it hit; the mask of slots hit, `num_slots + 1` long (the last:
    the trash, set by any miss); the distinct missing ids ascending, padded with `trash_id`
    to the batch's length; how many (0-d); each id's rank among them, valid where absent).
    Three launches: the sort, `lookup_counts`, `lookup_ranks` (module docstring)."""
    if triton is None:
        raise RuntimeError("the lookup kernels need Triton, which does not import here: use kernels='torch'")
    if ids.dim() != 1 or ids.dtype != torch.int64 or ids.numel() == 0:
        raise ValueError(f"look_up takes a non-empty 1-D int64 batch, got {ids.dtype} {list(ids.shape)}")
    ids, id_to_slot = ids.contiguous(), id_to_slot.contiguous()
    sorted_ids, perm = torch.sort(ids, stable=True)
    in_batch, counts = _counts_op(sorted_ids, id_to_slot, num_slots)
    slots, hit, missing, m, where = _ranks_op(ids, sorted_ids, perm, id_to_slot, counts, in_batch, trash_id)
    return slots, hit, in_batch, missing, m, where
