"""`ShardedEmbeddingBagCollection`: the model-parallel sparse part of a hybrid-parallel DLRM.

Each rank reads its own slice of every global batch, but the rows its samples need live on
their owner ranks (`placement.plan`). A forward therefore moves data twice:

1. **ids to owners** (one all-to-all of one buffer): every rank sends each owner one block,
   a header (its batch, the sizes of all its blocks, the number of ids of each feature the
   owner serves) and, for each (shard, feature) the owner serves, its samples' lengths and
   ids (a row-wise shard gets only the ids in its range, shifted to start at 0; a key-hash
   shard of an open table only the raw keys it owns, `placement.key_owner`, unchanged). Each block
   travels in a capacity every rank agrees on, padded with zeros: the largest block for that
   owner in the previous exchange plus 1/32, so no size has to be exchanged first. A block
   that outgrows it (the first batch, a larger evaluation batch, a row-wise shard's ids
   growing) is cut there and its rest follows in a second all-to-all, which every rank
   knows to make from the headers it received;
2. the owner looks the whole global batch up in its own cached collection, in global
   sample order, so each row's gradient is summed over the same samples in the same order
   as on one process (the owner writes the received lengths and ids into that order in one
   copy);
3. **pooled embeddings back** (all-to-all with autograd): each rank receives `[B_local, D]`
   per owner and assembles the features in the model's order (adding the partial sums of
   a row-wise or key-hash table). The backward sends the gradients the same way in reverse, and the
   owner's cache applies them to its rows during `loss.backward()`.

Steps 2 and 3 can start before the model asks for the features: `start(batch)` looks the
batch up and starts the pooled exchange without waiting, and the forward of that batch
waits for it. DLRM runs its bottom MLP before its sparse part, so a hook that starts the
sparse part first (`overlap_pooled_exchange`, on by default in `dlrm train` under
torchrun) lets the bottom MLP run while the pooled embeddings travel; the numbers are the
same to the bit (tests/test_dlrm_distributed.py).

`prefetch(batch)` does step 1 for a coming batch while this one trains and returns the
result in the batch's ticket (`nn.prefetch_ticket`), with the owner's own ticket for its
rows, so the ids of a batch cross the network once; that batch's forward takes the ticket
(a trainer keeps one per batch it prefetched ahead). On one process none of this happens:
the collection is the local one.

The exchanges run on a process group of their own, so they cannot interleave with the
data-parallel all-reduces that DDP launches during the same backward. A training step that
prefetches makes three all-to-alls on it: the next batch's ids, the pooled embeddings, and
their gradients (`tests/test_sharded_routing.py` counts them).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist
from torch import nn

from embcache.nn.prefetch_ticket import PrefetchTicket, TakesTickets
from embcache.nn.rows_only import TORCHREC_KEY, size_mismatch
from embcache.sparse_types import EmbeddingBagConfig, KeyedJaggedTensor, KeyedTensor

from .exchange_autograd import AllToAll, AwaitGradient, GradientExchange, ReceivedPooled
from .placement import Shard
from .world import collective_device, current, new_group


def shard_config(table: EmbeddingBagConfig, shard: Shard) -> EmbeddingBagConfig:
    """The config of `shard` on its rank: the table itself when whole, else its rows
    `[row_start, row_stop)`, initialised as those rows of the whole table would be. A
    key-hash shard keeps the table's name and features, its `num_embeddings` its share of
    the keys expected (its cache's size; its keys' first values are the table's, see
    `open_shard_settings`)."""
    if shard.whole:
        return table
    if shard.by_key:
        return replace(table, num_embeddings=shard.rows)

    def init_rows(weight: torch.Tensor) -> None:
        full = torch.empty(table.num_embeddings, table.embedding_dim)
        table.init_fn(full)
        with torch.no_grad():
            weight.copy_(full[shard.row_start: shard.row_stop])

    return replace(table, name=shard.name, num_embeddings=shard.rows,
                   feature_names=[shard.feature_key(f) for f in table.feature_names], init_fn=init_rows)


@dataclass
class _Routed:
    """A batch's lookups as its owner sees them: the local KJT over the global batch and
    how many samples each rank contributed (its rows of the pooled output)."""

    kjt: KeyedJaggedTensor
    batch_per_rank: list[int]


@dataclass
class _BlocksInFlight:
    """A routing exchange started and not yet waited for, with the capacities it used."""

    send: torch.Tensor
    rest: list[torch.Tensor] | None
    recv: torch.Tensor
    work: object
    capacity: list[int]


@dataclass
class _Started:
    """A batch whose pooled exchange `start` began: the forward of `features` waits for
    `work`, reads `recv` and ties it to `pooled` (this rank's lookups, through their
    gradient's wait) for the backward; `splits` are the exchange's (send, receive)."""

    features: KeyedJaggedTensor
    routed: _Routed
    recv: torch.Tensor
    work: object
    pooled: torch.Tensor | None
    gradient: GradientExchange
    splits: tuple[list[int], list[int]]


class ShardedEmbeddingBagCollection(TakesTickets, nn.Module):
    """torchrec-compatible collection whose tables are spread over the ranks.

    Args:
        tables: every table of the model (the same list on every rank).
        shards: `placement.plan(...)` for these tables and this world.
        make_local: builds this rank's collection from its shards' configs (a
            `CachedEmbeddingBagCollection`, say).
    """

    def __init__(self, tables: list[EmbeddingBagConfig], shards: list[Shard], make_local):
        super().__init__()
        self.world = current()
        self._configs = list(tables)
        self.shards = list(shards)
        by_name = {t.name: t for t in tables}
        self._feature_names = [f for t in tables for f in t.feature_names]
        self._dim = {f: t.embedding_dim for t in tables for f in t.feature_names}
        mine = [s for s in shards if s.rank == self.world.rank]
        self.local = make_local([shard_config(by_name[s.table], s) for s in mine]) if mine else None
        # per owner rank, the (shard, feature) pairs it serves, in its local output order
        self._served = [[(s, f) for s in shards if s.rank == o for f in s.features] for o in range(self.world.size)]
        self._group = new_group() if self.world.distributed else None
        self._started: _Started | None = None
        # a prefetch whose ids are on their way (`finish_prefetch_exchange` finishes it), with `overlap` only
        self._routing: tuple[PrefetchTicket, _BlocksInFlight] | None = None
        self.overlap = False  # set by `overlap_pooled_exchange`
        self.comm_bytes = {"ids": 0, "pooled": 0}
        # elements of a routing block for each owner, the same on every rank: header only at first
        self._capacity = [self._header_size(o) for o in range(self.world.size)]

    # --------------------------------------------------------- torchrec's interface
    def embedding_bag_configs(self) -> list[EmbeddingBagConfig]:
        return self._configs

    def is_weighted(self) -> bool:
        return False

    def forward(self, features: KeyedJaggedTensor, ticket: PrefetchTicket | None = None) -> KeyedTensor:
        """torchrec's forward. `ticket`: what `prefetch` returned for this batch (or given by
        `taking`): its ids are routed already and its owners' rows loaded."""
        ticket = self._ticket_for(features, ticket)
        if not self.world.distributed:
            return self._local_lookup(features, None if ticket is None else ticket.local)
        started, self._started = self._started, None
        if started is not None:
            started.work.wait()
            if started.features is features:
                return self._to_features(self._pooled_blocks(self._received(started), started.routed),
                                         features.stride())
        self.finish_prefetch_exchange()
        routed, local = self._routed_of(features, ticket)
        recv = self._send_pooled(self._local_pooled(routed, local), routed)
        return self._to_features(self._pooled_blocks(recv, routed), features.stride())

    def start(self, features: KeyedJaggedTensor) -> None:
        """Look `features` up and start sending the pooled embeddings back, without waiting
        for them: the forward of the same batch waits, so whatever runs in between (DLRM's
        bottom MLP, see `overlap_pooled_exchange`) overlaps the exchange. Its backward
        overlaps the gradients' way back the same way: the received embeddings join the
        autograd graph after the bottom MLP (so their backward, which starts sending the
        gradients, runs before the bottom MLP's), this rank's lookups before it (so the wait
        for their gradients comes after the bottom MLP's backward). Collective under
        torchrun: every rank starts the same batches. The numbers are the forward's alone
        (the same lookups, the same exchanges; only the waits move)."""
        if not self.world.distributed:
            return
        if self._started is not None:  # started and never consumed: finish it, every rank alike
            self._started.work.wait()
        ticket = self._ticket_for(features)  # `taking`'s, for this batch
        self.finish_prefetch_exchange()
        routed, local = self._routed_of(features, ticket)
        pooled = self._local_pooled(routed, local)
        gradient = GradientExchange()
        tracked = torch.is_grad_enabled() and pooled.requires_grad
        if tracked:
            pooled = AwaitGradient.apply(pooled, gradient)
        send_splits, recv_splits = self._splits(pooled, routed)
        recv = pooled.new_empty(sum(recv_splits))
        work = dist.all_to_all_single(recv, pooled.detach().reshape(-1), recv_splits, send_splits,
                                      group=self._group, async_op=True)
        self._count_pooled(pooled, send_splits)
        self._started = _Started(features, routed, recv, work, pooled if tracked else None, gradient,
                                 (send_splits, recv_splits))

    def _received(self, started: _Started) -> torch.Tensor:
        """The started batch's received embeddings, with the backward that sends their
        gradients to the owners (see `start`)."""
        if started.pooled is None:
            return started.recv
        return ReceivedPooled.apply(started.pooled, started.recv, *started.splits, self._group, started.gradient,
                                     self.finish_prefetch_exchange)

    def prefetch(self, features: KeyedJaggedTensor) -> PrefetchTicket:
        """Route a coming batch's ids now and have the owners load its rows; returns the
        ticket that batch's forward takes. Collective under torchrun: every rank prefetches
        the same batches (its own slices), in order."""
        ticket = PrefetchTicket.of(features)
        if not self.world.distributed:
            ticket.local = self.local.prefetch(features)
            return ticket
        self.finish_prefetch_exchange()
        if self.overlap:  # started now, finished by the step's backward (or the next call here)
            self._routing = (ticket, self._start_blocks(self._blocks_out(features)))
        else:
            self._prefetched(ticket, self._route(features))
        return ticket

    def _prefetched(self, ticket: PrefetchTicket, routed: _Routed) -> None:
        ticket.routed = routed
        if self.local is not None:
            ticket.local = self.local.prefetch(routed.kjt)

    def finish_prefetch_exchange(self) -> None:
        """Finish the prefetch whose ids are on their way (`overlap`): its owners receive
        them and load their rows. Called by the step's backward before the gradients'
        exchange, so the ids travel while the top MLP's backward runs and every cache does
        what it did when the prefetch waited at once, in the same order; and by every entry
        point of this collection, so nothing sees a prefetch half done. Collective."""
        routing, self._routing = self._routing, None
        if routing is not None:
            ticket, flight = routing
            self._prefetched(ticket, self._routed(*self._finish_blocks(flight), ticket.features))

    # --------------------------------------------------------- step 1: ids to owners
    def _routed_of(self, features: KeyedJaggedTensor, ticket: PrefetchTicket | None):
        """The batch's routed ids and its owner's ticket: its prefetch's, or routed now."""
        if ticket is not None and ticket.routed is not None:
            return ticket.routed, ticket.local
        return self._route(features), None

    def _route(self, kjt: KeyedJaggedTensor) -> _Routed:
        """Send each owner its block of this rank's samples and receive this rank's lookups
        from every rank (see the module docstring)."""
        return self._routed(*self._exchange_blocks(self._blocks_out(kjt)), kjt)

    def _routed(self, inbound: list[torch.Tensor], heads: list[list[int]], kjt: KeyedJaggedTensor) -> _Routed:
        """`kjt`'s lookups as this owner received them."""
        batch_from = [h[0] for h in heads]
        ids_from = [h[1 + self.world.size:] for h in heads]
        return _Routed(self._owner_kjt(inbound, batch_from, ids_from, kjt.lengths().dtype), batch_from)

    def _exchange_blocks(self, blocks: list[list[torch.Tensor]]) -> tuple[list[torch.Tensor], list[list[int]]]:
        """One all-to-all of the blocks, each in the capacity every rank gives its owner (a
        second one only when a block is longer): the blocks received, in rank order, and
        their headers as ints."""
        return self._finish_blocks(self._start_blocks(blocks))

    def _start_blocks(self, blocks: list[list[torch.Tensor]]) -> "_BlocksInFlight":
        """The first all-to-all of `_exchange_blocks`, started and not waited for."""
        world, me, capacity = self.world.size, self.world.rank, list(self._capacity)
        device = collective_device()  # NCCL exchanges device tensors only: host ids move once
        send, rest = _pack(blocks, capacity)
        send = send.to(device, non_blocking=True)
        recv = send.new_empty(world * capacity[me])
        work = dist.all_to_all_single(recv, send, [capacity[me]] * world, capacity, group=self._group,
                                      async_op=True)
        return _BlocksInFlight(send, rest, recv, work, capacity)

    def _finish_blocks(self, flight: "_BlocksInFlight") -> tuple[list[torch.Tensor], list[list[int]]]:
        """Wait for a started exchange of blocks, and send what outgrew its capacity."""
        world, me, capacity = self.world.size, self.world.rank, flight.capacity
        flight.work.wait()
        recv = flight.recv
        inbound = list(recv.view(world, capacity[me]).unbind(0))
        heads = recv.view(world, capacity[me])[:, :self._header_size(me)].tolist()
        sizes = [h[1: 1 + world] for h in heads]  # sizes[s][o]: rank s's block for owner o
        sent = sum(c for o, c in enumerate(capacity) if o != me)
        if any(n > c for row in sizes for n, c in zip(row, capacity)):
            # a block outgrew its capacity: every rank saw it in the headers and sends the rest
            send_rest = [max(n - c, 0) for n, c in zip(sizes[me], capacity)]
            recv_rest = [max(row[me] - capacity[me], 0) for row in sizes]
            more = recv.new_empty(sum(recv_rest))
            rest = torch.cat(flight.rest).to(recv.device, non_blocking=True) if flight.rest else flight.send[:0]
            dist.all_to_all_single(more, rest, recv_rest, send_rest, group=self._group)
            inbound = [torch.cat([block, extra]) if n else block
                       for block, extra, n in zip(inbound, more.split(recv_rest), recv_rest)]
            sent += sum(n for o, n in enumerate(send_rest) if o != me)
        self.comm_bytes["ids"] += sent * recv.element_size()
        self._capacity = [block_capacity(max(row[o] for row in sizes)) for o in range(world)]
        return inbound, heads

    def _header_size(self, owner: int) -> int:
        """A block's header: the sender's batch, its block sizes for every owner, and the
        number of ids of each feature `owner` serves."""
        return 1 + self.world.size + len(self._served[owner])

    def _blocks_out(self, kjt: KeyedJaggedTensor) -> list[list[torch.Tensor]]:
        """Per owner, the pieces of this rank's block (header, lengths, ids), views of the
        batch where a whole table is served."""
        batch = kjt.stride()
        values = kjt.values()
        lengths = kjt.lengths().view(len(kjt.keys()), batch).to(values.dtype)
        count = lengths.sum(1).tolist()
        per_key = dict(zip(kjt.keys(), zip(lengths.unbind(0), values.split(count))))
        # per owner: (lengths, ids) of each (shard, feature) it serves
        parts = [[_lookups_into(shard, *per_key[f]) for shard, f in served] for served in self._served]
        sizes = [self._header_size(o) + sum(n.numel() + v.numel() for n, v in p) for o, p in enumerate(parts)]
        heads = torch.tensor([x for p in parts for x in (batch, *sizes, *(v.numel() for _, v in p))],
                             dtype=values.dtype, device=values.device).split([self._header_size(o) for o in
                                                                               range(self.world.size)])
        return [[head, *(n for n, _ in p), *(v for _, v in p)] for head, p in zip(heads, parts)]

    def _owner_kjt(self, inbound: list[torch.Tensor], batch_from: list[int], ids_from: list[list[int]],
                   lengths_dtype: torch.dtype) -> KeyedJaggedTensor:
        """The global batch's lookups into this rank's shards, samples in rank order: the
        lengths and ids of every feature from every rank, copied once into place."""
        served = self._served[self.world.rank]
        header = self._header_size(self.world.rank)
        keys = [shard.feature_key(f) for shard, f in served]
        n = len(served)
        lengths = [block[header: header + n * b].view(n, b).unbind(0) for block, b in zip(inbound, batch_from)]
        ids = [block[header + n * b: header + n * b + sum(c)].split(c)
               for block, b, c in zip(inbound, batch_from, ids_from)]
        parts = [source[j] for per_source in (lengths, ids) for j in range(n) for source in per_source]
        out = torch.cat(parts) if parts else inbound[0][:0]
        n_lengths = n * sum(batch_from)
        return KeyedJaggedTensor(keys=keys, values=out[n_lengths:], lengths=out[:n_lengths].to(lengths_dtype))

    # --------------------------------------------------------- steps 2 and 3
    def _local_pooled(self, routed: _Routed, ticket: PrefetchTicket | None = None) -> torch.Tensor:
        """`[B_global, D_mine]`: this rank's shards looked up for every rank's samples."""
        if self.local is not None and len(routed.kjt.keys()):
            return self._local_lookup(routed.kjt, ticket).values()
        # a rank without tables still takes part in the backward exchange
        empty = torch.zeros(sum(routed.batch_per_rank), 0, requires_grad=torch.is_grad_enabled())
        return empty

    def _local_lookup(self, kjt: KeyedJaggedTensor, ticket: PrefetchTicket | None) -> KeyedTensor:
        """This rank's collection's forward, given its ticket where there is one (any
        torchrec-like collection serves where nothing is prefetched)."""
        return self.local(kjt) if ticket is None else self.local(kjt, ticket)

    def _widths(self) -> list[int]:
        return [sum(self._dim[f] for _, f in served) for served in self._served]

    def _splits(self, pooled: torch.Tensor, routed: _Routed) -> tuple[list[int], list[int]]:
        """The pooled exchange's (send, receive) splits: every rank's samples' rows of this
        rank's columns out, this rank's samples' rows of every owner's columns in."""
        batch = routed.batch_per_rank[self.world.rank]
        return [b * pooled.shape[1] for b in routed.batch_per_rank], [batch * w for w in self._widths()]

    def _count_pooled(self, pooled: torch.Tensor, send_splits: list[int]) -> None:
        sent = sum(n for r, n in enumerate(send_splits) if r != self.world.rank)
        self.comm_bytes["pooled"] += sent * pooled.element_size()

    def _send_pooled(self, pooled: torch.Tensor, routed: _Routed) -> torch.Tensor:
        """Send each rank its samples' rows of `pooled` (with autograd where it has a
        gradient) and wait: the `[B_local * sum D_owner]` buffer received."""
        send_splits, recv_splits = self._splits(pooled, routed)
        send = pooled.reshape(-1)
        if torch.is_grad_enabled() and send.requires_grad:
            recv = AllToAll.apply(send, send_splits, recv_splits, self._group)
        else:
            recv = send.new_empty(sum(recv_splits))
            dist.all_to_all_single(recv, send, recv_splits, send_splits, group=self._group)
        self._count_pooled(pooled, send_splits)
        return recv

    def _pooled_blocks(self, recv: torch.Tensor, routed: _Routed) -> list[torch.Tensor]:
        """Each owner's `[B_local, D_owner]` block for this rank's samples."""
        batch = routed.batch_per_rank[self.world.rank]
        width = self._widths()
        return [block.view(batch, w) for block, w in zip(recv.split([batch * w for w in width]), width)]

    def _to_features(self, blocks: list[torch.Tensor], batch: int) -> KeyedTensor:
        """The owners' blocks as the model's features in order; a row-wise table's
        partial sums added up."""
        columns: dict[str, torch.Tensor] = {}
        for block, served in zip(blocks, self._served):
            for (_, f), col in zip(served, block.split([self._dim[f] for _, f in served], dim=1)):
                columns[f] = col if f not in columns else columns[f] + col
        values = torch.cat([columns[f] for f in self._feature_names], dim=1)
        return KeyedTensor(keys=self._feature_names, length_per_key=[self._dim[f] for f in self._feature_names],
                           values=values)

    # --------------------------------------------------------- state dicts of torchrec's form
    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        """torchrec's `EmbeddingBagCollection` state dict (every table whole, the same on
        every rank) loads too: this rank takes its shards' rows, handed to its local
        collection under the shards' names (`nn.rows_only`); the other ranks' tables are
        theirs. Tables split by key hash keep rows in key order: refused."""
        keys = {t.name: prefix + TORCHREC_KEY.format(t.name) for t in self._configs}
        shapes = {t.name: (t.num_embeddings, t.embedding_dim) for t in self._configs}
        rows = {name: state_dict.pop(key) for name, key in keys.items() if key in state_dict}
        for shard in (s for s in self.shards if s.rank == self.world.rank and s.table in rows):
            whole, shape = rows[shard.table], shapes[shard.table]
            if shard.by_key:
                error_msgs.append(f"{keys[shard.table]}: a table split by key hash keeps its rows in key order, "
                                  "not id order: it loads from the run's own checkpoint only")
            elif torch.is_tensor(whole) and tuple(whole.shape) != shape:
                error_msgs.append(size_mismatch(keys[shard.table], whole, shape))
            else:
                state_dict[f"{prefix}local.{TORCHREC_KEY.format(shard.name)}"] = whole[shard.row_start: shard.row_stop]
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    # --------------------------------------------------------- the cache's interface
    def cache_stats(self) -> dict:
        """This rank's cache statistics (the trainer sums them over ranks)."""
        return self.local.cache_stats() if self.local is not None else {}

    def separate_stats(self):
        return self.local.separate_stats()

    def evaluation(self):
        return self.local.evaluation()

    def cache_rows(self) -> int:
        return self.local.cache_rows() if self.local is not None else 0

    def table_weight(self, name: str) -> torch.Tensor:
        """A whole table this rank holds (every table, on one process)."""
        return self.local.table_weight(name)


