"""The CF model both engines train: its settings (`CFConfig`) and its parameters
(`CFParams`: user rows, item rows, SimpleX's W and the fixed user histories). Plain numpy so
that the numba kernels and torch share the same memory; saving and loading them to a file
is `embcache.cf.data.embeddings_file`'s job."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

MODELS = ("simplex", "mf-ccl")
# where negatives come from: items outside the user's training items, or any item (the rule
# before issue 23, kept for comparison)
NEGATIVE_RULES = ("unseen", "all")


@dataclass(frozen=True)
class CFConfig:
    """Model and loss settings. The defaults are tuned on MovieLens-100k (20 epochs of HEAT
    reach Recall@20 ~0.30 there); the published SimpleX settings (d=64, per-dataset margin,
    negative weight and negatives) are in datasets/<name>/README.md.

    Args:
        model: "simplex" (user side gamma*u + (1-gamma)*W*mean(history)) or "mf-ccl" (u).
        dim: embedding dimension.
        negatives: K uniformly sampled negatives per (user, positive) pair.
        negatives_from: "unseen" (the default): the negatives are drawn from the items the
            user has no training pair with, so that a user's own positives are never pushed
            away (on MovieLens-100k this is what separated HEAT's Recall@20 from the best
            published-style SimpleX); "all": from every item, the rule before.
        margin: m in max(0, cos(z, n) - m).
        neg_weight: w, the weight of the mean negative term.
        gamma: SimpleX's weight of the user row against the aggregated history.
        history: H, the most history items per user (sampled once, `seed`).
        init_std: standard deviation of the normal initial rows.
        seed: seeds the initial parameters, the histories, the shuffles and the negatives.
    """

    model: str = "simplex"
    dim: int = 64
    negatives: int = 64
    negatives_from: str = "unseen"
    margin: float = 0.5
    neg_weight: float = 10.0
    gamma: float = 0.5
    history: int = 20
    init_std: float = 0.1
    seed: int = 0

    def __post_init__(self):
        if self.model not in MODELS:
            raise ValueError(f"model must be one of {MODELS}, not {self.model!r}")
        for name in ("dim", "negatives"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.negatives_from not in NEGATIVE_RULES:
            raise ValueError(f"negatives_from must be one of {NEGATIVE_RULES}, not {self.negatives_from!r}")
        if self.history < 0:
            raise ValueError("history must be >= 0")

    @property
    def simplex(self) -> bool:
        return self.model == "simplex"


@dataclass
class CFParams:
    """Parameters: U [users, d], I [items, d], W [d, d] (identity for MF-CCL, unused), and
    the fixed histories hist [users, H] (padded with 0) with lengths hist_len [users]."""

    U: np.ndarray
    I: np.ndarray
    W: np.ndarray
    hist: np.ndarray
    hist_len: np.ndarray
    config: CFConfig = field(default_factory=CFConfig)

    @classmethod
    def init(cls, config: CFConfig, num_users: int, num_items: int, train_indptr: np.ndarray,
             train_indices: np.ndarray) -> "CFParams":
        """Seeded normal rows, W = identity (SimpleX starts as the plain history mean), and up
        to H history items per user drawn once from its training items."""
        rng = np.random.default_rng(config.seed)
        d = config.dim
        U = (rng.standard_normal((num_users, d)) * config.init_std).astype(np.float32)
        I = (rng.standard_normal((num_items, d)) * config.init_std).astype(np.float32)
        W = np.eye(d, dtype=np.float32)
        return cls(U, I, W, *histories(config, train_indptr, train_indices), config)

    def copy(self) -> "CFParams":
        return CFParams(self.U.copy(), self.I.copy(), self.W.copy(), self.hist, self.hist_len,
                        self.config)


def histories(config: CFConfig, indptr: np.ndarray, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The fixed SimpleX histories: a stream of their own (seed, 1), independent of the
    initial rows, so that a loaded model gets back exactly the histories it was trained with."""
    return sample_histories(indptr, indices, config.history, np.random.default_rng([config.seed, 1]))


def sample_histories(indptr: np.ndarray, indices: np.ndarray, H: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """Up to H of each user's training items, without replacement (all of them if fewer)."""
    n = len(indptr) - 1
    hist = np.zeros((n, max(H, 1)), dtype=np.int64)
    lens = np.minimum(np.diff(indptr), H).astype(np.int64)
    for u in range(n):
        items = indices[indptr[u]:indptr[u + 1]]
        if len(items) > H:
            items = rng.choice(items, size=H, replace=False)
        hist[u, :len(items)] = items
    return hist, lens
