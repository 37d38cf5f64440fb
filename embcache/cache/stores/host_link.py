"""Rows between the host store and the device bookkeeper's working table, moved by device
kernels through the device's view of the pinned store (`unified_view`): no host thread,
no staging copy, no count handed back to the host.

Every move is a fixed-size list (sized by the batch, not by how many rows it turns out to
need) with a mask. On CUDA a Triton kernel skips a masked entry (`link_kernels`), so only the
rows that matter cross the link. In plain tensor ops (the CPU, where the view is the store
itself; `meta`; CUDA without Triton) a masked entry is sent to a spare row instead (the
store's row past its last, the working table's last row), so that one `index_copy_` serves
the whole list with no count.
"""
from __future__ import annotations

import logging

import torch

from embcache.cache.stores import link_kernels
from embcache.cache.bookkeeping.fixed_size import pick
from embcache.cache.stores.host_store import HostStore
from embcache.cache.stores.unified_view import device_view

logger = logging.getLogger(__name__)


class HostLink:
    """Reads (host rows -> working rows) and writes (working rows -> host rows) of every
    table of `host` (the weight and each optimizer state), through views on `device`.

    `host` must have spare rows (`HostStore(spare_rows=1)`): the masked entries' target.
    `kernels`: "auto" (Triton's on CUDA when it passes its check, else tensor ops),
    "triton" or "tensor"."""

    def __init__(self, host: HostStore, device: torch.device, kernels: str = "auto"):
        padded = host.with_spare()
        self.names = list(padded)  # "weight", "optimizer.<k>"
        self.host = padded
        self.views = {name: device_view(t, device) for name, t in padded.items()}
        self.spare_row = host.weight.shape[0]
        self.triton = False
        if kernels not in ("auto", "triton", "tensor"):
            raise ValueError(f"kernels must be auto, triton or tensor, got {kernels!r}")
        if kernels != "tensor" and torch.device(device).type == "cuda" and link_kernels.available():
            self.triton = self.self_check(device)
            if kernels == "triton" and not self.triton:
                raise RuntimeError("the Triton row kernels failed their check on this device")

    def self_check(self, device) -> bool:
        """Move a few rows both ways with the Triton kernel and compare with the tensor ops
        (the spare row is the scratch: nothing of the table changes)."""
        try:
            for name, host in self.host.items():
                spare = torch.tensor([self.spare_row], device=device)
                probe = torch.arange(host.shape[1], dtype=torch.float32, device=device).to(host.dtype).view(1, -1)
                mask = torch.ones(1, dtype=torch.bool, device=device)
                link_kernels.move_rows(probe, torch.zeros_like(spare), host, spare, mask)
                back = torch.empty_like(probe)
                link_kernels.move_rows(host, spare, back, torch.zeros_like(spare), mask)
                skipped = torch.full_like(probe, -1)
                link_kernels.move_rows(host, spare, skipped, torch.zeros_like(spare), ~mask)
                torch.cuda.synchronize(device)
                if not (torch.equal(back, probe) and torch.equal(host[self.spare_row:].to(device), probe)
                        and bool((skipped == -1).all())):
                    raise RuntimeError(f"{name}: rows moved wrong")
            return True
        except Exception as err:  # noqa: BLE001 - any failure means: use the tensor ops
            logger.warning(f"the Triton row kernels are not used ({type(err).__name__}: {err}); rows move by "
                           f"tensor ops, every masked entry through the spare row")
            return False

    def host_rows(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return pick(mask, ids, self.spare_row)

    def read(self, ids: torch.Tensor, rows: torch.Tensor, mask: torch.Tensor, work: dict[str, torch.Tensor],
             trash_row: int) -> None:
        """`work[name][rows[i]] = host[name][ids[i]]` where `mask[i]`."""
        if self.triton:
            for name, host in self.host.items():
                link_kernels.move_rows(host, ids, work[name], rows, mask)
            return
        src, dst = self.host_rows(ids, mask), pick(mask, rows, trash_row)
        for name, view in self.views.items():
            work[name].index_copy_(0, dst, view.index_select(0, src))

    def read_new(self, ids: torch.Tensor, mask: torch.Tensor, names=("weight",)) -> dict[str, torch.Tensor]:
        """New device tensors holding host rows `ids` where `mask` (rows elsewhere not read:
        zeros with the Triton kernel, the spare row's with tensor ops)."""
        if self.triton:
            out = {}
            for name in names:
                host = self.host[name]
                out[name] = torch.zeros((ids.numel(), host.shape[1]), dtype=host.dtype, device=ids.device)
                link_kernels.move_rows(host, ids, out[name], torch.arange(ids.numel(), device=ids.device), mask)
            return out
        src = self.host_rows(ids, mask)
        return {name: self.views[name].index_select(0, src) for name in names}

    def write(self, ids: torch.Tensor, rows: torch.Tensor, mask: torch.Tensor, work: dict[str, torch.Tensor],
              trash_row: int) -> None:
        """`host[name][ids[i]] = work[name][rows[i]]` where `mask[i]`."""
        if self.triton:
            for name, host in self.host.items():
                link_kernels.move_rows(work[name], rows, host, ids, mask)
            return
        dst, src = self.host_rows(ids, mask), pick(mask, rows, trash_row)
        for name, view in self.views.items():
            view.index_copy_(0, dst, work[name].index_select(0, src))
