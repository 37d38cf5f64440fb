"""The trainer's prefetch pipeline: which coming batches are prefetched, and their tickets.

While batch t trains, the batches after it, up to `depth` of them, are prefetched (their
rows loaded, on CUDA on a side stream that overlaps the step). The pipeline alone keeps
that state: one ticket per prefetched batch, in order, as torchrec's train pipelines keep
theirs. A step takes its batch's ticket before its forward (`take`) and prefetches the
batches not yet prefetched after it (`ahead`), so no batch is prefetched twice and nothing
is asked of the caches.

A resumed run's caches hold the prefetches its checkpoint recorded (made for the batches
that come first); the pipeline is told how many (`resume_with`), and those batches go
without a ticket: their forward finds its prefetch by its ids.
"""
from __future__ import annotations

from collections import deque


class PrefetchPipeline:
    """Tickets of the batches prefetched ahead, oldest first. `sparse`: a collection
    with `prefetch(features) -> ticket`; `depth`: batches prefetched ahead (0: none)."""

    def __init__(self, sparse, depth: int):
        self.sparse, self.depth = sparse, depth
        self._tickets: deque = deque()  # (batch, ticket); a resumed cache's: (None, None)

    def __len__(self) -> int:
        return len(self._tickets)

    def resume_with(self, prefetched: int) -> None:
        """Start with `prefetched` batches prefetched already (by the restored caches, at
        the depth the checkpoint's run had: more than `depth`, maybe)."""
        self._tickets = deque([(None, None)] * prefetched)

    def take(self, batch):
        """The ticket of `batch` (None: not prefetched, or by a resumed cache), and those
        of batches before it, which did not come, dropped."""
        while self._tickets:
            prefetched, ticket = self._tickets.popleft()
            if prefetched is batch or prefetched is None:
                return ticket
        return None

    def hand(self, batch, ticket) -> None:
        """`batch` was prefetched elsewhere (a captured step prefetches its next batch):
        its forward takes `ticket` as it would take one made here."""
        self._tickets.append((batch, ticket))

    def ahead(self, upcoming) -> None:
        """Prefetch the batches of `upcoming` (those after the current one, in order, at
        most `depth`) that are not yet. Collective under torchrun, as every prefetch is."""
        for batch in list(upcoming)[len(self._tickets): self.depth]:
            self._tickets.append((batch, self.sparse.prefetch(batch.sparse)))
