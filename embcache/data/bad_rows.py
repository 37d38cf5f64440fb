"""Malformed input, never dropped silently: `DataFormatError` for input that cannot be used at
all (one line naming the file and line), `BadRowLog` for rows a converter skips and counts,
reports to the user and stores in meta.json. `DataOutputError` is the same one line for an
output that cannot be written (an unwritable directory, a full disk)."""
from __future__ import annotations

import bisect
import contextlib
import os
import sys
from dataclasses import dataclass, field

from embcache.cli import UserFacingError


class DataFormatError(UserFacingError, ValueError):
    """Input that cannot be used: a missing or unreadable file, or a line that cannot be
    parsed where skipping it would change the data set's meaning. A ValueError for library
    callers; the `embcache` command prints it as one line without a traceback."""


def format_error(path: str | os.PathLike, line: int | None, what: str) -> DataFormatError:
    """`DataFormatError("path:line: what")`, the compiler-style location editors understand."""
    where = f"{os.fspath(path)}:{line}" if line is not None else os.fspath(path)
    return DataFormatError(f"{where}: {what}")


def is_whole(value, low: int, high: int | None = None) -> bool:
    """`value` is a whole number (an int, or a float equal to one; never a bool) in
    `[low, high)` (no upper bound when `high` is None)."""
    return not (isinstance(value, bool) or int(value) != value or value < low
                or (high is not None and value >= high))


def check_whole(name: str, value, low: int, high: int | None = None) -> None:
    """ValueError("NAME must be a whole number >= LOW, got VALUE") unless `is_whole` (the
    bound reads "in [LOW, HIGH)" when `high` is given)."""
    if not is_whole(value, low, high):
        bound = f">= {low}" if high is None else f"in [{low}, {_power_text(high)})"
        raise ValueError(f"{name} must be a whole number {bound}, got {value!r}")


def _power_text(n: int) -> str:
    """`2**32` rather than 4294967296 for a large power of two."""
    return f"2**{n.bit_length() - 1}" if n >= 1 << 16 and n & (n - 1) == 0 else str(n)


def first_line(err: BaseException) -> str:
    """The first line of `str(err)`, or the exception's type name when that is empty."""
    text = str(err)
    return text.splitlines()[0] if text else type(err).__name__


def describe_os_error(err: OSError, path: str | os.PathLike | None = None, doing: str = "") -> str:
    """One line for an OSError: "FILE: DOING: REASON". FILE is the error's own filename, else
    `path`, else left out with its colon; "DOING: " is left out when `doing` is empty; REASON
    is `err.strerror`, else the message's `first_line`."""
    if getattr(err, "filename", None):
        where = f"{err.filename}: "
    else:
        where = f"{os.fspath(path)}: " if path is not None else ""
    return f"{where}{doing + ': ' if doing else ''}{err.strerror or first_line(err)}"


class DataOutputError(UserFacingError, OSError):
    """An output file or directory that cannot be written. An OSError for library callers;
    the `embcache` command prints it as one line without a traceback."""


@contextlib.contextmanager
def writing(path: str | os.PathLike):
    """Turn an OSError raised while writing `path` into a DataOutputError naming the file."""
    try:
        yield
    except DataOutputError:
        raise
    except OSError as err:
        raise DataOutputError(describe_os_error(err, path, "cannot write")) from None


@dataclass
class FileBadRows:
    """Skipped rows of one input file: how many of each kind and the first line numbers."""

    count: int = 0
    by_reason: dict[str, int] = field(default_factory=dict)
    first_lines: list[int] = field(default_factory=list)
    first_reasons: list[str] = field(default_factory=list)


class BadRowLog:
    """Counts the rows a converter skips, per input file and reason.

    Keeps the `keep` smallest line numbers (with their reason) of each file so that a user can
    look at them; everything else is a count, so memory stays bounded however bad the file.

    Example:
        >>> log = BadRowLog()
        >>> log.add("train.txt", 7, "39 columns, expected 40")
        >>> log.to_json()["train.txt"]["count"]
        1
    """

    def __init__(self, keep: int = 5):
        self.keep = keep
        self.files: dict[str, FileBadRows] = {}

    def add(self, path: str | os.PathLike, line: int, reason: str) -> None:
        entry = self.files.setdefault(os.fspath(path), FileBadRows())
        entry.count += 1
        kind = reason.split(":")[0]
        entry.by_reason[kind] = entry.by_reason.get(kind, 0) + 1
        # keep the `keep` smallest line numbers: rows are not always reported in line order
        if len(entry.first_lines) < self.keep or line < entry.first_lines[-1]:
            at = bisect.bisect(entry.first_lines, line)
            entry.first_lines.insert(at, line)
            entry.first_reasons.insert(at, reason)
            del entry.first_lines[self.keep:], entry.first_reasons[self.keep:]

    def seen(self, path: str | os.PathLike) -> None:
        """Record that `path` was read, so a clean file shows up with count 0."""
        self.files.setdefault(os.fspath(path), FileBadRows())

    @property
    def total(self) -> int:
        return sum(e.count for e in self.files.values())

    def to_json(self) -> dict:
        return {path: {"count": e.count, "by_reason": dict(e.by_reason), "first_lines": list(e.first_lines),
                       "first_reasons": list(e.first_reasons)}
                for path, e in self.files.items()}

    def load_json(self, saved: dict) -> None:
        """Take back what `to_json` wrote (a checkpoint's record of skipped rows)."""
        self.files = {path: FileBadRows(e["count"], dict(e["by_reason"]), list(e["first_lines"]),
                                        list(e["first_reasons"])) for path, e in saved.items()}

    def report(self, stream=None) -> None:
        """Print one line per file with skipped rows (nothing when every row was good)."""
        stream = stream or sys.stderr
        for path, e in self.files.items():
            if e.count:
                kinds = ", ".join(f"{n} {k}" for k, n in sorted(e.by_reason.items()))
                first = "; ".join(f"line {ln}: {r}" for ln, r in zip(e.first_lines, e.first_reasons))
                print(f"{path}: skipped {e.count:,} malformed row(s) ({kinds}); first: {first}", file=stream)
