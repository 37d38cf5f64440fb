"""Two machine operations numba does not offer on the CPU, for the compiled admission.

- `atomic_min(arr, i, v)`: `arr[i] = min(arr[i], v)` as one atomic instruction, so that
  threads racing on one entry leave the smallest value whatever their order (how the
  parallel lookup finds, without a lock, the first chunk of lookups holding a slot).
- `prefetch_entry(arr, i)`: ask the CPU to start loading `arr[i]`'s cache line now, since
  it is read a few dozen lookups later (LLVM's `llvm.prefetch`: read, keep in every cache
  level; `prefetcht0` on x86). It never changes a result.
"""
from __future__ import annotations

from numba import types
from numba.extending import intrinsic

# the element address and the prefetch instruction are HEAT's (its kernels prefetch rows)
from cpu_kernels._prefetch import element_pointer, emit_prefetch


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
