"""`embcache cf`: collaborative filtering (SimpleX, MF-CCL) trained on the CPU by the HEAT
kernels (tiled, multithreaded, lock-free SGD), or by the batched PyTorch reference for
comparison. Data (--data): your own CSV, TSV or Parquet file of interactions (--user-col,
--item-col, optionally --time-col and --rating-col; any ids), MovieLens-100k (the default;
the offline copy, fetched once), a synthetic Gowalla-scale set, a LightGCN-format directory
(train.txt/test.txt: Gowalla, Yelp2018, Amazon-Books) or a MovieLens ratings file (u.data,
ratings.dat). Evaluation ranks all items
for every test user (training items masked): Recall@k and NDCG@k."""
from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from embcache.arg_types import DefaultsHelpFormatter, positive_int
from embcache.errors import UserFacingError
from embcache.paths import check_output_file
from embcache.safe_load import add_trust_argument
from embcache.settings_fields import add_config_arguments, config_values
from embcache.cf.config import negatives_count  # noqa: F401 (its home before)
from embcache.train.run_cli import (
    add_threads_argument,
    apply_threads,
    add_run_arguments,
    print_summary,
    refuse_existing_run,
    run_rows,
)

logger = logging.getLogger(__name__)

TRAIN_DESCRIPTION = (
    "Train with the HEAT kernels (--engine heat) or the PyTorch reference (--engine torch). A progress bar per "
    "epoch, then one line per epoch: seconds, samples/s, loss, Recall@k and NDCG@k on the test split; "
    "--metrics-out keeps the same records as JSON lines. Model settings not given on the command line come from "
    "--load's file (or --resume's checkpoint) when there is one, else from the defaults shown. --checkpoint-dir "
    "keeps a checkpoint of the last epoch; --resume continues a stopped or killed run from it. Published "
    "per-dataset settings: datasets/<name>/README.md.")


def build_parser(prog: str) -> argparse.ArgumentParser:
    from embcache.cf.config import MODEL_FLAGS, CFTrainConfig

    parser = argparse.ArgumentParser(prog=prog, description=__doc__)
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    fmt = DefaultsHelpFormatter
    p = sub.add_parser("train", help="train SimpleX / MF-CCL and evaluate after each epoch", formatter_class=fmt,
                       description=TRAIN_DESCRIPTION)
    # the settings are CFTrainConfig's fields (`embcache.settings_fields`); a model setting left
    # out is --load's file's or the checkpoint's, else the field's (`make_config`)
    _data_args(p)
    add_config_arguments(p, CFTrainConfig, MODEL_FLAGS, unset=MODEL_FLAGS, unset_note=FROM_SAVED)
    add_config_arguments(p, CFTrainConfig, ["engine", "lr", "threads", "tile", "refresh"])
    p.add_argument("--no-tiling", action="store_true", help="heat: draw negatives from all items (--tile 0)")
    add_config_arguments(p, CFTrainConfig, ["w_sync", "kernel", "user_run", "batch_size", "eval_every"])
    p.add_argument("--save", default=None, metavar="FILE",
                   help="write the model: FILE.npz is the whole model (embeddings, histories, each user's "
                        "training items, your ids), what `cf recommend` and `embcache.cf.CFModel.load` use; .npy or "
                        ".parquet: the embeddings alone (default: not saved)")
    p.add_argument("--force", action="store_true", help="replace an existing --save file")
    add_config_arguments(p, CFTrainConfig, ["load"])
    add_run_arguments(p, CFTrainConfig, "cf", threads=False, unset=["seed"], unset_note=FROM_SAVED)
    p.set_defaults(func=train)

    e = sub.add_parser("evaluate", help="evaluate saved embeddings or a checkpoint", formatter_class=fmt,
                       description="Load a model written by `train --save` (or the checkpoint of `train "
                                   "--checkpoint-dir`) and report Recall@k / NDCG@k on the test split of the data "
                                   "it was trained on, next to the popularity baseline. The file records that data "
                                   "and its split (source, columns, split rule and seed): --data and its options "
                                   "default to them, and a split option that differs from the model's is refused "
                                   "(its test rows would include rows the model trained on). A file saved before "
                                   "the record was kept is evaluated on the data the options give.")
    e.add_argument("load", metavar="FILE", help="embeddings file (.npy, .npz or .parquet), or a checkpoint "
                                                "(cf-last.pt, or the --checkpoint-dir holding it)")
    _data_args(e, unset=True)
    add_threads_argument(e, "CPU threads")
    add_trust_argument(e)
    e.set_defaults(func=evaluate)

    r = sub.add_parser("recommend", help="top-k items for users of a saved model (train --save FILE.npz)",
                       formatter_class=fmt,
                       description="Load a model written by `cf train --save FILE.npz` and write each user's k best "
                                   "items with their scores (cosine), their own training items left out, as rows "
                                   "user,rank,item,score: to --out (.csv or .parquet) or to the screen. Users and "
                                   "items are your data's own ids.")
    r.add_argument("model", metavar="MODEL", help="the .npz of `cf train --save`")
    who = r.add_mutually_exclusive_group(required=True)
    who.add_argument("--users", nargs="+", metavar="ID",
                     help="the users to recommend for (default: none; this or --all is needed)")
    who.add_argument("--all", action="store_true", help="every user of the model")
    r.add_argument("--k", type=positive_int, default=10, help="items per user")
    r.add_argument("--include-seen", action="store_true", help="keep the users' own training items")
    r.add_argument("--out", default=None, metavar="FILE", help="write .csv or .parquet (default: print CSV)")
    r.add_argument("--topk", choices=("auto", "torch", "faiss"), default="auto",
                   help="top-k back-end (faiss for a large catalogue, when installed)")
    r.set_defaults(func=recommend)
    return parser


