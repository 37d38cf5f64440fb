"""MovieLens-100k as a small real CTR data set: a rating of 4 or 5 counts as a click.

One row per rating. Sparse features (column: meaning, cardinality on the real data):

    sparse_0  user id                                   943
    sparse_1  item id                                   1682
    sparse_2  age bucket <18,18-24,25-34,35-44,45-49,50-55,56+   7
    sparse_3  gender                                    2
    sparse_4  occupation                                21
    sparse_5  zip-code prefix (first 3 characters)      distinct prefixes
    sparse_6  genres, multi-hot (list<int64>)           19

torchrec's DLRM needs a dense input, so there are two dense features: dense_0 = age / 100 and
dense_1 = (release year - 1900) / 100, 0 where the year is unknown. Splits: "random" (default)
shuffles the ratings with `seed` and cuts 80/10/10; "time" orders them by timestamp (ties by
file order) so val and test lie in the future of train. A malformed line of the three files
is skipped and counted (reported, and kept in meta.json's `bad_rows`), as in the other
converters; `skip_bad_lines=False` (`--strict`) stops at the first, naming file and line.
"""
from __future__ import annotations

import os

import numpy as np
import pyarrow as pa

from embcache.data.bad_rows import BadRowLog
from embcache.data.ctr_format import CTRDatasetWriter, SparseFeature, check_output_dir
from embcache.data.movielens import MovieLens100k, load_ml100k
from embcache.data.raw_values import save_raw_values

AGE_BOUNDS = (18, 25, 35, 45, 50, 56)  # bucket k holds ages in [AGE_BOUNDS[k-1], AGE_BOUNDS[k])
AGE_BUCKETS = ("<18", "18-24", "25-34", "35-44", "45-49", "50-55", "56+")
SPLIT_METHODS = ("random", "time")


def age_bucket(age: np.ndarray) -> np.ndarray:
    """The AGE_BUCKETS index of each age.

    Example:
        >>> age_bucket(np.array([17, 18, 34, 56])).tolist()
        [0, 1, 2, 6]
    """
    return np.searchsorted(np.array(AGE_BOUNDS), age, side="right").astype(np.int64)


def prepare_ml100k_ctr(out_dir: str | os.PathLike, source: str | os.PathLike | None = None,
                       split: str = "random", seed: int = 0,
                       fractions: tuple[float, float, float] = (0.8, 0.1, 0.1), skip_bad_lines: bool = True) -> dict:
    """Write MovieLens-100k as CTR data in the canonical format; returns its meta.

    Args:
        out_dir: target directory.
        source: a MovieLens-100k directory (see `movielens.ml100k_dir`); None fetches the
            RecBole copy into datasets/ml-100k/ on first use.
        split: "random" (seeded shuffle) or "time" (chronological).
        seed: the shuffle's seed (random split only).
        fractions: train / val / test shares; rounded down, test takes the remainder.
        skip_bad_lines: skip and count malformed lines (reported on stderr and in meta.json's
            `bad_rows`); False stops at the first with DataFormatError naming file and line.

    Example:
        >>> prepare_ml100k_ctr("ml-100k-ctr", split="weekly")
        Traceback (most recent call last):
        ValueError: split must be one of ('random', 'time'), got 'weekly'
        >>> meta = prepare_ml100k_ctr("datasets/ml-100k-ctr")  # doctest: +SKIP
        >>> meta["splits"]["train"]["rows"]  # doctest: +SKIP
        80000
    """
    _check_split(split, fractions)
    check_output_dir(out_dir)  # before a possible download
    bad = BadRowLog() if skip_bad_lines else None
    ml = load_ml100k(source, bad)
    if bad is not None:
        bad.report()
    prefixes, zip_code = np.unique(np.array([z[:3] for z in ml.user_zip]), return_inverse=True)
    writer = CTRDatasetWriter(out_dir, 2, _sparse_features(ml, len(prefixes)),
                              source=f"MovieLens-100k ({ml.source})")
    for name, rows in _split_rows(ml.ratings[:, 3], split, seed, fractions).items():
        _write_ratings(writer, name, ml, ml.ratings[rows], zip_code)
    return writer.finish(
        bad_rows=bad.to_json() if bad is not None else {},
        raw_values=_save_raw_values(out_dir, ml, prefixes),
        label="rating >= 4",
        split={"method": split, "seed": seed if split == "random" else None, "fractions": list(fractions)},
        features=_feature_descriptions(ml),
        vocabularies={"sparse_4": list(ml.occupation_names), "sparse_5": prefixes.tolist(),
                      "sparse_6": list(ml.genre_names)},
    )


