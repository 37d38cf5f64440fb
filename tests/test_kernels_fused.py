"""The fused backward + optimizer kernel (`embcache.kernels.fused_update`) against the torch
path it replaces (`lookup_terms`, `summed_in_torch_order`, `update_rows`), under Triton's
interpreter on the CPU (conftest sets TRITON_INTERPRET=1 where no GPU is), and on a GPU
where there is one.

Equal to the bit: SGD, Adagrad and Adam, every row type, sum and mean, with and without
per-sample weights, once torch's CPU `sqrt_` is made correctly rounded (`exact_sqrt`): the
kernel's `sqrt_rn` is, torch's vectorised CPU sqrt is not (about 0.7 % of float32 results one
unit in the last place (ULP) off; CUDA's is exact). With torch's own sqrt, Adagrad and Adam
rows are within one ULP of their type a step, their state equal (it takes no sqrt).
Row-wise Adagrad to a stated tolerance either way: its mean of the squared row is reduced in
`tl.sum`'s order, not in torch's (the kernel module's docstring), so its accumulator is
within a few float32 ULPs and its row within one ULP of its type.
Small on purpose: every program runs in Python.
"""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from embcache.cache import optimizers
from embcache.cache.bookkeeping.device_updates import lookup_bags, lookup_terms
from embcache.cache.bookkeeping.fixed_size import pick, summed_in_torch_order
from embcache.kernels.fused_update import fused_row_update, optimizer_factors, state_tensors
from embcache.nn.cached_embedding_bag import CachedEmbeddingBag

from .cache_helpers import long_runs_padded, zipf_batches

OPTIMIZERS = ["sgd", "adagrad", "rowwise_adagrad", "adam"]
ROW_DTYPES = [torch.float32, torch.float16, torch.bfloat16]
ROWS, DIM = 24, 5


@pytest.fixture
def exact_sqrt(monkeypatch):
    """torch's in-place sqrt (the optimizers') correctly rounded, through float64 (53 bits
    round a float32 square root once: no double rounding)."""
    monkeypatch.setattr(torch.Tensor, "sqrt_", lambda self: self.copy_(self.double().sqrt()))


