"""What the CF readers do with a malformed input line: stop with its file and line number,
or, when the caller passed a `BadRowLog` (--skip-bad-lines), count it there and go on."""
from __future__ import annotations

from embcache.data.bad_rows import BadRowLog
from embcache.errors import format_error


def bad_line(path, lineno: int, why: str, bad_rows: BadRowLog | None, carried: int | None = None) -> None:
    """Raise `DataFormatError` naming `path:lineno` and `why`, or record the line in `bad_rows`
    (with the `carried` interactions it held, where a line holds several).

    Example:
        >>> log = BadRowLog()
        >>> bad_line("u.data", 3, "negative id -2", log)
        >>> log.total
        1
    """
    if bad_rows is None:
        raise format_error(path, lineno, f"{why} (--skip-bad-lines skips and counts such lines)")
    bad_rows.add(path, lineno, why, carried)


def whole_numbers(tokens: list[str], path, lineno: int, noun: str, bad_rows: BadRowLog | None,
                  carried: int | None = None) -> list[int] | None:
    """The line's `tokens` as integers, or None when one is not (the line then goes to
    `bad_line`, naming the first such `noun`: "non-integer token 'x'", with `carried`).

    Example:
        >>> log = BadRowLog()
        >>> whole_numbers(["3", "7"], "train.txt", 1, "token", log)
        [3, 7]
        >>> whole_numbers(["3", "x"], "train.txt", 2, "token", log) is None
        True
        >>> whole_numbers(["3", str(2 * 10**20)], "train.txt", 3, "token", log) is None
        True
        >>> log.to_json()["train.txt"]["first_reasons"]
        ["non-integer token 'x'", 'token 200000000000000000000 is beyond any 64-bit id']
    """
    try:
        values = [int(t) for t in tokens]
    except ValueError:
        bad = next(t for t in tokens if not _is_int(t))
        bad_line(path, lineno, f"non-integer {noun} {bad!r}", bad_rows, carried)
        return None
    huge = next((v for v in values if not -INT64_LIMIT <= v < INT64_LIMIT), None)
    if huge is not None:  # no id table can have such a row, and numpy's int64 cannot hold it
        bad_line(path, lineno, f"{noun} {huge} is beyond any 64-bit id", bad_rows, carried)
        return None
    return values


INT64_LIMIT = 1 << 63


def _is_int(token: str) -> bool:
    try:
        int(token)
        return True
    except ValueError:
        return False
