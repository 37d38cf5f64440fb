"""Rows skipped, never dropped silently: `BadRowLog` counts the rows a reader skips, per
file and reason, keeps the first line numbers, reports them to the user and is stored in
meta.json and checkpoints. The exceptions and error wording live in `embcache.errors`."""
from __future__ import annotations

import bisect
import os
import sys
from dataclasses import dataclass, field


@dataclass
class FileBadRows:
    """Skipped rows of one input file: how many of each kind and the first line numbers."""

    count: int = 0
    by_reason: dict[str, int] = field(default_factory=dict)
    first_lines: list[int] = field(default_factory=list)
    first_reasons: list[str] = field(default_factory=list)
    carried: int | None = None  # records the skipped rows held, where a row holds several


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

    def __init__(self, keep: int = 5, noun: str = "malformed row", position: str | None = "line",
                 carried_noun: str = "record"):
        self.keep = keep
        self.noun = noun            # what a skipped item is called in `report`
        self.carried_noun = carried_noun  # what `add`'s `carried` counts
        self.position = position    # what its number is ("line", "record"); None: the file is the item
        self.files: dict[str, FileBadRows] = {}

    def add(self, path: str | os.PathLike, line: int, reason: str, carried: int | None = None) -> None:
        """Count a skipped row; `carried`: how many records it held, where a row holds several
        (a LightGCN line: a user's items), so the report can say what was lost with it."""
        entry = self.files.setdefault(os.fspath(path), FileBadRows())
        entry.count += 1
        if carried is not None:
            entry.carried = (entry.carried or 0) + carried
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

    @property
    def carried(self) -> int | None:
        """Records the skipped rows held, where `add` was told (None where it never was)."""
        counts = [e.carried for e in self.files.values() if e.carried is not None]
        return sum(counts) if counts else None

    def to_json(self) -> dict:
        return {path: {"count": e.count, "by_reason": dict(e.by_reason), "first_lines": list(e.first_lines),
                       "first_reasons": list(e.first_reasons), **({} if e.carried is None else {"carried": e.carried})}
                for path, e in self.files.items()}

    def load_json(self, saved: dict) -> None:
        """Take back what `to_json` wrote (a checkpoint's record of skipped rows)."""
        self.files = {path: FileBadRows(e["count"], dict(e["by_reason"]), list(e["first_lines"]),
                                        list(e["first_reasons"]), e.get("carried")) for path, e in saved.items()}

    def report(self, stream=None) -> None:
        """Print one line per file with skipped rows (nothing when every row was good); a
        file that is one item (`position` None: an image of a folder) is its reason alone."""
        stream = stream or sys.stderr
        for path, e in self.files.items():
            if not e.count:
                continue
            if self.position is None and e.count == 1:
                print(f"{path}: {e.first_reasons[0]}", file=stream)
                continue
            kinds = ", ".join(f"{n} {k}" for k, n in sorted(e.by_reason.items()))
            # a Parquet file has rows (numbered from 1), not lines
            position = "row" if self.position == "line" and str(path).endswith(".parquet") else self.position
            first = "; ".join((f"{position} {ln}: " if position else "") + r
                              for ln, r in zip(e.first_lines, e.first_reasons))
            carried = "" if e.carried is None else f", with {e.carried:,} {self.carried_noun}(s) in them"
            print(f"{path}: skipped {e.count:,} {self.noun}(s) ({kinds}){carried}; first: {first}", file=stream)
