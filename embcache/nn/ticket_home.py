"""Fixed tensors for the prefetch ticket of the batch a captured step trains next.

A captured step (`train.step_graph`) that also prefetches the next batch hands that
batch's ticket to its own next replay. A replay reads and writes the tensors its capture
used, at the same addresses, while each prefetch makes new ones (the capture's live in the
graph's memory, an eager step's anywhere). So the ticket is re-homed: its tensors (each
group's ids, offsets and weights, each cache's prefetch entry: ids, held slots, hits,
misses) are copied into tensors kept here for the run, and the ticket then points at
those. The step reads its batch's ticket from the home and, once its own prefetch is made,
re-homes that one: what a replay writes there is what the next replay reads.

The batch the ticket is for is re-homed too (its ids and lengths copied into a fixed
`KeyedJaggedTensorLite`), so that a forward takes the ticket: `PrefetchTicket.is_for`
compares the batch's identity and tensor versions, and only a re-homing changes those.
"""
from __future__ import annotations

import torch

from embcache.nn.prefetch_ticket import PrefetchTicket, tensor_versions
from embcache.sparse_types import KeyedJaggedTensorLite

GROUP_FIELDS = ("ids", "offsets", "weights", "tables")  # `table_groups.GroupInput`'s tensors
ENTRY_FIELDS = ("ids", "held", "hits", "misses", "slots")  # `bookkeeping.lookup.Prefetched`'s


class TicketHome:
    """The run's fixed tensors for one ticket, on `device` (made by the first re-homing,
    which a warm-up step does before any capture)."""

    def __init__(self, device: torch.device):
        self.device = torch.device(device)
        self._tensors: dict[tuple, torch.Tensor] = {}

    def rehome(self, ticket: PrefetchTicket) -> PrefetchTicket:
        """Copy `ticket`'s tensors (and its batch's) into the home and point it at them;
        returns it. A ticket of another structure or shape than the first is refused."""
        copied: dict[int, torch.Tensor] = {}  # a tensor two fields share stays one
        features = None if ticket.features is None else self._batch(ticket.features, copied)  # None: a bare bag's
        for t in (ticket, ticket.local):
            if t is None:
                continue
            for g, group in enumerate(t.groups):
                for name in GROUP_FIELDS:
                    setattr(group, name, self._home(("group", g, name), getattr(group, name), copied))
            for b, entry in enumerate(t.bags):
                for name in ENTRY_FIELDS:
                    value = getattr(entry, name, None)
                    if torch.is_tensor(value):
                        setattr(entry, name, self._home(("entry", b, name), value, copied))
            if features is not None:
                t.features, t.versions = features, tensor_versions(features)
        return ticket

    def _batch(self, kjt, copied: dict) -> KeyedJaggedTensorLite:
        values = self._home(("batch", "values"), kjt.values(), copied)
        lengths = self._home(("batch", "lengths"), kjt.lengths(), copied)
        weights = kjt.weights_or_none()
        if weights is not None:
            weights = self._home(("batch", "weights"), weights, copied)
        length_per_key = getattr(kjt, "_length_per_key", None)
        if length_per_key is None:
            length_per_key = kjt.length_per_key()
        return KeyedJaggedTensorLite(kjt.keys(), values, lengths=lengths, weights=weights, stride=kjt.stride(),
                                     length_per_key=list(length_per_key),
                                     padded_samples=getattr(kjt, "padded_samples", 0))

    def _home(self, key: tuple, t: torch.Tensor | None, copied: dict) -> torch.Tensor | None:
        if t is None:
            return None
        if id(t) in copied:
            return copied[id(t)]
        fixed = self._tensors.get(key)
        if fixed is None:
            fixed = self._tensors[key] = torch.empty(t.shape, dtype=t.dtype, device=self.device)
        elif (fixed.shape, fixed.dtype) != (t.shape, t.dtype):
            raise ValueError(f"a prefetch ticket of another shape than the captured step's ({key}: "
                             f"{tuple(t.shape)} {t.dtype}, the step's {tuple(fixed.shape)} {fixed.dtype})")
        if fixed is not t:
            fixed.copy_(t, non_blocking=True)
        copied[id(t)] = fixed
        return fixed
