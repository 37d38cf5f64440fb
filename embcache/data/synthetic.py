"""Criteo-shaped synthetic CTR data that needs no download: the built-in default of the main job.

Shape: 13 dense and 26 sparse features, the sparse cardinalities of Criteo Kaggle times `scale`.
Ids are Zipf-skewed (a per-feature exponent drawn from [1.05, 1.4]) so a small cache can hold the
hot rows, and the hot ids are scattered over the table by a per-feature affine permutation rather
than being 0..k. Labels come from a hidden logistic model, so AUC measures learning:

    logit = bias + sum_j w_j * z_j + sum_{f in informative} e_f(id_f)

z_j the standardized dense values (after the converters' `log(x+1)`), e_f(id) a fixed random
effect per id (uniform with standard deviation `effect_std`, drawn by hashing (feature, id), so
no per-id table is stored even at scale 1), and `bias` tuned on a calibration sample so that
about `base_rate` of labels are 1. The hidden model's own AUC on val ("oracle_auc" in meta.json,
~0.81 with the defaults) is the ceiling a trained model can approach.

Everything is vectorized numpy in chunks and a function of `seed` only: the same arguments give
byte-identical Parquet files.

Day by day (`days=N`): splits `day_0` .. `day_{N-1}` of `rows` rows each (no train/val/test),
for training one day and evaluating on the next. Each feature's values are numbered as they
appear. Day 0's rows are drawn as above, its value numbers the ids above. On every later day
the day's rows are drawn over the same Zipf ranks, then the distinct ranks drawn that day are
given values: a fraction `drift` of them (stochastically rounded, picked at random among the
day's distinct ranks, hot or cold alike) get new values, never seen before, numbered from
the feature's next free number on; the others, in rank order, take the values seen so far in
their order of popularity (yesterday's order, with the values that were new yesterday in
the ranks they had). So about `drift` of each day's distinct values and of its traffic are new,
and old values fade: each day the values put before them push them down to colder ranks,
and the share of day 0's values decays about as `(1 - drift)**day`. The hidden model gives
every value, new ones too, its own fixed effect (the hash of (feature, value number)): a model
that maps unseen values to one shared row, or hashes them into shared buckets, loses what
their effects carry. meta.json's "day_splits" has per day the oracle AUC and the oracle AUC
with the effects of that day's new values left out ("oracle_auc_new_unknown"): the most a
model that learns nothing about new values could reach.

Keys (`keys="raw"`): a value's key is `keys.mix64(((feature + 1) << 40) | value number)`, an
int64 spread over the whole range (never 0: 0 means missing); the same data as `keys="ids"`,
whose ids are the value numbers (with `days`: day 0's below the scaled cardinality, new ones
numbered on from there, and the cardinality counts them all).
"""
from __future__ import annotations

import math
import os

import numpy as np

from embcache.errors import check_whole
from embcache.data.ctr_format import KEY_MODES, CTRDatasetWriter, SparseFeature
from embcache.data.defaults import SYNTHETIC_DRIFT, SYNTHETIC_ROWS, SYNTHETIC_SCALE
from embcache.data.delimited import splitmix64
from embcache.data.raw_values import identity_values

CRITEO_KAGGLE_CARDINALITIES = (1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683,
                               8351593, 3194, 27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18,
                               15, 286181, 105, 142572)
NUM_DENSE = 13
ZIPF_RANGE = (1.05, 1.4)
VALUE_BITS = 40  # a raw key mixes (feature + 1) << 40 with a value number below 2**40


def scaled_cardinalities(scale: float) -> list[int]:
    """Criteo Kaggle's cardinalities times `scale`, at least 2 each."""
    if not (scale > 0 and math.isfinite(scale)):
        raise ValueError(f"scale must be a finite number > 0, got {scale}")
    return [max(2, int(round(c * scale))) for c in CRITEO_KAGGLE_CARDINALITIES]


