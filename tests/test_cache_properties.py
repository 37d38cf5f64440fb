"""Invariants of the cache on random traces (hypothesis): the maps stay inverse, no id is
cached twice, and every row read equals the host row or its newer cached copy (checked
against a dense shadow table trained alongside)."""
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from embcache import CachedEmbeddingBag

N, D = 60, 3

batch = st.lists(st.integers(0, N - 1), min_size=1, max_size=25)
op = st.tuples(st.sampled_from(["train", "eval", "prefetch", "flush"]), batch)


def check_cache(bag, shadow):
    cache = bag.cache
    cache.slots.check_invariants()
    occ = torch.nonzero(cache.slots.slot_to_id >= 0).flatten()
    ids = cache.slots.slot_to_id[occ]
    assert ids.unique().numel() == ids.numel()
    assert occ.numel() <= cache.num_slots
    clean = occ[~cache.dirty[occ]]
    # a clean cached row equals its host row; every cached row equals the true table
    assert torch.equal(cache.weight[clean], cache.host.weight[cache.slots.slot_to_id[clean]])
    assert torch.equal(cache.weight[occ], shadow[ids])
    assert bool((cache.pins >= 0).all())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(op, min_size=1, max_size=25),
       ratio=st.sampled_from([0.05, 0.1, 0.3, 1.0]),
       eviction=st.sampled_from(["freq", "lfu", "lru"]),
       seed=st.integers(0, 2**16))
def test_random_traces_keep_the_cache_consistent(ops, ratio, eviction, seed):
    gen = torch.Generator().manual_seed(seed)
    w0 = torch.randn(N, D, generator=gen)
    freq = torch.randint(0, 50, (N,), generator=gen)
    bag = CachedEmbeddingBag(N, D, cache_ratio=ratio, weight=w0, ids_freq=freq, eviction=eviction,
                             optimizer="sgd", lr=0.5, device="cpu", warmup_ratio=0.5)
    shadow = w0.clone()
    for kind, ids in ops:
        ids = torch.tensor(ids)
        offsets = torch.tensor([0, len(ids) // 2])
        if kind == "prefetch":
            bag.prefetch(ids, offsets)
        elif kind == "flush":
            bag.flush()
            assert torch.equal(bag.cache.host.weight, shadow)
            assert not bool(bag.cache.dirty.any())
        else:
            bag.train(kind == "train")
            out = bag(ids, offsets)
            assert torch.equal(out, F.embedding_bag(ids, shadow, offsets, mode="sum"))
            if kind == "train":
                out.sum().backward()
                # the update SGD makes: each looked-up row moves by -lr per occurrence
                shadow.index_add_(0, ids, torch.ones(len(ids), D), alpha=-0.5)
                assert int(bag.cache.pins.sum()) == sum(
                    e.pinned.unique().numel() for e in bag.cache._prefetched)
        check_cache(bag, shadow)
    assert torch.allclose(bag.full_weight(), shadow)