def _batch(kind, g):
    """(ids, offsets): one-hot, or multi-hot with an empty bag, an id repeated in a bag,
    and the table's last row."""
    if kind == "one_hot":
        ids = torch.randint(0, ROWS, (12,), generator=g)
        offsets = torch.arange(12)
    else:
        ids = torch.randint(0, ROWS // 3, (30,), generator=g)  # few distinct rows: long runs
        offsets = torch.tensor([0, 4, 4, 11, 19, 27])
        ids[5] = ids[6] = ids[7]
    ids[-1] = ROWS - 1
    return ids, offsets


def _tables(opt, dtype, g):
    weight = torch.randn(ROWS + 1, DIM, generator=g).to(dtype)  # + the trash row
    state = opt.init_state(ROWS + 1, DIM)
    for v in state.values():
        v.uniform_(0.01, 1.0, generator=g)  # nonzero accumulators and moments: each term matters
    return weight, state


def _torch_path(opt, weight, state, rows, terms, step):
    """The device bookkeeper's torch update (`apply_rows` for one table on the CPU)."""
    if opt.needs_coalesced:
        keys, terms = summed_in_torch_order(rows, terms)
        rows = pick(keys >= 0, keys, ROWS)  # the trash row takes the duplicates' -0.0
    optimizers.update_rows(opt, weight, state, rows, terms, step, torch.arange(ROWS + 1),
                           optimizers.RowRounding(weight.dtype), distinct=opt.needs_coalesced, fixed_size=True)


def _fused(opt, weight, state, rows, bags, grad_out, scale, weights, step):
    keys, order = rows.sort(stable=True) if not opt.needs_coalesced else rows.sort(0)
    fused_row_update(weight, *state_tensors(state, weight), keys, order, rows, bags, grad_out, scale, weights,
                     **optimizer_factors(opt, step))


def _bits(t):
    return t.view({4: torch.int32, 2: torch.int16}[t.element_size()])


def _assert_rows_alike(name, got, want, exact=True, steps=3, lr=0.05):
    """Equal bits; row-wise Adagrad (or, not `exact`, any) within one ULP of the row type
    a step, of the row or of its update: |got - want| <= steps * eps * (|want| + lr * sqrt(D))
    (an update is at most lr in size, row-wise Adagrad's lr * sqrt(D): an element against the
    row's mean square)."""
    got, want = got[:ROWS], want[:ROWS]  # the trash row is a sink, never read
    if name != "rowwise_adagrad" and exact:
        assert torch.equal(_bits(got), _bits(want))
        return
    bound = steps * torch.finfo(got.dtype).eps * (want.float().abs() + lr * DIM**0.5)
    assert bool(((got.float() - want.float()).abs() <= bound).all())


def _assert_state_alike(name, got, want):
    for k in want:
        a, b = got[k][:ROWS], want[k][:ROWS]
        if name == "rowwise_adagrad":  # a few float32 ULPs (the mean's last bit, then one add)
            torch.testing.assert_close(a, b, rtol=4 * torch.finfo(torch.float32).eps, atol=0)
        else:
            assert torch.equal(_bits(a), _bits(b))


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("dtype", ROW_DTYPES)
@pytest.mark.parametrize("mode, weighted", [("sum", False), ("mean", False), ("sum", True)])
@pytest.mark.parametrize("kind", ["one_hot", "multi_hot"])
def test_the_fused_step_is_the_torch_paths(optimizer, dtype, mode, weighted, kind, exact_sqrt):
    _compare_steps(optimizer, dtype, mode, weighted, kind)


@pytest.mark.parametrize("optimizer", ["adagrad", "adam"])
def test_with_torchs_own_cpu_sqrt_rows_are_within_one_ulp(optimizer):
    _compare_steps(optimizer, torch.float32, "sum", False, "multi_hot", exact=False)


def _compare_steps(optimizer, dtype, mode, weighted, kind, exact=True):
    g = torch.Generator().manual_seed(OPTIMIZERS.index(optimizer) * 7 + len(mode) + weighted)
    opt = optimizers.make_optimizer(optimizer, 0.05)
    ids, offsets = _batch(kind, g)
    grad_out = torch.randn(offsets.numel(), DIM, generator=g) * torch.exp(2 * torch.randn(offsets.numel(), 1,
                                                                                          generator=g))
    weights = torch.rand(ids.numel(), generator=g) if weighted else None
    weight, state = _tables(opt, dtype, g)
    want_w, want_s = weight.clone(), {k: v.clone() for k, v in state.items()}
    for step in (1, 2, 5):  # bias corrections and Adagrad's decay move with the step
        _torch_path(opt, want_w, want_s, ids, lookup_terms(grad_out, ids, offsets, weights, mode), step)
        bags, scale = lookup_bags(ids, offsets, mode)
        _fused(opt, weight, state, ids, bags, grad_out, scale, weights, step)
    assert not torch.equal(_bits(weight), _bits(weight.new_zeros(weight.shape)))
    _assert_rows_alike(optimizer, weight, want_w, exact)
    _assert_state_alike(optimizer, state, want_s)


LONG_RUNS = {0: 9, 3: 1, 5: 4, 7: 5, 11: 13, 16: 2, ROWS - 1: 6}  # row: lookups (chunk 4: <= 4 short)


def _long_run_batch(g):
    """One-hot lookups whose sorted runs straddle chunks of 4: runs of 1, 2, 4 (a chunk's
    length), 5 (one more), 6, 9 and 13 (several whole chunks), the first at position 0 and
    the last at the batch's end (43 lookups: the last chunk is short)."""
    ids = torch.cat([torch.full((m,), row) for row, m in LONG_RUNS.items()])
    ids = ids[torch.randperm(ids.numel(), generator=g)]
    return ids, torch.arange(ids.numel())


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("dtype", ROW_DTYPES)
def test_long_runs_are_summed_in_chunks_the_rest_as_the_torch_path(optimizer, dtype, exact_sqrt):
    """With chunks of 4 lookups: rows of runs up to 4 long equal the torch path to the bit
    (their order is its order); longer runs are summed piece by piece (each chunk's piece in
    order, then the pieces in chunk order, SGD's too, applied once), within the reordered
    float32 sum's bound of the torch path: (m + 2) units in the last place of the row type
    of |row| + lr * (sum of |terms| + sqrt(D)) for a run of m; and two launches give the same
    bits."""
    g = torch.Generator().manual_seed(11 + OPTIMIZERS.index(optimizer))
    opt = optimizers.make_optimizer(optimizer, 0.05)
    ids, offsets = _long_run_batch(g)
    grad_out = torch.randn(offsets.numel(), DIM, generator=g)
    weight, state = _tables(opt, dtype, g)
    want_w, want_s = weight.clone(), {k: v.clone() for k, v in state.items()}
    _torch_path(opt, want_w, want_s, ids, lookup_terms(grad_out, ids, offsets, None, "sum"), 1)
    bags, _ = lookup_bags(ids, offsets, "sum")
    keys, order = ids.sort(stable=True) if not opt.needs_coalesced else ids.sort(0)
    runs = []
    for _ in range(2):
        w, st = weight.clone(), {k: v.clone() for k, v in state.items()}
        fused_row_update(w, *state_tensors(st, w), keys, order, ids, bags, grad_out, None, None,
                         **optimizer_factors(opt, 1), chunk=4)
        runs.append((w, st))
    (got_w, got_s), (again_w, again_s) = runs
    assert torch.equal(_bits(got_w), _bits(again_w)) and all(torch.equal(got_s[k], again_s[k]) for k in got_s)
    short = [r for r, m in LONG_RUNS.items() if m <= 4]
    long = [r for r, m in LONG_RUNS.items() if m > 4]
    if optimizer != "rowwise_adagrad":  # its mean has a tolerance of its own (above)
        assert torch.equal(_bits(got_w[short]), _bits(want_w[short]))
        assert all(torch.equal(_bits(got_s[k][short]), _bits(want_s[k][short])) for k in got_s)
    untouched = [r for r in range(ROWS) if r not in LONG_RUNS]
    assert torch.equal(_bits(got_w[untouched]), _bits(weight[untouched]))
    terms = lookup_terms(grad_out, ids, offsets, None, "sum").abs()
    for r in long:
        m = LONG_RUNS[r]
        spread = terms[ids == r].sum(0) + DIM**0.5
        bound = (m + 2) * torch.finfo(dtype).eps * (want_w[r].float().abs() + 0.05 * spread)
        assert bool(((got_w[r].float() - want_w[r].float()).abs() <= bound).all()), (r, m)
        assert not torch.equal(got_w[r], weight[r])  # the row moved: no piece was lost outright
        for k in got_s:
            torch.testing.assert_close(got_s[k][r], want_s[k][r], rtol=(m + 2) * torch.finfo(torch.float32).eps, atol=0)


def test_a_long_runs_pieces_all_count():
    """SGD at chunks of 4 against the sum of every term, applied once: a piece dropped or
    added twice would move a row by a whole term (lr * |t|, far above the bound)."""
    g = torch.Generator().manual_seed(3)
    opt = optimizers.make_optimizer("sgd", 0.5)
    ids, offsets = _long_run_batch(g)
    grad_out = torch.randn(offsets.numel(), DIM, generator=g)
    weight = torch.randn(ROWS + 1, DIM, generator=g)
    got = weight.clone()
    bags, _ = lookup_bags(ids, offsets, "sum")
    keys, order = ids.sort(stable=True)
    fused_row_update(got, got.new_empty(0), got.new_empty(0), keys, order, ids, bags, grad_out, None, None,
                     **optimizer_factors(opt, 1), chunk=4)
    want = weight.clone().index_add_(0, ids, grad_out.double().float(), alpha=-0.5)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("given_ids", [True, False])
def test_stochastic_rounding_repeats_row_roundings_hash(dtype, given_ids):
    """Half rows written by the kernel's stochastic rounding equal `RowRounding`'s to the bit:
    the same hash of (seed, step, id, column), each row's id from `row_ids` (else the row),
    float16's coarser grid below its normal range (rows of 1e-6), runs short and long."""
    g = torch.Generator().manual_seed(1)
    rounding = optimizers.RowRounding(dtype, "stochastic", seed=7)
    weight = (torch.randn(ROWS + 1, DIM, generator=g) * torch.exp(3 * torch.randn(ROWS + 1, 1, generator=g))).to(dtype)
    weight[3] = (torch.randn(DIM, generator=g) * 1e-6).to(dtype)
    ids, offsets = _long_run_batch(g)
    grad_out = torch.randn(ids.numel(), DIM, generator=g) * 1e-2
    row_ids = torch.randperm(ROWS + 1, generator=g) * 1000 + 5 if given_ids else None
    keys, order = ids.sort(stable=True)
    got = weight.clone()
    fused_row_update(got, got.new_empty(0, dtype=torch.float32), got.new_empty(0, dtype=torch.float32), keys, order,
                     ids, torch.arange(ids.numel()), grad_out, None, None, optimizer="sgd", alpha=-0.05, eps=0.0,
                     beta1c=1.0, beta2c=1.0, stochastic_salt=rounding.salt(3), row_ids=row_ids)
    rows32 = weight.float()
    for j in order.tolist():  # SGD's terms one by one, in sorted order (runs of at most 64)
        rows32[ids[j]] = torch.add(rows32[ids[j]], grad_out[j], alpha=-0.05)
    touched = ids.unique()
    want = weight.clone()
    want[touched] = rounding(rows32[touched], (row_ids if given_ids else torch.arange(ROWS + 1))[touched], step=3)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    assert not torch.equal(want[touched], rows32[touched].to(dtype))  # not what rounding to nearest writes


def test_the_chunk_must_be_a_power_of_two():
    w = torch.zeros(2, 2)
    ids = torch.tensor([0, 1])
    with pytest.raises(ValueError, match="power of two"):
        fused_row_update(w, w.new_empty(0), w.new_empty(0), ids, ids, ids, ids, w, None, None, optimizer="sgd",
                         alpha=-0.1, eps=0.0, beta1c=1.0, beta2c=1.0, chunk=6)


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_given_rows_and_trash_entries_take_the_torch_paths_update(optimizer, exact_sqrt):
    """A table read by several features: torch sums the terms (`table_sums`), the kernel
    takes its per-row results as terms, trash entries (-0.0 at the trash row) among them."""
    g = torch.Generator().manual_seed(11)
    opt = optimizers.make_optimizer(optimizer, 0.05)
    ids = torch.randint(0, ROWS, (20,), generator=g)
    terms = torch.randn(20, DIM, generator=g)
    weight, state = _tables(opt, torch.float32, g)
    want_w, want_s = weight.clone(), {k: v.clone() for k, v in state.items()}
    _torch_path(opt, want_w, want_s, ids, terms, 1)
    if opt.needs_coalesced:
        keys, terms = summed_in_torch_order(ids, terms)
        ids = pick(keys >= 0, keys, ROWS)
    keys, order = ids.sort(stable=True)
    fused_row_update(weight, *state_tensors(state, weight), keys, order, ids, torch.arange(ids.numel()), terms,
                     None, None, **optimizer_factors(opt, 1))
    _assert_rows_alike(optimizer, weight, want_w)
    _assert_state_alike(optimizer, state, want_s)


# ---------------------------------------------------------------------- whole cached training
def _trained(optimizer, kernels, row_dtype="float32", segments=False, steps=14):
    torch.manual_seed(0)
    weight = torch.randn(300, 4)
    bag = CachedEmbeddingBag(300, 4, weight=weight, cache_ratio=0.04, optimizer=optimizer, lr=0.05, device="cpu",
                             bookkeeping="device", row_dtype=row_dtype, mode="sum" if segments else "mean")
    bag.cache.kernels = kernels
    batches = zipf_batches(300, steps, 6, 3, seed=3, a=1.1)
    bag.prefetch(*batches[0])
    for i, (ids, offsets) in enumerate(batches):
        if segments:  # one table read by two features: half the lookups each
            out = bag.lookup_checked(ids, offsets, None, [[ids.numel() // 2, ids.numel() - ids.numel() // 2]])
        else:
            out = bag(ids, offsets)
        if i + 1 < len(batches):
            bag.prefetch(*batches[i + 1])
        (out * torch.linspace(0.5, 1.5, 4)).sum().backward()
    assert bag.cache_stats()["overflow_rows"] > 0  # the overflow rows' write-back ran too
    return bag.full_weight()


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("row_dtype, segments", [("float32", False), ("bfloat16", False), ("float16", False),
                                                 ("float32", True)])
def test_cached_training_with_the_fused_kernel_is_torchs(optimizer, row_dtype, segments, exact_sqrt):
    """A dozen steps and more of a 4 % cache (overflow every step), device bookkeeping, the fused
    kernel against torch's path (its sqrt exact, as CUDA's is): the same table, to the bit
    (row-wise Adagrad: to 1e-5 after the steps, its mean's last bit compounding). Half rows
    are written by the bag's default stochastic rounding: the kernel repeats its hash."""
    want = _trained(optimizer, "torch", row_dtype, segments)
    got = _trained(optimizer, "triton", row_dtype, segments)
    if optimizer == "rowwise_adagrad":
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    else:
        assert torch.equal(got.view(torch.int32), want.view(torch.int32))


def test_cached_adam_training_with_torchs_own_cpu_sqrt_is_close():
    """With torch's own CPU sqrt (not correctly rounded), the roots' last bits feed back into
    later steps: the tables stay within 1e-5 relative."""
    torch.testing.assert_close(_trained("adam", "triton"), _trained("adam", "torch"), rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------- one op, on meta too
class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


def test_the_op_on_meta_is_one_dispatched_op():
    opt = optimizers.make_optimizer("adam", 0.1)
    weight, state = _tables(opt, torch.bfloat16, torch.Generator().manual_seed(0))
    weight, meta = weight.to("meta"), {k: v.to("meta") for k, v in state.items()}
    ids = torch.randint(0, ROWS, (9,), device="meta")
    keys, order = ids.sort(stable=True)
    grad_out, states = torch.empty(9, DIM, device="meta"), state_tensors(meta, weight)
    with _Ops() as ops:
        fused_row_update(weight, *states, keys, order, ids, ids, grad_out, None, None, **optimizer_factors(opt, 1))
    assert ops.names == ["embcache.fused_row_update.default"]


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_a_whole_step_with_the_fused_kernel_runs_on_meta(optimizer, monkeypatch):
    """The device bookkeeper's step with kernels "triton" on `meta`: no value goes to the
    host, and the update is the one op (torch's `update_rows` never runs)."""
    from embcache.cache.bookkeeping import device_updates

    monkeypatch.setattr(device_updates, "update_rows", lambda *a, **k: pytest.fail("torch's update ran"))
    bag = CachedEmbeddingBag(4000, 8, cache_ratio=0.05, optimizer=optimizer, lr=0.1, device="meta",
                             bookkeeping="device", ids_freq=torch.randint(0, 5, (4000,)), row_dtype="float16",
                             rounding="nearest")  # stochastic rounding takes torch's path
    bag.cache.kernels = "triton"
    g = torch.Generator().manual_seed(1)
    offsets = torch.arange(0, 64 * 4, 4)
    batches = [(torch.randint(0, 4000, (256,), generator=g), offsets) for _ in range(3)]
    bag.prefetch(*batches[0])
    for i in range(2):
        out = bag(*batches[i])
        bag.prefetch(*batches[i + 1])
        with _Ops() as ops:
            out.sum().backward()
        assert ops.names.count("embcache.fused_row_update.default") == 1
    assert bag.cache.step == 2


# ---------------------------------------------------------------------- on a GPU
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("dtype", ROW_DTYPES)
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_the_fused_step_is_the_torch_paths_on_cuda(optimizer, dtype, rounding):
    """On CUDA torch's `index_add_` rounds `alpha * t` before adding (no fused multiply-add),
    as the kernel does there: equal bits, but for row-wise Adagrad (its mean) and SGD (whose
    repeated rows torch adds by atomics in no fixed order): within one ULP of the row type.
    Stochastic rounding of half rows: the kernel takes the salt as a device tensor computed
    from a step count on the device (`RowRounding.salt_of`), as a captured step passes it;
    Adam its step size so too (`alpha_tensor`, from `Adam.step_size_of`)."""
    if rounding == "stochastic" and dtype == torch.float32:
        pytest.skip("float32 rows take no rounding")
    g = torch.Generator().manual_seed(5)
    opt = optimizers.make_optimizer(optimizer, 0.05)
    ids, offsets = _batch("multi_hot", g)
    grad_out = torch.randn(offsets.numel(), DIM, generator=g)
    weight, state = _tables(opt, dtype, g)
    cuda = {"ids": ids.cuda(), "offsets": offsets.cuda(), "grad_out": grad_out.cuda()}
    want_w, want_s = weight.cuda(), {k: v.cuda() for k, v in state.items()}
    got_w, got_s = weight.cuda(), {k: v.cuda() for k, v in state.items()}
    terms = lookup_terms(cuda["grad_out"], cuda["ids"], cuda["offsets"], None, "mean")
    rows = cuda["ids"]
    if opt.needs_coalesced:
        keys, terms = summed_in_torch_order(rows, terms, stable=True)
        rows = pick(keys >= 0, keys, ROWS)
    row_rounding = optimizers.RowRounding(dtype, rounding, seed=3)
    optimizers.update_rows(opt, want_w, want_s, rows, terms, 1, torch.arange(ROWS + 1, device="cuda"),
                           row_rounding, distinct=opt.needs_coalesced, fixed_size=True)
    bags, scale = lookup_bags(cuda["ids"], cuda["offsets"], "mean")
    keys, order = cuda["ids"].sort(stable=True)
    step = torch.ones((), dtype=torch.int64, device="cuda")  # the count on the device, as a captured step reads it
    salt = row_rounding.salt_of(step) if rounding == "stochastic" else None
    fused_row_update(got_w, *state_tensors(got_s, got_w), keys, order, cuda["ids"], bags, cuda["grad_out"], scale,
                     None, **optimizer_factors(opt, step), salt_tensor=salt)
    torch.cuda.synchronize()
    if optimizer in ("sgd", "rowwise_adagrad"):
        _assert_rows_alike("rowwise_adagrad", got_w.cpu(), want_w.cpu())
        _assert_state_alike("rowwise_adagrad", {k: v.cpu() for k, v in got_s.items()},
                            {k: v.cpu() for k, v in want_s.items()})
    else:
        _assert_rows_alike(optimizer, got_w.cpu(), want_w.cpu())
        _assert_state_alike(optimizer, {k: v.cpu() for k, v in got_s.items()}, {k: v.cpu() for k, v in want_s.items()})


def test_adams_step_size_at_the_devices_step_count_is_the_hosts():
    """`Adam.step_size_of` (a step count on the device, as a captured step reads it) gives
    `step_size`'s bits at every step: from its table to the step where both bias corrections
    are exactly 1, then `lr`. Betas settling past the table's limit are refused in one line."""
    opt = optimizers.Adam(0.05)
    settled = opt.settled_step()
    assert settled == 37_412 and 1 - opt.beta2 ** (settled - 1) != 1.0 and opt.step_size(settled) == opt.lr
    assert opt._tables == {} and opt.step_size_of(torch.tensor(1)) is not None
    assert opt._tables[torch.device("cpu")].numel() * 8 // 1024 == 292  # KiB, as the docs say
    steps = [*range(1, 2000), *range(settled - 50, settled + 50), 10**6, 2**40]
    got = [opt.step_size_of(torch.tensor(k)) for k in steps]
    assert all(g.dtype == torch.float64 and g.item() == opt.step_size(k) for g, k in zip(got, steps))
    with pytest.raises(ValueError, match="settle past step 1,048,576"):
        optimizers.Adam(0.05, betas=(0.9, 0.9999999)).step_size_of(torch.tensor(3))


@pytest.mark.parametrize("kernels", ["torch", "triton"])
def test_adam_at_the_devices_step_count_updates_as_at_the_hosts(kernels):
    """Adam's update with the step count as a 0-d tensor (torch's path: the step size a 0-d
    float64 in the product; the kernel: `alpha_tensor`) writes the bits the host's count
    writes, rows and moments, over steps 1-3 and 5,000."""
    g = torch.Generator().manual_seed(6)
    opt = optimizers.make_optimizer("adam", 0.05)
    ids, offsets = _batch("multi_hot", g)
    grad_out = torch.randn(offsets.numel(), DIM, generator=g)
    weight, state = _tables(opt, torch.float32, g)
    runs = []
    for on_device in (False, True):
        w, st = weight.clone(), {k: v.clone() for k, v in state.items()}
        for step in (1, 2, 3, 5000):
            count = torch.tensor(step) if on_device else step
            if kernels == "torch":
                _torch_path(opt, w, st, ids, lookup_terms(grad_out, ids, offsets, None, "sum"), count)
            else:
                _fused(opt, w, st, ids, *lookup_bags(ids, offsets, "sum")[:1], grad_out, None, None, count)
        runs.append((w, st))
    (want_w, want_s), (got_w, got_s) = runs
    assert torch.equal(_bits(got_w), _bits(want_w)) and not torch.equal(want_w, weight)
    assert all(torch.equal(_bits(got_s[k]), _bits(want_s[k])) for k in want_s)


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad"])
def test_a_padded_batch_updates_every_row_as_the_unpadded_one(optimizer):
    """A batch padded as a captured step pads it (`nn.fixed_capacity.pad_features`: one
    extra bag, its lookups repeating the first id, its output dropped), through the fused
    kernel's chunks of 64: three rows with runs of about 100 lookups and 150 pads. The pads
    set aside (`DeviceUpdates.set_pads_aside`), every row and its state equal the unpadded
    batch's to the bit; left in place, they join the first id's run and shift the runs after
    it across the chunks, and the sums round otherwise."""
    g = torch.Generator().manual_seed(4)
    ids, offsets, padded_ids, padded_offsets = long_runs_padded(g)
    scale = torch.linspace(0.5, 1.5, 4)
    results = []
    for padded in (False, True):
        torch.manual_seed(0)
        bag = CachedEmbeddingBag(8, 4, cache_ratio=1.0, optimizer=optimizer, lr=0.05, device="cpu",
                                 bookkeeping="device", kernels="triton")
        for _ in range(2):
            if padded:
                out = bag.lookup_normalized(padded_ids, padded_offsets, None, padded=(101, 1))[:100]
            else:
                out = bag(ids, offsets)
            (out * scale).sum().backward()
        results.append((bag.full_weight(), bag.table_rows(slice(0, 8))))
    (want_weight, want_rows), (got_weight, got_rows) = results
    assert ids.bincount().min() > 64 and 450 - ids.numel() > 64  # runs and pads longer than a chunk
    assert torch.equal(got_weight, want_weight) and not torch.equal(want_weight, torch.zeros_like(want_weight))
    assert all(torch.equal(got_rows[k], want_rows[k]) for k in want_rows)
