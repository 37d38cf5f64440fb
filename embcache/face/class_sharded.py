"""Class-sharded classification heads for face training on several ranks (Partial FC's
model parallelism): rank r holds the class centres of its range `slice_bounds(C, N, r)`.

Each step the ranks' features (with their gradient path) and labels are gathered, in rank
order, so every rank scores the whole global batch against its own classes. The margin
softmax is normalised across the shards with three all-reduces (the row maximum, the sum of
exponentials and the target logit); its backward is local (softmax minus one-hot of this
shard's columns), and the gradient of the gathered features goes back to the rank that made
them (the all-gather's backward sums it over the shards). Summed over ranks by DDP, the
probe's gradient is then the one-process gradient of the global batch's mean loss, and each
shard's centres get exactly their rows of it: N ranks train what one process trains.

On disk the heads keep the one-process format (the whole table, rows in class order): the
shards are gathered to rank 0 for a checkpoint and sliced again on load, so a checkpoint
moves between world sizes.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from embcache.nn.heads import SampledRowsSGD, apply_margin, check_labels, sample_classes

from embcache.distributed.gathers import gather_counts, gather_rows, gather_shards_to_main
from embcache.partition import slice_bounds

from embcache.distributed.world import World, collective_device


# ------------------------------------------------------------- the sharded margin softmax
class _ShardedCrossEntropy(torch.autograd.Function):
    """Per-row cross entropy of logits whose columns are spread over the ranks.

    forward(logits [B, K_r], target [B]: this shard's column of the row's class, -1 when the
    class lives on another shard) -> [B] losses, the same on every rank."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        rows = torch.arange(logits.shape[0], device=logits.device)
        here = target >= 0
        top = logits.amax(1) if logits.shape[1] else logits.new_full((logits.shape[0],), -math.inf)
        _all_reduce(top, dist.ReduceOp.MAX)
        exp = torch.exp(logits - top[:, None])
        total = exp.sum(1)
        _all_reduce(total, dist.ReduceOp.SUM)
        picked = logits.new_zeros(logits.shape[0])
        picked[here] = logits[rows[here], target[here]]
        _all_reduce(picked, dist.ReduceOp.SUM)
        ctx.save_for_backward(exp / total[:, None], target)
        return torch.log(total) + top - picked

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        prob, target = ctx.saved_tensors
        here = torch.nonzero(target >= 0).flatten()
        g = prob.clone()
        g[here, target[here]] -= 1.0
        return g * grad[:, None], None


def _all_reduce(t: torch.Tensor, op) -> None:
    dev = t.device
    moved = t.to(collective_device())
    dist.all_reduce(moved, op=op)
    t.copy_(moved.to(dev))


def sharded_margin_loss(feats: torch.Tensor, labels: torch.Tensor, centres: torch.Tensor, class_ids: torch.Tensor,
                        kind: str, margin: float, scale: float) -> torch.Tensor:
    """Mean margin softmax of the global batch (`feats`, `labels`: every rank's rows) over
    the classes of all shards; this shard holds `centres` [K_r, D] of sorted `class_ids`."""
    cos = F.normalize(feats, dim=1) @ F.normalize(centres, dim=1).t()
    k = class_ids.numel()
    target = torch.full_like(labels, -1)
    if k:
        col = torch.searchsorted(class_ids, labels).clamp(max=k - 1)
        target = torch.where(class_ids[col] == labels, col, target)
    logits = cos * scale
    if k:
        picked = cos.gather(1, target.clamp_min(0)[:, None]).squeeze(1)
        onehot = F.one_hot(target.clamp_min(0), k).bool() & (target >= 0)[:, None]
        logits = torch.where(onehot, (apply_margin(picked, kind, margin) * scale)[:, None], logits)
    return _ShardedCrossEntropy.apply(logits, target).mean()


