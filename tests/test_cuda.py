"""The cache on a GPU: exactness against torch's own tables on the same device, the
synchronisation budget, prefetch depth 1-4 under heavy eviction, and checkpoints moving
between a GPU run and a CPU one.

Every test body runs on the CPU in the default suite (which proves the test itself) and
on CUDA where a GPU is present (`-m cuda` selects those alone; they are skipped without
one). On CUDA, both sides run under `torch.use_deterministic_algorithms(True)`; the
tables are compared to a stated tolerance there (CUDA may contract a multiply-add that
the CPU rounds twice) and each test says whether they were in fact bit-equal.
"""
import pytest
import torch

from embcache.bench.gpu import count_syncs
from embcache.cache.optimizers import OPTIMIZERS
from embcache.nn.cached_embedding_bag import CachedEmbeddingBag

from tests.cache_helpers import reference_bag, zipf_batches

HAVE_CUDA = torch.cuda.is_available()
cuda = [pytest.mark.cuda, pytest.mark.skipif(not HAVE_CUDA, reason="needs a CUDA GPU")]
DEVICES = ["cpu", pytest.param("cuda", marks=cuda)]
ROWS, DIM, LR = 5000, 16, 0.05
CUDA_TOLERANCE = dict(rtol=1e-5, atol=1e-6)  # float32 rounding of the same sums


@pytest.fixture
def deterministic():
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(before)


def _assert_tables(cached: torch.Tensor, uncached: torch.Tensor, device: str) -> None:
    cached, uncached = cached.cpu(), uncached.detach().cpu()
    if device == "cpu":
        assert torch.equal(cached, uncached)
        return
    torch.testing.assert_close(cached, uncached, **CUDA_TOLERANCE)
    print(f"bit-equal on {device}: {torch.equal(cached, uncached)}; "
          f"largest difference {float((cached - uncached).abs().max()):.3g}")


def _train_pair(device, optimizer, depth, cache_ratio, batches, **kw):
    """A cached bag and torch's table trained on the same batches, the cached one
    prefetching `depth` batches ahead (ids from the host, as a loader gives them)."""
    torch.manual_seed(0)
    weight = torch.randn(ROWS, DIM)
    bag = CachedEmbeddingBag(ROWS, DIM, weight=weight, cache_ratio=cache_ratio, optimizer=optimizer, lr=LR,
                             device=device, **kw)
    ref, ref_opt = reference_bag(weight, "sum", optimizer, LR)
    ref = ref.to(device)
    if optimizer == "rowwise_adagrad":
        ref_opt.weight, ref_opt.sum = ref.weight, ref_opt.sum.to(device)
    else:
        ref_opt = type(ref_opt)(ref.parameters(), lr=LR)
    scale = torch.linspace(0.5, 1.5, DIM, device=device)
    for ids, offsets in batches[:depth]:
        bag.prefetch(ids, offsets)
    for i, (ids, offsets) in enumerate(batches):
        out = bag(ids, offsets)
        if i + depth < len(batches):
            bag.prefetch(*batches[i + depth])
        (out * scale).sum().backward()
        ref_opt.zero_grad()
        (ref(ids.to(device), offsets.to(device)) * scale).sum().backward()
        ref_opt.step()
    return bag, ref


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("depth", [1, 2, 3, 4])
@pytest.mark.parametrize("bookkeeping", ["host", "device"])
def test_cached_equals_torch_tables_on_the_device(device, optimizer, depth, bookkeeping, deterministic):
    """Eviction every step, prefetch `depth` ahead, and overflow (batches needing more
    distinct rows than the 1 % cache holds), with either bookkeeper."""
    batches = zipf_batches(ROWS, 12, 64, 4, seed=5, a=1.05)
    bag, ref = _train_pair(device, optimizer, depth, 0.01, batches, bookkeeping=bookkeeping)
    stats = bag.cache_stats()
    assert stats["evictions"] > 0 and stats["overflow_rows"] > 0
    _assert_tables(bag.full_weight(), ref.weight, device)
    assert int(bag.cache.holds.sum()) == 0


