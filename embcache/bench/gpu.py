"""The work of `embcache bench gpu`: DLRM on one GPU, the cache against whole tables on the
GPU. What it measures and how is the command's description, the docstring of
`embcache.bench.gpu_cli` (which holds the flags and imports this module only to run)."""
from __future__ import annotations

import math
import time
import traceback
import warnings
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from embcache.bench import link, shard_feed
from embcache.bench.step_ahead import StepAhead
from embcache.bench.criteo_trace import CRITEO_KAGGLE_CARDINALITIES, MULTI_HOT_SIZES, CriteoTrace
from embcache.cache.optimizers import torch_equivalent
from embcache.device import device_argument
from embcache.nn.cached_embedding_bag import CachedEmbeddingBag
from embcache.nn.whole_table import WholeTableBag
from embcache.dlrm.arch import DLRMDense
from embcache.threads import set_threads
from embcache.train.bench_results import write_json
from embcache.train.precision import autocast_modules

NUM_DENSE = 13
NUM_TABLES = len(CRITEO_KAGGLE_CARDINALITIES)
# the DLRM reference's Criteo layers (the bottom MLP ends at the embedding dim, the top at 1)
DENSE_ARCH, OVER_ARCH = [512, 256], [1024, 1024, 512, 256]
SHAPES = {"one-hot": [1] * NUM_TABLES, "multi-hot": MULTI_HOT_SIZES}


class FlatTables(nn.Module):
    """The 26 tables as one bag over the concatenated id space: one-hot ids `[B, F]`, or
    multi-hot (ids, offsets) with one bag a (sample, feature), sample-major -> `[B, F, D]`."""

    def __init__(self, bag: nn.Module, num_tables: int):
        super().__init__()
        self.bag, self.num_tables = bag, num_tables

    @staticmethod
    def bag_args(inputs: tuple) -> tuple:
        """The bag's arguments for a batch's inputs: `(ids [B, F],)` or `(ids, offsets)`."""
        return (inputs[0].reshape(-1, 1),) if len(inputs) == 1 else inputs

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.bag(*self.bag_args(inputs)).view(-1, self.num_tables, self.bag.embedding_dim)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make_data(args, trace: CriteoTrace, shape: str) -> list[tuple]:
    """(the sparse inputs on the host, dense features, labels) for every step: inputs are
    `(ids [B, 26],)` one-hot or `(ids, offsets)` multi-hot; labels drawn from a fixed
    logistic model of the dense features so that the loss can fall."""
    g = torch.Generator().manual_seed(args.seed + 7)
    w = torch.randn(NUM_DENSE, generator=g)
    out = []
    for i in range(trace.num_batches):
        inputs = (trace.batch(i),) if shape == "one-hot" else trace.pooled_batch(i, SHAPES[shape])
        x = torch.randn(trace.batch_size, NUM_DENSE, generator=g)
        y = torch.bernoulli(torch.sigmoid(x @ w), generator=g)
        out.append((inputs, x, y))
    return out


def make_variant(kind: str, ratio: float | None, table: torch.Tensor, freq, dense_state: dict, args, device,
                 bookkeeping: str = "host", kernels: str = "torch"):
    """(sparse module, its torch optimizer or None, dense model, dense optimizer)."""
    n, dim = table.shape
    if kind == "gpu" and kernels == "triton":  # the whole table with the project's kernels
        bag, sparse_opt = WholeTableBag(table, args.optimizer, lr=args.lr, kernels="triton", device=device), None
    elif kind == "gpu":  # a copy of the table on the device (on the CPU a clone: training writes it)
        weight = table.to(device) if device.type != "cpu" else table.clone()
        bag = nn.EmbeddingBag(n, dim, mode="sum", sparse=True, _weight=weight)
        sparse_opt = torch_equivalent(args.optimizer, bag.parameters(), args.lr)
    else:
        bag = CachedEmbeddingBag(n, dim, cache_ratio=ratio, ids_freq=freq, optimizer=args.optimizer, lr=args.lr,
                                 device=device, weight=table, bookkeeping=bookkeeping, kernels=kernels)
        sparse_opt = None
    dense = DLRMDense(NUM_DENSE, NUM_TABLES, dim, DENSE_ARCH, OVER_ARCH).to(device)
    dense.load_state_dict(dense_state)
    autocast_modules([dense], args.precision, device)  # bf16: the dense part autocast, float32 weights and logits
    return FlatTables(bag, NUM_TABLES), sparse_opt, dense, torch.optim.Adagrad(dense.parameters(), lr=args.lr)


