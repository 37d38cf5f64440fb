"""A batch's optimizer step in the row cache: the sparse gradient over the working table (the
cache's rows, then the batch's overflow rows) summed in torch's order for the uncached table,
then applied by the row-wise optimizer, so that training through the cache equals training
the whole table, to the bit (see `row_cache`). `RowUpdates` is a part of `RowCache`; it uses
the cache's rows, maps, transfers and statistics.
"""
from __future__ import annotations

import torch

from embcache.cache.bookkeeping.lookup import Lookup, Overflow
from embcache.cache.optimizers import update_rows


def table_sums(keys: torch.Tensor, values: torch.Tensor, tables: list[list[int]], size: tuple, total=None):
    """A gradient's terms (`keys` = id * working rows + row, one a lookup) table by table
    (`tables`: per table, its features' numbers of lookups), each table's features' terms
    added as autograd adds their sparse gradients (`+`), then summed per key by `total(keys,
    values)` where given (the caller's coalesce); the tables' results one after another."""
    key_parts, value_parts = [], []
    for features, k, v in zip(tables, keys.split([sum(t) for t in tables]), values.split([sum(t) for t in tables])):
        if k.numel() == 0:
            continue
        if len(features) > 1:
            per_feature = [torch.sparse_coo_tensor(fk.unsqueeze(0), fv, size, check_invariants=False)
                           for fk, fv in zip(k.split(features), v.split(features))]
            summed = per_feature[0]
            for more in per_feature[1:]:
                summed = summed + more
            k, v = summed._indices()[0], summed._values()
        if total is not None:
            k, v = total(k, v)
        key_parts.append(k)
        value_parts.append(v)
    if len(key_parts) == 1:
        return key_parts[0], value_parts[0]
    return torch.cat(key_parts), torch.cat(value_parts)


