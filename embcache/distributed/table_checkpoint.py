"""One logical checkpoint of a sharded sparse part, readable at any world size.

Layout under the checkpoint directory (`kind` = "dlrm"):

    dlrm-last.pt                  the run (config, position, dense part) + a manifest
    dlrm-tables-<step>/           one version of the tables
        <table>.<start>-<stop>/     rows [start, stop) of a table and their optimizer
                                    state, in id order (written by the rows' owner) as
                                    raw files with their CRC-32 (`cache.table_files`)
        <table>.keys<r>of<n>/       an open table split by key hash: shard r's keys, their
                                    rows, optimizer state and usage
        cache.rank<r>.pt            rank r's cache residency and statistics

The rows are copied from the host store chunk by chunk and read back through a mapping,
so a table larger than memory (`--host-store mmap:DIR`) is checkpointed and resumed
without holding it in memory. Parts of earlier versions (`<table>.<start>-<stop>.pt`,
one torch file each) still load.

Every rank writes its own shards into the step's directory; once all have (a barrier),
rank 0 replaces `dlrm-last.pt`, whose manifest names that directory, and only then removes
older versions. The replace is the commit: a run killed at any moment leaves the previous
`dlrm-last.pt` and the directory it names intact.

A resume on M ranks reads, for each shard it owns, the rows of the saved parts that
overlap it, whatever the saving world size: the parameters continue exactly. An open table (raw keys,
`cache.open_table`) is saved as it is placed: whole, or one part a key-hash shard
(`"key_hash": n` in the manifest), each part its keys' rows with the keys, their usage and
what its index needs (`open.*`), the manifest marking it `"open": true`. Read back by the
shard that saved it, a part puts every key back in its row; read by another placement
(another world size, or whole <-> split), the table's parts are merged and each shard
takes the keys it owns now (`placement.key_owner`), in new rows, values, optimizer state
and usage unchanged (the table's counts of keys made and retired go to its shard on the
lowest rank, so their sums carry over). Residency is
restored only when the world size and placement are the saved ones (then the run continues
bit for bit, cache statistics included); otherwise the caches start empty and the summed
statistics carry over on rank 0.
"""
from __future__ import annotations

import os
import shutil
from dataclasses import asdict, fields
from pathlib import Path

import torch

from embcache.cache.stores import table_files as tf
from embcache.cache.stats import CacheStats
from embcache.errors import CheckpointError, DataFormatError
from embcache.integrity import load_torch, save_torch

from .placement import Shard
from .world import all_sum, barrier, current

MANIFEST_VERSION = 1


def tables_dir_name(kind: str, step: int) -> str:
    return f"{kind}-tables-{step:09d}"


