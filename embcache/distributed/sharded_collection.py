"""`ShardedEmbeddingBagCollection`: the model-parallel sparse part of a hybrid-parallel DLRM.

Each rank reads its own slice of every global batch, but the rows its samples need live on
their owner ranks (`placement.plan`). A forward therefore moves data twice:

1. **ids to owners** (all-to-all): every rank sends, for each shard, its samples' lengths
   and ids (a row-wise shard gets only the ids in its range, shifted to start at 0);
2. the owner looks the whole global batch up in its own cached collection, in global
   sample order, so each row's gradient is summed over the same samples in the same order
   as on one process;
3. **pooled embeddings back** (all-to-all with autograd): each rank receives `[B_local, D]`
   per owner and assembles the features in the model's order (adding the partial sums of
   a row-wise table). The backward sends the gradients the same way in reverse, and the
   owner's cache applies them to its rows during `loss.backward()`.

`prefetch(batch)` does step 1 for a coming batch while this one trains and keeps the
result, so the ids of a batch cross the network once; up to `MAX_PENDING` routed batches
wait in order (a trainer prefetching D batches ahead has D of them). On one process none of
this happens: the collection is the local one.

The exchanges run on a process group of their own, so they cannot interleave with the
data-parallel all-reduces that DDP launches during the same backward.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist
from torch import nn

from embcache.sparse_types import EmbeddingBagConfig, KeyedJaggedTensor, KeyedTensor

from .placement import Shard
from .world import all_sum, collective_device, current, new_group

# routed batches kept for coming forwards (the cache keeps as many pending prefetches)
MAX_PENDING = 8


def shard_config(table: EmbeddingBagConfig, shard: Shard) -> EmbeddingBagConfig:
    """The config of `shard` on its rank: the table itself when whole, else its rows
    `[row_start, row_stop)`, initialised as those rows of the whole table would be."""
    if shard.whole:
        return table

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


class ShardedEmbeddingBagCollection(nn.Module):
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
        self._pending: deque[tuple[KeyedJaggedTensor, _Routed]] = deque(maxlen=MAX_PENDING)
        self.comm_bytes = {"ids": 0, "pooled": 0}

    # --------------------------------------------------------- torchrec's interface
    def embedding_bag_configs(self) -> list[EmbeddingBagConfig]:
        return self._configs

    def is_weighted(self) -> bool:
        return False

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        if not self.world.distributed:
            return self.local(features)
        routed = self._take_routed(features)
        pooled = self._local_pooled(routed)
        return self._to_features(self._return_pooled(pooled, routed), features.stride())

    def prefetch(self, features: KeyedJaggedTensor) -> None:
        """Route a coming batch's ids now and have the owners load its rows. Collective under
        torchrun: every rank prefetches the same batches (its own slices), in order."""
        if not self.world.distributed:
            self.local.prefetch(features)
            return
        routed = self._route(features)
        self._pending.append((features, routed))
        if self.local is not None:
            self.local.prefetch(routed.kjt)

    def pending_prefetches(self) -> int:
        """Prefetched batches not yet looked up, the same answer on every rank (collective
        under torchrun: a rank without tables holds none, the owners agree)."""
        mine = self.local.pending_prefetches() if self.local is not None else 0
        if not self.world.distributed:
            return mine
        owners = all_sum({"owners": int(self.local is not None), "pending": mine})
        return owners["pending"] // max(owners["owners"], 1)

    # --------------------------------------------------------- step 1: ids to owners
    def _take_routed(self, features: KeyedJaggedTensor) -> _Routed:
        """The batch's routed ids: prefetched (the batches prefetched before it are dropped:
        they will not come), or routed now (the pending ones are kept: they are for later
        batches, as after an evaluation between two steps)."""
        for i, (pending, _) in enumerate(self._pending):
            if pending is features:
                for _ in range(i):
                    self._pending.popleft()
                return self._pending.popleft()[1]
        return self._route(features)

    def _route(self, kjt: KeyedJaggedTensor) -> _Routed:
        batch = kjt.stride()
        lengths = kjt.lengths().view(len(kjt.keys()), batch)
        per_key = dict(zip(kjt.keys(), zip(lengths.unbind(0), kjt.values().split(lengths.sum(1).tolist()))))
        send_lengths, send_values = [], []
        for served in self._served:
            parts = [_lookups_into(shard, *per_key[f]) for shard, f in served]
            send_lengths.append(torch.cat([p[0] for p in parts]) if parts else lengths.new_zeros(0))
            send_values.append(torch.cat([p[1] for p in parts]) if parts else kjt.values().new_zeros(0))
        # NCCL exchanges device tensors only: ids from the host (a cached run keeps them there) move
        device = collective_device()
        send_lengths = [t.to(device, non_blocking=True) for t in send_lengths]
        send_values = [t.to(device, non_blocking=True) for t in send_values]
        counts = torch.tensor([[v.numel(), batch] for v in send_values], dtype=torch.long, device=device)
        recv_counts = torch.empty_like(counts)
        dist.all_to_all_single(recv_counts.view(-1), counts.view(-1), group=self._group)
        values_from, batch_from = recv_counts[:, 0].tolist(), recv_counts[:, 1].tolist()
        n_mine = len(self._served[self.world.rank])
        recv_lengths = self._exchange(torch.cat(send_lengths), [t.numel() for t in send_lengths],
                                      [n_mine * b for b in batch_from])
        recv_values = self._exchange(torch.cat(send_values), [t.numel() for t in send_values], values_from)
        self.comm_bytes["ids"] += _sent_bytes(send_lengths, self.world.rank) + _sent_bytes(send_values, self.world.rank)
        return _Routed(self._owner_kjt(recv_lengths, recv_values, batch_from, values_from, n_mine), batch_from)

    def _exchange(self, send: torch.Tensor, send_splits: list[int], recv_splits: list[int]) -> torch.Tensor:
        out = send.new_empty(sum(recv_splits))
        dist.all_to_all_single(out, send, recv_splits, send_splits, group=self._group)
        return out

    def _owner_kjt(self, lengths: torch.Tensor, values: torch.Tensor, batch_from: list[int],
                   values_from: list[int], n_mine: int) -> KeyedJaggedTensor:
        """The global batch's lookups into this rank's shards, samples in rank order."""
        per_source_lengths = [part.view(n_mine, b) for part, b in zip(lengths.split([n_mine * b for b in batch_from]),
                                                                     batch_from)]
        per_source_values = []
        for part, lens in zip(values.split(values_from), per_source_lengths):
            per_source_values.append(part.split(lens.sum(1).tolist()))
        keys = [shard.feature_key(f) for shard, f in self._served[self.world.rank]]
        out_lengths = [torch.cat([lens[j] for lens in per_source_lengths]) for j in range(n_mine)]
        out_values = [torch.cat([vals[j] for vals in per_source_values]) for j in range(n_mine)]
        return KeyedJaggedTensor(keys=keys, values=torch.cat(out_values) if out_values else values,
                                 lengths=torch.cat(out_lengths) if out_lengths else lengths)

    # --------------------------------------------------------- steps 2 and 3
    def _local_pooled(self, routed: _Routed) -> torch.Tensor:
        """`[B_global, D_mine]`: this rank's shards looked up for every rank's samples."""
        if self.local is not None and len(routed.kjt.keys()):
            return self.local(routed.kjt).values()
        # a rank without tables still takes part in the backward exchange
        empty = torch.zeros(sum(routed.batch_per_rank), 0, requires_grad=torch.is_grad_enabled())
        return empty

    def _return_pooled(self, pooled: torch.Tensor, routed: _Routed) -> list[torch.Tensor]:
        """Each owner's `[B_local, D_owner]` block for this rank's samples."""
        batch = routed.batch_per_rank[self.world.rank]
        width = [sum(self._dim[f] for _, f in served) for served in self._served]
        send_splits = [b * pooled.shape[1] for b in routed.batch_per_rank]
        recv_splits = [batch * w for w in width]
        send = pooled.reshape(-1)
        recv = (_AllToAll.apply(send, send_splits, recv_splits, self._group)
                if torch.is_grad_enabled() and send.requires_grad else self._exchange(send, send_splits, recv_splits))
        sent = sum(n for r, n in enumerate(send_splits) if r != self.world.rank)
        self.comm_bytes["pooled"] += sent * pooled.element_size()
        return [block.view(batch, w) for block, w in zip(recv.split(recv_splits), width)]

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


class _AllToAll(torch.autograd.Function):
    """`all_to_all_single` whose backward sends the gradients back the way the values came."""

    @staticmethod
    def forward(ctx, send, send_splits, recv_splits, group):
        ctx.splits, ctx.group = (send_splits, recv_splits), group
        out = send.new_empty(sum(recv_splits))
        dist.all_to_all_single(out, send.contiguous(), recv_splits, send_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        send_splits, recv_splits = ctx.splits
        back = grad.new_empty(sum(send_splits))
        dist.all_to_all_single(back, grad.contiguous(), send_splits, recv_splits, group=ctx.group)
        return back, None, None, None


def _lookups_into(shard: Shard, lengths: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(per-sample lengths, ids) of one feature's lookups that `shard` serves."""
    if shard.whole:
        return lengths, ids
    inside = (ids >= shard.row_start) & (ids < shard.row_stop)
    sample = torch.repeat_interleave(torch.arange(lengths.numel(), device=ids.device), lengths)
    counts = torch.bincount(sample[inside], minlength=lengths.numel()).to(lengths.dtype)
    return counts, ids[inside] - shard.row_start


def _sent_bytes(parts: list[torch.Tensor], me: int) -> int:
    return sum(t.numel() * t.element_size() for r, t in enumerate(parts) if r != me)
