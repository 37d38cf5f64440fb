"""`embcache data`: prepare CTR data in the canonical format (Parquet shards + meta.json) that
`embcache dlrm train --data DIR` reads, and look at a prepared directory."""
from __future__ import annotations

import argparse
import json

from embcache.arg_types import DefaultsHelpFormatter, float_in, int_in, positive_float
from embcache.data.defaults import MAX_COUNTED_KEYS, SYNTHETIC_DRIFT, SYNTHETIC_ROWS, SYNTHETIC_SCALE
from embcache.errors import UserFacingError, as_user_errors
from embcache.paths import datasets_dir

FORMATTER = DefaultsHelpFormatter  # every option's default in --help
ACTION_TEXTS = {  # action: (one line in the list of actions, description atop its --help)
    "criteo-kaggle": ("Criteo Kaggle train.txt",
                      "Criteo Display Advertising Challenge train.txt (or .gz). The last seventh of the rows "
                      "is held out: first half val, second half test."),
    "criteo-terabyte": ("Criteo Terabyte day_N files",
                        "Criteo 1TB click logs: day_0..day_23, plain or .gz. The last listed day is held out "
                        "(first half val, second half test); the others train. With --day-splits every day is "
                        "also a split of its own (day_N), for training day after day."),
    "avazu": ("Avazu train.csv", "Avazu CTR train.csv (or train.gz), header required."),
    "ml-100k": ("MovieLens-100k as CTR (rating >= 4 is a click)",
                "MovieLens-100k as CTR data. Without --input the RecBole copy is fetched once with pip "
                "into datasets/ml-100k/ (not redistributed)."),
    "own": ("your own CSV / TSV / Parquet file, columns named",
            "Your own CTR file: CSV, TSV (.txt too; .gz for both) or Parquet, with a header naming the columns. "
            "Name the 0/1 label, the dense and the categorical columns, and the split: random, by a time column "
            "(time:COL: the latest rows are held out) or the file's tail. Two streaming passes, as the public "
            "data sets' (docs/dlrm-own-data.md)."),
    "synthetic": ("generate Criteo-shaped synthetic data",
                  "Criteo-shaped synthetic data: Kaggle's cardinalities times --scale, Zipf ids, labels from "
                  "a hidden logistic model whose AUC is stored in meta.json as oracle_auc. val and test get "
                  "a tenth of --rows each. With --days N: splits day_0..day_{N-1} of --rows rows each "
                  "instead, and every day a fraction --drift of each feature's distinct values is new "
                  "(never seen before) while old values fade; new values carry effects of their own, "
                  "so a model that learns them gains AUC (see docs/open-vocabularies.md)."),
}


def build_parser(prog: str) -> argparse.ArgumentParser:
    """The `embcache data` parser: `prepare DATASET`, `synthetic` and `info`; the parsed
    namespace's `func(args)` runs the action and returns the exit status.

    Example:
        >>> args = build_parser("embcache data").parse_args(["synthetic", "--out", "syn"])
        >>> args.rows, args.scale, args.func is _synthetic
        (200000, 0.1, True)
    """
    parser = argparse.ArgumentParser(prog=prog, description=__doc__)
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    which = _add_prepare(sub)
    for add_dataset in (_add_criteo_kaggle, _add_criteo_terabyte, _add_avazu, _add_ml100k, _add_own):
        add_dataset(which)
    _add_synthetic(sub)
    _add_info(sub)
    return parser


def _add_prepare(sub) -> argparse._SubParsersAction:
    """`prepare` (alone it prints its help, exit 2); returns the group its DATASETs join."""
    prep = sub.add_parser("prepare", help="convert a public data set, or your own file (two streaming passes)")
    which = prep.add_subparsers(dest="dataset", metavar="DATASET")
    prep.set_defaults(func=lambda _args: prep.print_help() or 2)
    return which


def _action_parser(group, name: str, func) -> argparse.ArgumentParser:
    """A sub-parser of `group` with its ACTION_TEXTS that runs `func` and shows its defaults in --help."""
    help_line, description = ACTION_TEXTS[name]
    p = group.add_parser(name, formatter_class=FORMATTER, help=help_line, description=description)
    p.set_defaults(func=func)
    return p


