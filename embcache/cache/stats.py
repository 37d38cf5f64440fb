"""Counters a cache keeps about itself, shared by every working set in the project."""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields

import torch


@dataclass
class CacheStats:
    """Hits and misses count unique rows per batch: a row looked up five times in one
    batch is one hit or one miss. Bytes count rows (with optimizer state) moved between
    the host store and the device cache, whichever device the cache is on."""

    hits: int = 0
    misses: int = 0
    evictions: int = 0
    bytes_h2d: int = 0
    bytes_d2h: int = 0
    overflow_rows: int = 0  # missed rows served beside the cache: more than it could make room for
    batches: int = 0
    bypassed_rows: int = 0  # missed rows served beside the cache: admission control declined them

    @property
    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0

    def as_dict(self) -> dict:
        return {**asdict(self), "hit_rate": self.hit_rate}

    def reset(self) -> None:
        for f in fields(self):
            setattr(self, f.name, 0)

    def to_tensor(self) -> torch.Tensor:
        return torch.tensor([getattr(self, f.name) for f in fields(self)], dtype=torch.int64)

    def load_tensor(self, t: torch.Tensor) -> None:
        for f, v in zip(fields(self), t.tolist()):
            setattr(self, f.name, int(v))
