"""Cached training equals uncached training, to the bit, for every optimizer: the same
table after hundreds of steps with evictions on every step. (The adaptive optimizers
need each row's gradient summed first; the cache sums it in the order torch's
`coalesce` does for the uncached table, so not even the last bit moves.)"""
import pytest
import torch

from embcache import CachedEmbeddingBag
from tests.cache_helpers import reference_bag, zipf_batches

OPTIMIZERS = ["sgd", "adagrad", "rowwise_adagrad", "adam"]
N, D, LR = 4000, 8, 0.05


def train_both(optimizer, mode="sum", weighted=False, two_d=False, cache_ratio=0.03,
               steps=300, eviction="lru", bags=32, bag_size=3):
    torch.manual_seed(0)
    w0 = torch.randn(N, D)
    ref, opt = reference_bag(w0, mode, optimizer, LR)
    bag = CachedEmbeddingBag(N, D, mode=mode, cache_ratio=cache_ratio, optimizer=optimizer,
                             lr=LR, weight=w0, device="cpu", eviction=eviction)
    gen = torch.Generator().manual_seed(1)
    evicting_steps = 0
    for ids, offsets in zipf_batches(N, steps, bags, bag_size, two_d=two_d):
        psw = torch.rand(ids.shape, generator=gen) if weighted else None
        target = torch.randn(bags, D, generator=gen)
        opt.zero_grad()
        (ref(ids, offsets, per_sample_weights=psw) * target).sum().backward()
        opt.step()
        before = bag.cache_stats()["evictions"]
        (bag(ids, offsets, per_sample_weights=psw) * target).sum().backward()
        evicting_steps += bag.cache_stats()["evictions"] > before
    return bag, ref, evicting_steps


def assert_same_table(bag, ref, optimizer):
    got, want = bag.full_weight(), ref.weight.detach()
    assert torch.equal(got, want), f"{optimizer}: max difference {(got - want).abs().max().item()}"


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_cached_equals_uncached_with_eviction_every_step(optimizer):
    bag, ref, evicting_steps = train_both(optimizer)
    stats = bag.cache_stats()
    assert evicting_steps >= 0.9 * 300, "the cache must evict on (nearly) every step"
    assert stats["overflow_rows"] == 0
    assert_same_table(bag, ref, optimizer)


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("variant", ["mean", "per_sample_weights", "2d"])
def test_cached_equals_uncached_variants(optimizer, variant):
    bag, ref, _ = train_both(optimizer, mode="mean" if variant == "mean" else "sum",
                             weighted=variant == "per_sample_weights", two_d=variant == "2d",
                             steps=300)
    assert_same_table(bag, ref, optimizer)


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_overflow_batches_train_exactly_and_are_counted(optimizer):
    # 40 cache rows, batches of ~90 unique ids: most rows are served beside the cache.
    bag, ref, _ = train_both(optimizer, cache_ratio=0.01, steps=60, bags=32, bag_size=4)
    assert bag.cache_stats()["overflow_rows"] > 0
    assert_same_table(bag, ref, optimizer)


@pytest.mark.parametrize("eviction", ["freq", "lfu"])
def test_exact_under_every_policy(eviction):
    bag, ref, _ = train_both("adagrad", eviction=eviction, steps=100)
    assert_same_table(bag, ref, "adagrad")


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_exact_with_the_defaults_warm_up_and_freq(optimizer):
    """The contract's defaults: `freq` eviction warmed up from `ids_freq`."""
    torch.manual_seed(0)
    w0 = torch.randn(N, D)
    batches = zipf_batches(N, 300, 32, 3, seed=2)
    counts = torch.bincount(torch.cat([ids for ids, _ in batches]), minlength=N)
    ref, opt = reference_bag(w0, "sum", optimizer, LR)
    bag = CachedEmbeddingBag(N, D, cache_ratio=0.03, ids_freq=counts, optimizer=optimizer,
                             lr=LR, weight=w0, device="cpu")
    assert int(bag.cache.slots.occupied().sum()) == int(0.7 * bag.cache.num_slots)  # warmed up
    for ids, offsets in batches:
        opt.zero_grad()
        (ref(ids, offsets) ** 2).sum().backward()
        opt.step()
        (bag(ids, offsets) ** 2).sum().backward()
    assert bag.cache_stats()["evictions"] > 0
    assert_same_table(bag, ref, optimizer)


@pytest.mark.parametrize("optimizer", ["adam", "sgd", "adagrad", "rowwise_adagrad"])
def test_prefetch_keeps_results_exact_and_does_not_double_count(optimizer):
    """docs/cache.md, "Exactness, to the bit": every optimizer, with each batch's prefetch
    issued between the previous batch's forward and backward, as the trainer's pipeline
    does, in a cache that evicts."""
    torch.manual_seed(0)
    w0 = torch.randn(N, D)
    ref, opt = reference_bag(w0, "sum", optimizer, LR)
    bag = CachedEmbeddingBag(N, D, cache_ratio=0.05, optimizer=optimizer, lr=LR, weight=w0, device="cpu")
    batches = zipf_batches(N, 80, 32, 3)
    bag.prefetch(*batches[0])
    for i, (ids, offsets) in enumerate(batches):
        opt.zero_grad()
        ref(ids, offsets).sum().backward()
        opt.step()
        out = bag(ids, offsets)
        if i + 1 < len(batches):
            bag.prefetch(*batches[i + 1])  # between forward and backward, as a pipeline does
        out.sum().backward()
    stats = bag.cache_stats()
    assert stats["batches"] == len(batches)
    # every batch was prefetched, so forward itself found every row resident
    assert stats["hits"] + stats["misses"] == sum(torch.unique(ids).numel() for ids, _ in batches)
    assert stats["evictions"] > 0
    assert_same_table(bag, ref, optimizer)