def _add_out(p: argparse.ArgumentParser, default: str | None = None) -> None:
    """--out (required unless `default`) and --force."""
    p.add_argument("--out", required=default is None, default=default,
                   help="output directory: written whole or not at all (a temporary directory beside it is "
                        "renamed into place at the end; a failed run, Ctrl-C or SIGTERM leaves nothing)")
    p.add_argument("--force", action="store_true", help="replace --out when it is not empty")


def _add_split(p: argparse.ArgumentParser, split_help: str, seed_type, seed_help: str | None = None) -> None:
    """--split random|time and the --seed of the random split."""
    p.add_argument("--split", choices=("random", "time"), default="random", help=split_help)
    p.add_argument("--seed", type=seed_type, default=0, help=seed_help)


def _add_keys(p: argparse.ArgumentParser, what: str) -> None:
    """--keys ids|raw."""
    p.add_argument("--keys", choices=("ids", "raw"), default="ids",
                   help=f"ids: {what}; raw: each value's 64-bit key as int64 (any int64, 0 = missing), for "
                        "tables without a vocabulary (meta.json \"keys\": \"raw\"; per-key counts in key_freq.npz)")


def _add_vocabulary_options(p: argparse.ArgumentParser) -> None:
    """The options of the two-pass converters (`converter.convert`)."""
    _add_keys(p, "a vocabulary of contiguous ids per feature, built by a first pass")
    p.add_argument("--max-counted-keys", type=int_in(0), default=None,
                   help="--keys raw: per-key counts are exact up to this many distinct keys per feature; past "
                        "it the most frequent keys are kept (meta.json says so), which bounds memory; 0: no cap "
                        f"(default: {MAX_COUNTED_KEYS:,})")
    p.add_argument("--min-count", type=int_in(1), default=1,
                   help="values seen fewer times share id 0 with missing values (DLRM uses 15 on Terabyte)")
    p.add_argument("--max-ids-per-feature", type=int_in(2), default=None,
                   help="cap every table at this many rows: a feature with more distinct values is "
                        "hashed into buckets, which also bounds pass 1's memory (default: no cap)")
    p.add_argument("--rows-per-shard", type=int_in(1), default=2_000_000, help="rows per Parquet file")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def _one_file_dataset(which, name: str, func, input_help: str) -> argparse.ArgumentParser:
    """A `prepare DATASET` sub-parser whose input is one file: --input and --out, both required."""
    p = _action_parser(which, name, func)
    p.add_argument("--input", required=True, help=input_help)
    _add_out(p)
    return p


def _add_criteo_kaggle(which) -> None:
    p = _one_file_dataset(which, "criteo-kaggle", _criteo_kaggle, "path of train.txt or train.txt.gz")
    _add_vocabulary_options(p)


def _add_criteo_terabyte(which) -> None:
    p = _action_parser(which, "criteo-terabyte", _criteo_terabyte)
    p.add_argument("--input-dir", required=True, help="directory holding day_N or day_N.gz")
    p.add_argument("--days", default="0-23",
                   help="days to use, e.g. 0-23 or 0,1,23 (last = held out); checked before any reading")
    p.add_argument("--day-splits", action="store_true",
                   help="also list every day as a split, day_N, over the same files (shards are cut at each "
                        "day's end); meta.json's day_splits names them in order")
    _add_out(p)
    _add_vocabulary_options(p)


def _add_avazu(which) -> None:
    p = _one_file_dataset(which, "avazu", _avazu, "path of train.csv or train.gz")
    _add_split(p, "random 8:1:1 by a seeded hash of the row position, or by day "
                  "(last day test, the day before val)",
               int_in(0, 2**32 - 1), "seed of the random split")
    _add_vocabulary_options(p)


def _add_ml100k(which) -> None:
    p = _action_parser(which, "ml-100k", _ml100k)
    p.add_argument("--input", default=None, help="directory with u.data/u.user/u.item (or RecBole's ml-100k.*) (default: the RecBole copy, "
                        "fetched once into datasets/ml-100k/)")
    _add_out(p, default=str(datasets_dir() / "ml-100k-ctr"))
    _add_split(p, "seeded random 80/10/10, or chronological", int_in(0))
    p.add_argument("--strict", action="store_true",
                   help="stop at the first malformed line, naming file and line (default: skip and count such "
                        "lines, reported and kept in meta.json's bad_rows, as the other converters do)")


