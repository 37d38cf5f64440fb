"""Counting the operations that make the host wait for a CUDA device, on any device.

On CUDA, an operation whose result the host must read (a tensor's value as a Python
number), or whose output size depends on the data (nonzero, unique, coalesce, boolean
indexing), blocks the host until the device has caught up: a synchronisation. The same
operations run on the CPU too, so counting them there, under a dispatch mode that sees
every aten call, says how many a step would make on a GPU, with no GPU. The count is an
upper bound: an operation on a host tensor (the cache's bookkeeping) is counted although
it would not synchronise.
"""
import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

# output size or value depends on the data: the host must wait for it on CUDA
SYNCING = {aten._local_scalar_dense.default, aten.is_nonzero.default, aten.nonzero.default,
           aten.masked_select.default, aten._unique2.default, aten.unique_dim.default,
           aten.unique_consecutive.default, aten._coalesce.default, aten.equal.default,
           aten.bincount.default, aten.repeat_interleave.Tensor}
INDEXING = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default, aten._index_put_impl_.default}


def _bool_index(args) -> bool:
    indices = args[1] if len(args) > 1 else []
    return any(t is not None and t.dtype == torch.bool for t in indices)


def syncs(func, args, kwargs) -> str | None:
    """The name of what `func(*args, **kwargs)` makes the host wait for, or None."""
    if func in SYNCING and not (func is aten.repeat_interleave.Tensor and kwargs.get("output_size")):
        return str(func.overloadpacket.__name__)
    if func in INDEXING and _bool_index(args):
        return f"{func.overloadpacket.__name__}[bool]"
    return None


class SyncCounter(TorchDispatchMode):
    """`with SyncCounter() as c: ...` then `c.count` and `c.ops` (the names counted)."""

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    @property
    def count(self) -> int:
        return len(self.ops)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = syncs(func, args, kwargs)
        if name is not None:
            self.ops.append(name)
        return func(*args, **kwargs)
