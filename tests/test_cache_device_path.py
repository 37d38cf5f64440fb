"""The cache's device path: what a batch asks of the device, and the write-backs it
defers. No GPU is needed: the lookup path runs with its rows on torch's `meta` device
(shapes without data, where any operation that would read device data on the host
raises), the update is held to torch's own count of synchronising operations
(`sync_counter`), and deferred write-backs are exercised on the CPU.
"""
import functools

import pytest
import torch
import torch.nn.functional as F

import embcache.nn.cached_embedding_bag as ceb
from embcache.cache.bookkeeping import row_updates
from embcache.cache.optimizers import OPTIMIZERS, make_optimizer, update_rows
from embcache.cache.bookkeeping.row_cache import RowCache
from embcache.cache.stores.transfers import RowTransfers
from embcache.nn.cached_embedding_bag import CachedEmbeddingBag

from tests.cache_helpers import reference_bag, zipf_batches
from tests.sync_counter import SyncCounter

ROWS, DIM = 3000, 8


def _meta_and_cpu_bags(monkeypatch, **kw):
    """The same bag twice: rows on the meta device, and on the CPU."""
    torch.manual_seed(0)
    weight, freq = torch.randn(ROWS, DIM), torch.randint(0, 50, (ROWS,))
    cpu = CachedEmbeddingBag(ROWS, DIM, weight=weight, ids_freq=freq, device="cpu", **kw)
    monkeypatch.setattr(ceb, "resolve_device", lambda name: torch.device("meta"))
    meta = CachedEmbeddingBag(ROWS, DIM, weight=weight, ids_freq=freq, device="meta", **kw)
    return meta, cpu


@pytest.mark.parametrize("admission", [False, True])
def test_lookups_read_no_device_data_on_the_host(monkeypatch, admission):
    """Training forwards with prefetch, heavy eviction and overflow (a batch needs more
    rows than the cache holds), with the rows on `meta`: every device operation is data
    independent, so none would make the host wait for a GPU. The CPU twin makes the same
    decisions (slot map and statistics equal), so the meta run is the real path."""
    meta, cpu = _meta_and_cpu_bags(monkeypatch, cache_ratio=0.02, optimizer="adagrad", admission=admission)
    batches = zipf_batches(ROWS, 12, 40, 3, seed=1, a=1.05)
    for bag in (meta, cpu):
        outs = []
        for i, (ids, offsets) in enumerate(batches):
            out = bag(ids, offsets)  # a training forward: its rows are held until the graph goes
            if i + 1 < len(batches):
                bag.prefetch(*batches[i + 1])
            outs.append(out)
            if len(outs) > 2:
                outs.pop(0)  # at most two batches in flight, as a training loop has
        del outs
    assert torch.equal(meta.cache.slots.slot_to_id, cpu.cache.slots.slot_to_id)
    assert meta.cache_stats() == cpu.cache_stats()
    assert meta(*batches[0]).device.type == "meta"
    stats = cpu.cache_stats()
    assert stats["evictions"] > 0 and stats["overflow_rows"] + stats["bypassed_rows"] > 0


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("row_dtype", ["float32", "bfloat16"])
def test_an_update_synchronises_no_more_than_torchs_own(optimizer, row_dtype, monkeypatch):
    """The backward of a host-bookkept bag (gradient ordering and the row-wise update, of
    float32 rows or of half-precision ones updated in float32 copies) makes no more
    synchronising operations than `nn.EmbeddingBag(sparse=True)` with the matching torch
    optimizer: the coalesce of Adagrad, row-wise Adagrad and Adam, none for SGD. Half rows
    are updated as off the CPU (`fixed_size`): on the CPU, with no device to wait for, they
    are deduplicated by `unique`, the cheaper there."""
    monkeypatch.setattr(row_updates, "update_rows", functools.partial(update_rows, fixed_size=True))
    torch.manual_seed(0)
    weight = torch.randn(ROWS, DIM)
    bag = CachedEmbeddingBag(ROWS, DIM, weight=weight, cache_ratio=0.05, optimizer=optimizer, lr=0.1,
                             device="cpu", bookkeeping="host", row_dtype=row_dtype)
    ref, ref_opt = reference_bag(weight, "sum", optimizer, 0.1)
    for ids, offsets in zipf_batches(ROWS, 5, 32, 4, seed=2):
        out = bag(ids, offsets)
        with SyncCounter() as cached:
            out.sum().backward()
        ref_opt.zero_grad()
        ref_out = ref(ids, offsets)
        with SyncCounter() as uncached:
            ref_out.sum().backward()
            ref_opt.step()
        assert cached.count <= uncached.count, (cached.ops, uncached.ops)
        assert cached.count == (0 if optimizer == "sgd" else 1), cached.ops