def _add_own(which) -> None:
    p = _one_file_dataset(which, "own", _own, "your file: .csv, .tsv or .txt (tab-separated), .gz of those, or "
                                              ".parquet; text needs a header line")
    p.add_argument("--label-col", required=True, help="the 0/1 label's column (1.0 and 0.0 too)")
    p.add_argument("--dense-cols", required=True, type=_names, help="numeric columns, comma-separated (at least one)")
    p.add_argument("--sparse-cols", required=True, type=_names,
                   help="categorical columns, comma-separated: one embedding table each (sparse_0, ... in this "
                        "order; meta.json's features name them)")
    p.add_argument("--split", default="random", metavar="random|time:COL|tail",
                   help="random (seeded), time:COL (by a time column, numbers or ISO dates: the latest rows held "
                        "out) or tail (the file's last rows)")
    p.add_argument("--held-out", type=float_in(0, 1, low_open=True, high_open=True), default=0.2,
                   help="the share of val and test together, halved between them")
    p.add_argument("--seed", type=int_in(0, 2**32 - 1), default=0, help="seed of the random split")
    p.add_argument("--dense-transform", choices=("log1p", "none"), default="log1p",
                   help="log1p: Criteo's (negatives clamped to 0, then log(x + 1)); none: the values as they are "
                        "(empty -> 0 either way)")
    _add_vocabulary_options(p)


def _names(text: str) -> list[str]:
    """`a,b,c` -> ["a", "b", "c"]."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"expected column names separated by commas, got {text!r}")
    return names


def _own(args) -> int:
    from embcache.data.own import convert_own, parse_split

    try:
        parse_split(args.split)
    except ValueError as err:
        raise UserFacingError(str(err)) from None
    kwargs = _vocab_kwargs(args)
    return _staged(args, [args.input], lambda out: convert_own(
        args.input, out, label=args.label_col, dense=args.dense_cols, sparse=args.sparse_cols, split=args.split,
        held_out=args.held_out, seed=args.seed, dense_transform=args.dense_transform, **kwargs))


def _add_synthetic(sub) -> None:
    p = _action_parser(sub, "synthetic", _synthetic)
    _add_out(p)
    p.add_argument("--rows", type=int_in(1), default=SYNTHETIC_ROWS,
                   help="training rows; with --days: rows per day")
    p.add_argument("--scale", type=positive_float, default=SYNTHETIC_SCALE,
                   help="multiplies Criteo Kaggle's cardinalities (the DLRM trainer's built-in data set: the same)")
    p.add_argument("--seed", type=int_in(0), default=0)
    p.add_argument("--days", type=int_in(1), default=None,
                   help="write this many day splits, day_0.. (--rows rows each), instead of train/val/test "
                        "(default: none: train/val/test, the data as it always was)")
    p.add_argument("--drift", type=float_in(0, 1, high_open=True), default=None,
                   help="with --days: the fraction of each feature's distinct values that are new every day "
                        f"(never seen on an earlier day), in [0, 1) (default: {SYNTHETIC_DRIFT} with --days)")
    _add_keys(p, "value numbers as ids in [0, cardinality)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _add_info(sub) -> None:
    p = sub.add_parser("info", help="show a prepared directory's meta.json at a glance", formatter_class=FORMATTER)
    p.add_argument("dir", help="a directory with meta.json")
    p.add_argument("--head", type=int_in(0), default=0, help="also print the first N training rows (day_0's for data made by day)")
    p.add_argument("--json", action="store_true", help="print meta.json as it is")
    p.set_defaults(func=_info)


def _vocab_kwargs(args) -> dict:
    """The converter's keyword arguments; flags that do not go with --keys are one line."""
    if args.keys == "raw" and (args.min_count != 1 or args.max_ids_per_feature is not None):
        raise UserFacingError("--min-count and --max-ids-per-feature build a vocabulary; --keys raw has none")
    if args.keys == "ids" and args.max_counted_keys is not None:
        raise UserFacingError("--max-counted-keys caps the per-key counts of --keys raw; --keys ids counts every id")
    kwargs = dict(min_count=args.min_count, max_ids=args.max_ids_per_feature, progress=not args.no_progress,
                  rows_per_shard=args.rows_per_shard)
    if args.keys == "raw":
        cap = MAX_COUNTED_KEYS if args.max_counted_keys is None else args.max_counted_keys or None
        kwargs.update(keys="raw", max_counted_keys=cap)
    return kwargs


def _criteo_kaggle(args) -> int:
    from embcache.data.criteo import convert_criteo_kaggle

    kwargs = _vocab_kwargs(args)
    return _staged(args, [args.input], lambda out: convert_criteo_kaggle(args.input, out, **kwargs))


