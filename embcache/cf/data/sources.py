"""Which reader a `--data` value names: the built-in MovieLens-100k and synthetic sets, a
LightGCN directory (train.txt/test.txt), a MovieLens ratings file (u.data, ratings.dat) or a
directory holding one. Skipped lines are reported to the user here, once, as they are read."""
from __future__ import annotations

import logging
from pathlib import Path

from embcache.data.bad_rows import BadRowLog
from embcache.cf.data.interactions import TEST_FRACTION, Interactions
from embcache.errors import DataFormatError

logger = logging.getLogger(__name__)

DATA_CHOICES = ("'ml-100k', 'synthetic', a CSV, TSV or Parquet file of your own interactions (--user-col, "
                "--item-col), a LightGCN directory (train.txt, test.txt) or a MovieLens ratings file")


def read_interactions(spec: str, split: str = "random", test_fraction: float = TEST_FRACTION, split_seed: int = 0,
                      min_rating: int = 0, synthetic: tuple[int, int, int] = (30_000, 40_000, 1_000_000),
                      skip_bad_lines: bool = False, columns: dict | None = None) -> Interactions:
    """`Interactions` for `spec`. `split`, `test_fraction`, `split_seed` and `min_rating`
    split ratings (and the synthetic set: fraction and seed); `synthetic` is its (users,
    items, interactions). A bad line stops the reader naming file and line, or with
    `skip_bad_lines` is skipped, counted and reported. `split` "auto" is by time where a
    table file has a time column (`columns`: {"user", "item", "time", "rating"} names), else
    random. A table's ids come back on the data (`user_ids`, `item_ids`).

    Example:
        >>> data = read_interactions("synthetic", synthetic=(50, 60, 600))
        >>> data.num_users, data.num_items, data.num_train + data.num_test
        (50, 60, 600)
    """
    from embcache.cf.data.table import is_table

    given = (split, test_fraction, split_seed, min_rating, columns)  # before "auto" is resolved
    if spec in ("synthetic", "ml-100k"):
        _tell_ignored(spec, spec, *given)
    if split == "auto":
        has_time = bool((columns or {}).get("time")) and is_table(spec)
        split = "time" if has_time else "random"
    if spec == "ml-100k":
        return _ml100k(None, split, split_seed, test_fraction, min_rating, skip_bad_lines)
    if spec == "synthetic":
        from embcache.cf.data.synthetic import power_law_interactions

        return power_law_interactions(*synthetic, seed=split_seed, test_fraction=test_fraction)
    path = Path(spec)
    if path.is_dir():
        if (path / "train.txt").exists() or (path / "test.txt").exists():
            from embcache.cf.data.lightgcn import read_lightgcn

            _tell_ignored(path, "lightgcn", *given)
            data = read_lightgcn(path, skip_bad=skip_bad_lines)
            _report(data.bad_rows)
            return data
        ratings_file = next((path / n for n in ("u.data", "ratings.dat") if (path / n).is_file()), None)
        if ratings_file is None:
            if (path / "ml-100k.inter").is_file():
                return _ml100k(path, split, split_seed, test_fraction, min_rating, skip_bad_lines)
            raise DataFormatError(f"{path}: no train.txt/test.txt (LightGCN format), u.data or ratings.dat here")
        path = ratings_file
    elif not path.exists():
        raise DataFormatError(f"{path}: no such file or directory (--data takes {DATA_CHOICES})")
    elif is_table(path):
        return _table(path, split, test_fraction, split_seed, min_rating, skip_bad_lines, columns or {})
    _tell_ignored(path, "ratings", *given)
    return _ratings_file(path, split, test_fraction, split_seed, min_rating, skip_bad_lines)


