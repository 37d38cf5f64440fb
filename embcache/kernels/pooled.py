"""The pooled lookup: `F.embedding_bag` (sum or mean, per-sample weights) as one Triton
kernel over every bag of a table group, registered as the custom op
`embcache::pooled_lookup` with a fake implementation.

A group's ids already share one id space (its tables' rows stacked), so one launch covers
every feature of the group. Rows are read in their own type (float32, float16, bfloat16)
and widened on load: a half-precision working table needs no float32 copy per step.

Summation order (see the package docstring): each bag's terms, in index order, added one
by one to a float32 accumulator that starts at 0.0; `mean` divides that sum by the bag's
length with IEEE division (`div_rn`: Triton's plain `/` may be approximate on a GPU). A
weighted term is added by a fused multiply-add (`tl.fma`, one rounding), as torch's CPU
kernel (FBGEMM) adds it; a product rounded before its add would differ in the last bits.
That is the order and rounding of torch's CPU `embedding_bag`, so sum, mean and weighted
sum equal `F.embedding_bag(indices, table.float(), offsets, ...)` to the bit on the CPU
(Triton's interpreter; `tests/test_kernels_pooled.py`). Torch's CUDA kernel sums a bag in
the same order; the GPU test checks it.

A program pools a tile of `bags_per_program` bags by up to 128 columns: at its step i each
bag of the tile adds its i-th term where it has one (the others keep their sums as they
are), so every bag's sum is its own terms in index order whatever the tile, and the tile
only sets how many row loads a program has in flight at once.
"""
from __future__ import annotations

import torch
from torch.library import triton_op, wrap_triton

from .resolve import interpreted

from ._triton import tl, triton

MODES = ("sum", "mean")
MAX_BLOCK = 128  # columns per program: a wider dim takes more programs, not more registers
# bags a program pools at once: one, as on the H200 run of 2026-11-28 (38.6 % of the copy
# bandwidth one-hot), until a GPU run measures more side by side (`bench kernels`); under
# Triton's interpreter (the CPU's tests) 64, the same bits from a 64th of the Python calls
BAGS_PER_PROGRAM = 1
BAGS_PER_PROGRAM_INTERPRETED = 64


if triton is not None:
    @triton.jit
    def _pooled_kernel(table, indices, offsets, weights, out, num_bags, num_indices, dim,
                       HAS_WEIGHTS: tl.constexpr, MEAN: tl.constexpr, BAGS: tl.constexpr, BLOCK: tl.constexpr):
        bags = tl.program_id(0) * BAGS + tl.arange(0, BAGS)
        live = bags < num_bags
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        keep = cols < dim
        start = tl.load(offsets + bags, mask=live, other=0)
        end = tl.load(offsets + bags + 1, mask=live & (bags + 1 < num_bags), other=num_indices)  # the last bag ends
        length = tl.where(live, end - start, 0)  # at the end
        acc = tl.zeros([BAGS, BLOCK], dtype=tl.float32)
        for i in range(0, tl.max(length, axis=0)):  # the tile's bags step together, each through its own ids
            on = i < length
            row = tl.load(indices + start + i, mask=on, other=0).to(tl.int64)
            term = tl.load(table + row[:, None] * dim + cols[None, :], mask=on[:, None] & keep[None, :],
                           other=0.0).to(tl.float32)
            if HAS_WEIGHTS:  # one rounding per weighted term, as torch's CPU (FBGEMM) and CUDA kernels
                weight = tl.load(weights + start + i, mask=on, other=0.0).to(tl.float32)
                acc = tl.where(on[:, None], tl.fma(term, weight[:, None], acc), acc)
            else:
                acc = tl.where(on[:, None], acc + term, acc)
        if MEAN:
            size = tl.maximum(length, 1).to(tl.float32)
            acc = tl.math.div_rn(acc, tl.zeros([BAGS, BLOCK], dtype=tl.float32) + size[:, None])
        tl.store(out + bags.to(tl.int64)[:, None] * dim + cols[None, :], acc, mask=live[:, None] & keep[None, :])

    @triton_op("embcache::pooled_lookup", mutates_args={})
    def _pooled_op(table: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor,
                   per_sample_weights: torch.Tensor | None, mode: str, bags_per_program: int = 1) -> torch.Tensor:
        num_bags, dim = offsets.numel(), table.shape[1]
        out = torch.empty((num_bags, dim), dtype=torch.float32, device=table.device)
        if num_bags == 0 or dim == 0:
            return out
        block = min(MAX_BLOCK, triton.next_power_of_2(dim))
        weights = indices if per_sample_weights is None else per_sample_weights  # unread without weights
        grid = (triton.cdiv(num_bags, bags_per_program), triton.cdiv(dim, block))
        wrap_triton(_pooled_kernel)[grid](table, indices, offsets, weights, out, num_bags, indices.numel(), dim,
                                          HAS_WEIGHTS=per_sample_weights is not None, MEAN=mode == "mean",
                                          BAGS=bags_per_program, BLOCK=block)
        return out

    @_pooled_op.register_fake
    def _(table, indices, offsets, per_sample_weights, mode, bags_per_program=1):
        return table.new_empty((offsets.numel(), table.shape[1]), dtype=torch.float32)


