"""The times of a user's file, as `data prepare own --split time:COL` and `cf`'s reader read them.

A time is a number (say, Unix seconds) or an ISO date or date and time. One with a zone (`Z`,
`+02:00`, `+0200`, `-05`: `ZONED_TIME`, the one grammar of a zone both readers take) counts
as its UTC instant, one without as if it were UTC. A column holding times of both kinds has
no order anyone can tell (is 10:00 before 09:30Z?), so `ZoneKinds` refuses it, naming the
first time unlike the first one; it keeps the first one's text and line, so a pass that reads
a block at a time finds them however far apart they lie.

Example:
    >>> import pyarrow as pa
    >>> values, ok, zoned = parse_times(pa.array(["2024-03-01T10:00:00+02:00", "2024-03-01 08:00:00", "x"]))
    >>> bool(values[0] == values[1]), ok.tolist(), zoned.tolist()
    (True, [True, True, False], [1, 0, -1])
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pyarrow as pa

# an ISO date and time with a zone: Z, or an offset from UTC (+02:00, +0200, -05); named groups,
# as pyarrow's `extract_regex` needs them (Python's `re` numbers them 1..4 all the same)
ZONED_TIME = (r"(?P<local>\d{4}-\d{2}-\d{2}[T ]\d{2}(?::\d{2}(?::\d{2}(?:\.\d+)?)?)?)\s*"
              r"(?:Z|(?P<sign>[+-])(?P<hours>\d{2}):?(?P<minutes>\d{2})?)")
_ZONED_WHOLE = f"(?i)^{ZONED_TIME}$"
TIME_FORMATS = ("%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S", "%Y-%m-%d")  # a time's part before its zone


def parse_times(col: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(float64 times: a number as it is, an ISO date or time (`TIME_FORMATS`, then maybe a zone)
    as seconds since 1970, UTC where it has a zone; mask of the rows that hold one; int8 per row:
    1 a time with a zone, 0 one without, -1 a number or no time)."""
    import pyarrow as pa  # here: `cf`'s reader imports this module for `ZoneKinds` alone
    import pyarrow.compute as pc

    from embcache.data.delimited import parse_numbers64

    values, _, ok = parse_numbers64(col)
    zoned = np.full(len(col), -1, dtype=np.int8)
    rest = np.flatnonzero(~ok)  # the rest may be dates ("1e400", no finite number, is no date either)
    if not len(rest):
        return values, ok, zoned
    text = pc.take(col, pa.array(rest))
    parts = pc.extract_regex(text, _ZONED_WHOLE)
    has_zone = parts.is_valid().to_numpy(zero_copy_only=False)
    local = pc.if_else(parts.is_valid(), pc.struct_field(parts, "local"), text) if has_zone.any() else text
    offset = _offsets(parts, has_zone)
    left = np.arange(len(rest))  # positions in `text` not read yet
    for fmt in TIME_FORMATS:
        if not len(left):
            break
        stamps = pc.strptime(pc.take(local, pa.array(left)), format=fmt, unit="s", error_is_null=True)
        found = pc.is_valid(stamps).to_numpy(zero_copy_only=False)
        seconds = pc.cast(stamps, pa.int64()).to_numpy(zero_copy_only=False)
        rows = left[found]
        values[rest[rows]] = seconds[found] - offset[rows]
        ok[rest[rows]] = True
        zoned[rest[rows]] = has_zone[rows]
        left = left[~found]
    return values, ok, zoned


def _offsets(parts: pa.Array, has_zone: np.ndarray) -> np.ndarray:
    """Seconds east of UTC of each zone `extract_regex` found (0 for Z, and where none)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not has_zone.any():
        return np.zeros(len(parts), dtype=np.int64)

    def number(name: str) -> np.ndarray:
        field = pc.fill_null(pc.struct_field(parts, name), "")
        return pc.cast(pc.if_else(pc.equal(field, ""), "0", field), pa.int64()).to_numpy(zero_copy_only=False)

    sign = np.where(pc.fill_null(pc.equal(pc.struct_field(parts, "sign"), "-"), False).to_numpy(
        zero_copy_only=False), -1, 1)
    return np.where(has_zone, sign * (number("hours") * 3600 + number("minutes") * 60), 0)


class ZoneKinds:
    """Whether a time column's times carry a zone, read block after block (see the module
    docstring): `column` names it, `where` ("line", or "row" for Parquet) counts its rows."""

    def __init__(self, column: str, where: str = "line"):
        self.column, self.where = column, where
        self.first: tuple[bool, str, int] | None = None  # the first time's kind, text and line

    def see(self, zoned: np.ndarray, texts, line_of) -> tuple[int, str] | None:
        """(line, reason) of the first time of `zoned` (1 with a zone, 0 without, -1 a number or
        no time: either) whose kind is not the first time's; None while they agree. `texts[i]`
        is time i as written (a Python or pyarrow sequence), `line_of(i)` its line (asked for
        the two times named only)."""
        typed = np.flatnonzero(zoned >= 0)
        if not len(typed):
            return None
        if self.first is None:
            r = typed[0]
            self.first = bool(zoned[r]), _text(texts, r), line_of(int(r))
        kind, text, line = self.first
        other = np.flatnonzero(zoned == int(not kind))
        if not len(other):
            return None
        r = other[0]
        return line_of(int(r)), (f"{self.column!r} mixes times with and without a time zone: {_text(texts, r)!r} has "
                               f"{'none' if kind else 'one'}, {text!r} ({self.where} {line}) has "
                               f"{'one' if kind else 'none'}; give every time a zone (Z or +hh:mm), or none")


def _text(texts, i) -> str:
    value = texts[int(i)]
    return str(value.as_py() if hasattr(value, "as_py") else value)  # a pyarrow scalar, or a Python value
