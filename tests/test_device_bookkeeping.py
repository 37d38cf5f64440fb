"""The device bookkeeper (`DeviceRowCache`, `bookkeeping="device"`) against the host one:
the same decisions map for map on random traces, the same training to the bit, resumes
across the two, and a whole step that never asks the device for a value.

On the CPU the device bookkeeper runs its fixed-size tensor ops on CPU tensors, which is
how this suite proves it; `meta` tensors (shapes without values) prove that no operation of
a step hands a value back to the host (and, for the one case meta cannot show, shared tables,
a count of the operations that synchronise on CUDA, made on CPU tensors).
"""
import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from embcache.bench.op_count import count_ops
from embcache.cache.bookkeeping import device_updates
from embcache.cache import optimizers
from embcache.cache.bookkeeping.device_cache import DeviceRowCache
from embcache.cache.bookkeeping.fixed_size import first_positions, summed_in_torch_order
from embcache.cache.optimizers import update_rows
from embcache.cache.bookkeeping.row_cache import RowCache
from embcache.cache.bookkeeping.device_updates import lookup_terms
from embcache.nn.cached_embedding_bag import CachedEmbeddingBag

from .cache_helpers import reference_bag, step_alike, zipf_batches
from .sync_counter import SyncCounter
from .test_cache_fused import assert_same_state


OPTIMIZERS = ["sgd", "adagrad", "rowwise_adagrad", "adam"]
ROW_DTYPES = ["float32", "float16", "bfloat16"]


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


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_the_fixed_size_sum_is_coalesce_to_the_bit_run_after_run():
    """On CUDA the sum adds a key's terms in one fixed order (an accumulating `index_put_`),
    not by `index_add_`'s atomics: coalesce's bits, the same every run, on hot keys too."""
    g = torch.Generator().manual_seed(0)
    keys = torch.randint(0, 50, (200_000,), generator=g).cuda()  # ~4,000 terms a key
    values = (torch.randn(200_000, 16, generator=g) * torch.exp(4 * torch.randn(200_000, 1, generator=g))).cuda()
    want = torch.sparse_coo_tensor(keys.unsqueeze(0), values, (50, 16), check_invariants=False).coalesce()
    runs = [summed_in_torch_order(keys, values, stable=True)[1][:50] for _ in range(3)]
    for got in runs:
        assert torch.equal(got.view(torch.int32), want._values().view(torch.int32))


