"""The host's ceiling: how many samples a second the cache's host-side work allows, with
no device work at all, so that a GPU is never what it measures.

The bookkeeping of the cache lives on the host, beside the ids: every id of every batch
passes through it before a GPU sees a row. This runs the DLRM trainer's whole sparse path
as a training loop drives it (a `KeyedJaggedTensor` of 26 Criteo features -> group inputs
and their checks -> the prefetch's admission -> gathers of the missed rows from the host
store -> the forward's lookup -> the backward's host share: dirty bits and holds) over a
`CachedEmbeddingBagCollection` whose rows sit on torch's `meta` device: shapes without
values, so every device operation costs nothing, while the host store, the slot map, the
policy and the gathers are real. At full Kaggle cardinalities (33.8 M rows), batch 16,384,
for each cache ratio and thread count (torch's and numba's), side by side in one run:

- `one-hot`: 26 ids a sample (Criteo Kaggle's shape);
- `multi-hot`: MLPerf DLRM-DCNv2's pooling factors (1 to 100 ids per feature, 214 a
  sample) over the same tables (MLPerf's own tables, 188 M rows capped at 40 M a table,
  do not fit this machine's memory with their optimizer state).

Reported: samples/s and ids/s of host ceiling (the median step), the time of each part
per step, the speed-up with threads, and a projection to a 16-core host by Amdahl's law
from the measured 1- and 2-thread figures (the serial share read off their ratio).
Not counted: what a GPU step adds on the host (the copies' launches), and reading the
Parquet batches, which the trainer does in a background thread.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import os
import time

import numba
import numpy as np
import torch

from embcache.bench.common import DEFAULT_RESULTS_DIR, write_json
from embcache.bench.criteo_trace import CRITEO_KAGGLE_CARDINALITIES, bounded_zipf, scaled_cardinalities
from embcache.cache import row_cache, transfers
from embcache.nn import cached_collection
from embcache.nn.cached_collection import CachedEmbeddingBagCollection
from embcache.sparse_types import EmbeddingBagConfig, KeyedJaggedTensor

# ids per sample of each of the 26 features in MLPerf DLRM-DCNv2's multi-hot Criteo data
MULTI_HOT_SIZES = [3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1]
PROJECTED_CORES = 16
ROUNDS = 2  # each thread count is measured this many times, interleaved with the others
# the parts of a step, each the time spent in one function (and what it calls)
PARTS = {
    "group_inputs": (cached_collection, "_group_input"),
    "admission": (row_cache.RowCache, "_admit"),
    "gathers": (transfers.RowTransfers, "gather"),
    "forward_reuse": (row_cache.RowCache, "_reuse"),
    "holds": (row_cache.RowCache, "_hold"),
    "backward_host": (row_cache.RowCache, "apply_gradient"),
}


def build_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scale", type=float, default=1.0, help="times the Kaggle cardinalities (1.0: 33.8 M rows)")
    p.add_argument("--batch-size", type=int, default=16384)
    p.add_argument("--dim", type=int, default=16, help="embedding dim (the host store's row width)")
    p.add_argument("--ratios", type=float, nargs="+", default=[0.005, 0.015, 0.05], help="cache ratios")
    p.add_argument("--threads", type=int, nargs="+", default=None,
                   help="thread counts to measure (default: 1 up to all cores, doubling)")
    p.add_argument("--shapes", nargs="+", default=["one-hot", "multi-hot"], choices=["one-hot", "multi-hot"])
    p.add_argument("--steps", type=int, default=8,
                   help=f"timed steps per thread count and round ({ROUNDS} rounds; the median is reported)")
    p.add_argument("--warmup-steps", type=int, default=5, help="untimed steps first (compilation, warm caches)")
    p.add_argument("--eviction", default="freq", choices=["freq", "lfu", "lru"])
    p.add_argument("--prefetch-depth", type=int, default=1, help="batches prefetched ahead, as the trainer")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(DEFAULT_RESULTS_DIR), help="results directory")
    p.add_argument("--name", default="host", help="results file stem")
    p.set_defaults(func=run)
    return p


class PartTimer:
    """Seconds spent in each of `PARTS` (outermost calls only), by wrapping them for the
    duration of a `with` block."""

    def __init__(self):
        self.seconds = dict.fromkeys(PARTS, 0.0)
        self._depth = dict.fromkeys(PARTS, 0)

    @contextlib.contextmanager
    def installed(self):
        saved = {name: getattr(owner, attr) for name, (owner, attr) in PARTS.items()}
        try:
            for name, (owner, attr) in PARTS.items():
                setattr(owner, attr, self._timed(name, saved[name]))
            yield self
        finally:
            for name, (owner, attr) in PARTS.items():
                setattr(owner, attr, saved[name])

    def _timed(self, name, fn):
        @functools.wraps(fn)
        def wrapper(*a, **kw):
            self._depth[name] += 1
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                self._depth[name] -= 1
                if self._depth[name] == 0:
                    self.seconds[name] += time.perf_counter() - t0
        return wrapper

    def take(self) -> dict:
        out, self.seconds = self.seconds, dict.fromkeys(PARTS, 0.0)
        return out


def make_batches(cardinalities: list[int], sizes: list[int], batch: int, count: int, seed: int) -> list:
    """`count` KJTs of Zipf ids (exponent 1.05-1.25 per feature, hot ids scattered over
    each table as in `CriteoTrace`), feature f with `sizes[f]` ids a sample."""
    rng = np.random.default_rng(seed)
    exponents = rng.uniform(1.05, 1.25, len(cardinalities))
    keys = [f"f{i}" for i in range(len(cardinalities))]
    lengths = torch.from_numpy(np.repeat(np.asarray(sizes, dtype=np.int64), batch))
    out = []
    for i in range(count):
        r = np.random.default_rng((seed, i))
        cols = [(bounded_zipf(r, n, s, batch * k) * 2_147_483_647) % n
                for n, s, k in zip(cardinalities, exponents, sizes)]
        out.append(KeyedJaggedTensor(keys=keys, values=torch.from_numpy(np.concatenate(cols)), lengths=lengths))
    return out


def id_counts(batches: list, cardinalities: list[int]) -> dict[str, torch.Tensor]:
    """Per-table id counts over the batches (the `ids_freq` a run computes beforehand)."""
    per_feature = [[] for _ in cardinalities]
    for kjt in batches:
        sizes = kjt.lengths().view(len(cardinalities), -1).sum(1).tolist()
        for parts, ids in zip(per_feature, kjt.values().split(sizes)):
            parts.append(ids)
    return {f"t{i}": torch.bincount(torch.cat(parts), minlength=n)
            for i, (n, parts) in enumerate(zip(cardinalities, per_feature))}


def _zero(weight: torch.Tensor) -> torch.Tensor:
    return weight.zero_()  # the values never matter here: no row is ever read on `meta`


def build_collection(cardinalities, dim: int, ratio: float, freq: dict, eviction: str):
    tables = [EmbeddingBagConfig(name=f"t{i}", embedding_dim=dim, num_embeddings=int(n), feature_names=[f"f{i}"],
                                 init_fn=_zero) for i, n in enumerate(cardinalities)]
    return CachedEmbeddingBagCollection(tables, cache_ratio=ratio, ids_freq=freq, device="meta",
                                        eviction=eviction, optimizer="adagrad")


def set_threads(n: int) -> None:
    torch.set_num_threads(n)
    numba.set_num_threads(n)


def time_steps(ebc, batches: list, depth: int, timer: PartTimer) -> tuple[list[float], list[dict]]:
    """Train over `batches` as the trainer does (prefetch `depth` ahead after each
    forward, the first `depth` prefetched before); returns each step's seconds and parts."""
    steps, parts = [], []
    for b in batches[:depth]:
        ebc.prefetch(b)
    timer.take()
    for i in range(len(batches) - depth):
        t0 = time.perf_counter()
        out = ebc(batches[i])
        ebc.prefetch(batches[i + depth])
        out.values().sum().backward()
        steps.append(time.perf_counter() - t0)
        parts.append(timer.take())
    return steps, parts