def _criteo_terabyte(args) -> int:
    from embcache.data.criteo import convert_criteo_terabyte

    kwargs = _vocab_kwargs(args)
    return _staged(args, [args.input_dir], lambda out: convert_criteo_terabyte(args.input_dir, out, days=args.days,
                                                                              day_splits=args.day_splits, **kwargs))


def _avazu(args) -> int:
    from embcache.data.avazu import convert_avazu

    kwargs = _vocab_kwargs(args)
    return _staged(args, [args.input], lambda out: convert_avazu(args.input, out, split=args.split, seed=args.seed,
                                                                 **kwargs))


def _ml100k(args) -> int:
    from embcache.data.movielens_ctr import prepare_ml100k_ctr

    return _staged(args, [args.input], lambda out: prepare_ml100k_ctr(out, args.input, split=args.split,
                                                                      seed=args.seed, skip_bad_lines=not args.strict))


def _synthetic(args) -> int:
    from embcache.data.synthetic import generate_synthetic

    if args.drift is not None and args.days is None:
        raise UserFacingError("--drift needs --days (the data drifts from one day to the next)")
    extra = {} if args.days is None else {"days": args.days, "drift": args.drift}
    if args.keys == "raw":
        extra["keys"] = "raw"
    return _staged(args, [], lambda out: generate_synthetic(out, rows=args.rows, scale=args.scale, seed=args.seed,
                                                            progress=not args.no_progress, **extra))


def _staged(args, inputs: list, write) -> int:
    """Run `write(directory)` into a temporary directory that becomes --out when it succeeds
    (`staging.staged_output`: an existing non-empty --out only with --force), then print
    the data set's summary."""
    from embcache.data.staging import staged_output

    with staged_output(args.out, args.force, [p for p in inputs if p]) as tmp:
        meta = as_user_errors(write, tmp)
    print(summary(meta, args.out))
    return 0


def summary(meta: dict, where) -> str:
    """A few lines: rows per split, features, label rate where known, bad rows."""
    splits = ", ".join(f"{s} {info['rows']:,} rows in {len(info['files'])} file(s)"
                       for s, info in meta["splits"].items())
    cards = [f["cardinality"] for f in meta["sparse"]]
    multi = [f["name"] for f in meta["sparse"] if f.get("multi_hot")]
    raw = meta.get("keys") == "raw"
    lines = [f"{where}: {meta.get('source', '?')}",
             f"  splits      {splits}",
             f"  dense       {meta['num_dense']} columns",
             f"  sparse      {len(cards)} features, " + (
                 f"raw 64-bit keys: {sum(cards):,} distinct keys counted (largest {max(cards, default=0):,})"
                 + ("" if meta.get("key_counts", {}).get("exact", True) else ", per-key counts capped")
                 if raw else f"{sum(cards):,} ids in all (largest {max(cards, default=0):,})")
             + (f"; multi-hot: {', '.join(multi)}" if multi else "")]
    days = [d["split"] for d in meta.get("day_splits", [])]
    if days:
        drift = meta.get("generator", {}).get("drift")
        lines.append(f"  days        {len(days)} day splits, {days[0]}..{days[-1]}"
                     + (f"; drift {drift:g} new values a day" if drift is not None else ""))
    if meta.get("oracle_auc") is not None:
        lines.append(f"  oracle AUC  {meta['oracle_auc']:.4f} on val (the hidden model's ceiling)")
    bad = sum(v.get("count", 0) for v in meta.get("bad_rows", {}).values())
    if meta.get("bad_rows"):
        lines.append(f"  bad rows    {bad:,} skipped" + (" (details in meta.json)" if bad else ""))
    return "\n".join(lines)


def _info(args) -> int:
    from embcache.data.ctr_format import head_rows, read_meta

    meta = as_user_errors(read_meta, args.dir)
    if args.json:
        print(json.dumps(meta, indent=1))
        return 0
    print(summary(meta, args.dir))
    for name, info in meta.get("bad_rows", {}).items():
        if info.get("count"):
            print(f"  {name}: {info['count']:,} bad rows, first at lines {info['first_lines']}")
    if args.head:
        split = "train" if "train" in meta["splits"] else next(iter(meta["splits"]), "train")  # day_0 of days
        for row in as_user_errors(head_rows, args.dir, split, args.head):
            print(json.dumps(row))
    return 0
