"""`embcache dlrm train`: DLRM through the embedding cache on synthetic Criteo-shaped data
(the default: no download), MovieLens-100k as CTR, or a prepared dataset directory."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from embcache.arg_types import DefaultsHelpFormatter, memory_size, positive_float, positive_int
from embcache.errors import UserFacingError
from embcache.paths import datasets_dir
from embcache.safe_load import add_trust_argument
from embcache.settings_fields import add_config_arguments, config_values
from embcache.train.run_cli import (
    apply_threads,
    add_run_arguments,
    print_summary,
    refuse_existing_run,
    run_launched,
    run_rows,
)



def build_parser(prog: str) -> argparse.ArgumentParser:
    from embcache.dlrm.config import DLRMConfig

    parser = argparse.ArgumentParser(prog=prog, description=__doc__)
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    p = sub.add_parser("train", help="train (and evaluate) a DLRM",
                       formatter_class=DefaultsHelpFormatter,
                       description="Train DLRM (torchrec's, or the same model in plain torch) with a cached "
                                   "sparse part. Progress bar "
                                   "shows loss, samples/s and the live cache hit rate; validation "
                                   "AUC and log loss after each epoch; a summary at the end.")
    # the settings are DLRMConfig's fields (`embcache.settings_fields`); the flags declared here
    # are the command's own: where the built-in data is made, and shorthands
    add_config_arguments(p, DLRMConfig, ["data"])
    p.add_argument("--data-cache", default=str(datasets_dir()),
                   help="where 'synthetic' and 'ml-100k' are prepared")
    p.add_argument("--synthetic-rows", type=positive_int, default=200_000,
                   help="training rows of the synthetic set (val/test get a tenth each)")
    p.add_argument("--synthetic-scale", type=positive_float, default=0.1,
                   help="multiplies Criteo Kaggle's cardinalities for the synthetic set "
                        "(0.1: 3.4 M embedding rows, so the 1.5 %% cache holds 51 k)")
    # not given, the command sizes its cache from the data (`fit`); DLRMConfig keeps 0.015
    add_config_arguments(p, DLRMConfig, ["sparse", "cache_ratio"], unset=["cache_ratio"])
    p.add_argument("--device-memory", type=memory_size, default=None, metavar="SIZE",
                   help="with --cache-ratio auto or fit: device memory the cache may use, e.g. 16GiB "
                        "(default: the CUDA device's free memory, else 16 GiB)")
    add_config_arguments(p, DLRMConfig, ["eviction", "warmup_ratio", "admission", "bookkeeping", "kernels", "host_store", "row_dtype",
                                         "row_rounding", "sparse_optimizer", "sparse_lr", "dense_lr", "embedding_dim",
                                         "dense_arch", "over_arch", "batch_size", "arch", "precision", "cuda_graphs"])
    add_run_arguments(p, DLRMConfig, "dlrm", unset=["epochs"])  # None: not given, so `--days` may set it
    ahead = add_config_arguments(p, DLRMConfig, ["prefetch_depth"])["prefetch"]
    ahead.add_argument("--no-prefetch", action="store_true", help="do not prefetch (--prefetch-depth 0)")
    add_config_arguments(p, DLRMConfig, ["pipeline", "readers", "compile", "row_wise_rows", "overlap_exchange"])
    raw = p.add_argument_group("raw keys and days", "data with raw 64-bit keys (docs/open-vocabularies.md)")
    add_config_arguments(raw, DLRMConfig, ["raw_keys", "max_rows", "retire", "ttl", "ttl_days", "days",
                                           "eval_next_day", "allow_test_days"])
    p.set_defaults(func=train)

    _add_evaluate_parser(sub)
    _add_export_parser(sub)
    _add_predict(sub)
    return parser


def _add_evaluate_parser(sub) -> None:
    from embcache.dlrm.config import DLRMConfig

    e = sub.add_parser("evaluate", help="AUC and log loss of a checkpoint on the test (or val, or a day's) split",
                       formatter_class=DefaultsHelpFormatter,
                       description="Evaluate a checkpoint written by `dlrm train --checkpoint-dir`: the model "
                                   "and settings come from the checkpoint, the data from the directory it "
                                   "trained on (or --data, for a moved copy: it must have the same features, "
                                   "cardinalities and rows).")
    e.add_argument("checkpoint", help="a checkpoint file, or the --checkpoint-dir holding dlrm-last.pt "
                                      "(or the last.pt of earlier versions)")
    e.add_argument("--split", type=split_name, default="test",
                   help="test, val, or a day split (day_N) of data written day by day (`--days` runs'; such data "
                        "has no test or val)")
    e.add_argument("--data", default=None, help="prepared data directory (default: the checkpoint's)")
    add_config_arguments(e, DLRMConfig, ["device", "arch"])  # arch: not the checkpoint's, the model to evaluate in
    add_trust_argument(e)
    e.set_defaults(func=evaluate)


def split_name(text: str) -> str:
    """`dlrm evaluate --split`: test, val or day_N; a data set written day by day has only
    day splits, so a `--days` run could not be evaluated at all with test and val alone."""
    if text in ("test", "val") or (text.startswith("day_") and text[4:].isdigit()):
        return text
    raise argparse.ArgumentTypeError(f"expected test, val or a day split day_N, got {text!r}")


split_name.__name__ = "split"


def _add_export_parser(sub) -> None:
    """The `export` action of `embcache dlrm` (`embcache.dlrm.export`)."""
    from embcache.dlrm.config import TABLE_FORMATS

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
    add_trust_argument(e)
    e.set_defaults(func=_export)


def _export(args) -> int:
    from embcache.dlrm.export import export_command

    return export_command(args)


def _add_predict(sub) -> None:
    """The `predict` action of `embcache dlrm` (`embcache.dlrm.predict`)."""
    p = sub.add_parser("predict", help="click probabilities of a raw file through an export",
                       formatter_class=DefaultsHelpFormatter,
                       description="Score a raw file through `dlrm export`'s directory, batch by batch, with the "
                                   "parsing and dense transform of `data prepare`: Criteo text lines (40 fields "
                                   "with the label, 39 without; .gz too), or a CSV (.gz too) / Parquet file with a "
                                   "column per feature of the export (sparse_0, ..., dense_0, ...; 'label' is kept), "
                                   "or for `data prepare own` data the columns it was prepared from, by name, in any "
                                   "file that command reads (.tsv and .txt with a header too). Writes "
                                   "'probability' per row, in order, to --out (.csv or .parquet); values a "
                                   "vocabulary never saw are counted per feature (--strict refuses them).")
    p.add_argument("export", help="the directory `embcache dlrm export --out` wrote")
    p.add_argument("--input", required=True, help="the raw file to score")
    p.add_argument("--out", required=True, help="where the predictions go (.csv or .parquet)")
    p.add_argument("--batch-rows", type=int, default=8192, help="rows scored at a time")
    p.add_argument("--strict", action="store_true",
                   help="refuse a value its feature's vocabulary never saw (naming file, line, feature and value) "
                        "instead of scoring it as missing; without it such values are counted per feature")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    p.set_defaults(func=_predict)


def _predict(args) -> int:
    from embcache.data.results_file import check_output
    from embcache.dlrm.predict import predict_command

    check_output(args.out, "predictions")  # before the export is loaded and the input scored
    return predict_command(args)


def _chosen_cache_ratio(args, cfg, data_dir: Path) -> float:
    """The ratio of `--cache-ratio auto` (the planner's choice) or `fit` (the default:
    `embcache.dlrm.cache_fit`), logged (by rank 0) in one line."""
    import logging
    import os

    from embcache.cache.choices import resolve_bookkeeping
    from embcache.cache.planning.planner import auto_cache_ratio, default_device_memory
    from embcache.dlrm.cache_fit import fit_cache_ratio

    memory, source = (args.device_memory, "--device-memory") if args.device_memory else \
        default_device_memory(cfg.resolved_device())
    bookkeeping = resolve_bookkeeping(cfg.bookkeeping, cfg.resolved_device(), cfg.host_store)
    if cfg.cache_ratio == "fit":
        chosen, why = fit_cache_ratio(data_dir, batch_size=cfg.batch_size, prefetch_depth=cfg.prefetch_depth,
                                      embedding_dim=cfg.embedding_dim, optimizer=cfg.sparse_optimizer,
                                      eviction=cfg.eviction, bookkeeping=bookkeeping, device_memory=memory,
                                      memory_source=source)
    else:
        chosen, why = auto_cache_ratio(data_dir, embedding_dim=cfg.embedding_dim, optimizer=cfg.sparse_optimizer,
                                       eviction=cfg.eviction, batch_size=cfg.batch_size,
                                       warmup_ratio=cfg.warmup_ratio, device_memory=memory, seed=cfg.seed,
                                       prefetch_depth=cfg.prefetch_depth, admission=cfg.admission,
                                       bookkeeping=bookkeeping)
        why = f"{why} ({source})"
    if int(os.environ.get("RANK", "0")) == 0:
        logging.getLogger("embcache.dlrm.trainer").info(why)
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

    from embcache.data.staging import shared_output

    out = builtin_data_dir(args)
    if args.data == "synthetic":  # made whole or not at all (Ctrl-C, a full disk); another run making it: waited for
        from embcache.data.synthetic import generate_synthetic

        return shared_output(out, lambda tmp: generate_synthetic(tmp, rows=args.synthetic_rows,
                                                                 scale=args.synthetic_scale, seed=args.seed),
                             "generating synthetic Criteo-shaped data")
    if args.data == "ml-100k":
        from embcache.data.movielens_ctr import prepare_ml100k_ctr

        return shared_output(out, prepare_ml100k_ctr, "preparing MovieLens-100k as CTR")
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
    from embcache.dlrm.trainer import DLRMConfig, DLRMTrainer

    values = config_values(args, DLRMConfig)
    epochs = values.pop("epochs")
    cfg = DLRMConfig(**{**values, "cache_ratio": "fit" if values["cache_ratio"] is None else values["cache_ratio"],
                        "prefetch_depth": 0 if args.no_prefetch else args.prefetch_depth,
                        **({} if epochs is None else {"epochs": epochs})})
    try:
        cfg.resolved_device()
        refuse_idle_day_options(cfg, epochs)
        refuse_existing_run(args, "dlrm")
        apply_threads(args)
        data_dir = _prepared_once(args)
        if cfg.cache_ratio in ("auto", "fit"):
            cfg.cache_ratio = _chosen_cache_ratio(args, cfg, data_dir) if cfg.sparse == "cached" \
                else DLRMConfig.cache_ratio
        summary, _ = run_launched(cfg, lambda: DLRMTrainer(cfg, data_dir).fit())
    except ValueError as err:
        raise UserFacingError(str(err)) from None
    except OSError as err:  # an unwritable --data-cache or --checkpoint-dir, a full disk
        from embcache.errors import describe_os_error

        raise UserFacingError(describe_os_error(err)) from None
    print_summary(summary_rows(summary), summary)
    return 0


def refuse_idle_day_options(cfg, epochs: int | None = None) -> None:
    """Options that act only beside `--days` (or, for `--eval-every` in a `--days` run, beside
    `--eval-next-day`), refused in one line before any data is prepared: `--eval-every`
    without a next day to score printed "trained (no next day evaluated)" every N steps and
    evaluated nothing, and `--allow-test-days` alone passed unremarked. `epochs`, the
    `--epochs` given (None: not given), is refused beside a `--days` that counts other days:
    the days won, without a word."""
    if cfg.days is not None and epochs is not None and epochs != cfg.epochs:
        raise ValueError(f"--epochs {epochs} and --days {cfg.days}: a --days run trains one epoch a day ({cfg.epochs} "
                         f"here); leave out --epochs")
    if cfg.days is None:
        alone = [flag for flag, on in (("--eval-next-day", cfg.eval_next_day),
                                       ("--allow-test-days", cfg.allow_test_days)) if on]
        if alone:
            raise ValueError(f"{' and '.join(alone)} {'needs' if len(alone) == 1 else 'need'} --days A-B")
    elif cfg.eval_every and not cfg.eval_next_day:
        raise ValueError("--eval-every in a --days run scores the next day: add --eval-next-day (without it the "
                         "run evaluates nothing)")


def evaluate(args) -> int:
    from embcache.dlrm.config import parse_day_range
    from embcache.dlrm.trainer import DLRMConfig, DLRMTrainer, scores_text
    from embcache.train.precision import describe as describe_precision
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
    print(f"{args.split}: {scores_text(result)}  ({result['samples']:,} samples, step {ckpt['step']})")
    if cfg.days and args.split in {f"day_{d}" for d in parse_day_range(cfg.days)}:
        print(f"warning: {args.split} is one of the days this run trains on (--days {cfg.days}): its score is of "
              f"rows seen in training, not of a day to come", file=sys.stderr)
    print(f"trained with precision {describe_precision(ckpt.get('precision'))}; evaluated in "
          f"{'bf16' if cfg.precision == 'bf16' else 'float32'}")
    print(json.dumps({"split": args.split, "step": ckpt["step"], **result,
                      "trained_precision": ckpt.get("precision") or "fp32"}, default=float))
    return 0


def _check_same_data(path: Path, ckpt: dict, data_dir: Path) -> None:
    """A checkpoint evaluates only on the data it was trained on (or a copy): one line naming
    the difference otherwise (not the resume's wording: nothing resumes here)."""
    from embcache.data.ctr_format import read_meta
    from embcache.dlrm.trainer import data_difference, data_differs, data_fingerprint

    saved = ckpt.get("data")
    if saved is None:
        return
    now = data_fingerprint(read_meta(data_dir))
    if data_differs(saved, now):
        raise ValueError(f"{path} was trained on other data than {data_dir} ({data_difference(saved, now)}); "
                         f"evaluate it on its own data (leave out --data) or a copy of it")


def summary_rows(s: dict) -> list[tuple[str, str]]:
    from embcache.units import format_bytes

    scored = [d for d in s.get("next_day", []) if "auc" in d]
    if scored:  # --days --eval-next-day: each day's score on the next
        rows = [("next-day AUC", "  ".join(f"{d['split']} {_score(d, 'auc')}" for d in scored)),
                ("next-day log loss", "  ".join(f"{d['split']} {_score(d, 'logloss')}" for d in scored))]
    else:
        unscored = {"not_scored": s["val_not_scored"]} if "val_not_scored" in s else {}
        rows = [("validation AUC", _score({"auc": s.get("val_auc"), **unscored}, "auc")),
                ("validation log loss", _score({"logloss": s.get("val_logloss"), **unscored}, "logloss"))]
    rows += [("model", "DLRM in plain torch" if s.get("arch") == "torch" else "torchrec's DLRM"),
             ("sparse part", f"{s['sparse']} on {s['device']}"), ("precision", s.get("precision", "fp32"))]
    if "kernels" in s:
        rows.append(("embedding kernels", s["kernels"] + (" under Triton's interpreter: a check of the results, not "
                                                          "a speed" if s.get("kernels_interpreted") else "")))
    if s["sparse"] == "cached":
        rows += [("cache", f"{s['cache_rows']:,} of {s['table_rows']:,} rows "
                           f"({s['cache_rows'] / s['table_rows']:.2%})"),
                 ("cache hit rate", f"{s['hit_rate']:.4f}" + _every_row_held(s)),
                 ("bytes host->device", format_bytes(s["bytes_h2d"])),
                 ("bytes device->host", format_bytes(s["bytes_d2h"])),
                 ("overflow rows", f"{s['overflow_rows']:,}")]
        if "live_keys" in s:
            rows.append(("open tables", f"{s['live_keys']:,} keys held, {s['new_keys']:,} made, {s['retired_keys']:,} "
                                        f"retired; key index {format_bytes(s['key_index_bytes'])}"))
        if s.get("bypassed_rows"):
            rows.append(("rows served beside the cache", f"{s['bypassed_rows']:,} (declined by admission control)"))
    if "comm_bytes_per_step" in s:
        c = s["comm_bytes_per_step"]
        rows.append(("sent between ranks", f"{format_bytes(sum(c.values()))} a step (ids {format_bytes(c['ids'])}, "
                                           f"pooled {format_bytes(c['pooled'])} + their gradients, dense all-reduce "
                                           f"{format_bytes(c['dense_allreduce'])})"))
    return rows + run_rows(s)


def _every_row_held(s: dict) -> str:
    """Beside the hit rate of a cache holding every row: its misses are each row's first use,
    which no cache size avoids (0.86 reads as a cache too small otherwise). Not for open
    tables, whose keys beyond those expected are rows the cache may not hold."""
    if s.get("cache_ratio") == 1 and s["cache_rows"] >= s["table_rows"] and "live_keys" not in s \
            and not s.get("bypassed_rows"):
        return " (every miss a row's first use: the cache holds every row)"
    return ""


def _score(d: dict, key: str) -> str:
    """A score to four places; `n/a (why)` where the split had nothing to score; `-` where
    nothing was evaluated."""
    if d.get(key) is not None:
        return f"{d[key]:.4f}"
    return f"n/a ({d['not_scored']})" if d.get("not_scored") else "-"