def measure(ebc, batches: list, threads: list[int], args, timer: PartTimer) -> dict[int, dict]:
    """Per thread count, the median step and the mean parts. The cache is brought to its
    steady state by an untimed pass first; then each thread count trains its own fresh
    stretch of the trace (a stretch seen twice would hit more), the counts interleaved over
    `ROUNDS` rounds so that a change of load on a shared machine touches them alike."""
    span = args.steps + args.prefetch_depth
    time_steps(ebc, batches[: args.warmup_steps + args.prefetch_depth], args.prefetch_depth, timer)
    ebc.reset_cache_stats()
    got = {t: ([], []) for t in threads}
    start = args.warmup_steps
    for _ in range(ROUNDS):
        for t in threads:
            set_threads(t)
            steps, parts = time_steps(ebc, batches[start: start + span], args.prefetch_depth, timer)
            got[t][0].extend(steps)
            got[t][1].extend(parts)
            start += args.steps
    set_threads(threads[-1])
    return {t: {"step_s": float(np.median(steps)),
                "parts_s": {k: float(np.mean([p[k] for p in parts])) for k in PARTS}}
            for t, (steps, parts) in got.items()}


def projection(rate_1: float, rate_2: float, cores: int = PROJECTED_CORES) -> dict:
    """Amdahl's law through the measured 1- and 2-thread rates: the serial share s from
    the 2-thread speed-up S2 = 1 / (s + (1 - s) / 2), then the rate at `cores`."""
    s2 = rate_2 / rate_1
    serial = min(1.0, max(0.0, 2.0 / s2 - 1.0))
    speedup = 1.0 / (serial + (1.0 - serial) / cores)
    return {"serial_share": serial, "speedup": speedup, "samples_per_s": rate_1 * speedup, "cores": cores}


