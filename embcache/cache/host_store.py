"""The full table and its optimizer state in host memory, in id order, always.

When CUDA is present the tensors are pinned (page-locked host memory, in torch's words)
so that rows gathered for the device can be copied asynchronously; on a CPU-only machine
they are ordinary tensors. (Not to be confused with a slot *held* in the device cache by
a batch in flight, which only keeps it from eviction.)
"""
from __future__ import annotations

import torch


class HostStore:
    """Host-resident weights `[N, D]` plus per-row state tables `{name: [N, w]}`.

    Args:
        weight: the initial table (id order); taken over, not copied, unless pinning.
        state: optimizer state tables with N rows each.
        pin: page-lock the memory (`pin_memory`; only meaningful with CUDA).
    """

    def __init__(self, weight: torch.Tensor, state: dict[str, torch.Tensor], pin: bool = False):
        self.weight = weight.pin_memory() if pin and not weight.is_pinned() else weight
        self.state = {k: (v.pin_memory() if pin and not v.is_pinned() else v) for k, v in state.items()}
        self.pinned = pin

    def row_bytes(self) -> int:
        """Bytes one row occupies with its state: what moving it costs."""
        per = self.weight.shape[1] * self.weight.element_size()
        return per + sum(t.shape[1] * t.element_size() for t in self.state.values())

    def gather(self, ids: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Copies of rows `ids` (host tensors, pinned when the store is)."""
        ids = ids.cpu()
        return (self._take(self.weight, ids),
                {k: self._take(v, ids) for k, v in self.state.items()})

    def _take(self, table: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        if not self.pinned:
            return table.index_select(0, ids)
        out = torch.empty((ids.numel(), table.shape[1]), dtype=table.dtype, pin_memory=True)
        return torch.index_select(table, 0, ids, out=out)

    def scatter(self, ids: torch.Tensor, weight: torch.Tensor, state: dict[str, torch.Tensor]) -> None:
        """Write rows back (from any device; a device->host copy when needed)."""
        ids = ids.cpu()
        self.weight.index_copy_(0, ids, weight.to("cpu"))
        for k, v in state.items():
            self.state[k].index_copy_(0, ids, v.to("cpu"))