# what a model flag (or --seed) means when it is not given
FROM_SAVED = "(default: {default}, or the --load file's / checkpoint's)"


def _data_args(p: argparse.ArgumentParser, unset: bool = False) -> None:
    """The data flags; with `unset` those a model's record gives default to it (None here)."""
    from embcache.cf.config import DATA_SETTINGS, CFTrainConfig
    from embcache.cf.trained_on import RECORDED

    add_config_arguments(p, CFTrainConfig, DATA_SETTINGS, unset=RECORDED if unset else (),
                         unset_note="(default: the model's, else {default})")


def data_config(args):
    """A `CFTrainConfig` holding only what --data and its options say (for reading the data)."""
    from embcache.cf.config import DATA_SETTINGS, CFTrainConfig

    values = config_values(args, CFTrainConfig)
    return CFTrainConfig(**{n: values[n] for n in DATA_SETTINGS})


def saved_model_settings(args) -> dict:
    """The model settings of --load's file or --resume's checkpoint ({} without either)."""
    from embcache.cf.config import MODEL_SETTINGS

    if args.load:
        from dataclasses import asdict

        from embcache.cf.data.embeddings_file import load

        return asdict(load(args.load)[3])
    if args.resume and args.checkpoint_dir:
        from embcache.cf.trainer import load_cf_checkpoint
        from embcache.train.run import checkpoint_in

        path = checkpoint_in(args.checkpoint_dir, "cf")
        if path.is_file():  # its dim checked against its rows: the run builds tables of that dim first
            saved = load_cf_checkpoint(path)[1]["config"]
            # a checkpoint from before issue 23 drew negatives from all items (as CFTrainer's
            # upgrade_checkpoint says too): it resumes that way, not under the new default
            saved.setdefault("negatives_from", "all")
            return {k: saved[k] for k in MODEL_SETTINGS if k in saved}
    return {}


def make_config(args):
    """The run's `CFTrainConfig`: model settings from the flags given, else from --load's
    file or the checkpoint, else the defaults."""
    from embcache.cf.config import MODEL_SETTINGS, CFTrainConfig

    values = config_values(args, CFTrainConfig)
    model = saved_model_settings(args)
    model.update({k: values[k] for k in MODEL_SETTINGS if values.get(k) is not None})
    values = {k: v for k, v in values.items() if k not in MODEL_SETTINGS or v is not None}
    return CFTrainConfig(**{**values, **model, "tile": 0 if args.no_tiling else args.tile})


def train(args) -> int:
    from embcache.cf.data.embeddings_file import FORMATS, save
    from embcache.cf.trained_on import record
    from embcache.cf.trainer import CFTrainer, load_interactions
    from embcache.cf.evaluation import format_metrics

    if args.save and Path(args.save).suffix not in FORMATS:
        raise UserFacingError(f"{args.save}: embeddings are saved as {', '.join(FORMATS)}")
    if args.save:
        check_output_file(args.save)  # before training: a path that cannot be written would lose the model
    if args.save and not args.force:
        for kept in (Path(args.save), *([Path(args.save + ".json")] if args.save.endswith(".npy") else [])):
            if kept.exists():
                raise UserFacingError(f"{kept} already exists; choose another --save, or replace it with --force")
    if args.resume and args.load:
        raise UserFacingError("--resume and --load both give starting embeddings: choose one")
    refuse_existing_run(args, "cf")
    from cpu_kernels.heat import max_threads

    if args.threads is not None and not 1 <= args.threads <= max_threads():
        raise UserFacingError(f"--threads must be in 1..{max_threads()} on this machine")
    apply_threads(args)  # the engine's and the evaluation's torch work
    data_cfg = data_config(args)
    data = load_interactions(data_cfg)
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
            if Path(args.save).suffix == ".npz":
                from embcache.cf.model import CFModel

                path = CFModel.from_training(trainer.params, data, record(data_cfg, data)).save(args.save)
                print(f"saved the model to {path} (cf recommend {path} --users ...)")
            else:
                path = save(trainer.params, args.save, record(data_cfg, data), (data.user_ids, data.item_ids))
                print(f"saved embeddings to {path}")
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
    from embcache.cf.evaluation import format_metrics

    rows = [("test split", format_metrics(s, ks)), ("popularity baseline", format_metrics(s["popularity"], ks)),
            ("model", f"{s['model']} on {s['data']}, engine {s['engine']}, {s['threads']} thread(s)"),
            *run_rows({k: v for k, v in s.items() if not k.startswith("steady_")})]  # its rows read dlrm's steps
    ours = {"training throughput": throughput_row(s), "CPU time": cpu_row(s)}
    return [(name, ours.get(name) or text) for name, text in rows]


