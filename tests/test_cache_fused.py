"""The compiled admission pass against the batched tensor ops it replaces on the CPU: the
same decisions, map for map and counter for counter, under every policy, admission
control, aging, prefetch (rows held by batches in flight), overflow and training."""
import pytest
import torch

from embcache import CachedEmbeddingBag
from embcache.cache.bookkeeping.eviction import select_victims

from .cache_helpers import zipf_batches

N, D = 3000, 4


def twin_bags(**kwargs):
    """Two identical bags, one per bookkeeping path."""
    weight = torch.randn(N, D, generator=torch.Generator().manual_seed(0))
    freq = torch.bincount(torch.cat([b for b, _ in zipf_batches(N, 20, 16, 6, seed=9)]), minlength=N)
    bags = []
    for path in ("tensor", "fused"):
        bag = CachedEmbeddingBag(N, D, weight=weight, ids_freq=freq, device="cpu", **kwargs)
        bag.cache.admission_pass = path
        bags.append(bag)
    return bags


def assert_same_state(a, b, resident_only: bool = False):
    """Two bags' caches decide alike: maps, policy, dirty bits, holds, statistics, rows and
    optimizer state, and their pending prefetches (held slots, counts). `resident_only`
    compares the rows of occupied slots alone (the device bookkeeper's free slots keep what
    its masked writes left there)."""
    ca, cb = a.cache, b.cache
    assert torch.equal(ca.slots.slot_to_id, cb.slots.slot_to_id)
    assert torch.equal(ca.slots.id_to_slot, cb.slots.id_to_slot)
    assert torch.equal(ca.policy.slot_primary, cb.policy.slot_primary)
    assert torch.equal(ca.policy.slot_last, cb.policy.slot_last)
    if ca.policy.id_count is not None:
        assert torch.equal(ca.policy.id_count, cb.policy.id_count)
    assert torch.equal(ca.dirty, cb.dirty) and torch.equal(ca.holds, cb.holds)
    assert ca.stats.as_dict() == cb.stats.as_dict()
    rows = ca.slots.slot_to_id >= 0 if resident_only else slice(None)
    assert torch.equal(ca.weight[rows], cb.weight[rows])
    for k in ca.state:
        assert torch.equal(ca.state[k][rows], cb.state[k][rows])
    assert len(ca._prefetched) == len(cb._prefetched)
    for p, q in zip(ca._prefetched, cb._prefetched):
        assert torch.equal(_held_slots(p.held), _held_slots(q.held))
        assert (int(p.hits), int(p.misses)) == (int(q.hits), int(q.misses))


def _held_slots(held: torch.Tensor) -> torch.Tensor:
    """A prefetch's held slots ascending, whether kept as slots or as a mask over them."""
    return torch.nonzero(held).flatten() if held.dtype == torch.bool else torch.sort(held).values


def train_both(bags, batches, prefetch=0):
    """Train both bags on `batches`, prefetching `prefetch` batches ahead; compare the
    lookups of every batch and the whole state after each."""
    for i, (ids, offsets) in enumerate(batches):
        outs = []
        for bag in bags:
            for ahead in batches[i + 1: i + 1 + prefetch][-1:]:
                bag.prefetch(*ahead)
            out = bag(ids, offsets)
            outs.append(out)
            (out * out).sum().backward()
        assert torch.equal(outs[0], outs[1])
        assert_same_state(*bags)


@pytest.mark.parametrize("eviction", ["freq", "lfu", "lru"])
@pytest.mark.parametrize("admission", [False, True])
def test_fused_makes_the_tensor_paths_decisions(eviction, admission):
    bags = twin_bags(cache_ratio=0.03, eviction=eviction, admission=admission, optimizer="adagrad", lr=0.1)
    train_both(bags, zipf_batches(N, 25, 16, 6, seed=1))
    assert bags[1].cache.stats.evictions > 50  # the comparison covered eviction


@pytest.mark.parametrize("prefetch", [1, 3])
def test_fused_equals_tensor_with_batches_in_flight_and_aging(prefetch):
    bags = twin_bags(cache_ratio=0.05, eviction="freq", admission=True, half_life=4, optimizer="sgd")
    train_both(bags, zipf_batches(N, 20, 24, 6, seed=2), prefetch=prefetch)


def test_fused_equals_tensor_under_overflow():
    # 20 slots, batches of ~100 distinct ids: most rows are served beside the cache
    bags = twin_bags(cache_ratio=20 / N, eviction="lfu", optimizer="adam", lr=0.01, warmup_ratio=0.0)
    train_both(bags, zipf_batches(N, 8, 32, 6, seed=3, a=1.05))
    assert bags[1].cache.stats.overflow_rows > 0


def test_fused_and_tensor_equal_uncached_training():
    """Both paths train the table exactly as torch does (the decisions above change no row)."""
    bags = twin_bags(cache_ratio=0.02, eviction="freq", optimizer="sgd", lr=0.05)
    ref = torch.nn.EmbeddingBag(N, D, mode="sum", sparse=True, _weight=bags[0].full_weight())
    opt = torch.optim.SGD(ref.parameters(), lr=0.05)
    batches = zipf_batches(N, 15, 16, 6, seed=4)
    train_both(bags, batches)
    for ids, offsets in batches:
        opt.zero_grad()
        out = ref(ids, offsets)
        (out * out).sum().backward()
        opt.step()
    for bag in bags:
        assert torch.equal(bag.full_weight(), ref.weight.detach())


def test_victims_are_the_smallest_keys_ties_to_the_lower_slot():
    keys = torch.tensor([3.0, 1.0, 2.0, 1.0, 0.5, 1.0, 9.0])
    candidates = torch.tensor([True, True, True, True, False, True, True])
    assert select_victims(keys, 3, candidates).tolist() == [1, 3, 5]
    assert select_victims(keys, 9, candidates).tolist() == [1, 3, 5, 2, 0, 6]
    big = torch.randint(0, 50, (20000,)).double()  # many ties, sampled-threshold path
    mask = torch.rand(20000) < 0.9
    got = select_victims(big, 300, mask)
    order = sorted((float(big[i]), i) for i in range(20000) if mask[i])[:300]
    assert got.tolist() == [i for _, i in order]


def test_fused_equals_tensor_on_a_cache_large_enough_to_sample_its_victims():
    """Past 8192 slots both pick victims among the keys below a sampled threshold."""
    n = 400_000
    batches = [ids for ids, _ in zipf_batches(n, 12, 512, 8, seed=6, a=1.3, two_d=True)]
    # every slot warmed up (ties broken by noise), so each miss evicts
    noise = torch.rand(n, generator=torch.Generator().manual_seed(7))
    freq = torch.bincount(torch.cat(batches[:6]).flatten(), minlength=n) + noise
    bags = []
    for path in ("tensor", "fused"):
        bag = CachedEmbeddingBag(n, 2, cache_ratio=0.025, ids_freq=freq, device="cpu",
                                 weight=torch.zeros(n, 2), warmup_ratio=1.0)
        bag.cache.admission_pass = path
        bags.append(bag)
    for ids in batches:
        for bag in bags:
            bag(ids).sum().backward()
        assert_same_state(*bags)
    assert bags[1].cache.num_slots >= 8192 and bags[1].cache.stats.evictions > 1000
