"""What the CF readers do with a malformed input line: stop with its file and line number,
or, when the caller passed a `BadRowLog` (--skip-bad-lines), count it there and go on."""
from __future__ import annotations

from embcache.data.bad_rows import BadRowLog
from embcache.errors import format_error


def bad_line(path, lineno: int, why: str, bad_rows: BadRowLog | None) -> None:
    """Raise `DataFormatError` naming `path:lineno` and `why`, or record the line in `bad_rows`.

    Example:
        >>> log = BadRowLog()
        >>> bad_line("u.data", 3, "negative id -2", log)
        >>> log.total
        1
    """
    if bad_rows is None:
        raise format_error(path, lineno, f"{why} (--skip-bad-lines skips and counts such lines)")
    bad_rows.add(path, lineno, why)


def is_int(token: str) -> bool:
    """Whether `int(token)` succeeds (to name the first bad token of a line)."""
    try:
        int(token)
        return True
    except ValueError:
        return False
