"""`embcache dlrm train`: DLRM through the embedding cache on synthetic Criteo-shaped data
(the default: no download), MovieLens-100k as CTR, or a prepared dataset directory."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from embcache.arg_types import DefaultsHelpFormatter, fraction, int_in, memory_size, positive_float, positive_int, ratio
from embcache.errors import UserFacingError
from embcache.train.run_cli import (
    apply_threads,
    add_run_arguments,
    config_values,
    print_summary,
    refuse_existing_run,
    run_launched,
    run_rows,
)

REPO_DATASETS = Path(__file__).resolve().parents[2] / "datasets"


def build_parser(prog: str) -> argparse.ArgumentParser:
    from embcache.cache.choices import OPTIMIZERS
    from embcache.train.dlrm_config import ARCHS, MAX_PREFETCH_DEPTH, SPARSE_MODES, DLRMConfig

    d = DLRMConfig()
    parser = argparse.ArgumentParser(prog=prog, description=__doc__)
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    p = sub.add_parser("train", help="train (and evaluate) a DLRM",
                       formatter_class=DefaultsHelpFormatter,
                       description="Train DLRM (torchrec's, or the same model in plain torch) with a cached "
                                   "sparse part. Progress bar "
                                   "shows loss, samples/s and the live cache hit rate; validation "
                                   "AUC and log loss after each epoch; a summary at the end.")
    p.add_argument("--data", default=d.data,
                   help="'synthetic' (Criteo-shaped, generated on first use), 'ml-100k' "
                        "(MovieLens-100k as CTR), or a directory with meta.json")
    p.add_argument("--data-cache", default=str(REPO_DATASETS),
                   help="where 'synthetic' and 'ml-100k' are prepared")
    p.add_argument("--synthetic-rows", type=positive_int, default=200_000,
                   help="training rows of the synthetic set (val/test get a tenth each)")
    p.add_argument("--synthetic-scale", type=positive_float, default=0.1,
                   help="multiplies Criteo Kaggle's cardinalities for the synthetic set "
                        "(0.1: 3.4 M embedding rows, so the 1.5 %% cache holds 51 k)")
    p.add_argument("--sparse", choices=SPARSE_MODES, default=d.sparse,
                   help="cached tables, whole tables on the device, or whole tables on the host")
    _add_cache_size(p, d.cache_ratio)
    _add_cache_options(p, d)
    p.add_argument("--sparse-optimizer", choices=OPTIMIZERS, default=d.sparse_optimizer)
    p.add_argument("--lr", type=positive_float, default=d.sparse_lr, help="learning rate of the embeddings")
    p.add_argument("--dense-lr", type=positive_float, default=d.dense_lr, help="learning rate of the MLPs (Adagrad)")
    p.add_argument("--embedding-dim", type=positive_int, default=d.embedding_dim)
    p.add_argument("--dense-arch", type=positive_int, nargs="+", default=d.dense_arch,
                   help="hidden sizes of the bottom MLP (the embedding dim is appended)")
    p.add_argument("--over-arch", type=positive_int, nargs="+", default=d.over_arch,
                   help="hidden sizes of the top MLP (the output 1 is appended)")
    p.add_argument("--batch-size", type=positive_int, default=d.batch_size)
    p.add_argument("--arch", choices=ARCHS, default=d.arch,
                   help="the model: torchrec's DLRM, the same model in plain torch (same parameters, same "
                        "results to the bit; no torchrec needed), or auto: torchrec where it is installed")
    add_run_arguments(p, "dlrm", epochs=d.epochs, epochs_help="passes over the training split",
                      checkpoint_every=d.checkpoint_every)
    ahead = p.add_mutually_exclusive_group()
    ahead.add_argument("--prefetch-depth", type=int_in(0, MAX_PREFETCH_DEPTH), default=d.prefetch_depth,
                       metavar="D", help=f"batches whose rows are prefetched while the current one trains "
                                         f"(0 to {MAX_PREFETCH_DEPTH}; 0: none)")
    ahead.add_argument("--no-prefetch", action="store_true", help="do not prefetch (--prefetch-depth 0)")
    p.add_argument("--no-pipeline", action="store_true",
                   help="the synchronous loop: read the loss at every step and the batches in the training "
                        "thread (the same results to the bit, slower; default: losses read every --log-every "
                        "steps, batches read, decoded and pinned in a background thread)")
    p.add_argument("--compile", action="store_true",
                   help="the dense part (bottom MLP, interaction, top MLP) under torch.compile; the cache stays "
                        "eager. Results agree with eager to rounding, not to the bit; the first steps compile")
    p.add_argument("--row-wise-rows", type=positive_int, default=None, metavar="N",
                   help="under torchrun: split a table with more than N rows by rows over all ranks "
                        "(default: a table holding more than its fair share, all rows / ranks)")
    p.set_defaults(func=train)

    _add_evaluate_parser(sub)
    _add_export_parser(sub)
    return parser


def _add_cache_options(p: argparse.ArgumentParser, d) -> None:
    """How the cache chooses its rows, and where and how the full tables are stored."""
    from embcache.cache.choices import POLICIES

    p.add_argument("--eviction", choices=POLICIES, default=d.eviction)
    p.add_argument("--warmup-ratio", type=fraction, default=d.warmup_ratio,
                   help="fraction of the cache filled with the hottest ids before training")
    p.add_argument("--admission", action="store_true",
                   help="admission control (freq, lfu): a missed row colder than the row it would evict is "
                        "served beside the cache for the step; results are unchanged, the hit rate rises "
                        "most where a batch needs more rows than the cache holds")
    p.add_argument("--host-store", type=host_store, default=d.host_store, metavar="memory|mmap:DIR",
                   help="where the full tables and optimizer state live: host memory, or files under DIR "
                        "mapped into memory (the page cache is the RAM tier: tables larger than memory)")
    p.add_argument("--row-dtype", choices=("float32", "float16", "bfloat16"), default=d.row_dtype,
                   help="how embedding rows are stored (host and cache); optimizer state stays float32")
    p.add_argument("--row-rounding", choices=("nearest", "stochastic"), default=d.row_rounding,
                   help="how float16/bfloat16 rows are rounded when an update is written")


def _add_evaluate_parser(sub) -> None:
    from embcache.train.dlrm_config import ARCHS

    e = sub.add_parser("evaluate", help="AUC and log loss of a checkpoint on the test (or val) split",
                       formatter_class=DefaultsHelpFormatter,
                       description="Evaluate a checkpoint written by `dlrm train --checkpoint-dir`: the model "
                                   "and settings come from the checkpoint, the data from the directory it "
                                   "trained on (or --data, for a moved copy: it must have the same features, "
                                   "cardinalities and rows).")
    e.add_argument("checkpoint", help="a checkpoint file, or the --checkpoint-dir holding dlrm-last.pt "
                                      "(or the last.pt of earlier versions)")
    e.add_argument("--split", choices=("test", "val"), default="test")
    e.add_argument("--data", default=None, help="prepared data directory (default: the checkpoint's)")
    e.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    e.add_argument("--arch", choices=ARCHS, default="auto",
                   help="the model to evaluate in (either reads a checkpoint of the other)")
    e.set_defaults(func=evaluate)


def _add_export_parser(sub) -> None:
    """The `export` action of `embcache dlrm` (`embcache.train.dlrm_export`)."""
    from embcache.train.dlrm_config import TABLE_FORMATS

    e = sub.add_parser("export", help="write a checkpoint's tables, vocabularies and dense model for serving",
                       formatter_class=DefaultsHelpFormatter,
                       description="Write every table in id order (float32), the raw value behind every id "
                                   "(where the data directory records it), the dense model as a torch.export "
                                   "program and a manifest; `embcache.serve.load_export(DIR)` scores raw rows.")
    e.add_argument("checkpoint", help="a checkpoint file, or the --checkpoint-dir holding dlrm-last.pt")
    e.add_argument("--out", required=True, help="the export directory (refused when it holds files, unless --force)")
    e.add_argument("--format", choices=TABLE_FORMATS, default="npy", help="file format of the tables (default: npy)")
    e.add_argument("--data", default=None, help="prepared data directory (default: the checkpoint's)")
    e.add_argument("--force", action="store_true", help="replace a non-empty --out")
    e.add_argument("--verify", choices=("val", "test"), default=None, metavar="SPLIT",
                   help="then score SPLIT (val or test) through the export and through the trainer's model "
                        "and report whether the logits agree bit for bit (default: no check)")
    e.set_defaults(func=_export)


def _export(args) -> int:
    from embcache.train.dlrm_export import export_command

    return export_command(args)


def host_store(text: str) -> str:
    """`--host-store`: "memory" or "mmap:DIR" (argparse's one-line error otherwise)."""
    if text == "memory" or (text.startswith("mmap:") and len(text) > len("mmap:")):
        return text
    raise argparse.ArgumentTypeError(f"must be 'memory' or 'mmap:DIR', not {text!r}")


def _add_cache_size(p: argparse.ArgumentParser, default: float) -> None:
    """--cache-ratio (a number, or `auto`) and the --device-memory that `auto` sizes for."""
    p.add_argument("--cache-ratio", type=cache_ratio, default=default,
                   help="fraction of all embedding rows kept on the device, or 'auto': the smallest whose "
                        "predicted hit rate (`embcache cache plan`, from the id counts) is within 1 point of "
                        "the largest cache that fits --device-memory")
    p.add_argument("--device-memory", type=memory_size, default=None, metavar="SIZE",
                   help="with --cache-ratio auto: device memory the cache may use, e.g. 16GiB "
                        "(default: the CUDA device's free memory, else 16 GiB)")


def cache_ratio(text: str) -> float | str:
    """`--cache-ratio`: a ratio in (0, 1], or `auto` (sized by the cache planner once the
    data is known)."""
    return "auto" if text == "auto" else ratio(text)


cache_ratio.__name__ = "cache ratio"


def _auto_cache_ratio(args, cfg, data_dir: Path) -> float:
    """The planner's choice for `--cache-ratio auto`, logged (by rank 0) in one line."""
    import logging
    import os

    from embcache.cache.planner import auto_cache_ratio, default_device_memory

    memory, source = (args.device_memory, "--device-memory") if args.device_memory else \
        default_device_memory(cfg.resolved_device())
    chosen, why = auto_cache_ratio(data_dir, embedding_dim=cfg.embedding_dim, optimizer=cfg.sparse_optimizer,
                                   eviction=cfg.eviction, batch_size=cfg.batch_size,
                                   warmup_ratio=cfg.warmup_ratio, device_memory=memory, seed=cfg.seed,
                                   prefetch_depth=cfg.prefetch_depth, admission=cfg.admission)
    if int(os.environ.get("RANK", "0")) == 0:
        logging.getLogger("embcache.train.dlrm").info(f"{why} ({source})")
    return chosen


def builtin_data_dir(args) -> Path | None:
    """Where the built-in `--data` (synthetic, ml-100k) is prepared; None for a directory."""
    if args.data == "synthetic":
        name = f"synthetic-criteo-r{args.synthetic_rows}-s{args.synthetic_scale:g}-seed{args.seed}"
        return Path(args.data_cache) / name
    if args.data == "ml-100k":
        return Path(args.data_cache) / "ml-100k-ctr"
    return None


def resolve_data(args) -> Path:
    """A prepared dataset directory for `--data`, preparing the built-in ones on first use."""
    from embcache.data.ctr_format import read_meta

    from embcache.data.staging import staged_output

    out = builtin_data_dir(args)
    if args.data == "synthetic":
        if not (out / "meta.json").exists():
            from embcache.data.synthetic import generate_synthetic

            print(f"generating synthetic Criteo-shaped data into {out} ...")
            with staged_output(out, force=True) as tmp:  # whole or not at all (Ctrl-C, a full disk)
                generate_synthetic(tmp, rows=args.synthetic_rows, scale=args.synthetic_scale, seed=args.seed)
        return out
    if args.data == "ml-100k":
        if not (out / "meta.json").exists():
            from embcache.data.movielens_ctr import prepare_ml100k_ctr

            print(f"preparing MovieLens-100k as CTR into {out} ...")
            with staged_output(out, force=True) as tmp:
                prepare_ml100k_ctr(tmp)
        return out
    path = Path(args.data)
    if not (path / "meta.json").is_file():
        raise UserFacingError(f"{path}: no meta.json here; prepare data with `embcache data prepare ...` "
                              f"or use --data synthetic / ml-100k")
    read_meta(path)
    return path


def _prepared_once(args) -> Path:
    """`resolve_data`, run by one rank per node under torchrun (the others wait for its
    files rather than write the same ones at once; meta.json is written last)."""
    import os
    import time

    out = builtin_data_dir(args)
    if int(os.environ.get("LOCAL_RANK", "0")) == 0 or out is None:
        return resolve_data(args)
    deadline = time.monotonic() + 1800
    while not (out / "meta.json").is_file():
        if time.monotonic() > deadline:
            raise UserFacingError(f"{args.data}: local rank 0 did not finish preparing the data in 30 minutes")
        time.sleep(0.5)
    return resolve_data(args)


def train(args) -> int:
    from embcache.train.dlrm import DLRMConfig, DLRMTrainer

    cfg = DLRMConfig(**{**config_values(args, DLRMConfig), "sparse_lr": args.lr,
                        "prefetch_depth": 0 if args.no_prefetch else args.prefetch_depth,
                        "pipeline": not args.no_pipeline})
    try:
        cfg.resolved_device()
        refuse_existing_run(args, "dlrm")
        apply_threads(args)
        data_dir = _prepared_once(args)
        if cfg.cache_ratio == "auto":
            cfg.cache_ratio = _auto_cache_ratio(args, cfg, data_dir) if cfg.sparse == "cached" \
                else DLRMConfig.cache_ratio
        summary, _ = run_launched(cfg, lambda: DLRMTrainer(cfg, data_dir).fit())
    except ValueError as err:
        raise UserFacingError(str(err)) from None
    except OSError as err:  # an unwritable --data-cache or --checkpoint-dir, a full disk
        from embcache.errors import describe_os_error

        raise UserFacingError(describe_os_error(err)) from None
    print_summary(summary_rows(summary), summary)
    return 0


def evaluate(args) -> int:
    from embcache.train.dlrm import DLRMConfig, DLRMTrainer
    from embcache.train.run import checkpoint_to_evaluate

    try:
        path, ckpt, cfg = checkpoint_to_evaluate(args.checkpoint, "dlrm", DLRMConfig, args.device)
        cfg.arch = args.arch  # not the checkpoint's: the two models read each other's checkpoints
        data_dir = args.data or ckpt.get("data_dir")
        if data_dir is None:
            raise ValueError(f"{path}: the checkpoint does not name its data directory; give --data")
        data_dir = Path(data_dir)
        if not (data_dir / "meta.json").is_file():
            raise ValueError(f"{data_dir}: no meta.json here (the checkpoint's data moved? give --data)")
        _check_same_data(path, ckpt, data_dir)

        def run():
            trainer = DLRMTrainer(cfg, data_dir)
            trainer.restore(path)
            return trainer.evaluate(args.split)

        result, world = run_launched(cfg, run)
    except ValueError as err:
        raise UserFacingError(str(err)) from None
    if not world.is_main:
        return 0
    print(f"{args.split}: AUC {result['auc']:.4f}  log loss {result['logloss']:.4f}  "
          f"({result['samples']:,} samples, step {ckpt['step']})")
    print(json.dumps({"split": args.split, "step": ckpt["step"], **result}, default=float))
    return 0


def _check_same_data(path: Path, ckpt: dict, data_dir: Path) -> None:
    """A checkpoint evaluates only on the data it was trained on (or a copy): one line naming
    the difference otherwise (not the resume's wording: nothing resumes here)."""
    from embcache.data.ctr_format import read_meta
    from embcache.train.dlrm import data_difference, data_fingerprint

    saved = ckpt.get("data")
    if saved is None:
        return
    now = data_fingerprint(read_meta(data_dir))
    if json.dumps(saved) != json.dumps(now):
        raise ValueError(f"{path} was trained on other data than {data_dir} ({data_difference(saved, now)}); "
                         f"evaluate it on its own data (leave out --data) or a copy of it")


def summary_rows(s: dict) -> list[tuple[str, str]]:
    rows = [("validation AUC", f"{s['val_auc']:.4f}" if s.get("val_auc") is not None else "-"),
            ("validation log loss", f"{s['val_logloss']:.4f}" if s.get("val_logloss") is not None else "-"),
            ("model", "DLRM in plain torch" if s.get("arch") == "torch" else "torchrec's DLRM"),
            ("sparse part", f"{s['sparse']} on {s['device']}")]
    if s["sparse"] == "cached":
        rows += [("cache", f"{s['cache_rows']:,} of {s['table_rows']:,} rows "
                           f"({s['cache_rows'] / s['table_rows']:.2%})"),
                 ("cache hit rate", f"{s['hit_rate']:.4f}"),
                 ("bytes host->device", f"{s['bytes_h2d'] / 2**20:,.1f} MiB"),
                 ("bytes device->host", f"{s['bytes_d2h'] / 2**20:,.1f} MiB"),
                 ("overflow rows", f"{s['overflow_rows']:,}")]
        if s.get("bypassed_rows"):
            rows.append(("rows served beside the cache", f"{s['bypassed_rows']:,} (declined by admission control)"))
    if "comm_bytes_per_step" in s:
        c = s["comm_bytes_per_step"]
        rows.append(("sent between ranks", f"{sum(c.values()) / 2**20:,.2f} MiB a step (ids {c['ids'] / 2**20:,.2f}, "
                                           f"pooled {c['pooled'] / 2**20:,.2f} + their gradients, dense all-reduce "
                                           f"{c['dense_allreduce'] / 2**20:,.2f})"))
    return rows + run_rows(s)
