"""The rows' life an open table drives in the row cache: the id space grows, rows taken by new
keys get fresh values and optimizer state, rows a batch in flight holds are not retired, and
new keys' counts seed the `freq` policy. The narrow interface an open table talks to the
cache through. `RowLifecycle` is a part of `RowCache`.
"""
from __future__ import annotations

import numpy as np
import torch


class RowLifecycle:
    """`RowCache`'s row lifecycle (see the module docstring)."""

    def grow(self, num_rows: int) -> None:
        """Widen the id space to `num_rows` (an open table's host store grows; the new
        rows are not resident and have no counts)."""
        if num_rows <= self.num_rows:
            return
        self.transfers.settle()
        self.host.grow(num_rows, {k: self.optimizer.initial_state_value(k) for k in self.host.state})
        self.slots.grow(num_rows)
        self.policy.grow(num_rows)
        self.transfers.grow(num_rows)
        self.num_rows = int(num_rows)

    def held_rows(self) -> np.ndarray:
        """Ids whose slots a batch in flight holds (an open table must not retire them)."""
        return self.slots.slot_to_id[self.holds > 0].cpu().numpy()

    def reset_rows(self, ids: torch.Tensor, weight: torch.Tensor) -> None:
        """Give rows `ids` new values (float32 `weight`) and fresh optimizer state: an
        open table's rows taken by new keys. A resident copy is dropped without being
        written back (it belongs to the retired key) and the rows' counts start again.
        No batch in flight may hold them (the open table protects those)."""
        if ids.numel() == 0:
            return
        ids = ids.to(self.book)
        self.wait_for_prefetches()
        self.transfers.settle(ids)
        slots = self.slots.lookup(ids)
        resident = slots[slots >= 0]
        if resident.numel():
            if bool((self.holds.index_select(0, resident) > 0).any()):
                raise RuntimeError("an open table reset a row that a batch in flight holds")
            self.dirty.index_fill_(0, resident, False)
            self.slots.release(resident)
        self.policy.forget(ids)
        state = {k: torch.full((ids.numel(), v.shape[1]), self.optimizer.initial_state_value(k))
                 for k, v in self.host.state.items()}
        self.host.scatter(ids, weight.to(self.host.weight.dtype), state)  # rounded as a new table's rows are

    def set_prior(self, ids: torch.Tensor, counts: torch.Tensor) -> None:
        """The `freq` prior of rows `ids` (an open table's: its keys' counts, set as keys
        take rows, after `reset_rows`); other policies ignore it."""
        self.policy.set_prior(ids.to(self.book), counts)
