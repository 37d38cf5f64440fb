"""Triton kernels for the host link's masked row moves (CUDA only).

In plain tensor ops a masked entry of a fixed-size list still moves a row: to or from the
spare row, across the link, so a batch of n lookups moves n rows whatever its misses. Here
each entry is one program that loads its mask first and does nothing when it is False, so
only the rows that matter cross the link. The kernels take the pinned host table itself
(Triton maps a pinned pointer to its device address) and a device table.

`HostLink` uses them on CUDA after checking them once against the tensor ops on a few rows
(`self_check`), and keeps the tensor ops where Triton is missing or the check fails.
"""
from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # no Triton (the CPU build): the tensor ops serve
    triton = None


if triton is not None:
    @triton.jit
    def _move_rows(src, src_rows, dst, dst_rows, mask, width, BLOCK: tl.constexpr):
        r = tl.program_id(0)
        if tl.load(mask + r) != 0:
            s = tl.load(src_rows + r).to(tl.int64)
            d = tl.load(dst_rows + r).to(tl.int64)
            for start in range(0, width, BLOCK):
                cols = start + tl.arange(0, BLOCK)
                keep = cols < width
                tl.store(dst + d * width + cols, tl.load(src + s * width + cols, mask=keep), mask=keep)


def available() -> bool:
    return triton is not None and torch.cuda.is_available()


def move_rows(src: torch.Tensor, src_rows: torch.Tensor, dst: torch.Tensor, dst_rows: torch.Tensor,
              mask: torch.Tensor) -> None:
    """`dst[dst_rows[i]] = src[src_rows[i]]` where `mask[i]`; nothing moves elsewhere. Both
    tables 2-D and contiguous, of one dtype and width; one of them may be a pinned host
    tensor. The index lists and the mask live on the device."""
    n = mask.numel()
    if n == 0:
        return
    width = src.shape[1]
    block = min(1024, triton.next_power_of_2(width))
    _move_rows[(n,)](src, src_rows, dst, dst_rows, mask.to(torch.uint8), width, BLOCK=block)
