"""A validation pass through the cache (`evaluation()`) reads the same rows as any lookup
and leaves the cache exactly as training left it: residency, policy, holds, dirty bits,
statistics and pending prefetches; its own hits and misses are counted apart."""
import copy

import pytest
import torch
import torch.nn.functional as F

from embcache.nn.cached_embedding_bag import CachedEmbeddingBag

from .cache_helpers import zipf_batches
from .test_cache_fused import N, D, assert_same_state


def trained_bag(path, eviction):
    weight = torch.randn(N, D, generator=torch.Generator().manual_seed(0))
    freq = torch.bincount(torch.cat([b for b, _ in zipf_batches(N, 20, 16, 6, seed=9)]), minlength=N)
    bag = CachedEmbeddingBag(N, D, weight=weight, ids_freq=freq, device="cpu", cache_ratio=0.02,
                             eviction=eviction, optimizer="adagrad", lr=0.1)
    bag.cache.admission_pass = path
    for ids, offsets in zipf_batches(N, 12, 16, 6, seed=3):
        bag(ids, offsets).pow(2).sum().backward()
    return bag


@pytest.mark.parametrize("path", ["tensor", "fused"])
@pytest.mark.parametrize("eviction", ["freq", "lru"])
def test_evaluation_reads_the_table_and_changes_nothing(path, eviction):
    bag = trained_bag(path, eviction)
    upcoming = zipf_batches(N, 1, 16, 6, seed=4)[0]
    bag.cache.prefetch(upcoming[0])  # a training batch's prefetch, pending across the validation
    before = copy.deepcopy(bag)
    table = bag.full_weight().clone()
    distinct = 0
    with torch.no_grad(), bag.evaluation() as stats:
        for ids, offsets in zipf_batches(N, 6, 64, 8, seed=5):  # many rows the cache does not hold
            assert torch.equal(bag(ids, offsets), F.embedding_bag(ids, table, offsets, mode="sum"))
            distinct += ids.unique().numel()
    assert stats.hits + stats.misses == distinct and stats.misses > 0 and stats.batches == 6
    assert stats.overflow_rows == stats.misses  # served beside the cache, none admitted
    assert_same_state(bag, before)  # residency, policy, holds, dirty bits, training's statistics
    assert bag.cache.pending_prefetches() == 1
    # the training batch after the validation consumes its prefetch as if nothing happened
    bag(*upcoming).sum().backward()
    before(*upcoming).sum().backward()
    assert_same_state(bag, before)
