"""The machine operations numba does not offer on the CPU, in one module that HEAT's kernels
and the cache's compiled admission both import (it imports neither).

- `prefetch_row(arr, row)` / `prefetch_entry(arr, i)`: ask the CPU to start loading a table
  row (or one entry's cache line) now, because it will be read a few samples (lookups) from
  now. At K=64 on a table of a few MB, a HEAT sample spends about as long waiting for its user
  and positive rows (random reads that miss the private caches) as on its 64 negatives, and
  the order of the samples is known ahead; an out-of-order core cannot reach that far ahead by
  itself (a sample is about a thousand dependent instructions). LLVM's `llvm.prefetch` (read,
  keep in all cache levels, data cache) compiles to `prefetcht0` on x86. A prefetch never
  changes a result.
- `atomic_min(arr, i, v)`: `arr[i] = min(arr[i], v)` as one atomic instruction, so that
  threads racing on one entry leave the smallest value whatever their order (how the cache's
  parallel lookup finds, without a lock, the first chunk of lookups holding a slot).
"""
from __future__ import annotations

from llvmlite import ir
from numba import config, njit, types
from numba.core import cgutils
from numba.extending import intrinsic

LINE_FLOATS = 16  # float32 values in a 64-byte cache line


def element_pointer(context, builder, aryty, ary_value, index_values, index_types):
    """LLVM code for the address of one array element (no bounds check): what an intrinsic
    that acts on memory needs."""
    ary = context.make_array(aryty)(context, builder, ary_value)
    inds = [context.cast(builder, v, t, types.intp) for v, t in zip(index_values, index_types)]
    return cgutils.get_item_pointer2(context, builder, data=ary.data, shape=cgutils.unpack_tuple(builder, ary.shape),
                                     strides=cgutils.unpack_tuple(builder, ary.strides), layout=aryty.layout,
                                     inds=inds, wraparound=False)


def emit_prefetch(builder, ptr) -> None:
    """LLVM code asking the CPU to load the cache line at `ptr`: read (0), keep in every
    cache level (3), data (1)."""
    i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
                                        "llvm.prefetch.p0")
    builder.call(fn, [builder.bitcast(ptr, i8p), i32(0), i32(3), i32(1)])


@intrinsic
def _prefetch_element(typingctx, arr, row, col):
    """Start loading the cache line that holds `arr[row, col]` (2-D array, no bounds check)."""
    if not isinstance(arr, types.Array) or arr.ndim != 2:
        return None
    sig = types.void(arr, row, col)

    def codegen(context, builder, signature, args):
        emit_prefetch(builder, element_pointer(context, builder, signature.args[0], args[0], args[1:],
                                               signature.args[1:]))
        return context.get_dummy_value()

    return sig, codegen


@njit(nogil=True, cache=True)
def prefetch_row(arr, row):
    """Start loading every cache line of row `row` of the 2-D float32 table `arr`."""
    for col in range(0, arr.shape[1], LINE_FLOATS):
        _prefetch_element(arr, row, col)


if config.DISABLE_JIT:  # the kernels run as plain Python (a test does): an intrinsic cannot
    def prefetch_row(arr, row):  # noqa: F811
        """Nothing to ask of the CPU from Python."""


@intrinsic
def atomic_min(typingctx, arr, idx, val):
    if not isinstance(arr, types.Array) or arr.ndim != 1 or arr.dtype != types.int32:
        return None
    sig = types.void(arr, idx, val)

    def codegen(context, builder, signature, args):
        ptr = element_pointer(context, builder, signature.args[0], args[0], [args[1]], [signature.args[1]])
        v = context.cast(builder, args[2], signature.args[2], types.int32)
        builder.atomic_rmw("min", ptr, v, "monotonic")
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def prefetch_entry(typingctx, arr, idx):
    if not isinstance(arr, types.Array) or arr.ndim != 1:
        return None
    sig = types.void(arr, idx)

    def codegen(context, builder, signature, args):
        emit_prefetch(builder, element_pointer(context, builder, signature.args[0], args[0], [args[1]],
                                               [signature.args[1]]))
        return context.get_dummy_value()

    return sig, codegen