def _save(obj, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    save_torch(obj, tmp)  # sealed with its CRC-32, fsynced
    os.replace(tmp, path)


def write_tables(checkpoint_dir: str | os.PathLike, kind: str, step: int, sharded) -> dict:
    """Collective: every rank writes its shards' rows and its cache state; returns the
    manifest (the same on every rank) once all files are written."""
    world = current()
    name = tables_dir_name(kind, step)
    directory = Path(checkpoint_dir) / name
    directory.mkdir(parents=True, exist_ok=True)
    sharded.finish_prefetch_exchange()  # a prefetch half done is finished first: the caches' state is whole
    local = sharded.local
    for shard in sharded.shards:
        if shard.rank == world.rank:
            part = directory / _part_file(shard)
            shutil.rmtree(part, ignore_errors=True)  # a part left by an attempt killed at this step
            part.mkdir()
            tf.save_tensors(part, local.table_rows(shard.name))  # views of the store, copied chunk by chunk
    if local is not None:
        _save(local.residency_state(), directory / f"cache.rank{world.rank}.pt")
    counts = {k: v for k, v in sharded.cache_stats().items() if k != "hit_rate"} or _zero_stats()
    summed = all_sum({**{f"stats.{k}": v for k, v in counts.items()},
                      "steps": local.optimizer_steps() if local is not None else 0, "owners": int(local is not None)})
    totals = {k[len("stats."):]: v for k, v in summed.items() if k.startswith("stats.")}
    steps, owners = summed["steps"], summed["owners"]
    barrier()  # every part is on disk before rank 0 commits the manifest
    return {"version": MANIFEST_VERSION, "dir": name, "world_size": world.size,
            "optimizer_steps": steps // max(owners, 1), "stats": totals,
            "placement": _placement(sharded.shards),
            "tables": {t.name: {"rows": t.num_embeddings, "dim": t.embedding_dim,
                                **({"open": True} if t.name in getattr(sharded, "open_tables", ()) else {}),
                                **_split_by_key(sharded.shards, t.name),
                                "parts": [[s.row_start, s.row_stop, _part_file(s)] for s in sharded.shards
                                          if s.table == t.name]}
                       for t in sharded.embedding_bag_configs()}}


def _placement(shards: list[Shard]) -> list[dict]:
    """The shards as the manifest records them (a row-wise shard's as before key-hash
    shards existed, so that older checkpoints' placements compare equal)."""
    return [asdict(s) if s.by_key else {k: v for k, v in asdict(s).items() if k not in ("kind", "parts")}
            for s in shards]


def _split_by_key(shards: list[Shard], table: str) -> dict:
    mine = [s for s in shards if s.table == table and s.by_key]
    return {"key_hash": mine[0].parts} if mine else {}


def _part_file(shard: Shard) -> str:
    if shard.by_key:
        return f"{shard.table}.keys{shard.rank}of{shard.parts}"
    return f"{shard.table}.{shard.row_start}-{shard.row_stop}"


def _zero_stats() -> dict:
    return {f.name: 0 for f in fields(CacheStats)}


def remove_stale(checkpoint_dir: str | os.PathLike, kind: str, keep: str) -> None:
    """Rank 0, after the commit: drop table versions other than `keep`."""
    for d in Path(checkpoint_dir).glob(f"{kind}-tables-*"):
        if d.name != keep and d.is_dir():
            shutil.rmtree(d, ignore_errors=True)


def read_tables(checkpoint: Path, manifest: dict, sharded) -> int | None:
    """Put the saved rows of every shard this rank owns in place; returns, where the cache
    residency was restored too (same world size and placement), the prefetches the caches
    hold again (made for the batches that come first), else None (a cold cache, or no
    tables on this rank)."""
    world = current()
    directory = tables_dir(checkpoint, manifest)
    local = sharded.local
    if local is None:
        return None
    rows = {}
    for shard in sharded.shards:
        if shard.rank == world.rank:
            rows[shard.name] = _rows_of(directory, manifest, shard)
    local.restore_tables(rows, manifest["optimizer_steps"])
    same = (manifest["world_size"] == world.size
            and manifest["placement"] == _placement(sharded.shards))
    cache_file = directory / f"cache.rank{world.rank}.pt"
    if same and cache_file.is_file():
        local.load_residency(_load(cache_file))
        return local.pending_prefetches()
    local.load_stats(manifest["stats"] if world.is_main else {})
    return None


def _rows_of(directory: Path, manifest: dict, shard: Shard) -> dict[str, torch.Tensor]:
    """Rows `[row_start, row_stop)` of the shard's table, from the saved parts overlapping them."""
    table = manifest["tables"].get(shard.table)
    if table is None or table["rows"] != shard.table_rows:
        raise CheckpointError(f"{directory}: no table {shard.table!r} of {shard.table_rows:,} rows in the checkpoint")
    if table.get("open"):  # its keys' rows, however many, with its key index
        return _open_rows(directory, table, shard)
    pieces = []
    for start, stop, file in table["parts"]:
        lo, hi = max(start, shard.row_start), min(stop, shard.row_stop)
        if lo < hi:
            part = _read_part(directory / file)
            if part["weight"].shape[0] != stop - start:
                raise CheckpointError(f"{directory / file}: {part['weight'].shape[0]} rows, the manifest says "
                                      f"{stop - start}")
            pieces.append({k: v[lo - start: hi - start] for k, v in part.items()})
    got = sum(p["weight"].shape[0] for p in pieces)
    if got != shard.rows:
        raise CheckpointError(f"{directory}: the saved parts of {shard.table!r} cover {got} of rows "
                              f"[{shard.row_start}, {shard.row_stop})")
    if len(pieces) == 1:  # the saving placement: the mapped rows as they are, no copy
        return pieces[0]
    return {k: torch.cat([p[k] for p in pieces]) for k in pieces[0]}


_OPEN_COLUMNS = ("open.keys", "open.rows", "open.last_seen", "open.uses")  # one entry a key, as the weight


def _open_rows(directory: Path, table: dict, shard: Shard) -> dict[str, torch.Tensor]:
    """An open table's saved keys and rows for `shard` (`OpenTable.table_part`'s columns as
    `open.<k>`). The part saved for this very shard (whole, or the same key-hash shard of
    as many) as it is: its keys go back to their rows. Otherwise every part of the table,
    merged and cut to the keys the shard owns (all for a whole one), marked as of another
    grouping: the keys take new rows, their values and usage unchanged."""
    parts, split = table["parts"], int(table.get("key_hash", 0))
    files = [directory / file for _, _, file in parts]
    if (shard.whole and not split and len(parts) == 1) or (shard.by_key and split == shard.parts == len(parts)):
        path = files[0] if shard.whole else directory / _part_file(shard)
        if path not in files:
            raise CheckpointError(f"{directory}: the manifest names no part {path.name} of open table {shard.table!r}")
        part = _read_open_part(path)
        if shard.by_key and not bool(shard.owns(part["open.keys"].reshape(-1)).all()):
            raise CheckpointError(f"{path}: holds keys that are not shard {shard.rank}'s of {shard.parts} "
                                  f"(not the part the manifest says)")
        return part
    read = [_read_open_part(f) for f in files]
    names = set(read[0])
    for f, p in zip(files, read):
        if set(p) != names:
            raise CheckpointError(f"{f}: holds {sorted(set(p))}, another part of {shard.table!r} "
                                  f"{sorted(names)}")
    keys = torch.cat([p["open.keys"].reshape(-1) for p in read])
    if torch.unique(keys).numel() != keys.numel():
        raise CheckpointError(f"{directory}: open table {shard.table!r} has a key saved in two parts")
    keep = shard.owns(keys) if shard.by_key else torch.ones_like(keys, dtype=torch.bool)
    columns = [k for k in read[0] if k == "weight" or k.startswith("optimizer.") or k in _OPEN_COLUMNS]
    out = {k: torch.cat([p[k] for p in read])[keep] for k in columns}
    n = int(keep.sum())
    out["open.rows"] = torch.arange(n, dtype=torch.int64).view(-1, 1)
    out["open.free_rows"] = torch.zeros(0, 1, dtype=torch.int64)
    groups = torch.stack([p["open.group"].reshape(-1) for p in read])  # clock, rows, new, retired, members, tables
    counted = shard.whole or shard.rank == 0  # the table's counts of keys made and retired, once
    out["open.group"] = torch.tensor([int(groups[:, 0].max()), n,
                                      int(groups[:, 2].sum()) if counted else 0,
                                      int(groups[:, 3].sum()) if counted else 0,
                                      -1, int(groups[0, 5])], dtype=torch.int64).view(-1, 1)  # members -1: not exact
    return out


def _read_open_part(path: Path) -> dict[str, torch.Tensor]:
    """A saved part of an open table, its columns checked against each other."""
    part = _read_part(path)
    missing = [k for k in (*_OPEN_COLUMNS, "open.group", "open.free_rows") if k not in part]
    if missing:
        raise CheckpointError(f"{path}: an open table's part without {', '.join(missing)}")
    n = part["weight"].shape[0]
    wrong = {k: tuple(v.shape) for k, v in part.items()
             if (k in _OPEN_COLUMNS or k.startswith("optimizer.")) and v.shape[0] != n}
    if wrong or part["open.group"].numel() != 6:
        raise CheckpointError(f"{path}: {n:,} rows, but {wrong or 'a group record of the wrong size'}")
    return part


def _read_part(path: Path) -> dict[str, torch.Tensor]:
    """A saved part's tensors, checked whole (sizes and CRC-32) before any is used, then
    mapped privately: reading them costs page cache, not memory, and nothing written to
    them reaches the checkpoint."""
    if path.suffix == ".pt":  # one torch file per part, as earlier versions wrote them
        return _load(path)
    try:
        header = tf.read_header(path)
        if header is None:
            raise CheckpointError(f"{path}: missing or incomplete (no {tf.HEADER}; the checkpoint's tables "
                                  f"are incomplete)")
        specs = [tf.TensorSpec(_plain_name(name), _shape(t["shape"]), tf.DTYPES[t["dtype"]])
                 for name, t in header["tensors"].items()]
    except DataFormatError as err:
        raise CheckpointError(str(err)) from None
    except (KeyError, TypeError, ValueError) as err:
        raise CheckpointError(f"{path / tf.HEADER}: damaged ({type(err).__name__}: {err})") from None
    if "weight" not in header["tensors"]:
        raise CheckpointError(f"{path / tf.HEADER}: names no weight")
    tf.verify_saved(path, specs)
    return {s.name: tf.map_tensor(path, s, shared=False) for s in specs}


def _plain_name(name: str) -> str:
    """A table's name from a header, which names its file (`NAME.bin`): one from someone else
    naming `../x` would map a file outside the checkpoint into the run's tables."""
    if not isinstance(name, str) or not name or "/" in name or "\\" in name or name.startswith("."):
        raise ValueError(f"names table {str(name)[:80]!r}, not a file inside its folder")
    return name


def _shape(shape) -> tuple[int, int]:
    """A table's `[rows, dim]` from a header: whole numbers of at least 0 (torch's own error
    for -2 rows, or text, is a traceback)."""
    if not (isinstance(shape, list) and len(shape) == 2 and all(type(n) is int and n >= 0 for n in shape)):
        raise ValueError(f"shape {str(shape)[:80]}, not [rows, dim]")
    return tuple(shape)


def _load(path: Path) -> dict:
    if not path.is_file():
        raise CheckpointError(f"{path}: missing (the checkpoint's tables are incomplete)")
    try:
        return load_torch(path)  # its CRC-32 checked first; plain data only
    except CheckpointError:
        raise
    except Exception as err:  # a damaged zip or pickle raises many types
        raise CheckpointError(f"{path}: corrupt or truncated ({type(err).__name__}: {err})") from None


def legacy_rows(sparse_state: dict[str, torch.Tensor], groups) -> tuple[dict, int, dict]:
    """(rows by table, optimizer steps, summed statistics) from the sparse part of a
    checkpoint written before the sharded format (one `CachedEmbeddingBagCollection`
    state dict; `groups` is that collection's grouping of the tables)."""
    rows, totals = {}, CacheStats()
    for i, group in enumerate(groups):
        state_keys = [k[len(f"bags.{i}."):] for k in sparse_state if k.startswith(f"bags.{i}.optimizer.")]
        for t, off in zip(group.tables, group.row_offsets):
            rows[t.name] = {k: sparse_state[f"bags.{i}.{k}"][off: off + t.num_embeddings]
                            for k in ["weight", *state_keys]}
        stats = CacheStats()
        stats.load_tensor(sparse_state[f"bags.{i}.stats"])
        for f in fields(CacheStats):
            setattr(totals, f.name, getattr(totals, f.name) + getattr(stats, f.name))
    steps = int(sparse_state["bags.0.step"])
    return rows, steps, {k: v for k, v in totals.as_dict().items() if k != "hit_rate"}


def full_tables(checkpoint: str | os.PathLike, manifest: dict) -> dict[str, dict[str, torch.Tensor]]:
    """Every saved table whole, in id order, with its optimizer state (for inspection,
    comparison and export: it reads all the tables into memory)."""
    directory = tables_dir(checkpoint, manifest)
    out = {}
    for name, table in manifest["tables"].items():
        whole = Shard(name, (), 0, 0, table["rows"], table["rows"])
        out[name] = _rows_of(directory, manifest, whole)
    return out


def saved_residency(checkpoint: str | os.PathLike, manifest: dict, rank: int) -> dict[str, torch.Tensor]:
    """Rank `rank`'s saved cache state (residency, policy, statistics)."""
    return _load(tables_dir(checkpoint, manifest) / f"cache.rank{rank}.pt")


def tables_dir(checkpoint: str | os.PathLike, manifest: dict) -> Path:
    """The checkpoint's tables folder, beside it, after checking that the folder and every
    part the manifest names are inside it: a checkpoint from someone else naming `../x` or
    `/x` would map files the user never handed over into the run's tables."""
    from embcache.safe_load import inside

    try:
        named = [manifest["dir"]] + [part[2] for table in manifest["tables"].values() for part in table["parts"]]
    except (KeyError, TypeError, AttributeError, IndexError) as err:
        raise CheckpointError(f"{checkpoint}: its tables manifest is damaged ({type(err).__name__}: {err})") from None
    for name in named:
        if not inside(name):
            raise CheckpointError(f"{checkpoint}: names table files {str(name)[:120]!r}, outside the folder beside "
                                  f"it; a checkpoint names only its own files, so it is not used")
    return Path(checkpoint).parent / manifest["dir"]
