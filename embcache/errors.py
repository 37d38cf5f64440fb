"""The project's exceptions and the wording of its errors.

Every error a user can cause (a bad file, a bad setting, a checkpoint that does not fit)
reaches them as one line, without a traceback. The classes say which kind it is; each is
also a ValueError or OSError, so library callers catch what they would expect. The
helpers below word the recurring cases the same way everywhere: a location ("file:line:
what"), an OSError ("file: doing: reason"), a whole-number check.

Light on purpose (no torch import): the command line imports it before any heavy module.
"""
from __future__ import annotations

import contextlib
import os


class UserFacingError(Exception):
    """An error caused by the user's input (a missing file, a bad row, a bad setting):
    the `embcache` command prints it as one line, without a traceback, and exits with
    status `exit_code`."""

    exit_code = 1


class DataFormatError(UserFacingError, ValueError):
    """Input that cannot be used: a missing or unreadable file, or a line that cannot be
    parsed where skipping it would change the data set's meaning."""


class DataOutputError(UserFacingError, OSError):
    """An output file or directory that cannot be written (an unwritable directory, a
    full disk)."""


class CheckpointError(UserFacingError, ValueError):
    """A checkpoint that cannot be used: missing, truncated, corrupt, of another kind, or
    written with settings or data that a resume may not change."""


class TrainingDiverged(UserFacingError, ValueError):
    """The loss became NaN or infinite; nothing from the bad step was checkpointed."""


class RunInterrupted(UserFacingError):
    """Ctrl-C (SIGINT) or SIGTERM stopped a training run: after the step it was in, with a
    checkpoint where the run keeps one, or at once on a second signal. The `embcache`
    command prints its one line (no "error:") and exits with `exit_code`, 130 as a shell
    reports a process stopped by Ctrl-C."""

    exit_code = 130


def format_error(path: str | os.PathLike, line: int | None, what: str) -> DataFormatError:
    """`DataFormatError("path:line: what")`, the compiler-style location editors understand.

    Example:
        >>> str(format_error("train.txt", 7, "39 columns, expected 40"))
        'train.txt:7: 39 columns, expected 40'
    """
    where = f"{os.fspath(path)}:{line}" if line is not None else os.fspath(path)
    return DataFormatError(f"{where}: {what}")


def first_line(err: BaseException) -> str:
    """The first line of `str(err)`, or the exception's type name when that is empty."""
    text = str(err)
    return text.splitlines()[0] if text else type(err).__name__


def describe_os_error(err: OSError, path: str | os.PathLike | None = None, doing: str = "") -> str:
    """One line for an OSError: "FILE: DOING: REASON". FILE is the error's own filename, else
    `path`, else left out with its colon; "DOING: " is left out when `doing` is empty; REASON
    is `err.strerror`, else the message's `first_line`.

    Example:
        >>> describe_os_error(PermissionError(13, "Permission denied", "/out/meta.json"), doing="cannot write")
        '/out/meta.json: cannot write: Permission denied'
    """
    if getattr(err, "filename", None):
        where = f"{err.filename}: "
    else:
        where = f"{os.fspath(path)}: " if path is not None else ""
    return f"{where}{doing + ': ' if doing else ''}{err.strerror or first_line(err)}"


@contextlib.contextmanager
def writing(path: str | os.PathLike):
    """Turn an OSError raised while writing `path` into a DataOutputError naming the file."""
    try:
        yield
    except DataOutputError:
        raise
    except OSError as err:
        raise DataOutputError(describe_os_error(err, path, "cannot write")) from None


def is_whole(value, low: int, high: int | None = None) -> bool:
    """`value` is a whole number (an int, or a float equal to one; never a bool) in
    `[low, high)` (no upper bound when `high` is None)."""
    return not (isinstance(value, bool) or int(value) != value or value < low
                or (high is not None and value >= high))


def check_whole(name: str, value, low: int, high: int | None = None) -> None:
    """ValueError("NAME must be a whole number >= LOW, got VALUE") unless `is_whole` (the
    bound reads "in [LOW, HIGH)" when `high` is given).

    Example:
        >>> check_whole("rows", 2.5, 1)
        Traceback (most recent call last):
        ...
        ValueError: rows must be a whole number >= 1, got 2.5
    """
    if not is_whole(value, low, high):
        bound = f">= {low}" if high is None else f"in [{low}, {_power_text(high)})"
        raise ValueError(f"{name} must be a whole number {bound}, got {value!r}")


def _power_text(n: int) -> str:
    """`2**32` rather than 4294967296 for a large power of two."""
    return f"2**{n.bit_length() - 1}" if n >= 1 << 16 and n & (n - 1) == 0 else str(n)


def as_user_errors(fn, *args, **kwargs):
    """Call `fn`; library ValueErrors (bad arguments) and OSErrors (a file that cannot be
    read or written, a full disk) become one-line user errors naming what went wrong."""
    try:
        return fn(*args, **kwargs)
    except UserFacingError:
        raise
    except ValueError as err:
        raise UserFacingError(str(err)) from None
    except OSError as err:
        raise UserFacingError(describe_os_error(err)) from None
