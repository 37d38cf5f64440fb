"""The work of `embcache bench vocab` (issue 26): next-day AUC, memory and speed of a day-0
vocabulary (`first-day`), hashing (`hash`) and an open table (`open`) trained day after day
on drifting data with raw 64-bit keys. A day-0 vocabulary maps every later value to one
shared row, hashing shares rows between colliding values, an open table gives each value its
own row under the same bound; the data gives every value an effect of its own, so the AUC
says what each way of sharing rows costs. The flags and the full description are in
`embcache.bench.vocab_cli` (`--help`), which imports this module only to run.

Each variant is a `embcache dlrm train` subprocess: its peak host memory is its own, and
what it reports is what the command reports (its last stdout line, the JSON summary).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path

from embcache.errors import UserFacingError
from embcache.train.bench_results import run_for_summary, write_json

OPEN_FIELDS = ("live_keys", "new_keys", "retired_keys", "key_index_bytes")


def data_dir(args) -> Path:
    """Where the data of these settings lives in --data-cache (seed 0)."""
    return Path(args.data_cache) / f"bench-vocab-d{args.days}-r{args.rows}-s{args.scale:g}-f{args.drift:g}"


def _matches(meta: dict, args) -> bool:
    gen = meta.get("generator", {})
    return (meta.get("keys") == "raw" and gen.get("days") == args.days and gen.get("rows_per_day") == args.rows
            and gen.get("drift") == args.drift and gen.get("scale") == args.scale and gen.get("seed") == 0)


def ensure_data(args) -> tuple[Path, dict, bool]:
    """(directory, meta, generated now): the drifting raw-key data of these settings, from
    --data-cache where a complete copy is there, else generated (into a temporary directory
    renamed into place, so an interrupted generation is never reused)."""
    from embcache.data.staging import staged_output
    from embcache.data.synthetic import generate_synthetic

    out = data_dir(args)
    meta_file = out / "meta.json"
    if meta_file.exists():
        meta = json.loads(meta_file.read_text())
        if _matches(meta, args):
            return out, meta, False
        shutil.rmtree(out)  # not what its name says (an older generator): made again
    with staged_output(out, force=True) as tmp:  # what a killed generation left beside it goes first
        meta = generate_synthetic(tmp, rows=args.rows, scale=args.scale, seed=0, days=args.days, drift=args.drift,
                                  keys="raw")
    return out, meta, True


def evaluated_splits(days: int) -> list[str]:
    """The splits scored, in order: day_1..day_{days-1} (each after training on the day before)."""
    return [f"day_{d}" for d in range(1, days)]


def mean_splits(days: int) -> list[str]:
    """The splits the mean is taken over: every evaluated one but the first (day_1, which
    only says how well day 0's keys cover day 1)."""
    return evaluated_splits(days)[1:]


def train_argv(mode: str, data: Path, args) -> list[str]:
    """The `embcache` arguments of one variant."""
    argv = ["dlrm", "train", "--data", str(data), "--days", f"0-{args.days - 2}", "--eval-next-day",
            "--raw-keys", mode]
    if mode != "first-day":  # the vocabulary's size is day 0's keys: it takes no bound
        argv += ["--max-rows", str(args.max_rows)]
    argv += ["--batch-size", str(args.batch_size), "--embedding-dim", str(args.embedding_dim),
             "--lr", str(args.lr), "--cache-ratio", str(args.cache_ratio), "--seed", str(args.seed),
             "--threads", str(args.threads), "--no-progress"]
    if args.device is not None:
        argv += ["--device", args.device]
    return argv


def run_variant(mode: str, data: Path, args) -> tuple[dict, float]:
    """(the run's JSON summary, its wall seconds); UserFacingError in one line if it fails."""
    argv = train_argv(mode, data, args)
    return run_for_summary(argv, f"the {mode} run (embcache {' '.join(argv)})",
                           env={**os.environ, "OMP_NUM_THREADS": str(args.threads)})


def warm_up(modes: list[str], args) -> float:
    """Seconds of one tiny run of each variant (3 days of two batches, made beside the data),
    run first so that the numba kernels every variant needs are compiled and cached on disk:
    compiled inside a measured run, they would count in its samples/s and its peak memory."""
    tiny = argparse.Namespace(**{**vars(args), "days": 3, "rows": 2 * args.batch_size})
    start = time.perf_counter()
    data, _, _ = ensure_data(tiny)
    for mode in modes:
        run_variant(mode, data, tiny)
    return time.perf_counter() - start


def variant_result(mode: str, summary: dict, days: int, argv: list[str], wall: float) -> dict:
    """What the benchmark keeps of a run's summary, its next-day AUCs checked against the days
    it should have scored and their mean over `mean_splits(days)`."""
    scored = [r for r in summary.get("next_day", []) if r.get("auc") is not None]
    got = [r["split"] for r in scored]
    if got != evaluated_splits(days):
        raise UserFacingError(f"the {mode} run scored {got or 'no day'}, expected {evaluated_splits(days)}")
    auc = {r["split"]: r["auc"] for r in scored}
    logloss = {r["split"]: r["logloss"] for r in scored}
    over = mean_splits(days)
    out = {"mode": mode, "command": "embcache " + " ".join(argv),
           "next_day_auc": auc, "next_day_logloss": logloss,
           "mean_auc": sum(auc[s] for s in over) / len(over),
           "mean_logloss": sum(logloss[s] for s in over) / len(over),
           "peak_host_mib": summary["peak_host_mib"], "samples_per_s": summary["train_samples_per_s"],
           "cpu_seconds_per_sample": summary.get("cpu_seconds_per_sample"),
           "train_seconds": summary.get("train_seconds"), "wall_seconds": wall, "steps": summary.get("steps"),
           "table_rows": summary.get("table_rows"), "cache_rows": summary.get("cache_rows"),
           "hit_rate": summary.get("hit_rate"), "arch": summary.get("arch"), "device": summary.get("device")}
    if mode == "open":
        missing = [k for k in OPEN_FIELDS if k not in summary]
        if missing:
            raise UserFacingError(f"the open run's summary has no {', '.join(missing)}")
        out.update({k: summary[k] for k in OPEN_FIELDS})
        out["key_index_bytes_per_live_key"] = (summary["key_index_bytes"] / summary["live_keys"]
                                               if summary["live_keys"] else None)
    return out


def open_minus(results: list[dict]) -> dict:
    """Open's AUC minus each baseline's, in points (100 x the AUC difference): of the mean and
    of each scored day."""
    by_mode = {r["mode"]: r for r in results}
    if "open" not in by_mode:
        return {}
    op = by_mode["open"]
    return {base: {"mean_auc_points": 100 * (op["mean_auc"] - r["mean_auc"]),
                   "auc_points": {s: 100 * (op["next_day_auc"][s] - r["next_day_auc"][s]) for s in r["next_day_auc"]}}
            for base, r in by_mode.items() if base != "open"}


def format_table(payload: dict) -> str:
    """The results at a glance: a row per variant (and the data's hidden model, with every
    value's effect known and with day 0's values' only), then open minus each baseline."""
    splits, over = payload["evaluated_splits"], payload["mean_over"]
    mean_label = f"mean {over[0]}..{over[-1]}" if len(over) > 1 else f"mean {over[0]}"
    head = ["variant", *splits, mean_label, "peak MiB", "samples/s", "CPU µs/sample", "retired", "index B/key"]
    rows = []
    for r in payload["results"]:
        cpu = r["cpu_seconds_per_sample"]
        per_key = r.get("key_index_bytes_per_live_key")
        rows.append([r["mode"], *(f"{r['next_day_auc'][s]:.4f}" for s in splits), f"{r['mean_auc']:.4f}",
                     f"{r['peak_host_mib']:,.0f}", f"{r['samples_per_s']:,.0f}",
                     f"{cpu * 1e6:,.1f}" if cpu is not None else "-",
                     f"{r['retired_keys']:,}" if "retired_keys" in r else "-",
                     f"{per_key:.1f}" if per_key is not None else "-"])
    for label, key in (("oracle", "oracle_auc"), ("oracle, day-0 values", "oracle_auc_day0_values_only")):
        auc = {s: (payload["data"]["oracle"].get(s) or {}).get(key) for s in splits}
        if all(v is not None for v in auc.values()):  # the hidden model's AUC: the most a model can reach
            rows.append([label, *(f"{auc[s]:.4f}" for s in splits), f"{sum(auc[s] for s in over) / len(over):.4f}",
                         *["-"] * 5])
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(head)]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    out = [f"next-day AUC (each day scored before training on it; the mean leaves out {splits[0]}, "
           f"which only reflects day 0's keys)", line(head), *map(line, rows)]
    for base, d in payload["open_minus"].items():
        days = ", ".join(f"{s} {v:+.2f}" for s, v in d["auc_points"].items())
        out.append(f"open - {base}: {d['mean_auc_points']:+.2f} points of mean AUC ({days})")
    return "\n".join(out)


