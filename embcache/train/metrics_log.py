"""A run's metrics log: JSON lines, one object per event (`start`, `step`, `epoch`, `summary`
or `diverged`), appended so that a resumed run continues the same file, and mirrored to
TensorBoard with `--tensorboard`."""
from __future__ import annotations

import json
import os
from pathlib import Path


class MetricsLog:
    """Append-only JSON-lines file: one object per event. Opened in append mode so that a
    resumed run continues the same file. With `open_tensorboard`, every record also goes
    to TensorBoard (`embcache.train.tensorboard_log`)."""

    def __init__(self, path: str | os.PathLike | None):
        self.path = Path(path) if path else None
        self.tensorboard = None
        if self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def open_tensorboard(self, directory: str | None, purge_step: int | None = None) -> None:
        if directory:
            from embcache.train.tensorboard_log import TensorBoardLog

            self.tensorboard = TensorBoardLog(directory, purge_step)

    def write(self, **record) -> None:
        if self.path:
            with open(self.path, "a") as f:
                f.write(json.dumps(record, default=float) + "\n")
        if self.tensorboard is not None:
            self.tensorboard.write(record)

    def close(self) -> None:
        if self.tensorboard is not None:
            self.tensorboard.close()
            self.tensorboard = None