def train_steps(variant, data, device, prefetch_depth: int, start: int, stop: int,
                read_losses: bool = True) -> list[float]:
    """Steps `start..stop-1`; returns the losses (read after the window, not per step)."""
    sparse, sparse_opt, dense, dense_opt = variant
    cached = isinstance(sparse.bag, CachedEmbeddingBag)
    losses = []
    for i in range(start, stop):
        if getattr(sparse, "captured", None) is not None and captured_step(variant, data, i, losses):
            continue
        inputs, x, y = data[i]
        inputs = inputs if cached else tuple(t.to(device, non_blocking=True) for t in inputs)
        embedded = sparse(*inputs)
        if cached and prefetch_depth and i + prefetch_depth < len(data):  # after the forward, as a trainer does
            sparse.bag.prefetch(*sparse.bag_args(data[i + prefetch_depth][0]))
        logits = dense(embedded, x.to(device, non_blocking=True)).squeeze(1)
        loss = F.binary_cross_entropy_with_logits(logits, y.to(device, non_blocking=True))
        dense_opt.zero_grad()
        if sparse_opt is not None:
            sparse_opt.zero_grad()
        loss.backward()
        dense_opt.step()
        if sparse_opt is not None:
            sparse_opt.step()
        losses.append(loss.detach())
    return [float(v) for v in losses] if read_losses else []


def whole_step(variant):
    """One step of the whole table with the project's kernels, as a function of its inputs
    (dense features, labels, then the sparse inputs): what `CapturedStep` captures."""
    sparse, _, dense, dense_opt = variant

    def step(x, y, *inputs):
        dense_opt.zero_grad(set_to_none=True)
        logits = dense(sparse(*inputs), x).squeeze(1)
        loss = F.binary_cross_entropy_with_logits(logits, y)
        loss.backward()
        dense_opt.step()
        return loss.detach()

    step.variant = variant  # what it trains (a test's stand-in for the capture reads it)
    return step


def capture(variant, args, device, make_step=None) -> str:
    """Give the whole table with Triton's kernels, or the cached bag with the device
    bookkeeper, a captured step (`train.step_graph`) where `--cuda-graphs` and the step
    allow; returns what was decided, in a few words. With `--prefetch-depth` >= 1 the
    cached step prefetches the next batch inside its graph (`step_ahead`); its counters are
    device tensors the replays update, so its hit rate is the replays' own. `make_step`:
    what captures a step function (`CapturedStep`; a test's stand-in)."""
    from embcache.train.step_graph import CapturedStep, choose_graphs

    choice = choose_graphs(args.cuda_graphs, device, variant[0])
    if not choice.capture:
        return f"off: {choice.reason}"
    make_step = make_step or (lambda fn: CapturedStep(fn, device, warmup=2))
    sparse = variant[0]
    if isinstance(sparse.bag, CachedEmbeddingBag) and args.prefetch_depth:
        sparse.ahead = StepAhead(variant, device)
        sparse.ahead.captured = sparse.captured = make_step(sparse.ahead.captured_fn)
    else:
        sparse.captured = make_step(whole_step(variant))
    return "on"


def captured_step(variant, data: list, i: int, losses: list) -> bool:
    """Step `i` through the captured graph (False: its capture failed, said once and kept in
    `graph_failed`; the caller runs the step eagerly, which nothing of the failed one ran)."""
    sparse = variant[0]
    inputs, x, y = data[i]
    try:
        if getattr(sparse, "ahead", None) is not None:
            sparse.ahead.step(data, i, losses)
        else:
            losses.append(sparse.captured(x, y, *inputs))
        return True
    except RuntimeError as err:
        sparse.captured, sparse.ahead = None, None
        sparse.graph_failed = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
        print(f"  the step could not be captured ({sparse.graph_failed}): it runs eagerly", flush=True)
        return False


