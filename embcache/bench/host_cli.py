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
With `--keys ids raw raw-new` the same lookups also run as raw 64-bit keys into open tables
(each id a key, one to one): `raw` tables know every id of the vocabulary as a key
beforehand, their rows in the vocabulary's order (a long run's steady state: the same rows
laid out alike, so that only the key index differs), `raw-new` tables start empty and give
keys rows as they first come (holding only the keys seen, numbered by arrival). Both get
the ids' counts as their keys' (`key_freq`: freq's prior, as the ids have it; the JSON
config's `raw_key_freq`), and `raw`'s caches warm up from them as the ids' do. Every variant trains the same stretch
of the trace right after the others, so `raw_vs_ids_1` (samples/s against ids, 1 thread)
is what the key index costs the host.

With `--bookkeeping device` the same lookups also run through the device bookkeeper with
every device tensor on `meta`: what the host does then is issue operations, so the JSON
gives their number a step (`launches_per_step`: in all, by part of the step (forward,
prefetch, backward) and by operation; counted by a dispatch mode in the trainer's steady
state, views not counted) beside the step's time on meta (an upper bound: some meta kernels are slow
Python; on a GPU each operation costs a launch, ~5-10 us).

Not counted: what a GPU step adds on the host (the copies' launches), and reading the
Parquet batches, which the trainer does in a background thread.
"""
from __future__ import annotations

import argparse

from embcache.arg_types import add_output_arguments, non_negative_int, positive_float, positive_int, ratio
from embcache.bench.defaults import HOST_ROUNDS


def build_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scale", type=positive_float, default=1.0,
                   help="times the Kaggle cardinalities (1.0: 33.8 M rows)")
    p.add_argument("--batch-size", type=positive_int, default=16384)
    p.add_argument("--dim", type=positive_int, default=16, help="embedding dim (the host store's row width)")
    p.add_argument("--ratios", type=ratio, nargs="+", default=[0.005, 0.015, 0.05], help="cache ratios")
    p.add_argument("--threads", type=positive_int, nargs="+", default=None,
                   help="thread counts to measure (default: 1 up to all cores, doubling)")
    p.add_argument("--shapes", nargs="+", default=["one-hot", "multi-hot"], choices=["one-hot", "multi-hot"])
    p.add_argument("--steps", type=positive_int, default=8,
                   help=f"timed steps per thread count and round ({HOST_ROUNDS} rounds; the median is reported)")
    p.add_argument("--warmup-steps", type=non_negative_int, default=5,
                   help="untimed steps first (compilation, warm caches)")
    p.add_argument("--eviction", default="freq", choices=["freq", "lfu", "lru"])
    p.add_argument("--keys", nargs="+", default=["ids"], choices=["ids", "raw", "raw-new"],
                   help="ids: vocabulary ids with their counts (warm-up, freq's prior); raw: the same lookups as "
                        "raw 64-bit keys into open tables that know every key of the trace beforehand (a long "
                        "run's steady state: the ids' counts as the keys' prior and warm-up); raw-new: keys get rows "
                        "as they first come (every batch brings new ones; the same counts)")
    p.add_argument("--bookkeeping", nargs="+", default=["host"], choices=["host", "device"],
                   help="host: the compiled pass beside the ids (rows on meta); device: the device bookkeeper with "
                        "every device tensor on meta, its operations a step counted (launches_per_step) and timed "
                        "(an upper bound: some meta kernels are slow Python)")
    p.add_argument("--kernels", default="torch", choices=["torch", "triton", "auto"],
                   help="the device bookkeeper's embedding kernels (embcache.kernels: triton's lookup and fused "
                        "backward + optimizer, each one operation; on meta they run as their fake "
                        "implementations, so the count needs no GPU)")
    p.add_argument("--prefetch-depth", type=non_negative_int, default=1,
                   help="batches prefetched ahead, as the trainer")
    p.add_argument("--seed", type=int, default=0)
    add_output_arguments(p, "host")
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    """Run the benchmark: `embcache.bench.host` (and torch) imported only now."""
    from embcache.bench import host

    return host.run(args)
