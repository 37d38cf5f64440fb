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
"""
from __future__ import annotations

import math
import os

import numpy as np

from embcache.errors import check_whole
from embcache.data.ctr_format import CTRDatasetWriter, SparseFeature
from embcache.data.defaults import SYNTHETIC_ROWS, SYNTHETIC_SCALE
from embcache.data.delimited import splitmix64
from embcache.data.raw_values import identity_values

CRITEO_KAGGLE_CARDINALITIES = (1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683,
                               8351593, 3194, 27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18,
                               15, 286181, 105, 142572)
NUM_DENSE = 13
ZIPF_RANGE = (1.05, 1.4)


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
        ids = (ranks * self.mult + self.shift) % self.cardinalities
        raw = np.floor(np.exp(rng.normal(self.dense_mu, self.dense_sigma, (n, NUM_DENSE)))) - 1.0
        raw[rng.random((n, NUM_DENSE)) < self.dense_missing] = 0.0  # missing -> 0, as converters do
        dense = np.log1p(np.maximum(raw, 0.0))
        mean, std = self._dense_stats()
        logit = ((dense - mean) / std) @ self.dense_weight
        for f in self.informative:
            logit += self.effects(f, ids[:, f])
        logit += self.bias if bias is None else bias
        return dense.astype(np.float32), ids, 1.0 / (1.0 + np.exp(-logit)), logit

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


def generate_synthetic(out_dir: str | os.PathLike, rows: int = SYNTHETIC_ROWS, scale: float = SYNTHETIC_SCALE,
                       seed: int = 0,
                       val_rows: int | None = None, test_rows: int | None = None,
                       chunk_rows: int = 65_536, rows_per_shard: int = 1_000_000,
                       progress: bool = False) -> dict:
    """Write a Criteo-shaped synthetic data set in the canonical format; returns its meta.

    Args:
        out_dir: target directory (old shards there are replaced).
        rows: training rows; `val_rows` / `test_rows` default to a tenth of it each.
        scale: multiplies Criteo Kaggle's cardinalities (0.1: 3.4 M embedding rows in all).
        seed: everything is a function of it.
        chunk_rows: rows generated at a time (memory ~ chunk_rows * 40 * 8 bytes).

    meta.json gets "oracle_auc" (the hidden model's AUC on val), "oracle_auc_test",
    "base_rate", and "generator" (the arguments and hidden parameters worth knowing).

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     meta = generate_synthetic(tmp, rows=2_000, scale=0.001)
        >>> meta["splits"]["val"]["rows"], meta["oracle_auc"] > 0.7
        (200, True)
    """
    val_rows, test_rows = _check_rows(rows, seed, val_rows, test_rows, chunk_rows)
    cards = scaled_cardinalities(scale)
    model = HiddenModel(cards, seed)
    features = [SparseFeature(f"sparse_{f}", c) for f, c in enumerate(cards)]
    writer = CTRDatasetWriter(out_dir, NUM_DENSE, features, rows_per_shard=rows_per_shard,
                              source=f"synthetic Criteo-shaped (rows={rows}, scale={scale:g}, seed={seed})")
    oracle: dict[str, float] = {}
    rates: dict[str, float] = {}
    bar = _progress(rows + val_rows + test_rows, progress)
    for split_index, (split, n) in enumerate((("train", rows), ("val", val_rows), ("test", test_rows))):
        rates[split], auc = _write_split(writer, model, split, n, [seed, split_index], chunk_rows, bar)
        if auc is not None:
            oracle[split] = auc
    bar.close()
    generator = {"rows": rows, "val_rows": val_rows, "test_rows": test_rows, "scale": scale, "seed": seed,
                 **_hidden_parameters(model)}
    return writer.finish(oracle_auc=oracle.get("val"), oracle_auc_test=oracle.get("test"),
                         base_rate=model.base_rate, label_rate=rates, generator=generator,
                         raw_values=identity_values([f.name for f in features]))


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
                 chunk_rows: int, bar) -> tuple[float, float | None]:
    """Draw and write `n` rows of `split`, chunk k from the generator seeded `seed + [k]`;
    returns the label rate and, for val and test, the hidden model's AUC (None for train or
    no rows)."""
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
        writer.write(split, label, dense, [ids[:, f] for f in range(ids.shape[1])])
        positives += int(label.sum())
        if scored:
            probs[start:start + size], labels[start:start + size] = prob, label
        bar.update(size)
    rate = positives / n if n else float("nan")
    return rate, (roc_auc(probs, labels) if scored and n else None)


def _hidden_parameters(model: HiddenModel) -> dict:
    """The hidden parameters meta.json's "generator" records."""
    return {"zipf_exponents": [round(float(s), 4) for s in model.zipf],
            "informative_features": [f"sparse_{f}" for f in model.informative],
            "effect_std": model.effect_std, "dense_weights": [round(float(w), 4) for w in model.dense_weight]}


def _progress(total: int, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, unit="row", unit_scale=True, desc="synthetic", disable=not enabled)
