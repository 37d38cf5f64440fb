"""Evaluation metrics and the JSON-lines log every training loop writes."""
from __future__ import annotations

import json
import os
import resource
from pathlib import Path

import torch


class MetricsLog:
    """Append-only JSON-lines file: one object per event (step, epoch, eval, summary).
    Opened in append mode so a resumed run continues the same file."""

    def __init__(self, path: str | os.PathLike | None):
        self.path = Path(path) if path else None
        if self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, **record) -> None:
        if self.path:
            with open(self.path, "a") as f:
                f.write(json.dumps(record, default=float) + "\n")


def binary_metrics(logits: torch.Tensor, labels: torch.Tensor) -> dict:
    """AUC and log loss (torchmetrics' AUROC; log loss from the logits, stable)."""
    from torchmetrics.functional.classification import binary_auroc

    labels = labels.float()
    logloss = torch.nn.functional.binary_cross_entropy_with_logits(logits.float(), labels).item()
    auc = binary_auroc(torch.sigmoid(logits.float()), labels.long()).item() if labels.numel() else float("nan")
    return {"auc": auc, "logloss": logloss, "samples": int(labels.numel()),
            "positive_rate": float(labels.mean()) if labels.numel() else float("nan")}


def peak_memory(device: torch.device) -> dict:
    """Peak resident host memory of this process and peak device memory allocated."""
    out = {"peak_host_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if device.type == "cuda":
        out["peak_device_mib"] = torch.cuda.max_memory_allocated(device) / 2**20
    return out
