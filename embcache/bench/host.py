"""The work of `embcache bench host`: the host's ceiling, the cache's host-side work alone
(its rows on `meta`). What it measures and how is the command's description, the docstring of
`embcache.bench.host_cli` (which holds the flags and imports this module only to run)."""
from __future__ import annotations

import contextlib
from collections import Counter
import functools
import os
import time

import numba
import numpy as np
import torch

from embcache.bench.criteo_trace import CRITEO_KAGGLE_CARDINALITIES, MULTI_HOT_SIZES, bounded_zipf, scaled_cardinalities
from embcache.bench.defaults import HOST_ROUNDS as ROUNDS
from embcache.cache.open_keys import open_table
from embcache.cache.bookkeeping import row_cache
from embcache.cache.stores import transfers
from embcache.nn import cached_collection
from embcache.nn.cached_collection import CachedEmbeddingBagCollection
from embcache.nn.cached_embedding_bag import KeyedEmbeddingBag
from embcache.sparse_types import EmbeddingBagConfig, KeyedJaggedTensor
from embcache.train.bench_results import write_json

PROJECTED_CORES = 16
WARMUP_RATIO = 0.7  # of each cache, filled with the hottest rows by their counts before the first step
# the parts of a step, each the time spent in one function (and what it calls)
PARTS = {
    "group_inputs": (cached_collection.CachedEmbeddingBagCollection, "_group_inputs"),
    "admission": (row_cache.RowCache, "_admit"),
    "gathers": (transfers.RowTransfers, "gather"),
    "forward_reuse": (row_cache.RowCache, "_reuse"),
    "holds": (row_cache.RowCache, "_hold"),
    "backward_host": (row_cache.RowCache, "apply_gradient"),
    # open tables only: the prefetch's key lookup, the forward's map of keys to rows (new
    # keys, uses, retirement), and the forward's reuse of a prefetch whose rows differ
    # where keys were new (its admission of those positions is counted in both)
    "key_lookup_ahead": (open_table.OpenTable, "rows_ahead"),
    "key_map": (open_table.OpenTable, "map"),
    "forward_reuse_part": (row_cache.RowCache, "_reuse_part"),
}


DEVICE_VARIANT = "device bookkeeping"  # the variant of `--bookkeeping device`


def launches_per_step(ebc, batches: list, depth: int) -> dict:
    """The operations one training step issues to the device (forward, prefetch of the
    batch `depth` ahead, backward with the update), counted on meta: the device
    bookkeeper's whole host cost on a GPU is issuing these. Counted in the trainer's steady
    state: one uncounted step first drops whatever prefetches the timed runs left pending (a
    drop is an operation), so the count does not depend on how many steps ran before."""
    from embcache.bench.op_count import count_ops

    for b in batches[:depth]:
        ebc.prefetch(b)
    parts = {}

    def forward(i: int = 1):
        parts["out"] = ebc(batches[i])

    def prefetch(i: int = 1):
        if depth:
            ebc.prefetch(batches[i + depth])

    def backward():  # the loss's sum, then the backward with the update
        parts.pop("out").values().sum().backward()

    forward(0), prefetch(0), backward()  # the steady state: exactly the next batch's prefetch pending
    counters = {name: count_ops(fn) for name, fn in (("forward", forward), ("prefetch", prefetch),
                                                    ("backward", backward))}
    by_op = sum((c.ops for c in counters.values()), Counter())
    return {"total": sum(c.total for c in counters.values()),
            "by_part": {name: c.total for name, c in counters.items()},
            "by_op": dict(by_op.most_common())}


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