class HiddenModel:
    """The generator's parameters: Zipf exponents, id permutations, dense distributions and
    the logistic model that makes labels. Built from `seed`; `sample(rng, n)` draws rows."""

    def __init__(self, cardinalities: list[int], seed: int, informative: int = 8,
                 effect_std: float = 0.45, dense_weight_std: float = 0.25, base_rate: float = 0.25):
        rng = np.random.default_rng([seed, 0xC7])
        self.cardinalities = np.array(cardinalities, dtype=np.int64)
        m = len(cardinalities)
        self.zipf = rng.uniform(*ZIPF_RANGE, size=m)
        # affine permutation rank -> (a*rank + b) mod c, a coprime with c: hot ids land anywhere
        self.mult = np.empty(m, dtype=np.int64)
        for f, c in enumerate(cardinalities):
            a = int(rng.integers(1, c)) if c > 2 else 1
            while math.gcd(a, c) != 1:
                a = a % (c - 1) + 1
            self.mult[f] = a
        self.shift = np.array([rng.integers(0, c) for c in cardinalities], dtype=np.int64)
        self.informative = np.sort(rng.choice(m, size=min(informative, m), replace=False))
        self.effect_std = effect_std
        self.salt = rng.integers(0, 2**62, size=m, dtype=np.int64).astype(np.uint64)
        self.dense_mu = rng.uniform(0.0, 4.0, NUM_DENSE)
        self.dense_sigma = rng.uniform(0.8, 2.0, NUM_DENSE)
        self.dense_missing = rng.uniform(0.0, 0.4, NUM_DENSE)
        self.dense_weight = rng.normal(0.0, dense_weight_std, NUM_DENSE)
        calib = self.sample(np.random.default_rng([seed, 0xCA1]), 50_000, bias=0.0)[3]
        self.bias = _bias_for_rate(calib, base_rate)
        self.base_rate = base_rate

    def zipf_ranks(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """`[n, m]` ranks (0 = hottest), bounded Zipf by inverting the continuous power law
        on [1, c+1): exact enough for skew, O(1) memory whatever the cardinality."""
        c = self.cardinalities.astype(np.float64)
        s = self.zipf
        u = rng.random((n, len(c)))
        top = (c + 1.0) ** (1.0 - s)
        x = (1.0 - u * (1.0 - top)) ** (1.0 / (1.0 - s))
        return np.minimum(np.floor(x).astype(np.int64) - 1, self.cardinalities - 1)

    def effects(self, f: int, ids: np.ndarray) -> np.ndarray:
        """Feature f's fixed random effect of each id: uniform, mean 0, std `effect_std`."""
        h = splitmix64(ids.astype(np.uint64) ^ self.salt[f])
        u = (h >> np.uint64(11)).astype(np.float64) * (1.0 / 2**53)
        return (2.0 * u - 1.0) * (math.sqrt(3.0) * self.effect_std)

    def sample(self, rng: np.random.Generator, n: int, bias: float | None = None):
        """`n` rows: (dense `[n,13]` float32 after log(x+1), ids `[n,26]` int64,
        click probability `[n]`, logit `[n]`); labels are drawn by the caller."""
        ranks = self.zipf_ranks(rng, n)
        ids = self.ids_of_ranks(ranks)
        dense, logit = self.dense_part(rng, n)
        for f in self.informative:
            logit += self.effects(f, ids[:, f])
        logit += self.bias if bias is None else bias
        return dense.astype(np.float32), ids, 1.0 / (1.0 + np.exp(-logit)), logit

    def ids_of_ranks(self, ranks: np.ndarray) -> np.ndarray:
        """`[n, m]` ids of `[n, m]` ranks: the affine permutation, so hot ids land anywhere."""
        return (ranks * self.mult + self.shift) % self.cardinalities

    def dense_part(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        """`n` rows' dense values (float64, after log(x+1)) and their part of the logit, drawn
        from `rng` after the ranks."""
        raw = np.floor(np.exp(rng.normal(self.dense_mu, self.dense_sigma, (n, NUM_DENSE)))) - 1.0
        raw[rng.random((n, NUM_DENSE)) < self.dense_missing] = 0.0  # missing -> 0, as converters do
        dense = np.log1p(np.maximum(raw, 0.0))
        mean, std = self._dense_stats()
        return dense, ((dense - mean) / std) @ self.dense_weight

    def _dense_stats(self):
        if not hasattr(self, "_stats"):
            probe = np.random.default_rng(0xD5)
            raw = np.floor(np.exp(probe.normal(self.dense_mu, self.dense_sigma, (20_000, NUM_DENSE)))) - 1.0
            raw[probe.random((20_000, NUM_DENSE)) < self.dense_missing] = 0.0
            d = np.log1p(np.maximum(raw, 0.0))
            self._stats = (d.mean(0), d.std(0) + 1e-6)
        return self._stats


def _bias_for_rate(logit: np.ndarray, rate: float) -> float:
    """The bias b with mean(sigmoid(logit + b)) = rate (bisection; the mean is monotone in b)."""
    lo, hi = -20.0, 20.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if np.mean(1.0 / (1.0 + np.exp(-(logit + mid)))) < rate:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def roc_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve by the rank-sum formula, ties given their average rank."""
    scores, labels = np.asarray(scores, dtype=np.float64), np.asarray(labels).astype(bool)
    pos, neg = int(labels.sum()), int((~labels).sum())
    if pos == 0 or neg == 0:
        return float("nan")
    _, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    average_rank = ends - (counts - 1) / 2.0  # 1-based average rank of each distinct score
    ranks = average_rank[inverse]
    return float((ranks[labels].sum() - pos * (pos + 1) / 2.0) / (pos * neg))


def synthetic_keys(feature: int, values: np.ndarray) -> np.ndarray:
    """int64 raw keys of feature `feature`'s value numbers: `mix64(((feature + 1) << 40) | value)`
    (`embcache.keys.mix64`, a bijection: distinct values, and features, get distinct keys, none 0).

    Example:
        >>> k = synthetic_keys(2, np.array([0, 1, 1]))
        >>> str(k.dtype), bool(k[0] != k[1]), bool(k[1] == k[2]), bool((k != 0).all())
        ('int64', True, True, True)
    """
    import torch

    from embcache.keys import mix64

    values = np.asarray(values, dtype=np.int64)
    if len(values) and (values.min() < 0 or values.max() >= 1 << VALUE_BITS):
        raise ValueError(f"value numbers must be in [0, 2**{VALUE_BITS})")
    code = np.int64((feature + 1) << VALUE_BITS) | values
    return mix64(torch.from_numpy(np.ascontiguousarray(code))).numpy()


def generate_synthetic(out_dir: str | os.PathLike, rows: int = SYNTHETIC_ROWS, scale: float = SYNTHETIC_SCALE,
                       seed: int = 0,
                       val_rows: int | None = None, test_rows: int | None = None,
                       chunk_rows: int = 65_536, rows_per_shard: int = 1_000_000,
                       progress: bool = False, days: int | None = None, drift: float | None = None,
                       keys: str = "ids") -> dict:
    """Write a Criteo-shaped synthetic data set in the canonical format; returns its meta.

    Args:
        out_dir: target directory (old shards there are replaced).
        rows: training rows; `val_rows` / `test_rows` default to a tenth of it each. With
            `days`: rows per day.
        scale: multiplies Criteo Kaggle's cardinalities (0.1: 3.4 M embedding rows in all).
        seed: everything is a function of it.
        chunk_rows: rows generated at a time (memory ~ chunk_rows * 40 * 8 bytes).
        days: None (train/val/test), or the number of day splits `day_0`.. written instead
            (see the module's docstring).
        drift: with `days`: the fraction of each day's distinct values that are new, in
            [0, 1) (default 0.1).
        keys: "ids" or "raw" (`synthetic_keys` of the same values; meta.json `"keys": "raw"`).

    meta.json gets "oracle_auc" (the hidden model's AUC on val), "oracle_auc_test",
    "base_rate", and "generator" (the arguments and hidden parameters worth knowing); with
    `days`, "day_splits" instead of the oracle AUCs (per day: rows, label rate, oracle AUC,
    oracle AUC with the new values' effects unknown, distinct and new values), and per-day
    key counts ("split_frequency_files"; the frequency file counts every day).

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     meta = generate_synthetic(tmp, rows=2_000, scale=0.001)
        >>> meta["splits"]["val"]["rows"], meta["oracle_auc"] > 0.7
        (200, True)
    """
    if keys not in KEY_MODES:
        raise ValueError(f"keys must be one of {KEY_MODES}, got {keys!r}")
    if days is not None:
        if val_rows is not None or test_rows is not None:
            raise ValueError("val_rows and test_rows have no meaning with days (every day is a split)")
        return _generate_days(out_dir, rows, scale, seed, days, SYNTHETIC_DRIFT if drift is None else drift, keys,
                              chunk_rows, rows_per_shard, progress)
    if drift is not None:
        raise ValueError("drift needs days (--drift needs --days)")
    return _generate_splits(out_dir, rows, scale, seed, val_rows, test_rows, chunk_rows, rows_per_shard, progress,
                            keys)


def _generate_splits(out_dir, rows: int, scale: float, seed: int, val_rows: int | None, test_rows: int | None,
                     chunk_rows: int, rows_per_shard: int, progress: bool, keys: str) -> dict:
    """`generate_synthetic` without days: train, val and test."""
    val_rows, test_rows = _check_rows(rows, seed, val_rows, test_rows, chunk_rows)
    cards = scaled_cardinalities(scale)
    model = HiddenModel(cards, seed)
    features = [SparseFeature(f"sparse_{f}", c) for f, c in enumerate(cards)]
    writer = CTRDatasetWriter(out_dir, NUM_DENSE, features, rows_per_shard=rows_per_shard,
                              source=f"synthetic Criteo-shaped (rows={rows}, scale={scale:g}, seed={seed})"
                                     + (", raw keys" if keys == "raw" else ""), keys=keys)
    oracle: dict[str, float] = {}
    rates: dict[str, float] = {}
    bar = _progress(rows + val_rows + test_rows, progress)
    for split_index, (split, n) in enumerate((("train", rows), ("val", val_rows), ("test", test_rows))):
        rates[split], auc = _write_split(writer, model, split, n, [seed, split_index], chunk_rows, bar,
                                         raw_keys=keys == "raw")
        if auc is not None:
            oracle[split] = auc
    bar.close()
    generator = {"rows": rows, "val_rows": val_rows, "test_rows": test_rows, "scale": scale, "seed": seed,
                 **_hidden_parameters(model)}
    return writer.finish(oracle_auc=oracle.get("val"), oracle_auc_test=oracle.get("test"),
                         base_rate=model.base_rate, label_rate=rates, generator=generator,
                         **_value_meta(features, keys))


def _value_meta(features: list[SparseFeature], keys: str) -> dict:
    """meta.json's word on what a sparse value is: the id itself, or its raw key."""
    if keys == "ids":
        return {"raw_values": identity_values([f.name for f in features])}
    return {"key_rule": f"mix64(((feature index + 1) << {VALUE_BITS}) | value number) as int64 "
                        "(embcache.keys.mix64; data.synthetic.synthetic_keys)",
            "key_kinds": {f.name: "mix64" for f in features}}


def _check_rows(rows: int, seed: int, val_rows: int | None, test_rows: int | None,
                chunk_rows: int) -> tuple[int, int]:
    """Check the row counts and the seed; returns val_rows and test_rows, a tenth of `rows`
    (at least 1) where None."""
    check_whole("rows", rows, 1)
    if not (isinstance(seed, (int, np.integer)) and seed >= 0):
        raise ValueError(f"seed must be a whole number >= 0, got {seed!r}")
    val_rows = max(1, rows // 10) if val_rows is None else val_rows
    test_rows = max(1, rows // 10) if test_rows is None else test_rows
    check_whole("val_rows", val_rows, 0)
    check_whole("test_rows", test_rows, 0)
    check_whole("chunk_rows", chunk_rows, 1)
    return val_rows, test_rows


def _write_split(writer: CTRDatasetWriter, model: HiddenModel, split: str, n: int, seed: list[int],
                 chunk_rows: int, bar, raw_keys: bool = False) -> tuple[float, float | None]:
    """Draw and write `n` rows of `split`, chunk k from the generator seeded `seed + [k]`;
    returns the label rate and, for val and test, the hidden model's AUC (None for train or
    no rows). `raw_keys`: write the ids' `synthetic_keys`."""
    # train needs only the count of positives; val and test keep (prob, label) per row for
    # the oracle AUC, in arrays sized once by the known row count
    scored = split != "train"
    probs = np.empty(n if scored else 0, dtype=np.float64)
    labels = np.empty(n if scored else 0, dtype=np.int8)
    positives = 0
    for chunk, start in enumerate(range(0, n, chunk_rows)):
        size = min(chunk_rows, n - start)
        rng = np.random.default_rng([*seed, chunk])
        dense, ids, prob, _ = model.sample(rng, size)
        label = (rng.random(size) < prob).astype(np.int8)
        if raw_keys:
            writer.write(split, label, dense, [synthetic_keys(f, ids[:, f]) for f in range(ids.shape[1])])
        else:
            writer.write(split, label, dense, [ids[:, f] for f in range(ids.shape[1])])
        positives += int(label.sum())
        if scored:
            probs[start:start + size], labels[start:start + size] = prob, label
        bar.update(size)
    rate = positives / n if n else float("nan")
    return rate, (roc_auc(probs, labels) if scored and n else None)


class DriftingValues:
    """The values of every feature, day after day (see the module's docstring): feeds on the
    distinct ranks each day drew (`next_day`) and says which value each rank stands for.

    State per feature: the values seen so far, most popular first, and the next free value
    number. `rng` draws how many values are new and which ranks get them.
    """

    def __init__(self, model: HiddenModel, drift: float, seed: int):
        self.model, self.drift, self.seed = model, float(drift), seed
        m = len(model.cardinalities)
        self.order: list[np.ndarray] = [np.zeros(0, dtype=np.int64)] * m  # seen values, hottest first
        self.next_value = [int(c) for c in model.cardinalities]  # day 0's values are the ids below c
        self.day = 0
        # today's map: per feature (distinct ranks ascending, their values, whether new today)
        self.ranks: list[np.ndarray] = []
        self.values: list[np.ndarray] = []
        self.new: list[np.ndarray] = []

    def next_day(self, realized: list[np.ndarray]) -> None:
        """Give the day's distinct ranks (ascending, per feature) their values."""
        rng = np.random.default_rng([self.seed, 0xD21F, self.day])
        self.ranks, self.values, self.new = [], [], []
        for f, ranks in enumerate(realized):
            u = len(ranks)
            if self.day == 0:  # every value is new: the ids of the ranks
                values = (ranks * self.model.mult[f] + self.model.shift[f]) % self.model.cardinalities[f]
                new, old = np.ones(u, dtype=bool), 0
            else:
                want = self.drift * u
                k = int(want) + int(rng.random() < want - int(want))  # stochastic rounding: E[k] = drift * u
                k = min(u, max(k, u - len(self.order[f])))  # fewer old values than asked: more new ones
                new = np.zeros(u, dtype=bool)
                new[rng.choice(u, size=k, replace=False)] = True
                old = u - k
                values = np.empty(u, dtype=np.int64)
                values[~new] = self.order[f][:old]  # in rank order: the hottest old value first
                values[new] = self.next_value[f] + rng.permutation(k)
                self.next_value[f] += k
            values = values.astype(np.int64)
            # tomorrow's order: today's values by rank, then the old values not drawn today
            self.order[f] = np.concatenate([values, self.order[f][old:]])
            self.ranks.append(ranks)
            self.values.append(values)
            self.new.append(new)
        if max(self.next_value, default=0) >= 1 << VALUE_BITS:
            raise ValueError(f"more than 2**{VALUE_BITS} values in a feature: fewer days or rows")
        self.day += 1

    def of(self, f: int, ranks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(values, new today) of feature `f`'s ranks drawn today."""
        at = np.searchsorted(self.ranks[f], ranks)
        return self.values[f][at], self.new[f][at]


def _day_rng(seed: int, day: int, chunk: int) -> np.random.Generator:
    return np.random.default_rng([seed, 0xDA7, day, chunk])


def _realized_ranks(model: HiddenModel, seed: int, day: int, rows: int, chunk_rows: int) -> list[np.ndarray]:
    """The distinct ranks each feature draws on `day` (ascending): the chunks' first draws,
    as `_write_day` draws them again."""
    seen = [np.zeros(int(c), dtype=bool) for c in model.cardinalities]
    for chunk, start in enumerate(range(0, rows, chunk_rows)):
        ranks = model.zipf_ranks(_day_rng(seed, day, chunk), min(chunk_rows, rows - start))
        for f, mask in enumerate(seen):
            mask[ranks[:, f]] = True
    return [np.flatnonzero(mask) for mask in seen]


def _generate_days(out_dir, rows: int, scale: float, seed: int, days: int, drift: float, keys: str,
                   chunk_rows: int, rows_per_shard: int, progress: bool) -> dict:
    """`generate_synthetic` with `days`."""
    _check_rows(rows, seed, 0, 0, chunk_rows)
    check_whole("days", days, 1)
    if not (isinstance(drift, (int, float)) and 0.0 <= drift < 1.0):
        raise ValueError(f"drift must be a number in [0, 1), got {drift!r}")
    cards = scaled_cardinalities(scale)
    if max(cards) + days * rows >= 1 << VALUE_BITS:
        raise ValueError(f"rows * days must stay below 2**{VALUE_BITS} values per feature")
    model = HiddenModel(cards, seed)
    names = [f"day_{d}" for d in range(days)]
    if keys == "ids":  # the cardinality counts every value of every day: a first run finds it
        values = DriftingValues(model, drift, seed)
        for day in range(days):
            values.next_day(_realized_ranks(model, seed, day, rows, chunk_rows))
        cards = list(values.next_value)
    features = [SparseFeature(f"sparse_{f}", c) for f, c in enumerate(cards)]
    writer = CTRDatasetWriter(out_dir, NUM_DENSE, features, rows_per_shard=rows_per_shard, keys=keys,
                              source=f"synthetic Criteo-shaped, {days} days (rows per day={rows}, scale={scale:g}, "
                                     f"drift={drift:g}, seed={seed}" + (", raw keys)" if keys == "raw" else ")"),
                              splits=names, counted=names, split_counts=True)
    values = DriftingValues(model, drift, seed)
    bar = _progress(rows * days, progress)
    listed = []
    for day, name in enumerate(names):
        values.next_day(_realized_ranks(model, seed, day, rows, chunk_rows))
        stats = _write_day(writer, model, values, name, rows, seed, day, chunk_rows, bar, keys == "raw")
        writer.end_split(name)
        listed.append({"split": name, "rows": rows, **stats,
                       "distinct_values": int(sum(len(r) for r in values.ranks)),
                       "new_values": int(sum(n.sum() for n in values.new)) if day else 0})
    bar.close()
    generator = {"rows_per_day": rows, "days": days, "drift": drift, "scale": scale, "seed": seed,
                 "scaled_cardinalities": scaled_cardinalities(scale), **_hidden_parameters(model)}
    return writer.finish(day_splits=listed, base_rate=model.base_rate, generator=generator,
                         **_value_meta(features, keys))


def _write_day(writer: CTRDatasetWriter, model: HiddenModel, values: DriftingValues, split: str, n: int, seed: int,
               day: int, chunk_rows: int, bar, raw_keys: bool) -> dict:
    """Draw and write day `day`'s `n` rows (the ranks `_realized_ranks` drew, then the rest);
    returns its label rate and oracle AUCs: the hidden model's; without the effects of the
    values new that day (the best a model knowing every earlier day can do); with the effects
    of day 0's values only (the best a vocabulary fixed on day 0 allows)."""
    probs, known, first, labels = (np.empty(n, dtype=np.float64) for _ in range(4))
    for chunk, start in enumerate(range(0, n, chunk_rows)):
        size = min(chunk_rows, n - start)
        rng = _day_rng(seed, day, chunk)
        ranks = model.zipf_ranks(rng, size)
        columns, new = [], []
        for f in range(ranks.shape[1]):
            v, is_new = values.of(f, ranks[:, f])
            columns.append(v)
            new.append(is_new)
        dense, logit = model.dense_part(rng, size)
        without_new, day0_only = logit.copy(), logit.copy()
        for f in model.informative:
            effect = model.effects(f, columns[f])
            logit += effect
            without_new += np.where(new[f], 0.0, effect)
            day0_only += np.where(columns[f] < model.cardinalities[f], effect, 0.0)  # day 0's values are the ids < c
        prob = 1.0 / (1.0 + np.exp(-(logit + model.bias)))
        label = (rng.random(size) < prob).astype(np.int8)
        sparse = [synthetic_keys(f, c) for f, c in enumerate(columns)] if raw_keys else columns
        writer.write(split, label, dense.astype(np.float32), sparse)
        probs[start:start + size], labels[start:start + size] = prob, label
        known[start:start + size], first[start:start + size] = without_new, day0_only
        bar.update(size)
    return {"label_rate": float(labels.mean()), "oracle_auc": roc_auc(probs, labels),
            "oracle_auc_new_unknown": roc_auc(known, labels) if day else None,
            "oracle_auc_day0_values_only": roc_auc(first, labels) if day else None}


def _hidden_parameters(model: HiddenModel) -> dict:
    """The hidden parameters meta.json's "generator" records."""
    return {"zipf_exponents": [round(float(s), 4) for s in model.zipf],
            "informative_features": [f"sparse_{f}" for f in model.informative],
            "effect_std": model.effect_std, "dense_weights": [round(float(w), 4) for w in model.dense_weight]}


def _progress(total: int, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, unit="row", unit_scale=True, desc="synthetic", disable=not enabled)