def run(args) -> int:
    modes = list(dict.fromkeys(args.modes))  # given twice: run once
    start = time.perf_counter()
    data, meta, generated = ensure_data(args)
    print(f"{'generated' if generated else 'reusing'} {data} ({args.days} days of {args.rows:,} rows, "
          f"drift {args.drift:g}, scale {args.scale:g})", flush=True)
    warmup = None if args.no_warmup else warm_up(modes, args)
    if warmup is not None:
        print(f"warmed up (a tiny run of each variant: {warmup:.0f} s)", flush=True)
    oracle = {d["split"]: {k: d.get(k) for k in ("oracle_auc", "oracle_auc_new_unknown", "oracle_auc_day0_values_only")}
              for d in meta.get("day_splits", []) if d["split"] in evaluated_splits(args.days)}
    results = []
    payload = {"benchmark": "vocab",
               "config": {k: v for k, v in vars(args).items() if k != "func"},
               "data": {"dir": str(data), "days": args.days, "rows_per_day": args.rows, "drift": args.drift,
                        "scale": args.scale, "seed": 0, "keys": "raw", "oracle": oracle},
               "trained_days": f"day_0..day_{args.days - 2}",
               "evaluated_splits": evaluated_splits(args.days), "mean_over": mean_splits(args.days),
               "results": results, "warmup_seconds": warmup, "complete": False}
    for mode in modes:
        summary, wall = run_variant(mode, data, args)
        r = variant_result(mode, summary, args.days, train_argv(mode, data, args), wall)
        results.append(r)
        print(f"  {mode}: mean next-day AUC {r['mean_auc']:.4f}, {r['samples_per_s']:,.0f} samples/s, "
              f"{r['peak_host_mib']:,.0f} MiB peak ({wall:.0f} s)", flush=True)
        # after every variant, `complete` false until the end: a run cut short keeps the variants it ran
        write_json(payload | {"open_minus": open_minus(results), "seconds": time.perf_counter() - start},
                   args.name, args.out)
    payload.update(open_minus=open_minus(results), seconds=time.perf_counter() - start, complete=True)
    print(format_table(payload))
    path = write_json(payload, args.name, args.out)
    print(f"wrote {path}")
    return 0
