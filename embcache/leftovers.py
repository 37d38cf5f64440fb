"""What a writer killed outright (SIGKILL, power loss, the OOM killer) left beside its output:
Ctrl-C and SIGTERM remove the staged directory (`.NAME.tmp-PID`, `.NAME.export-tmp-PID`) and
the old output moved aside (`.NAME.old-PID`), SIGKILL cannot, and half a data set (gigabytes)
stayed there unseen. `claimed(out)` records who writes `out` (`.NAME.writer-PID`: host, PID
and the process's start, so a reused PID is not taken for the writer) and, before the writer
begins, removes what dead writers of `out` left, saying so in one line each; it refuses to
start while a writer it can prove alive writes the same `out`, and leaves, with one line,
whatever it cannot prove dead. Light: no torch."""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import sys
import time
from pathlib import Path

from embcache.errors import DataOutputError
from embcache.units import format_bytes

KINDS = ("tmp", "old", "export-tmp", "export-old", "writer")
QUIET_SECONDS = 3600  # a leftover without a writer record is taken for dead only after an hour untouched


class WriterAlive(DataOutputError):
    """Another process, proven alive, writes `out` now (its PID in `pid`)."""

    def __init__(self, message: str, pid: int):
        super().__init__(message)
        self.pid = pid


def process_start(pid: int) -> str | None:
    """This boot's id and `pid`'s start in clock ticks (Linux /proc), which differ for a
    process that reuses a dead writer's PID; None where /proc cannot say."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"{boot}:{stat.rsplit(')', 1)[1].split()[19]}"  # field 22, counted after the name
    except (OSError, IndexError):
        return None


def pid_alive(pid: int) -> bool:
    """A process `pid` exists on this host (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except (OverflowError, ValueError):  # no such PID can exist
        return False
    return True


@contextlib.contextmanager
def claimed(out: str | os.PathLike, refuse: bool = True):
    """Record this process as the writer of `out` for the block, after sweeping what dead
    writers of `out` left beside it (`sweep`); the record goes when the block ends."""
    out = Path(out)
    record = out.parent / f".{out.name}.writer-{os.getpid()}"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                      "start": process_start(os.getpid()), "time": time.time()}) + "\n")
    except OSError:
        record = None  # an unwritable parent: the writer's own error names it
    try:
        sweep(out, refuse=refuse)
        yield
    finally:
        if record is not None:
            with contextlib.suppress(OSError):
                record.unlink()


def leftovers(out: Path) -> dict[int, list[Path]]:
    """Other processes' entries beside `out`, by PID (`KINDS`)."""
    pattern = re.compile(rf"\.{re.escape(out.name)}\.({'|'.join(KINDS)})-(\d+)")
    found: dict[int, list[Path]] = {}
    try:
        entries = list(out.parent.iterdir())
    except OSError:
        return found
    for entry in entries:
        match = pattern.fullmatch(entry.name)
        if match and int(match[2]) != os.getpid():
            found.setdefault(int(match[2]), []).append(entry)
    return found


def sweep(out: Path, now: float | None = None, refuse: bool = True) -> None:
    """Remove the leftovers of `out`'s dead writers, one line each on stderr; leave the rest
    (a live or unprovable writer, another host's), one line each; DataOutputError when a
    writer proven alive writes `out` now and `refuse` (a checkpoint, saved mid-run: not)."""
    for pid, paths in sorted(leftovers(out).items()):
        verdict = _owner(pid, paths, time.time() if now is None else now)
        staged = [p for p in paths if not p.name.endswith(f".writer-{pid}")]
        if verdict == "alive" and refuse:
            raise WriterAlive(f"{out}: another embcache process (PID {pid}) is writing it now; wait for it to "
                              f"end, or choose another --out", pid)
        if verdict == "alive":
            verdict = f"process {pid} is writing {out.name} now"
        if verdict != "dead":
            if staged:
                _note(f"left {_names(staged)} ({format_bytes(_size(staged))}) beside {out} alone: {verdict}; "
                      f"remove it by hand once no process writes {out}")
            continue
        kept = [p for p in staged if p.name.rsplit(".", 1)[-1].startswith(("old-", "export-old-")) and not out.exists()]
        if kept:  # killed between its two renames: the previous data set, with `out` missing
            _note(f"left {_names(kept)} alone: the previous {out.name}, moved aside by process {pid} which was "
                  f"killed before it put the new one in place; rename it back to {out} if you want it")
        gone = [p for p in staged if p not in kept]
        size = _size(gone)
        failed = [p for p in gone if not _remove(p)]
        for record in (p for p in paths if p not in staged):
            with contextlib.suppress(OSError):
                record.unlink()
        if gone and not failed:
            _note(f"removed {_names(gone)} ({format_bytes(size)} freed): left by process {pid}, "
                  f"killed before it finished writing {out}")
        elif failed:
            _note(f"could not remove {_names(failed)} (left by process {pid}, no longer running); remove it by hand")


def _owner(pid: int, paths: list[Path], now: float) -> str:
    """"dead", "alive" (proven: same host, PID and start), or why neither can be told."""
    record = next((p for p in paths if p.name.endswith(f".writer-{pid}")), None)
    if record is not None:
        try:
            owner = json.loads(record.read_text())
            host, start = owner["host"], owner["start"]
        except (OSError, ValueError, KeyError, TypeError):
            return f"its writer record {record.name} is unreadable"
        if host != socket.gethostname():
            return f"written from host {host}, where this process cannot tell whether PID {pid} still runs"
        if not pid_alive(pid):
            return "dead"
        if start is None or process_start(pid) is None:
            return f"process {pid} is running and may be its writer"
        return "alive" if process_start(pid) == start else "dead"  # else: a new process with the old PID
    if pid_alive(pid):
        return f"process {pid} is running and may be its writer"
    if now - _newest(paths) < QUIET_SECONDS:
        return "no writer record (an older embcache, or another host) and changed within the hour"
    return "dead"


def _note(text: str) -> None:
    print(f"embcache: {text}", file=sys.stderr, flush=True)


def _names(paths: list[Path]) -> str:
    return " and ".join(p.name for p in sorted(paths))


def _walk(path: Path):
    """`path` and, for a directory, everything under it (links not followed)."""
    yield path
    if path.is_dir() and not path.is_symlink():
        for root, dirs, files in os.walk(path):
            for name in dirs + files:
                yield Path(root, name)


def _size(paths: list[Path]) -> int:
    total = 0
    for path in paths:
        for entry in _walk(path):
            with contextlib.suppress(OSError):
                if not entry.is_dir() or entry.is_symlink():
                    total += entry.lstat().st_size
    return total


def _newest(paths: list[Path]) -> float:
    newest = 0.0
    for path in paths:
        for entry in _walk(path):
            with contextlib.suppress(OSError):
                newest = max(newest, entry.lstat().st_mtime)
    return newest


def _remove(path: Path) -> bool:
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    except FileNotFoundError:  # another starting writer swept it first
        return True
    except OSError:
        return False
    return True
