"""`bench gpu`'s cached step with the next batch's prefetch inside its CUDA graph, as
`dlrm train --cuda-graphs` runs it (`dlrm.captured`): where the graph's side stream loads
the next batch's rows while the dense backward runs.

The step takes its batch's ids from the ticket the step before made, re-homed at fixed
addresses (`nn.ticket_home`), and its inputs are the dense features, the labels and the
next batch's sparse inputs. A step with no such ticket (a window's first; a batch whose
ticket was made for another index, as the sync count and the profile rerun the first
steps) runs the same function eagerly from its own inputs, and prefetches the next batch
into the home: the graph takes over from the next step. The eager path (`gpu.train_steps`)
prefetches at the same point, after the forward, so both decide alike.
"""
from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn.functional as F

from embcache.nn.prefetch_ticket import PrefetchTicket
from embcache.nn.ticket_home import TicketHome
from embcache.train.step_graph import pending_prefetches, restore_prefetches


class StepAhead:
    """The cached variant's step with the prefetch (module docstring). `captured`: its
    `CapturedStep` (or a test's stand-in), set by `gpu.capture`."""

    def __init__(self, variant, device: torch.device):
        self.variant, self.home = variant, TicketHome(device)
        self.ticket, self.index = None, None  # the re-homed ticket, made for batch `index`
        self.captured = None

    def step(self, data: list, i: int, losses: list) -> None:
        """Batch `i` of `data`, its loss appended. A capture that fails raises, the pending
        prefetches set back to what it found and dropped (the caller runs the batch eagerly)."""
        bag = self.variant[0].bag
        inputs, x, y = data[i]
        following = data[i + 1][0] if i + 1 < len(data) else None
        if self.index == i and following is not None:
            pending = pending_prefetches([bag.cache])
            try:
                losses.append(self.captured(x, y, *following))
            except RuntimeError:  # its Python took this prefetch and made one CUDA never ran
                restore_prefetches([bag.cache], pending)
                bag.cache.drop_prefetches()
                self.ticket, self.index = None, None
                raise
            self.index = i + 1
            return
        ticket = self.ticket if self.index == i else None
        if self.ticket is not None and ticket is None:
            bag.cache.drop_prefetches()  # made for another batch: its holds let go
        self.ticket, self.index = None, None
        device = self.home.device
        if following is not None:  # on the device, as the graph's inputs are
            following = tuple(t.to(device, non_blocking=True) for t in following)
        losses.append(self.body(x.to(device, non_blocking=True), y.to(device, non_blocking=True), ticket, inputs,
                                following))
        self.index = i + 1 if following is not None else None

    def captured_fn(self, x, y, *following):
        """What the graph holds: this batch from the home's ticket, the next one prefetched."""
        return self.body(x, y, self.ticket, None, following)

    def body(self, x, y, ticket, inputs, following):
        """One step: the forward of the ticket's batch (else of `inputs`), the prefetch of
        `following` (None: none), the loss, the backward with the cache's update, the dense
        optimizer's step; the prefetch's ticket re-homed."""
        sparse, _, dense, dense_opt = self.variant
        bag = sparse.bag
        dense_opt.zero_grad(set_to_none=True)
        if ticket is not None:
            group = ticket.groups[0]
            emb = bag.lookup_normalized(group.ids, group.offsets, None, ticket=ticket.bags[0])
        else:
            emb = bag(*sparse.bag_args(inputs))
        made = None
        if following is not None:
            ids, offsets, _ = bag.normalize_input(*sparse.bag_args(following))
            group = SimpleNamespace(ids=ids, offsets=offsets, weights=None, tables=None)
            made = PrefetchTicket(None, groups=[group], bags=[bag.prefetch_ids(ids)])
        logits = dense(emb.view(-1, sparse.num_tables, bag.embedding_dim), x).squeeze(1)
        loss = F.binary_cross_entropy_with_logits(logits, y)
        loss.backward()
        dense_opt.step()
        if made is not None:
            bag.cache.wait_for_prefetches()
            self.ticket = self.home.rehome(made)
        return loss.detach()
