"""The loader alone: rows/s of prepared Criteo-shaped shards read by 1, 2, ... reader threads.

A GPU step at batch 65,536 takes millions of samples a second; training reads them from
Parquet shards. This times the parallel loader (`embcache.data.parallel`) over the first
`--batches` batches of the train split of DIR (13 dense and 26 one-hot features, as
`embcache data synthetic` writes), warm in the page cache (a pass before the first timing,
which also checks every shard's CRC-32), at each `--readers` count (the best of `--repeats`
passes, the counts taking turns), doing what the step is fed: read, decode, check, lay the
ids out as the step takes them, in the reader threads. Also the process's CPU seconds a
million rows, all threads together: what reading costs, whatever else the machine runs. Beside it, the one-thread background reader the trainer uses today, with the ids
laid out in the thread that takes them. Each count's first batches are compared with the
one-thread loader's to the bit (`same_batches_as_one_thread`). `bench gpu --from-shards`
measures the same beside the step it feeds (`loader_vs_step`).
"""
from __future__ import annotations

import argparse

from embcache.arg_types import add_output_arguments, positive_int


def build_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data", help="a prepared Criteo-shaped directory (meta.json; 13 dense, 26 one-hot features)")
    p.add_argument("--readers", type=positive_int, nargs="+", default=[1, 2, 4],
                   help="reader threads, each count timed")
    p.add_argument("--batch-size", type=positive_int, default=65_536)
    p.add_argument("--batches", type=positive_int, default=64, help="batches timed at each count (at most the split's)")
    p.add_argument("--repeats", type=positive_int, default=3,
                   help="timed passes at each count, taking turns; the best is kept")
    add_output_arguments(p, "loader")
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    """Time the loader (torch and pyarrow imported only now) and write `<out>/<name>.json`."""
    import time

    from embcache.bench.shard_feed import FlatIds, check_criteo_shaped, loader_rates, reader_counts
    from embcache.data.ctr_format import sparse_features
    from embcache.data.loader import CTRBatches
    from embcache.threads import usable_cores
    from embcache.train.bench_results import write_json

    counts = reader_counts(args.readers)
    rates = loader_rates(args.data, args.batch_size, args.batches, counts, repeats=args.repeats)
    batches = rates[0]["batches"]
    loader = CTRBatches(args.data, "train", args.batch_size, drop_last=True)
    flat = FlatIds([f.cardinality for f in sparse_features(check_criteo_shaped(args.data))], pin=False)
    best = float("inf")
    for _ in range(max(args.repeats, 1)):
        t0 = time.perf_counter()
        with loader.background() as stream:
            for _ in range(batches):
                flat(next(stream))
        best = min(best, time.perf_counter() - t0)
    background = batches * args.batch_size / best
    for r in rates:
        print(f"  {r['readers']} reader(s): {r['rows_per_s']:,.0f} rows/s, "
              f"{r['cpu_s_per_million_rows']:.2f} CPU-s a million rows"
              f"{'' if r['same_batches_as_one_thread'] else '  BATCHES DIFFER FROM ONE THREAD'}")
    print(f"  one-thread background reader (the trainer's today): {background:,.0f} rows/s")
    payload = {"benchmark": "loader", "data": str(args.data), "split": "train", "batch_size": args.batch_size,
               "usable_cores": usable_cores(), "config": {k: v for k, v in vars(args).items() if k != "func"},
               "rates": rates, "background_one_thread_rows_per_s": background}
    path = write_json(payload, args.name, args.out)
    print(f"wrote {path}")
    return 0