def _check_split(split: str, fractions: tuple[float, float, float]) -> None:
    if split not in SPLIT_METHODS:
        raise ValueError(f"split must be one of {SPLIT_METHODS}, got {split!r}")
    if len(fractions) != 3 or min(fractions) < 0 or abs(sum(fractions) - 1) > 1e-9:
        raise ValueError(f"fractions must be three shares summing to 1, got {fractions}")


def _split_rows(timestamps: np.ndarray, split: str, seed: int,
                fractions: tuple[float, float, float]) -> dict[str, np.ndarray]:
    """The rating indices of train, val and test: a seeded shuffle or chronological order
    (ties in file order), cut by `fractions` rounded down."""
    n = len(timestamps)
    if split == "random":
        order = np.random.default_rng(seed).permutation(n)
    else:
        order = np.argsort(timestamps, kind="stable")
    n_train, n_val = int(n * fractions[0]), int(n * fractions[1])
    return {"train": order[:n_train], "val": order[n_train:n_train + n_val], "test": order[n_train + n_val:]}


def _sparse_features(ml: MovieLens100k, zip_prefixes: int) -> list[SparseFeature]:
    return [SparseFeature("sparse_0", ml.num_users), SparseFeature("sparse_1", ml.num_items),
            SparseFeature("sparse_2", len(AGE_BUCKETS)), SparseFeature("sparse_3", len(ml.gender_names)),
            SparseFeature("sparse_4", len(ml.occupation_names)), SparseFeature("sparse_5", zip_prefixes),
            SparseFeature("sparse_6", len(ml.genre_names), multi_hot=True)]


def _write_ratings(writer: CTRDatasetWriter, split: str, ml: MovieLens100k, ratings: np.ndarray,
                   zip_code: np.ndarray) -> None:
    """Write `ratings` (rows of (user, item, rating, timestamp)) to `split` as CTR rows."""
    users, items = ratings[:, 0], ratings[:, 1]
    year = ml.item_year.astype(np.float64)
    item_year = np.where(year >= 0, (year - 1900.0) / 100.0, 0.0)
    dense = np.stack([ml.user_age[users] / 100.0, item_year[items]], 1)
    writer.write(split, (ratings[:, 2] >= 4).astype(np.int8), dense,
                 [users, items, age_bucket(ml.user_age)[users], ml.user_gender[users], ml.user_occupation[users],
                  zip_code[users], _genres_of(ml, items)])


def _save_raw_values(out_dir: str | os.PathLike, ml: MovieLens100k, zip_prefixes: np.ndarray) -> dict:
    """raw_values/: every feature's value per id, as the files spell it (user and item ids,
    age bucket labels, names, zip prefixes); every id is a value, none stands for missing."""
    values = [ml.user_raw_ids, ml.item_raw_ids, AGE_BUCKETS, ml.gender_names, ml.occupation_names,
              zip_prefixes, ml.genre_names]
    tables = {f"sparse_{f}": pa.table({"value": pa.array(np.asarray(v).tolist())}) for f, v in enumerate(values)}
    entries = {name: {"key": "exact", "id_0": "a value", "hashed": False} for name in tables}
    return save_raw_values(out_dir, tables, entries)


def _genres_of(ml: MovieLens100k, items: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The multi-hot genre column of `items`: (offsets, flat genre ids), without a Python loop
    over rows."""
    lengths = np.diff(ml.item_genre_offsets)[items]
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    starts = ml.item_genre_offsets[items]
    flat = np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1])
    return offsets, ml.item_genre_ids[flat]


def _feature_descriptions(ml: MovieLens100k) -> dict[str, str]:
    """meta.json's "features": what each column holds."""
    return {"sparse_0": "user", "sparse_1": "item", "sparse_2": "age bucket " + ",".join(AGE_BUCKETS),
            "sparse_3": "gender " + ",".join(ml.gender_names), "sparse_4": "occupation",
            "sparse_5": "zip prefix (3 chars)", "sparse_6": "genres (multi-hot)",
            "dense_0": "age / 100", "dense_1": "(release year - 1900) / 100, 0 if unknown"}