def throughput_row(s: dict) -> str | None:
    """Samples a second over the epochs after this process's first, which is timed apart (it
    carries the warm-up), and where the HEAT kernels' compiling went; None where this process
    ran no epoch of a run that had some (the shared row then stands)."""
    from embcache.units import format_seconds

    first = s.get("first_epoch_seconds")
    if first is None:  # no epoch in this process: the run's own figures where it had any (a finished resume)
        return None if s.get("train_seconds") else "none: no epoch was trained"
    compiled = s.get("compile_seconds")
    compiled = (f"; the HEAT kernels, compiled or loaded from numba's cache, took {format_seconds(compiled)} before "
                f"it, not counted"
                if compiled is not None else "")
    if s.get("steady_samples_per_s"):
        return (f"{s['steady_samples_per_s']:,.0f} samples/s over {s['steady_epochs']:,} epoch(s) after the first "
                f"(the first, timed apart: {format_seconds(first)}, {s['first_epoch_samples_per_s']:,.0f} "
                f"samples/s{compiled})")
    return (f"{s['train_samples_per_s']:,.0f} samples/s over {format_seconds(s['train_seconds'])}, one epoch "
            f"(its warm-up included{compiled})")


def cpu_row(s: dict) -> str | None:
    """CPU time a sample over the epochs after the first, where there are any."""
    steady = s.get("steady_cpu_seconds_per_sample")
    if not steady:
        return None
    return (f"{steady * 1e6:,.1f} µs a sample after the first epoch ({s['train_cpu_seconds']:,.1f} CPU-s in all, "
            f"all threads)")


def evaluate(args) -> int:
    """`cf evaluate`: the model's metrics on the test split of the data it was trained on."""
    from cpu_kernels.heat import max_threads
    from embcache.cf import trained_on
    from embcache.cf.evaluation import evaluate_params, format_metrics, popularity, warn_of_large_k

    if args.threads is not None and not 1 <= args.threads <= max_threads():
        raise UserFacingError(f"--threads must be in 1..{max_threads()} on this machine")
    apply_threads(args)
    loaded = loaded_checkpoint(args.load)  # a damaged or foreign checkpoint stops before any data is read
    if loaded is None and not Path(args.load).is_file():  # as a missing or misnamed embeddings file does
        from embcache.cf.data.embeddings_file import FORMATS

        raise UserFacingError(f"{args.load}: no such embeddings file" if Path(args.load).suffix in FORMATS else
                              f"{args.load}: embeddings are loaded from {', '.join(FORMATS)}")
    data, saved, pairs = evaluation_data(args, loaded)
    params = evaluated_params(args.load, data, loaded)
    if pairs is not None:
        dropped = trained_on.drop_trained_pairs(data, *pairs)
        if dropped:
            print(f"note: {dropped:,} test interactions are among the {len(pairs[1]):,} {args.load} trained on: left "
                  f"out, the model is scored on the {data.num_test:,} it never saw", file=sys.stderr)
    ks = tuple(args.k)
    warn_of_large_k(ks, data.num_items)
    result = evaluate_params(params, data, ks, args.topk)
    baseline = popularity(data, ks, args.topk)
    print(f"{params.config.model}: {format_metrics(result, ks)}  (popularity baseline: {format_metrics(baseline, ks)})")
    print(json.dumps({**result, "popularity": baseline}))
    return 0


def loaded_checkpoint(path: str):
    """(file, checkpoint) where `path` names a cf checkpoint (a .pt file, or the directory of
    one), loaded and checked; None for an embeddings file (its loader checks it)."""
    if Path(path).suffix != ".pt" and not Path(path).is_dir():
        return None
    from embcache.cf.trainer import load_cf_checkpoint

    return load_cf_checkpoint(path)


