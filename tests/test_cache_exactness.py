"""Cached training equals uncached training: same table after hundreds of steps with
evictions on every step. SGD is compared to the bit; the adaptive optimizers to 1e-6,
because torch's `coalesce` sums a row's duplicate gradients in an order that depends on
the index values (ids for the reference, slots for the cache), which moves the last bit."""
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
    if optimizer == "sgd":
        assert torch.equal(got, want)
    else:
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


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
                             steps=120)
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


def test_prefetch_keeps_results_exact_and_does_not_double_count():
    torch.manual_seed(0)
    w0 = torch.randn(N, D)
    ref, opt = reference_bag(w0, "sum", "adam", LR)
    bag = CachedEmbeddingBag(N, D, cache_ratio=0.05, optimizer="adam", lr=LR, weight=w0, device="cpu")
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
    assert_same_table(bag, ref, "adam")


def test_eval_forward_changes_nothing():
    torch.manual_seed(0)
    w0 = torch.randn(N, D)
    bag = CachedEmbeddingBag(N, D, cache_ratio=0.05, weight=w0, device="cpu").eval()
    ids, offsets = zipf_batches(N, 1, 16, 3)[0]
    with torch.no_grad():
        out = bag(ids, offsets)
    torch.testing.assert_close(out, torch.nn.functional.embedding_bag(ids, w0, offsets, mode="sum"), rtol=0, atol=0)
    assert torch.equal(bag.full_weight(), w0)
