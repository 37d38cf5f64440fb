"""CTR evaluation of a DLRM: AUC and log loss over a split."""
from __future__ import annotations

import torch


def binary_metrics(logits: torch.Tensor, labels: torch.Tensor) -> dict:
    """AUC and log loss (torchmetrics' AUROC; log loss from the logits, stable).

    AUC ranks positives against negatives: with one label only it has no value (torchmetrics
    gives 0.0 and a warning, which would read as a model ranking every pair wrong), so it is
    None there, with `not_scored` saying why; the log loss is still the split's.

    Example:
        >>> m = binary_metrics(torch.tensor([2.0, -1.0, 0.5, -3.0]), torch.tensor([1, 0, 1, 0]))
        >>> m["auc"], m["samples"], m["positive_rate"]
        (1.0, 4, 0.5)
        >>> one = binary_metrics(torch.tensor([2.0, -1.0]), torch.tensor([1, 1]))
        >>> one["auc"], one["not_scored"]
        (None, 'AUC needs both labels: its 2 rows are all 1')
    """
    from torchmetrics.functional.classification import binary_auroc

    labels = labels.float()
    n = int(labels.numel())
    logloss = torch.nn.functional.binary_cross_entropy_with_logits(logits.float(), labels).item()
    out = {"auc": None, "logloss": logloss, "samples": n, "positive_rate": float(labels.mean()) if n else float("nan")}
    positives = int(labels.sum().item()) if n else 0
    if 0 < positives < n:
        out["auc"] = binary_auroc(torch.sigmoid(logits.float()), labels.long()).item()
    elif n:
        out["not_scored"] = f"AUC needs both labels: its {n:,} rows are all {1 if positives else 0}"
    return out
