"""Id traces shaped like Criteo Kaggle, for cache benchmarks: 26 features with the
Kaggle cardinalities (times a scale), Zipf-skewed ids per feature with hot ids scattered
over the table, concatenated into one id space as a shared cache sees them."""
from __future__ import annotations

import numpy as np
import torch

# The trace and the synthetic training data share the 26 Kaggle cardinalities.
from embcache.data.synthetic import CRITEO_KAGGLE_CARDINALITIES, scaled_cardinalities  # noqa: F401

# ids per sample of each of the 26 features in MLPerf DLRM-DCNv2's multi-hot Criteo data (214 a sample)
MULTI_HOT_SIZES = [3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1]


def bounded_zipf(rng: np.random.Generator, n: int, s: float, size: int) -> np.ndarray:
    """Ranks in [0, n) with P(rank k) ~ (k + 1)^-s, by inverting the continuous CDF."""
    u = rng.random(size)
    if abs(s - 1.0) < 1e-9:
        k = np.exp(u * np.log(n + 1.0))
    else:
        a = 1.0 - s
        k = (u * ((n + 1.0) ** a - 1.0) + 1.0) ** (1.0 / a)
    return np.minimum(k.astype(np.int64) - 1, n - 1).clip(0)


class CriteoTrace:
    """`batches` batches of `batch_size` samples x 26 features, ids in one space.

    Each feature gets its own exponent (seeded, in [s_min, s_max]) and a bijective
    scramble of ranks (multiplication by a large prime modulo the cardinality), so hot
    ids are spread over the table instead of sitting at 0..k.

    `day_batches` > 0 makes the hot set drift, as real click logs do from day to day:
    every `day_batches` batches the popularity ranks of each feature rotate by
    `day_shift` of its cardinality, so the ids that were at rank `shift` yesterday are the
    hottest today and yesterday's hottest fall to the tail.
    """

    def __init__(self, scale: float = 1.0, batch_size: int = 4096, batches: int = 100,
                 seed: int = 0, s_min: float = 1.05, s_max: float = 1.25, day_batches: int = 0,
                 day_shift: float = 0.001):
        rng = np.random.default_rng(seed)
        self.cardinalities = scaled_cardinalities(scale)
        self.offsets = np.concatenate([[0], np.cumsum(self.cardinalities)[:-1]])
        self.num_rows = int(sum(self.cardinalities))
        self.exponents = rng.uniform(s_min, s_max, len(self.cardinalities))
        self.batch_size, self.num_batches = batch_size, batches
        self._seed = seed
        self.day_batches = int(day_batches)
        self.shifts = [max(1, int(day_shift * n)) for n in self.cardinalities]

    def batch(self, i: int) -> torch.Tensor:
        """Batch `i` as a `[batch_size, 26]` tensor of ids in the concatenated space."""
        rng = np.random.default_rng((self._seed, i))
        day = i // self.day_batches if self.day_batches else 0
        cols = []
        for n, s, off, shift in zip(self.cardinalities, self.exponents, self.offsets, self.shifts):
            ranks = bounded_zipf(rng, n, s, self.batch_size)
            if day:
                ranks = (ranks + day * shift) % n
            cols.append((ranks * 2_147_483_647) % n + off)
        return torch.from_numpy(np.stack(cols, axis=1))

    def pooled_batch(self, i: int, sizes: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Batch `i` with `sizes[f]` ids a sample in feature f, as (ids, offsets) of one bag
        a (sample, feature), sample-major: bag `b * 26 + f` holds sample b's ids of feature f,
        so a bag's pooled output views as `[batch_size, 26, D]`. Each feature's ids follow
        its own Zipf law and scramble, as in `batch`."""
        rng = np.random.default_rng((self._seed, i, len(sizes)))
        b = self.batch_size
        cols = [((bounded_zipf(rng, n, s, b * k) * 2_147_483_647) % n + off).reshape(b, k)
                for n, s, off, k in zip(self.cardinalities, self.exponents, self.offsets, sizes)]
        ids = torch.from_numpy(np.concatenate(cols, axis=1).reshape(-1))
        lengths = torch.tensor(sizes, dtype=torch.int64).repeat(b)
        offsets = torch.zeros_like(lengths)
        offsets[1:] = lengths.cumsum(0)[:-1]
        return ids, offsets

    def __iter__(self):
        return (self.batch(i) for i in range(self.num_batches))

    def frequencies(self) -> torch.Tensor:
        """Per-id counts over the whole trace (the `ids_freq` a user would compute)."""
        counts = torch.zeros(self.num_rows, dtype=torch.int64)
        for b in self:
            counts += torch.bincount(b.flatten(), minlength=self.num_rows)
        return counts
