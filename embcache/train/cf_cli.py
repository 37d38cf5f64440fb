"""`embcache cf`: collaborative filtering (SimpleX, MF-CCL) trained on the CPU by the HEAT
kernels (tiled, multithreaded, lock-free SGD), or by the batched PyTorch reference for
comparison. Data: MovieLens-100k (the default; the offline copy, fetched once), a synthetic
Gowalla-scale set, a LightGCN-format directory (train.txt/test.txt: Gowalla, Yelp2018,
Amazon-Books) or a MovieLens ratings file (u.data, ratings.dat). Evaluation ranks all items
for every test user (training items masked): Recall@k and NDCG@k."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from embcache.arg_types import (
    finite_float,
    fraction,
    non_negative_float,
    non_negative_int,
    open_fraction,
    positive_float,
    positive_int,
)
from embcache.errors import UserFacingError

DATA_CHOICES = "'ml-100k', 'synthetic', a LightGCN directory (train.txt, test.txt) or a MovieLens ratings file"


def build_parser(prog: str) -> argparse.ArgumentParser:
    from cpu_kernels.heat import HeatOptions
    from cpu_kernels.model import MODELS, CFConfig
    from cpu_kernels.torch_reference import TorchOptions

    c, h = CFConfig(), HeatOptions()
    parser = argparse.ArgumentParser(prog=prog, description=__doc__)
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    fmt = argparse.ArgumentDefaultsHelpFormatter
    p = sub.add_parser("train", help="train SimpleX / MF-CCL and evaluate after each epoch", formatter_class=fmt,
                       description="Train with the HEAT kernels (--engine heat) or the PyTorch reference "
                                   "(--engine torch). A progress bar per epoch, then one line per epoch: seconds, "
                                   "samples/s, loss, Recall@k and NDCG@k on the test split; --metrics-out keeps "
                                   "the same records as JSON lines. Model settings not given on the command line "
                                   "come from --load's file (or --resume's checkpoint) when there is one, else from the "
                                   "defaults shown. --checkpoint-dir keeps a checkpoint of the last epoch; --resume "
                                   "continues a stopped or killed run from it. "
                                   "Published per-dataset settings: datasets/<name>/README.md.")
    _data_args(p)
    p.add_argument("--model", choices=MODELS, default=None,
                   help=f"simplex: user side g*u + (1-g)*W*mean(history); mf-ccl: the user row (default {c.model})")
    p.add_argument("--engine", choices=("heat", "torch"), default="heat",
                   help="heat: numba kernels (SGD); torch: batched PyTorch reference (Adam)")
    p.add_argument("--dim", type=positive_int, default=None, help=f"embedding dimension (default {c.dim})")
    p.add_argument("--negatives", type=positive_int, default=None,
                   help=f"K uniformly sampled negatives per training pair (default {c.negatives})")
    p.add_argument("--margin", type=finite_float, default=None,
                   help=f"m: negatives with cosine above m are pushed away (default {c.margin})")
    p.add_argument("--neg-weight", type=non_negative_float, default=None,
                   help=f"w: weight of the mean negative term (default {c.neg_weight})")
    p.add_argument("--gamma", type=fraction, default=None,
                   help=f"SimpleX: weight g of the user row against the history (default {c.gamma})")
    p.add_argument("--history", type=non_negative_int, default=None,
                   help=f"SimpleX: most history items per user, drawn once (default {c.history})")
    p.add_argument("--epochs", type=non_negative_int, default=20,
                   help="passes over the training pairs (0: only evaluate)")
    p.add_argument("--lr", type=positive_float, default=None,
                   help=f"learning rate (default {h.lr} for heat's SGD, {TorchOptions.lr:g} for torch's Adam)")
    p.add_argument("--threads", type=positive_int, default=None, help="CPU threads (default: all cores)")
    p.add_argument("--seed", type=non_negative_int, default=None, help=f"initial rows, histories, order, negatives "
                                                          f"(default {c.seed})")
    p.add_argument("--tile", type=non_negative_int, default=h.tile,
                   help="heat: items per thread tile that negatives are drawn from (sized for a private L2)")
    p.add_argument("--refresh", type=positive_int, default=h.refresh,
                   help="heat: samples between two tiles of a thread")
    p.add_argument("--no-tiling", action="store_true", help="heat: draw negatives from all items")
    p.add_argument("--w-sync", type=positive_int, default=h.w_sync,
                   help="heat, SimpleX: samples between two applications of a thread's W gradient")
    p.add_argument("--batch-size", type=positive_int, default=1024, help="torch: training pairs per Adam step")
    p.add_argument("--eval-every", type=positive_int, default=1, help="evaluate every N epochs (and after the last)")
    p.add_argument("--metrics-out", default=None, metavar="FILE", help="JSON-lines metrics log (appended)")
    p.add_argument("--save", default=None, metavar="FILE", help="write the embeddings (.npy, .npz or .parquet)")
    p.add_argument("--load", default=None, metavar="FILE", help="start from saved embeddings (and their settings)")
    p.add_argument("--checkpoint-dir", default=None, metavar="DIR",
                   help="write a checkpoint here after every epoch (atomically: a killed run loses at most "
                        "the epoch it was in)")
    p.add_argument("--resume", action="store_true",
                   help="continue from the checkpoint in --checkpoint-dir up to --epochs; settings not given "
                        "come from the checkpoint")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=train)

    e = sub.add_parser("evaluate", help="evaluate saved embeddings", formatter_class=fmt,
                       description="Load embeddings written by `train --save` and report Recall@k / NDCG@k on "
                                   "the test split of --data (which must be the data they were trained on), "
                                   "next to the popularity baseline.")
    e.add_argument("load", metavar="FILE", help="embeddings file (.npy, .npz or .parquet)")
    _data_args(e)
    e.add_argument("--threads", type=positive_int, default=None, help="CPU threads (default: all cores)")
    e.set_defaults(func=evaluate)
    return parser


def _data_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", default="ml-100k", help=DATA_CHOICES)
    p.add_argument("--split", choices=("random", "time"), default="random",
                   help="ratings only: per user, a seeded random 20 %% or the latest 20 %% is the test set")
    p.add_argument("--test-fraction", type=open_fraction, default=0.2,
                   help="ratings and synthetic: test share per user, strictly between 0 and 1")
    p.add_argument("--split-seed", type=non_negative_int, default=0,
                   help="ratings and synthetic: seed of the split and data")
    p.add_argument("--min-rating", type=non_negative_int, default=0, help="ratings: keep ratings >= this (0: all)")
    p.add_argument("--synthetic-users", type=positive_int, default=30_000)
    p.add_argument("--synthetic-items", type=positive_int, default=40_000)
    p.add_argument("--synthetic-interactions", type=positive_int, default=1_000_000)
    p.add_argument("--skip-bad-lines", action="store_true",
                   help="skip and count malformed input lines instead of stopping at the first")
    p.add_argument("-k", "--k", type=positive_int, nargs="+", default=[20], help="cut-offs of Recall@k and NDCG@k")
    p.add_argument("--topk", choices=("auto", "torch", "faiss"), default="auto", help="top-k back-end")


def load_data(args):
    """`Interactions` for --data. Bad input (a malformed line, a split with no training
    pairs, data too large for memory) raises a one-line `UserFacingError` naming the file;
    an empty test split is allowed, with a warning: its metrics are reported as null."""
    from embcache.errors import DataFormatError

    try:
        data = _read_data(args)
    except DataFormatError:
        raise
    except (ValueError, OSError) as err:
        raise UserFacingError(f"{args.data}: {err}") from None
    except MemoryError as err:
        raise UserFacingError(f"{args.data}: out of memory reading the data ({err}); are the ids dense, "
                              f"0..n-1?") from None
    where = args.data if args.data in ("ml-100k", "synthetic") else Path(args.data)
    if data.num_train == 0:
        raise UserFacingError(f"{where}: no training interactions after the split ({data.num_test:,} in test; "
                              f"--min-rating {args.min_rating}, --test-fraction {args.test_fraction:g}): "
                              f"nothing to train on")
    if data.num_test == 0:
        print(f"warning: {where}: the test split is empty, so Recall and NDCG cannot be computed: they are "
              f"reported as null", file=sys.stderr)
    return data


def _read_data(args):
    from embcache.data.bad_rows import BadRowLog
    from embcache.data.cf.lightgcn import read_lightgcn
    from embcache.data.cf.ratings import load_ml100k, read_ratings, split_ratings

    spec = args.data
    if spec == "ml-100k":
        return load_ml100k(None, args.split, args.split_seed, args.test_fraction, args.min_rating)
    if spec == "synthetic":
        from embcache.data.cf.synthetic import power_law_interactions

        return power_law_interactions(args.synthetic_users, args.synthetic_items, args.synthetic_interactions,
                                      seed=args.split_seed, test_fraction=args.test_fraction)
    path = Path(spec)
    log = BadRowLog() if args.skip_bad_lines else None
    if path.is_dir():
        if (path / "train.txt").exists() or (path / "test.txt").exists():
            data = read_lightgcn(path, skip_bad=args.skip_bad_lines)
            _report_bad(data.bad_rows)
            return data
        for name in ("u.data", "ratings.dat"):
            if (path / name).is_file():
                path = path / name
                break
        else:
            if (path / "ml-100k.inter").is_file():
                return load_ml100k(path, args.split, args.split_seed, args.test_fraction, args.min_rating)
            raise UserFacingError(f"{path}: no train.txt/test.txt (LightGCN format), u.data or ratings.dat here")
    elif not path.exists():
        raise UserFacingError(f"{path}: no such file or directory (--data takes {DATA_CHOICES})")
    ratings = read_ratings(path, log)
    if log is not None:
        _report_bad(log)
    return split_ratings(ratings, args.split, args.test_fraction, args.split_seed, args.min_rating,
                         name=path.name, bad_rows=log)


def _report_bad(log) -> None:
    if log is not None and log.total:
        log.report()


def make_config(args, saved=None):
    """CFConfig from the flags given; those not given come from `saved` (a loaded file's
    settings) or the defaults."""
    from dataclasses import asdict

    from cpu_kernels.model import CFConfig

    values = asdict(saved) if saved is not None else {}
    for name in ("model", "dim", "negatives", "margin", "neg_weight", "gamma", "history", "seed"):
        given = getattr(args, name, None)
        if given is not None:
            values[name] = given
    return CFConfig(**values)


def train(args) -> int:
    from dataclasses import asdict

    from cpu_kernels.heat import HeatOptions, compile_kernels, max_threads
    from cpu_kernels.model import CFConfig, CFParams
    from cpu_kernels.torch_reference import TorchOptions
    from embcache.data.cf.embeddings_file import FORMATS, load, load_params, save
    from embcache.train import cf_checkpoint
    from embcache.train.cf import fit, make_engine
    from embcache.train.cf_eval import evaluate_params as eval_params
    from embcache.train.cf_eval import popularity
    from embcache.errors import TrainingDiverged
    from embcache.train.metrics import MetricsLog

    if args.save and Path(args.save).suffix not in FORMATS:
        raise UserFacingError(f"{args.save}: embeddings are saved as {', '.join(FORMATS)}")
    if args.threads is not None and not 1 <= args.threads <= max_threads():
        raise UserFacingError(f"--threads must be in 1..{max_threads()} on this machine")
    if args.resume and not args.checkpoint_dir:
        raise UserFacingError("--resume needs --checkpoint-dir")
    if args.resume and args.load:
        raise UserFacingError("--resume and --load both give starting embeddings: choose one")
    data = load_data(args)
    print(data.summary())
    try:
        ck = cf_checkpoint.load(args.checkpoint_dir) if args.resume else None
        saved = load(args.load)[3] if args.load else (CFConfig(**ck["config"]) if ck else None)
        config = make_config(args, saved)
        if args.load:
            params = load_params(args.load, data.num_items, data.train_indptr, data.train_indices, config)
        else:
            params = CFParams.init(config, data.num_users, data.num_items, data.train_indptr, data.train_indices)
        # `is None`, not `or`: a given --lr is never replaced (the parser refuses <= 0)
        heat = HeatOptions(lr=HeatOptions.lr if args.lr is None else args.lr, threads=args.threads,
                           tile=0 if args.no_tiling else args.tile, refresh=args.refresh, w_sync=args.w_sync)
        torch_opts = TorchOptions(lr=TorchOptions.lr if args.lr is None else args.lr, batch_size=args.batch_size,
                                  threads=args.threads)
        engine = make_engine(args.engine, params, data, heat, torch_opts)
        options = engine_options(args.engine, heat, torch_opts)
        done, previous = 0, []
        if ck is not None:
            cf_checkpoint.restore(ck, params, engine, args.engine, options, data)
            done, previous = ck["epochs_done"], ck["records"]
            print(f"resumed from {ck['path']} after epoch {done}")
    except (ValueError, OSError, KeyError) as err:
        raise UserFacingError(str(err)) from None
    except MemoryError as err:
        raise UserFacingError(f"{args.data}: out of memory for the embedding tables of {data.num_users:,} users "
                              f"and {data.num_items:,} items ({err})") from None
    threads = args.threads or max_threads()
    print(f"{config.model} d={config.dim} K={config.negatives} m={config.margin:g} w={config.neg_weight:g}"
          + (f" g={config.gamma:g} H={config.history}" if config.simplex else "")
          + f"; engine {args.engine}"
          + (f" (tile {engine.tile or 'off'})" if args.engine == "heat" else f" (batch {args.batch_size})")
          + f", {threads} thread(s)")
    if args.engine == "heat" and args.epochs > 0:
        seconds = compile_kernels()
        if seconds > 1.0:
            print(f"compiled the HEAT kernels in {seconds:.1f} s (numba caches them for later runs)")
    log = MetricsLog(args.metrics_out)
    run_info = {"data": data.name, "engine": args.engine, "model": config.model, "threads": threads}
    log.write(event="start", **run_info, config=asdict(config), users=data.num_users, items=data.num_items,
              train=data.num_train, test=data.num_test)
    ks = tuple(args.k)

    records = list(previous)

    def on_epoch(rec):
        print(format_epoch(rec, args.epochs, ks), flush=True)
        log.write(event="epoch", **run_info, **rec)
        records.append(rec)
        if args.checkpoint_dir:
            cf_checkpoint.save(args.checkpoint_dir, params, engine, args.engine, options, data, rec["epoch"],
                               records)

    if done >= args.epochs > 0:
        print(f"the checkpoint has {done} epoch(s) already: nothing to train (raise --epochs to go on)")
    try:
        fit(engine, params, data, args.epochs, ks=ks, eval_every=args.eval_every, backend=args.topk,
            progress=not args.no_progress, on_epoch=on_epoch, start_epoch=done)
    except TrainingDiverged as err:
        log.write(event="diverged", **run_info, message=str(err))
        raise UserFacingError(str(err)) from None
    last = records[-1] if records else {}
    final = ({k: v for k, v in last.items() if "@" in k} if f"recall@{ks[0]}" in last
             else eval_params(params, data, ks, args.topk))
    if not records:
        print("evaluation: " + _format_metrics(final, ks))
    baseline = popularity(data, ks, args.topk)
    if args.save:
        try:
            path = save(params, args.save)
        except (ValueError, OSError) as err:
            raise UserFacingError(str(err)) from None
        print(f"saved embeddings to {path}")
    train_s = sum(r["seconds"] for r in records)
    summary = {**run_info, "epochs": args.epochs, "train_seconds": train_s,
               "samples_per_s": sum(r["samples_per_s"] * r["seconds"] for r in records) / train_s if train_s else None,
               **final, "popularity": baseline}
    log.write(event="summary", **summary)
    print(f"summary: {_format_metrics(final, ks)}  (popularity baseline: {_format_metrics(baseline, ks)})"
          + (f"; {train_s:.1f} s training, {summary['samples_per_s']:,.0f} samples/s" if train_s else ""))
    return 0


def evaluate(args) -> int:
    from cpu_kernels.heat import max_threads
    from embcache.data.cf.embeddings_file import load_params
    from embcache.train.cf_eval import evaluate_params as eval_params
    from embcache.train.cf_eval import popularity

    if args.threads is not None:
        import numba

        if not 1 <= args.threads <= max_threads():
            raise UserFacingError(f"--threads must be in 1..{max_threads()} on this machine")
        numba.set_num_threads(args.threads)
    data = load_data(args)
    print(data.summary())
    try:
        params = load_params(args.load, data.num_items, data.train_indptr, data.train_indices)
    except (ValueError, OSError, KeyError) as err:
        raise UserFacingError(str(err)) from None
    except MemoryError as err:
        raise UserFacingError(f"{args.load}: out of memory loading the embeddings ({err})") from None
    ks = tuple(args.k)
    result = eval_params(params, data, ks, args.topk)
    baseline = popularity(data, ks, args.topk)
    print(f"{params.config.model}: {_format_metrics(result, ks)}  (popularity baseline: {_format_metrics(baseline, ks)})")
    print(json.dumps({**result, "popularity": baseline}))
    return 0


def engine_options(engine: str, heat, torch_opts) -> dict:
    """The options a resumed run must share with its checkpoint (threads are checked by
    the HEAT engine itself: each thread's random stream is part of its state)."""
    if engine == "heat":
        return {"lr": heat.lr, "tile": heat.tile, "refresh": heat.refresh, "w_sync": heat.w_sync}
    return {"lr": torch_opts.lr, "batch_size": torch_opts.batch_size}


def _format_metrics(m: dict, ks) -> str:
    if m.get(f"recall@{ks[0]}") is None:
        return "Recall/NDCG not computed (no test users)"
    return "  ".join(f"Recall@{k} {m[f'recall@{k}']:.4f}  NDCG@{k} {m[f'ndcg@{k}']:.4f}" for k in ks)


def format_epoch(rec: dict, epochs: int, ks) -> str:
    s = (f"epoch {rec['epoch']:>3}/{epochs}  {rec['seconds']:7.2f} s  {rec['samples_per_s']:>12,.0f} samples/s  "
         f"loss {rec['loss']:.4f}")
    if f"recall@{ks[0]}" in rec:
        s += "  " + _format_metrics(rec, ks)
    return s