def pooled_lookup(table: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor,
                  per_sample_weights: torch.Tensor | None = None, mode: str = "sum",
                  bags_per_program: int | None = None) -> torch.Tensor:
    """`F.embedding_bag(indices, table.float(), offsets, mode=mode,
    per_sample_weights=per_sample_weights)` as one op: `[B, D]` float32, B = len(offsets).

    Args:
        table: `[N, D]` rows, float32, float16 or bfloat16 (read in place, widened to float32).
        indices: int64 row numbers in `[0, N)`, bag after bag.
        offsets: int64 start of each bag in `indices` (non-decreasing, the first 0; no
            closing offset). An empty bag gives zeros.
        per_sample_weights: one float per index (sum mode only, as torch).
        mode: "sum" or "mean".
        bags_per_program: bags a program pools side by side (a power of two; None:
            `BAGS_PER_PROGRAM`, under the interpreter `BAGS_PER_PROGRAM_INTERPRETED`). Any choice gives the same bits: each bag's terms are
            summed in its own index order; it changes only how many loads a program has in
            flight (`bench kernels` measures the choices side by side).

    The inputs are the caller's checked ones (the bag's input checks): only types and
    shapes are checked here, since reading an id on the host would stall the device.

    Example:
        >>> t = torch.arange(6.0).reshape(3, 2)
        >>> pooled_lookup(t, torch.tensor([0, 2, 2]), torch.tensor([0, 1])).tolist()  # doctest: +SKIP
        [[0.0, 1.0], [8.0, 10.0]]
    """
    if triton is None:
        raise RuntimeError("the pooled-lookup kernel needs Triton, which does not import here: use kernels='torch'")
    _check(table, indices, offsets, per_sample_weights, mode)
    if bags_per_program is None:
        bags_per_program = BAGS_PER_PROGRAM_INTERPRETED if interpreted() else BAGS_PER_PROGRAM
    bags = int(bags_per_program)
    if bags < 1 or bags & (bags - 1):
        raise ValueError(f"bags_per_program must be a power of two, got {bags_per_program}")
    table = table.contiguous()
    if per_sample_weights is not None:
        per_sample_weights = per_sample_weights.contiguous()
    return _pooled_op(table, indices.contiguous(), offsets.contiguous(), per_sample_weights, mode, bags)


def _check(table, indices, offsets, per_sample_weights, mode) -> None:
    """Types and shapes: a wrong one would make the kernel read the wrong bytes silently."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if table.dim() != 2 or table.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"table must be 2-D float32, float16 or bfloat16, got {table.dtype} {list(table.shape)}")
    if indices.dim() != 1 or offsets.dim() != 1 or indices.dtype != torch.int64 or offsets.dtype != torch.int64:
        raise ValueError(f"indices and offsets must be 1-D int64, got {indices.dtype} {list(indices.shape)} "
                         f"and {offsets.dtype} {list(offsets.shape)}")
    if per_sample_weights is not None:
        if mode != "sum":
            raise ValueError(f"per_sample_weights need mode='sum' (as torch), got mode={mode!r}")
        if per_sample_weights.shape != indices.shape or not per_sample_weights.is_floating_point():
            raise ValueError(f"per_sample_weights must be floats shaped as indices {list(indices.shape)}, got "
                             f"{per_sample_weights.dtype} {list(per_sample_weights.shape)}")