def overlap_pooled_exchange(model: nn.Module, sharded: ShardedEmbeddingBagCollection):
    """Have `model` (a DLRM, torchrec's or `nn.dlrm_arch`'s: `forward(dense, sparse)`, the
    bottom MLP before the sparse part) start the sparse part's lookup and pooled exchange
    before its bottom MLP, which then runs while the pooled embeddings travel; its own
    forward of the sparse part waits for them. Only under torchrun (nothing to overlap on
    one process). It also sets `sharded.overlap`, under which a prefetch's ids exchange is
    finished by the step's backward (`finish_prefetch_exchange`) rather than at once. Returns the hook's
    handle: `.remove()` and `sharded.overlap = False` undo the two."""
    def start(_module, args, kwargs):
        sparse = args[1] if len(args) > 1 else kwargs.get("sparse_features")
        if sparse is not None:
            sharded.start(sparse)

    sharded.overlap = True
    return model.register_forward_pre_hook(start, with_kwargs=True)


def open_shard_settings(settings: dict, table: EmbeddingBagConfig, shard: Shard) -> dict:
    """An open table's settings (`CachedEmbeddingBagCollection`'s `open_tables`) for its
    shard: a key-hash shard's keys start from the whole table's init bound, and its bound
    on keys held is the table's `max_rows` divided over the shards (ceil): a per-shard
    bound, under which each shard retires its own coldest keys."""
    if not shard.by_key:
        return settings
    bound = settings.get("max_rows")
    return {**settings, "max_rows": None if bound is None else -(-int(bound) // shard.parts),
            "init_bound": math.sqrt(1.0 / table.num_embeddings)}


def _lookups_into(shard: Shard, lengths: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(per-sample lengths, ids) of one feature's lookups that `shard` serves."""
    if shard.whole:
        return lengths, ids
    if shard.by_key:  # the raw keys it owns, as they are
        inside = shard.owns(ids)
        if bool(inside.all()):
            return lengths, ids
    else:
        inside = (ids >= shard.row_start) & (ids < shard.row_stop)
    sample = torch.repeat_interleave(torch.arange(lengths.numel(), device=ids.device), lengths)
    counts = torch.bincount(sample[inside], minlength=lengths.numel()).to(lengths.dtype)
    return counts, ids[inside] if shard.by_key else ids[inside] - shard.row_start


def block_capacity(largest: int) -> int:
    """Elements a routing block gets for an owner whose largest block was `largest`: 1/32
    more, so that the next batches' blocks fit as the ids of a row-wise table vary, in
    whole 8s.

    Example:
        >>> block_capacity(1000)  # 1000 + 31, in whole 8s
        1032
    """
    return -(-(largest + largest // 32) // 8) * 8


def _pack(blocks: list[list[torch.Tensor]], capacity: list[int]) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
    """The send buffer of the first all-to-all, each owner's block cut or padded with zeros
    to its capacity (written in one copy when all fit), and what remains of each block
    (None when all fit)."""
    sizes = [sum(p.numel() for p in parts) for parts in blocks]
    zeros = blocks[0][0].new_zeros(max(max(c - n, 0) for n, c in zip(sizes, capacity)))
    if all(n <= c for n, c in zip(sizes, capacity)):
        return torch.cat([p for parts, n, c in zip(blocks, sizes, capacity) for p in (*parts, zeros[: c - n])]), None
    whole = torch.cat([p for parts in blocks for p in parts]).split(sizes)
    send = torch.cat([p for block, c in zip(whole, capacity) for p in (block[:c], zeros[: max(c - block.numel(), 0)])])
    return send, [block[c:] for block, c in zip(whole, capacity)]