def run(args) -> int:
    cores = os.cpu_count() or 1
    threads = args.threads or sorted({min(cores, 2 ** k) for k in range(cores.bit_length() + 1)})
    cardinalities = scaled_cardinalities(args.scale) if args.scale != 1.0 else list(CRITEO_KAGGLE_CARDINALITIES)
    timer = PartTimer()
    results = []
    for shape in args.shapes:
        sizes = [1] * len(cardinalities) if shape == "one-hot" else MULTI_HOT_SIZES
        n_steps = args.warmup_steps + ROUNDS * len(threads) * args.steps + 2 * args.prefetch_depth
        print(f"bench host: {shape}: drawing {n_steps} batches of {args.batch_size} x {sum(sizes)} ids", flush=True)
        batches = make_batches(cardinalities, sizes, args.batch_size, n_steps, args.seed)
        freq = id_counts(batches, cardinalities)
        ids_per_sample = sum(sizes)
        for ratio in args.ratios:
            ebc = build_collection(cardinalities, args.dim, ratio, freq, args.eviction)
            with timer.installed():
                measured = measure(ebc, batches, threads, args, timer)
            hit_rate = ebc.cache_stats()["hit_rate"]
            for t, r in measured.items():
                rate = args.batch_size / r["step_s"]
                results.append({"shape": shape, "ratio": ratio, "threads": t, "samples_per_s": rate,
                                "ids_per_s": rate * ids_per_sample, "ids_per_sample": ids_per_sample,
                                "hit_rate": hit_rate, **r})
                parts = "  ".join(f"{k} {1e3 * v:.1f}" for k, v in r["parts_s"].items())
                print(f"  {shape} {ratio:.3%} {t} thread(s): {rate:,.0f} samples/s "
                      f"({1e3 * r['step_s']:.1f} ms/step; ms: {parts})", flush=True)
            del ebc
    summary = summarize(results)
    for s in summary:
        print(f"bench host: {s['shape']} {s['ratio']:.3%}: 1 thread {s['samples_per_s_1']:,.0f} samples/s"
              + (f", 2 threads x{s['speedup_2']:.2f}, projected {PROJECTED_CORES} cores "
                 f"{s['projected']['samples_per_s']:,.0f}" if "speedup_2" in s else ""))
    path = write_json({"config": vars(args) | {"func": None, "threads": threads}, "results": results,
                       "summary": summary}, args.name, args.out)
    png = plot(results, path.with_suffix(".png"))
    print(f"bench host: wrote {path}" + (f" and {png}" if png else ""))
    return 0


def summarize(results: list[dict]) -> list[dict]:
    out = []
    for shape, ratio in dict.fromkeys((r["shape"], r["ratio"]) for r in results):
        by_t = {r["threads"]: r["samples_per_s"] for r in results if r["shape"] == shape and r["ratio"] == ratio}
        row = {"shape": shape, "ratio": ratio, "samples_per_s_1": by_t.get(1)}
        if 1 in by_t and 2 in by_t:
            row["speedup_2"] = by_t[2] / by_t[1]
            row["projected"] = projection(by_t[1], by_t[2])
        out.append(row)
    return out


def plot(results: list[dict], path) -> str | None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    shapes = list(dict.fromkeys(r["shape"] for r in results))
    fig, axes = plt.subplots(1, len(shapes), figsize=(5.5 * len(shapes), 4), squeeze=False)
    for ax, shape in zip(axes[0], shapes):
        for ratio in dict.fromkeys(r["ratio"] for r in results if r["shape"] == shape):
            rows = sorted((r for r in results if r["shape"] == shape and r["ratio"] == ratio),
                          key=lambda r: r["threads"])
            ax.plot([r["threads"] for r in rows], [r["samples_per_s"] / 1e6 for r in rows], "o-",
                    label=f"cache {ratio:.1%}")
        ax.set_title(f"host ceiling, {shape}")
        ax.set_xlabel("threads")
        ax.set_ylabel("M samples/s")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)
