"""Settings a benchmark's command line shares with its run, here and light (no torch) so that
`--help` can show them, as `embcache.data.defaults` does for the data sets."""

HOST_ROUNDS = 2  # bench host: each thread count is measured this many times, interleaved with the others
