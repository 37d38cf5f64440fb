"""`dlrm train`'s default cache size (`--cache-ratio fit`): 1.5 % of the rows, or more where
the data's batches need more.

A fixed ratio suits large tables only: on MovieLens-100k (3,056 rows) 1.5 % is 46 rows while
one batch of 2,048 ratings needs about 1,800 distinct ones, so every step serves most of its
rows beside the cache (exact, but slow) and the hit rate is a few percent. The rule here keeps
1.5 % wherever it holds the batches in flight twice over (the built-in synthetic data: 51 k
rows against about 13 k), and otherwise takes that many rows, as far as the device memory
allows. It reads only meta.json's id counts: the batches' distinct rows are the expected
count of `hit_curves.expected_distinct`, not a pass over the data.
"""
from __future__ import annotations

import math
from pathlib import Path

DEFAULT_RATIO = 0.015  # `DLRMConfig.cache_ratio`, and `CachedEmbeddingBag`'s
HEADROOM = 2  # slots per row of the batches in flight: as many again for the rows kept between them


def fit_cache_ratio(data_dir: str | Path, *, batch_size: int, prefetch_depth: int, embedding_dim: int,
                    optimizer: str, eviction: str, bookkeeping: str, device_memory: int,
                    memory_source: str = "--device-memory") -> tuple[float, str]:
    """The cache ratio of `--cache-ratio fit` and one line saying why: `DEFAULT_RATIO`, or
    the ratio of `HEADROOM` times the distinct rows expected in the `1 + prefetch_depth`
    batches the trainer holds at once (all rows at most), capped by what `device_memory`
    holds. Raw-key data keeps `DEFAULT_RATIO` (its tables grow as keys arrive: the counts
    do not give their rows)."""
    from embcache.cache.planning.hit_curves import expected_distinct
    from embcache.cache.planning.planner import Footprint, format_bytes, table_frequencies, training_rows
    from embcache.data.ctr_format import is_raw_keys

    freq, meta = table_frequencies(data_dir)
    if is_raw_keys(meta):
        return DEFAULT_RATIO, (f"cache ratio fit: {DEFAULT_RATIO} (raw-key tables are sized by --cache-ratio "
                               f"RATIO or auto)")
    rows = freq.size
    base = math.ceil(DEFAULT_RATIO * rows)
    held = 1 + prefetch_depth
    batches = max(1, math.ceil(training_rows(meta) / batch_size))
    in_flight = expected_distinct(freq, batches / held)
    want = math.ceil(HEADROOM * in_flight)
    need = min(rows, want)
    flight = (f"the {held} batch(es) of {batch_size:,} in flight hold {in_flight:,.0f} distinct rows (expected "
              f"from the id counts), and the cache wants {HEADROOM}x that, {want:,} (as many slots again for the "
              f"rows kept between batches)")
    if need <= base:
        return DEFAULT_RATIO, (f"cache ratio fit: {DEFAULT_RATIO} ({base:,} of {rows:,} rows): {flight}, no more "
                               f"than {DEFAULT_RATIO}'s {base:,}")
    footprint = Footprint(rows, embedding_dim, optimizer, eviction, bookkeeping, batch_size * len(meta["sparse"]))
    largest = footprint.largest_cache(device_memory)
    chosen = max(base, min(need, largest))
    ratio = 1.0 if chosen >= rows else chosen / rows
    capped = (f"; {format_bytes(device_memory)} of device memory ({memory_source}) holds no more"
              if chosen < need else "")
    whole = " (the whole tables)" if chosen >= rows else ""
    return ratio, (f"cache ratio fit: {ratio:.4g} ({chosen:,} of {rows:,} rows{whole}, "
                   f"{format_bytes(footprint.device_bytes(chosen))}): {flight}, more than {DEFAULT_RATIO}'s "
                   f"{base:,}{capped}")
