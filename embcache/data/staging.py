"""A data set written whole or not at all: `staged_output` gives a temporary directory beside
the output, renamed into place when the writing ends well and removed when it does not (an
error, Ctrl-C, SIGTERM), so `--out` never holds half a data set and a failed run leaves nothing. What
a run killed outright (SIGKILL) left there is removed by the next (`embcache.leftovers`). An
existing non-empty output is replaced only when asked (`force`). Light: no torch."""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

from embcache.errors import DataOutputError, UserFacingError, describe_os_error, writing
from embcache.leftovers import WriterAlive, claimed, pid_alive


def check_replaceable(out: str | os.PathLike, force: bool, inputs=()) -> Path:
    """`out` as a Path when a data set may be written there: absent, an empty directory, or
    (with `force`) a directory to replace that holds none of `inputs`. DataOutputError in
    one line otherwise."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise DataOutputError(f"{out}: cannot write: a file, not a directory")
    if not out.is_dir() or not any(out.iterdir()):
        return out
    if not force:
        what = "a prepared data set" if (out / "meta.json").is_file() else "files"
        raise DataOutputError(f"{out} already holds {what}; choose another --out, or replace it with --force")
    held = [p for p in map(Path, inputs) if p is not None and _inside(p, out)]
    if held:
        raise DataOutputError(f"{out} holds the input {held[0]}: --force would delete it; choose another --out")
    return out


def _inside(path: Path, directory: Path) -> bool:
    try:
        path.resolve().relative_to(directory.resolve())
        return True
    except ValueError:
        return False


@contextlib.contextmanager
def staged_output(out: str | os.PathLike, force: bool = False, inputs=()):
    """Yield a new temporary directory beside `out` (`.<name>.tmp-<pid>`) to write a data set
    into; when the block ends without an exception it becomes `out` (an old `out`, with
    `force`, is removed once the new one is in place); on any exception it is removed, and
    the paths in a user error's message name `out`, not the temporary directory.

    Example:
        >>> import tempfile
        >>> root = Path(tempfile.mkdtemp())
        >>> with staged_output(root / "data") as tmp:
        ...     _ = (tmp / "meta.json").write_text("{}")
        >>> sorted(p.name for p in root.iterdir()), (root / "data" / "meta.json").is_file()
        (['data'], True)
    """
    out = check_replaceable(out, force, inputs)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    with claimed(out):  # what killed writers of `out` left is removed first; a live one's refused
        with _terminate_as_exit():  # from before the directory is made: a SIGTERM at any point leaves none
            try:
                _make_directory(out, tmp)
                yield tmp
            except UserFacingError as err:
                shutil.rmtree(tmp, ignore_errors=True)
                if len(err.args) == 1 and isinstance(err.args[0], str):
                    err.args = (err.args[0].replace(str(tmp), str(out)),)
                raise
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
        with writing(out):
            _move_into_place(tmp, out)


def shared_output(out: str | os.PathLike, make, what: str, poll_s: float = 0.5) -> Path:
    """`out` as `make(tmp)` writes it (through `staged_output`: whole or not at all), unless it
    is there already (its meta.json): a built-in data set, which runs started together all
    ask for. While another live process makes it, this one waits for that process (one line)
    instead of refusing: the runs did not choose `out`, and a sweep of settings starts several
    at once. Should that process die first, this one makes it (its leftovers swept)."""
    out, waited_for = Path(out), None
    while not (out / "meta.json").exists():
        try:
            with staged_output(out, force=True) as tmp:
                print(f"{what} into {out} ...", flush=True)
                make(tmp)
        except WriterAlive as err:
            if waited_for != err.pid:
                print(f"waiting for process {err.pid}, which is writing {out} now ...", flush=True)
                waited_for = err.pid
            while pid_alive(err.pid) and not (out / "meta.json").exists():
                time.sleep(poll_s)
    return out


def _make_directory(out: Path, tmp: Path) -> None:
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)  # left by a process of the same id killed outright
        tmp.mkdir()
    except OSError as err:  # named as the user wrote it, not as the temporary directory
        raise DataOutputError(describe_os_error(OSError(err.errno, err.strerror), out, "cannot write")) from None


@contextlib.contextmanager
def _terminate_as_exit():
    """SIGTERM (`kill`, `timeout`, a job scheduler) as SystemExit(143) while a data set is
    written, so the temporary directory is removed as after Ctrl-C: the default action ends
    the process at once and left a half-written copy of the data set behind (gigabytes, on
    the disk it was to fill). Only in the main thread, and only where SIGTERM had its default
    action."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    def stop(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM: stop at once
        print("embcache: stopped by SIGTERM; the unfinished data set is removed", file=sys.stderr, flush=True)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _move_into_place(tmp: Path, out: Path) -> None:
    if not out.exists():
        os.rename(tmp, out)
        return
    if not any(out.iterdir()):  # an empty directory: rename(2) replaces it
        os.replace(tmp, out)
        return
    old = out.parent / f".{out.name}.old-{os.getpid()}"
    os.rename(out, old)
    os.rename(tmp, out)
    shutil.rmtree(old, ignore_errors=True)
