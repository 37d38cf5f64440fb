"""The device bookkeeper's optimizer step: a batch's gradient terms summed in torch's order in
fixed sizes (one entry per lookup, the first of each row's entries holding the row's sum),
the cache's rows and the batch's overflow rows updated in one call, the overflow rows then
written back to the host store by the device. With `kernels = "triton"` the bag's backward
and the optimizer are one kernel (`embcache.kernels.fused_update`) over the same sort.
`DeviceUpdates` is a part of `device_cache.DeviceRowCache`."""
from __future__ import annotations

import torch

from embcache.cache.bookkeeping.fixed_size import pick, summed_in_torch_order, write_where
from embcache.cache.bookkeeping.lookup import Lookup
from embcache.cache.optimizers import update_rows
from embcache.cache.bookkeeping.row_updates import table_sums


class DeviceUpdates:
    """`DeviceRowCache`'s optimizer step (see the module docstring)."""

    kernels = "torch"  # or "triton": the fused backward + optimizer (`RowCache` sets it)

    def apply_gradient(self, grad: torch.Tensor, lookup: Lookup) -> None:
        """`apply_rows` for a sparse gradient over the working table."""
        self.apply_rows(grad._indices()[0], grad._values(), grad.size(0), lookup)

    def apply_bag_gradient(self, grad_out: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor,
                           weights: torch.Tensor | None, mode: str, width: int, lookup: Lookup) -> None:
        """`apply_rows` for an embedding bag's output gradient over the working table (of
        `width` rows) read through `indices` / `offsets` / `weights` in `mode`, by Triton's
        kernel where chosen (every optimizer, row type and rounding)."""
        if self.kernels == "triton":
            self.wait_for_prefetches()
            self.step += 1
            self._fused_update(grad_out.to(torch.float32), indices, offsets, weights, mode, width, lookup)
            self._after_update(lookup)
            return
        self.apply_rows(indices, lookup_terms(grad_out, indices, offsets, weights, mode), width, lookup)

    def set_pads_aside(self, lookup: Lookup, offsets: torch.Tensor, samples: int, padded: int) -> None:
        """Point a padded batch's pad lookups (the last `padded` of each feature's `samples`
        bags: `nn.fixed_capacity.pad_features`) at the trash row and their ids at the last
        id, once the cache has decided the batch (they repeat ids the batch has, so it decides
        as for the unpadded batch). Their terms (zero: their bags' output is dropped) then
        sort after every real one, in a run of their own, and every real row's run of terms
        sits where it sits in the unpadded batch. Why it matters: the fused kernel cuts the
        sorted terms into chunks at fixed positions, and a run longer than a chunk is summed
        piece by piece; a pad that joined a real row's run, or shifted the runs after it,
        would change those pieces and the sum's rounding."""
        bag, _ = lookup_bags(lookup.indices, offsets, "sum")
        real = bag % samples < samples - padded
        lookup.indices = pick(real, lookup.indices, self._trash_row())
        if lookup.ids is not None:
            lookup.ids = pick(real, lookup.ids, self.num_rows - 1)

    def _fused_update(self, grad_out: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor,
                      weights: torch.Tensor | None, mode: str, width: int, lookup: Lookup) -> None:
        """`apply_rows`'s update by `fused_row_update`, its terms summed in the order
        `_gradient_rows` sums them: the same sort of the same keys. Tables read by several
        features are summed by torch first (autograd's sparse `+` of the features, whose
        merge order a sort cannot give), and the kernel then takes those sums as its terms,
        one a row (trash entries and SGD's repeated rows grouped by a stable sort of rows)."""
        from embcache.kernels.fused_update import (  # Triton: only when chosen
            fused_row_update, optimizer_factors, state_tensors)

        multi_feature = lookup.segments is not None and any(len(t) > 1 for t in lookup.segments)
        if multi_feature:
            rows, grad_out = self._gradient_rows(indices, lookup_terms(grad_out, indices, offsets, weights, mode),
                                                 width, lookup)
            keys, order = rows.sort(stable=True)
            bags, scale, weights = torch.arange(rows.numel(), device=rows.device), None, None
        else:
            rows = indices
            bags, scale = lookup_bags(indices, offsets, mode)
            keys, order = self._sort_order(indices, width, lookup)
        weight, state = self._work["weight"], self.state_of_work()
        step, rounding_step = self._device_steps()
        fused_row_update(weight, *state_tensors(state, weight), keys, order, rows, bags, grad_out, scale, weights,
                         **optimizer_factors(self.optimizer, step), row_ids=self._work_ids,
                         salt_tensor=None if rounding_step is None else self.rounding.salt_of(rounding_step))

    def _device_steps(self) -> tuple[int | torch.Tensor, torch.Tensor | None]:
        """The step count as the update reads it, and as stochastic rounding's hash of half
        rows reads it (None: float32 rows, or rounding to nearest). Where either reads it
        (Adam's step size; the hash) it is the count on the device (`fixed_size.DeviceCount`,
        one op a step), so that a replayed step reads its own step, not the capture's."""
        rounding = self.rounding.mode == "stochastic" and self._work["weight"].dtype != torch.float32
        if not rounding and self.optimizer.name != "adam":
            return self.step, None
        on_device = self._step_count.follow(self.step)
        return (on_device if self.optimizer.name == "adam" else self.step), (on_device if rounding else None)

    def _sort_order(self, rows: torch.Tensor, width: int, lookup: Lookup) -> tuple[torch.Tensor, torch.Tensor]:
        """(sorted keys, permutation) of the lookups, the sort `_gradient_rows` makes: SGD's
        terms keep lookup order (a stable sort of rows); the others sort `id * width + row`,
        stably off the CPU, per table on it (its unstable sort orders ties by the array)."""
        if not self.optimizer.needs_coalesced:
            return rows.sort(stable=True)
        keys = lookup.ids * width + rows
        if self.device.type != "cpu":
            return keys.sort(stable=True, dim=0)
        tables = [sum(t) for t in lookup.segments] if lookup.segments is not None else [keys.numel()]
        parts, orders, start = [], [], 0
        for k in keys.split(tables):
            if k.numel():
                sorted_keys, order = k.sort(0)
                parts.append(sorted_keys)
                orders.append(order + start)
            start += k.numel()
        if len(parts) == 1:
            return parts[0], orders[0]
        return torch.cat(parts), torch.cat(orders)

    def apply_rows(self, rows: torch.Tensor, values: torch.Tensor, width: int, lookup: Lookup) -> None:
        """One optimizer step from per-lookup gradient terms (`rows` of a working table of
        `width` rows, as a sparse embedding-bag gradient has them) over the working table:
        the cache's rows and the batch's overflow rows in one call. The overflow rows then
        go back to the host store (and into the cache, where a prefetch admitted one
        meanwhile)."""
        self.wait_for_prefetches()
        self.step += 1
        rows, values = self._gradient_rows(rows, values.to(torch.float32), width, lookup)
        work, (step, rounding_step) = self._work, self._device_steps()
        update_rows(self.optimizer, work["weight"], self.state_of_work(), rows, values, step,
                    self._work_ids, self.rounding, distinct=self.optimizer.needs_coalesced, fixed_size=True,
                    rounding_step=rounding_step)
        self._after_update(lookup)

    def _after_update(self, lookup: Lookup) -> None:
        """What follows the update: the overflow rows written back to the host store (and
        into the cache, where a prefetch admitted one meanwhile), the rows marked dirty, the
        batch's holds released."""
        work = self._work
        s = lookup.scratch
        if s is not None:
            trash = self._trash_row()
            self.link.write(s.ids, s.rows, s.mask, work, trash)
            self._count(bytes_d2h=s.mask.sum() * self._row_bytes)
            slot = self._pad["id_to_slot"].index_select(0, pick(s.mask, s.ids, self.num_rows))
            now = s.mask & (slot >= 0)
            target, source = pick(now, slot, trash), pick(now, s.rows, trash)
            if self.kernels == "triton":  # only the rows that matter: no copies into the trash row
                from embcache.kernels.row_moves import move_rows

                move_rows(list(work.values()), list(work.values()), source, target, now)
            else:
                for t in work.values():
                    t.index_copy_(0, target, t.index_select(0, source))
            write_where(self._pad["dirty"], pick(now, slot, self.num_slots), True, now, self.kernels)
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