def coalesced(keys: torch.Tensor, values: torch.Tensor, size: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    """torch's `coalesce` of the terms (what it sums for an uncached table)."""
    summed = torch.sparse_coo_tensor(keys.unsqueeze(0), values, size, check_invariants=False).coalesce()
    return summed._indices()[0], summed._values()


class RowUpdates:
    """`RowCache`'s optimizer step (see the module docstring)."""

    def apply_gradient(self, grad: torch.Tensor, lookup: Lookup) -> None:
        """One optimizer step from a sparse gradient over the working table (the cache,
        then the batch's overflow rows), then release the batch's holds."""
        self.wait_for_prefetches()
        self.step += 1
        rows = self._apply_rows(grad, lookup)
        # the batch's held slots are exactly the cached rows it looked up
        self.dirty.index_fill_(0, lookup.held if lookup.held is not None else rows.to(self.book), True)
        self.release(lookup)

    def _apply_rows(self, grad: torch.Tensor, lookup: Lookup) -> torch.Tensor:
        """The update's arithmetic: the cached rows' (returns them) and the overflow
        rows', which are written back."""
        overflow = lookup.overflow
        # float32 gradients whatever the rows' type: the update computes in float32
        rows, values = self._in_torch_order(grad.to(torch.float32), lookup,
                                            coalesce=self.optimizer.needs_coalesced)
        if overflow is None:
            self._update(self.weight, self.state, rows, values, self._slot_ids())
        else:
            rows, values, out_rows, out_values = self._split_at_overflow(rows, values, lookup)
            self._update(self.weight, self.state, rows, values, self._slot_ids())
            self._update(overflow.weight, overflow.state, out_rows, out_values, overflow.device_ids)
            self.transfers.write(overflow.ids, overflow.weight, overflow.state)
            self.stats.bytes_d2h += overflow.ids.numel() * self._row_bytes
            self._refresh_admitted_overflow(overflow)
        return rows

    def _split_at_overflow(self, rows: torch.Tensor, values: torch.Tensor, lookup: Lookup):
        """(cache rows, their values, overflow rows, their values), each part in the order
        it had in `rows`. A boolean mask would make the device report the parts' sizes
        (a sync); the host knows them instead: a coalesced gradient has one entry per
        distinct row, so `overflow.ids` of them are overflow rows, and a per-lookup one has
        the overflow lookups counted when the indices were made. A stable sort by the
        side of the boundary then puts the parts one after the other, and slicing at a
        size known on the host asks the device nothing."""
        coalesced = self.optimizer.needs_coalesced
        outside = lookup.overflow.ids.numel() if coalesced else lookup.overflow_lookups
        if outside is None or (not coalesced and rows.numel() != lookup.indices.numel()):
            inside = rows < self.num_slots  # sizes unknown here: the mask (a sync on CUDA)
            return rows[inside], values[inside], rows[~inside] - self.num_slots, values[~inside]
        order = torch.sort((rows >= self.num_slots).to(torch.uint8), stable=True).indices
        rows, values = rows.index_select(0, order), values.index_select(0, order)
        cut = rows.numel() - outside
        return rows[:cut], values[:cut], rows[cut:] - self.num_slots, values[cut:]

    def _update(self, weight: torch.Tensor, state: dict, rows: torch.Tensor, values: torch.Tensor,
                row_ids: torch.Tensor) -> None:
        """The optimizer step on rows of `weight` (whose ids are `row_ids`): in place for
        float32 rows, else on float32 copies rounded on write (`update_rows`)."""
        update_rows(self.optimizer, weight, state, rows, values, self.step, row_ids, self.rounding)

    def working_table(self) -> torch.Tensor:
        """The rows a lookup's indices point into: the cache's (the device bookkeeper's
        also has rows for a batch's overflow after them)."""
        return self.weight

    def _slot_ids(self) -> torch.Tensor:
        """Each slot's id, beside the rows: only half-precision rows read it (their
        stochastic rounding hashes the id), so float32 rows never pay for the copy."""
        if self.book == self.device or self.weight.dtype == torch.float32:
            return self.slots.slot_to_id
        return self.transfers.to_device(self.slots.slot_to_id)

    def _in_torch_order(self, grad: torch.Tensor, lookup: Lookup, coalesce: bool):
        """The gradient as (rows, values) of the working table, with each row's
        per-lookup terms combined in torch's order for the uncached table: summed as
        `coalesce()` sums them (`coalesce=True`: distinct rows, in id order), or left as
        terms in the order a sparse `add_` applies them (SGD).

        `coalesce()` sums over an unstable sort of the indices, so the order of a row's
        terms depends on the index values: sorting slots instead of ids moves the last
        bit. Sorting the key `id * W + row` (W = working rows) makes the same comparisons
        as sorting the ids, since each id has one row in a batch, and the row comes back
        as `key % W`. An uncached collection (torchrec's) keeps a gradient per table, so
        each table is summed on its own; for a table read by several features, autograd
        adds the features' sparse gradients with `+`, which merges the index sequences by
        comparing them, and the same `+` on the keys makes the same comparisons."""
        rows, values = grad._indices()[0], grad._values()
        ids, width = lookup.ids, grad.size(0)
        multi_feature = lookup.segments is not None and any(len(t) > 1 for t in lookup.segments)
        if not coalesce and not multi_feature:
            return rows, values  # already torch's order: one table's terms in lookup order
        if ids is None or ids.numel() != rows.numel() or ids.numel() == 0 \
                or self.num_rows * width >= 2**62:  # not a per-lookup gradient
            grad = grad.coalesce() if coalesce else grad
            return grad._indices()[0], grad._values()
        keys = self.transfers.to_device(ids) * width + rows  # the ids cross only when a sum needs them
        size = (self.num_rows * width, self.dim)
        tables = [[keys.numel()]] if lookup.segments is None else lookup.segments
        keys, values = table_sums(keys, values, tables, size,
                                  (lambda k, v: coalesced(k, v, size)) if coalesce else None)
        return keys % width, values

    def _refresh_admitted_overflow(self, overflow: Overflow) -> None:
        """An overflow row a prefetch admitted after this batch's forward was copied in
        before its update: give the cached copy the updated row (and state)."""
        slots = self.slots.lookup(overflow.ids)
        now_cached = slots >= 0
        if bool(now_cached.any()):  # host-side bookkeeping: no device sync
            where = torch.nonzero(now_cached).flatten()
            target = slots.index_select(0, where)
            rows, target_dev = self.transfers.to_device(where), self.transfers.to_device(target)
            self.weight.index_copy_(0, target_dev, overflow.weight.index_select(0, rows))
            for k, v in self.state.items():
                v.index_copy_(0, target_dev, overflow.state[k].index_select(0, rows))
            self.dirty.index_fill_(0, target, True)
