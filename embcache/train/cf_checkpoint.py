"""Checkpoints of `embcache cf train`, written atomically after every epoch, so that a
killed run loses at most the epoch it was in. A checkpoint holds the parameters, the
engine's own state (HEAT: each thread's random stream and tile; torch: Adam's moments and
the sampler), the epochs done and their records; the SimpleX histories are not stored,
they are drawn again from the seed and the training data. It also records which data and
settings it belongs to, and a resume with other ones is refused with one line."""
from __future__ import annotations

import zlib
from dataclasses import asdict
from pathlib import Path

import numpy as np

from embcache.checkpoint import CheckpointError, load_checkpoint, save_checkpoint

KIND = "cf"
FILE_NAME = "cf-last.pt"


def data_fingerprint(data) -> dict:
    """Sizes and a CRC of the train/test split: a resume on other data must not pass."""
    crc = 0
    for a in (data.train_indptr, data.train_indices, data.test_indptr, data.test_indices):
        crc = zlib.crc32(np.ascontiguousarray(a, dtype=np.int64).tobytes(), crc)
    return {"users": data.num_users, "items": data.num_items, "train": data.num_train,
            "test": data.num_test, "crc32": crc}


def save(directory: str | Path, params, engine, engine_name: str, options: dict, data,
         epochs_done: int, records: list[dict]) -> Path:
    payload = {"config": asdict(params.config), "engine": engine_name, "options": options,
               "data": data_fingerprint(data), "epochs_done": epochs_done, "records": records,
               "U": params.U, "I": params.I, "W": params.W, "engine_state": engine.state_dict()}
    return save_checkpoint(payload, Path(directory) / FILE_NAME, kind=KIND)


def load(directory: str | Path) -> dict:
    path = Path(directory) / FILE_NAME
    if not path.is_file():
        raise CheckpointError(f"{directory}: no cf checkpoint ({FILE_NAME}) to resume from")
    ck = load_checkpoint(path, kind=KIND)
    ck["path"] = path
    return ck


def restore(ck: dict, params, engine, engine_name: str, options: dict, data) -> None:
    """Put the checkpoint's parameters and engine state in place, after checking that it
    was written for the same data, model settings, engine and options."""
    path = ck["path"]
    if ck["data"] != data_fingerprint(data):
        raise CheckpointError(f"{path}: written for other data ({ck['data']['users']} users, "
                              f"{ck['data']['items']} items, {ck['data']['train']} training pairs)")
    if ck["config"] != asdict(params.config):
        diff = sorted(k for k in ck["config"] if ck["config"][k] != asdict(params.config).get(k))
        raise CheckpointError(f"{path}: written with other model settings ({', '.join(diff)}); "
                              f"leave them out to use the checkpoint's")
    if ck["engine"] != engine_name:
        raise CheckpointError(f"{path}: written by --engine {ck['engine']}, not {engine_name}")
    if ck["options"] != options:
        diff = sorted(k for k in ck["options"] if ck["options"][k] != options.get(k))
        raise CheckpointError(f"{path}: written with other engine options ({', '.join(diff)})")
    for name in ("U", "I", "W"):
        saved, live = ck[name], getattr(params, name)
        if saved.shape != live.shape or saved.dtype != live.dtype:
            raise CheckpointError(f"{path}: {name} has shape {saved.shape}, expected {live.shape}")
        live[...] = saved
    try:
        engine.load_state_dict(ck["engine_state"])
    except (ValueError, KeyError) as err:
        raise CheckpointError(f"{path}: {err}") from None
