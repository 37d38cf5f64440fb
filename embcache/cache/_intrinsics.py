"""Two machine operations numba does not offer on the CPU, for the compiled admission.

- `atomic_min(arr, i, v)`: `arr[i] = min(arr[i], v)` as one atomic instruction, so that
  threads racing on one entry leave the smallest value whatever their order (how the
  parallel lookup finds, without a lock, the first chunk of lookups holding a slot).
- `prefetch_entry(arr, i)`: ask the CPU to start loading `arr[i]`'s cache line now, since
  it is read a few dozen lookups later (LLVM's `llvm.prefetch`: read, keep in every cache
  level; `prefetcht0` on x86). It never changes a result.
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic


def _entry_pointer(context, builder, aryty, ary_value, index_value, index_type):
    ary = context.make_array(aryty)(context, builder, ary_value)
    i = context.cast(builder, index_value, index_type, types.intp)
    return cgutils.get_item_pointer2(context, builder, data=ary.data, shape=cgutils.unpack_tuple(builder, ary.shape),
                                     strides=cgutils.unpack_tuple(builder, ary.strides), layout=aryty.layout,
                                     inds=[i], wraparound=False)


@intrinsic
def atomic_min(typingctx, arr, idx, val):
    if not isinstance(arr, types.Array) or arr.ndim != 1 or arr.dtype != types.int32:
        return None
    sig = types.void(arr, idx, val)

    def codegen(context, builder, signature, args):
        ptr = _entry_pointer(context, builder, signature.args[0], args[0], args[1], signature.args[1])
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
        ptr = _entry_pointer(context, builder, signature.args[0], args[0], args[1], signature.args[1])
        i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
                                            "llvm.prefetch.p0")
        builder.call(fn, [builder.bitcast(ptr, i8p), i32(0), i32(3), i32(1)])
        return context.get_dummy_value()

    return sig, codegen
