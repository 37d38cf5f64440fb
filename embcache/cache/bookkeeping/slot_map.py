"""Which id sits in which slot of a small working set, in both directions.

Shared by the embedding cache (rows of a table) and the dynamic class pool (identities
of a classifier). Both directions are dense tensors so that every question is a batched
gather, never a Python loop: `id_to_slot[N]` holds -1 for ids not resident, and
`slot_to_id[C]` holds -1 for empty slots.

With `index="sorted"` there is no per-id table at all: lookups binary-search a sorted copy
of `slot_to_id`, so memory is O(num_slots) whatever the id space (the class pool over
millions of identities uses this; the embedding cache keeps the dense table, whose host
store is O(N) anyway).
"""
from __future__ import annotations

import torch


class SlotMap:
    """Bidirectional id <-> slot map over `num_ids` ids and `num_slots` slots.

    Args:
        num_ids: size of the id space (rows of the table, classes of the classifier).
        num_slots: capacity of the working set.
        device: where the maps live (beside the working set they index).
        index: "dense" (an `id_to_slot` table of num_ids entries: O(1) lookups) or
            "sorted" (no per-id table: O(log num_slots) lookups, O(num_slots) memory,
            re-sorted after each assign/release).

    Example:
        >>> import torch
        >>> m = SlotMap(10, 3)
        >>> m.assign(torch.tensor([7, 2]), torch.tensor([0, 1]))
        >>> m.lookup(torch.tensor([2, 5])).tolist()
        [1, -1]
    """

    def __init__(self, num_ids: int, num_slots: int, device: torch.device | str = "cpu",
                 index: str = "dense"):
        if num_slots < 1 or num_ids < 1:
            raise ValueError(f"SlotMap needs at least one id and one slot, got {num_ids=} {num_slots=}")
        if index not in ("dense", "sorted"):
            raise ValueError(f"index must be 'dense' or 'sorted', got {index!r}")
        self.num_ids = int(num_ids)
        self.num_slots = int(num_slots)
        self.index = index
        self.slot_to_id = torch.full((self.num_slots,), -1, dtype=torch.long, device=device)
        if index == "dense":
            self.id_to_slot = torch.full((self.num_ids,), -1, dtype=torch.long, device=device)
        else:
            self.id_to_slot = None
            self._reindex()

    def grow(self, num_ids: int) -> None:
        """More ids (an open table's new rows), none of them resident."""
        if num_ids > self.num_ids and self.id_to_slot is not None:
            more = self.id_to_slot.new_full((num_ids - self.num_ids,), -1)
            self.id_to_slot = torch.cat([self.id_to_slot, more])
        self.num_ids = max(self.num_ids, int(num_ids))

    def _reindex(self) -> None:
        """Sorted mode: refresh the sorted copy of slot_to_id and its permutation."""
        self._sorted_ids, self._sorted_slots = torch.sort(self.slot_to_id)

    @property
    def device(self) -> torch.device:
        return self.slot_to_id.device

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        """Slot of each id, -1 where absent."""
        if self.id_to_slot is not None:  # index_select: several times cheaper than [ids]
            return self.id_to_slot.index_select(0, ids.reshape(-1)).view(ids.shape)
        pos = torch.searchsorted(self._sorted_ids, ids).clamp_(max=self.num_slots - 1)
        hit = (self._sorted_ids[pos] == ids) & (ids >= 0)
        return torch.where(hit, self._sorted_slots[pos], torch.full_like(pos, -1))

    def occupied(self) -> torch.Tensor:
        """Boolean mask over slots: True where a slot holds an id."""
        return self.slot_to_id >= 0

    def num_occupied(self) -> int:
        return int(self.occupied().sum())

    def free_slots(self, limit: int | None = None) -> torch.Tensor:
        """Indices of empty slots (at most `limit`), in slot order."""
        free = torch.nonzero(self.slot_to_id < 0).flatten()
        return free if limit is None else free[:limit]

    def assign(self, ids: torch.Tensor, slots: torch.Tensor) -> None:
        """Place distinct absent `ids` into distinct empty `slots`."""
        self.slot_to_id.index_copy_(0, slots, ids)
        if self.id_to_slot is not None:
            self.id_to_slot.index_copy_(0, ids, slots)
        else:
            self._reindex()

    def release(self, slots: torch.Tensor) -> torch.Tensor:
        """Empty `slots`; returns the ids they held (-1 for slots already empty)."""
        ids = self.slot_to_id.index_select(0, slots)
        if self.id_to_slot is not None:
            self.id_to_slot.index_fill_(0, ids[ids >= 0], -1)
        self.slot_to_id.index_fill_(0, slots, -1)
        if self.id_to_slot is None:
            self._reindex()
        return ids

    def clear(self) -> None:
        self.slot_to_id.fill_(-1)
        if self.id_to_slot is not None:
            self.id_to_slot.fill_(-1)
        else:
            self._reindex()

    def check_invariants(self) -> None:
        """Raise AssertionError if the two directions disagree (used by tests and debugging)."""
        occ = torch.nonzero(self.slot_to_id >= 0).flatten()
        ids = self.slot_to_id[occ]
        assert ids.unique().numel() == ids.numel(), "an id occupies two slots"
        assert torch.equal(self.lookup(ids), occ), "slot_to_id and id_to_slot disagree"
        if self.id_to_slot is None:
            assert torch.equal(self._sorted_ids, torch.sort(self.slot_to_id).values), "stale sorted index"
            return
        resident = torch.nonzero(self.id_to_slot >= 0).flatten()
        assert resident.numel() == occ.numel(), "id_to_slot names more ids than the slots hold"
        assert torch.equal(self.slot_to_id[self.id_to_slot[resident]], resident), "maps not inverse"

    def state_dict(self) -> dict:
        return {"slot_to_id": self.slot_to_id.cpu().clone()}

    def load_state_dict(self, state: dict) -> None:
        slot_to_id = state["slot_to_id"].to(self.device)
        if slot_to_id.numel() != self.num_slots:
            raise ValueError(f"slot map has {slot_to_id.numel()} slots, this one {self.num_slots}")
        self.clear()
        occ = torch.nonzero(slot_to_id >= 0).flatten()
        self.assign(slot_to_id[occ], occ)