def build_collection(cardinalities, dim: int, ratio: float, freq: dict | None, eviction: str, raw: bool = False,
                     device: str = "meta", bookkeeping: str = "host", kernels: str = "torch"):
    """The collection the bench times; `raw`: every table open (rows made as keys arrive),
    each given its ids' counts as its keys' (`key_counts`), so that the two differ by the
    key index alone, not by the `freq` policy's prior."""
    tables = [EmbeddingBagConfig(name=f"t{i}", embedding_dim=dim, num_embeddings=int(n), feature_names=[f"f{i}"],
                                 init_fn=_zero) for i, n in enumerate(cardinalities)]
    open_tables = {t.name: {} if freq is None else {"key_freq": key_counts(freq[t.name])} for t in tables} \
        if raw else None
    ebc = CachedEmbeddingBagCollection(tables, cache_ratio=ratio, ids_freq=None if raw else freq, device=device,
                                       eviction=eviction, optimizer="adagrad", warmup_ratio=WARMUP_RATIO,
                                       open_tables=open_tables, bookkeeping=bookkeeping, kernels=kernels)
    if torch.device(device).type == "meta" and bookkeeping == "host":
        for bag in ebc.bags:
            _host_share_only(bag.cache)
    return ebc


def _host_share_only(cache) -> None:
    """A host bookkeeper's cache whose rows are on `meta` (no values) does its host work
    alone: a backward's update marks the batch's rows dirty and lets them go, without the
    arithmetic (the device's; sparse gradients have no meta kernels), and a write-back
    scatters zeros into the host store (its cost is the host's). The bench's own stand-ins:
    the library has no branch for rows without values."""
    write = cache.transfers.write

    def write_zeros(ids: torch.Tensor, weight: torch.Tensor, state: dict) -> None:
        zeros = lambda t: torch.zeros(t.shape, dtype=t.dtype)  # noqa: E731
        write(ids, zeros(weight), {k: zeros(v) for k, v in state.items()})

    cache._apply_rows = lambda grad, lookup: lookup.held
    cache.transfers.write = write_zeros


def key_of(ids: torch.Tensor) -> torch.Tensor:
    """The raw 64-bit key the bench gives an id (a bijection: the same distinct rows)."""
    from embcache.keys import mix64

    return mix64(ids + 1)


def warm_up_known_keys(ebc) -> None:
    """Fill each open table's cache with its hottest known keys by their counts (the prior
    `add_keys` gave their rows), as the ids variant's caches are filled at construction by
    the ids' counts: without it the two start from different residencies, and with batches
    needing several times the cache's rows (multi-hot) the hit rates stay apart."""
    for bag in ebc.bags:
        prior = bag.cache.policy.prior
        if isinstance(bag, KeyedEmbeddingBag) and prior is not None:
            bag.cache.warm_up(prior, WARMUP_RATIO)


