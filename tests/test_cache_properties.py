"""Invariants of the cache on random traces (hypothesis): the maps stay inverse, no id is
cached twice, every row read equals the host row or its newer cached copy, slots are held
only by batches still in flight, and the table equals an uncached one trained alongside
with the matching torch optimizer, to the bit, through evictions, prefetches, dropped
forwards and checkpoint round-trips; with the host bookkeeper and with the device one."""
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from embcache import CachedEmbeddingBag
from tests.cache_helpers import reference_bag

N, D = 60, 3

batch = st.lists(st.integers(0, N - 1), min_size=1, max_size=25)
op = st.tuples(st.sampled_from(["train", "eval", "prefetch", "flush", "drop", "checkpoint"]), batch)


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
    # slots are held by pending prefetches only (no batch is between forward and backward)
    expected = torch.zeros_like(cache.holds)
    for entry in cache._prefetched:
        expected[entry.held] += 1
    assert torch.equal(cache.holds, expected)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(op, min_size=1, max_size=25),
       ratio=st.sampled_from([0.05, 0.1, 0.3, 1.0]),
       eviction=st.sampled_from(["freq", "lfu", "lru"]),
       optimizer=st.sampled_from(["sgd", "adagrad", "rowwise_adagrad", "adam"]),
       bookkeeping=st.sampled_from(["host", "device"]),
       seed=st.integers(0, 2**16))
def test_random_traces_keep_the_cache_consistent(ops, ratio, eviction, optimizer, bookkeeping, seed):
    gen = torch.Generator().manual_seed(seed)
    w0 = torch.randn(N, D, generator=gen)
    freq = torch.randint(0, 50, (N,), generator=gen)

    def make():
        return CachedEmbeddingBag(N, D, cache_ratio=ratio, weight=w0, ids_freq=freq, eviction=eviction,
                                  optimizer=optimizer, lr=0.5, device="cpu", warmup_ratio=0.5,
                                  bookkeeping=bookkeeping)

    bag = make()
    ref, opt = reference_bag(w0, "sum", optimizer, 0.5)
    shadow = ref.weight.detach()
    for kind, ids in ops:
        ids = torch.tensor(ids)
        offsets = torch.tensor([0, len(ids) // 2])
        if kind == "prefetch":
            bag.prefetch(ids, offsets)
        elif kind == "flush":
            bag.flush()
            assert torch.equal(bag.cache.host.weight, shadow)
            assert not bool(bag.cache.dirty.any())
        elif kind == "drop":  # a training forward whose output is never used
            bag.train()
            bag(ids, offsets)
        elif kind == "checkpoint":
            stats = bag.cache_stats()
            resumed = make()
            resumed.load_state_dict(bag.state_dict())
            assert resumed.cache_stats() == stats
            bag = resumed
        else:
            bag.train(kind == "train")
            out = bag(ids, offsets)
            assert torch.equal(out, F.embedding_bag(ids, shadow, offsets, mode="sum"))
            if kind == "train":
                opt.zero_grad()
                ref(ids, offsets).sum().backward()
                opt.step()
                out.sum().backward()
        check_cache(bag, shadow)
    assert torch.equal(bag.full_weight(), shadow)