@pytest.mark.parametrize("seed", range(10))
def test_first_positions_name_each_value_by_its_first_entry(seed):
    g = torch.Generator().manual_seed(seed)
    n = int(torch.randint(1, 400, (1,), generator=g))
    values = torch.randint(0, max(1, n // int(torch.randint(1, 30, (1,), generator=g))), (n,), generator=g)
    got = first_positions(values)
    _, inverse = torch.unique(values, return_inverse=True)
    first = torch.full((n,), n).scatter_reduce_(0, inverse, torch.arange(n), "amin")  # per distinct value
    assert torch.equal(got, first.index_select(0, inverse))


def _terms(seed, dim=None):
    """A per-lookup gradient over a small table: rows repeated many times, values over a
    wide range of magnitudes; widths on and off the vector lanes."""
    g = torch.Generator().manual_seed(seed)
    dim = dim or [1, 3, 8, 16, 33][seed % 5]
    n, num_rows = int(torch.randint(1, 2000, (1,), generator=g)), int(torch.randint(1, 60, (1,), generator=g))
    rows = torch.randint(0, num_rows, (n,), generator=g)
    values = torch.randn(n, dim, generator=g) * torch.exp(3 * torch.randn(n, 1, generator=g))
    return torch.randn(num_rows, dim, generator=g), rows, values


@pytest.mark.parametrize("seed", range(20))
def test_sgd_adds_the_terms_as_torch_adds_a_sparse_gradient(seed):
    """SGD's step off the CPU, `index_add_` of the per-lookup terms (what torch's dense +=
    uncoalesced sparse gradient runs on CUDA, and what runs on meta), gives the bits of the
    sparse op that `torch.optim.SGD` applies and that SGD keeps on the CPU."""
    weight, rows, values = _terms(seed)
    want = weight.clone().add_(torch.sparse_coo_tensor(rows.unsqueeze(0), values, weight.shape,
                                                       check_invariants=False), alpha=-0.05)
    on_cpu = weight.clone()
    optimizers.SGD(0.05).update(on_cpu, {}, rows, values, step=1)
    off_cpu = weight.clone().index_add_(0, rows, values, alpha=-0.05)
    assert torch.equal(on_cpu.view(torch.int32), want.view(torch.int32))
    assert torch.equal(off_cpu.view(torch.int32), want.view(torch.int32))


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("row_dtype, rounding", [("bfloat16", "stochastic"), ("float16", "nearest"),
                                                 ("float16", "stochastic")])
def test_half_rows_deduplicated_in_a_fixed_size_update_as_by_unique(optimizer, row_dtype, rounding):
    """`update_rows` without `unique` (the device bookkeeper's, and any off the CPU) writes
    the bits it writes with it: rows and optimizer state, over steps, with SGD's repeated
    rows and the others' coalesced ones."""
    dtype = getattr(torch, row_dtype)
    opt, rnd = optimizers.make_optimizer(optimizer, 0.05), optimizers.RowRounding(dtype, rounding, seed=3)
    weight, rows, values = _terms(len(optimizer), dim=8)
    tables = []
    for fixed_size in (False, True):
        w, state = weight.to(dtype), opt.init_state(weight.shape[0], 8)
        for step in range(1, 4):
            r, v = rows.roll(step), values * step
            if opt.needs_coalesced:
                grad = torch.sparse_coo_tensor(r.unsqueeze(0), v, weight.shape, check_invariants=False).coalesce()
                r, v = grad._indices()[0], grad._values()
            update_rows(opt, w, state, r, v, step, torch.arange(weight.shape[0]), rnd, fixed_size=fixed_size)
        tables.append([w.view(torch.int16)] + [state[k].view(torch.int32) for k in sorted(state)])
    assert all(torch.equal(a, b) for a, b in zip(*tables))
    assert not torch.equal(tables[1][0], weight.to(dtype).view(torch.int16))  # the steps changed the rows


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
def _meta_bag(num_rows=4000, optimizer="adagrad", device="meta", **kw):
    return CachedEmbeddingBag(num_rows, 8, cache_ratio=0.05, optimizer=optimizer, lr=0.1, device=device,
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


# (pooling, per-sample weights: None | "host" | "grad" (the model's, on the device, needing a gradient))
VARIANTS = [("sum", None), ("mean", None), ("sum", "host"), ("sum", "grad")]


def _variant_trace(num_rows, weights, device, shared=False):
    """`_trace`'s batches as (ids, offsets, weights, segments). `shared`: one table read by
    two features (a collection's layout: the first feature's lookups, then the second's;
    `segments` gives their counts); `weights` as in VARIANTS."""
    g = torch.Generator().manual_seed(5)
    out = []
    for ids, offsets in _trace(num_rows, 64, [1, 3, 8] if not shared else [4], seed=1):
        w = None if weights is None else torch.rand(ids.numel(), generator=g)
        if weights == "grad":
            w = w.to(device).requires_grad_()
        out.append((ids, offsets, w, [[ids.numel() // 2, ids.numel() - ids.numel() // 2]] if shared else None))
    return out


def _run_variant(bag, batches, monkeypatch) -> list[tuple]:
    """Train `bag` on `batches` (each prefetched one ahead); returns, per step, the shape of
    the gradient that reached the update (rows, values), recorded at the update's call."""
    seen = []

    def recording(optimizer, weight, state, rows, values, *args, **kwargs):
        seen.append((rows.shape[0], tuple(values.shape)))
        return update_rows(optimizer, weight, state, rows, values, *args, **kwargs)

    monkeypatch.setattr(device_updates, "update_rows", recording)
    bag.prefetch(*batches[0][:2])
    for i, (ids, offsets, weights, segments) in enumerate(batches[:-1]):
        if (weights is not None and weights.requires_grad) or segments is not None:
            # as a collection hands its group over: checked where the loader gave it (the bag's
            # own check of device-side weights would read them), segments per table
            out = bag.lookup_checked(ids, offsets, weights, segments)
        else:
            out = bag(ids, offsets, weights)
        bag.prefetch(*batches[i + 1][:2])
        out.sum().backward()
    return seen


def _assert_whole_steps(bag, batches, seen):
    """Every step reached the update with one gradient entry per lookup (a step that
    skipped it, or a gradient faked empty, fails), the step count is the host's, and every
    batch needs more distinct rows than the cache has slots (so each step had overflow)."""
    lookups = [(ids.numel(), (ids.numel(), bag.embedding_dim)) for ids, *_ in batches[:-1]]
    assert seen == lookups
    assert bag.cache.step == len(batches) - 1
    assert all(torch.unique(ids).numel() > bag.cache.num_slots for ids, *_ in batches)


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("row_dtype", ROW_DTYPES)
@pytest.mark.parametrize("mode, weights", VARIANTS)
def test_a_whole_step_runs_with_every_device_tensor_on_meta(optimizer, row_dtype, mode, weights, monkeypatch):
    """Forward, prefetch of the next batch, backward with the update, overflow every step,
    for every optimizer and row type, sum and mean pooling, per-sample weights (from the
    host, and the model's needing a gradient: the sparse-gradient path): on `meta` any
    operation that hands a value to the host raises (`.item()`, a copy to the host) or has
    no meta kernel because its size is the data's (`unique`, `nonzero`, boolean masks,
    `coalesce`), so none is made. A table read by several features is the one case meta
    cannot show: its features' sparse gradients are added with `+`, which on meta gives an
    empty gradient (the rest of the step would run on nothing); it is proved on CPU
    tensors below (`test_a_shared_tables_update_makes_no_syncing_operation`)."""
    bag = _meta_bag(optimizer=optimizer, row_dtype=row_dtype, mode=mode)
    batches = _variant_trace(4000, weights, "meta")
    _assert_whole_steps(bag, batches, _run_variant(bag, batches, monkeypatch))


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("row_dtype", ROW_DTYPES)
def test_a_shared_tables_update_makes_no_syncing_operation(optimizer, row_dtype, monkeypatch):
    """Shared tables, where `meta` fakes an empty gradient (see above), on CPU tensors: the
    backward (gradient terms, the features' sparse `+`, the per-row sums, the update of
    cache and overflow rows, their write-back) calls no operation that synchronises on
    CUDA (`tests/sync_counter.py`: a size or value the device would report). torch's sparse
    `+` on CUDA concatenates, sizing its result on the host; on the CPU it merges (the
    order the update repeats), so the counter sees it as the same one operation."""
    bag = _meta_bag(optimizer=optimizer, row_dtype=row_dtype, device="cpu")
    batches = _variant_trace(4000, None, "cpu", shared=True)
    counted = []

    def counting_backward(backward):
        def run(self, *args, **kwargs):
            with SyncCounter() as c:
                backward(self, *args, **kwargs)
            counted.append(c.ops)
        return run

    monkeypatch.setattr(torch.Tensor, "backward", counting_backward(torch.Tensor.backward))
    _assert_whole_steps(bag, batches, _run_variant(bag, batches, monkeypatch))
    assert counted == [[]] * (len(batches) - 1)


@pytest.mark.parametrize("plant, match", [
    ("item", r"item\(\) cannot be called on meta tensors"),
    ("unique", r"_unique2.*Meta tensors"),
])
def test_a_planted_read_of_a_device_value_fails_the_meta_step(plant, match, monkeypatch):
    """The proof above can fail, for the reason planted: the same step runs unplanted,
    and fails with meta's own message once one `.item()` is planted in the admission pass,
    or once half-precision SGD rows are deduplicated by `torch.unique` (as they once were)."""
    batches = _variant_trace(4000, None, "meta")
    _run_variant(_meta_bag(optimizer="sgd", row_dtype="bfloat16"), batches, monkeypatch)
    if plant == "item":
        real = DeviceRowCache._count

        def planted(self, **deltas):
            deltas["evictions"].item()  # what a host bookkeeper would do with a count
            real(self, **deltas)

        monkeypatch.setattr(DeviceRowCache, "_count", planted)
    else:
        monkeypatch.setattr(optimizers, "first_positions", lambda rows: torch.unique(rows, return_inverse=True)[1])
    with pytest.raises((RuntimeError, NotImplementedError), match=match):
        _run_variant(_meta_bag(optimizer="sgd", row_dtype="bfloat16"), batches, monkeypatch)


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


class _HostNumbers(TorchDispatchMode):
    """Each operation a step dispatches to the device (`meta`), with the Python numbers it
    hands it."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        flat, _ = tree_flatten((args, kwargs or {}, out))
        if any(isinstance(a, torch.Tensor) and a.device.type == "meta" for a in flat):
            self.calls.append((str(func), tuple(a for a in flat if isinstance(a, (bool, int, float)))))
        return out


@pytest.mark.parametrize("kernels", ["torch", "triton"])
@pytest.mark.parametrize("eviction, admission, optimizer", [("freq", True, "adagrad"), ("lru", False, "adagrad"),
                                                            ("lru", False, "adam")])
def test_consecutive_steps_hand_the_device_the_same_numbers(kernels, eviction, admission, optimizer):
    """What a CUDA graph captured at one step replays at every later one: the same operations
    with the same host numbers. A number that changes from step to step (the eviction clock
    a batch stamps, as it once was; Adam's step size) would be replayed stale; here the clock
    and the step count live on the device, and two steps in a row issue identical calls."""
    bag = _meta_bag(optimizer=optimizer, eviction=eviction, admission=admission, kernels=kernels)
    batches = _trace(4000, 64, [1, 3, 8], steps=4)
    bag.prefetch(*batches[0])
    _one_step(bag, batches, 0)
    seen = []
    for i in (1, 2):
        with _HostNumbers() as numbers:
            _one_step(bag, batches, i)
        seen.append(numbers.calls)
    assert len(seen[0]) > 100 and seen[0] == seen[1]
    assert bag.cache.policy.clock == bag.cache._clock.mirror == 7  # a prefetch, then two passes a step