@pytest.mark.parametrize("device", DEVICES)
def test_prefetch_race_many_batches_in_flight_under_heavy_eviction(device, deterministic):
    """Four batches prefetched ahead through a cache barely larger than one batch's rows:
    the pending batches hold most slots, every admission must evict around them, and a
    row an in-flight batch needs is never evicted (else its lookups would read another
    row and the tables would differ)."""
    batches = zipf_batches(ROWS, 30, 48, 3, seed=6, a=1.3)
    distinct = max(int(torch.unique(ids).numel()) for ids, _ in batches)
    bag, ref = _train_pair(device, "adagrad", 4, 1.3 * distinct / ROWS, batches, warmup_ratio=0)
    assert bag.cache_stats()["evictions"] > 10 * bag.cache.num_slots // 4
    _assert_tables(bag.full_weight(), ref.weight, device)


def _warn_syncs(fn, sites: list | None = None) -> int:
    return count_syncs(fn, torch.device("cuda"), sites)


def _torch_pair(weight, optimizer):
    """torch's own table on CUDA and its sparse optimizer, as the cached bag is built."""
    ref, ref_opt = reference_bag(weight, "sum", optimizer, LR)
    ref = ref.cuda()
    if optimizer == "rowwise_adagrad":
        ref_opt.weight, ref_opt.sum = ref.weight, ref_opt.sum.cuda()
    else:
        ref_opt = type(ref_opt)(ref.parameters(), lr=LR)
    return ref, ref_opt


@pytest.mark.cuda
@pytest.mark.skipif(not HAVE_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("row_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("bookkeeping", ["host", "device"])
def test_sync_budget(optimizer, row_dtype, bookkeeping):
    """Each bookkeeper by name (`auto` is the device's on CUDA). The prefetch of a batch
    (checks on the host, admission, evictions, copies) makes no synchronisation at all
    with ids from the host (sync debug mode "error"); the forward makes no more than
    torch's `nn.EmbeddingBag` forward on device input, and the backward with its update
    no more than torch's own table and sparse optimizer: the coalesce of Adagrad, row-wise
    Adagrad and Adam, none for SGD. The device bookkeeper makes none in either. Its
    first step (which makes its overflow region and pinned buffers) is not counted, as in
    `test_a_device_bookkept_step_never_waits_for_the_device`."""
    batches = zipf_batches(ROWS, 8, 64, 4, seed=7, a=1.1)
    torch.manual_seed(0)
    weight = torch.randn(ROWS, DIM)
    bag = CachedEmbeddingBag(ROWS, DIM, weight=weight, cache_ratio=0.05, optimizer=optimizer, lr=LR, device="cuda",
                             bookkeeping=bookkeeping, row_dtype=row_dtype)
    assert bag.cache.bookkeeping == bookkeeping
    ref, ref_opt = _torch_pair(weight, optimizer)
    bag.prefetch(*batches[0])
    first = 1 if bookkeeping == "device" else 0
    for i, (ids, offsets) in enumerate(batches[:-1]):
        if i < first:
            bag(ids, offsets).sum().backward()
            bag.prefetch(*batches[i + 1])
            continue
        ids_dev, offsets_dev = ids.cuda(), offsets.cuda()
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            bag.prefetch(*batches[i + 1])
        finally:
            torch.cuda.set_sync_debug_mode("default")
        outs, sites = {}, []  # sites: where the cached side waited, to say so on failure
        forward = {"cached": _warn_syncs(lambda: outs.update(cached=bag(ids, offsets)), sites),
                   "torch": _warn_syncs(lambda: outs.update(torch=ref(ids_dev, offsets_dev)))}
        assert forward["cached"] <= forward["torch"], (forward, sites)
        backward = {"cached": _warn_syncs(lambda: outs["cached"].sum().backward(), sites),
                    "torch": _warn_syncs(lambda: (ref_opt.zero_grad(), outs["torch"].sum().backward(),
                                                  ref_opt.step()))}
        assert backward["cached"] <= backward["torch"], (backward, sites)
        if bookkeeping == "device":
            assert forward["cached"] == backward["cached"] == 0, (forward, backward, sites)
        if optimizer == "sgd":
            assert backward["cached"] == 0, (backward, sites)


@pytest.mark.cuda
@pytest.mark.skipif(not HAVE_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("row_dtype", ["float32", "float16", "bfloat16"])
def test_a_device_bookkept_step_never_waits_for_the_device(optimizer, row_dtype):
    """Forward, prefetch of the next batch and backward with the update, ids from the host,
    overflow every step, rows of every type (half-precision ones updated in float32 copies,
    deduplicated in a fixed size): under sync debug mode "error" any wait of the host raises."""
    batches = zipf_batches(ROWS, 8, 64, 4, seed=7, a=1.05)
    torch.manual_seed(0)
    bag = CachedEmbeddingBag(ROWS, DIM, cache_ratio=0.01, optimizer=optimizer, lr=LR, device="cuda",
                             bookkeeping="device", row_dtype=row_dtype)
    assert bag.cache.bookkeeping == "device"
    bag.prefetch(*batches[0])
    for i, (ids, offsets) in enumerate(batches[:-1]):
        if i == 1:  # the first step made the overflow region and the pinned buffers
            torch.cuda.synchronize()
        if i >= 1:
            torch.cuda.set_sync_debug_mode("error")
        try:
            out = bag(ids, offsets)
            bag.prefetch(*batches[i + 1])
            out.sum().backward()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert bag.cache_stats()["overflow_rows"] > 0


@pytest.mark.parametrize("device", DEVICES)
def test_checkpoint_moves_between_a_gpu_run_and_a_cpu_run(device, deterministic):
    """A checkpoint taken on `device` loads on the CPU, and one taken there loads back on
    `device`: tables, optimizer state, residency and statistics arrive whole, and both
    runs go on alike."""
    batches = zipf_batches(ROWS, 16, 48, 3, seed=8, a=1.1)
    torch.manual_seed(0)
    kw = dict(weight=torch.randn(ROWS, DIM), cache_ratio=0.02, optimizer="adagrad", lr=LR)
    gpu = CachedEmbeddingBag(ROWS, DIM, device=device, **kw)
    cpu = CachedEmbeddingBag(ROWS, DIM, device="cpu", **kw)
    for ids, offsets in batches[:8]:
        gpu(ids, offsets).sum().backward()
    cpu.load_state_dict(gpu.state_dict())
    assert torch.equal(cpu.full_weight(), gpu.full_weight())
    assert cpu.cache_stats() == gpu.cache_stats()
    assert torch.equal(cpu.cache.slots.slot_to_id, gpu.cache.slots.slot_to_id.cpu())
    for ids, offsets in batches[8:]:
        for bag in (gpu, cpu):
            bag(ids, offsets).sum().backward()
    _assert_tables(gpu.full_weight(), cpu.full_weight(), device)
    back = CachedEmbeddingBag(ROWS, DIM, device=device, **kw)
    back.load_state_dict(cpu.state_dict())
    assert torch.equal(back.full_weight(), cpu.full_weight())
    assert back.cache_stats() == cpu.cache_stats()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=cuda)])