# ------------------------------------------------------------------------------ the heads
class _ShardedHead(nn.Module):
    """What both sharded heads share: the class range, the gathering of the global batch and
    the checkpoint in the one-process format."""

    global_loss = True  # `loss` is the global batch's mean, the same on every rank
    sharded = ("weight",)  # row-sharded tensors of the state dict

    def _init_range(self, num_classes: int, world: World) -> None:
        self.num_classes, self.world = int(num_classes), world
        self.lo, self.hi = slice_bounds(self.num_classes, world.size, world.rank)

    def _initial_rows(self, feat_dim: int, seed: int) -> torch.Tensor:
        """This shard's rows of the one-process initial table (drawn whole, then sliced, so
        that every world size starts from the same centres)."""
        gen = torch.Generator().manual_seed(seed)
        return (torch.randn(self.num_classes, feat_dim, generator=gen) * 0.01)[self.lo:self.hi].clone()

    def _global_batch(self, feats, labels, counts):
        check_labels(labels, self.num_classes)
        counts = counts if counts is not None else gather_counts([feats.shape[0]], self.world)[:, 0].tolist()
        return gather_rows(feats, counts, grad=True), gather_rows(labels, counts)

    def gathered_state_dict(self) -> dict | None:
        """The one-process state dict (whole tables) on rank 0, None elsewhere. Collective."""
        own = self.state_dict()
        whole = {k: gather_shards_to_main(own[k], self.num_classes, self.world) for k in self.sharded}
        return {**own, **whole} if self.world.is_main else None

    def load_gathered_state_dict(self, state: dict) -> None:
        """Load a one-process state dict: this shard's rows of its tables."""
        own = {k: (v[self.lo:self.hi] if k in self.sharded else v) for k, v in state.items()}
        self.load_state_dict(own)

    def shard_rows(self, table: torch.Tensor) -> torch.Tensor:
        return table[self.lo:self.hi]


class ShardedFullFC(_ShardedHead):
    """`FullFC` with its weight table split by class over the ranks; the shard is a
    parameter of the main optimizer (SGD acts row by row, so the shards' updates are the
    whole table's).

    Args:
        world: this rank's place (its class range is `slice_bounds(num_classes, size, rank)`).
    """

    def __init__(self, num_classes: int, feat_dim: int, margin: float, scale: float, kind: str, seed: int,
                 world: World):
        super().__init__()
        self._init_range(num_classes, world)
        self.margin, self.scale, self.kind = margin, scale, kind
        self.weight = nn.Parameter(self._initial_rows(feat_dim, seed))
        self.class_ids = torch.arange(self.lo, self.hi)

    def loss(self, feats: torch.Tensor, labels: torch.Tensor, counts: list[int] | None = None, **_) -> torch.Tensor:
        feats, labels = self._global_batch(feats, labels, counts)
        ids = self.class_ids.to(labels.device)
        return sharded_margin_loss(feats, labels, self.weight, ids, self.kind, self.margin, self.scale)

    def after_backward(self, lr: float) -> None:
        """Nothing: the shard is a parameter of the main optimizer."""


class ShardedPartialFC(SampledRowsSGD, _ShardedHead):
    """`PartialFC` with its tables split by class over the ranks. Every rank draws the
    one-process sample of classes (the same generator, the same scores for all classes: a
    vector of C floats per step, small beside a C/N x D shard) and scores the sampled
    classes of its range: the positives of the global batch that fall in it plus its share
    of the random negatives. So N ranks train the very classes one process trains.
    """

    sharded = ("weight", "momentum_buffer")

    def __init__(self, num_classes: int, feat_dim: int, sample_rate: float, margin: float, scale: float, kind: str,
                 momentum: float, weight_decay: float, seed: int, world: World):
        super().__init__()
        if not 0 < sample_rate <= 1:
            raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate}")
        self._init_range(num_classes, world)
        self.margin, self.scale, self.kind = margin, scale, kind
        self.num_sample = max(1, math.ceil(sample_rate * self.num_classes))
        self.momentum, self.weight_decay = momentum, weight_decay
        rows = self._initial_rows(feat_dim, seed)
        self.register_buffer("weight", rows)
        self.register_buffer("momentum_buffer", torch.zeros_like(rows))
        self.generator = torch.Generator().manual_seed(seed + 1)
        self._rows = self._sub = None

    def loss(self, feats: torch.Tensor, labels: torch.Tensor, counts: list[int] | None = None, **_) -> torch.Tensor:
        feats, labels = self._global_batch(feats, labels, counts)
        rows, _ = sample_classes(labels, self.num_classes, self.num_sample, self.generator)
        mine = rows[(rows >= self.lo) & (rows < self.hi)]
        self._rows = mine - self.lo
        self._sub = self.weight[self._rows].requires_grad_()
        return sharded_margin_loss(feats, labels, self._sub, mine, self.kind, self.margin, self.scale)
