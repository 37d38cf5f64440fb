"""The face trainer's head factory: the head named on the command line (`dcp`, `fc` or `pfc`,
`embcache.nn.heads`), or, under several ranks, the class-sharded form of fc / pfc
(`embcache.face.class_sharded`). It sits with the trainer because it picks between
the model's heads and the distributed ones: the floors below it import neither.

Example:
    >>> head = build_head("pfc", 1000, 16, sample_rate=0.1)
    >>> type(head).__name__, head.num_sample
    ('PartialFC', 100)
"""
from __future__ import annotations

import torch
from torch import nn

from embcache.face.config import pool_slots  # with the settings: checkpoints' pools are checked against it
from embcache.nn.choices import HEADS
from embcache.nn.heads import DCPHead, FullFC, PartialFC


def build_head(kind: str, num_classes: int, feat_dim: int, *, pool_ratio: float = 0.1, min_pool: int = 1,
               sample_rate: float = 0.1,
               margin_type: str = "arcface", margin: float = 0.5, scale: float = 64.0, topk: int = 5,
               momentum: float = 0.9, weight_decay: float = 5e-4, seed: int = 0,
               device: torch.device | str | None = None, world=None) -> nn.Module:
    """`dcp` | `fc` | `pfc` with the shared margin settings (`pool_ratio` and `min_pool` set
    Q for dcp, `pool_slots`).
    With a `world` of several ranks, fc and pfc are their class-sharded versions (this
    rank's range of classes); dcp's pool is the same on every rank."""
    if world is not None and world.distributed and kind in ("fc", "pfc"):
        from embcache.face.class_sharded import ShardedFullFC, ShardedPartialFC  # a run of several ranks only

        if kind == "fc":
            return ShardedFullFC(num_classes, feat_dim, margin, scale, margin_type, seed, world).to(device or "cpu")
        return ShardedPartialFC(num_classes, feat_dim, sample_rate, margin, scale, margin_type, momentum,
                                weight_decay, seed, world).to(device or "cpu")
    if kind == "dcp":
        q = pool_slots(pool_ratio, num_classes, min_pool)
        return DCPHead(num_classes, feat_dim, q, margin, scale, margin_type, topk, device=device)
    if kind == "fc":
        return FullFC(num_classes, feat_dim, margin, scale, margin_type, seed=seed).to(device or "cpu")
    if kind == "pfc":
        return PartialFC(num_classes, feat_dim, sample_rate, margin, scale, margin_type, momentum, weight_decay,
                         seed=seed).to(device or "cpu")
    raise ValueError(f"head must be one of {HEADS}, got {kind!r}")
