"""Rows between the host store and the device bookkeeper's working table, moved by device
kernels through the device's view of the pinned store (`unified_view`): no host thread,
no staging copy, no count handed back to the host.

Every move is a fixed-size list (sized by the batch, not by how many rows it turns out to
need) with a mask. With the Triton kernel (`kernels.row_moves`: on CUDA where it passes its
check, or where the cache runs `kernels="triton"`: Triton's interpreter on the CPU, `meta`)
one launch moves every table of the rows and skips a masked entry, so only the rows that
matter cross the link. In plain tensor ops (the CPU, where the view is the store itself;
`meta`; CUDA without Triton) a masked entry is sent to a spare row instead (the store's row
past its last, the working table's last row), so that one `index_copy_` per table serves
the whole list with no count.
"""
from __future__ import annotations

import logging

import torch

from embcache.cache.bookkeeping.fixed_size import pick
from embcache.cache.stores.host_store import HostStore
from embcache.cache.stores.unified_view import device_view
from embcache.kernels.resolve import _why_triton_is_missing

logger = logging.getLogger(__name__)


class HostLink:
    """Reads (host rows -> working rows) and writes (working rows -> host rows) of every
    table of `host` (the weight and each optimizer state), through views on `device`.

    `host` must have spare rows (`HostStore(spare_rows=1)`): the masked entries' target.
    `kernels`: "auto" (Triton's on CUDA when it imports and passes its check, else tensor
    ops), "triton" (Triton's: refused on CUDA if its check fails; elsewhere the caller has
    made sure it can run, `resolve_kernels`) or "tensor"."""

    def __init__(self, host: HostStore, device: torch.device, kernels: str = "auto"):
        padded = host.with_spare()
        self.names = list(padded)  # "weight", "optimizer.<k>"
        self.host = padded
        self.views = {name: device_view(t, device) for name, t in padded.items()}
        self.spare_row = host.weight.shape[0]
        self.triton = False
        if kernels not in ("auto", "triton", "tensor"):
            raise ValueError(f"kernels must be auto, triton or tensor, got {kernels!r}")
        cuda = torch.device(device).type == "cuda"
        if kernels == "triton" and not cuda:
            self.triton = True
        elif kernels != "tensor" and cuda:
            self.triton = _why_triton_is_missing() is None and self.self_check(device)
            if kernels == "triton" and not self.triton:
                raise RuntimeError("the Triton row kernel failed its check on this device")

    def self_check(self, device) -> bool:
        """Move a row of every table both ways with the Triton kernel and compare (the spare
        row is the scratch: nothing of the table changes)."""
        try:
            spare = torch.tensor([self.spare_row], device=device)
            zero, one = torch.zeros_like(spare), torch.ones(1, dtype=torch.bool, device=device)
            probes = [torch.arange(t.shape[1], dtype=torch.float32, device=device).to(t.dtype).view(1, -1)
                      for t in self.views.values()]
            views = list(self.views.values())
            self._move(probes, views, zero, spare, one)
            back = [torch.empty_like(p) for p in probes]
            self._move(views, back, spare, zero, one)
            skipped = [torch.full_like(p, -1) for p in probes]
            self._move(views, skipped, spare, zero, ~one)
            torch.cuda.synchronize(device)
            for name, host, probe, b, k in zip(self.names, self.host.values(), probes, back, skipped):
                if not (torch.equal(b, probe) and torch.equal(host[self.spare_row:].to(device), probe)
                        and bool((k == -1).all())):
                    raise RuntimeError(f"{name}: rows moved wrong")
            return True
        except Exception as err:  # noqa: BLE001 - any failure means: use the tensor ops
            logger.warning(f"the Triton row kernel is not used ({type(err).__name__}: {err}); rows move by "
                           f"tensor ops, every masked entry through the spare row")
            return False

    @staticmethod
    def _move(srcs, dsts, src_rows, dst_rows, mask) -> None:
        from embcache.kernels.row_moves import move_rows  # Triton: imported only when used

        move_rows(srcs, dsts, src_rows, dst_rows, mask)

    def host_rows(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return pick(mask, ids, self.spare_row)

    def read(self, ids: torch.Tensor, rows: torch.Tensor, mask: torch.Tensor, work: dict[str, torch.Tensor],
             trash_row: int) -> None:
        """`work[name][rows[i]] = host[name][ids[i]]` where `mask[i]`."""
        if self.triton:
            self._move(list(self.views.values()), [work[k] for k in self.views], ids, rows, mask)
            return
        src, dst = self.host_rows(ids, mask), pick(mask, rows, trash_row)
        for name, view in self.views.items():
            work[name].index_copy_(0, dst, view.index_select(0, src))

    def read_new(self, ids: torch.Tensor, mask: torch.Tensor, names=("weight",)) -> dict[str, torch.Tensor]:
        """New device tensors holding host rows `ids` where `mask` (rows elsewhere not read:
        zeros with the Triton kernel, the spare row's with tensor ops)."""
        if self.triton:
            out = {name: torch.zeros((ids.numel(), self.views[name].shape[1]), dtype=self.views[name].dtype,
                                     device=ids.device) for name in names}
            self._move([self.views[k] for k in names], list(out.values()), ids,
                       torch.arange(ids.numel(), device=ids.device), mask)
            return out
        src = self.host_rows(ids, mask)
        return {name: self.views[name].index_select(0, src) for name in names}

    def write(self, ids: torch.Tensor, rows: torch.Tensor, mask: torch.Tensor, work: dict[str, torch.Tensor],
              trash_row: int) -> None:
        """`host[name][ids[i]] = work[name][rows[i]]` where `mask[i]`."""
        if self.triton:
            self._move([work[k] for k in self.views], list(self.views.values()), rows, ids, mask)
            return
        dst, src = self.host_rows(ids, mask), pick(mask, rows, trash_row)
        for name, view in self.views.items():
            view.index_copy_(0, dst, work[name].index_select(0, src))
