"""`embcache cf`: collaborative filtering (SimpleX, MF-CCL) trained on the CPU by the HEAT
kernels (tiled, multithreaded, lock-free SGD), or by the batched PyTorch reference for
comparison. Data: MovieLens-100k (the default; the offline copy, fetched once), a synthetic
Gowalla-scale set, a LightGCN-format directory (train.txt/test.txt: Gowalla, Yelp2018,
Amazon-Books) or a MovieLens ratings file (u.data, ratings.dat). Evaluation ranks all items
for every test user (training items masked): Recall@k and NDCG@k."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from embcache.arg_types import (
    DefaultsHelpFormatter,
    finite_float,
    fraction,
    non_negative_float,
    non_negative_int,
    open_fraction,
    positive_float,
    positive_int,
)
from embcache.errors import UserFacingError
from embcache.train.run_cli import (
    add_threads_argument,
    apply_threads,
    add_run_arguments,
    config_values,
    print_summary,
    refuse_existing_run,
    run_rows,
)

TRAIN_DESCRIPTION = (
    "Train with the HEAT kernels (--engine heat) or the PyTorch reference (--engine torch). A progress bar per "
    "epoch, then one line per epoch: seconds, samples/s, loss, Recall@k and NDCG@k on the test split; "
    "--metrics-out keeps the same records as JSON lines. Model settings not given on the command line come from "
    "--load's file (or --resume's checkpoint) when there is one, else from the defaults shown. --checkpoint-dir "
    "keeps a checkpoint of the last epoch; --resume continues a stopped or killed run from it. Published "
    "per-dataset settings: datasets/<name>/README.md.")


def build_parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__)
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    fmt = DefaultsHelpFormatter
    p = sub.add_parser("train", help="train SimpleX / MF-CCL and evaluate after each epoch", formatter_class=fmt,
                       description=TRAIN_DESCRIPTION)
    _data_args(p)
    _model_args(p)
    _engine_args(p)
    p.add_argument("--eval-every", type=positive_int, default=1, help="evaluate every N epochs (and after the last)")
    p.add_argument("--save", default=None, metavar="FILE", help="write the embeddings (.npy, .npz or .parquet) (default: not saved)")
    p.add_argument("--load", default=None, metavar="FILE", help="start from saved embeddings (and their settings) (default: fresh rows drawn from --seed)")
    add_run_arguments(p, "cf", epochs=20, epochs_help="passes over the training pairs (0: only evaluate)",
                      min_epochs=0, stepwise=False, device=False, threads=False, seed=None,
                      seed_help="initial rows, histories, order, negatives (default 0, or the --load file's / "
                                "checkpoint's)")
    p.set_defaults(func=train)

    e = sub.add_parser("evaluate", help="evaluate saved embeddings or a checkpoint", formatter_class=fmt,
                       description="Load embeddings written by `train --save` (or the checkpoint of `train "
                                   "--checkpoint-dir`) and report Recall@k / NDCG@k on the test split of --data "
                                   "(which must be the data they were trained on), next to the popularity "
                                   "baseline.")
    e.add_argument("load", metavar="FILE", help="embeddings file (.npy, .npz or .parquet), or a checkpoint "
                                                "(cf-last.pt, or the --checkpoint-dir holding it)")
    _data_args(e)
    add_threads_argument(e, "CPU threads")
    e.set_defaults(func=evaluate)
    return parser


def _model_args(p: argparse.ArgumentParser) -> None:
    """The model's settings; None (not given) means the --load file's or the checkpoint's,
    else the default shown."""
    from cpu_kernels.model import MODELS, NEGATIVE_RULES, CFConfig

    c = CFConfig()
    p.add_argument("--model", choices=MODELS, default=None,
                   help=f"simplex: user side g*u + (1-g)*W*mean(history); mf-ccl: the user row (default {c.model})")
    p.add_argument("--dim", type=positive_int, default=None, help=f"embedding dimension (default {c.dim})")
    p.add_argument("--negatives", type=negatives_count, default=None,
                   help=f"K uniformly sampled negatives per training pair (default {c.negatives})")
    p.add_argument("--negatives-from", choices=NEGATIVE_RULES, default=None,
                   help=f"unseen: negatives are items the user has no training pair with; all: any item, the "
                        f"rule before (default {c.negatives_from})")
    p.add_argument("--margin", type=finite_float, default=None,
                   help=f"m: negatives with cosine above m are pushed away (default {c.margin})")
    p.add_argument("--neg-weight", type=non_negative_float, default=None,
                   help=f"w: weight of the mean negative term (default {c.neg_weight})")
    p.add_argument("--gamma", type=fraction, default=None,
                   help=f"SimpleX: weight g of the user row against the history (default {c.gamma})")
    p.add_argument("--history", type=non_negative_int, default=None,
                   help=f"SimpleX: most history items per user, drawn once (default {c.history})")


def negatives_count(text: str) -> int:
    """--negatives is K, a count; the rule has its own flag, and a rule given here is told so."""
    from cpu_kernels.model import NEGATIVE_RULES

    if text in NEGATIVE_RULES:
        raise argparse.ArgumentTypeError(f"is the number K of negatives; for the rule write --negatives-from {text}")
    return positive_int(text)


def _engine_args(p: argparse.ArgumentParser) -> None:
    from cpu_kernels.options import KERNELS, HeatOptions, TorchOptions

    h = HeatOptions()
    p.add_argument("--engine", choices=("heat", "torch"), default="heat",
                   help="heat: numba kernels (SGD); torch: batched PyTorch reference (Adam)")
    p.add_argument("--lr", type=positive_float, default=None,
                   help=f"learning rate (default {h.lr} for heat's SGD, {TorchOptions.lr:g} for torch's Adam)")
    add_threads_argument(p, "CPU threads of the engine and the evaluation")
    p.add_argument("--tile", type=non_negative_int, default=h.tile,
                   help="heat: items per thread tile that negatives are drawn from (sized for a private L2); "
                        "0: untiled, as --no-tiling")
    p.add_argument("--refresh", type=positive_int, default=h.refresh,
                   help="heat: samples between two tiles of a thread")
    p.add_argument("--no-tiling", action="store_true", help="heat: draw negatives from all items")
    p.add_argument("--w-sync", type=positive_int, default=h.w_sync,
                   help="heat, SimpleX: samples between two applications of a thread's W gradient")
    p.add_argument("--kernel", choices=KERNELS, default=h.kernel,
                   help="heat: runs (SimpleX's user side once per run of a user's samples) or sample (every "
                        "sample its own user side, in a plain shuffle: the kernel before runs)")
    p.add_argument("--user-run", type=positive_int, default=h.user_run,
                   help="heat --kernel runs, SimpleX: most samples of one user in a run (1: a plain shuffle)")
    p.add_argument("--batch-size", type=positive_int, default=TorchOptions.batch_size,
                   help="torch: training pairs per Adam step")


def _data_args(p: argparse.ArgumentParser) -> None:
    from embcache.data.cf.sources import DATA_CHOICES

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


def data_config(args):
    """A `CFTrainConfig` holding only what --data and its options say (for reading the data)."""
    from embcache.train.cf import CFTrainConfig

    names = ("data", "split", "test_fraction", "split_seed", "min_rating", "synthetic_users", "synthetic_items",
             "synthetic_interactions", "skip_bad_lines")
    return CFTrainConfig(**{n: getattr(args, n) for n in names}, ks=tuple(args.k), topk=args.topk)


def saved_model_settings(args) -> dict:
    """The model settings of --load's file or --resume's checkpoint ({} without either)."""
    from embcache.train.cf import MODEL_SETTINGS

    if args.load:
        from dataclasses import asdict

        from embcache.data.cf.embeddings_file import load

        return asdict(load(args.load)[3])
    if args.resume and args.checkpoint_dir:
        from embcache.checkpoint import load_checkpoint
        from embcache.train.run import checkpoint_in

        path = checkpoint_in(args.checkpoint_dir, "cf")
        if path.is_file():
            saved = load_checkpoint(path, kind="cf")["config"]
            # a checkpoint from before issue 23 drew negatives from all items (as CFTrainer's
            # upgrade_checkpoint says too): it resumes that way, not under the new default
            saved.setdefault("negatives_from", "all")
            return {k: saved[k] for k in MODEL_SETTINGS if k in saved}
    return {}


def make_config(args):
    """The run's `CFTrainConfig`: model settings from the flags given, else from --load's
    file or the checkpoint, else the defaults."""
    from embcache.train.cf import MODEL_SETTINGS, CFTrainConfig

    values = config_values(args, CFTrainConfig)
    model = saved_model_settings(args)
    model.update({k: values[k] for k in MODEL_SETTINGS if values.get(k) is not None})
    values = {k: v for k, v in values.items() if k not in MODEL_SETTINGS or v is not None}
    return CFTrainConfig(**{**values, **model, "ks": tuple(args.k), "tile": 0 if args.no_tiling else args.tile})


def train(args) -> int:
    from embcache.data.cf.embeddings_file import FORMATS, save
    from embcache.train.cf import CFTrainer, load_interactions
    from embcache.train.cf_eval import format_metrics

    if args.save and Path(args.save).suffix not in FORMATS:
        raise UserFacingError(f"{args.save}: embeddings are saved as {', '.join(FORMATS)}")
    if args.resume and args.load:
        raise UserFacingError("--resume and --load both give starting embeddings: choose one")
    refuse_existing_run(args, "cf")
    from cpu_kernels.heat import max_threads

    if args.threads is not None and not 1 <= args.threads <= max_threads():
        raise UserFacingError(f"--threads must be in 1..{max_threads()} on this machine")
    apply_threads(args)  # the engine's and the evaluation's torch work
    data = load_interactions(data_config(args))
    print(data.summary())
    try:
        cfg = make_config(args)
        trainer = CFTrainer(cfg, data)
    except (ValueError, OSError, KeyError) as err:
        raise UserFacingError(str(err)) from None
    except MemoryError as err:
        raise UserFacingError(f"{args.data}: out of memory for the embedding tables of {data.num_users:,} users "
                              f"and {data.num_items:,} items ({err})") from None
    print(describe_run(trainer))
    summary = trainer.fit()
    if not trainer.history:
        print("evaluation: " + format_metrics(summary, cfg.ks))
    if args.save:
        try:
            print(f"saved embeddings to {save(trainer.params, args.save)}")
        except (ValueError, OSError) as err:
            raise UserFacingError(str(err)) from None
    print_summary(summary_rows(summary, cfg.ks), summary)
    return 0


def describe_run(trainer) -> str:
    """One line: the model, the engine and the threads."""
    c, cfg = trainer.config, trainer.cfg
    return (f"{c.model} d={c.dim} K={c.negatives} ({c.negatives_from}) m={c.margin:g} w={c.neg_weight:g}"
            + (f" g={c.gamma:g} H={c.history}" if c.simplex else "")
            + f"; engine {cfg.engine}"
            + (f" (tile {trainer.engine.tile or 'off'})" if cfg.engine == "heat" else f" (batch {cfg.batch_size})")
            + f", {trainer.threads} thread(s)")


def summary_rows(s: dict, ks) -> list[tuple[str, str]]:
    from embcache.train.cf_eval import format_metrics

    return [("test split", format_metrics(s, ks)), ("popularity baseline", format_metrics(s["popularity"], ks)),
            ("model", f"{s['model']} on {s['data']}, engine {s['engine']}, {s['threads']} thread(s)"),
            *run_rows(s)]


def evaluate(args) -> int:
    from cpu_kernels.heat import max_threads
    from embcache.data.cf.embeddings_file import load_params
    from embcache.train.cf import load_interactions
    from embcache.train.cf_eval import evaluate_params, format_metrics, popularity

    if args.threads is not None and not 1 <= args.threads <= max_threads():
        raise UserFacingError(f"--threads must be in 1..{max_threads()} on this machine")
    apply_threads(args)
    data = load_interactions(data_config(args))
    print(data.summary())
    try:
        if Path(args.load).suffix == ".pt" or Path(args.load).is_dir():
            from embcache.train.cf import params_from_checkpoint

            params = params_from_checkpoint(args.load, data)
        else:
            params = load_params(args.load, data.num_items, data.train_indptr, data.train_indices)
    except UserFacingError:
        raise
    except (ValueError, OSError, KeyError) as err:
        raise UserFacingError(str(err)) from None
    except MemoryError as err:
        raise UserFacingError(f"{args.load}: out of memory loading the embeddings ({err})") from None
    ks = tuple(args.k)
    result = evaluate_params(params, data, ks, args.topk)
    baseline = popularity(data, ks, args.topk)
    print(f"{params.config.model}: {format_metrics(result, ks)}  (popularity baseline: {format_metrics(baseline, ks)})")
    print(json.dumps({**result, "popularity": baseline}))
    return 0
