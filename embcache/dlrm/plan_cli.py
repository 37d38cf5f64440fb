"""`embcache cache plan DATA_DIR`: how big a cache, before training. From a prepared data
set's id counts (and, with --trace N, a replay of its first N training batches), the hit
rate each eviction policy is predicted to reach at each cache ratio, what each costs in
device and host memory and in rows moved per step, and the largest cache that fits the
device memory. The trainer's settings (--embedding-dim, --optimizer, --eviction, --batch-size,
--warmup-ratio, --prefetch-depth, --admission, --seed) mean and default to what they do for
`embcache dlrm train`: the plan predicts that run. How the predictions are made:
embcache/cache/planning/planner.py."""
from __future__ import annotations

import argparse
import json

from embcache.arg_types import DefaultsHelpFormatter, int_in, memory_size, ratio
from embcache.errors import as_user_errors
from embcache.settings_fields import add_config_arguments


def build_parser(prog: str) -> argparse.ArgumentParser:
    """The `embcache cache plan` parser; the namespace's `func(args)` prints the plan.

    Example:
        >>> args = build_parser("embcache cache plan").parse_args(["data", "--device-memory", "8 GiB"])
        >>> args.device_memory, args.embedding_dim, args.admission, args.trace
        (8589934592, 16, 'off', None)
    """
    from embcache.cache.choices import OPTIMIZERS, PLANNED_RATIOS
    from embcache.dlrm.config import DLRMConfig

    d = DLRMConfig()
    p = argparse.ArgumentParser(prog=prog, description=__doc__,
                                formatter_class=DefaultsHelpFormatter)
    p.add_argument("data_dir", metavar="DATA_DIR", help="a prepared data set (meta.json + id counts)")
    p.add_argument("--device-memory", type=memory_size, default="16GiB", metavar="SIZE",
                   help="device memory the cache may use, e.g. 16GiB, '16 GiB', 512MB, 16e9 (bytes)")
    # the trainer's own settings, declared once on DLRMConfig (the plan predicts that trainer)
    add_config_arguments(p, DLRMConfig, ["embedding_dim"])
    p.add_argument("--optimizer", choices=OPTIMIZERS, default=d.sparse_optimizer,
                   help="the sparse optimizer (the trainer's --sparse-optimizer), whose state travels with each row")
    add_config_arguments(p, DLRMConfig, ["eviction", "batch_size", "warmup_ratio"])
    p.add_argument("--trace", type=int_in(1), default=None, metavar="N",
                   help="replay the first N training batches (default: predict from the id counts alone)")
    ahead = add_config_arguments(p, DLRMConfig, ["prefetch_depth"])["prefetch"]
    ahead.add_argument("--no-prefetch", action="store_true", help="the same as --prefetch-depth 0")
    p.add_argument("--admission", choices=("on", "off"), default="on" if d.admission else "off",
                   help="the cache's admission control for freq/lfu (the trainer's --admission)")
    add_config_arguments(p, DLRMConfig, ["bookkeeping"])
    add_config_arguments(p, DLRMConfig, ["seed"])
    p.add_argument("--ratios", type=ratio, nargs="+", default=list(PLANNED_RATIOS), metavar="R",
                   help="cache ratios (fraction of all rows on the device)")
    p.add_argument("--plot", default=None, metavar="PATH", help="also draw the curves into this PNG (default: no picture)")
    p.add_argument("--json", action="store_true", help="print the plan as one JSON object instead of a table")
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    from embcache.cache.planning.planner import plan_cache

    def make_plan():
        plan = plan_cache(args.data_dir, embedding_dim=args.embedding_dim, optimizer=args.optimizer,
                          device_memory=args.device_memory, batch_size=args.batch_size,
                          warmup_ratio=args.warmup_ratio, eviction=args.eviction, trace=args.trace,
                          seed=args.seed, ratios=args.ratios,
                          prefetch_depth=0 if args.no_prefetch else args.prefetch_depth,
                          admission=args.admission == "on", bookkeeping=planned_bookkeeping(args.bookkeeping))
        if args.plot:
            plot(plan, args.plot)
        return plan

    plan = as_user_errors(make_plan)
    print(json.dumps(plan.to_json(), indent=1) if args.json else report(plan))
    return 0


