"""Your own interactions: a CSV, TSV or Parquet file (by extension) with a user column and an
item column, and optionally a time and a rating column. Ids are any strings or integers: they
are numbered 0..n-1 in sorted order, and the token <-> index maps travel with the data (and
with a trained model) so that results come back as the file's own ids.

A time is a number (say, Unix seconds) or an ISO date or date and time; one with a zone (`Z`,
`+02:00`) counts as its UTC instant, one without as if it were UTC, so a column holding both
(whose order nobody can tell) is refused in one line naming the first time unlike the first.
A row with an empty id, a rating or time that is not a number (nor an ISO time), or a CSV/TSV
line with another number of fields than the header, stops the reader naming file and row (the
line, counting the header, for CSV/TSV), or with `--skip-bad-lines` is skipped, counted and
reported. CSV/TSV fields are read as text, as
`embcache.data.delimited.read_blocks` reads them; an empty line is no row.

Example:
    >>> import tempfile, pathlib
    >>> with tempfile.TemporaryDirectory() as d:
    ...     p = pathlib.Path(d) / "clicks.csv"
    ...     _ = p.write_text("user_id,item_id\\nu1,a\\nu2,b\\nu1,b\\n")
    ...     t = read_table(p, "user_id", "item_id")
    >>> t.user_ids.tolist(), t.item_ids.tolist(), t.pairs[:, :2].astype(int).tolist()
    (['u1', 'u2'], ['a', 'b'], [[0, 0], [1, 1], [0, 1]])
"""
from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from embcache.data.bad_rows import BadRowLog
from embcache.data.times import ZONED_TIME, ZoneKinds
from embcache.cf.data.bad_lines import bad_line
from embcache.errors import DataFormatError, format_error

TABLE_SUFFIXES = {".csv": ",", ".tsv": "\t", ".parquet": None}


@dataclass
class InteractionTable:
    """Rows of (user index, item index, rating, time) as the float64 columns of `pairs`
    ([n, 4], rating 1 and time the row's position where the file has none), and the ids
    each index stands for."""

    pairs: np.ndarray
    user_ids: np.ndarray
    item_ids: np.ndarray
    has_time: bool


def is_table(path) -> bool:
    return Path(path).suffix.lower() in TABLE_SUFFIXES


def read_table(path, user_col: str, item_col: str, time_col: str | None = None, rating_col: str | None = None,
               bad_rows: BadRowLog | None = None) -> InteractionTable:
    """Read `path` (see the module docstring)."""
    path = Path(path)
    if not path.is_file():
        raise format_error(path, None, "no such file")
    suffix = path.suffix.lower()
    wanted = [c for c in (user_col, item_col, time_col, rating_col) if c]
    columns, lines, wrong_width = _read_columns(path, suffix, wanted, bad_rows)
    if bad_rows is not None:
        bad_rows.seen(path)
    n = len(columns[user_col])
    problems: dict[int, str] = {}  # row -> its first problem

    def refuse(rows, why) -> None:
        for r in rows:
            problems.setdefault(int(r), why(int(r)))

    for col in (user_col, item_col):
        values = columns[col]
        refuse(np.flatnonzero([_blank(v) for v in values]),
               lambda r, col=col: f"empty {col!r}")
    rating = _column(columns[rating_col], rating_col, refuse, _number, "number") if rating_col else np.ones(n)
    time = _times(columns[time_col], time_col, refuse) if time_col else np.arange(n, dtype=np.float64)
    mixed = _mixed_zones(columns[time_col], time_col, lines, problems, suffix) if time_col else None
    if mixed and (bad_rows is not None or not problems or mixed[0] < lines[min(problems)]):
        raise format_error(path, *mixed)  # the column's, not a row's fault: no row to skip
    keep = np.ones(n, dtype=bool)
    if wrong_width and (not problems or wrong_width[0] < lines[min(problems)]):
        bad_line(path, *wrong_width, None)  # stops the reader: it comes before any other bad row
    for r in sorted(problems):  # the first bad row stops the reader, or every one is counted
        bad_line(path, int(lines[r]), problems[r], bad_rows)
        keep[r] = False
    if not keep.any():
        raise format_error(path, None, "no usable rows")
    users, user_ids = _index(np.asarray(columns[user_col], dtype=object)[keep])
    items, item_ids = _index(np.asarray(columns[item_col], dtype=object)[keep])
    pairs = np.stack([users, items, rating[keep], time[keep]], axis=1)
    return InteractionTable(pairs, user_ids, item_ids, time_col is not None)


