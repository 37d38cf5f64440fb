"""`embcache dlrm export`: a trained DLRM checkpoint as files a server reads without embcache's
trainer, cache or torchrec.

    DIR/manifest.json            what is below, the table order, and how to score a raw row
    DIR/tables/<table>.npy       float32 [rows, dim] in id order (or .parquet: id, embedding)
    DIR/vocab/<feature>.parquet  the raw value (or hash bucket) of every id, from the data
    DIR/vocab/<feature>.keys.npy the keys owning ids 1.. (the converters' lookup, an open
                                 table's or a first-day vocabulary's keys), where used
    DIR/dense.pt2                the dense part as a `torch.export` program:
                                 (pooled [B, T, D], dense [B, k]) -> logit [B, 1]

Tables are read through the checkpoint's own loading code (`table_checkpoint.full_tables`,
or the whole-model state dict of a single-process checkpoint) and written as float32
whatever they were trained in. Everything is written into a temporary directory beside DIR
and renamed onto it, so DIR is either the previous export or the whole new one.
`embcache.serve` loads the result and scores raw rows.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from embcache.data.ctr_format import dense_transform
from embcache.errors import CheckpointError, DataOutputError, UserFacingError, writing
from embcache.integrity import ChecksumError, file_crc32, verify_zip
from embcache.leftovers import claimed
from embcache.dlrm.arch import DLRMDense
from embcache.dlrm.config import TABLE_FORMATS, training_split

FORMAT = "embcache-dlrm-export"
VERSION = 1
DENSE_FILE = "dense.pt2"


def export_dense(model: DLRMDense, num_tables: int, dim: int, num_dense: int):
    """A `torch.export` program of `model` with a free batch size."""
    batch = torch.export.Dim("batch", min=1)
    example = (torch.zeros(2, num_tables, dim), torch.zeros(2, num_dense))
    return torch.export.export(model.eval(), example, dynamic_shapes=({0: batch}, {0: batch}))


@dataclass
class KeyRule:
    """How a table of a raw-key run finds a key's row, as the export writes it (its
    manifest vocabulary's "rule"): "open" and "first-day" look the key up in `keys` (uint64,
    ascending, owning rows 1..; any other key -> row 0), "hash" takes row
    `splitmix64(key) % rows` (`data.key_maps.HashedKeys`, the trainer's own map)."""

    rule: str
    id_0: str  # what row 0 is, in words
    keys: np.ndarray | None = None
    rows: int | None = None


OPEN_ID_0 = "a key never trained (or retired): zeros"
HASH_ID_0 = "the bucket of the keys hashing to 0, like any other"


def checkpoint_tables(path: Path, ck: dict, meta: dict, cfg,
                      key_rules: dict[str, KeyRule] | None = None) -> dict[str, torch.Tensor]:
    """Every table of the checkpoint as float32 `[rows, dim]` in id order, by table name.
    An open table's rows are those `open_table_rows` serves; its rule (its keys) goes into
    `key_rules`."""
    from embcache.distributed import table_checkpoint

    if "tables" in ck:
        out = {}
        for name, part in table_checkpoint.full_tables(path, ck["tables"]).items():
            if "open.keys" in part:
                out[name], keys = open_table_rows(part)
                if key_rules is not None:
                    key_rules[name] = KeyRule("open", OPEN_ID_0, keys=keys)
            else:
                out[name] = part["weight"].to(torch.float32)
        return out
    from embcache.dlrm.model import table_configs

    configs = table_configs(meta, cfg)
    model = ck["model"]
    if cfg.sparse == "cached":  # one collection's state dict, from before the sharded format
        from embcache.nn.table_groups import group_tables

        prefix = "sparse_arch.embedding_bag_collection."
        sparse = {k[len(prefix):]: v for k, v in model.items() if k.startswith(prefix)}
        rows, _, _ = table_checkpoint.legacy_rows(sparse, group_tables(configs))
        return {t.name: rows[t.name]["weight"].to(torch.float32) for t in configs}
    out = {}
    for t in configs:
        keys = [k for k in model if k.endswith(f"embedding_bags.{t.name}.weight")]
        if len(keys) != 1:
            raise CheckpointError(f"{path}: no weight of table {t.name!r} in the checkpoint")
        out[t.name] = model[keys[0]].to(torch.float32)
    return out


def open_table_rows(part: dict[str, torch.Tensor]) -> tuple[torch.Tensor, np.ndarray]:
    """An open table's saved part as a served table: row 0 zeros (the default row of a key
    never seen), then the live keys' rows in key order; returns (table, the keys owning
    rows 1..)."""
    weight = part["weight"]
    return rows_in_key_order(torch.zeros(weight.shape[1]), weight, part["open.keys"].numpy())


def rows_in_key_order(row_0: torch.Tensor, weight: torch.Tensor,
                      keys: np.ndarray) -> tuple[torch.Tensor, np.ndarray]:
    """A served table of raw keys, float32: `row_0` (the row of every key not listed), then
    `weight`'s rows (those of `keys`, in the same order) in ascending uint64 key order, the
    order a lookup's `searchsorted` wants; returns (table, the keys owning rows 1..)."""
    keys = np.ascontiguousarray(keys).reshape(-1).view(np.uint64)
    order = np.argsort(keys, kind="stable")
    rows = weight.to(torch.float32).index_select(0, torch.from_numpy(order))
    return torch.cat([row_0.to(torch.float32).reshape(1, -1), rows]), keys[order]


def closed_key_rules(path: Path, ck: dict, meta: dict, cfg, data_dir: Path,
                     tables: dict[str, torch.Tensor]) -> dict[str, KeyRule]:
    """The rules of a `--raw-keys hash` or `first-day` run's tables, by table name (none for
    other runs): its key map rebuilt from the data as its trainer built it (`raw_key_setup`
    of its first training split) and checked against the checkpoint, so that the export
    serves keys exactly as training mapped them. A first-day table is put into key order in
    `tables` (training numbered its keys in int64 order; the served lookup wants uint64)."""
    from embcache.data.key_maps import HashedKeys
    from embcache.dlrm.raw_keys import raw_key_setup, table_name

    if cfg.raw_keys not in ("hash", "first-day"):  # open tables bring their keys; ids data needs none
        return {}
    split = training_split(cfg.days, 0)
    setup = raw_key_setup(meta, cfg, data_dir, split)
    if setup is None:  # data of vocabulary ids: the raw-key settings never applied
        return {}
    key_map = setup.key_map
    check_key_map(path, ck, data_dir, split, key_map, [tables[table_name(f["name"])] for f in meta["sparse"]])
    rules = {}
    for f, feature in enumerate(meta["sparse"]):
        name = table_name(feature["name"])
        if isinstance(key_map, HashedKeys):
            rules[name] = KeyRule("hash", HASH_ID_0, rows=key_map.rows()[f])
        else:
            weight = tables[name]
            tables[name], keys = rows_in_key_order(weight[0], weight[1:], key_map.keys(f))
            rules[name] = KeyRule("first-day", f"a key not among the first training split's ({split}): the row "
                                               f"those keys shared in training", keys=keys)
    return rules


def check_key_map(path: Path, ck: dict, data_dir: Path, split: str, key_map, tables: list[torch.Tensor]) -> None:
    """Refuse a rebuilt key map other than the run's: tables of other sizes, or (where the
    checkpoint records it: checkpoints from before it do not) another record (`KeyMap.record`:
    the rule, sizes and a digest of a first-day vocabulary's keys)."""
    saved = ck.get("key_map")
    sizes = [int(t.shape[0]) for t in tables]
    if sizes == key_map.rows() and saved in (None, key_map.record()):
        return
    raise UserFacingError(f"{data_dir}: its {split} keys do not rebuild the key map {path} trained with "
                          f"({'table sizes' if sizes != key_map.rows() else 'keys'} differ; give --data the "
                          f"data it trained on)")


def checkpoint_dense(ck: dict, meta: dict, cfg) -> DLRMDense:
    """The checkpoint's dense part, in the trainer's DLRM without its tables (plain torch under
    torchrec's parameter names, so the state loads as is; bit-equal to torchrec's modules)."""
    state = ck.get("dense_model")
    if state is None:
        state = {k: v for k, v in ck["model"].items() if not k.startswith("sparse_arch.")}
    model = DLRMDense(meta["num_dense"], len(meta["sparse"]), cfg.embedding_dim, cfg.dense_arch, cfg.over_arch)
    model.load_state_dict(state)
    return model


def write_table(weight: torch.Tensor, path: Path) -> None:
    """One table in id order: `.npy` float32 `[rows, dim]`, or Parquet with `id` and a
    fixed-size-list `embedding` column."""
    array = weight.detach().cpu().numpy().astype(np.float32, copy=False)
    with writing(path):
        if path.suffix == ".npy":
            np.save(path, array)
            return
        import pyarrow as pa
        import pyarrow.parquet as pq

        flat = pa.array(np.ascontiguousarray(array).reshape(-1))
        table = pa.table({"id": pa.array(np.arange(len(array), dtype=np.int64)),
                          "embedding": pa.FixedSizeListArray.from_arrays(flat, array.shape[1])})
        pq.write_table(table, path)


def write_vocabulary(data_dir: Path, meta: dict, feature: str, vocab_dir: Path,
                     key_rule: KeyRule | None = None) -> dict:
    """Copy a feature's raw-value file (and the keys its lookup needs) from the data
    directory, or write a raw-key table's rule (`write_key_rule`); returns the table's
    "vocabulary" entry of the manifest."""
    if key_rule is not None:
        return write_key_rule(meta, feature, vocab_dir, key_rule)
    entry = dict(meta.get("raw_values", {}).get("features", {}).get(feature, {}))
    if not entry:  # prepared before raw values were recorded: the scorer takes ids
        return {"key": "identity", "id_0": "unknown", "hashed": False,
                "note": "the data directory records no raw values; rows are scored by id"}
    if "file" in entry:
        target = vocab_dir / f"{feature}.parquet"
        if not (data_dir / entry["file"]).is_file():
            raise UserFacingError(f"{data_dir / entry['file']}: missing (meta.json lists it for {feature})")
        with writing(target):
            shutil.copyfile(data_dir / entry["file"], target)
        entry["file"] = f"vocab/{target.name}"
    if entry["key"] in ("string", "int+1"):
        target = vocab_dir / f"{feature}.keys.npy"
        source = data_dir / meta.get("vocabulary_file", "vocabulary.npz")
        try:
            verify_zip(source)
            with np.load(source, allow_pickle=False) as npz:
                keys = npz[feature]
        except ChecksumError:
            raise
        except (OSError, KeyError, ValueError) as err:
            raise UserFacingError(f"{source}: cannot read the keys of {feature} ({err})") from None
        with writing(target):
            np.save(target, keys.astype(np.uint64))
        entry["keys_file"] = f"vocab/{target.name}"
        entry["max_ids"] = meta.get("max_ids_per_feature")
    return entry


def write_key_rule(meta: dict, feature: str, vocab_dir: Path, key_rule: KeyRule) -> dict:
    """A raw-key table's "vocabulary" entry: a value finds its key by the data's rule
    (`key_kinds`: "string", "int+1", or "raw" where the value is its key), then its row by
    `key_rule`: in the keys written beside ("open", "first-day"), or by the hash ("hash")."""
    kind = meta.get("key_kinds", {}).get(feature, "raw")
    entry = {"key": kind if kind in ("string", "int+1") else "raw", "rule": key_rule.rule, "id_0": key_rule.id_0,
             "hashed": key_rule.rule == "hash", "open": key_rule.rule == "open"}
    if key_rule.keys is None:
        return {**entry, "rows": key_rule.rows}
    target = vocab_dir / f"{feature}.keys.npy"
    with writing(target):
        np.save(target, key_rule.keys.astype(np.uint64))
    return {**entry, "keys_file": f"vocab/{target.name}"}


def export_command(args) -> int:
    manifest = export_checkpoint(args.checkpoint, args.out, table_format=args.format, data=args.data,
                                 force=args.force)
    rows = sum(t["rows"] for t in manifest["tables"])
    print(f"exported step {manifest['step']}: {len(manifest['tables'])} tables ({rows:,} rows x "
          f"{manifest['embedding_dim']}), vocabularies, {DENSE_FILE} -> {args.out}")
    print(f"trained with precision {manifest['trained_precision']}; the export scores in float32")
    if args.verify:
        check = verify_export(args.checkpoint, args.out, args.verify)
        agree = "equal the trainer's bit for bit" if check["bit_for_bit"] else "differ from the trainer's"
        print(f"{check['split']}: {check['rows']:,} rows scored through the export {agree} "
              f"(largest difference {check['max_abs_diff']:.3g}; the export scored "
              f"{check['export_rows_per_s'] or 0:,.0f} rows/s from ids)")
        print(json.dumps(check))
    return 0


def check_target(out: Path, force: bool) -> None:
    """Refuse an --out that is a file, or a directory holding anything, unless `force`."""
    if out.exists() and not out.is_dir():
        raise UserFacingError(f"{out}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise UserFacingError(f"{out}: exists and is not empty (give --force to replace it)")


def checkpoint_data(path: Path, ck: dict, data: str | None) -> tuple[Path, dict]:
    """The prepared data directory the checkpoint trained on (or `data`) and its meta,
    checked to have the checkpoint's features, cardinalities and rows."""
    from embcache.data.ctr_format import read_meta
    from embcache.dlrm.trainer import data_differs, data_fingerprint

    data_dir = data or ck.get("data_dir")
    if data_dir is None:
        raise UserFacingError(f"{path}: the checkpoint does not name its data directory; give --data")
    data_dir = Path(data_dir)
    if not (data_dir / "meta.json").is_file():
        raise UserFacingError(f"{data_dir}: no meta.json here (the checkpoint's data moved? give --data)")
    meta = read_meta(data_dir)
    saved = ck.get("data")
    if saved is not None and data_differs(saved, data_fingerprint(meta)):
        from embcache.dlrm.trainer import data_difference

        raise UserFacingError(f"{data_dir}: other features, cardinalities or rows than the data of {path} "
                              f"({data_difference(saved, data_fingerprint(meta))})")
    return data_dir, meta


def export_checkpoint(checkpoint: str | os.PathLike, out: str | os.PathLike, table_format: str = "npy",
                      data: str | None = None, force: bool = False) -> dict:
    """Write the export of `checkpoint` to `out` (see the module docstring); returns the
    manifest. Bad input is a `UserFacingError` raised before `out` changes."""
    from embcache.dlrm.trainer import DLRMConfig
    from embcache.train.run import checkpoint_to_evaluate

    if table_format not in TABLE_FORMATS:
        raise ValueError(f"table_format must be one of {TABLE_FORMATS}, got {table_format!r}")
    out = Path(out)
    check_target(out, force)
    path, ck, cfg = checkpoint_to_evaluate(checkpoint, "dlrm", DLRMConfig, "cpu")
    data_dir, meta = checkpoint_data(path, ck, data)
    for inside in (path, data_dir):  # --force would delete what the export is made from
        if out.resolve() in (inside.resolve(), *inside.resolve().parents):
            raise UserFacingError(f"{out}: holds {inside}; export to another directory")
    try:
        key_rules: dict[str, KeyRule] = {}
        tables = checkpoint_tables(path, ck, meta, cfg, key_rules)
        key_rules.update(closed_key_rules(path, ck, meta, cfg, data_dir, tables))
        dense = checkpoint_dense(ck, meta, cfg)
    except (KeyError, RuntimeError) as err:  # a state dict that does not fit the model
        raise CheckpointError(f"{path}: does not hold a DLRM of its own settings ({type(err).__name__}: "
                              f"{str(err).splitlines()[0]})") from None
    program = export_dense(dense, len(meta["sparse"]), cfg.embedding_dim, meta["num_dense"])
    tmp = out.parent / f".{out.name}.export-tmp-{os.getpid()}"
    with claimed(out):  # what killed exports to `out` left is removed first; a live one's refused
        try:
            with writing(out.parent):
                out.parent.mkdir(parents=True, exist_ok=True)
                tmp.mkdir()
            manifest = write_export(tmp, tables, program, data_dir, meta, table_format, key_rules)
            # what the dense part was trained in (`--precision`); the export itself scores in float32
            manifest.update(checkpoint=str(path), step=ck.get("step"),
                            trained_precision=ck.get("precision") or "fp32")
            # every file's CRC-32, which `load_export` checks before it uses any
            manifest["files_crc32"] = {f.relative_to(tmp).as_posix(): file_crc32(f)
                                       for f in sorted(tmp.rglob("*")) if f.is_file()}
            with writing(tmp / "manifest.json"):
                (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
            _commit(tmp, out)
        except DataOutputError as err:  # name the file as the user will look for it
            raise DataOutputError(str(err).replace(str(tmp), str(out))) from None
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return manifest


def _commit(tmp: Path, out: Path) -> None:
    """Put the finished export at `out`: a rename, the old export (if any) moved aside
    first and removed after."""
    old = out.parent / f".{out.name}.export-old-{os.getpid()}"
    with writing(out):
        if out.is_dir() and any(out.iterdir()):
            os.replace(out, old)
        try:
            os.replace(tmp, out)
        except OSError:
            if old.exists():  # the previous export goes back where it was
                os.replace(old, out)
            raise
    shutil.rmtree(old, ignore_errors=True)


def write_export(directory: Path, tables: dict[str, torch.Tensor], program, data_dir: Path, meta: dict,
                 table_format: str, key_rules: dict[str, KeyRule] | None = None) -> dict:
    """Tables, vocabularies and the dense program into `directory`; returns the manifest
    (without the checkpoint's name and step)."""
    (directory / "tables").mkdir()
    (directory / "vocab").mkdir()
    entries = []
    for feature in meta["sparse"]:
        name = f"t_{feature['name']}"
        weight = tables[name]
        file = f"tables/{name}.{table_format}"
        write_table(weight, directory / file)
        entries.append({"name": name, "feature": feature["name"], "rows": int(weight.shape[0]),
                        "dim": int(weight.shape[1]), "file": file, "multi_hot": bool(feature.get("multi_hot")),
                        "description": meta.get("features", {}).get(feature["name"]),
                        "vocabulary": write_vocabulary(data_dir, meta, feature["name"], directory / "vocab",
                                                       (key_rules or {}).get(name))})
    with writing(directory / DENSE_FILE):
        torch.export.save(program, directory / DENSE_FILE)
    dim = entries[0]["dim"]
    return {"format": FORMAT, "version": VERSION, "data_dir": str(data_dir.resolve()), "source": meta.get("source"),
            "embedding_dim": dim, "pooling": "sum", "table_format": table_format, "tables": entries,
            "num_dense": meta["num_dense"],
            "dense_features": [meta.get("features", {}).get(f"dense_{j}", f"dense_{j}")
                               for j in range(meta["num_dense"])],
            # what `predict` applies to raw dense values, as `data prepare` did (null: none)
            "dense_transform": dense_transform(meta),
            # `data prepare own`'s columns (label, dense, sparse, time): `dlrm predict` reads them by name
            **({"input_columns": meta["columns"]} if "columns" in meta else {}),
            "dense_model": {"file": DENSE_FILE, "kind": "torch.export", "torch": torch.__version__,
                            "inputs": {"pooled": f"[B, {len(entries)}, {dim}] float32, tables in the order above",
                                       "dense": f"[B, {meta['num_dense']}] float32, the dense_features above"},
                            "output": "logit [B, 1]; click probability = sigmoid(logit)"},
            "scoring": SCORING}


SCORING = [
    "1. each categorical value -> an id by its table's vocabulary.key: 'string': the converters' key of the "
    "value (its bytes, up to 8; a hash of longer ones) looked up in keys_file (ids 1..; hashed first as "
    "bucket = 1 + splitmix64(key) % (max_ids - 1) when hashed), unknown, rare or empty -> 0; 'int+1': key = "
    "value + 1, then as 'string'; 'exact': the value's row in file, unknown values have no id; 'identity': "
    "the value is the id; 'raw': the value is its 64-bit key (as the data holds it); a raw key's id by "
    "vocabulary.rule: 'open' or 'first-day': its position in keys_file (ids 1..), any other key -> 0; 'hash': "
    "splitmix64(key) % rows",
    "2. pooled[b, t] = the sum of table t's rows of row b's ids (one id for a one-hot feature)",
    "3. dense[b] = the row's dense features as the data's dense columns hold them (dense_features): "
    "raw values through dense_transform, as data prepare did (missing -> 0)",
    "4. logit = the dense program(pooled, dense); click probability = sigmoid(logit)",
    "embcache.serve.load_export(DIR).predict(rows) does all four, from raw values",
]


def verify_export(checkpoint: str | os.PathLike, out: str | os.PathLike, split: str = "val") -> dict:
    """Score a split of the checkpoint's data through the export (from the data's ids: the
    tables and the dense program; from raw keys by the export's rules, where the data holds
    raw keys; raw-value lookups are the tests' to check) and through the trainer's own model
    (raw keys mapped by its own key map), batch by batch; returns rows, whether every logit is
    equal bit for bit, and the largest difference."""
    from embcache.serve import load_export
    from embcache.dlrm.trainer import DLRMConfig, DLRMTrainer
    from embcache.train.run import checkpoint_to_evaluate

    path, ck, cfg = checkpoint_to_evaluate(checkpoint, "dlrm", DLRMConfig, "cpu")
    model = load_export(out)
    cfg.precision = "fp32"  # the export scores in float32: so does the model it is checked against
    trainer = DLRMTrainer(cfg, model.manifest["data_dir"])
    trainer.restore(path)
    trainer.model.eval()
    rows, equal, worst, seconds = 0, True, 0.0, 0.0
    key_map = trainer.raw.key_map if trainer.raw else None
    with torch.no_grad():
        for batch in trainer._batches(split, cfg.eval_batch_size, map_keys=False):  # raw keys: the export maps them
            want = trainer.model(batch.dense, mapped_keys(batch.sparse, key_map)).reshape(-1).cpu()
            ids = {f: (lookup.ids_of_keys(batch.sparse[f].values().cpu().numpy()) if lookup.rule
                       else batch.sparse[f].values().cpu().numpy(), batch.sparse[f].lengths().tolist())
                   for f, lookup in zip(model.features, model.lookups)}
            start = time.perf_counter()
            got = model.logits_of_pooled(model.pool_ids(ids), batch.dense.cpu().numpy())
            seconds += time.perf_counter() - start
            rows, equal = rows + len(want), equal and torch.equal(got, want)
            worst = max(worst, float((got - want).abs().max()) if len(want) else 0.0)
    return {"split": split, "rows": rows, "bit_for_bit": equal, "max_abs_diff": worst,
            "export_rows_per_s": rows / seconds if seconds else None}


def mapped_keys(sparse, key_map):
    """A batch's raw keys as the trainer's `key_map` turns them into ids while loading (the
    batch itself where there is none: ids data, open tables)."""
    if key_map is None:
        return sparse
    from embcache.sparse_types import KeyedJaggedTensor

    ids = key_map(sparse.values().cpu().numpy(), sparse.length_per_key())
    return KeyedJaggedTensor(keys=sparse.keys(), values=torch.from_numpy(ids), lengths=sparse.lengths())