def _train(bag, batches, lr=0.1):
    for i, (ids, offsets) in enumerate(batches):
        out = bag(ids, offsets)
        if i + 1 < len(batches):
            bag.prefetch(*batches[i + 1])
        (out * torch.linspace(0.5, 1.5, DIM)).sum().backward()


def _deferred_run(monkeypatch, optimizer, check_conflicts=True):
    """Training with every write-back held back until a gather needs its row (as on
    CUDA while the copy is in flight): returns the bag."""
    if not check_conflicts:
        monkeypatch.setattr(RowTransfers, "_last_carrying", lambda self, ids: 0)
    torch.manual_seed(0)
    bag = CachedEmbeddingBag(ROWS, DIM, weight=torch.randn(ROWS, DIM), cache_ratio=0.01, warmup_ratio=0,
                             optimizer=optimizer, lr=0.1, device="cpu", eviction="lru")
    bag.cache.transfers.defer_on_cpu = True  # nothing was written back yet: warm-up writes none
    _train(bag, zipf_batches(ROWS, 25, 24, 3, seed=3, a=1.1))
    return bag


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad"])
def test_deferred_write_backs_keep_training_exact(monkeypatch, optimizer):
    """A row evicted dirty and missed again while its write-back is pending is read only
    after that write lands: the table equals uncached training to the bit. Without the
    wait the same run reads stale rows and differs, so the test sees the hazard."""
    torch.manual_seed(0)
    weight = torch.randn(ROWS, DIM)
    ref, ref_opt = reference_bag(weight, "sum", optimizer, 0.1)
    for ids, offsets in zipf_batches(ROWS, 25, 24, 3, seed=3, a=1.1):
        ref_opt.zero_grad()
        (ref(ids, offsets) * torch.linspace(0.5, 1.5, DIM)).sum().backward()
        ref_opt.step()
    bag = _deferred_run(monkeypatch, optimizer)
    assert bag.cache.transfers.waits > 0  # re-misses of rows still on their way back happened
    assert bag.cache.transfers.pending() > 0  # and writes were still pending at the end
    assert torch.equal(bag.full_weight(), ref.weight.detach())
    assert bag.cache.transfers.pending() == 0  # reading the table settled them
    careless = _deferred_run(monkeypatch, optimizer, check_conflicts=False)
    assert not torch.equal(careless.full_weight(), ref.weight.detach())


def test_a_checkpoint_settles_pending_writes_and_a_load_drops_none_over_it(monkeypatch):
    """state_dict lands every pending write first; a load lands them before overwriting
    the tables, so none lands over the restored rows."""
    bag = _deferred_run(monkeypatch, "adagrad")
    assert bag.cache.transfers.pending() > 0
    sd = {k: v.clone() for k, v in bag.state_dict().items()}
    assert bag.cache.transfers.pending() == 0
    _train(bag, zipf_batches(ROWS, 6, 24, 3, seed=4, a=1.1))
    assert bag.cache.transfers.pending() > 0
    bag.load_state_dict(sd)
    assert bag.cache.transfers.pending() == 0
    assert torch.equal(bag.full_weight(), sd["weight"])


def test_row_cache_indices_are_on_the_device_and_bookkeeping_on_the_host():
    cache = RowCache(torch.randn(100, 4), 10, make_optimizer("sgd", 0.1), device="meta")
    lookup = cache.prepare(torch.tensor([1, 2, 3, 2]), keep=True)
    assert lookup.indices.device.type == "meta" and lookup.ids.device.type == "cpu"  # ids cross only for a sum
    assert cache.slots.slot_to_id.device.type == "cpu" and lookup.held.device.type == "cpu"
    out = F.embedding_bag(lookup.indices, cache.weight, torch.tensor([0], device="meta"))
    assert out.shape == (1, 4)
    cache.release(lookup)
    assert int(cache.holds.sum()) == 0
