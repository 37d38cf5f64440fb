"""Rows between the host store and the device bookkeeper's working table, moved by device
kernels through the device's view of the pinned store (`unified_view`): no host thread,
no staging copy, no count handed back to the host.

Every move is a fixed-size list (sized by the batch, not by how many rows it turns out to
need) with a mask: an entry whose mask is False moves nothing that matters. In plain tensor
ops such an entry is sent to a spare row (the store's row past its last, the working table's
last row), so that one `index_copy_` serves the whole list with no count; that is also how
the CPU, where the view is the store itself, runs it.
"""
from __future__ import annotations

import torch

from .fixed_size import pick
from .host_store import HostStore
from .unified_view import device_view


class HostLink:
    """Reads (host rows -> working rows) and writes (working rows -> host rows) of every
    table of `host` (the weight and each optimizer state), through views on `device`.

    `host` must have spare rows (`HostStore(spare_rows=1)`): the masked entries' target."""

    def __init__(self, host: HostStore, device: torch.device):
        padded = host.with_spare()
        self.names = list(padded)  # "weight", "optimizer.<k>"
        self.views = {name: device_view(t, device) for name, t in padded.items()}
        self.spare_row = host.weight.shape[0]

    def host_rows(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return pick(mask, ids, self.spare_row)

    def read(self, ids: torch.Tensor, rows: torch.Tensor, mask: torch.Tensor, work: dict[str, torch.Tensor],
             trash_row: int) -> None:
        """`work[name][rows[i]] = host[name][ids[i]]` where `mask[i]`."""
        src, dst = self.host_rows(ids, mask), pick(mask, rows, trash_row)
        for name, view in self.views.items():
            work[name].index_copy_(0, dst, view.index_select(0, src))

    def read_new(self, ids: torch.Tensor, mask: torch.Tensor, names=("weight",)) -> dict[str, torch.Tensor]:
        """New device tensors holding host rows `ids` where `mask` (the spare row elsewhere)."""
        src = self.host_rows(ids, mask)
        return {name: self.views[name].index_select(0, src) for name in names}

    def write(self, ids: torch.Tensor, rows: torch.Tensor, mask: torch.Tensor, work: dict[str, torch.Tensor],
              trash_row: int) -> None:
        """`host[name][ids[i]] = work[name][rows[i]]` where `mask[i]`."""
        dst, src = self.host_rows(ids, mask), pick(mask, rows, trash_row)
        for name, view in self.views.items():
            view.index_copy_(0, dst, work[name].index_select(0, src))
