"""Host store tiers: the memory-mapped store against the memory store, and a table larger
than memory trained through the cache.

(1) On a table that fits in memory, the same `CachedEmbeddingBag` training (same ids,
same cache) runs with `host_store="memory"` and with `host_store="mmap:DIR"`, and the
samples/s are reported side by side (mmap / memory). (2) With `--big-gib G`, a table of G
GiB of rows plus Adagrad state (as files) trains for `--big-steps` batches: samples/s,
the process's peak resident memory split into anonymous memory (what the process
allocated) and mapped file pages (page cache the kernel may take back), bytes the
process read from and wrote to the disk (/proc/self/io), major page faults, and the
bytes of rows the cache gathered. The big files are deleted afterwards.

Ids are Zipf-distributed over the table with the hot ids scattered (a multiplicative
hash of the rank), so the rows a batch misses are spread over the whole file.
"""
from __future__ import annotations

import argparse

from embcache.arg_types import add_output_arguments, non_negative_float, positive_int, ratio
from embcache.train.run_cli import add_threads_argument


def build_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=positive_int, default=2_000_000, help="rows of the table that fits (part 1)")
    p.add_argument("--dim", type=positive_int, default=64)
    p.add_argument("--steps", type=positive_int, default=200, help="batches of part 1 (each store)")
    p.add_argument("--rounds", type=positive_int, default=10,
                   help="part 1 alternates the two stores over this many slices of its batches")
    p.add_argument("--batch-size", type=positive_int, default=4096, help="bags per batch")
    p.add_argument("--bag-size", type=positive_int, default=8, help="ids per bag")
    p.add_argument("--cache-ratio", type=ratio, default=0.015)
    p.add_argument("--big-gib", type=non_negative_float, default=0.0,
                   help="part 2: GiB of rows + Adagrad state of the big table (0: skip)")
    p.add_argument("--big-steps", type=positive_int, default=300)
    p.add_argument("--dir", default=None, help="where the table files go (default: a temporary directory)")
    add_output_arguments(p, "tiers")
    add_threads_argument(p)
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    """Run the benchmark: `embcache.bench.tiers` (and torch) imported only now."""
    from embcache.errors import UserFacingError

    if args.steps < args.rounds:  # a round of no batches has no time to divide by
        raise UserFacingError(f"--steps {args.steps} is fewer than --rounds {args.rounds}: part 1 splits its "
                              "batches into the rounds, each needs at least one")
    from embcache.bench import tiers

    return tiers.run(args)
