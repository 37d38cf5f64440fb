"""Classification heads for face recognition, all with a margin softmax (ArcFace or CosFace):

- `FullFC`: one weight row per class, trained by the main optimizer (the baseline whose
  memory and time grow with the number of classes).
- `PartialFC`: the same weight table, but each step scores only the batch's classes plus a
  random sample of the others (`sample_rate`), and updates only those rows (SGD with
  momentum, per row).
- `DCPHead`: no weight table at all; the classes are the slots of a `DynamicClassPool`,
  filled with gallery features. Memory and time depend on Q, not on the number of classes.

Every head has the same interface: `loss(feats, labels, ...)` -> scalar, `after_backward(lr)`
(its own parameter updates, if any) and `state_dict()`.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .choices import MARGINS
from .class_pool import DynamicClassPool


def apply_margin(cos: torch.Tensor, kind: str, margin: float) -> torch.Tensor:
    """The target-class cosine after the margin: ArcFace cos(theta + m), CosFace cos - m.

    For ArcFace, once theta + m would pass pi, cos(theta + m) would rise again with theta;
    there it continues as cos - m*sin(m), which keeps the logit decreasing in theta."""
    if kind == "cosface":
        return cos - margin
    if kind != "arcface":
        raise ValueError(f"margin must be one of {MARGINS}, got {kind!r}")
    cos = cos.clamp(-1.0, 1.0)
    sin = torch.sqrt((1.0 - cos * cos).clamp_min(1e-12))
    shifted = cos * math.cos(margin) - sin * math.sin(margin)
    return torch.where(cos > math.cos(math.pi - margin), shifted, cos - margin * math.sin(margin))


def margin_softmax_loss(cos: torch.Tensor, target: torch.Tensor, kind: str, margin: float, scale: float,
                        valid: torch.Tensor | None = None, target_cos: torch.Tensor | None = None) -> torch.Tensor:
    """Per-row cross entropy of `scale * cos` with the margin on column `target`.

    Args:
        cos: [B, K] cosines to K class centres.
        target: [B] column of each row's class.
        valid: optional [K] mask; invalid columns take no part.
        target_cos: optional [B] cosine to use for the target column instead of
            `cos[i, target[i]]` (the DCP head scores a probe against the other view's feature).
    """
    picked = cos.gather(1, target[:, None]).squeeze(1) if target_cos is None else target_cos
    logits = cos * scale
    if valid is not None:
        logits = logits.masked_fill(~valid[None, :], float("-inf"))
    logits = logits.scatter(1, target[:, None], (apply_margin(picked, kind, margin) * scale)[:, None])
    return F.cross_entropy(logits, target, reduction="none")


def check_labels(labels: torch.Tensor, num_classes: int) -> None:
    if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= num_classes):
        bad = torch.nonzero((labels < 0) | (labels >= num_classes)).flatten()
        raise ValueError(f"label {int(labels[bad[0]])} at batch index {int(bad[0])} is outside "
                         f"[0, {num_classes}) ({bad.numel()} such labels in the batch)")


class FullFC(nn.Module):
    """One weight row per class; logits are cosines to every row.

    Args:
        num_classes, feat_dim: size of the weight table.
        margin, scale, kind: the margin softmax ("arcface" or "cosface").

    Example:
        >>> head = FullFC(100, 16)
        >>> head.loss(torch.randn(4, 16), torch.tensor([1, 2, 3, 4])).shape
        torch.Size([])
    """

    def __init__(self, num_classes: int, feat_dim: int, margin: float = 0.5, scale: float = 64.0,
                 kind: str = "arcface", seed: int = 0):
        super().__init__()
        self.num_classes, self.margin, self.scale, self.kind = int(num_classes), margin, scale, kind
        gen = torch.Generator().manual_seed(seed)
        self.weight = nn.Parameter(torch.randn(self.num_classes, feat_dim, generator=gen) * 0.01)

    def loss(self, feats: torch.Tensor, labels: torch.Tensor, **_) -> torch.Tensor:
        check_labels(labels, self.num_classes)
        cos = F.normalize(feats, dim=1) @ F.normalize(self.weight, dim=1).t()
        return margin_softmax_loss(cos, labels, self.kind, self.margin, self.scale).mean()

    def after_backward(self, lr: float) -> None:
        """Nothing: the weight is a parameter of the main optimizer."""


def sample_classes(labels: torch.Tensor, num_classes: int, num_sample: int,
                   generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Partial FC's classes of a step: (sorted class ids, column of each label among them).
    All positives, topped up to `num_sample` with uniformly drawn others; the draw is of
    `num_classes` scores from `generator`, so every rank that holds the same generator
    draws the same sample (the class-sharded head relies on that)."""
    positives = torch.unique(labels)
    if positives.numel() >= num_sample:
        rows = positives
    else:
        score = torch.rand(num_classes, generator=generator).to(labels.device)
        score[positives] = 2.0  # positives always in
        rows = torch.sort(torch.topk(score, num_sample, sorted=False).indices).values
    return rows, torch.searchsorted(rows, labels)


@torch.no_grad()
def sgd_rows(weight: torch.Tensor, momentum_buffer: torch.Tensor, rows: torch.Tensor, sub: torch.Tensor,
             grad: torch.Tensor, lr: float, momentum: float, weight_decay: float) -> None:
    """SGD with momentum and weight decay on rows `rows` of `weight` (whose values are `sub`),
    as torch.optim.SGD would do on those rows alone."""
    grad = grad + weight_decay * sub
    buf = momentum_buffer[rows].mul_(momentum).add_(grad)
    momentum_buffer[rows] = buf
    weight[rows] = sub - lr * buf


class SampledRowsSGD:
    """The update half of a head that scores a sample of class rows per step (Partial FC,
    and its class-sharded form): SGD with momentum on the sampled rows `_rows` (their
    gradient on the `_sub` copy), and the sampling generator kept in checkpoints."""

    @torch.no_grad()
    def after_backward(self, lr: float) -> None:
        if self._sub is None or self._sub.grad is None:
            return
        sgd_rows(self.weight, self.momentum_buffer, self._rows, self._sub.detach(), self._sub.grad, lr,
                 self.momentum, self.weight_decay)
        self._rows = self._sub = None

    def get_extra_state(self) -> dict:
        return {"generator": self.generator.get_state()}

    def set_extra_state(self, state: dict) -> None:
        self.generator.set_state(state["generator"])


class PartialFC(SampledRowsSGD, nn.Module):
    """Partial FC: per step, the positive classes of the batch plus a uniform sample of the
    other classes, `ceil(sample_rate * num_classes)` in all, are the softmax's classes. Only
    those rows get a gradient, and `after_backward` applies SGD with momentum and weight
    decay to them (per-row momentum, as torch.optim.SGD would on those rows).

    Example:
        >>> head = PartialFC(1000, 16, sample_rate=0.1)
        >>> loss = head.loss(torch.randn(4, 16, requires_grad=True), torch.tensor([1, 2, 3, 4]))
        >>> loss.backward(); head.after_backward(lr=0.1)
    """

    def __init__(self, num_classes: int, feat_dim: int, sample_rate: float = 0.1, margin: float = 0.5,
                 scale: float = 64.0, kind: str = "arcface", momentum: float = 0.9, weight_decay: float = 5e-4,
                 seed: int = 0):
        super().__init__()
        if not 0 < sample_rate <= 1:
            raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate}")
        self.num_classes, self.margin, self.scale, self.kind = int(num_classes), margin, scale, kind
        self.num_sample = max(1, math.ceil(sample_rate * self.num_classes))
        self.momentum, self.weight_decay = momentum, weight_decay
        gen = torch.Generator().manual_seed(seed)
        self.register_buffer("weight", torch.randn(self.num_classes, feat_dim, generator=gen) * 0.01)
        self.register_buffer("momentum_buffer", torch.zeros(self.num_classes, feat_dim))
        self.generator = torch.Generator().manual_seed(seed + 1)
        self._rows = self._sub = None

    def sample(self, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(sorted class ids scored this step, column of each label among them)."""
        return sample_classes(labels, self.num_classes, self.num_sample, self.generator)

    def loss(self, feats: torch.Tensor, labels: torch.Tensor, **_) -> torch.Tensor:
        check_labels(labels, self.num_classes)
        rows, target = self.sample(labels)
        self._rows, self._sub = rows, self.weight[rows].requires_grad_()
        cos = F.normalize(feats, dim=1) @ F.normalize(self._sub, dim=1).t()
        return margin_softmax_loss(cos, target, self.kind, self.margin, self.scale).mean()


def dcp_loss(probe: torch.Tensor, slots: torch.Tensor, centres: torch.Tensor, valid: torch.Tensor, kind: str,
             margin: float, scale: float, topk: int, positives: torch.Tensor | None = None,
             has_positive: torch.Tensor | None = None, batch_total: int | None = None) -> torch.Tensor:
    """The dynamic class pool's loss, averaged over the batch (summed over these probes and
    divided by `batch_total`, the global batch size, when the batch is split over ranks).

    A probe whose identity is in the pool (`slots[i] >= 0`) gets a margin softmax over the
    pool's occupied slots with its slot as the target; where `has_positive[i]`, the target
    cosine is to `positives[i]` (the other view's gallery feature) instead of the slot's
    centre. A probe whose identity is not in the pool gets the mean of its `topk` largest
    cosines to the pool, each clamped at zero (only positive cosines push).

    Args:
        probe: [B, D] probe features (normalised here).
        slots: [B] pool slot of each probe's identity, -1 if absent.
        centres: [Q, D] normalised class centres (no gradient); valid: [Q] occupied slots.
    """
    p = F.normalize(probe, dim=1)
    cos = p @ centres.t()
    inside = slots >= 0
    total = probe.new_zeros(())
    if bool(inside.any()):
        target_cos = None
        if positives is not None:
            own = cos[inside].gather(1, slots[inside][:, None]).squeeze(1)
            other = (p[inside] * positives[inside]).sum(1)
            target_cos = torch.where(has_positive[inside], other, own)
        total = total + margin_softmax_loss(cos[inside], slots[inside], kind, margin, scale, valid,
                                            target_cos).sum()
    n_valid = int(valid.sum())
    if bool((~inside).any()) and n_valid:
        k = min(topk, n_valid)
        outside = cos[~inside].masked_fill(~valid[None, :], float("-inf"))
        total = total + torch.topk(outside, k, dim=1).values.clamp_min(0).mean(1).sum()
    return total / (probe.shape[0] if batch_total is None else batch_total)


class DCPHead(nn.Module):
    """The F2C head: a `DynamicClassPool` of Q slots and the `dcp_loss` over it.

    Args:
        num_classes: size of the label space (nothing is allocated per class).
        feat_dim: feature dimension; num_slots: Q.
        margin, scale, kind: the margin softmax; topk: k of the out-of-pool loss.

    Example:
        >>> head = DCPHead(10**6, 16, num_slots=64)
        >>> g = F.normalize(torch.randn(4, 16), dim=1)
        >>> head.update_pool(torch.tensor([5, 6, 5, 6]), g)
        >>> float(head.loss(torch.randn(2, 16), torch.tensor([5, 7]))) > 0
        True
    """

    def __init__(self, num_classes: int, feat_dim: int, num_slots: int, margin: float = 0.5, scale: float = 64.0,
                 kind: str = "arcface", topk: int = 5, device: torch.device | str | None = None):
        super().__init__()
        self.num_classes, self.margin, self.scale, self.kind, self.topk = int(num_classes), margin, scale, kind, topk
        self.pool = DynamicClassPool(num_slots, feat_dim, num_classes, device=device)

    def update_pool(self, labels: torch.Tensor, gallery_feats: torch.Tensor) -> None:
        self.pool.update(labels, F.normalize(gallery_feats.detach(), dim=1))

    def loss(self, feats: torch.Tensor, labels: torch.Tensor, positives: torch.Tensor | None = None,
             has_positive: torch.Tensor | None = None, batch_total: int | None = None) -> torch.Tensor:
        slots = self.pool.lookup(labels)
        if positives is not None:
            positives = F.normalize(positives.detach(), dim=1)
        return dcp_loss(feats, slots, self.pool.centres(), self.pool.occupied(), self.kind, self.margin,
                        self.scale, self.topk, positives, has_positive, batch_total)

    def after_backward(self, lr: float) -> None:
        """Nothing: the pool is written by `update_pool` from the gallery net."""
