"""`embcache bench vocab`: training day after day on data whose values drift, with three ways
of meeting values no vocabulary held (issue 26), side by side in one run:

- `first-day`: a vocabulary of day 0's keys; every later value shares one row (id 0);
- `hash`: every key hashed into --max-rows rows a table (default first-day: each table's
  distinct keys on day 0), so colliding values share a row;
- `open`: an open table, a row per key on first sight, under the same bound (--max-rows):
  past it the coldest keys retire (--retire lru) to make room for new ones.

Why: a day-0 vocabulary maps every later value to one shared row, hashing shares rows
between colliding values, an open table gives each value its own row under the same bound.
The data (`embcache data synthetic --days N --drift F --keys raw`, reused from --data-cache)
gives every value, new ones too, an effect of its own on the label, so what a variant cannot
tell apart it cannot learn.

Each variant is one `embcache dlrm train --days 0-(N-2) --eval-next-day` in a process of its
own (so peak host memory is its own), one after the other, with the same settings and
threads: days 0..N-2 are trained in order, and after day d the model is scored on day d+1
before training on it. Reported per variant: the next-day AUC of each of day_1..day_{N-1};
their mean over day_2..day_{N-1} (the first evaluation, day_1, is left out of it: it scores
only how well day 0's keys cover day 1); peak host MiB, training samples/s and CPU-seconds a
sample; for `open` the keys retired and the key index's bytes a live key. Then the mean and
per-day AUC of open minus each baseline, in points (1 point = 0.01 AUC). Writes
bench/results/<name>.json.
"""
from __future__ import annotations

import argparse

from embcache.arg_types import (
    add_output_arguments, DefaultsHelpFormatter, float_in, int_in, positive_float, positive_int
)
from embcache.paths import datasets_dir
from embcache.data.defaults import SYNTHETIC_DRIFT, SYNTHETIC_SCALE
from embcache.settings_fields import add_config_arguments
from embcache.dlrm.config import RAW_KEY_MODES, DLRMConfig, max_rows_value
from embcache.train.run_cli import add_device_argument

MODES = ("first-day", "hash", "open")  # baselines first, the open table last
assert set(MODES) == set(RAW_KEY_MODES)
DEFAULT_DAYS = 6
DEFAULT_ROWS = 100_000  # rows a day


class _HelpFormatter(argparse.RawDescriptionHelpFormatter, DefaultsHelpFormatter):
    """The description as written, every option's default shown."""


def build_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=_HelpFormatter)
    p.add_argument("--days", type=int_in(3), default=DEFAULT_DAYS,
                   help="days of data, day_0..day_{N-1}: days 0..N-2 are trained, day_1..day_{N-1} scored, the "
                        "mean taken over day_2..day_{N-1} (so at least 3)")
    p.add_argument("--rows", type=positive_int, default=DEFAULT_ROWS, help="rows a day")
    p.add_argument("--drift", type=float_in(0, 1, high_open=True), default=SYNTHETIC_DRIFT,
                   help="fraction of each day's distinct values never seen before, in [0, 1)")
    p.add_argument("--scale", type=positive_float, default=SYNTHETIC_SCALE,
                   help="multiplies Criteo Kaggle's cardinalities")
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES),
                   help="variants to run, in this order")
    p.add_argument("--max-rows", type=max_rows_value, default="first-day", metavar="N|first-day",
                   help="rows a table of hash and open (first-day: each table's distinct keys on day 0, the size of "
                        "the first-day vocabulary)")
    add_config_arguments(p, DLRMConfig, ["batch_size", "embedding_dim", "sparse_lr", "cache_ratio", "seed"])
    p.add_argument("--threads", type=positive_int, default=1,
                   help="torch and numba threads of each run (1 keeps the variants comparable on a shared "
                        "machine)")
    add_device_argument(p)
    p.add_argument("--no-warmup", action="store_true",
                   help="skip the warm-up: a tiny run of each variant first, so that the numba kernels are compiled "
                        "and cached on disk before the measured runs (else the first run to need one pays for it)")
    p.add_argument("--data-cache", default=str(datasets_dir()),
                   help="where the data is generated once and reused")
    add_output_arguments(p, "vocab")
    p.set_defaults(func=run)
    return p


def run(args) -> int:
    """Run the benchmark: `embcache.bench.vocab` (and numpy) imported only now."""
    from embcache.bench import vocab

    return vocab.run(args)