def count_syncs(fn, device: torch.device, sites: list[str] | None = None) -> int | None:
    """How many times `fn` makes the host wait for the device: torch's sync debug mode
    warns at each (None off CUDA). With `sites`, each wait's innermost frame of this
    project's code is appended to it (`file:line in function: source`), so that a budget
    test that fails says where."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    count = 0

    def record(message, category, filename, lineno, file=None, line=None):
        nonlocal count
        if "synchroniz" not in str(message).lower():
            return
        count += 1
        if sites is not None:
            sites.append(_project_frame(traceback.extract_stack()[:-1]))

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return count


def _project_frame(stack) -> str:
    """The innermost frame of embcache's or cpu_kernels' code in `stack` (else the innermost)."""
    ours = [f for f in stack if ("/embcache/" in f.filename or "/cpu_kernels/" in f.filename)
            and not f.filename.endswith("bench/gpu.py")]
    f = (ours or stack)[-1]
    where = f.filename.rsplit("/embcache/", 1)[-1] if "/embcache/" in f.filename else \
        "/".join(f.filename.split("/")[-2:])  # the path inside the package (cache/bookkeeping/row_cache.py)
    return f"{where}:{f.lineno} in {f.name}: {f.line}"


def measure(variant, data, args, device, prefetch_depth: int) -> dict:
    """Warm up, then time a window of steps; statistics cover the window only."""
    sparse = variant[0]
    cached = isinstance(sparse.bag, CachedEmbeddingBag)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    warm = train_steps(variant, data, device, prefetch_depth, 0, args.warmup_steps)
    if cached:
        sparse.bag.reset_cache_stats()
    _sync(device)
    t0 = time.perf_counter()
    timed = train_steps(variant, data, device, prefetch_depth, args.warmup_steps, len(data))
    _sync(device)
    seconds = time.perf_counter() - t0
    row = {"samples_per_s": args.steps * args.batch_size / seconds, "step_ms": 1e3 * seconds / args.steps,
           "losses": warm + timed}
    if device.type == "cuda":
        row["peak_device_mib"] = torch.cuda.max_memory_allocated(device) / 2**20
        steps = min(3, len(data))  # a few more steps, their losses not read: the step's own waits
        row["syncs_per_step"] = count_syncs(
            lambda: train_steps(variant, data, device, prefetch_depth, 0, steps, read_losses=False), device) / steps
    if cached:
        s = sparse.bag.cache_stats()
        row.update(hit_rate=s["hit_rate"], bytes_h2d_per_step=s["bytes_h2d"] / args.steps,
                   bytes_d2h_per_step=s["bytes_d2h"] / args.steps, overflow_rows=s["overflow_rows"],
                   bypassed_rows=s.get("bypassed_rows", 0))
    return row


def profile_summary(variant, data, args, device, steps: int = 5) -> list[str]:
    """The top ops of a few steps (a captured step's replays where it is captured) by device
    (else host) time: where a step goes."""
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        train_steps(variant, data, device, args.prefetch_depth, 0, min(steps, len(data)))
        _sync(device)
    key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=key, row_limit=20).splitlines()


def initial_table(num_rows: int, dim: int, seed: int, device: torch.device) -> torch.Tensor:
    """The table every variant starts from, on the host (drawn on the device where it is a
    GPU: a Kaggle-scale table at dim 128 is 4.3 G values, minutes for one host thread)."""
    where = device if device.type == "cuda" else torch.device("cpu")
    g = torch.Generator(device=where).manual_seed(seed)
    bound = 1.0 / math.sqrt(num_rows)
    return torch.rand(num_rows, dim, generator=g, device=where).mul_(2 * bound).sub_(bound).cpu()


def bench_block(shape: str, dim: int, table: torch.Tensor, args, device, data, freq,
                on_row: Callable[[dict], object] = lambda block: None) -> dict:
    """Every variant at one shape and dim, from the same initial table and dense model.
    `on_row` gets the block as measured so far after each variant: a run cut short by its
    time limit (a GPU machine's few minutes) keeps every row it finished."""
    torch.manual_seed(args.seed)
    dense_state = DLRMDense(NUM_DENSE, NUM_TABLES, dim, DENSE_ARCH, OVER_ARCH).state_dict()
    from embcache.kernels import resolve_kernels

    whole = ["torch"] + (["triton"] if "triton" in {resolve_kernels(k, device) for k in args.kernels} else [])
    plan = [("gpu", None, 0, None, k) for k in whole] + [("cached", r, args.prefetch_depth, b, k)
                                                         for r in (args.ratios if args.cached else [])
                                                         for b in args.bookkeeping
                                                         for k in (args.kernels if b == "device" else ["torch"])]
    middle = args.ratios[len(args.ratios) // 2]
    if args.prefetch_depth and args.price_prefetch and args.cached:
        first = args.bookkeeping[0]
        plan.append(("cached", middle, 0, first, args.kernels[0] if first == "device" else "torch"))
    rows, profile, whole_profile = [], {}, None

    def block() -> dict:
        return {"shape": shape, "dim": dim, "results": summarize(rows), "profile_cached_middle_ratio": profile or None,
                "profile_whole_table_triton": whole_profile}

    for kind, ratio, depth, book, kernels in plan:
        variant = make_variant(kind, ratio, table, freq, dense_state, args, device, book or "host", kernels)
        kernels = variant[0].bag.cache.kernels if kind == "cached" else kernels  # "auto" as it resolved
        graphs = capture(variant, args, device) if (kind, kernels) == ("gpu", "triton") or book == "device" else \
            "off: " + ("the host bookkeeper syncs" if kind == "cached" else "torch's sparse optimizer is not capturable")
        depth = min(depth, 1) if graphs == "on" else depth  # a captured step prefetches one batch ahead at most
        row = {"variant": kind, "ratio": ratio, "prefetch_depth": depth, "bookkeeping": book, "kernels": kernels,
               "batch_size": args.batch_size, **measure(variant, data, args, device, depth)}
        failed = getattr(variant[0], "graph_failed", None)
        row["cuda_graphs"] = f"off: capture failed ({failed})" if failed else graphs
        if kind == "cached" and ratio == middle and depth and device.type == "cuda" and not args.no_profile:
            profile[book if len(args.kernels) == 1 else f"{book}, {kernels} kernels"] = \
                profile_summary(variant, data, args, device)
        if (kind, kernels) == ("gpu", "triton") and device.type == "cuda" and not args.no_profile:
            whole_profile = profile_summary(variant, data, args, device)  # captured where `cuda_graphs` says so
        rows.append(row)
        on_row(block())
        print(f"  {shape} dim {dim:4d} {kind:6s} {'' if ratio is None else f'{ratio:.1%}':>6s} "
              f"{'' if book is None else book + ' bookkeeping, '}{kernels} kernels, prefetch {depth}: "
              f"{row['samples_per_s']:,.0f} samples/s" + (f", hit rate {row['hit_rate']:.3f}" if ratio else ""),
              flush=True)
        del variant
        if device.type == "cuda":  # give back the device's and the pinned host memory before the next variant
            torch.cuda.empty_cache()
            getattr(torch._C, "_host_emptyCache", lambda: None)()
    return block()


def summarize(rows: list[dict]) -> list[dict]:
    """Ratios to the whole-table run, the loss agreement, and the copy time prefetch hid."""
    base = rows[0]
    for row in rows:
        row["ratio_to_gpu_tables"] = row["samples_per_s"] / base["samples_per_s"]
        row["max_loss_diff_vs_gpu_tables"] = max(abs(a - b) for a, b in zip(row["losses"], base["losses"]))
    def key(r):
        return r["ratio"], r["bookkeeping"], r.get("kernels", "torch")

    without = {key(r): r["step_ms"] for r in rows if r["variant"] == "cached" and not r["prefetch_depth"]}
    for row in rows:
        if row["variant"] == "cached" and row["prefetch_depth"] and key(row) in without:
            row["step_ms_without_prefetch"] = without[key(row)]
    return rows


def add_link_figures(result: dict, gbps: float | None, batch_size: int) -> None:
    """Achieved host<->device traffic against the pinned copy; the share of the copy time
    (bytes / pinned bandwidth) that prefetch took off the step; and the link's bound: the
    samples/s at which a step's bytes, moved as scattered rows through the unified view
    (`random_rows`, measured at the row width in the same run), would fill the link alone
    (`link_bound_samples_per_s`; `link_bound_fraction` is the run's share of it)."""
    for block in result["blocks"]:
        rate = result["random_rows"].get(str(block["dim"]))
        for row in block["results"]:
            if row["variant"] != "cached":
                continue
            moved = row["bytes_h2d_per_step"] + row["bytes_d2h_per_step"]
            if rate is not None and moved > 0:
                link_s = (row["bytes_h2d_per_step"] / (rate["gather_gbps"] * 1e9)
                          + row["bytes_d2h_per_step"] / (rate["scatter_gbps"] * 1e9))
                row["link_bound_samples_per_s"] = batch_size / link_s
                row["link_bound_fraction"] = row["samples_per_s"] / row["link_bound_samples_per_s"]
            if gbps is None:
                continue
            row["link_gbps"] = moved / (row["step_ms"] / 1e3) / 1e9
            row["link_share_of_pinned_copy"] = row["link_gbps"] / gbps
            copy_ms = 1e3 * moved / (gbps * 1e9)
            if "step_ms_without_prefetch" in row and copy_ms > 0:
                hidden = (row["step_ms_without_prefetch"] - row["step_ms"]) / copy_ms
                row["copy_time_hidden_by_prefetch"] = min(1.0, max(0.0, hidden))


def flat_rows(result: dict, device_name: str) -> list[dict]:
    """One row per run with the keys a reader compares across cards and bookkeepers."""
    out = []
    for block in result["blocks"]:
        for r in block["results"]:
            out.append({"device_name": device_name, "bookkeeping": r["bookkeeping"],
                        "kernels": r.get("kernels", "torch"), "batch_size": r.get("batch_size"),
                        "cuda_graphs": r.get("cuda_graphs", "off"),
                        "variant": "cached" if r["variant"] == "cached" else "whole table on the device",
                        "shape": block["shape"], "dim": block["dim"], "cache_ratio": r["ratio"],
                        "prefetch_depth": r["prefetch_depth"], "samples_per_s": r["samples_per_s"],
                        "vs_all_on_gpu": r["ratio_to_gpu_tables"],
                        "link_bound_fraction": r.get("link_bound_fraction"), "hit_rate": r.get("hit_rate"),
                        "bytes_moved_per_step": None if r["variant"] != "cached" else
                        r["bytes_h2d_per_step"] + r["bytes_d2h_per_step"],
                        "peak_device_mib": r.get("peak_device_mib"), "syncs_per_step": r.get("syncs_per_step")})
    return out


def plot(result: dict, path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    blocks = result["blocks"]
    fig, axes = plt.subplots(1, len(blocks), figsize=(5 * len(blocks), 4), squeeze=False)
    for ax, block in zip(axes[0], blocks):
        rows = block["results"]
        labels = ["whole table" if r["variant"] == "gpu" else
                  f"cached {r['ratio']:.1%}\n{r['bookkeeping']}" + ("" if r["prefetch_depth"] else ", no prefetch")
                  for r in rows]
        ax.bar(range(len(rows)), [r["ratio_to_gpu_tables"] for r in rows], color="tab:blue")
        ax.axhline(0.9, color="tab:red", linestyle="--", linewidth=1, label="target at 1.5 %: 0.9")
        ax.set_xticks(range(len(rows)), labels, fontsize=8)
        ax.set_title(f"{block['shape']}, dim {block['dim']}")
        ax.set_ylabel("samples/s vs whole table on the device")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def markdown_table(result: dict) -> list[str]:
    """The GPU table of docs/cache.md ("On a GPU: the device path"), one row per variant:
    what the benchmark measured, read at a glance (the ratio to the whole table on the
    device first)."""
    def fmt(value, spec: str, scale: float = 1.0) -> str:
        return "-" if value is None else format(value * scale, spec)

    lines = ["| shape | dim | variant | samples/s | vs whole table | of link bound | hit rate | MiB moved/step | "
             "link GB/s (of pinned copy) | copy hidden by prefetch | peak device MiB | syncs/step |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for block in result["blocks"]:
        for r in block["results"]:
            name = "whole table on the device" if r["variant"] == "gpu" else \
                f"cached {r['ratio']:.1%}, {r['bookkeeping']} bookkeeping" + ("" if r["prefetch_depth"] else ", no prefetch")
            name += ", triton kernels" if r.get("kernels") == "triton" else ""
            moved = None if r["variant"] == "gpu" else (r["bytes_h2d_per_step"] + r["bytes_d2h_per_step"]) / 2**20
            link_rate = "-" if "link_gbps" not in r else \
                f"{r['link_gbps']:.1f} ({r['link_share_of_pinned_copy']:.0%})"
            lines.append(f"| {block['shape']} | {block['dim']} | {name} | {r['samples_per_s']:,.0f} | "
                         f"{r['ratio_to_gpu_tables']:.2f} | {fmt(r.get('link_bound_fraction'), '.0%')} | "
                         f"{fmt(r.get('hit_rate'), '.3f')} | {fmt(moved, '.2f')} | {link_rate} | "
                         f"{fmt(r.get('copy_time_hidden_by_prefetch'), '.0%')} | "
                         f"{fmt(r.get('peak_device_mib'), ',.0f')} | {fmt(r.get('syncs_per_step'), '.1f')} |")
    return lines


def run(args) -> int:
    set_threads(args.threads)
    device = device_argument(args.device)
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    trace = CriteoTrace(scale=args.scale, batch_size=args.batch_size, batches=args.warmup_steps + args.steps,
                        seed=args.seed)
    feed = shard_feed.open_feed(args, device) if args.from_shards else None  # the step fed from prepared shards
    num_rows, shapes = (feed.num_rows, ["one-hot"]) if feed else (trace.num_rows, args.shapes)
    print(f"DLRM on {device_name}: {num_rows:,} rows, batch {args.batch_size}, {args.steps} timed steps, "
          f"{', '.join(shapes)}" + (f", from {args.from_shards}" if feed else ""), flush=True)
    gbps = link.pinned_copy_gbps(device)
    # the link's random-row rate at each row width (on the CPU: memory's, which bounds nothing)
    try:
        rates = {str(d): link.random_row_gbps(device, 4 * d, args.link_table_mib) for d in args.dims}
    except (RuntimeError, ValueError, TypeError) as e:  # no unified view on this torch: no bound, said so
        print(f"  the link's random-row rate could not be measured ({type(e).__name__}: {e}): no link bound")
        rates = {}
    blocks = []
    result = {"num_rows": num_rows, "pinned_copy_gbps": gbps, "random_rows": rates, "blocks": blocks}

    def save():  # after every block: a run cut short keeps what it measured
        add_link_figures(result, gbps, args.batch_size)
        payload = {"benchmark": "gpu", "device": str(device), "device_name": device_name,
                   "config": {k: v for k, v in vars(args).items() if k != "func"},
                   "rows": [{**r, "precision": args.precision} for r in flat_rows(result, device_name)], **result}
        if feed:
            shard_feed.add_loader_figures(payload, feed.rates, feed.readers)
        return write_json(payload, args.name, args.out)

    for dim in args.dims:
        table = initial_table(num_rows, dim, args.seed, device)
        for shape in shapes:
            data = feed if feed else make_data(args, trace, shape)
            # the ids' counts over the run (the trace's `frequencies()`, without drawing it again)
            freq = torch.bincount(torch.cat([inputs[0].flatten() for inputs, _, _ in data]), minlength=num_rows)
            # each batch's distinct rows: what a cache smaller than a batch serves beside itself
            distinct = [int(torch.unique(inputs[0]).numel()) for inputs, _, _ in data]
            blocks.append(None)  # set from the first row on

            def keep(block, at=len(blocks) - 1, distinct=distinct):
                blocks[at] = {**block, "distinct_rows_per_batch": distinct}
                return save()

            path = keep(bench_block(shape, dim, table, args, device, data, freq, on_row=keep))
            del data, freq
        del table
    png = path.with_suffix(".png")
    plot(result, png)
    print("\n".join(markdown_table(result)))
    print(f"wrote {path} and {png} " + ("(the table above is docs/cache.md's, \"On a GPU: the device path\")"
                                         if device.type == "cuda" else
                                         "(on the CPU: a check of the run, not the docs' GPU figures)"))
    if feed:
        feed.close()
    return 0
