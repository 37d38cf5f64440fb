"""Checkpoints that survive a kill: written to a temporary file, sealed with its CRC-32
(`embcache.integrity`), fsynced, then renamed over the old one, so a reader sees either the
previous checkpoint or the new one, never half of one. Loading checks the CRC before it reads
anything, and refuses a damaged, truncated or foreign file with one clear line. It unpickles
plain data only (`embcache.safe_load`): a file that would run code is refused, unless trusted."""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from embcache.errors import CheckpointError, DataOutputError, first_line
from embcache.integrity import open_verified, save_torch
from embcache.leftovers import claimed
from embcache.safe_load import UntrustedFileError, load_pickled

FORMAT_KEY = "embcache_checkpoint"
FORMAT_VERSION = 1


def save_checkpoint(payload: dict[str, Any], path: str | os.PathLike, kind: str) -> Path:
    """Atomically write `payload` (a dict of named parts) as a checkpoint of `kind`
    (e.g. "dlrm", "face") to `path`."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:  # a run killed (SIGKILL) while saving left its temporary file: the next save removes it
        with claimed(path, refuse=False):
            path.parent.mkdir(parents=True, exist_ok=True)
            save_torch({FORMAT_KEY: FORMAT_VERSION, "kind": kind, **payload}, tmp)  # sealed and fsynced
            os.replace(tmp, path)
    except OSError as err:  # a full disk, a directory taken away: one line naming the checkpoint
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise DataOutputError(f"{path}: cannot write the checkpoint: {err.strerror or first_line(err)}") from None
    try:  # make the rename itself durable
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError:
        pass
    return path


def load_checkpoint(path: str | os.PathLike, kind: str, trust: bool | None = None) -> dict[str, Any]:
    """Load a checkpoint written by `save_checkpoint` for the same `kind`, or raise
    CheckpointError naming the file and what is wrong with it. `trust` loads one that needs
    more than plain data (None: as `embcache.safe_load.trusting()` says)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint file")
    try:  # one handle for the check and the load: a run renaming its next checkpoint over
        with open_verified(path, "checkpoint") as file:  # this one meanwhile cannot mix two files
            try:
                payload = load_pickled(path, "checkpoint", trust, file=file)
            except UntrustedFileError:
                raise
            except Exception as err:  # torch raises many types for a damaged zip/pickle
                raise CheckpointError(
                    f"{path}: corrupt or truncated checkpoint ({type(err).__name__}: {first_line(err)})"
                ) from None
    except OSError as err:
        raise CheckpointError(f"{path}: cannot be read ({err.strerror or err})") from None
    if not isinstance(payload, dict) or payload.get(FORMAT_KEY) != FORMAT_VERSION:
        raise CheckpointError(f"{path}: not an embcache checkpoint (format v{FORMAT_VERSION})")
    if payload.get("kind") != kind:
        raise CheckpointError(f"{path}: a {payload.get('kind')!r} checkpoint, expected {kind!r}")
    return payload


def latest_checkpoint(directory: str | os.PathLike, pattern: str = "*.pt") -> Path | None:
    """The most recently written checkpoint in `directory`, or None."""
    directory = Path(directory)
    if not directory.is_dir():
        return None
    files = [p for p in directory.glob(pattern) if not p.name.startswith(".")]
    return max(files, key=lambda p: p.stat().st_mtime_ns, default=None)