def test_a_forward_without_backward_leaves_no_holds():
    """Validation run with gradients on, or an output dropped after an exception: the
    rows are held while the graph lives and let go when it goes."""
    bag = CachedEmbeddingBag(N, D, cache_ratio=0.01, device="cpu")
    batches = zipf_batches(N, 20, 16, 3)
    out = bag(*batches[0])
    assert int((bag.cache.holds > 0).sum()) > 0
    del out
    assert int(bag.cache.holds.sum()) == 0
    for ids, offsets in batches:
        bag(ids, offsets)  # dropped at once
    assert int(bag.cache.holds.sum()) == 0
    assert bag.cache_stats()["overflow_rows"] == 0
    # and a forward whose backward did run lets go once, not twice
    out = bag(*batches[1])
    out.sum().backward()
    del out
    assert int(bag.cache.holds.min()) == 0 and int(bag.cache.holds.sum()) == 0


def test_full_weight_is_a_snapshot():
    bag = CachedEmbeddingBag(N, D, cache_ratio=0.05, device="cpu")
    before = bag.full_weight()
    ids, offsets = zipf_batches(N, 1, 16, 3)[0]
    bag(ids, offsets).sum().backward()
    after = bag.full_weight()
    assert not torch.equal(before, after)
    changed = torch.nonzero((before != after).any(1)).flatten()
    assert torch.equal(changed, torch.unique(ids))


def test_dropped_prefetches_are_not_counted():
    bag = CachedEmbeddingBag(N, D, cache_ratio=0.05, device="cpu", eviction="lru")
    a, b = zipf_batches(N, 2, 16, 3, seed=9)
    bag.prefetch(*a)                 # never trained
    bag(*b).sum().backward()         # drops a's prefetch
    stats = bag.cache_stats()
    assert stats["batches"] == 1
    assert stats["hits"] + stats["misses"] == torch.unique(b[0]).numel()


def test_an_overflow_row_a_prefetch_admitted_meanwhile_gets_its_update():
    """Batch 0 overflows while a pending prefetch holds half the cache. A later prefetch
    pushes that one out of the (bounded) queue and admits two of batch 0's overflow ids
    before batch 0's backward: their cached copies must carry batch 0's update."""
    torch.manual_seed(0)
    w0 = torch.randn(N, D)
    ref, opt = reference_bag(w0, "sum", "adagrad", LR)
    bag = CachedEmbeddingBag(N, D, cache_ratio=0.005, optimizer="adagrad", lr=LR, weight=w0,
                             device="cpu", eviction="lru")  # 20 rows
    bag.prefetch(torch.arange(1000, 1010), torch.tensor([0]))     # holds 10 rows alone
    for _ in range(7):
        bag.prefetch(torch.tensor([1000]), torch.tensor([0]))      # the queue is full (8)
    batch0 = (torch.arange(60), torch.tensor([0, 30]))
    out = bag(*batch0)                        # 10 rows fit, ids 10..59 overflow
    assert bag.cache_stats()["overflow_rows"] == 50
    later = (torch.tensor([30, 31]), torch.tensor([0]))
    bag.prefetch(*later)                      # drops the first prefetch, admits 30 and 31
    assert bool((bag.cache.slots.lookup(later[0]) >= 0).all())
    out.sum().backward()
    for ids, offsets in (batch0, later, later):
        opt.zero_grad()
        ref(ids, offsets).sum().backward()
        opt.step()
    bag(*later).sum().backward()
    bag(*later).sum().backward()
    assert_same_table(bag, ref, "adagrad")


def test_eval_forward_changes_nothing():
    torch.manual_seed(0)
    w0 = torch.randn(N, D)
    bag = CachedEmbeddingBag(N, D, cache_ratio=0.05, weight=w0, device="cpu").eval()
    ids, offsets = zipf_batches(N, 1, 16, 3)[0]
    with torch.no_grad():
        out = bag(ids, offsets)
    torch.testing.assert_close(out, torch.nn.functional.embedding_bag(ids, w0, offsets, mode="sum"), rtol=0, atol=0)
    assert torch.equal(bag.full_weight(), w0)


def test_a_cache_smaller_than_a_batch_warns_once_with_the_ratio_that_holds_it(caplog):
    """`dlrm train --data ml-100k` at the default 1.5 % made a 46-row cache and served most
    rows beside it without a word. A batch with more distinct rows than slots says so once,
    with the cache ratio that holds it; rows pushed out only by held prefetches do not."""
    bag = CachedEmbeddingBag(N, D, cache_ratio=0.005, optimizer="sgd", lr=LR, device="cpu", eviction="lru")  # 20 rows
    with caplog.at_level("WARNING", logger="embcache"):
        bag.prefetch(torch.arange(1000, 1010), torch.tensor([0]))  # holds 10 rows
        bag(torch.arange(15), torch.tensor([0])).sum().backward()  # 15 distinct fit in 20 slots: no warning
        assert bag.cache_stats()["overflow_rows"] == 5 and caplog.records == []
        for _ in range(2):
            bag(torch.arange(60), torch.tensor([0, 30])).sum().backward()
    assert [r.getMessage() for r in caplog.records] == [
        "the cache holds 20 rows, a batch needs 60 distinct rows of 4,000: the rest are served beside the cache "
        "every such step (exact, slower; overflow_rows); a cache ratio (--cache-ratio) of 0.015 or more holds such a batch"]
