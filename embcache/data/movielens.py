"""MovieLens-100k: 100,000 ratings of 1,682 movies by 943 users, read from either of its two
common distributions into one set of numpy arrays.

* the GroupLens files `u.data` (tab-separated), `u.user` and `u.item` ('|'-separated, latin-1);
* RecBole's "atomic" copy (`ml-100k.inter/.user/.item`, typed header, tab-separated), which ships
  inside the `recbole==1.2.1` wheel on PyPI. That copy is what `ml100k_dir()` fetches when no
  directory is given: MovieLens's terms forbid redistributing it, so it is extracted into the
  git-ignored `datasets/ml-100k/`, never committed, and reused on later calls.

Both sources give identical arrays: ids are 0-based and contiguous in the order of the raw
numeric ids (raw id k -> k-1 for the real files), categorical user fields are codes into sorted
name lists, genres are a CSR pair over the 19 genres in GroupLens's column order.

A malformed line (a field count, a number, an id another file lacks, a repeated id, a rating
outside 1..5) stops the reader naming file and line, or, given a `BadRowLog`, is skipped
and counted there, as the CTR converters do; a header or a file that cannot be read stops it
either way.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from embcache.data.bad_rows import BadRowLog
from embcache.data.delimited import BOM
from embcache.errors import DataFormatError, format_error, writing
from embcache.paths import datasets_dir

#: The 19 genres, in the order of u.item's flag columns (and of `genre_names`).
GENRES = ("unknown", "Action", "Adventure", "Animation", "Children's", "Comedy", "Crime",
          "Documentary", "Drama", "Fantasy", "Film-Noir", "Horror", "Musical", "Mystery",
          "Romance", "Sci-Fi", "Thriller", "War", "Western")

STANDARD_FILES = ("u.data", "u.user", "u.item")
ATOMIC_FILES = ("ml-100k.inter", "ml-100k.user", "ml-100k.item")
RECBOLE_PIN = "recbole==1.2.1"
RECBOLE_MEMBER = "recbole/dataset_example/ml-100k/"


@dataclass(frozen=True)
class MovieLens100k:
    """MovieLens-100k as arrays; every user array is indexed by user id, every item array by
    item id (both 0-based, contiguous).

    Args:
        ratings: int64 `[n, 4]`: user, item, rating (1-5), unix timestamp; in file order.
        user_age: int64 `[num_users]`, years.
        user_gender / user_occupation: int64 codes into `gender_names` / `occupation_names`.
        user_zip: str `[num_users]`; not all are numeric (Canadian postcodes appear).
        item_genre_offsets / item_genre_ids: CSR pair: item i's genres are
            `item_genre_ids[item_genre_offsets[i]:item_genre_offsets[i+1]]`, ascending codes
            into `genre_names`.
        item_year: int64 `[num_items]`, the year in the movie's title, -1 where there is none.
        user_raw_ids / item_raw_ids: the ids as the files spell them.
        source: the directory read.
    """

    ratings: np.ndarray
    num_users: int
    num_items: int
    user_age: np.ndarray
    user_gender: np.ndarray
    gender_names: tuple[str, ...]
    user_occupation: np.ndarray
    occupation_names: tuple[str, ...]
    user_zip: np.ndarray
    item_genre_offsets: np.ndarray
    item_genre_ids: np.ndarray
    genre_names: tuple[str, ...]
    item_year: np.ndarray
    user_raw_ids: np.ndarray
    item_raw_ids: np.ndarray
    source: str

    def item_genres(self, item: int) -> np.ndarray:
        """Genre codes of one item."""
        return self.item_genre_ids[self.item_genre_offsets[item]:self.item_genre_offsets[item + 1]]


# --------------------------------------------------------------------------- locating the files
def ml100k_dir(path: str | os.PathLike | None = None) -> Path:
    """A directory holding MovieLens-100k in either supported layout.

    Args:
        path: a directory with `u.data`, `u.user`, `u.item` (GroupLens) or
            `ml-100k.inter/.user/.item` (RecBole). None: the RecBole copy in `ml-100k/` under
            `embcache.paths.datasets_dir()` (`datasets/` of a checkout),
            fetched on first use with `pip download` (PyPI must be reachable that once).

    Raises DataFormatError (one line) for a missing or partial directory or a failed fetch.
    """
    if path is not None:
        directory = Path(path)
        if not directory.is_dir():
            raise format_error(directory, None, "no such directory (expected MovieLens-100k files "
                                                f"{', '.join(STANDARD_FILES)} or {', '.join(ATOMIC_FILES)})")
        _layout(directory)
        return directory
    default = datasets_dir() / "ml-100k"
    if all((default / name).is_file() for name in ATOMIC_FILES):
        return default
    fetch_recbole_copy(default)
    return default


def _layout(directory: Path) -> str:
    """'standard' or 'atomic', whichever set of files is complete; a clear error otherwise."""
    for layout, names in (("standard", STANDARD_FILES), ("atomic", ATOMIC_FILES)):
        if all((directory / n).is_file() for n in names):
            return layout
    for names in (STANDARD_FILES, ATOMIC_FILES):
        present = [n for n in names if (directory / n).is_file()]
        if present:
            missing = [n for n in names if n not in present]
            raise format_error(directory, None, f"incomplete MovieLens-100k: has {', '.join(present)} "
                                                f"but not {', '.join(missing)}")
    raise format_error(directory, None, f"no MovieLens-100k here: expected {', '.join(STANDARD_FILES)} "
                                        f"or {', '.join(ATOMIC_FILES)}")


def fetch_recbole_copy(dest: str | os.PathLike) -> Path:
    """Extract RecBole's copy of MovieLens-100k into `dest` (via `pip download` of the pinned
    wheel, no install). Files appear atomically: all three or none."""
    dest = Path(dest)
    with writing(dest):
        dest.mkdir(parents=True, exist_ok=True)
        return _fetch_into(dest)


def _fetch_into(dest: Path) -> Path:
    with tempfile.TemporaryDirectory(prefix="ml100k-", dir=dest) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", RECBOLE_PIN, "-d", tmp]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wheels = list(Path(tmp).glob("recbole-*.whl"))
        if proc.returncode != 0 or not wheels:
            last = (proc.stderr.strip().splitlines() or ["no wheel downloaded"])[-1]
            raise DataFormatError(f"could not fetch MovieLens-100k ({' '.join(cmd[2:6])} failed: {last}); "
                                  f"pass a directory holding u.data/u.user/u.item instead")
        staged = []
        with zipfile.ZipFile(wheels[0]) as wheel:
            for name in ATOMIC_FILES:
                target = Path(tmp) / name
                with wheel.open(RECBOLE_MEMBER + name) as src, open(target, "wb") as out:
                    shutil.copyfileobj(src, out)
                staged.append(target)
        for target in staged:
            os.replace(target, dest / target.name)
    return dest


# --------------------------------------------------------------------------- reading
def load_ml100k(path: str | os.PathLike | None = None, bad_rows: BadRowLog | None = None) -> MovieLens100k:
    """Read MovieLens-100k from `path` (see `ml100k_dir`) into a `MovieLens100k`; a malformed
    line stops it (DataFormatError naming file and line), or with `bad_rows` is skipped and
    counted there (a rating of a skipped user or item goes with it, counted too).

    Example (not run by the tests: it fetches the data on first use):
        >>> ml = load_ml100k()                               # doctest: +SKIP
        >>> ml.ratings.shape, ml.num_users, ml.num_items     # doctest: +SKIP
        ((100000, 4), 943, 1682)
    """
    directory = ml100k_dir(path)
    if _layout(directory) == "standard":
        paths = [directory / n for n in STANDARD_FILES]
        readers = (_read_standard_users, _read_standard_items, _read_standard_ratings)
    else:
        paths = [directory / n for n in ATOMIC_FILES]
        readers = (_read_atomic_users, _read_atomic_items, _read_atomic_ratings)
    ratings_path, user_path, item_path = paths
    for p in paths:
        if bad_rows is not None:
            bad_rows.seen(p)
    users = list(_skipping(user_path, readers[0](user_path), bad_rows))
    items = list(_skipping(item_path, readers[1](item_path), bad_rows))
    return _assemble(directory, users, items, ratings_path, _skipping(ratings_path, readers[2](ratings_path), bad_rows),
                     bad_rows)


def _skipping(path: Path, rows, bad_rows: BadRowLog | None):
    """The (line number, row) of `rows` (a reader's `_parsed` pairs); a malformed line's error
    is raised, or counted in `bad_rows` and the line left out."""
    for number, row in rows:
        if isinstance(row, DataFormatError):
            if bad_rows is None:
                raise row
            bad_rows.add(path, number, _reason(row, path, number))
            continue
        yield number, row


def _reason(err: DataFormatError, path: Path, number: int) -> str:
    """The error's text without its "path:line: " (the log keeps both apart)."""
    text, where = str(err), f"{os.fspath(path)}:{number}: "
    return text[len(where):] if text.startswith(where) else text


def _parsed(path: Path, numbered, parse):
    """(number, parse(number, line)) for each line, or (number, the DataFormatError) where it
    is malformed: the caller (`_skipping`) raises or counts it, and the file reads on."""
    for number, line in numbered:
        try:
            yield number, parse(number, line)
        except DataFormatError as err:
            yield number, err


def _lines(path: Path, encoding: str):
    """(line number, text) for every line; a final newline does not make an extra line. A
    UTF-8 byte-order mark that an editor put before the first line is no part of it (it made
    line 1 a bad row), in a latin-1 file too, where it reads as three letters."""
    try:
        with open(path, encoding=encoding, newline="") as f:
            for number, line in enumerate(f, 1):
                if number == 1:
                    line = line.removeprefix(BOM if encoding == "utf-8" else BOM.encode().decode("latin-1"))
                yield number, line.rstrip("\r\n")
    except UnicodeDecodeError as err:
        raise format_error(path, None, f"not {encoding} text ({err.reason} at byte {err.start})") from None
    except OSError as err:
        raise format_error(path, None, f"cannot read: {err.strerror}") from None


def _int(path: Path, number: int, text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        pass
    try:  # RecBole types ratings and timestamps as float ("3", "881250949", sometimes "3.0")
        value = float(text)
        if value.is_integer():
            return int(value)
    except ValueError:
        pass
    raise format_error(path, number, f"{what} {text!r} is not an integer")


def _fields(path: Path, number: int, line: str, sep: str, expected: int) -> list[str]:
    parts = line.split(sep)
    if len(parts) != expected:
        raise format_error(path, number, f"{len(parts)} fields, expected {expected} "
                                         f"separated by {sep!r}: {line[:60]!r}")
    return parts


# Each reader yields tuples in file order; `_assemble` checks ids across files.
def _read_standard_ratings(path: Path):
    def parse(number, line):
        return _rating(path, number, _fields(path, number, line, "\t", 4))
    return _parsed(path, _lines(path, "latin-1"), parse)


def _rating(path: Path, number: int, fields) -> tuple[int, int, int, int]:
    u, i, r, t = fields
    return (_int(path, number, u, "user id"), _int(path, number, i, "item id"),
            _int(path, number, r, "rating"), _int(path, number, t, "timestamp"))


def _user(path: Path, number: int, fields) -> tuple:
    u, age, gender, occupation, zip_code = fields
    return _int(path, number, u, "user id"), _int(path, number, age, "age"), gender, occupation, zip_code


def _read_standard_users(path: Path):
    return _parsed(path, _lines(path, "latin-1"), lambda number, line: _user(path, number,
                                                                          _fields(path, number, line, "|", 5)))


_YEAR_IN_TITLE = re.compile(r"\((\d{4})\)\s*$")


def _read_standard_items(path: Path):
    def parse(number, line):
        parts = _fields(path, number, line, "|", 5 + len(GENRES))
        flags = parts[5:]
        if any(f not in ("0", "1") for f in flags):
            raise format_error(path, number, f"genre flags must be 0 or 1, got {'|'.join(flags)!r}")
        genres = [g for g, f in enumerate(flags) if f == "1"]
        year = _YEAR_IN_TITLE.search(parts[1])
        return _int(path, number, parts[0], "item id"), genres, int(year.group(1)) if year else -1
    return _parsed(path, _lines(path, "latin-1"), parse)


def _atomic_rows(path: Path, wanted: tuple[str, ...], parse):
    """`_parsed` rows of a RecBole atomic file: `parse(number, fields)` of the `wanted` columns
    of each line (by name, types ignored); a header without them stops the reader."""
    lines = _lines(path, "utf-8")
    header = next(lines, None)
    if header is None:
        raise format_error(path, 1, "empty file; expected a RecBole header such as 'user_id:token'")
    names = [col.split(":")[0] for col in header[1].split("\t")]
    missing = [w for w in wanted if w not in names]
    if missing:
        raise format_error(path, 1, f"header lacks column(s) {', '.join(missing)}: {header[1][:80]!r}")
    index = [names.index(w) for w in wanted]

    def fields(number, line):
        parts = _fields(path, number, line, "\t", len(names))
        return parse(number, [parts[k] for k in index])
    return _parsed(path, lines, fields)


def _read_atomic_ratings(path: Path):
    return _atomic_rows(path, ("user_id", "item_id", "rating", "timestamp"),
                        lambda number, fields: _rating(path, number, fields))


def _read_atomic_users(path: Path):
    return _atomic_rows(path, ("user_id", "age", "gender", "occupation", "zip_code"),
                        lambda number, fields: _user(path, number, fields))


def _read_atomic_items(path: Path):
    return _atomic_rows(path, ("item_id", "movie_title", "release_year", "class"),
                        lambda number, fields: _atomic_item(path, number, *fields))


def _atomic_item(path: Path, number: int, i: str, title: str, year: str, classes: str) -> tuple:
    code = {g: k for k, g in enumerate(GENRES)}
    genres = []
    for name in classes.split(" "):
        if name not in code:
            raise format_error(path, number, f"unknown genre {name!r} (known: {', '.join(GENRES)})")
        genres.append(code[name])
    if year.isdigit() and len(year) == 4:
        item_year = int(year)
    else:  # RecBole splits the year off the title; where that failed it stays in the title
        found = _YEAR_IN_TITLE.search(title)
        item_year = int(found.group(1)) if found else -1
    return _int(path, number, i, "item id"), sorted(set(genres)), item_year


def _index(path: Path, rows: list, what: str, bad_rows: BadRowLog | None) -> tuple[dict[int, int], list]:
    """(raw id -> 0-based id, in ascending raw-id order; the rows kept): a repeated id is an
    error, or with `bad_rows` a skipped line (its first line kept)."""
    seen: dict[int, int] = {}
    kept = []
    for number, row in rows:
        if row[0] in seen:
            what_happened = f"{what} id {row[0]} appears again (first on line {seen[row[0]]})"
            if bad_rows is None:
                raise format_error(path, number, what_happened)
            bad_rows.add(path, number, what_happened)
            continue
        seen[row[0]] = number
        kept.append((number, row))
    if not seen:
        raise _none_left(path, f"{what}s", bad_rows)
    return {raw: k for k, raw in enumerate(sorted(seen))}, kept


def _rating_rows(ratings_path: Path, ratings, user_id: dict, item_id: dict, names: tuple[str, str],
                 bad_rows: BadRowLog | None) -> list[tuple[int, int, int, int]]:
    """The ratings with 0-based ids; one of a user or item the other files lack (`names`:
    theirs), or outside 1..5, is an error, or with `bad_rows` a skipped line."""
    rows = []
    for number, (u, i, r, t) in ratings:
        why = (f"user id {u} is not in {names[0]}" if u not in user_id else
               f"item id {i} is not in {names[1]}" if i not in item_id else
               f"rating {r} outside 1..5" if not 1 <= r <= 5 else None)
        if why is None:
            rows.append((user_id[u], item_id[i], r, t))
        elif bad_rows is None:
            raise format_error(ratings_path, number, why)
        else:
            bad_rows.add(ratings_path, number, why)
    if not rows:
        raise _none_left(ratings_path, "ratings", bad_rows)
    return rows


def _none_left(path: Path, what: str, bad_rows: BadRowLog | None) -> DataFormatError:
    """A file with nothing usable, naming the first line skipped where every line was."""
    entry = bad_rows.files.get(os.fspath(path)) if bad_rows is not None else None
    if entry is None or not entry.count:
        return format_error(path, None, f"no {what} in this file")
    return format_error(path, None, f"no {what} in this file: all {entry.count:,} line(s) malformed, skipped "
                                    f"(the first, line {entry.first_lines[0]}: {entry.first_reasons[0]})")


def _assemble(directory: Path, users: list, items: list, ratings_path: Path, ratings,
              bad_rows: BadRowLog | None = None) -> MovieLens100k:
    layout = _layout(directory)
    user_path = directory / ("u.user" if layout == "standard" else "ml-100k.user")
    item_path = directory / ("u.item" if layout == "standard" else "ml-100k.item")
    user_id, users = _index(user_path, users, "user", bad_rows)
    item_id, items = _index(item_path, items, "item", bad_rows)
    rows = _rating_rows(ratings_path, ratings, user_id, item_id, (user_path.name, item_path.name), bad_rows)

    users_sorted = [row for _, row in sorted(users, key=lambda x: x[1][0])]
    gender_names = tuple(sorted({row[2] for row in users_sorted}))
    occupation_names = tuple(sorted({row[3] for row in users_sorted}))
    g_code = {g: k for k, g in enumerate(gender_names)}
    o_code = {o: k for k, o in enumerate(occupation_names)}

    items_sorted = [row for _, row in sorted(items, key=lambda x: x[1][0])]
    lengths = np.array([len(row[1]) for row in items_sorted], dtype=np.int64)
    offsets = np.zeros(len(items_sorted) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    genre_ids = np.array([g for row in items_sorted for g in row[1]], dtype=np.int64)

    return MovieLens100k(
        ratings=np.array(rows, dtype=np.int64).reshape(-1, 4),
        num_users=len(user_id),
        num_items=len(item_id),
        user_age=np.array([row[1] for row in users_sorted], dtype=np.int64),
        user_gender=np.array([g_code[row[2]] for row in users_sorted], dtype=np.int64),
        gender_names=gender_names,
        user_occupation=np.array([o_code[row[3]] for row in users_sorted], dtype=np.int64),
        occupation_names=occupation_names,
        user_zip=np.array([row[4] for row in users_sorted], dtype=str),
        item_genre_offsets=offsets,
        item_genre_ids=genre_ids,
        genre_names=GENRES,
        item_year=np.array([row[2] for row in items_sorted], dtype=np.int64),
        user_raw_ids=np.array(sorted(user_id), dtype=np.int64),
        item_raw_ids=np.array(sorted(item_id), dtype=np.int64),
        source=str(directory),
    )
