"""CTR evaluation of a DLRM: AUC and log loss over a split."""
from __future__ import annotations

import torch


def binary_metrics(logits: torch.Tensor, labels: torch.Tensor) -> dict:
    """AUC and log loss (torchmetrics' AUROC; log loss from the logits, stable).

    Example:
        >>> m = binary_metrics(torch.tensor([2.0, -1.0, 0.5, -3.0]), torch.tensor([1, 0, 1, 0]))
        >>> m["auc"], m["samples"], m["positive_rate"]
        (1.0, 4, 0.5)
    """
    from torchmetrics.functional.classification import binary_auroc

    labels = labels.float()
    logloss = torch.nn.functional.binary_cross_entropy_with_logits(logits.float(), labels).item()
    auc = binary_auroc(torch.sigmoid(logits.float()), labels.long()).item() if labels.numel() else float("nan")
    return {"auc": auc, "logloss": logloss, "samples": int(labels.numel()),
            "positive_rate": float(labels.mean()) if labels.numel() else float("nan")}