def _read_columns(path: Path, suffix: str, wanted: list[str],
                  bad_rows: BadRowLog | None) -> tuple[dict, np.ndarray, tuple | None]:
    """{column: list of values (strings for CSV/TSV, the file's types for Parquet)}, each
    row's line (counting the header; Parquet rows count from 1), and the (line, reason) of
    the first CSV/TSV line with another number of fields, which `bad_rows`, where given,
    counts instead (None then, and where there is none)."""
    try:
        if suffix == ".parquet":
            import pyarrow.parquet as pq

            names = pq.read_schema(path).names
            _check_columns(path, names, wanted)
            table = pq.read_table(path, columns=list(dict.fromkeys(wanted)))
            return {c: table.column(c).to_pylist() for c in wanted}, np.arange(1, table.num_rows + 1), None
        return _read_text_columns(path, TABLE_SUFFIXES[suffix], wanted, bad_rows)
    except DataFormatError:
        raise
    except Exception as err:  # pyarrow's own errors name the row: keep their first line
        raise format_error(path, None, f"not a readable {suffix[1:].upper()} file: {str(err).splitlines()[0]}") from None


def _read_text_columns(path: Path, delimiter: str, wanted: list[str],
                       bad_rows: BadRowLog | None) -> tuple[dict, np.ndarray, tuple | None]:
    """`_read_columns` of a CSV or TSV file, block by block (`read_blocks`)."""
    from embcache.data.delimited import header_fields, is_empty_line, read_blocks

    header, line = header_fields(path, delimiter)  # a byte-order mark (Excel's "CSV UTF-8") is no name
    if not line.strip():  # no header to list: say what the file lacks, not "it has ''"
        raise format_error(path, None if path.stat().st_size == 0 else 1,
                           f"{'the file is empty' if path.stat().st_size == 0 else 'an empty header line'}: "
                           f"expected a header naming the columns {', '.join(map(repr, wanted))}")
    _check_columns(path, header, wanted)
    log = BadRowLog() if bad_rows is None else bad_rows
    columns: dict[str, list] = {c: [] for c in wanted}
    lines = []
    for block, first, numbers in read_blocks(path, header, delimiter, True, log):
        row = ~is_empty_line(block)  # an empty line arrives as a row of empty fields
        lines.append(numbers.of(first + np.flatnonzero(row)))
        for c in columns:
            columns[c].extend(v for v, r in zip(block.column(c).to_pylist(), row) if r)
    entry = log.files.get(str(path)) if bad_rows is None else None
    wrong_width = (entry.first_lines[0], entry.first_reasons[0]) if entry and entry.count else None
    return columns, np.concatenate(lines) if lines else np.zeros(0, np.int64), wrong_width


def _check_columns(path: Path, names: list[str], wanted: list[str]) -> None:
    missing = [c for c in wanted if c not in names]
    if missing:
        raise format_error(path, None, f"no column {', '.join(map(repr, missing))}; it has {', '.join(map(repr, names))}"
                                       f" (--user-col, --item-col, --time-col, --rating-col name them)")