def test_cf_torch_engine_on_the_device_trains_what_it_trains_on_the_cpu(device, tmp_path):
    """The torch CF engine's parameters and Adam on the device, its negatives drawn on the
    CPU: two epochs end where the CPU run ends (float32, different kernels: within 1e-4),
    the parameters written back for evaluation, and a checkpoint resumes there."""
    import numpy as np

    from embcache.cf.data.synthetic import power_law_interactions
    from embcache.cf.trainer import CFTrainConfig, CFTrainer

    data = power_law_interactions(num_users=60, num_items=90, interactions=900, communities=3, seed=2)

    def train(dev, epochs, ckdir, resume=False):
        cfg = CFTrainConfig(epochs=epochs, engine="torch", negatives=4, threads=1, progress=False, device=dev,
                            checkpoint_dir=str(ckdir), resume=resume)
        trainer = CFTrainer(cfg, data)
        return trainer, trainer.fit()

    ref, ref_summary = train("cpu", 2, tmp_path / "ref")
    got, summary = train(device, 2, tmp_path / "dev")
    assert np.abs(got.params.U - ref.params.U).max() < 1e-4 and np.abs(got.params.I - ref.params.I).max() < 1e-4
    assert abs(summary["recall@20"] - ref_summary["recall@20"]) < 1e-3
    resumed, _ = train(device, 3, tmp_path / "dev", resume=True)
    more, _ = train("cpu", 3, tmp_path / "ref", resume=True)
    assert np.abs(resumed.params.U - more.params.U).max() < 1e-4


def test_the_heat_engine_refuses_another_device_in_one_line():
    from embcache.cf.trainer import CFTrainConfig, CFTrainer

    with pytest.raises(ValueError, match="(HEAT engine runs on the CPU|CUDA)") as err:
        CFTrainer(CFTrainConfig(epochs=1, engine="heat", device="cuda", progress=False))
    assert "\n" not in str(err.value)
