"""A run's metrics log: JSON lines, one object per event (`start`, `step`, `eval`, `epoch`,
`summary`, `diverged` or `interrupted`), appended so that a resumed run continues the same
file, and mirrored to TensorBoard with `--tensorboard`.

A resumed run's file has each step once: a checkpoint records how long the log was when it
was written (`mark`), and the resumed run removes the progress records (`step`, `eval`,
`epoch`) the killed run wrote after that point (`supersede`), since it trains those steps
again and writes their records anew; the other records (`start`, `interrupted`, `diverged`,
`summary`) stay, and the resumed run's `start` says where it resumed from."""
from __future__ import annotations

import json
import os
from pathlib import Path

PROGRESS_EVENTS = ("step", "eval", "epoch")  # what a resumed run writes again for the steps it trains again


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

    def mark(self) -> dict | None:
        """Where the file stands (its path and length), for a checkpoint: what a run resumed
        from it finds written after this is the killed run's (None: no file)."""
        if not self.path:
            return None
        return {"path": str(self.path.resolve()), "bytes": self.path.stat().st_size if self.path.is_file() else 0}

    def supersede(self, mark: dict | None) -> int:
        """For a run resumed from a checkpoint that recorded `mark`: remove the progress
        records written after it (and a line the kill cut short), keep the others; returns
        how many went. Nothing changes when this log is another file than the mark's, or
        shorter than it (replaced since), or the checkpoint has no mark (older versions)."""
        if not (self.path and mark and self.path.is_file()) or Path(mark["path"]) != self.path.resolve():
            return 0
        with open(self.path, "r+b") as f:
            if f.seek(0, os.SEEK_END) < mark["bytes"]:
                return 0
            f.seek(mark["bytes"])
            kept, dropped = [], 0
            for line in f.read().splitlines():
                try:
                    record = json.loads(line)
                except ValueError:  # cut short by the kill
                    record = None
                if not isinstance(record, dict) or record.get("event") in PROGRESS_EVENTS:
                    dropped += 1
                else:
                    kept.append(line + b"\n")
            f.seek(mark["bytes"])
            f.truncate()
            f.write(b"".join(kept))
        return dropped

    def close(self) -> None:
        if self.tensorboard is not None:
            self.tensorboard.close()
            self.tensorboard = None
