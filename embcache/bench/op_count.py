"""How many tensor operations a piece of work issues that launch a kernel on a device: on a
GPU the host's share of a device-bookkept step is issuing them (~5-10 us each), so their
count, not their arithmetic, is what the host costs.

Counted with a dispatch mode over every aten operation on a tensor of the given device
type; views and aliases (which launch nothing) and operations on host tensors are left
out. Run the work with its device tensors on `meta` and nothing is computed at all: the
count (and the host's time, an upper bound, since some meta kernels are slow Python) is
what remains. One of the project's own kernels (`embcache.kernels`) dispatches as one op but
may launch more than one kernel: it counts as the launches it makes (`kernels.LAUNCHES`).
"""
from __future__ import annotations

from collections import Counter

import torch
from embcache.kernels import LAUNCHES
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

# operations that only describe or alias a tensor: no kernel runs
_NO_LAUNCH = {"detach", "alias", "view", "_unsafe_view", "reshape", "expand", "slice", "select", "unsqueeze",
              "squeeze", "t", "transpose", "permute", "as_strided", "lift_fresh", "_reshape_alias", "unbind",
              "split", "split_with_sizes", "chunk", "narrow", "sym_size", "sym_stride", "sym_numel",
              "sym_storage_offset", "is_same_size", "_to_copy_meta_noop", "empty", "empty_strided",
              "new_empty", "new_empty_strided", "_indices", "_values", "indices", "values", "_nnz",
              "_coalesced_", "is_coalesced", "dense_dim", "sparse_dim", "set_"}


class OpCounter(TorchDispatchMode):
    """Counts, by name, the aten operations that touch a tensor on `device_type`."""

    def __init__(self, device_type: str = "meta"):
        super().__init__()
        self.device_type = device_type
        self.ops: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        # a composite operation runs as the operations it is made of (each counted here),
        # as it does outside the mode; on meta its own kernel would only fake a result
        if func is torch.ops.aten._embedding_bag_backward.default and args[9]:  # sparse: what the CPU and CUDA
            # kernels run (the meta kernel, reached from inside a mode, fakes an empty gradient)
            grad, indices, offsets, offset2bag, bag_size, _, num_weights, by_freq, mode, _, *rest = args
            return torch.ops.aten._embedding_bag_sparse_backward(grad, indices, offsets, offset2bag, bag_size,
                                                                 num_weights, by_freq, mode, *rest)
        if torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd"):
            out = func.decompose(*args, **kwargs)
            if out is not NotImplemented:
                return out
        name = func.overloadpacket.__name__
        out = func(*args, **kwargs)
        if name not in _NO_LAUNCH and not func.is_view:
            flat, _ = tree_flatten((args, kwargs, out))  # a factory (full, arange) has its tensor in the output
            if any(isinstance(a, torch.Tensor) and a.device.type == self.device_type for a in flat):
                self.ops[name] += LAUNCHES.get(name, 1)
        return out

    @property
    def total(self) -> int:
        return sum(self.ops.values())


def count_ops(fn, device_type: str = "meta") -> OpCounter:
    """Run `fn()` under an `OpCounter`; returns it (`.total`, `.ops` by name)."""
    counter = OpCounter(device_type)
    with counter:
        fn()
    return counter
