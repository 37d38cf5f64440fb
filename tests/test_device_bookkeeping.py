"""The device bookkeeper (`DeviceRowCache`, `bookkeeping="device"`) against the host one:
the same decisions map for map on random traces, the same training to the bit, resumes
across the two, and a whole step that never asks the device for a value.

On the CPU the device bookkeeper runs its fixed-size tensor ops on CPU tensors, which is
how this suite proves it; `meta` tensors (shapes without values) prove that no operation of
a step hands a value back to the host.
"""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from embcache.bench.op_count import count_ops
from embcache.cache.device_cache import DeviceRowCache
from embcache.cache.fixed_size import summed_in_torch_order
from embcache.cache.row_cache import RowCache
from embcache.nn.cached_embedding_bag import CachedEmbeddingBag, lookup_terms

from .cache_helpers import reference_bag, step_alike, zipf_batches
from .test_cache_fused import assert_same_state


# ---------------------------------------------------------------------- the pieces
@pytest.mark.parametrize("seed", range(40))
def test_the_fixed_size_sum_is_coalesce_to_the_bit(seed):
    g = torch.Generator().manual_seed(seed)
    n = int(torch.randint(1, 400, (1,), generator=g))
    keys = torch.randint(0, max(1, n // int(torch.randint(1, 30, (1,), generator=g))), (n,), generator=g)
    values = torch.randn(n, 3, generator=g) * torch.exp(4 * torch.randn(n, 1, generator=g))
    values[::7] = -0.0  # a row whose only term is -0.0 keeps its sign, as coalesce keeps it
    want = torch.sparse_coo_tensor(keys.unsqueeze(0), values, (int(keys.max()) + 1, 3),
                                   check_invariants=False).coalesce()
    got_keys, got_values = summed_in_torch_order(keys, values)
    distinct = want._nnz()
    assert torch.equal(got_keys[:distinct], want._indices()[0])
    assert torch.equal(got_values[:distinct].view(torch.int32), want._values().view(torch.int32))  # bits, signs too
    assert bool((got_keys[distinct:] == -1).all())


@pytest.mark.parametrize("mode", ["sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
def test_lookup_terms_are_the_sparse_gradient_values(mode, weighted):
    if weighted and mode == "mean":
        pytest.skip("per-sample weights need mode sum")
    g = torch.Generator().manual_seed(3)
    table = torch.randn(30, 4, generator=g, requires_grad=True)
    ids = torch.randint(0, 30, (17,), generator=g)
    offsets = torch.tensor([0, 0, 5, 9, 9, 16])  # empty bags too
    weights = torch.rand(17, generator=g) if weighted else None
    out = F.embedding_bag(ids, table, offsets, mode=mode, sparse=True, per_sample_weights=weights)
    grad_out = torch.randn(out.shape, generator=g)
    out.backward(grad_out)
    assert torch.equal(table.grad._indices()[0], ids)
    assert torch.equal(lookup_terms(grad_out, ids, offsets, weights, mode), table.grad._values())


def test_the_factory_builds_either_bookkeeper():
    w = torch.randn(50, 2)
    from embcache.cache.optimizers import make_optimizer

    host = RowCache(w, 5, make_optimizer("sgd", 0.1), bookkeeping="host")
    device = RowCache(w, 5, make_optimizer("sgd", 0.1), bookkeeping="device")
    auto = RowCache(w, 5, make_optimizer("sgd", 0.1))  # rows on the CPU: the host's
    assert type(host) is RowCache and type(device) is DeviceRowCache and type(auto) is RowCache
    with pytest.raises(ValueError, match="bookkeeping must be one of"):
        RowCache(w, 5, make_optimizer("sgd", 0.1), bookkeeping="gpu")
    with pytest.raises(ValueError, match="open tables"):
        CachedEmbeddingBag(50, 2, keys="raw", device="cpu", bookkeeping="device")


# ---------------------------------------------------------------------- twins on the same trace
def _twins(num_rows, dim, **kw):
    g = torch.Generator().manual_seed(kw.pop("seed", 0))
    weight = torch.randn(num_rows, dim, generator=g)
    freq = torch.randint(0, 20, (num_rows,), generator=g)
    return [CachedEmbeddingBag(num_rows, dim, weight=weight, ids_freq=freq, device="cpu", bookkeeping=b, **kw)
            for b in ("host", "device")]


def _run(bags, batches, depth, evaluate_every=0):
    """Train every bag on `batches`, `depth` prefetched ahead; after each step compare the
    outputs and the whole state. Every `evaluate_every`-th step is a frozen validation pass
    over the next batch first."""
    for bag in bags:
        for ids, offsets in batches[:depth]:
            bag.prefetch(ids, offsets)
    for i, (ids, offsets) in enumerate(batches):
        if evaluate_every and i % evaluate_every == evaluate_every - 1:
            seen = []
            for bag in bags:
                with bag.evaluation():
                    seen.append(bag(ids, offsets))
            assert torch.equal(seen[0], seen[1])
        outs = step_alike(bags, batches, i, depth)
        assert torch.equal(outs[0], outs[1])
        assert_same_state(*bags, resident_only=True)
    assert torch.equal(bags[0].full_weight(), bags[1].full_weight())


@pytest.mark.parametrize("eviction", ["freq", "lfu", "lru"])
@pytest.mark.parametrize("admission", [False, True])
@pytest.mark.parametrize("depth", [0, 1, 2, 4])
def test_the_device_bookkeeper_decides_as_the_host_one(eviction, admission, depth):
    """Eviction every step, overflow (a 2 % cache: batches need more rows than it has),
    admission declining cold rows, validation passes, prefetch 0-4 ahead."""
    bags = _twins(1500, 3, cache_ratio=0.02, eviction=eviction, admission=admission, optimizer="adagrad",
                  lr=0.1)
    _run(bags, zipf_batches(1500, 14, 12, 4, seed=depth, a=1.1), depth, evaluate_every=5)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(num_rows=st.integers(20, 400), ratio=st.sampled_from([0.01, 0.05, 0.2, 1.0]),
       eviction=st.sampled_from(["freq", "lfu", "lru"]), admission=st.booleans(),
       half_life=st.sampled_from([None, 2, 5]), depth=st.integers(0, 4),
       optimizer=st.sampled_from(["sgd", "adagrad", "rowwise_adagrad", "adam"]),
       mode=st.sampled_from(["sum", "mean"]), warmup=st.sampled_from([0.0, 0.7]), seed=st.integers(0, 999))
def test_random_traces_decide_alike(num_rows, ratio, eviction, admission, half_life, depth, optimizer, mode,
                                    warmup, seed):
    bags = _twins(num_rows, 2, cache_ratio=ratio, eviction=eviction, admission=admission, half_life=half_life,
                  optimizer=optimizer, lr=0.2, mode=mode, warmup_ratio=warmup, seed=seed)
    _run(bags, zipf_batches(num_rows, 8, 6, 3, seed=seed, a=1.2), depth, evaluate_every=3)


# ---------------------------------------------------------------------- against torch, and resumes
@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "rowwise_adagrad", "adam"])
def test_device_bookkept_training_equals_torch_to_the_bit(optimizer):
    torch.manual_seed(0)
    weight = torch.randn(800, 4)
    bag = CachedEmbeddingBag(800, 4, weight=weight, cache_ratio=0.02, optimizer=optimizer, lr=0.05, device="cpu",
                             bookkeeping="device")
    ref, opt = reference_bag(weight, "sum", optimizer, 0.05)
    batches = zipf_batches(800, 12, 10, 4, seed=1, a=1.05)
    bag.prefetch(*batches[0])
    for i, (ids, offsets) in enumerate(batches):
        out = bag(ids, offsets)
        if i + 1 < len(batches):
            bag.prefetch(*batches[i + 1])
        (out * torch.linspace(0.5, 1.5, 4)).sum().backward()
        opt.zero_grad()
        (ref(ids, offsets) * torch.linspace(0.5, 1.5, 4)).sum().backward()
        opt.step()
    assert bag.cache_stats()["overflow_rows"] > 0  # the update went through the overflow rows too
    assert torch.equal(bag.full_weight(), ref.weight.detach())


@pytest.mark.parametrize("first, then", [("host", "device"), ("device", "host")])
def test_a_checkpoint_resumes_exactly_under_the_other_bookkeeper(tmp_path, first, then):
    """Saved mid-run with a prefetch pending, loaded into a cache of the other kind: the
    rest of the run equals the run that never stopped (table, residency, statistics)."""
    batches = zipf_batches(600, 10, 8, 4, seed=4, a=1.1)
    g = torch.Generator().manual_seed(2)
    weight, freq = torch.randn(600, 3, generator=g), torch.randint(0, 9, (600,), generator=g)

    def make(bookkeeping):
        return CachedEmbeddingBag(600, 3, weight=weight, ids_freq=freq, cache_ratio=0.03, optimizer="adam", lr=0.1,
                                  device="cpu", bookkeeping=bookkeeping)

    def steps(bag, part, ahead):
        for i, (ids, offsets) in enumerate(part):
            out = bag(ids, offsets)
            if ahead and i + 1 < len(ahead):
                bag.prefetch(*ahead[i + 1])
            out.square().sum().backward()

    whole = make(first)
    whole.prefetch(*batches[0])
    steps(whole, batches, batches)
    cut = make(first)
    cut.prefetch(*batches[0])
    steps(cut, batches[:5], batches[:6])  # stops with batch 5 prefetched
    cut.save_checkpoint(tmp_path / "ck")
    resumed = make(then)
    resumed.load_checkpoint(tmp_path / "ck")
    assert type(resumed.cache).bookkeeping == then and resumed.cache.pending_prefetches() == 1
    steps(resumed, batches[5:], batches[5:])
    assert torch.equal(resumed.full_weight(), whole.full_weight())
    assert resumed.cache_stats() == whole.cache_stats()
    assert torch.equal(resumed.cache.slots.slot_to_id, whole.cache.slots.slot_to_id)


# ---------------------------------------------------------------------- the host never asks
def _meta_bag(num_rows=4000, optimizer="adagrad", **kw):
    return CachedEmbeddingBag(num_rows, 8, cache_ratio=0.05, optimizer=optimizer, lr=0.1, device="meta",
                              bookkeeping="device", ids_freq=torch.randint(0, 5, (num_rows,)), **kw)


def _one_step(bag, batches, i):
    out = bag(*batches[i])
    bag.prefetch(*batches[i + 1])
    out.sum().backward()


def _trace(num_rows, batch, sizes, steps=3, seed=0):
    """`steps` + 1 batches, `batch` samples, feature f with `sizes[f]` ids a sample."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor(sizes).repeat(batch)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)[:-1]])
    return [(torch.randint(0, num_rows, (int(lengths.sum()),), generator=g), offsets) for _ in range(steps + 1)]


@pytest.mark.parametrize("optimizer", ["adagrad", "rowwise_adagrad", "adam"])
def test_a_whole_step_runs_with_every_device_tensor_on_meta(optimizer):
    """Forward, prefetch of the next batch, backward with the update, overflow included: on
    `meta` any operation that hands a value to the host raises, so none does."""
    bag = _meta_bag(optimizer=optimizer)
    batches = _trace(4000, 64, [1, 3, 8])
    bag.prefetch(*batches[0])
    for i in range(len(batches) - 1):
        _one_step(bag, batches, i)
    assert bag.cache.weight.device.type == "meta"


def test_a_planted_read_of_a_device_value_fails_the_meta_step(monkeypatch):
    """The proof above can fail: one `.item()` planted in the admission pass breaks it."""
    bag = _meta_bag()
    batches = _trace(4000, 64, [1, 3, 8])
    real = DeviceRowCache._count

    def planted(self, **deltas):
        deltas["evictions"].item()  # what a host bookkeeper would do with a count
        real(self, **deltas)

    monkeypatch.setattr(DeviceRowCache, "_count", planted)
    with pytest.raises((RuntimeError, NotImplementedError)):
        bag.prefetch(*batches[0])


def test_a_step_issues_the_same_operations_whatever_the_batch():
    """The host's share of a device-bookkept step is issuing operations: as many for one-hot
    as for multi-hot batches, for small batches as for large ones."""
    counts = []
    for batch, sizes in [(32, [1] * 26), (512, [1] * 26), (64, [3, 2, 1, 2, 6, 1, 100, 27, 10])]:
        bag = _meta_bag(20_000)
        batches = _trace(20_000, batch, sizes)
        bag.prefetch(*batches[0])
        _one_step(bag, batches, 0)
        counts.append(count_ops(lambda: _one_step(bag, batches, 1)).total)
    assert counts[0] == counts[1] == counts[2]


def test_a_compiled_model_holding_a_device_bookkept_bag_trains_as_an_eager_one():
    """torch.compile stops at the cache (a compile boundary), around it the model compiles."""

    class Model(torch.nn.Module):
        def __init__(self, bookkeeping):
            super().__init__()
            torch.manual_seed(0)
            self.bag = CachedEmbeddingBag(300, 4, cache_ratio=0.05, optimizer="adagrad", lr=0.1, device="cpu",
                                          bookkeeping=bookkeeping)
            self.head = torch.nn.Linear(4, 1)

        def forward(self, ids, offsets):
            return self.head(torch.relu(self.bag(ids, offsets))).sum()

    eager, compiled = Model("host"), Model("device")
    step = torch.compile(compiled, backend="eager")
    for ids, offsets in zipf_batches(300, 5, 8, 3, seed=2):
        for model, run in ((eager, eager), (compiled, step)):
            model.head.zero_grad()
            run(ids, offsets).backward()
    assert torch.equal(eager.bag.full_weight(), compiled.bag.full_weight())
    assert torch.equal(eager.head.weight.grad, compiled.head.weight.grad)
