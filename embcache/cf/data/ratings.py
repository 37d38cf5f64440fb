"""MovieLens ratings as implicit feedback: `read_ratings` reads `u.data` or `ratings.dat`,
`split_ratings` holds out a seeded random or the latest share of each user's interactions,
and `load_ml100k` does both for MovieLens-100k (the offline copy by default).

Example:
    >>> import numpy as np
    >>> r = np.array([[0, i, 5, 50 - 10 * i] for i in range(5)])
    >>> split_ratings(r, "time", test_fraction=0.4).test_indices.tolist()
    [0, 1]
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from embcache.data.bad_rows import BadRowLog
from embcache.cf.data.bad_lines import bad_line, whole_numbers
from embcache.cf.data.interactions import SPLITS, TEST_FRACTION, Interactions, from_pairs
from embcache.errors import format_error


def read_ratings(path: str | Path, bad_rows: BadRowLog | None = None) -> np.ndarray:
    """MovieLens ratings: `u.data` (tab separated) or `ratings.dat` (`::` separated), rows
    user, item, rating, timestamp. Returns int64 [n, 4] with user and item ids remapped to
    0-based contiguous ids (in the order of the raw ids). Bad lines as `read_lightgcn_file`."""
    return read_ratings_and_ids(path, bad_rows)[0]


def read_ratings_and_ids(path: str | Path, bad_rows: BadRowLog | None = None
                         ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`read_ratings`, and the file's user and item ids of each 0-based index: a model then
    answers in MovieLens's ids (1-based), not in indices one below them."""
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
                bad_line(path, lineno, f"expected 4 fields, found {len(parts)}", bad_rows)
                continue
            row = whole_numbers(parts, path, lineno, "field", bad_rows)
            if row is None:
                continue
            if row[0] < 0 or row[1] < 0:
                bad_line(path, lineno, f"negative id {min(row[:2])}", bad_rows)
                continue
            rows.append(row)
    if not rows:
        raise format_error(path, None, "no ratings")
    r = np.array(rows, dtype=np.int64)
    user_ids, r[:, 0] = np.unique(r[:, 0], return_inverse=True)
    item_ids, r[:, 1] = np.unique(r[:, 1], return_inverse=True)
    return r, user_ids, item_ids


def split_ratings(ratings: np.ndarray, how: str = "random", test_fraction: float = TEST_FRACTION,
                  seed: int = 0, min_rating: int = 0, name: str = "", num_users=None,
                  num_items=None, bad_rows=None) -> Interactions:
    """Ratings [n, >=2] (user, item[, rating, timestamp]) -> implicit train/test.

    Ratings below `min_rating` are dropped (0 keeps all). Per user, `test_fraction` of its
    interactions (rounded, at least one when the user has two or more) go to the test set:
    a seeded random choice (`random`) or the latest by timestamp (`time`, ties by order).
    Every user keeps at least one interaction in train (a single one stays there): a test
    user with none would be scored on an untrained row, noise in Recall and NDCG, which
    large fractions (0.75 and up rounds a 2-interaction user's share to both) would cause.
    """
    if how not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}")
    r = ratings[ratings[:, 2] >= min_rating] if min_rating > 0 else ratings
    if not len(r):
        raise ValueError(f"no rating is >= {min_rating} (--min-rating) among {len(ratings):,}" if len(ratings)
                         else "no ratings")
    r, duplicates = _first_of_each_pair(r)
    users, items = r[:, 0].astype(np.int64), r[:, 1].astype(np.int64)
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
    n_test = np.where(counts >= 2, np.clip(np.rint(counts * test_fraction), 1, counts - 1), 0).astype(np.int64)
    is_test = rank >= (counts - n_test)[users]
    data = from_pairs(users[~is_test], items[~is_test], users[is_test], items[is_test],
                      num_users=num_users, num_items=num_items, name=name, bad_rows=bad_rows)
    data.duplicates = duplicates
    return data


def _first_of_each_pair(r: np.ndarray) -> tuple[np.ndarray, int]:
    """The rows of `r` less repeats of a (user, item) pair, each pair's earliest kept (by
    time, then file order), in file order; and how many were dropped. Merged before the
    split, so that one pair cannot be both a training and a test interaction."""
    users, items = r[:, 0].astype(np.int64), r[:, 1].astype(np.int64)
    when = r[:, 3].astype(np.float64) if r.shape[1] >= 4 else np.zeros(len(r))
    order = np.lexsort((np.arange(len(r)), when, items, users))
    first = np.ones(len(r), dtype=bool)
    first[1:] = (np.diff(users[order]) != 0) | (np.diff(items[order]) != 0)
    if first.all():
        return r, 0
    return r[np.sort(order[first])], int((~first).sum())


def load_ml100k(path=None, how="random", seed=0, test_fraction=TEST_FRACTION, min_rating=0,
                bad_rows: BadRowLog | None = None) -> Interactions:
    """MovieLens-100k through `embcache.data.movielens` (the offline copy when path is None);
    a malformed line stops it naming file and line, or is counted in `bad_rows`."""
    from embcache.data import movielens

    ml = movielens.load_ml100k(path, bad_rows)  # raises DataFormatError (one line) itself
    data = split_ratings(np.asarray(ml.ratings, dtype=np.int64), how, test_fraction, seed, min_rating,
                         name="ml-100k", num_users=ml.num_users, num_items=ml.num_items, bad_rows=bad_rows)
    data.user_ids, data.item_ids = ml.user_raw_ids, ml.item_raw_ids  # MovieLens's ids (1-based), for the model
    return data
