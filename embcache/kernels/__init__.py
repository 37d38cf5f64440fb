"""Embedding kernels of our own, in Triton, each a torch custom op (so `meta`, the op count,
`torch.compile` and CUDA graphs see one op); a floor below `cache` and `nn`. Triton is
imported only when a kernel is first used (`resolve_kernels` says whether it can be).

What each program of each kernel touches (the order of a row's terms is what makes a run
repeatable, and what decides whether a result equals torch's to the bit):

- `pooled_lookup` (`pooled.py`, `embcache::pooled_lookup`): the grid is (bags, dim
  blocks). Program (b, j) reads bag b's start and end (`offsets[b]`, `offsets[b + 1]` or
  the number of indices for the last bag), then, in index order, each index of the bag,
  its per-sample weight if any, and columns `[j * BLOCK, (j + 1) * BLOCK)` of the table
  row it names (float32, float16 or bfloat16, widened to float32 on load). It sums them
  sequentially from 0.0 in float32, divides by the bag's length for `mean` (an empty bag
  gives 0), and writes those columns of output row b, which no other program writes. It
  writes nothing else and reads no other rows; a table row named twice is read twice.
- `fused_row_update` (`fused_update.py`, `embcache::fused_row_update`): one program per
  lookup, in the order of the lookups' sorted keys. A program whose key equals the previous
  one's returns at once; the one that leads its run of equal keys reads that run's terms
  (each a row of the output gradient, scaled for `mean` and by the lookup's weight) in
  sorted order, and reads, updates and writes the one row of the weight and of the
  optimizer's state the run names. A row has one leader, so no two programs write a row.
"""
from .resolve import CHOICES, resolve_kernels

__all__ = ["CHOICES", "resolve_kernels", "pooled_lookup"]


def __getattr__(name):
    """`pooled_lookup` on first use: importing it imports Triton and registers the op."""
    if name == "pooled_lookup":
        from .pooled import pooled_lookup

        return pooled_lookup
    raise AttributeError(f"module 'embcache.kernels' has no attribute {name!r}")
