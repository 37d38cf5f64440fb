"""Eviction policies chosen by hand-made traces: which slot goes is what each promises."""
import torch

from embcache import CachedEmbeddingBag


def resident(bag):
    ids = bag.cache.slots.slot_to_id
    return set(ids[ids >= 0].tolist())


def run(bag, batches):
    with torch.no_grad():
        for b in batches:
            bag(torch.tensor([b]))


def make(policy, freq=None, slots=3):
    return CachedEmbeddingBag(100, 2, cache_ratio=slots / 100, eviction=policy, ids_freq=freq,
                              warmup_ratio=0.0, device="cpu").eval()


def test_lru_evicts_the_least_recently_used():
    bag = make("lru")
    run(bag, [[1], [2], [3], [1], [4]])  # 2 is the least recent when 4 arrives
    assert resident(bag) == {1, 3, 4}


def test_lfu_keeps_the_most_used_and_remembers_counts_across_eviction():
    bag = make("lfu")
    run(bag, [[1], [1], [1], [2], [3], [4]])  # 2, 3 used once; 4 evicts the older of them (2)
    assert resident(bag) == {1, 3, 4}
    # 2 returns (evicting 3, the older of 3 and 4), its count resumes: 1 + 2 = 3.
    # 5 then evicts 4 (count 1) rather than 1 or 2 (count 3).
    run(bag, [[2], [2], [5]])
    assert resident(bag) == {1, 2, 5}
    counts = bag.cache.policy.id_count
    assert (int(counts[3]), int(counts[4])) == (1, 1)


def test_freq_prefers_ids_frequent_in_the_data_over_recent_ones():
    freq = torch.zeros(100)
    freq[7] = 50  # hot in the training data, but used long ago in this trace
    bag = make("freq", freq)
    run(bag, [[7], [1], [2], [3]])
    assert 7 in resident(bag)
    lru = make("lru")
    run(lru, [[7], [1], [2], [3]])
    assert 7 not in resident(lru)


def test_rows_of_the_current_batch_are_never_evicted():
    bag = make("lru", slots=4)
    run(bag, [[1, 2, 3, 4]])
    run(bag, [[1, 2, 5]])  # 3 or 4 must go; 1 and 2 are in this batch although least recent
    assert {1, 2, 5} <= resident(bag)


def test_warm_up_loads_the_hottest_ids_first():
    freq = torch.arange(100, dtype=torch.float64)  # 99 is the hottest
    bag = CachedEmbeddingBag(100, 2, cache_ratio=0.1, ids_freq=freq, warmup_ratio=0.5, device="cpu")
    assert resident(bag) == {99, 98, 97, 96, 95}


def test_sampled_victim_selection_equals_a_full_topk():
    """The threshold read off a sample only narrows the search: the victims are exactly the
    k smallest candidate keys, also when the sample misleads (small keys hidden between
    the sampled positions) or few slots are candidates."""
    from embcache.cache.bookkeeping.eviction import select_victims

    g = torch.Generator().manual_seed(0)
    n = 50_000
    cases = []
    for k in (1, 37, 500, 6000, 20_000):
        keys = torch.randperm(n, generator=g).to(torch.float64)  # distinct: the answer is unique
        cases.append((keys, k, torch.rand(n, generator=g) > 0.3))
    hidden = torch.arange(n, dtype=torch.float64) + 1e6
    hidden[1::12] = torch.arange(len(hidden[1::12]), dtype=torch.float64)  # off the stride-12 sample
    cases.append((hidden, 3000, torch.ones(n, dtype=torch.bool)))
    cases.append((torch.randperm(n, generator=g).to(torch.float64), 400, torch.rand(n, generator=g) < 0.001))
    for keys, k, cand in cases:
        got = select_victims(keys, k, cand)
        masked = torch.where(cand, keys, torch.full_like(keys, float("inf")))
        want = torch.topk(masked, min(k, int(cand.sum())), largest=False).indices
        assert sorted(got.tolist()) == sorted(want.tolist())
        assert bool(cand[got].all())


def test_admission_control_serves_a_colder_row_beside_the_cache_and_counts_its_use():
    freq = torch.zeros(100)
    freq[[7, 8, 9]] = 50
    bag = CachedEmbeddingBag(100, 2, cache_ratio=0.03, eviction="freq", ids_freq=freq, warmup_ratio=1.0,
                             device="cpu", admission=True).eval()
    assert resident(bag) == {7, 8, 9}
    with torch.no_grad():
        out = bag(torch.tensor([[1]]))
    assert resident(bag) == {7, 8, 9}  # 1 (prior 0) is colder than every resident row
    assert torch.equal(out, bag.full_weight()[1:2])  # served all the same
    stats = bag.cache_stats()  # declined by admission control, not for want of room
    assert stats["bypassed_rows"] == 1 and stats["overflow_rows"] == 0 and int(bag.cache.policy.id_count[1]) == 1
    plain = CachedEmbeddingBag(100, 2, cache_ratio=0.03, eviction="freq", ids_freq=freq, warmup_ratio=1.0,
                               device="cpu", admission=False).eval()
    run(plain, [[1]])
    assert 1 in resident(plain)  # without admission control every miss gets in


def test_training_with_admission_control_and_aging_equals_the_uncached_table():
    g = torch.Generator().manual_seed(0)
    n, d = 500, 4
    weight = torch.randn(n, d, generator=g)
    freq = torch.rand(n, generator=g) * 10
    bag = CachedEmbeddingBag(n, d, cache_ratio=0.04, eviction="freq", ids_freq=freq, optimizer="adagrad", lr=0.1,
                             device="cpu", weight=weight, admission=True, half_life=3)
    ref = torch.nn.EmbeddingBag(n, d, mode="sum", sparse=True, _weight=weight.clone())
    opt = torch.optim.Adagrad(ref.parameters(), lr=0.1)
    for _ in range(12):
        ids = torch.randint(0, n, (32, 3), generator=g)
        opt.zero_grad()
        ref(ids).pow(2).sum().backward()
        opt.step()
        bag(ids).pow(2).sum().backward()
    assert bag.cache_stats()["bypassed_rows"] > 0  # rows were served beside the cache
    assert torch.equal(bag.full_weight(), ref.weight.detach())