def _column(values: list, col: str, refuse, parse, noun: str) -> np.ndarray:
    """`parse(v)` of every value; a value it refuses (TypeError, ValueError) goes to
    `refuse` as "`col` is not a `noun`"."""
    out = np.zeros(len(values))
    bad = []
    for r, v in enumerate(values):
        try:
            out[r] = parse(v)
        except (TypeError, ValueError):
            bad.append(r)
    refuse(np.array(bad, dtype=np.int64),
           lambda r: f"empty {col!r}" if _blank(values[r]) else f"{col!r} is not a {noun}: {values[r]!r}")
    return out


def _blank(v) -> bool:
    """None, an empty string, or a float NaN: a missing value in a Parquet float column, as
    pandas writes integer ids with gaps (it would be an id "nan" otherwise)."""
    return v is None or (isinstance(v, str) and not v.strip()) or (isinstance(v, float) and v != v)


def _number(v) -> float:
    x = float(v)
    if not np.isfinite(x):
        raise ValueError(v)
    return x


_ZONED = re.compile(ZONED_TIME, re.IGNORECASE)  # local time 1, zone's sign 2, hours 3, minutes 4


def _times(values: list, col: str, refuse) -> np.ndarray:
    """`_column` of a time column: numpy's warning of a zone it reads (a form `_ZONED` does not
    take) is an error there, so that such a time is refused, not turned into UTC unseen."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        return _column(values, col, refuse, _time, "time")


def _time(v) -> float:
    """A number (say, Unix seconds), or an ISO date or date and time, as seconds; a time with a
    zone as its UTC instant (an empty field is neither: numpy would take it for NaT, nor is
    numpy's "now" or "today": the split would depend on the day it ran)."""
    if _blank(v):
        raise ValueError("empty")
    try:
        return float(v)
    except (TypeError, ValueError):
        text = str(v).strip()
    zoned = _ZONED.fullmatch(text)
    local = zoned.group(1) if zoned else text
    if not local[:1].isdigit():
        raise ValueError(text)
    try:
        seconds = float(np.datetime64(local.replace(" ", "T"), "s").astype(np.int64))
    except UserWarning:  # numpy read a zone in a form `_ZONED` does not take
        raise ValueError(text) from None
    if zoned and zoned.group(2):
        offset = int(zoned.group(3)) * 3600 + int(zoned.group(4) or 0) * 60
        seconds -= offset if zoned.group(2) == "+" else -offset
    return seconds


def _zoned(v) -> bool | None:
    """Whether a time `_time` reads carries a zone; None for a number, an instant already."""
    if isinstance(v, (int, float, np.number)):
        return None
    text = str(v).strip()
    try:
        float(text)
        return None
    except ValueError:
        return _ZONED.fullmatch(text) is not None


def _mixed_zones(values: list, col: str, lines: np.ndarray, problems: dict, suffix: str) -> tuple | None:
    """(line, reason) of the first time of `values` (but `problems`' rows) with a zone where an
    earlier one had none, or the other way round; None when they agree. A time without a zone
    is read as UTC, so beside times with one the order would rest on a guess."""
    kinds = [None if r in problems else _zoned(v) for r, v in enumerate(values)]
    zoned = np.array([-1 if k is None else int(k) for k in kinds], dtype=np.int8)
    return ZoneKinds(col, "row" if suffix == ".parquet" else "line").see(zoned, values, lambda i: int(lines[i]))


def _index(tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(each token's index, the tokens in index order): integers where every token is one
    (as the file's own type, or written as digits), else strings."""
    as_int = _as_integers(tokens)
    if as_int is not None:
        ids, index = np.unique(as_int, return_inverse=True)
    else:
        ids, index = np.unique(np.array([str(t) for t in tokens]), return_inverse=True)
    return index.astype(np.int64), ids


def _as_integers(tokens: np.ndarray) -> np.ndarray | None:
    if any(isinstance(t, float) and not t.is_integer() for t in tokens):  # 1.5 is no integer id (int() said 1)
        return None
    try:
        out = np.array([int(t) for t in tokens], dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        return None
    if any(isinstance(t, str) and str(int(t)) != t.strip() for t in tokens):  # "007" stays a string id
        return None
    return out
