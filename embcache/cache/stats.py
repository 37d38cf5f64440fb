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
        """Restore `to_tensor`'s output, also one of an earlier version: fields are only
        ever appended, so a shorter tensor leaves the later ones at 0."""
        check_stats_tensor(t)
        self.reset()
        for f, v in zip(fields(self), t.tolist()):
            setattr(self, f.name, int(v))


# the counters of the first checkpoints (hits .. batches); `bypassed_rows` came later
_FIRST_FIELDS = 7


def check_stats_tensor(t: torch.Tensor) -> None:
    """Raise ValueError unless `t` is a `CacheStats.to_tensor` of this or an earlier version."""
    count = len(fields(CacheStats))
    if t.dim() != 1 or not _FIRST_FIELDS <= t.numel() <= count:
        raise ValueError(f"checkpoint statistics have {t.numel()} fields, this cache's "
                         f"{_FIRST_FIELDS} to {count}")