def key_counts(counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A table's id counts as its keys' (`key_of`): (keys ascending, counts), the ids never
    seen left out, as `load_key_frequencies` gives raw-key data's."""
    ids = torch.nonzero(counts).flatten()
    keys = key_of(ids)
    order = torch.argsort(keys)
    return keys[order], counts[ids[order]]


def as_raw_keys(batches: list) -> list:
    """The same lookups with each id its raw key (`key_of`)."""
    return [KeyedJaggedTensor(keys=b.keys(), values=key_of(b.values()), lengths=b.lengths()) for b in batches]


def vocabulary_as_keys(cardinalities: list[int]) -> KeyedJaggedTensor:
    """Every id of every table as its raw key (`key_of`), in id order, as one sample: what
    an open table holds in a long run's steady state (as many keys as the vocabulary, its
    rows in the vocabulary's order, so the two differ by the key index alone)."""
    ids = torch.cat([torch.arange(n, dtype=torch.int64) for n in cardinalities])
    return KeyedJaggedTensor(keys=[f"f{i}" for i in range(len(cardinalities))], values=key_of(ids),
                             lengths=torch.tensor(cardinalities, dtype=torch.int64))


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


def measure(variants: dict, threads: list[int], args, timer: PartTimer) -> dict[str, dict[int, dict]]:
    """Per variant (keys -> (collection, trace)) and thread count, the median step and the
    mean parts. Each cache is brought to its steady state by an untimed pass first; then
    each thread count trains its own fresh stretch of the trace (a stretch seen twice would
    hit more), every variant the same stretch right after another, the counts interleaved
    over `ROUNDS` rounds, so that a change of load on a shared machine touches all alike."""
    span = args.steps + args.prefetch_depth
    for ebc, trace in variants.values():
        time_steps(ebc, trace[: args.warmup_steps + args.prefetch_depth], args.prefetch_depth, timer)
        ebc.reset_cache_stats()
    got = {(k, t): ([], []) for k in variants for t in threads}
    start = args.warmup_steps
    for _ in range(ROUNDS):
        for t in threads:
            set_threads(t)
            for k, (ebc, trace) in variants.items():
                steps, parts = time_steps(ebc, trace[start: start + span], args.prefetch_depth, timer)
                got[k, t][0].extend(steps)
                got[k, t][1].extend(parts)
            start += args.steps
    set_threads(threads[-1])
    out: dict[str, dict[int, dict]] = {k: {} for k in variants}
    for (k, t), (steps, parts) in got.items():
        out[k][t] = {"step_s": float(np.median(steps)),
                     "parts_s": {name: float(np.mean([p[name] for p in parts])) for name in PARTS}}
    return out


def projection(rate_1: float, rate_2: float, cores: int = PROJECTED_CORES) -> dict:
    """Amdahl's law through the measured 1- and 2-thread rates: the serial share s from
    the 2-thread speed-up S2 = 1 / (s + (1 - s) / 2), then the rate at `cores`."""
    s2 = rate_2 / rate_1
    serial = min(1.0, max(0.0, 2.0 / s2 - 1.0))
    speedup = 1.0 / (serial + (1.0 - serial) / cores)
    return {"serial_share": serial, "speedup": speedup, "samples_per_s": rate_1 * speedup, "cores": cores}


def save(args, threads: list[int], results: list[dict], complete: bool):
    """The JSON of the rows so far and their summary; `complete` false until the run ends."""
    # raw variants get the ids' counts as their keys' (`build_collection`): the same freq prior
    raw_key_freq = any(k != "ids" for k in args.keys)
    return write_json({"config": vars(args) | {"func": None, "threads": threads, "raw_key_freq": raw_key_freq},
                       "results": results, "summary": summarize(results), "complete": complete}, args.name, args.out)


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
            variants = {}
            for keys in args.keys:
                ebc = build_collection(cardinalities, args.dim, ratio, freq, args.eviction, raw=keys != "ids")
                trace = batches if keys == "ids" else as_raw_keys(batches)
                if keys == "raw":  # the steady state: the vocabulary's keys known, rows in its order
                    ebc.add_keys(vocabulary_as_keys(cardinalities))
                    warm_up_known_keys(ebc)
                variants[keys] = (ebc, trace)
            if "device" in args.bookkeeping:  # the same lookups, every device tensor on meta
                variants[DEVICE_VARIANT] = (build_collection(cardinalities, args.dim, ratio, freq, args.eviction,
                                                             bookkeeping="device", kernels=args.kernels), batches)
            with timer.installed():
                measured = measure(variants, threads, args, timer)
            for keys, (ebc, trace) in variants.items():
                device = keys == DEVICE_VARIANT
                hit_rate = None if device else ebc.cache_stats()["hit_rate"]  # meta counts have no values
                launches = launches_per_step(ebc, trace, args.prefetch_depth) if device else None
                for t, r in measured[keys].items():
                    rate = args.batch_size / r["step_s"]
                    results.append({"shape": shape, "ratio": ratio, "threads": t, "samples_per_s": rate,
                                    "ids_per_s": rate * ids_per_sample, "ids_per_sample": ids_per_sample,
                                    "hit_rate": hit_rate, "bookkeeping": "device" if device else "host",
                                    **({"launches_per_step": launches, "kernels": ebc.bags[0].cache.kernels}
                                       if device else {}),
                                    **({"keys": keys} if len(args.keys) > 1 and not device else {}), **r})
                    parts = "  ".join(f"{k} {1e3 * v:.1f}" for k, v in r["parts_s"].items() if v)
                    if device:
                        parts = (f"{launches['total']} operations a step, each on meta: "
                                 + ", ".join(f"{k} {v}" for k, v in launches["by_part"].items()))
                    label = f" {keys}" if len(args.keys) > 1 or device else ""
                    hits = "" if hit_rate is None else f", hit rate {hit_rate:.3f}"
                    print(f"  {shape}{label} {ratio:.3%} {t} thread(s): {rate:,.0f} samples/s{hits} "
                          f"({1e3 * r['step_s']:.1f} ms/step; {'' if device else 'ms: '}{parts})", flush=True)
            del variants, ebc
            save(args, threads, results, complete=False)  # after every ratio: a run cut short keeps its rows
    print_summary(summarize(results))
    path = save(args, threads, results, complete=True)
    png = plot(results, path.with_suffix(".png"))
    print(f"bench host: wrote {path}" + (f" and {png}" if png else ""))
    return 0


def print_summary(summary: list[dict]) -> None:
    for s in summary:
        print(f"bench host: {s['shape']}{' ' + s['keys'] if 'keys' in s else ''}"
              f"{', device bookkeeping (on meta), ' + s['kernels'] + ' kernels' if s['bookkeeping'] == 'device' else ''}"
              f" {s['ratio']:.3%}: 1 thread "
              f"{s['samples_per_s_1']:,.0f} samples/s"
              + (f" (x{s['raw_vs_ids_1']:.2f} of ids)" if "raw_vs_ids_1" in s else "")
              + (f", {s['launches_per_step']} operations a step" if "launches_per_step" in s else "")
              + (f", 2 threads x{s['speedup_2']:.2f}, projected {PROJECTED_CORES} cores "
                 f"{s['projected']['samples_per_s']:,.0f}" if "speedup_2" in s else ""))


def summarize(results: list[dict]) -> list[dict]:
    out = []
    for shape, ratio, keys, book in dict.fromkeys((r["shape"], r["ratio"], r.get("keys"), r.get("bookkeeping", "host"))
                                                  for r in results):
        mine = [r for r in results if r["shape"] == shape and r["ratio"] == ratio and r.get("keys") == keys
                and r.get("bookkeeping", "host") == book]
        by_t = {r["threads"]: r["samples_per_s"] for r in mine}
        row = {"shape": shape, "ratio": ratio, **({"keys": keys} if keys else {}), "bookkeeping": book,
               "samples_per_s_1": by_t.get(1)}
        if "launches_per_step" in mine[0]:
            row["kernels"] = mine[0]["kernels"]
            row["launches_per_step"] = mine[0]["launches_per_step"]["total"]
            row["launches_by_part"] = mine[0]["launches_per_step"]["by_part"]
        if 1 in by_t and 2 in by_t:
            row["speedup_2"] = by_t[2] / by_t[1]
            row["projected"] = projection(by_t[1], by_t[2])
        out.append(row)
    ids = {(r["shape"], r["ratio"]): r["samples_per_s_1"] for r in out
           if r.get("keys") == "ids" and r["bookkeeping"] == "host"}
    for r in out:  # raw keys against ids, the same lookups: what the key index costs the host
        if r.get("keys", "").startswith("raw") and ids.get((r["shape"], r["ratio"])) and r["samples_per_s_1"]:
            r["raw_vs_ids_1"] = r["samples_per_s_1"] / ids[(r["shape"], r["ratio"])]
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
        for ratio, keys, book in dict.fromkeys((r["ratio"], r.get("keys"), r.get("bookkeeping", "host"))
                                               for r in results if r["shape"] == shape):
            rows = sorted((r for r in results if r["shape"] == shape and r["ratio"] == ratio
                           and r.get("keys") == keys and r.get("bookkeeping", "host") == book),
                          key=lambda r: r["threads"])
            ax.plot([r["threads"] for r in rows], [r["samples_per_s"] / 1e6 for r in rows], "o-",
                    label=f"cache {ratio:.1%}" + (f", {keys} keys" if keys else "")
                    + (", device bookkeeping (meta)" if book == "device" else ""))
        ax.set_title(f"host ceiling, {shape}")
        ax.set_xlabel("threads")
        ax.set_ylabel("M samples/s")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)