def evaluation_data(args, loaded=None):
    """(the data to evaluate `args.load` on, its record, its training pairs): the data and
    split the file records, the flags given over them; without a record, the flags alone.
    `loaded`: the checkpoint `args.load` names, read already (`loaded_checkpoint`)."""
    from embcache.cf import trained_on
    from embcache.cf.config import CFTrainConfig
    from embcache.cf.trainer import load_interactions

    if loaded is not None:
        saved, pairs, readable = trained_on.checkpoint_record(loaded[1]["config"]), None, True
    else:
        saved, pairs, readable = trained_on.read_saved(args.load)
    given = {name: getattr(args, name) for name in trained_on.RECORDED if getattr(args, name) is not None}
    settings = trained_on.evaluation_settings(args.load, given, saved)
    if saved is None and readable:
        print(f"note: {args.load} does not record the data it was trained on (saved before models did): evaluated on "
              f"{settings.get('data', 'ml-100k')} as the options give it, which must be that data and split",
              file=sys.stderr)
    data = load_interactions(CFTrainConfig(**settings, ks=tuple(args.k), topk=args.topk))
    print(data.summary())
    trained_on.check_same_data(args.load, saved, data)
    return data, saved, pairs


def evaluated_params(path: str, data, loaded=None):
    """The parameters of the embeddings file or checkpoint `path` (`loaded`: that
    checkpoint, read already), for `data`."""
    from embcache.cf.data.embeddings_file import load_params

    try:
        if loaded is not None or Path(path).suffix == ".pt" or Path(path).is_dir():
            from embcache.cf.trainer import params_from_checkpoint

            return params_from_checkpoint(path, data, loaded)
        return load_params(path, data.num_items, data.train_indptr, data.train_indices)
    except UserFacingError:
        raise
    except (ValueError, OSError, KeyError) as err:
        raise UserFacingError(str(err)) from None
    except MemoryError as err:
        raise UserFacingError(f"{path}: out of memory loading the embeddings ({err})") from None


def recommend(args) -> int:
    """`cf recommend`: rows user, rank, item, score for the users asked."""
    from embcache.cf.model import CFModel

    from embcache.data.results_file import check_output

    out = check_output(args.out, "recommendations") if args.out else None  # before the work, not after it
    try:
        model = CFModel.load(args.model)
    except (ValueError, OSError) as err:
        raise UserFacingError(str(err)) from None
    users = model.user_ids.tolist() if args.all and model.user_ids is not None else \
        list(range(model.num_users)) if args.all else args.users
    rows, short = recommendation_rows(model, users, args)
    if short:
        fewest = min(short.values())
        logger.warning(f"--k {args.k} is more than the items {len(short):,} user(s) have not seen (fewest: "
                       f"{fewest:,}, user {min(short, key=short.get)!r}): they get their unseen items only")
    if out is None:  # CSV as a reader takes it back: an id with a comma or a quote ("Matrix, The") is quoted
        import csv
        import sys

        printed = csv.writer(sys.stdout, lineterminator="\n")
        printed.writerow(["user", "rank", "item", "score"])
        printed.writerows((user, rank, item, f"{score:.6f}") for user, rank, item, score in rows)
        return 0
    from embcache.data.results_file import write_columns

    write_columns({"user": [r[0] for r in rows], "rank": [r[1] for r in rows], "item": [r[2] for r in rows],
                   "score": [r[3] for r in rows]}, out)
    print(f"wrote {len(rows):,} recommendations for {len(users):,} user(s) to {out}")
    return 0


def recommendation_rows(model, users: list, args) -> tuple[list[tuple], dict]:
    """(rows user, rank, item, score; {user: unseen items} of the users with fewer than
    --k unseen items, whose rows stop there rather than go on with seen items scored -inf)."""
    import numpy as np
    from tqdm import tqdm

    rows: list[tuple] = []
    short: dict = {}
    exclude = not args.include_seen
    chunk = 4096
    for lo in tqdm(range(0, len(users), chunk), desc="recommend", unit="chunk", disable=len(users) <= chunk):
        part = users[lo:lo + chunk]
        try:
            index = model.user_index(part)
        except KeyError as err:
            raise UserFacingError(f"{args.model}: {err.args[0]}") from None
        room = model.unseen_counts(index) if exclude else np.full(len(index), model.num_items)
        k = int(min(args.k, room.max(initial=0)))
        top, scores = model.ranked(index, k, exclude, args.topk)
        items = model._item_ids(top)
        for user, its, scs, n in zip(part, items.tolist(), scores.tolist(), room.tolist()):
            if n < args.k and exclude:
                short[user] = n
            rows.extend((user, rank, item, score) for rank, (item, score) in enumerate(zip(its[:n], scs[:n]), 1))
    return rows, short