def lookup_bags(indices: torch.Tensor, offsets: torch.Tensor, mode: str,
                dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Each lookup's bag, and ("mean") 1 / each bag's size in `dtype`: what `lookup_terms`
    multiplies by, made once for it and the fused kernel, so that their terms are alike."""
    n = indices.numel()
    # a lookup's bag: how many bags start at or before it, less one (empty bags start where the next does)
    offset2bag = torch.searchsorted(offsets, torch.arange(n, device=indices.device), right=True).sub_(1)
    if mode != "mean":
        return offset2bag, None
    ends = torch.cat([offsets[1:], offsets.new_full((1,), n)])
    return offset2bag, 1 / (ends - offsets).to(dtype)


def lookup_terms(grad_out: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor,
                 weights: torch.Tensor | None, mode: str) -> torch.Tensor:
    """Each lookup's term of an embedding bag's gradient, `[L, D]`, computed as torch's
    sparse backward computes its values: the bag's output gradient (times 1 / the bag's
    size for "mean"; times the lookup's weight), in fixed-size ops."""
    offset2bag, inverse = lookup_bags(indices, offsets, mode, grad_out.dtype)
    terms = grad_out.index_select(0, offset2bag)
    if inverse is not None:
        terms *= inverse.unsqueeze(1).index_select(0, offset2bag)
    if weights is not None:
        terms.mul_(weights.unsqueeze(1))
    return terms
