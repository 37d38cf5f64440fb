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
    """Model and loss settings. The defaults are tuned on MovieLens-100k (20 epochs of HEAT
    reach Recall@20 ~0.30 there); the published SimpleX settings (d=64, per-dataset margin,
    negative weight and negatives) are in datasets/<name>/README.md.

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

    @classmethod
    def from_file(cls, path: str | Path, num_items: int, train_indptr: np.ndarray,
                  train_indices: np.ndarray, config: "CFConfig | None" = None) -> "CFParams":
        """Parameters saved by `save`, with the histories drawn again from the training data
        (they depend only on the data, H and the seed, so they are the ones training used).
        `config` replaces the saved settings (its model and dim must agree with the file)."""
        U, I, W, saved = load(path)
        config = config or saved
        if (config.dim, config.model) != (saved.dim, saved.model):
            raise ValueError(f"{path}: holds a {saved.model} model of dim {saved.dim}, "
                             f"not {config.model} of dim {config.dim}")
        if (len(U), len(I)) != (len(train_indptr) - 1, num_items):
            raise ValueError(f"{path}: has {len(U)} users and {len(I)} items, the data "
                             f"{len(train_indptr) - 1} and {num_items}")
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


FORMATS = (".npy", ".npz", ".parquet")


def save(params: CFParams, path: str | Path) -> Path:
    """Write the embeddings: `.npy` (rows U, then I, then W, with the layout and config in
    `<path>.json`), `.npz` (arrays U, I, W and the same metadata as a JSON string, one file)
    or `.parquet` (columns kind, id, vector; the metadata in the schema)."""
    path = Path(path)
    meta = {"config": asdict(params.config), "num_users": len(params.U),
            "num_items": len(params.I), "dim": params.U.shape[1]}
    if path.suffix not in FORMATS:
        raise ValueError(f"{path}: embeddings are saved as {', '.join(FORMATS)}")
    path.parent.mkdir(parents=True, exist_ok=True)
    stacked = np.concatenate([params.U, params.I, params.W])
    if path.suffix == ".npy":
        np.save(path, stacked)
        Path(str(path) + ".json").write_text(json.dumps(meta, indent=2) + "\n")
    elif path.suffix == ".npz":
        np.savez(path, U=params.U, I=params.I, W=params.W, meta=np.array(json.dumps(meta)))
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
    return path


def load(path: str | Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, CFConfig]:
    """Read what `save` wrote: (U, I, W, config)."""
    path = Path(path)
    if path.suffix not in FORMATS:
        raise ValueError(f"{path}: embeddings are loaded from {', '.join(FORMATS)}")
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such embeddings file")
    if path.suffix == ".npy":
        meta_path = Path(str(path) + ".json")
        if not meta_path.exists():
            raise FileNotFoundError(f"{meta_path}: the layout of {path.name} is missing")
    try:
        if path.suffix == ".npy":
            meta = json.loads(meta_path.read_text())
            stacked = np.load(path)
        elif path.suffix == ".npz":
            with np.load(path) as z:
                meta = json.loads(str(z["meta"]))
                stacked = np.concatenate([z["U"], z["I"], z["W"]])
        else:
            import pyarrow.parquet as pq

            table = pq.read_table(path)
            meta = json.loads(table.schema.metadata[b"embcache_cf"])
            col = table.column("vector").combine_chunks()
            stacked = col.values.to_numpy().reshape(len(table), meta["dim"])
        nu, ni = meta["num_users"], meta["num_items"]
        stacked = np.ascontiguousarray(stacked, dtype=np.float32)
        config = CFConfig(**meta["config"])
    except Exception as err:  # numpy, zipfile, pyarrow and json each raise their own types
        raise ValueError(f"{path}: not a readable embeddings file ({type(err).__name__}: {err})") from None
    if len(stacked) != nu + ni + meta["dim"]:
        raise ValueError(f"{path}: {len(stacked)} rows, expected {nu} users + {ni} items + {meta['dim']} of W")
    bad = np.flatnonzero(~np.isfinite(stacked).all(axis=1))
    if len(bad):
        row = int(bad[0])
        where = (f"user {row}" if row < nu else f"item {row - nu}" if row < nu + ni else f"W row {row - nu - ni}")
        raise ValueError(f"{path}: {len(bad)} row(s) hold NaN or infinity (first: {where})")
    return stacked[:nu].copy(), stacked[nu:nu + ni].copy(), stacked[nu + ni:].copy(), config
