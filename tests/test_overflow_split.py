"""The update splits a gradient at the cache's boundary (cache rows | overflow rows) with
sizes the host knows, not with a boolean mask: a mask makes a GPU report the parts' sizes
(a sync every overflow step, found on the first GPU run). On the CPU the split must equal
the mask's, part for part and in order; on `meta` (no values) it must need none."""
from types import SimpleNamespace

import pytest
import torch

from embcache.cache.bookkeeping.lookup import Lookup, Overflow
from embcache.cache.bookkeeping.row_cache import RowCache

SLOTS = 10


def _cache(coalesced: bool):
    return SimpleNamespace(num_slots=SLOTS, optimizer=SimpleNamespace(needs_coalesced=coalesced))


def _lookup(indices: torch.Tensor, overflow_ids: torch.Tensor) -> Lookup:
    outside = int((indices >= SLOTS).sum())
    overflow = Overflow(overflow_ids, torch.empty(0), {}, overflow_ids)
    return Lookup(indices, overflow, None, overflow_lookups=outside)


def _by_mask(rows, values):
    inside = rows < SLOTS
    return rows[inside], values[inside], rows[~inside] - SLOTS, values[~inside]


@pytest.mark.parametrize("seed", range(5))
def test_a_per_lookup_gradient_splits_as_the_mask_does(seed):
    g = torch.Generator().manual_seed(seed)
    indices = torch.randint(0, SLOTS + 4, (40,), generator=g)  # lookups, repeats included
    values = torch.randn(40, 3, generator=g)
    lookup = _lookup(indices, torch.arange(4) + 100)
    got = RowCache._split_at_overflow(_cache(False), indices, values, lookup)
    for a, b in zip(got, _by_mask(indices, values)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("seed", range(5))
def test_a_coalesced_gradient_splits_as_the_mask_does(seed):
    g = torch.Generator().manual_seed(seed)
    lookups = torch.randint(0, SLOTS + 6, (50,), generator=g)
    rows = torch.unique(lookups)[torch.randperm(torch.unique(lookups).numel(), generator=g)]  # distinct, any order
    values = torch.randn(rows.numel(), 2, generator=g)
    lookup = _lookup(lookups, torch.unique(lookups[lookups >= SLOTS]))
    got = RowCache._split_at_overflow(_cache(True), rows, values, lookup)
    for a, b in zip(got, _by_mask(rows, values)):
        assert torch.equal(a, b)


def test_the_split_asks_the_device_nothing():
    """On meta a boolean mask raises (its size is a value); the split must not."""
    indices = torch.tensor([0, 11, 3, 12, 11])
    lookup = _lookup(indices, torch.tensor([200, 201]))
    rows, values = torch.empty(5, dtype=torch.int64, device="meta"), torch.empty(5, 4, device="meta")
    lookup.indices = rows
    cache_rows, _, out_rows, out_values = RowCache._split_at_overflow(_cache(False), rows, values, lookup)
    assert cache_rows.shape == (2,) and out_rows.shape == (3,) and out_values.shape == (3, 4)
    with pytest.raises(Exception):
        _by_mask(rows, values)  # what the split replaced: needs the values
