"""The ticket a collection's `prefetch` hands back, for its batch's forward to take.

A trainer prefetches batch t+D while batch t trains and keeps what `prefetch` returned
(`embcache.train.prefetch_pipeline`). That batch's forward takes it: `forward(features,
ticket)`, or `with collection.taking(ticket):` around a model that calls the collection
itself (torchrec's DLRM). The ticket carries what the prefetch worked out, so the forward
neither does it again nor searches for it: the batch's group inputs (ids concatenated and
checked), each bag's ticket (the cache's prefetch entry, or an open table's kept key lookup
that names it) and, under torchrun, the ids as routed to their owners.

A forward given no ticket (a user's `prefetch` then forward, as `nn.EmbeddingBag` users
write it) still finds its prefetch, by its ids. A ticket for another batch, or for one whose
tensors were changed in place since, is not used: the forward then works as given none.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field


def tensor_versions(kjt) -> tuple:
    """The versions of a batch's tensors (an in-place change bumps one)."""
    weights = kjt.weights_or_none()
    return (kjt.values()._version, kjt.lengths()._version, None if weights is None else weights._version)


@dataclass
class PrefetchTicket:
    """One prefetched batch: the batch and its tensors' versions then, and what each layer
    made of it (`groups`, `bags`: a cached collection's; `routed`, `local`: a sharded one's,
    `local` being its own collection's ticket)."""

    features: object
    versions: tuple = ()
    groups: list = field(default_factory=list)
    bags: list = field(default_factory=list)
    routed: object = None
    local: PrefetchTicket | None = None

    @classmethod
    def of(cls, features, **parts) -> PrefetchTicket:
        return cls(features, tensor_versions(features), **parts)

    def is_for(self, features) -> bool:
        return self.features is features and self.versions == tensor_versions(features)


class TakesTickets:
    """A collection's side of the hand-off: `taking(ticket)` gives the next forward its
    ticket, and the forward takes it once (`_ticket_for`)."""

    _given: PrefetchTicket | None = None

    @contextmanager
    def taking(self, ticket: PrefetchTicket | None):
        """The forward run inside (once) takes `ticket`: for a model that calls this
        collection itself. Collective under torchrun, as the forward is."""
        self._given = ticket
        try:
            yield
        finally:
            self._given = None

    def _ticket_for(self, features, ticket: PrefetchTicket | None = None) -> PrefetchTicket | None:
        """The ticket this forward of `features` takes: the one passed, else the one
        `taking` gave (used once), if it is this very batch's."""
        if ticket is None:
            ticket, self._given = self._given, None
        return ticket if ticket is not None and ticket.is_for(features) else None
