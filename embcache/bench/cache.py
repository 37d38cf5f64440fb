"""The work of `embcache bench cache`: hit rates of the eviction policies against Belady's
and the static top-C, the bytes moved, and the bookkeeping's cost against an uncached
`nn.EmbeddingBag`. What it measures and how is the command's description, the docstring of
`embcache.bench.cache_cli` (which holds the flags and imports this module only to run)."""
from __future__ import annotations

import logging
import math
import time
import warnings

import torch

from embcache.bench.belady import belady_hit_rate
from embcache.bench.criteo_trace import CriteoTrace
from embcache.cache.bookkeeping import row_cache
from embcache.cache.optimizers import torch_equivalent
from embcache.device import device_argument
from embcache.nn.cached_embedding_bag import CachedEmbeddingBag
from embcache.threads import set_threads
from embcache.train.bench_results import write_json


VARIANTS = (("freq", "freq", False), ("freq+adm", "freq", True), ("lfu", "lfu", False), ("lru", "lru", False))


class _OverflowSaidOnce(logging.Filter):
    """Lets the row cache's warning that a batch needs more rows than the cache holds through
    once and counts the rest: the table builds a cache per policy, ratio and trace, and each
    of them would say it again."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.getMessage().startswith("the cache holds "):
            return True
        self.count += 1
        return self.count == 1


def hit_rates(args, device, on_row=lambda part: None) -> dict:
    """The hit-rate table on the stationary trace and, with `--day-batches`, a drifting one
    (when the trace is long enough to drift: its first day is the stationary trace).
    `on_row` gets the table so far after each row (the run saves it: a run cut short keeps it)."""
    said = _OverflowSaidOnce()
    log = logging.getLogger(row_cache.__name__)
    log.addFilter(said)
    try:
        out = _trace_hit_rates(args, device, 0, on_row)
        if args.day_batches and args.batches <= args.day_batches:
            out["drifting_skipped"] = (f"{args.batches} batches never reach a day boundary (--day-batches "
                                       f"{args.day_batches}): the drifting trace would be the stationary one")
            print(f"  drifting trace skipped: {out['drifting_skipped']}", flush=True)
        elif args.day_batches:
            out["drifting"] = _trace_hit_rates(args, device, args.day_batches,
                                               lambda drifting: on_row({**out, "drifting": drifting}))
    finally:
        log.removeFilter(said)
    if said.count > 1:
        print(f"  (the warning that a batch needs more rows than the cache holds came from {said.count} of the "
              "caches built here, said once; each cache's overflow_rows is in the JSON)", flush=True)
    return out


def _trace_hit_rates(args, device, day_batches: int, on_row) -> dict:
    trace = CriteoTrace(scale=args.scale, batch_size=args.batch_size, batches=args.batches,
                        seed=args.seed, day_batches=day_batches, day_shift=args.day_shift)
    batches = list(trace)
    skip = int(args.burn_in * len(batches))
    freq = trace.frequencies()
    out = {"num_rows": trace.num_rows, "batches": len(batches), "skip": skip, "day_batches": day_batches,
           "day_shift": args.day_shift if day_batches else 0, "results": []}
    name = f"drifting trace ({day_batches} batches a day)" if day_batches else "stationary trace"
    for ratio in args.ratios:
        cache_rows = math.ceil(ratio * trace.num_rows)
        row = {"ratio": ratio, "cache_rows": cache_rows}
        initial = None
        for label, policy, admission in VARIANTS:
            bag = CachedEmbeddingBag(trace.num_rows, 1, cache_ratio=ratio, eviction=policy,
                                     ids_freq=freq, warmup_ratio=args.warmup_ratio, admission=admission,
                                     device=device, weight=torch.zeros(trace.num_rows, 1)).eval()
            if initial is None:
                initial = bag.cache.slots.slot_to_id[bag.cache.slots.slot_to_id >= 0].cpu()
            with torch.no_grad():
                for i, b in enumerate(batches):
                    if i == skip:
                        bag.reset_cache_stats()
                    bag(b)
            s = bag.cache_stats()
            row[label] = s["hit_rate"]
            row[f"{label}_overflow_rows"] = s["overflow_rows"]
            del bag
        for label, bypass in (("belady", False), ("belady_bypass", True)):
            row[label] = belady_hit_rate(batches, trace.num_rows, cache_rows, skip=skip, initial=initial,
                                         bypass=bypass)["hit_rate"]
        row["static_top_c"] = static_top_c(batches[skip:], freq, cache_rows)
        out["results"].append(row)
        on_row(out)
        print(f"  {name}, ratio {ratio:>6.3%}: " + "  ".join(
            f"{k} {row[k]:.4f}" for k in (*(v[0] for v in VARIANTS), "static_top_c", "belady", "belady_bypass")),
            flush=True)
    return out


def static_top_c(batches: list[torch.Tensor], freq: torch.Tensor, cache_rows: int) -> float:
    """Hit rate of a cache that holds the `cache_rows` ids most frequent over the whole
    trace throughout (it knows the frequencies, not the order)."""
    resident = torch.zeros(freq.numel(), dtype=torch.bool)
    resident[torch.topk(freq.to(torch.float64), min(cache_rows, freq.numel())).indices] = True
    hits = lookups = 0
    for b in batches:
        unique = torch.unique(b)
        hits += int(resident[unique].sum())
        lookups += unique.numel()
    return hits / lookups if lookups else 0.0


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timing(args, device, on_row=lambda part: None) -> dict:
    """Cached vs uncached step time, interleaved step by step so that machine noise hits
    all alike; ratios are of medians. On the CPU the cache runs twice side by side: with
    its admission bookkeeping as one compiled pass (the default) and as the batched
    tensor ops that state it (the reference, what every other device runs): the before
    and after of that fusion in one run."""
    trace = CriteoTrace(scale=args.timing_scale, batch_size=args.batch_size,
                        batches=args.timing_steps + 5, seed=args.seed + 1)
    n, d = trace.num_rows, args.dim
    freq = trace.frequencies()
    batches = [b.to(device) for b in trace]
    target = torch.randn(args.batch_size, d, device=device)
    # torch's Adagrad rebuilds a sparse tensor each step and warns that it skips the
    # invariant checks; that is the baseline working as intended, not something to report
    warnings.filterwarnings("ignore", message="Sparse invariant checks are implicitly disabled")
    paths = ("fused", "tensor") if device.type == "cpu" else ("tensor",)
    results = []
    part = {"num_rows": n, "dim": d, "steps": args.timing_steps, "results": results}
    for opt_name in args.optimizers:
        weight = torch.randn(n, d) * 0.01
        ref = torch.nn.EmbeddingBag(n, d, mode="sum", sparse=True, _weight=weight.clone()).to(device)
        opt = torch_equivalent(opt_name, ref.parameters(), 0.01)

        def uncached(b):
            opt.zero_grad()
            (ref(b) * target).sum().backward()
            opt.step()

        for ratio in args.ratios:
            bags = {path: CachedEmbeddingBag(n, d, cache_ratio=ratio, ids_freq=freq, optimizer=opt_name,
                                             lr=0.01, device=device, weight=weight) for path in paths}
            steps = {"uncached": uncached}
            for path, bag in bags.items():
                bag.cache.admission_pass = path
                steps[path] = lambda b, bag=bag: (bag(b) * target).sum().backward()
            med = _interleaved_medians(steps, batches, device, warmup=5,
                                       after_warmup=lambda: [bag.reset_cache_stats() for bag in bags.values()])
            row = _timing_row(opt_name, ratio, bags[paths[0]], med)
            results.append(row)
            on_row(part)
            print(f"  {opt_name:8s} ratio {ratio:>6.3%}: cached/uncached step = {row['bookkeeping_ratio']:.2f}"
                  + (f" (tensor-op bookkeeping {row['bookkeeping_ratio_tensor_ops']:.2f})"
                     if "bookkeeping_ratio_tensor_ops" in row else "")
                  + f", {row['cached_step_ms']:.1f} ms vs {row['uncached_step_ms']:.1f} ms, hit rate "
                  f"{row['hit_rate']:.3f}, {(row['bytes_h2d_per_batch'] + row['bytes_d2h_per_batch']) / 2**20:.2f}"
                  " MiB moved/batch", flush=True)
            del bags
        del ref, opt
    return part


def _interleaved_medians(steps: dict, batches, device, warmup: int, after_warmup) -> dict:
    """Median seconds of each step function over `batches`, run in turn on every batch;
    the first `warmup` batches are not timed (`after_warmup` is called after them)."""
    times = {name: [] for name in steps}
    for i, b in enumerate(batches):
        if i == warmup:
            after_warmup()
        for name, step in steps.items():
            _sync(device)
            t0 = time.perf_counter()
            step(b)
            _sync(device)
            if i >= warmup:
                times[name].append(time.perf_counter() - t0)
    return {name: sorted(ts)[len(ts) // 2] for name, ts in times.items()}


def _timing_row(opt_name: str, ratio: float, bag, med: dict) -> dict:
    s = bag.cache_stats()
    cached = med.get("fused", med.get("tensor"))
    row = {"optimizer": opt_name, "ratio": ratio, "cache_rows": bag.cache.num_slots,
           "uncached_step_ms": 1e3 * med["uncached"], "cached_step_ms": 1e3 * cached,
           "bookkeeping_ratio": cached / med["uncached"], "hit_rate": s["hit_rate"],
           "bytes_h2d_per_batch": s["bytes_h2d"] / s["batches"],
           "bytes_d2h_per_batch": s["bytes_d2h"] / s["batches"], "overflow_rows": s["overflow_rows"]}
    if "fused" in med and "tensor" in med:
        row["bookkeeping_ratio_tensor_ops"] = med["tensor"] / med["uncached"]
    return row


def plot(hits: dict, path) -> None:
    """One panel per trace (stationary, and drifting when measured)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("stationary", hits)] + ([("drifting by day", hits["drifting"])] if "drifting" in hits else [])
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4), squeeze=False)
    for ax, (title, data) in zip(axes[0], panels):
        ratios = [100 * r["ratio"] for r in data["results"]]
        for key, style in (("belady", "k--"), ("belady_bypass", "k:"), ("static_top_c", "k-."), ("freq+adm", "D-"),
                           ("freq", "o-"), ("lfu", "s-"), ("lru", "^-")):
            ax.plot(ratios, [100 * r[key] for r in data["results"]], style, label=key)
        ax.set_xscale("log")
        ax.minorticks_off()
        ax.set_xticks(ratios, [f"{r:g}%" for r in ratios])
        ax.set_xlabel("cache ratio (rows on the device)")
        ax.set_ylabel("hit rate, % of unique rows per batch")
        ax.set_title(f"{title}: Criteo-Kaggle-shaped, {data['num_rows'] / 1e6:.1f} M rows")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(args) -> int:
    set_threads(args.threads)
    device = device_argument(args.device)
    # saved after every row, `complete` false until the end: a run cut short keeps the rows it measured
    payload = {"benchmark": "cache", "device": str(device), "config": {
        k: v for k, v in vars(args).items() if k != "func"}, "hit_rate": None, "timing": None, "complete": False}

    def save(key: str, part: dict) -> None:
        payload[key] = part
        write_json(payload, args.name, args.out)

    if "hit-rate" in args.parts:
        print(f"hit rates ({args.batches} batches of {args.batch_size}, scale {args.scale}) on {device}:")
        payload["hit_rate"] = hit_rates(args, device, lambda part: save("hit_rate", part))
    if "timing" in args.parts:
        print(f"bookkeeping cost (dim {args.dim}, scale {args.timing_scale}):")
        payload["timing"] = timing(args, device, lambda part: save("timing", part))
    payload["complete"] = True
    hits = payload["hit_rate"]
    path = write_json(payload, args.name, args.out)
    written = [path]
    if hits is not None:
        written.append(path.with_name(f"{args.name}_hit_rate.png"))
        plot(hits, written[-1])
    print("wrote " + " and ".join(map(str, written)))
    return 0
