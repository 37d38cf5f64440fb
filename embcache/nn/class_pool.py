"""The dynamic class pool: Q slots of gallery features standing in for a classifier's weight
rows, for label spaces far larger than Q (F2C; docs/class-pool.md).

Each slot holds the two latest gallery features of one identity (written alternately, the
older one replaced). Which label sits in which slot is a `SlotMap` (sorted index: no per-label
table, so memory is O(Q) whatever the number of classes) and which slot to give up is an
`EvictionPolicy("lru")`: the same working-set mechanics as the embedding cache. An update is
batched tensor work (unique, searchsorted, topk, index writes); no loop over labels.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from embcache.cache.bookkeeping.eviction import EvictionPolicy
from embcache.cache.bookkeeping.slot_map import SlotMap


class DynamicClassPool(nn.Module):
    """Q slots of gallery features with an LRU label -> slot table.

    Args:
        num_slots: Q, the pool's capacity (identities resident at once).
        feat_dim: dimension of the (L2-normalised) gallery features.
        num_classes: size of the label space (only used to check labels: nothing is
            allocated per class).
        device: where the pool lives (default cpu).

    Example:
        >>> pool = DynamicClassPool(num_slots=4, feat_dim=8, num_classes=1_000_000)
        >>> feats = F.normalize(torch.randn(3, 8), dim=1)
        >>> pool.update(torch.tensor([7, 7, 999_999]), feats)
        >>> pool.lookup(torch.tensor([7, 5, 999_999])).ge(0).tolist()
        [True, False, True]
        >>> pool.num_resident()
        2
    """

    def __init__(self, num_slots: int, feat_dim: int, num_classes: int, device: torch.device | str | None = None):
        super().__init__()
        if num_slots < 1:
            raise ValueError(f"the pool needs at least one slot, got {num_slots}")
        device = torch.device(device or "cpu")
        self.num_slots, self.feat_dim, self.num_classes = int(num_slots), int(feat_dim), int(num_classes)
        self.register_buffer("features", torch.zeros(self.num_slots, 2, self.feat_dim, device=device))
        # features written into a slot since its identity was admitted (entry = writes % 2)
        self.register_buffer("writes", torch.zeros(self.num_slots, dtype=torch.long, device=device))
        self.slots = SlotMap(self.num_classes, self.num_slots, device, index="sorted")
        self.lru = EvictionPolicy("lru", self.num_classes, self.num_slots, device=device)
        self.stats = {"updates": 0, "admitted": 0, "evicted": 0, "overflow": 0}

    # -- reading -------------------------------------------------------------------------
    def check_labels(self, labels: torch.Tensor) -> None:
        if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= self.num_classes):
            bad = torch.nonzero((labels < 0) | (labels >= self.num_classes)).flatten()
            raise ValueError(f"label {int(labels[bad[0]])} at batch index {int(bad[0])} is outside "
                             f"[0, {self.num_classes}) ({bad.numel()} such labels in the batch)")

    def lookup(self, labels: torch.Tensor) -> torch.Tensor:
        """Slot of each label, -1 where the identity is not in the pool."""
        self.check_labels(labels)
        return self.slots.lookup(labels)

    def occupied(self) -> torch.Tensor:
        return self.slots.occupied()

    def num_resident(self) -> int:
        return self.slots.num_occupied()

    def centres(self) -> torch.Tensor:
        """[Q, D] class centres: the normalised mean of each slot's two features (zero rows
        for empty slots; mask them with `occupied()`)."""
        return F.normalize(self.features.sum(1), dim=1)

    # -- writing -------------------------------------------------------------------------
    @torch.no_grad()
    def update(self, labels: torch.Tensor, feats: torch.Tensor) -> None:
        """Admit the batch's identities (least-recently-used slots give way) and write each
        identity's latest (at most two) features, in batch order, alternately into its slot."""
        labels = labels.to(self.features.device, torch.long).flatten()
        if labels.numel() == 0:
            return
        self.check_labels(labels)
        feats = feats.detach().to(self.features.device, self.features.dtype)
        self.lru.tick()
        self.stats["updates"] += 1
        uniq, inverse = torch.unique(labels, return_inverse=True)
        slot = self.slots.lookup(uniq)
        new = slot < 0
        n_new = int(new.sum())
        if n_new:
            protected = torch.zeros(self.num_slots, dtype=torch.bool, device=slot.device)
            protected[slot[~new]] = True
            free = self.slots.free_slots(n_new)
            victims = self.lru.select_victims(n_new - free.numel(), protected, self.slots.occupied())
            targets = torch.cat([free, victims])
            new_ids = uniq[new]
            if targets.numel() < n_new:  # more distinct labels in one batch than the pool holds
                self.stats["overflow"] += n_new - targets.numel()
                new_ids = new_ids[: targets.numel()]
            if victims.numel():
                self.lru.on_evict(self.slots.slot_to_id[victims], victims)
                self.slots.release(victims)
                self.stats["evicted"] += victims.numel()
            self.slots.assign(new_ids, targets)
            self.lru.on_admit(new_ids, targets)
            self.writes[targets] = 0
            self.stats["admitted"] += new_ids.numel()
            slot = self.slots.lookup(uniq)
        resident = slot >= 0
        self.lru.on_access(uniq[resident], slot[resident])

        # rank of each occurrence within its label (0 = first in the batch), without a loop
        counts = torch.bincount(inverse, minlength=uniq.numel())
        order = torch.argsort(inverse, stable=True)
        starts = counts.cumsum(0) - counts
        rank = torch.empty_like(inverse)
        rank[order] = torch.arange(labels.numel(), device=labels.device) - starts[inverse[order]]
        skip = (counts[inverse] - 2).clamp_min(0)  # only the last two occurrences are kept
        occ_slot = slot[inverse]
        keep = (rank >= skip) & (occ_slot >= 0)
        s, j = occ_slot[keep], (rank - skip)[keep]
        self.features[s, (self.writes[s] + j) % 2] = feats[keep]
        touched = slot[resident]
        self.writes[touched] += counts[resident].clamp(max=2)
        single = touched[self.writes[touched] == 1]  # a fresh identity with one feature so far
        self.features[single, 1] = self.features[single, 0]

    # -- checkpointing -------------------------------------------------------------------
    def get_extra_state(self) -> dict:
        return {"slots": self.slots.state_dict(), "lru": self.lru.state_dict(), "stats": dict(self.stats)}

    def set_extra_state(self, state: dict) -> None:
        self.slots.load_state_dict(state["slots"])
        self.lru.load_state_dict(state["lru"])
        self.stats = dict(state["stats"])

    def check_invariants(self) -> None:
        """AssertionError unless the LRU table and the slots agree (tests, debugging)."""
        self.slots.check_invariants()
        occ = self.slots.occupied()
        assert self.num_resident() <= self.num_slots
        assert bool((self.writes[occ] >= 1).all()), "a resident identity without features"
        assert bool((self.lru.slot_last[occ] <= self.lru.clock).all()), "LRU key from the future"

    def nbytes(self) -> int:
        """Bytes held by the pool (features, table and LRU keys): O(Q)."""
        tensors = [self.features, self.writes, self.slots.slot_to_id, self.slots._sorted_ids,
                   self.slots._sorted_slots, self.lru.slot_last, self.lru.slot_primary]
        return sum(t.numel() * t.element_size() for t in tensors)
