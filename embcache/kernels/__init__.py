"""Embedding kernels of our own, in Triton, each a torch custom op (so `meta`, the op count,
`torch.compile` and CUDA graphs see one op); a floor below `cache` and `nn`. Triton is
imported only when a kernel is first used (`resolve_kernels` says whether it can be).

What each program of each kernel touches (the order of a row's terms is what makes a run
repeatable, and what decides whether a result equals torch's to the bit):

- `pooled_lookup` (`pooled.py`, `embcache::pooled_lookup`): the grid is (tiles of bags, dim
  blocks). Program (t, j) reads the start and end of each bag b of tile t (`offsets[b]`,
  `offsets[b + 1]` or the number of indices for the last bag), then, in index order, each
  index of the bag, its per-sample weight if any, and columns `[j * BLOCK, (j + 1) * BLOCK)`
  of the table row it names (float32, float16 or bfloat16, widened to float32 on load). It
  sums each bag's terms sequentially from 0.0 in float32 (the tile's bags side by side),
  divides by the bag's length for `mean` (an empty bag gives 0), and writes those columns of
  output row b, which no other program writes. It writes nothing else and reads no other
  rows; a table row named twice is read twice.
- `fused_row_update` (`fused_update.py`, `embcache::fused_row_update`, two launches): the
  lookups in the order of their sorted keys, cut into chunks of 64. A run of equal keys is
  read, in sorted order, by the program of the chunk it starts in, which sums its terms
  (each a row of the output gradient, scaled for `mean` and by the lookup's weight) and
  reads, updates and writes the one row of the weight and of the optimizer's state the run
  names; a run longer than a chunk is summed piece by piece into a workspace and stepped by
  the second launch. Every row is written by one program.
- `move_rows` (`row_moves.py`, `embcache::move_rows`): program i copies row `src_rows[i]`
  of each source table (the weight and each optimizer state) to row `dst_rows[i]` of its
  destination where `mask[i]`, and touches nothing where it is False.
- `scatter_masked` (`masked_scatter.py`, `embcache::scatter_masked`): program b reads block
  b of a list of (index, value, mask) and writes `dst[index]` for the entries whose mask is
  set, nothing else (the callers' set indices are distinct).
- `look_up` (`batch_lookup.py`, `embcache::lookup_counts` and `embcache::lookup_ranks`,
  after a sort): program b takes block b of the batch's sorted ids and of its original
  order; each entry of the results is written by one program.
"""
from .resolve import CHOICES, resolve_kernels

__all__ = ["CHOICES", "LAUNCHES", "resolve_kernels", "pooled_lookup"]

# the ops above that launch more than one kernel, and how many (an op count counts launches)
LAUNCHES = {"fused_row_update": 2}


def __getattr__(name):
    """`pooled_lookup` on first use: importing it imports Triton and registers the op."""
    if name == "pooled_lookup":
        from .pooled import pooled_lookup

        return pooled_lookup
    raise AttributeError(f"module 'embcache.kernels' has no attribute {name!r}")
