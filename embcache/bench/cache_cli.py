"""Cache benchmark on a Criteo-Kaggle-shaped trace (26 features, Zipf ids, batch 4096).

Three measurements, side by side in one run:
1. hit rate (unique rows per batch) of freq / lfu / lru at each cache ratio, of `freq`
   with admission control (`freq+adm`: a missed row colder than the row it would evict is
   served beside the cache), and of three references on the same trace: Belady's offline
   optimum, Belady with bypass (a row may be served without admission), and the static
   top-C oracle (the C ids most frequent over the whole trace, resident throughout: the
   best any online policy can do in expectation when ids are drawn independently). All of
   this on the stationary trace and on one whose hot set drifts by day (`--day-batches`;
   left out, and said so, when the run is no longer than a day: it would not drift);
2. bytes moved between host store and cache per training batch;
3. bookkeeping cost: a cached forward+backward+update step divided by the same step on an
   uncached `nn.EmbeddingBag(sparse=True)` with the matching torch sparse optimizer.

Every policy starts from the same warm-up (the hottest `--warmup-ratio` of the cache by
the trace's id counts, as a user computes them from the training data before training),
and so does Belady; only `freq` keeps using the counts for eviction. Hit rates skip the
first `--burn-in` of the batches.

Writes <--out>/<--name>.json (default bench/results/cache.json), saved after every row with
`complete` false until the run ends (a run cut short keeps its rows), and the hit-rate PNG.
"""
from __future__ import annotations

import argparse

from embcache.arg_types import (
    add_output_arguments, float_in, fraction, non_negative_int, positive_float, positive_int, ratio
)
from embcache.cache.choices import TORCH_OPTIMIZERS
from embcache.train.run_cli import add_device_argument, add_threads_argument

BURN_IN = float_in(0, 1, high_open=True)  # a burn-in of every batch would leave no hit rate to report


def build_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ratios", type=ratio, nargs="+", default=[0.005, 0.015, 0.05],
                   help="cache ratios (fraction of rows on the device)")
    p.add_argument("--scale", type=positive_float, default=1.0,
                   help="multiplies the Kaggle cardinalities for the hit-rate trace (1.0: 33.8 M rows)")
    p.add_argument("--batches", type=positive_int, default=60, help="batches in the hit-rate trace")
    p.add_argument("--batch-size", type=positive_int, default=4096)
    p.add_argument("--burn-in", type=BURN_IN, default=0.25, help="fraction of batches before counting")
    p.add_argument("--warmup-ratio", type=fraction, default=0.7, help="fraction of the cache warmed up")
    p.add_argument("--day-batches", type=non_negative_int, default=50,
                   help="drifting trace: batches per day (0, or not fewer than --batches: no drifting trace)")
    p.add_argument("--day-shift", type=fraction, default=0.002,
                   help="drifting trace: popularity ranks rotate by this share of each table per day")
    p.add_argument("--timing-scale", type=positive_float, default=0.25,
                   help="cardinality scale of the timing run (it holds two full tables)")
    p.add_argument("--timing-steps", type=positive_int, default=30)
    p.add_argument("--dim", type=positive_int, default=16, help="embedding dim of the timing run")
    p.add_argument("--optimizers", nargs="+", default=["sgd", "adagrad"],
                   choices=list(TORCH_OPTIMIZERS))
    add_device_argument(p)
    p.add_argument("--parts", nargs="+", choices=["hit-rate", "timing"], default=["hit-rate", "timing"],
                   help="what to measure (both by default; each part is side by side within itself)")
    p.add_argument("--seed", type=int, default=0)
    add_output_arguments(p, "cache")
    add_threads_argument(p)
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    """Run the benchmark: `embcache.bench.cache` (and torch) imported only now."""
    from embcache.bench import cache

    return cache.run(args)