def planned_bookkeeping(bookkeeping: str) -> str:
    """The bookkeeper the trainer will use: "auto" is the device's where it trains on CUDA,
    which it does where CUDA is (its --device default)."""
    from embcache.cache.choices import resolve_bookkeeping
    from embcache.device import default_device

    return resolve_bookkeeping(bookkeeping, default_device())


def report(plan) -> str:
    """The plan as people read it: what it assumes, then one line per ratio."""
    from embcache.cache.planning.planner import format_bytes

    j = plan.to_json()
    fp = plan.footprint
    lines = [f"{plan.data_dir}: {fp.num_rows:,} embedding rows; a batch of {plan.batch_size:,} needs "
             f"{j['distinct_rows_per_batch']:,.0f} distinct rows ({j['distinct_rows_per_batch_expected']:,.0f} "
             f"expected from the counts)",
             f"predicted from {j['assumption']}",
             f"for the trainer's cache: prefetch depth {plan.prefetch_depth}, admission control "
             f"{'on' if plan.admission else 'off'} (freq, lfu)",
             f"a row: {fp.dim} float32 + {fp.optimizer} state = {fp.row_bytes:,} B; host store "
             f"{format_bytes(fp.host_bytes())} (every row and its state)",
             f"largest cache in {format_bytes(plan.device_memory)} of device memory: {plan.largest_rows:,} rows "
             f"({j['largest_cache_ratio']:.2%})" if plan.largest_rows else
             f"no cache fits in {format_bytes(plan.device_memory)}: one row with its state needs {fp.row_bytes} B",
             "",
             f"  {'ratio':>7}  {'rows':>10}  {'freq':>6}  {'lfu':>6}  {'lru':>6}  {'device':>10}  "
             f"{'moved/step (freq)':>18}"]
    for row in j["rows"]:
        h, moved = row["hit_rate"], row["bytes_per_batch"]["freq"]
        note = "  ".join(n for n, on in (("does not fit", not row["fits"]),
                                          ("overflow: smaller than a batch's distinct rows", row["overflow"])) if on)
        lines.append(f"  {row['ratio']:>7.2%}  {row['cache_rows']:>10,}  {h['freq']:>6.3f}  {h['lfu']:>6.3f}  "
                     f"{h['lru']:>6.3f}  {format_bytes(row['device_bytes']):>10}  "
                     f"{format_bytes(moved['h2d'] + moved['d2h']):>18}  {note}".rstrip())
    where = ("the bookkeeping lives on the host" if fp.bookkeeping == "host" else
             "+ the device bookkeeper's maps, counts and overflow rows")
    lines.append(f"hit rates count distinct rows per batch, as the cache does; device = rows + state ({where}); "
                 f"moved = misses in + dirty evictions out")
    return "\n".join(lines)


def plot(plan, path) -> None:
    """Hit rate against cache ratio for each policy (the replay's grid of sizes, the
    planned ratios marked), with the largest cache that fits; written to a temporary
    name, then renamed."""
    import os
    from pathlib import Path

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pred, n = plan.prediction, plan.footprint.num_rows
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for policy, style in zip(pred.hits, ("-", "--", ":")):
        line, = ax.plot(100 * pred.sizes / n, 100 * pred.hit_rate(policy), style, label=policy)
        ax.plot([100 * r for r in plan.ratios], 100 * pred.hit_rate(policy)[plan.rows()], "o",
                color=line.get_color(), ms=4)
    if 0 < plan.largest_rows < n:
        ax.axvline(100 * plan.largest_rows / n, color="k", lw=0.8, label="largest that fits")
    ax.set_xscale("log")
    ax.set_xlabel("cache ratio, % of rows on the device")
    ax.set_ylabel("predicted hit rate, % of distinct rows per batch")
    ax.set_title(f"{Path(plan.data_dir).name}: {n / 1e6:.1f} M rows, " + ("trace" if plan.traced else "counts only"))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}.png")
    try:
        fig.savefig(tmp, dpi=120)
        os.replace(tmp, path)
    finally:
        plt.close(fig)
        tmp.unlink(missing_ok=True)
