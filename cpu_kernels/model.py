"""The CF model both engines train: its settings (`CFConfig`) and its parameters
(`CFParams`: user rows, item rows, SimpleX's W and the fixed user histories), plus saving
and loading them. Plain numpy so that the numba kernels and torch share the same memory."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

MODELS = ("simplex", "mf-ccl")


@dataclass(frozen=True)
class CFConfig:
    """Model and loss settings (defaults: SimpleX's published d=64 setting; margin, negative
    weight and negatives are per dataset, see datasets/<name>/README.md).

    Args:
        model: "simplex" (user side gamma*u + (1-gamma)*W*mean(history)) or "mf-ccl" (u).
        dim: embedding dimension.
        negatives: K uniformly sampled negatives per (user, positive) pair.
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
    margin: float = 0.9
    neg_weight: float = 150.0
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
        hist, hist_len = sample_histories(train_indptr, train_indices, config.history, rng)
        return cls(U, I, W, hist, hist_len, config)

    def copy(self) -> "CFParams":
        return CFParams(self.U.copy(), self.I.copy(), self.W.copy(), self.hist, self.hist_len,
                        self.config)


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


def save(params: CFParams, path: str | Path) -> Path:
    """Write the embeddings: `.npy` (rows U, then I, then W, with the layout and config in
    `<path>.json`) or `.parquet` (columns kind, id, vector; config in the schema metadata)."""
    path = Path(path)
    meta = {"config": asdict(params.config), "num_users": len(params.U),
            "num_items": len(params.I), "dim": params.U.shape[1]}
    stacked = np.concatenate([params.U, params.I, params.W])
    if path.suffix == ".npy":
        np.save(path, stacked)
        Path(str(path) + ".json").write_text(json.dumps(meta, indent=2) + "\n")
    elif path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        kinds = (["user"] * len(params.U) + ["item"] * len(params.I) + ["W"] * len(params.W))
        ids = np.concatenate([np.arange(len(params.U)), np.arange(len(params.I)),
                              np.arange(len(params.W))])
        d = stacked.shape[1]
        vec = pa.FixedSizeListArray.from_arrays(pa.array(stacked.reshape(-1)), d)
        table = pa.table({"kind": kinds, "id": ids, "vector": vec})
        table = table.replace_schema_metadata({"embcache_cf": json.dumps(meta)})
        pq.write_table(table, path)
    else:
        raise ValueError(f"{path}: embeddings are saved as .npy or .parquet")
    return path


def load(path: str | Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, CFConfig]:
    """Read what `save` wrote: (U, I, W, config)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such embeddings file")
    if path.suffix == ".npy":
        meta_path = Path(str(path) + ".json")
        if not meta_path.exists():
            raise FileNotFoundError(f"{meta_path}: the layout of {path.name} is missing")
        meta = json.loads(meta_path.read_text())
        stacked = np.load(path)
    elif path.suffix == ".parquet":
        import pyarrow.parquet as pq

        table = pq.read_table(path)
        meta = json.loads(table.schema.metadata[b"embcache_cf"])
        col = table.column("vector").combine_chunks()
        stacked = col.values.to_numpy().reshape(len(table), meta["dim"])
    else:
        raise ValueError(f"{path}: embeddings are loaded from .npy or .parquet")
    nu, ni = meta["num_users"], meta["num_items"]
    stacked = np.ascontiguousarray(stacked, dtype=np.float32)
    return (stacked[:nu].copy(), stacked[nu:nu + ni].copy(), stacked[nu + ni:].copy(),
            CFConfig(**meta["config"]))
