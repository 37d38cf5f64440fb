"""One training batch of a CTR data set (what `CTRBatches` yields and a DLRM step takes)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from embcache.sparse_types import KeyedJaggedTensor


@dataclass
class Batch:
    """One training batch.

    Args:
        dense: float32 `[B, num_dense]`.
        sparse: keys = sparse feature names in meta order; lengths are 1 per sample for a
            one-hot feature, the list length for a multi-hot one.
        labels: float32 `[B]` of 0.0 / 1.0 (what `BCEWithLogitsLoss` takes).
        global_size: rows of the global batch this one is a rank's slice of (its own
            length when the batch is not split).
    """

    dense: torch.Tensor
    sparse: KeyedJaggedTensor
    labels: torch.Tensor
    global_size: int | None = None

    def to(self, device: torch.device | str, non_blocking: bool = False,
           sparse_device: torch.device | str | None = None) -> "Batch":
        """The batch on `device`, its ids on `sparse_device` (default: `device` too)."""
        sparse_device = torch.device(device if sparse_device is None else sparse_device)
        return Batch(self.dense.to(device, non_blocking=non_blocking),
                     self.sparse.to(sparse_device, non_blocking=non_blocking),
                     self.labels.to(device, non_blocking=non_blocking), self.global_size)

    def __len__(self) -> int:
        return self.labels.shape[0]
