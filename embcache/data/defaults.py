"""Defaults that more than one command shares, in one place and light (no numpy, no pyarrow),
so that `--help` can show them: the built-in synthetic data set is the same whether
`embcache data synthetic` writes it or `embcache dlrm train` makes it on first use."""

SYNTHETIC_ROWS = 200_000  # training rows (val and test get a tenth each)
SYNTHETIC_SCALE = 0.1  # times Criteo Kaggle's cardinalities: 3.4 M embedding rows in all
SYNTHETIC_DRIFT = 0.1  # with --days: the fraction of each day's distinct values never seen before
MAX_COUNTED_KEYS = 1 << 22  # raw keys: per-key counts are exact up to this many keys per feature