def _table(path: Path, split: str, test_fraction: float, split_seed: int, min_rating: int, skip_bad_lines: bool,
           cols: dict) -> Interactions:
    """Your CSV, TSV or Parquet file (`cols`: the column names given), split; its ids on the data."""
    from embcache.cf.data.ratings import split_ratings
    from embcache.cf.data.table import read_table

    if min_rating and not cols.get("rating"):
        raise DataFormatError(f"{path}: --min-rating {min_rating} needs --rating-col, your file's rating column "
                              f"(without one every row counts as rated 1)")
    log = BadRowLog() if skip_bad_lines else None
    table = read_table(path, cols.get("user") or "user_id", cols.get("item") or "item_id", cols.get("time"),
                       cols.get("rating"), log)
    _report(log)
    if split == "time" and not table.has_time:
        raise DataFormatError(f"{path}: --split time needs the time column (--time-col)")
    data = split_ratings(table.pairs, split, test_fraction, split_seed, min_rating, name=path.name,
                         num_users=len(table.user_ids), num_items=len(table.item_ids), bad_rows=log)
    data.user_ids, data.item_ids = table.user_ids, table.item_ids
    return data


def _ratings_file(path: Path, split: str, test_fraction: float, split_seed: int, min_rating: int,
                  skip_bad_lines: bool) -> Interactions:
    """A MovieLens ratings file (u.data, ratings.dat), split; MovieLens's ids on the data."""
    from embcache.cf.data.ratings import read_ratings_and_ids, split_ratings

    log = BadRowLog() if skip_bad_lines else None
    ratings, user_ids, item_ids = read_ratings_and_ids(path, log)
    _report(log)
    data = split_ratings(ratings, split, test_fraction, split_seed, min_rating, name=path.name, bad_rows=log)
    # the file's ids, for the model and `cf recommend` (sizes as before: --min-rating may drop the last ones)
    data.user_ids, data.item_ids = user_ids[:data.num_users], item_ids[:data.num_items]
    return data


def _ml100k(path, split: str, split_seed: int, test_fraction: float, min_rating: int,
            skip_bad_lines: bool) -> Interactions:
    """MovieLens-100k (the offline copy, or RecBole's files in `path`), its skipped lines
    counted and reported as every other reader's."""
    from embcache.cf.data.ratings import load_ml100k

    log = BadRowLog() if skip_bad_lines else None
    data = load_ml100k(path, split, split_seed, test_fraction, min_rating, log)
    _report(log)
    return data


IGNORED_BECAUSE = {"lightgcn": "a LightGCN directory is split already, by its train.txt and test.txt, and has no "
                               "ratings",
                   "synthetic": "the synthetic set is split at random and has no ratings",
                   "ml-100k": "--*-col name the columns of a CSV, TSV or Parquet file of your own",
                   "ratings": "a MovieLens ratings file's columns are fixed: user, item, rating, time"}


def _tell_ignored(spec, kind: str, split: str, test_fraction: float, split_seed: int, min_rating: int,
                  columns: dict | None) -> None:
    """One warning naming the options given that this data cannot use (a LightGCN directory
    is split already and has no ratings; the synthetic set has no ratings or times; neither,
    nor MovieLens-100k, has a file's columns), so that no run looks shaped by an option it
    ignored."""
    defaults = {"user": "user_id", "item": "item_id"}
    ignored = [f"--{k}-col {v}" for k, v in (columns or {}).items() if v and v != defaults.get(k)]
    lightgcn = kind == "lightgcn"
    if lightgcn:
        ignored += ([f"--split {split}"] if split != "auto" else []) + (
            [f"--test-fraction {test_fraction:g}"] if test_fraction != TEST_FRACTION else []) + (
            [f"--split-seed {split_seed}"] if split_seed else [])
    if kind in ("lightgcn", "synthetic"):
        ignored += [f"--min-rating {min_rating}"] if min_rating else []
    if kind == "synthetic" and split == "time":
        ignored.append("--split time")
    if ignored:
        logger.warning(f"{spec}: {', '.join(ignored)} ignored ({IGNORED_BECAUSE[kind]})")


def _report(log: BadRowLog | None) -> None:
    if log is not None and log.total:
        log.report()
