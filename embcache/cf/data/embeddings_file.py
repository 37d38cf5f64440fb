"""Trained CF embeddings on disk: `save` writes a model's U, I and W with its settings (.npy
with a .json beside it, .npz or .parquet), `load` reads them back, and `load_params` makes a
`CFParams` of them for the data they were trained on.

Example:
    >>> import tempfile
    >>> import numpy as np
    >>> from cpu_kernels.model import CFConfig, CFParams
    >>> indptr, indices = np.array([0, 2, 3]), np.array([0, 2, 1])
    >>> params = CFParams.init(CFConfig(dim=4), 2, 3, indptr, indices)
    >>> with tempfile.TemporaryDirectory() as d:
    ...     back = load_params(save(params, d + "/cf.npz"), 3, indptr, indices)
    >>> bool((back.U == params.U).all() and (back.hist == params.hist).all())
    True
"""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np

from cpu_kernels.model import CFConfig, CFParams, histories
from embcache.integrity import ChecksumError, array_crc32, open_verified, save_npz

FORMATS = (".npy", ".npz", ".parquet")


def save(params: CFParams, path: str | Path, trained_on: dict | None = None, ids=(None, None)) -> Path:
    """Write the embeddings: `.npy` (rows U, then I, then W, with the layout and config in
    `<path>.json`), `.npz` (arrays U, I, W and the same metadata as a JSON string, one file)
    or `.parquet` (columns kind, id (the row), your_id, vector; the metadata in the schema).
    `trained_on`, the data and split they were trained on, goes with the metadata
    (`embcache.cf.trained_on`); `ids`, (user ids, item ids) of the data (`user_ids[u]` is row
    u's id in your file; None where the rows are the ids), fill `your_id`: without it a row
    said `id 0` for the user your file calls `u0`."""
    path = Path(path)
    stacked = np.ascontiguousarray(np.concatenate([params.U, params.I, params.W]), dtype=np.float32)
    # the rows' CRC-32 goes with them (the .json, the npz's meta, the Parquet schema): `load` checks it
    meta = {"config": asdict(params.config), "num_users": len(params.U),
            "num_items": len(params.I), "dim": params.U.shape[1], "crc32": array_crc32(stacked)}
    if trained_on is not None:
        meta["trained_on"] = trained_on
    if path.suffix not in FORMATS:
        raise ValueError(f"{path}: embeddings are saved as {', '.join(FORMATS)}")
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".npy":
        np.save(path, stacked)
        Path(str(path) + ".json").write_text(json.dumps(meta, indent=2) + "\n")
    elif path.suffix == ".npz":
        save_npz(path, {"U": params.U, "I": params.I, "W": params.W, "meta": np.array(json.dumps(meta))})
    elif path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        kinds = (["user"] * len(params.U) + ["item"] * len(params.I) + ["W"] * len(params.W))
        rows = np.concatenate([np.arange(len(params.U)), np.arange(len(params.I)), np.arange(len(params.W))])
        d = stacked.shape[1]
        vec = pa.FixedSizeListArray.from_arrays(pa.array(stacked.reshape(-1)), d)
        yours = [_as_text(ids[0], len(params.U)), _as_text(ids[1], len(params.I)), [None] * len(params.W)]
        table = pa.table({"kind": kinds, "id": rows, "your_id": pa.array(sum(yours, []), pa.string()),
                          "vector": vec})
        table = table.replace_schema_metadata({"embcache_cf": json.dumps(meta)})
        pq.write_table(table, path)
    return path


def _as_text(ids, n: int) -> list[str]:
    """Your data's ids as text (a row's number where the rows are the ids)."""
    return [str(v) for v in (range(n) if ids is None else ids.tolist())]


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
            stacked = np.load(path, allow_pickle=False)
        elif path.suffix == ".npz":
            with open_verified(path, "embeddings file") as f, np.load(f, allow_pickle=False) as z:
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
    except ChecksumError:
        raise
    except Exception as err:  # numpy, zipfile, pyarrow and json each raise their own types
        raise ValueError(f"{path}: not a readable embeddings file ({type(err).__name__}: {err})") from None
    if "crc32" in meta and array_crc32(stacked) != meta["crc32"]:
        raise ChecksumError(f"{path}: corrupt embeddings file: the rows' CRC-32 is {array_crc32(stacked):08x}, "
                            f"written with {meta['crc32']:08x}; not used")
    if len(stacked) != nu + ni + meta["dim"]:
        raise ValueError(f"{path}: {len(stacked)} rows, expected {nu} users + {ni} items + {meta['dim']} of W")
    if stacked.shape[1:] != (meta["dim"],) or config.dim != meta["dim"]:  # else a traceback deep in the kernels
        raise ValueError(f"{path}: rows of {stacked.shape[1:]} floats, its settings say dim {config.dim} and "
                         f"{meta['dim']}; not used")
    bad = np.flatnonzero(~np.isfinite(stacked).all(axis=1))
    if len(bad):
        row = int(bad[0])
        where = (f"user {row}" if row < nu else f"item {row - nu}" if row < nu + ni else f"W row {row - nu - ni}")
        raise ValueError(f"{path}: {len(bad)} row(s) hold NaN or infinity (first: {where})")
    return stacked[:nu].copy(), stacked[nu:nu + ni].copy(), stacked[nu + ni:].copy(), config


def load_params(path: str | Path, num_items: int, train_indptr: np.ndarray, train_indices: np.ndarray,
                config: CFConfig | None = None) -> CFParams:
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
    return CFParams(U, I, W, *histories(config, train_indptr, train_indices), config)
