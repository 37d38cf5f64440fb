"""The work of `embcache bench gpu`: DLRM on one GPU, the cache against whole tables on the
GPU. What it measures and how is the command's description, the docstring of
`embcache.bench.gpu_cli` (which holds the flags and imports this module only to run)."""
from __future__ import annotations

import math
import time
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from embcache.bench.common import write_json
from embcache.bench.criteo_trace import CRITEO_KAGGLE_CARDINALITIES, CriteoTrace
from embcache.cache.optimizers import torch_equivalent
from embcache.device import resolve_device
from embcache.nn.cached_embedding_bag import CachedEmbeddingBag
from embcache.nn.dlrm_arch import DLRMDense
from embcache.threads import set_threads

NUM_DENSE = 13
NUM_TABLES = len(CRITEO_KAGGLE_CARDINALITIES)
# the DLRM reference's Criteo layers (the bottom MLP ends at the embedding dim, the top at 1)
DENSE_ARCH, OVER_ARCH = [512, 256], [1024, 1024, 512, 256]


class FlatTables(nn.Module):
    """The 26 tables as one bag over the concatenated id space: ids `[B, F]` -> `[B, F, D]`."""

    def __init__(self, bag: nn.Module, num_tables: int):
        super().__init__()
        self.bag, self.num_tables = bag, num_tables

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        b = ids.shape[0]
        return self.bag(ids.reshape(-1, 1)).view(b, self.num_tables, -1)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make_data(args, trace: CriteoTrace) -> list[tuple]:
    """(ids [B, 26] on the host, dense features, labels) for every step, labels drawn
    from a fixed logistic model of the dense features so that the loss can fall."""
    g = torch.Generator().manual_seed(args.seed + 7)
    w = torch.randn(NUM_DENSE, generator=g)
    out = []
    for ids in trace:
        x = torch.randn(ids.shape[0], NUM_DENSE, generator=g)
        y = torch.bernoulli(torch.sigmoid(x @ w), generator=g)
        out.append((ids, x, y))
    return out


def make_variant(kind: str, ratio: float | None, table: torch.Tensor, freq, dense_state: dict, args, device):
    """(sparse module, its torch optimizer or None, dense model, dense optimizer)."""
    n, dim = table.shape
    if kind == "gpu":
        bag = nn.EmbeddingBag(n, dim, mode="sum", sparse=True, _weight=table.clone()).to(device)
        sparse_opt = torch_equivalent(args.optimizer, bag.parameters(), args.lr)
    else:
        bag = CachedEmbeddingBag(n, dim, cache_ratio=ratio, ids_freq=freq, optimizer=args.optimizer, lr=args.lr,
                                 device=device, weight=table)
        sparse_opt = None
    dense = DLRMDense(NUM_DENSE, NUM_TABLES, dim, DENSE_ARCH, OVER_ARCH).to(device)
    dense.load_state_dict(dense_state)
    return FlatTables(bag, NUM_TABLES), sparse_opt, dense, torch.optim.Adagrad(dense.parameters(), lr=args.lr)


def train_steps(variant, data, device, prefetch_depth: int, start: int, stop: int,
                read_losses: bool = True) -> list[float]:
    """Steps `start..stop-1`; returns the losses (read after the window, not per step)."""
    sparse, sparse_opt, dense, dense_opt = variant
    cached = isinstance(sparse.bag, CachedEmbeddingBag)
    losses = []
    for i in range(start, stop):
        if cached and prefetch_depth and i + prefetch_depth < len(data):
            sparse.bag.prefetch(data[i + prefetch_depth][0].reshape(-1, 1))
        ids, x, y = data[i]
        ids = ids if cached else ids.to(device, non_blocking=True)
        logits = dense(sparse(ids), x.to(device, non_blocking=True)).squeeze(1)
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


def count_syncs(fn, device: torch.device) -> int | None:
    """How many times `fn` makes the host wait for the device: torch's sync debug mode
    warns at each (None off CUDA)."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message).lower() for w in caught)


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


def pinned_copy_gbps(device: torch.device, mib: int = 256, reps: int = 10) -> float | None:
    """Host->device bandwidth of a plain pinned copy: what the cache's copies can reach."""
    if device.type != "cuda":
        return None
    src = torch.empty(mib * 2**20, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty_like(src, device=device)
    dst.copy_(src, non_blocking=True)
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(reps):
        dst.copy_(src, non_blocking=True)
    _sync(device)
    return reps * src.numel() / (time.perf_counter() - t0) / 1e9


def profile_summary(variant, data, args, device, steps: int = 5) -> list[str]:
    """The top ops of a few cached steps by device (else host) time: where a step goes."""
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        train_steps(variant, data, device, args.prefetch_depth, 0, min(steps, len(data)))
        _sync(device)
    key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=key, row_limit=20).splitlines()


