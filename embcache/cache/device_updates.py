"""The device bookkeeper's optimizer step: a batch's gradient terms summed in torch's order in
fixed sizes (one entry per lookup, the first of each row's entries holding the row's sum),
the cache's rows and the batch's overflow rows updated in one call, the overflow rows then
written back to the host store by the device. `DeviceUpdates` is a part of
`device_cache.DeviceRowCache`."""
from __future__ import annotations

import torch

from .fixed_size import pick, summed_in_torch_order
from .lookup import Lookup
from .optimizers import update_rows
from .row_updates import table_sums


class DeviceUpdates:
    """`DeviceRowCache`'s optimizer step (see the module docstring)."""

    def apply_gradient(self, grad: torch.Tensor, lookup: Lookup) -> None:
        """`apply_rows` for a sparse gradient over the working table."""
        self.apply_rows(grad._indices()[0], grad._values(), grad.size(0), lookup)

    def apply_bag_gradient(self, grad_out: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor,
                           weights: torch.Tensor | None, mode: str, width: int, lookup: Lookup) -> None:
        """`apply_rows` for an embedding bag's output gradient over the working table (of
        `width` rows) read through `indices` / `offsets` / `weights` in `mode`."""
        self.apply_rows(indices, lookup_terms(grad_out, indices, offsets, weights, mode), width, lookup)

    def apply_rows(self, rows: torch.Tensor, values: torch.Tensor, width: int, lookup: Lookup) -> None:
        """One optimizer step from per-lookup gradient terms (`rows` of a working table of
        `width` rows, as a sparse embedding-bag gradient has them) over the working table:
        the cache's rows and the batch's overflow rows in one call. The overflow rows then
        go back to the host store (and into the cache, where a prefetch admitted one
        meanwhile)."""
        self._wait_for_prefetch()
        self.step += 1
        rows, values = self._gradient_rows(rows, values.to(torch.float32), width, lookup)
        work = self._work
        update_rows(self.optimizer, work["weight"], self.state_of_work(), rows, values, self.step,
                    self._work_ids, self.rounding, distinct=self.optimizer.needs_coalesced, fixed_size=True)
        s = lookup.scratch
        if s is not None:
            trash = self._trash_row()
            self.link.write(s.ids, s.rows, s.mask, work, trash)
            self._count(bytes_d2h=s.mask.sum() * self._row_bytes)
            slot = self._pad["id_to_slot"].index_select(0, pick(s.mask, s.ids, self.num_rows))
            now = s.mask & (slot >= 0)
            target, source = pick(now, slot, trash), pick(now, s.rows, trash)
            for t in work.values():
                t.index_copy_(0, target, t.index_select(0, source))
            self._pad["dirty"].index_fill_(0, pick(now, slot, self.num_slots), True)
        self.dirty.logical_or_(lookup.held)
        self.release(lookup)

    def _gradient_rows(self, rows: torch.Tensor, values: torch.Tensor, width: int,
                       lookup: Lookup) -> tuple[torch.Tensor, torch.Tensor]:
        """`RowCache._in_torch_order` in fixed sizes: a coalesced gradient keeps one entry
        per lookup, the first of each row's entries holding the row's sum (summed as torch's
        `coalesce` sums it: `summed_in_torch_order`), the others pointing at the trash row
        with nothing to add."""
        coalesce = self.optimizer.needs_coalesced
        multi_feature = lookup.segments is not None and any(len(t) > 1 for t in lookup.segments)
        if not coalesce and not multi_feature:
            return rows, values
        keys = lookup.ids * width + rows
        size = (self.num_rows * width, self.dim)
        tables = [[keys.numel()]] if lookup.segments is None else lookup.segments
        if self.device.type != "cpu" and not multi_feature:
            # keys of different tables differ (their ids do): one stable sum over them all is
            # each table's (the CPU's unstable sort orders ties by the array it sorts: per table)
            keys, values = summed_in_torch_order(keys, values, stable=True)
            return pick(keys >= 0, keys % width, self._trash_row()), values
        keys, values = table_sums(keys, values, tables, size, summed_in_torch_order if coalesce else None)
        return pick(keys >= 0, keys % width, self._trash_row()), values

    def state_of_work(self) -> dict[str, torch.Tensor]:
        """The optimizer state of every working row, by the optimizer's names."""
        return {k[len("optimizer."):]: v for k, v in self._work.items() if k != "weight"}


def lookup_terms(grad_out: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor,
                 weights: torch.Tensor | None, mode: str) -> torch.Tensor:
    """Each lookup's term of an embedding bag's gradient, `[L, D]`, computed as torch's
    sparse backward computes its values: the bag's output gradient (times 1 / the bag's
    size for "mean"; times the lookup's weight), in fixed-size ops."""
    n = indices.numel()
    offset2bag = torch.zeros(n + 1, dtype=torch.long, device=indices.device)
    offset2bag.index_add_(0, offsets, torch.ones_like(offsets))
    offset2bag[0] -= 1
    offset2bag = offset2bag.cumsum(0)[:n]
    terms = grad_out.index_select(0, offset2bag)
    if mode == "mean":
        ends = torch.cat([offsets[1:], offsets.new_full((1,), n)])
        inverse = (1 / (ends - offsets).to(terms.dtype)).unsqueeze(1).index_select(0, offset2bag)
        terms *= inverse
    if weights is not None:
        terms.mul_(weights.unsqueeze(1))
    return terms
