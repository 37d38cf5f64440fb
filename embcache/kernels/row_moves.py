"""Rows copied between tables through a fixed-size list of (source row, destination row)
pairs with a mask, every table of a row (the weight and each optimizer state) in one launch,
registered as the custom op `embcache::move_rows`. The device bookkeeper's host link moves
its rows so (`cache.stores.host_link`): one operation where plain tensor ops take two
`where`s and a gather and a scatter per table, and only the rows that matter cross the link
(a masked pair moves nothing, where the tensor ops send it through a spare row).

Which rows each program touches: program p takes the pairs `[p * R, (p + 1) * R)` (R: `ROWS`,
one on a GPU; under Triton's interpreter, where a program is a Python call, 64). For each
pair i whose `mask[i]` is set it reads `src_rows[i]` and `dst_rows[i]` and copies that row of
each source table, in column blocks, to that row of the matching destination table; a pair
whose mask is False is not read further. A copy is bit for bit (each
table moved as integers of its element's width, so a bfloat16 weight beside float32 state is
never converted). Two unmasked pairs with one destination row would race: the callers' are
distinct (a batch's distinct missing ids, its victims' slots).
"""
from __future__ import annotations

import torch
from torch.library import triton_op, wrap_triton

from .resolve import interpreted

from ._triton import jit as _jit, tl, triton

MAX_TABLES = 4  # the weight and up to three states (Adam keeps two)
MAX_BLOCK = 1024  # columns a program copies at once: a wider row takes a loop
ROWS, ROWS_INTERPRETED = 1, 64  # pairs a program takes (module docstring)
_AS_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@_jit
def _copy_rows(src, dst, width, s, d, on, BLOCK: tl.constexpr):
    for start in range(0, width, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        keep = on[:, None] & (cols < width)[None, :]
        values = tl.load(src + s[:, None] * width + cols[None, :], mask=keep)
        tl.store(dst + d[:, None] * width + cols[None, :], values, mask=keep)


@_jit
def _move_kernel(s0, d0, w0, s1, d1, w1, s2, d2, w2, s3, d3, w3, src_rows, dst_rows, mask, n,
                 TABLES: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    on = tl.load(mask + i, mask=i < n, other=0) != 0
    s = tl.load(src_rows + i, mask=on, other=0).to(tl.int64)
    d = tl.load(dst_rows + i, mask=on, other=0).to(tl.int64)
    _copy_rows(s0, d0, w0, s, d, on, BLOCK)
    if TABLES > 1:
        _copy_rows(s1, d1, w1, s, d, on, BLOCK)
    if TABLES > 2:
        _copy_rows(s2, d2, w2, s, d, on, BLOCK)
    if TABLES > 3:
        _copy_rows(s3, d3, w3, s, d, on, BLOCK)


@triton_op("embcache::move_rows", mutates_args={"dsts"})
def _move_op(srcs: list[torch.Tensor], dsts: list[torch.Tensor], src_rows: torch.Tensor, dst_rows: torch.Tensor,
             mask: torch.Tensor) -> None:
    n = mask.numel()
    if n == 0:
        return
    args = []
    for src, dst in zip(srcs, dsts):
        bits = _AS_BITS[src.element_size()]
        args += [src.view(bits), dst.view(bits), src.shape[1]]
    args += args[:3] * (MAX_TABLES - len(srcs))  # unread: TABLES says how many are real
    block = min(MAX_BLOCK, triton.next_power_of_2(max(max(s.shape[1] for s in srcs), 1)))
    rows = ROWS_INTERPRETED if interpreted() else ROWS
    wrap_triton(_move_kernel)[(triton.cdiv(n, rows),)](*args, src_rows, dst_rows, mask.view(torch.uint8), n,
                                                       TABLES=len(srcs), ROWS=rows, BLOCK=block)


@_move_op.register_fake
def _(srcs, dsts, src_rows, dst_rows, mask) -> None:
    return None  # writes its destinations in place: shapes and types as they were


def move_rows(srcs: list[torch.Tensor], dsts: list[torch.Tensor], src_rows: torch.Tensor, dst_rows: torch.Tensor,
              mask: torch.Tensor) -> None:
    """`dsts[t][dst_rows[i]] = srcs[t][src_rows[i]]` for each table t where `mask[i]`; nothing
    moves elsewhere (an index under a False mask is never read, so it may be anything).

    Args:
        srcs, dsts: up to `MAX_TABLES` pairs of 2-D contiguous tables, each pair of one dtype
            and width, all on one device (a CUDA view of pinned host memory counts as the
            device's: `unified_view`).
        src_rows, dst_rows: int64 row numbers, one per pair; mask: bool, one per pair.

    Example:
        >>> a, b = torch.arange(6.0).view(3, 2), torch.zeros(2, 2)
        >>> move_rows([a], [b], torch.tensor([2, 0]), torch.tensor([0, 1]), torch.tensor([True, False]))
        ...  # doctest: +SKIP
        >>> b.tolist()  # doctest: +SKIP
        [[4.0, 5.0], [0.0, 0.0]]
    """
    if triton is None:
        raise RuntimeError("the row-move kernel needs Triton, which does not import here: use kernels='torch'")
    if not 0 < len(srcs) == len(dsts) <= MAX_TABLES:
        raise ValueError(f"move_rows takes 1 to {MAX_TABLES} pairs of tables, got {len(srcs)} and {len(dsts)}")
    for src, dst in zip(srcs, dsts):
        if src.dim() != 2 or dst.dim() != 2 or src.dtype != dst.dtype or src.shape[1] != dst.shape[1] \
                or not (src.is_contiguous() and dst.is_contiguous()):
            raise ValueError(f"move_rows: tables must be 2-D, contiguous and alike in dtype and width, got "
                             f"{src.dtype} {list(src.shape)} and {dst.dtype} {list(dst.shape)}")
    if mask.dtype != torch.bool or src_rows.shape != mask.shape or dst_rows.shape != mask.shape:
        raise ValueError("move_rows: mask must be bool, and the row lists shaped as it")
    _move_op(list(srcs), list(dsts), src_rows.contiguous(), dst_rows.contiguous(), mask.contiguous())
