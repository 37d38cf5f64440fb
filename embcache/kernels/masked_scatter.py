"""A fixed-size list of writes into a 1-D array, each under a mask, as one Triton launch
(`embcache::scatter_masked`): what the device bookkeeper's slot and id arrays take.

The tensor ops send a masked entry to a spare "trash" entry of the array instead
(`index_copy_(0, where(mask, index, trash), values)`), so that one op serves the whole list
with no count. On a GPU every masked entry of a list then writes the same address: on an
H200 (2026-11-28, `bench/results/device_2026-11-28/gpu.json`'s profile) the device
bookkeeper's `index_copy_`s, most of whose entries are masked (a batch's lookups against its
few misses, every slot against the free ones), took 4.5 ms each at batch 65,536, 18 % of a
cached step's GPU time, serialised on that one address. Here program b takes block b of the
list and writes only the entries whose mask is set: no write to the trash, no contention.

Which entries each program touches: it reads its block of `mask`, and for each set entry i
the index `index[i]` and the value (`values[i]`, or the one value), and writes
`dst[index[i]]` (with `add`: reads it first and writes the sum). The callers' unmasked
indices are distinct, so no two programs write one entry and the result is the tensor ops'
bit for bit (tests/test_kernels_masked_scatter.py).
"""
from __future__ import annotations

import torch
from torch.library import triton_op, wrap_triton

from ._triton import jit as _jit, tl, triton

BLOCK = 1024  # entries a program takes
_STORED_AS = {torch.bool: torch.uint8}  # Triton loads and stores bytes for a bool array


@_jit
def _scatter_kernel(dst, index, values, mask, n, ONE_VALUE: tl.constexpr, ADD: tl.constexpr,
                    BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    on = tl.load(mask + offs, mask=offs < n, other=0) != 0
    at = tl.load(index + offs, mask=on, other=0)
    if ONE_VALUE:
        value = tl.load(values)
    else:
        value = tl.load(values + offs, mask=on)
    if ADD:
        value = tl.load(dst + at, mask=on) + value
    tl.store(dst + at, value, mask=on)


@triton_op("embcache::scatter_masked", mutates_args={"dst"})
def _scatter_op(dst: torch.Tensor, index: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
                add: bool = False) -> None:
    n = index.numel()
    if n == 0:
        return
    stored = _STORED_AS.get(dst.dtype, dst.dtype)
    wrap_triton(_scatter_kernel)[(triton.cdiv(n, BLOCK),)](
        dst.view(stored), index, values.view(stored), mask.view(torch.uint8), n,
        ONE_VALUE=values.numel() == 1, ADD=add, BLOCK=BLOCK)


@_scatter_op.register_fake
def _(dst, index, values, mask, add=False) -> None:
    return None  # writes `dst` in place


def scatter_masked(dst: torch.Tensor, index: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
                   add: bool = False) -> None:
    """`dst[index[i]] = values[i]` (with `add`: `+=`) for each i where `mask[i]`; nothing
    else is read or written (an index under a False mask may be anything).

    Args:
        dst: 1-D, contiguous; int32, int64, float32, float64 or bool.
        index: int64, one per entry; its unmasked entries distinct.
        values: of `dst`'s dtype, one per entry, or a single one for every entry (0-d or one
            element: a device constant, the device's clock).
        mask: bool, one per entry.

    Example:
        >>> d = torch.zeros(4, dtype=torch.long)
        >>> scatter_masked(d, torch.tensor([3, 9, 0]), torch.tensor([7, 8, 5]),
        ...                torch.tensor([True, False, True]))  # doctest: +SKIP
        >>> d.tolist()  # doctest: +SKIP
        [5, 0, 0, 7]
    """
    if triton is None:
        raise RuntimeError("the masked-scatter kernel needs Triton, which does not import here: use kernels='torch'")
    n = index.numel()
    if dst.dim() != 1 or not dst.is_contiguous() or values.dtype != dst.dtype:
        raise ValueError(f"scatter_masked: dst must be 1-D and contiguous, values of its dtype; got {dst.dtype} "
                         f"{list(dst.shape)} and {values.dtype}")
    if index.dtype != torch.int64 or mask.dtype != torch.bool or mask.shape != index.shape \
            or values.numel() not in (1, n):
        raise ValueError("scatter_masked: index int64, mask bool of its shape, and one value or one per entry")
    _scatter_op(dst, index.contiguous(), values.contiguous().reshape(-1), mask.contiguous(), add)
