"""Implicit-feedback data for CF: `Interactions` (train and test as CSR user -> items) and
the readers that make it: the LightGCN text format (Gowalla, Yelp2018, Amazon-Books),
MovieLens ratings (`u.data`, `ratings.dat`, or the offline ml-100k copy) with a seeded
random or a by-time split. Bad input stops with the file and line, or, when the caller asks
to skip it, is counted and reported — never dropped silently."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from embcache.data.bad_rows import BadRowLog
from embcache.errors import format_error

SPLITS = ("random", "time")
TEST_FRACTION = 0.2  # the default test share per user of every split here


@dataclass
class Interactions:
    """Train and test interactions as CSR (indptr [users+1], indices: item ids, sorted per
    user, no duplicates). `bad_rows` counts the input lines that were skipped, per file."""

    num_users: int
    num_items: int
    train_indptr: np.ndarray
    train_indices: np.ndarray
    test_indptr: np.ndarray
    test_indices: np.ndarray
    name: str = ""
    bad_rows: BadRowLog = field(default_factory=BadRowLog)

    @property
    def num_train(self) -> int:
        return len(self.train_indices)

    @property
    def num_test(self) -> int:
        return len(self.test_indices)

    def train_pairs(self) -> tuple[np.ndarray, np.ndarray]:
        """(users, items) of every training interaction, int32."""
        users = np.repeat(np.arange(self.num_users, dtype=np.int32), np.diff(self.train_indptr))
        return users, self.train_indices.astype(np.int32)

    def item_degrees(self) -> np.ndarray:
        return np.bincount(self.train_indices, minlength=self.num_items)

    def summary(self) -> str:
        s = (f"{self.name or 'data'}: {self.num_users} users, {self.num_items} items, "
             f"{self.num_train} train / {self.num_test} test interactions")
        if self.bad_rows.total:
            s += f"; skipped {self.bad_rows.total} malformed line(s)"
        return s


def to_csr(users: np.ndarray, items: np.ndarray, num_users: int) -> tuple[np.ndarray, np.ndarray]:
    """CSR of (user, item) pairs: sorted by user then item, duplicates removed."""
    users = np.asarray(users, dtype=np.int64)
    items = np.asarray(items, dtype=np.int64)
    if len(users):
        key = np.unique(users * (int(items.max()) + 1) + items)
        users, items = np.divmod(key, int(items.max()) + 1)
    indptr = np.zeros(num_users + 1, dtype=np.int64)
    np.cumsum(np.bincount(users, minlength=num_users), out=indptr[1:])
    return indptr, items.astype(np.int64)


def from_pairs(train_u, train_i, test_u, test_i, num_users=None, num_items=None, name="",
               bad_rows=None) -> Interactions:
    """Interactions from (user, item) arrays; sizes default to the largest id + 1."""
    all_u = np.concatenate([train_u, test_u]).astype(np.int64)
    all_i = np.concatenate([train_i, test_i]).astype(np.int64)
    nu = int(num_users if num_users is not None else (all_u.max() + 1 if len(all_u) else 0))
    ni = int(num_items if num_items is not None else (all_i.max() + 1 if len(all_i) else 0))
    tr = to_csr(train_u, train_i, nu)
    te = to_csr(test_u, test_i, nu)
    return Interactions(nu, ni, *tr, *te, name=name, bad_rows=bad_rows or BadRowLog())


# --- LightGCN text format ---------------------------------------------------------------

# a test.txt id must be below _FAR_ID_FACTOR x the training count + _FAR_ID_SLACK
_FAR_ID_FACTOR = 2
_FAR_ID_SLACK = 1000


def far_id_limit(train_count: int) -> int:
    """The bound a test.txt id must stay below, given the users (or items) of train.txt.

    An id that train.txt never names (a user or item seen only in test) is kept: the table
    grows to hold it and its row is never trained, so it counts as a miss, as before. But
    the tables are dense (one row per id up to the largest), so a single corrupt id such as
    10000000000 would ask for terabytes; an id at or above twice the training count plus
    1,000 is taken for a bad line instead.
    """
    return _FAR_ID_FACTOR * train_count + _FAR_ID_SLACK


def read_lightgcn_file(path: str | Path, bad_rows: BadRowLog | None = None,
                       train_counts: tuple[int, int] | None = None) -> tuple[np.ndarray, np.ndarray, int]:
    """Read `user item item ...` lines (space separated) into (users, items, num_users).

    Empty lines are ignored; a user with no items is allowed: it adds no pair but still
    counts in num_users (the largest user id seen + 1), so it keeps its row. A token that
    is not a non-negative integer, or, for a test file (`train_counts` = the users and items
    of train.txt), an id at or above its `far_id_limit`, raises `DataFormatError` naming
    file and line, or, when a `bad_rows` log is given, the line is skipped and counted there.
    """
    path = Path(path)
    if not path.is_file():
        raise format_error(path, None, "no such file")
    users, items = [], []
    num_users = 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, 1):
            tokens = line.split()
            if not tokens:
                continue
            try:
                ids = [int(t) for t in tokens]
            except ValueError:
                bad = next(t for t in tokens if not _is_int(t))
                _bad_line(path, lineno, f"non-integer token {bad!r}", bad_rows)
                continue
            if min(ids) < 0:
                _bad_line(path, lineno, f"negative id {min(ids)}", bad_rows)
                continue
            if train_counts is not None:
                far = _far_id(ids, train_counts)
                if far:
                    _bad_line(path, lineno, far, bad_rows)
                    continue
            num_users = max(num_users, ids[0] + 1)
            users.extend([ids[0]] * (len(ids) - 1))
            items.extend(ids[1:])
    if bad_rows is not None:
        bad_rows.seen(path)
    return np.array(users, dtype=np.int64), np.array(items, dtype=np.int64), num_users


def read_lightgcn(directory: str | Path, skip_bad: bool = False) -> Interactions:
    """`train.txt` and `test.txt` of a LightGCN-format dataset directory."""
    directory = Path(directory)
    if not directory.is_dir():
        raise format_error(directory, None, "no such directory (expected train.txt and test.txt)")
    log = BadRowLog() if skip_bad else None
    tr_u, tr_i, tr_n = read_lightgcn_file(directory / "train.txt", log)
    if not len(tr_u):
        raise format_error(directory / "train.txt", None, "no interactions")
    te_u, te_i, te_n = read_lightgcn_file(directory / "test.txt", log, train_counts=(tr_n, int(tr_i.max()) + 1))
    num_items = int(max(tr_i.max(initial=-1), te_i.max(initial=-1))) + 1
    return from_pairs(tr_u, tr_i, te_u, te_i, num_users=max(tr_n, te_n), num_items=num_items,
                      name=directory.name, bad_rows=log)


# --- MovieLens ratings -------------------------------------------------------------------

def read_ratings(path: str | Path, bad_rows: BadRowLog | None = None) -> np.ndarray:
    """MovieLens ratings: `u.data` (tab separated) or `ratings.dat` (`::` separated), rows
    user, item, rating, timestamp. Returns int64 [n, 4] with user and item ids remapped to
    0-based contiguous ids (in the order of the raw ids). Bad lines as `read_lightgcn_file`."""
    path = Path(path)
    if not path.is_file():
        raise format_error(path, None, "no such file")
    rows = []
    with open(path, encoding="latin-1") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            parts = line.strip().split("::") if "::" in line else line.split()
            if len(parts) != 4:
                _bad_line(path, lineno, f"expected 4 fields, found {len(parts)}", bad_rows)
                continue
            try:
                row = [int(p) for p in parts]
            except ValueError:
                bad = next(p for p in parts if not _is_int(p))
                _bad_line(path, lineno, f"non-integer field {bad!r}", bad_rows)
                continue
            if row[0] < 0 or row[1] < 0:
                _bad_line(path, lineno, f"negative id {min(row[:2])}", bad_rows)
                continue
            rows.append(row)
    if not rows:
        raise format_error(path, None, "no ratings")
    r = np.array(rows, dtype=np.int64)
    r[:, 0] = np.unique(r[:, 0], return_inverse=True)[1]
    r[:, 1] = np.unique(r[:, 1], return_inverse=True)[1]
    return r


def split_ratings(ratings: np.ndarray, how: str = "random", test_fraction: float = TEST_FRACTION,
                  seed: int = 0, min_rating: int = 0, name: str = "", num_users=None,
                  num_items=None, bad_rows=None) -> Interactions:
    """Ratings [n, >=2] (user, item[, rating, timestamp]) -> implicit train/test.

    Ratings below `min_rating` are dropped (0 keeps all). Per user, `test_fraction` of its
    interactions (rounded, at least one when the user has two or more) go to the test set:
    a seeded random choice (`random`) or the latest by timestamp (`time`, ties by order).
    Users with a single interaction keep it in train.
    """
    if how not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}")
    r = ratings[ratings[:, 2] >= min_rating] if min_rating > 0 else ratings
    if not len(r):
        raise ValueError(f"no rating is >= {min_rating} (--min-rating) among {len(ratings):,}" if len(ratings)
                         else "no ratings")
    users, items = r[:, 0], r[:, 1]
    rng = np.random.default_rng(seed)
    if how == "random":
        key = rng.random(len(r))
    else:
        if r.shape[1] < 4:
            raise ValueError("a split by time needs a timestamp column")
        key = r[:, 3].astype(np.float64)
    # rank each interaction within its user by key; the last n_test ranks are test
    order = np.lexsort((np.arange(len(r)), key, users))
    counts = np.bincount(users, minlength=int(users.max()) + 1)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    rank = np.empty(len(r), dtype=np.int64)
    rank[order] = np.arange(len(r)) - np.repeat(starts, counts)
    n_test = np.where(counts >= 2, np.maximum(1, np.rint(counts * test_fraction)), 0).astype(np.int64)
    is_test = rank >= (counts - n_test)[users]
    return from_pairs(users[~is_test], items[~is_test], users[is_test], items[is_test],
                      num_users=num_users, num_items=num_items, name=name, bad_rows=bad_rows)


def load_ml100k(path=None, how="random", seed=0, test_fraction=TEST_FRACTION, min_rating=0) -> Interactions:
    """MovieLens-100k through `embcache.data.movielens` (the offline copy when path is None)."""
    from embcache.data import movielens

    ml = movielens.load_ml100k(path)  # raises DataFormatError (one line) itself
    return split_ratings(np.asarray(ml.ratings, dtype=np.int64), how, test_fraction, seed,
                         min_rating, name="ml-100k", num_users=ml.num_users, num_items=ml.num_items)


def _is_int(token: str) -> bool:
    try:
        int(token)
        return True
    except ValueError:
        return False


def _far_id(ids: list[int], train_counts: tuple[int, int]) -> str:
    """Why a test line's user or item id is out of all proportion to train.txt ('' if not)."""
    for kind, value, count in (("user", ids[0], train_counts[0]), ("item", max(ids[1:], default=0), train_counts[1])):
        limit = far_id_limit(count)
        if value >= limit:
            return (f"{kind} id {value} is far beyond the {count:,} {kind}s of train.txt; "
                    f"a test {kind} id must be below {_FAR_ID_FACTOR} x {count:,} + {_FAR_ID_SLACK:,} = {limit:,}")
    return ""


def _bad_line(path, lineno, why, bad_rows):
    if bad_rows is None:
        raise format_error(path, lineno, f"{why} (--skip-bad-lines skips and counts such lines)")
    bad_rows.add(path, lineno, why)
