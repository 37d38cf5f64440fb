"""The batch-lookup kernels (`embcache.kernels.batch_lookup`) under Triton's interpreter
(conftest sets TRITON_INTERPRET=1 where no GPU is): entry for entry the device bookkeeper's
torch path, in blocks small enough that every batch spans many; three operations on `meta`;
and the device bookkeeper running every kernel of its own decides as the host one."""
import pytest
import torch

import embcache.kernels.batch_lookup as batch_lookup
from embcache.cache.bookkeeping.device_cache import DeviceRowCache
from embcache.nn.cached_embedding_bag import CachedEmbeddingBag

from .cache_helpers import zipf_batches
from .test_device_bookkeeping import _run
from .test_kernels_fused import _Ops

# (ids, slots, batch, block): one block and many, every slot resident, none, a cache larger
# than the id space, a batch of one id
SHAPES = [(100, 10, 37, 8), (1000, 50, 300, 16), (50, 60, 200, 32), (20, 0, 5, 4), (1000, 999, 3, 4),
          (30, 30, 64, 8), (7, 3, 1, 4)]


class _TorchPath:
    """The torch path of `DeviceRowCache._look_up`, on a stand-in holding just what it reads."""

    kernels = "torch"

    def __init__(self, id_to_slot, num_slots, num_rows):
        self._pad, self.num_slots, self.num_rows, self.device = {"id_to_slot": id_to_slot}, num_slots, num_rows, "cpu"


def _case(num_rows, num_slots, n, seed, repeat=False):
    g = torch.Generator().manual_seed(seed)
    id_to_slot = torch.full((num_rows + 1,), -1)
    resident = torch.randperm(num_rows, generator=g)[: min(num_slots, num_rows)]
    id_to_slot[resident] = torch.randperm(num_slots, generator=g)[: resident.numel()]
    ids = torch.randint(0, num_rows, (n,), generator=g)
    if repeat:
        ids[: n // 2] = ids[0]  # a run of one id crossing blocks
    return ids, id_to_slot


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("repeat", [False, True])
def test_the_kernels_look_up_as_the_torch_path(shape, repeat, monkeypatch):
    num_rows, num_slots, n, block = shape
    monkeypatch.setattr(batch_lookup, "BLOCK", block)
    for seed in range(3):
        ids, id_to_slot = _case(num_rows, num_slots, n, seed, repeat)
        want = DeviceRowCache._look_up(_TorchPath(id_to_slot, num_slots, num_rows), ids)
        got = batch_lookup.look_up(ids, id_to_slot, num_slots, num_rows)
        names = ["slots", "hit", "in_batch", "missing", "m", "where"]
        for name, a, b in zip(names, got, want):
            assert a.dtype == b.dtype and torch.equal(a, b), name


def test_on_meta_a_lookup_is_a_sort_and_two_ops():
    ids, id_to_slot = torch.zeros(40, dtype=torch.long, device="meta"), torch.zeros(101, dtype=torch.long,
                                                                                       device="meta")
    with _Ops() as ops:
        out = batch_lookup.look_up(ids, id_to_slot, 10, 100)
    assert ops.names == ["aten.sort.stable", "embcache.lookup_counts.default", "embcache.lookup_ranks.default"]
    assert [tuple(t.shape) for t in out] == [(40,), (40,), (11,), (40,), (), (40,)]


def test_an_empty_or_misshapen_batch_is_refused():
    with pytest.raises(ValueError, match="non-empty 1-D int64"):
        batch_lookup.look_up(torch.zeros(0, dtype=torch.long), torch.full((5,), -1), 2, 4)
    with pytest.raises(ValueError, match="non-empty 1-D int64"):
        batch_lookup.look_up(torch.zeros(3, dtype=torch.int32), torch.full((5,), -1), 2, 4)


@pytest.mark.parametrize("eviction, admission", [("freq", False), ("lru", True)])
def test_with_its_own_kernels_the_device_bookkeeper_decides_as_the_host_one(eviction, admission, monkeypatch):
    """Lookup, row moves, pooled forward and fused update all Triton (interpreted): the same
    slots, victims, counters and rows as the host bookkeeper step after step (overflow every
    step, a validation pass, one batch prefetched ahead)."""
    monkeypatch.setattr(batch_lookup, "BLOCK", 16)
    g = torch.Generator().manual_seed(0)
    weight, freq = torch.randn(400, 3, generator=g), torch.randint(0, 20, (400,), generator=g)
    bags = [CachedEmbeddingBag(400, 3, weight=weight, ids_freq=freq, device="cpu", bookkeeping=b, kernels=k,
                               cache_ratio=0.03, eviction=eviction, admission=admission, optimizer="sgd", lr=0.1)
            for b, k in (("host", "torch"), ("device", "triton"))]
    assert bags[1].cache.kernels == "triton" and bags[1].cache.link.triton
    _run(bags, zipf_batches(400, 6, 8, 3, seed=2, a=1.1), depth=1, evaluate_every=3)


# ---------------------------------------------------------------------- on a GPU
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_the_kernels_look_up_as_the_torch_path():
    """Compiled for the GPU (full blocks of 1024): the shapes above, and a Kaggle-sized batch
    (425,984 ids over 3 M rows, 50,000 slots) spanning hundreds of blocks."""
    for num_rows, num_slots, n, _ in SHAPES + [(3_000_000, 50_000, 425_984, None)]:
        ids, id_to_slot = _case(num_rows, num_slots, n, seed=1, repeat=n > 100)
        ids, id_to_slot = ids.cuda(), id_to_slot.cuda()
        stand_in = _TorchPath(id_to_slot, num_slots, num_rows)
        stand_in.device = ids.device
        want = DeviceRowCache._look_up(stand_in, ids)
        got = batch_lookup.look_up(ids, id_to_slot, num_slots, num_rows)
        for name, a, b in zip(["slots", "hit", "in_batch", "missing", "m", "where"], got, want):
            assert a.dtype == b.dtype and torch.equal(a, b), (name, n)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_the_device_bookkeeper_decides_alike_with_either_kernels():
    """The device bookkeeper on CUDA with torch's kernels and with its own: the same slots,
    counters and step after step (the rows within float32 rounding: on CUDA torch's SGD adds
    a row's terms by atomics, the fused kernel in sorted order)."""
    g = torch.Generator().manual_seed(0)
    weight, freq = torch.randn(5000, 16, generator=g), torch.randint(0, 20, (5000,), generator=g)
    bags = [CachedEmbeddingBag(5000, 16, weight=weight, ids_freq=freq, device="cuda", bookkeeping="device",
                               kernels=k, cache_ratio=0.03, eviction="freq", admission=True, optimizer="sgd", lr=0.1)
            for k in ("torch", "triton")]
    assert bags[1].cache.link.triton
    batches = zipf_batches(5000, 12, 256, 4, seed=3, a=1.1)
    for bag in bags:
        bag.prefetch(*batches[0])
    for i, (ids, offsets) in enumerate(batches):
        for bag in bags:
            out = bag(ids, offsets)
            if i + 1 < len(batches):
                bag.prefetch(*batches[i + 1])
            (out * torch.linspace(0.5, 1.5, out.shape[1], device="cuda")).sum().backward()
        maps = [bag.cache.slots.slot_to_id.cpu() for bag in bags]
        assert torch.equal(maps[0], maps[1]), i
    stats = [bag.cache_stats() for bag in bags]
    assert stats[0] == stats[1] and stats[0]["overflow_rows"] > 0
    torch.testing.assert_close(bags[1].full_weight(), bags[0].full_weight(), rtol=1e-5, atol=1e-6)