def bench_dim(dim: int, args, device, trace, data, freq) -> dict:
    """Every variant at one embedding dim, from the same initial table and dense model."""
    g = torch.Generator().manual_seed(args.seed)
    bound = 1.0 / math.sqrt(trace.num_rows)
    table = torch.rand(trace.num_rows, dim, generator=g).mul_(2 * bound).sub_(bound)
    torch.manual_seed(args.seed)
    dense_state = DLRMDense(NUM_DENSE, NUM_TABLES, dim, DENSE_ARCH, OVER_ARCH).state_dict()
    plan = [("gpu", None, 0)] + [("cached", r, args.prefetch_depth) for r in args.ratios]
    middle = args.ratios[len(args.ratios) // 2]
    if args.prefetch_depth:
        plan.append(("cached", middle, 0))
    rows, profile = [], None
    for kind, ratio, depth in plan:
        variant = make_variant(kind, ratio, table, freq, dense_state, args, device)
        row = {"variant": kind, "ratio": ratio, "prefetch_depth": depth, **measure(variant, data, args, device, depth)}
        if kind == "cached" and ratio == middle and depth and device.type == "cuda" and not args.no_profile:
            profile = profile_summary(variant, data, args, device)
        rows.append(row)
        print(f"  dim {dim:4d} {kind:6s} {'' if ratio is None else f'{ratio:.1%}':>6s} prefetch {depth}: "
              f"{row['samples_per_s']:,.0f} samples/s" + (f", hit rate {row['hit_rate']:.3f}" if ratio else ""),
              flush=True)
        del variant
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return {"dim": dim, "results": summarize(rows), "profile_cached_middle_ratio": profile}


def summarize(rows: list[dict]) -> list[dict]:
    """Ratios to the whole-table run, the loss agreement, and the copy time prefetch hid."""
    base = rows[0]
    for row in rows:
        row["ratio_to_gpu_tables"] = row["samples_per_s"] / base["samples_per_s"]
        row["max_loss_diff_vs_gpu_tables"] = max(abs(a - b) for a, b in zip(row["losses"], base["losses"]))
    without = {r["ratio"]: r["step_ms"] for r in rows if r["variant"] == "cached" and not r["prefetch_depth"]}
    for row in rows:
        if row["variant"] == "cached" and row["prefetch_depth"] and row["ratio"] in without:
            row["step_ms_without_prefetch"] = without[row["ratio"]]
    return rows


def add_link_figures(result: dict, gbps: float | None) -> None:
    """Achieved host<->device traffic against the pinned copy, and the share of the copy
    time (bytes / pinned bandwidth) that prefetch took off the step."""
    for dim_block in result["dims"]:
        for row in dim_block["results"]:
            if row["variant"] != "cached" or gbps is None:
                continue
            moved = row["bytes_h2d_per_step"] + row["bytes_d2h_per_step"]
            row["link_gbps"] = moved / (row["step_ms"] / 1e3) / 1e9
            row["link_share_of_pinned_copy"] = row["link_gbps"] / gbps
            copy_ms = 1e3 * moved / (gbps * 1e9)
            if "step_ms_without_prefetch" in row and copy_ms > 0:
                hidden = (row["step_ms_without_prefetch"] - row["step_ms"]) / copy_ms
                row["copy_time_hidden_by_prefetch"] = min(1.0, max(0.0, hidden))


def plot(result: dict, path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    blocks = result["dims"]
    fig, axes = plt.subplots(1, len(blocks), figsize=(5 * len(blocks), 4), squeeze=False)
    for ax, block in zip(axes[0], blocks):
        rows = block["results"]
        labels = ["whole table" if r["variant"] == "gpu" else
                  f"cached {r['ratio']:.1%}" + ("" if r["prefetch_depth"] else "\nno prefetch") for r in rows]
        ax.bar(range(len(rows)), [r["ratio_to_gpu_tables"] for r in rows], color="tab:blue")
        ax.axhline(0.9, color="tab:red", linestyle="--", linewidth=1, label="target at 1.5 %: 0.9")
        ax.set_xticks(range(len(rows)), labels, fontsize=8)
        ax.set_title(f"dim {block['dim']}")
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

    lines = ["| dim | variant | samples/s | vs whole table | hit rate | MiB moved/step | link GB/s "
             "(of pinned copy) | copy hidden by prefetch | peak device MiB | syncs/step |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for block in result["dims"]:
        for r in block["results"]:
            name = "whole table on the device" if r["variant"] == "gpu" else \
                f"cached {r['ratio']:.1%}" + ("" if r["prefetch_depth"] else ", no prefetch")
            moved = None if r["variant"] == "gpu" else (r["bytes_h2d_per_step"] + r["bytes_d2h_per_step"]) / 2**20
            link = "-" if "link_gbps" not in r else \
                f"{r['link_gbps']:.1f} ({r['link_share_of_pinned_copy']:.0%})"
            lines.append(f"| {block['dim']} | {name} | {r['samples_per_s']:,.0f} | {r['ratio_to_gpu_tables']:.2f} | "
                         f"{fmt(r.get('hit_rate'), '.3f')} | {fmt(moved, '.2f')} | {link} | "
                         f"{fmt(r.get('copy_time_hidden_by_prefetch'), '.0%')} | "
                         f"{fmt(r.get('peak_device_mib'), ',.0f')} | {fmt(r.get('syncs_per_step'), '.1f')} |")
    return lines


def run(args) -> int:
    set_threads(args.threads)
    device = resolve_device(args.device)
    trace = CriteoTrace(scale=args.scale, batch_size=args.batch_size, batches=args.warmup_steps + args.steps,
                        seed=args.seed)
    print(f"DLRM on {device}: {trace.num_rows:,} rows, batch {args.batch_size}, {args.steps} timed steps")
    data = make_data(args, trace)
    # the ids' counts over the run (the trace's `frequencies()`, without drawing it again)
    freq = torch.bincount(torch.cat([ids.flatten() for ids, _, _ in data]), minlength=trace.num_rows)
    gbps = pinned_copy_gbps(device)
    result = {"num_rows": trace.num_rows, "pinned_copy_gbps": gbps,
              "dims": [bench_dim(dim, args, device, trace, data, freq) for dim in args.dims]}
    add_link_figures(result, gbps)
    payload = {"benchmark": "gpu", "device": str(device),
               "config": {k: v for k, v in vars(args).items() if k != "func"}, **result}
    path = write_json(payload, args.name, args.out)
    png = path.with_suffix(".png")
    plot(result, png)
    print("\n".join(markdown_table(result)))
    print(f"wrote {path} and {png} (the table above is docs/cache.md's, \"On a GPU: the device path\")")
    return 0
