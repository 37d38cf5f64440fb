"""The LightGCN text format of Gowalla, Yelp2018 and Amazon-Books: a directory with
`train.txt` and `test.txt`, one `user item item ...` line per user (space separated).
Bad lines stop the reader with file and line, or are counted and skipped on request (with
the interactions they held: a line is a user's items).

A test user with no interaction in train.txt gets no row and is left out of evaluation: its
row would never be trained, so its ranking would be noise in Recall and NDCG. A test item
with none keeps its row and stays in the test split, as LightGCN's own evaluation keeps it
(and as a held-out split keeps an item whose interactions all fell in the test share): the
model trains it as a negative, and missing it is the model's miss. Both are counted, and the
data line says so (`Interactions.summary`).

Example:
    >>> far_id_limit(50)
    1100
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from embcache.data.bad_rows import BadRowLog
from embcache.cf.data.bad_lines import bad_line, whole_numbers
from embcache.cf.data.interactions import Interactions, from_pairs
from embcache.errors import format_error

# a test.txt id must be below _FAR_ID_FACTOR x the training count + _FAR_ID_SLACK
_FAR_ID_FACTOR = 2
_FAR_ID_SLACK = 1000


def far_id_limit(train_count: int) -> int:
    """The bound a test.txt id must stay below, given the users (or items) of train.txt.

    An id that train.txt never names is not an error (a user seen only in test is left out
    of evaluation, an item's table grows to hold it: see the module docstring). But the
    tables are dense (one row per id up to the largest), so a single corrupt id such as
    10000000000 would ask for terabytes; an id at or above twice the training count plus
    1,000 is taken for a bad line instead, as a damaged line rather than a cold one.
    """
    return _FAR_ID_FACTOR * train_count + _FAR_ID_SLACK


def read_lightgcn_file(path: str | Path, bad_rows: BadRowLog | None = None,
                       train_counts: tuple[int, int] | None = None) -> tuple[np.ndarray, np.ndarray, int]:
    """`_read_lines` without the per-line record (see there)."""
    users, items, num_users, _ = _read_lines(path, bad_rows, train_counts)
    return users, items, num_users


def _read_lines(path: str | Path, bad_rows: BadRowLog | None = None,
                train_counts: tuple[int, int] | None = None) -> tuple[np.ndarray, np.ndarray, int, np.ndarray]:
    """Read `user item item ...` lines (space separated) into (users, items, num_users).

    Empty lines are ignored; a user with no items is allowed: it adds no pair but still
    counts in num_users (the largest user id seen + 1), so it keeps its row. A token that
    is not a non-negative integer, or, for a test file (`train_counts` = the users and items
    of train.txt), an id at or above its `far_id_limit`, raises `DataFormatError` naming
    file and line, or, when a `bad_rows` log is given, the line is skipped and counted there.
    The fourth value holds, per kept line, (line number, first pair, end pair, user, largest
    item), for `_bound_dense`.
    """
    path = Path(path)
    lines = []
    if not path.is_file():
        raise format_error(path, None, "no such file")
    users, items = [], []
    num_users = 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, 1):
            tokens = line.split()
            if not tokens:
                continue
            ids = whole_numbers(tokens, path, lineno, "token", bad_rows, len(tokens) - 1)
            if ids is None:
                continue
            if min(ids) < 0:
                bad_line(path, lineno, f"negative id {min(ids)}", bad_rows, len(ids) - 1)
                continue
            if train_counts is not None:
                far = _far_id(ids, train_counts)
                if far:
                    bad_line(path, lineno, far, bad_rows, len(ids) - 1)
                    continue
            num_users = max(num_users, ids[0] + 1)
            lines.append((lineno, len(items), len(items) + len(ids) - 1, ids[0], max(ids[1:], default=-1)))
            users.extend([ids[0]] * (len(ids) - 1))
            items.extend(ids[1:])
    if bad_rows is not None:
        bad_rows.seen(path)
    return (np.array(users, dtype=np.int64), np.array(items, dtype=np.int64), num_users,
            np.array(lines, dtype=np.int64).reshape(-1, 5))


def _bound_dense(path: Path, users: np.ndarray, items: np.ndarray, lines: np.ndarray,
                 bad_rows: BadRowLog | None) -> tuple[np.ndarray, np.ndarray, int]:
    """train.txt's ids checked before any table is sized from them: the tables hold a row per
    id up to the largest, so an id at or above `far_id_limit` of the distinct ids seen (one
    corrupt 10^12 would ask for terabytes) is a bad line naming file, line and value, or, with
    `bad_rows`, a counted skip. Returns (users, items, num_users) without the skipped lines."""
    limits = [far_id_limit(len(np.unique(lines[:, 3]))), far_id_limit(len(np.unique(items)))]
    far = (lines[:, 3] >= limits[0]) | (lines[:, 4] >= limits[1])
    if not far.any():
        return users, items, int(lines[:, 3].max(initial=-1)) + 1
    hint = ""
    if far.mean() > 0.01:  # not a few corrupt lines: the ids themselves are sparse
        hint = ("; the ids are not dense (LightGCN files index the tables by id): give the interactions as a "
                "CSV, TSV or Parquet file with --user-col/--item-col instead, whose ids may be anything")
    keep = np.ones(len(users), dtype=bool)
    for lineno, lo, hi, user, top in lines[far]:
        kind, value, limit = ("user", user, limits[0]) if user >= limits[0] else ("item", top, limits[1])
        bad_line(path, int(lineno), f"{kind} id {value:,} is far beyond the ids of train.txt (an id must be below "
                                    f"{_FAR_ID_FACTOR} x the distinct {kind}s + {_FAR_ID_SLACK:,} = {limit:,}){hint}",
                 bad_rows, int(hi - lo))
        keep[lo:hi] = False
    kept = lines[~far]
    return users[keep], items[keep], int(kept[:, 3].max(initial=-1)) + 1


def read_lightgcn(directory: str | Path, skip_bad: bool = False) -> Interactions:
    """`train.txt` and `test.txt` of a LightGCN-format dataset directory."""
    directory = Path(directory)
    if not directory.is_dir():
        raise format_error(directory, None, "no such directory (expected train.txt and test.txt)")
    log = BadRowLog(carried_noun="interaction") if skip_bad else None
    tr_u, tr_i, tr_n, lines = _read_lines(directory / "train.txt", log)
    tr_u, tr_i, tr_n = _bound_dense(directory / "train.txt", tr_u, tr_i, lines, log)
    if not len(tr_u):
        raise format_error(directory / "train.txt", None, "no interactions")
    te_u, te_i, _ = read_lightgcn_file(directory / "test.txt", log, train_counts=(tr_n, int(tr_i.max()) + 1))
    te_u, te_i, cold = _cold_test(tr_u, tr_i, te_u, te_i)
    num_items = int(max(tr_i.max(initial=-1), te_i.max(initial=-1))) + 1
    data = from_pairs(tr_u, tr_i, te_u, te_i, num_users=tr_n, num_items=num_items, name=directory.name,
                      bad_rows=log)
    data.cold_test = cold
    return data


def _cold_test(tr_u: np.ndarray, tr_i: np.ndarray, te_u: np.ndarray,
               te_i: np.ndarray) -> tuple[np.ndarray, np.ndarray, dict]:
    """test.txt's pairs less those of users with no training interaction (their rows would
    never be trained), and the counts `Interactions.cold_test` keeps of those users and of
    the test items with no training interaction (kept: see the module docstring). The cold
    users' pairs go first, so that the data is the same as without their lines at all; a pair
    named twice counts once, as it is one interaction."""
    te_u, te_i = np.unique(np.stack([te_u, te_i], axis=1).reshape(-1, 2), axis=0).T
    cold_user = ~np.isin(te_u, tr_u)
    te_u, te_i, dropped = te_u[~cold_user], te_i[~cold_user], te_u[cold_user]
    cold_item = ~np.isin(te_i, tr_i)
    counts = {"users": len(np.unique(dropped)), "user_interactions": len(dropped),
              "items": len(np.unique(te_i[cold_item])), "item_interactions": int(cold_item.sum())}
    return te_u, te_i, counts


def _far_id(ids: list[int], train_counts: tuple[int, int]) -> str:
    """Why a test line's user or item id is out of all proportion to train.txt ('' if not)."""
    for kind, value, count in (("user", ids[0], train_counts[0]), ("item", max(ids[1:], default=0), train_counts[1])):
        limit = far_id_limit(count)
        if value >= limit:
            return (f"{kind} id {value} is far beyond the {count:,} {kind}s of train.txt; "
                    f"a test {kind} id must be below {_FAR_ID_FACTOR} x {count:,} + {_FAR_ID_SLACK:,} = {limit:,}")
    return ""
