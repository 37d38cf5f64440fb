"""`--tensorboard DIR`: the metrics log's records as TensorBoard scalars, beside the JSON lines.

The run skeleton writes every record once, to `MetricsLog`; this sink turns the numbers of
each into scalars, so that what TensorBoard shows is what the JSON lines hold:

- `step` records (every `--log-every` steps): `train/loss`, `train/loss_ema`,
  `train/samples_per_s` and the trainer's step fields (DLRM: `train/hit_rate`, bytes moved);
- `epoch` and `eval` records (an epoch's results and its validation; validation every
  `--eval-every` steps and at `--max-steps`): `epoch/<field>` (DLRM: `epoch/auc`,
  `epoch/logloss`; cf: `epoch/loss`, `epoch/recall@20`; face: `epoch/lfw/accuracy`);
- the x axis is the global step of a run of steps, the epoch of a run of epochs (cf).

A resumed run opens the writer with `purge_step` just past the checkpoint's step, so that what the
killed run logged after its last checkpoint (and the resumed run logs again) is shown once.
"""
from __future__ import annotations

import math
from pathlib import Path

from embcache.errors import UserFacingError

# record keys that are positions or labels, not measurements
_NOT_SCALARS = {"event", "epoch", "step", "split", "partial", "kind", "samples"}


def scalars(record: dict, prefix: str) -> dict[str, float]:
    """The finite numbers of `record` (nested dicts flattened with '/') under `prefix`.

    >>> scalars({"event": "epoch", "epoch": 2, "auc": 0.8, "lfw": {"accuracy": 0.9}, "split": "val"}, "epoch")
    {'epoch/auc': 0.8, 'epoch/lfw/accuracy': 0.9}
    """
    out: dict[str, float] = {}
    for key, value in record.items():
        if key in _NOT_SCALARS:
            continue
        if isinstance(value, dict):
            out.update(scalars(value, f"{prefix}/{key}"))
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            out[f"{prefix}/{key}"] = float(value)
    return out


class TensorBoardLog:
    """A `SummaryWriter` on `directory` fed with metrics-log records (`write`)."""

    def __init__(self, directory: str, purge_step: int | None = None):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as err:  # tensorboard is an install requirement; a trimmed environment lacks it
            raise UserFacingError(f"--tensorboard {directory}: the tensorboard package is not installed "
                                  f"(pip install tensorboard): {err}") from None
        try:
            Path(directory).mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise UserFacingError(f"--tensorboard {directory}: cannot create the directory: {err.strerror}") from None
        self.writer = SummaryWriter(log_dir=directory, purge_step=purge_step)

    def write(self, record: dict) -> None:
        event = record.get("event")
        if event == "step":
            x, values = record["step"], scalars(record, "train")
        elif event in ("epoch", "eval"):
            x, values = record.get("step", record.get("epoch")), scalars(record, "epoch")
        else:
            return
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, x)
        if event != "step":
            self.writer.flush()  # an epoch's results are there for a TensorBoard already open

    def close(self) -> None:
        self.writer.close()
