"""Rows stored in float16 / bfloat16: a cached table trains to the bit as the same
arithmetic on the whole table uncached (float32 update, rounded on write, to nearest or
stochastically with the same hashed randomness), under eviction; the optimizer state
stays float32; the pooled output is float32; rows cost half the bytes."""
import pytest
import torch
import torch.nn.functional as F

from embcache import CachedEmbeddingBag
from embcache.cache.optimizers import RowRounding, make_optimizer, update_rows
from tests.cache_helpers import zipf_batches

N, D, LR = 3000, 8, 0.05
OPTIMIZERS = ["sgd", "adagrad", "rowwise_adagrad", "adam"]


class UncachedTable:
    """The whole table in the row type, trained without a cache: the forward reads the
    rows as float32, the sparse gradient is summed as torch sums it, and every touched
    row is updated in float32 and rounded on write (ids are rows here)."""

    def __init__(self, weight, dtype, optimizer, rounding, mode="sum"):
        self.weight = weight.to(dtype)
        self.opt = make_optimizer(optimizer, LR)
        self.state = self.opt.init_state(N, D)
        self.rounding, self.mode, self.step = rounding, mode, 0

    def train_step(self, ids, offsets, target):
        table = self.weight.float().requires_grad_()
        out = F.embedding_bag(ids, table, offsets, mode=self.mode, sparse=True)
        (out * target).sum().backward()
        grad = table.grad.coalesce() if self.opt.needs_coalesced else table.grad
        self.step += 1
        update_rows(self.opt, self.weight, self.state, grad._indices()[0], grad._values(), self.step,
                    torch.arange(N), self.rounding)
        return out


def train_both(optimizer, dtype, rounding, steps=50, mode="sum", cache_ratio=0.03, **bag_kw):
    torch.manual_seed(0)
    w0 = torch.randn(N, D)
    ref = UncachedTable(w0, getattr(torch, dtype), optimizer, RowRounding(getattr(torch, dtype), rounding, 7), mode)
    bag = CachedEmbeddingBag(N, D, mode=mode, cache_ratio=cache_ratio, optimizer=optimizer, lr=LR, weight=w0,
                             device="cpu", eviction="lru", row_dtype=dtype, rounding=rounding, rounding_seed=7,
                             **bag_kw)
    gen = torch.Generator().manual_seed(1)
    for ids, offsets in zipf_batches(N, steps, 32, 3):
        target = torch.randn(32, D, generator=gen)
        want = ref.train_step(ids, offsets, target)
        got = bag(ids, offsets)
        assert got.dtype == torch.float32 and torch.equal(got, want.detach())
        (got * target).sum().backward()
    return bag, ref


CASES = [(opt, "bfloat16", "stochastic") for opt in OPTIMIZERS] + [(opt, "float16", "nearest") for opt in OPTIMIZERS] \
    + [("adagrad", "bfloat16", "nearest"), ("adam", "float16", "stochastic")]


@pytest.mark.parametrize("optimizer,dtype,rounding", CASES)
def test_cached_half_rows_equal_the_uncached_arithmetic(optimizer, dtype, rounding):
    bag, ref = train_both(optimizer, dtype, rounding)
    assert bag.cache_stats()["evictions"] > 0.9 * 50 * 32
    got = bag.full_weight()
    assert got.dtype == getattr(torch, dtype)
    assert torch.equal(got, ref.weight), f"max difference {(got.float() - ref.weight.float()).abs().max()}"
    bag.flush()
    for k, v in bag.cache.host.state.items():
        assert v.dtype == torch.float32 and torch.equal(v, ref.state[k]), k


@pytest.mark.parametrize("optimizer,dtype,rounding", [("sgd", "bfloat16", "stochastic"), ("sgd", "float16", "nearest"),
                                                      ("adagrad", "bfloat16", "stochastic")])
def test_device_bookkept_half_rows_equal_the_uncached_arithmetic(optimizer, dtype, rounding):
    """The device bookkeeper's update of half-precision rows (the cache's and the overflow
    rows' in one call; SGD's repeated rows found in a fixed size, Adagrad's coalesced rows
    beside the trash row) is the same arithmetic, to the bit."""
    bag, ref = train_both(optimizer, dtype, rounding, steps=30, cache_ratio=0.01, bookkeeping="device")
    stats = bag.cache_stats()
    assert bag.cache.bookkeeping == "device" and stats["evictions"] > 0 and stats["overflow_rows"] > 0
    assert torch.equal(bag.full_weight(), ref.weight)


def test_half_rows_on_a_mapped_store_with_mean_pooling(tmp_path):
    bag, ref = train_both("adagrad", "bfloat16", "stochastic", steps=40, mode="mean",
                          host_store=f"mmap:{tmp_path}")
    assert torch.equal(bag.full_weight(), ref.weight)
    assert (tmp_path / "weight.bin").stat().st_size == N * D * 2


def test_rounding_differs_from_nearest_and_is_unbiased():
    """Stochastic rounding lands on one of the two neighbours, with the probabilities
    that make it unbiased; it is a function of (seed, step, id), not of call order."""
    x = torch.full((20000, 1), 1.0 + 1 / 512)  # a quarter of the way from 1 to bfloat16's next, 1 + 1/128
    ids = torch.arange(20000)
    sr = RowRounding(torch.bfloat16, "stochastic", seed=3)
    y = sr(x, ids, step=1).float()
    assert set(y.unique().tolist()) == {1.0, 1.0 + 1 / 128}
    assert abs((y > 1).float().mean().item() - 0.25) < 0.02
    perm = torch.randperm(20000)
    assert torch.equal(sr(x[perm], ids[perm], step=1).float(), y[perm])
    assert not torch.equal(sr(x, ids, step=2).float(), y)
    assert torch.equal(RowRounding(torch.bfloat16, "nearest")(x, ids, 1), x.to(torch.bfloat16))
    small = torch.full((20000, 1), -3e-6)  # float16's subnormal range: a coarser grid
    z = RowRounding(torch.float16, "stochastic")(small, ids, 1).float()
    assert z.unique().numel() == 2 and abs(z.mean().item() / -3e-6 - 1) < 0.02


def test_stochastic_rounding_keeps_updates_nearest_rounding_loses():
    """An SGD step below half a bfloat16 unit: lost to nearest rounding, kept on average
    by stochastic rounding (the reason it exists)."""
    rows = torch.arange(4000)
    start = torch.ones(4000, 1)
    for mode, moved in (("nearest", False), ("stochastic", True)):
        weight = start.to(torch.bfloat16)
        opt = make_optimizer("sgd", 1.0)
        for step in range(1, 21):
            update_rows(opt, weight, {}, rows, torch.full((4000, 1), 1e-3), step, rows,
                        RowRounding(torch.bfloat16, mode))
        mean = weight.float().mean().item()
        assert (abs(mean - (1 - 0.02)) < 0.003) == moved, (mode, mean)


def test_half_rows_halve_the_bytes_moved():
    out = {}
    for dtype in ("float32", "bfloat16"):
        torch.manual_seed(0)
        bag = CachedEmbeddingBag(N, D, cache_ratio=0.03, optimizer="sgd", device="cpu", eviction="lru",
                                 row_dtype=dtype)
        for ids, offsets in zipf_batches(N, 20, 32, 3):
            bag(ids, offsets).sum().backward()
        out[dtype] = bag.cache_stats()
    assert out["bfloat16"]["misses"] == out["float32"]["misses"]
    assert out["bfloat16"]["bytes_h2d"] * 2 == out["float32"]["bytes_h2d"]


def test_bad_row_dtype_and_rounding_are_refused():
    with pytest.raises(ValueError, match="row_dtype"):
        CachedEmbeddingBag(10, 2, device="cpu", row_dtype="int8")
    with pytest.raises(ValueError, match="rounding"):
        CachedEmbeddingBag(10, 2, device="cpu", row_dtype="float16", rounding="up")


def test_a_checkpoint_of_other_row_type_is_refused():
    a = CachedEmbeddingBag(50, 2, device="cpu", row_dtype="bfloat16")
    b = CachedEmbeddingBag(50, 2, device="cpu")
    with pytest.raises(RuntimeError, match="bfloat16"):
        b.load_state_dict(a.state_dict())


def test_a_collection_of_several_groups_trains_half_rows():
    """Each group (here three dims) rounds with bits of its own (their row ids overlap)."""
    from embcache.sparse_types import EmbeddingBagConfig, KeyedJaggedTensor

    from embcache import CachedEmbeddingBagCollection

    tables = [EmbeddingBagConfig(name=f"t{d}", embedding_dim=d, num_embeddings=100, feature_names=[f"f{d}"])
              for d in (4, 8, 2)]
    ebc = CachedEmbeddingBagCollection(tables, cache_ratio=0.1, device="cpu", row_dtype="bfloat16",
                                       optimizer="adagrad", lr=0.05, rounding_seed=3)
    before = {t.name: ebc.table_weight(t.name).clone() for t in tables}
    kjt = KeyedJaggedTensor(keys=["f4", "f8", "f2"], values=torch.tensor([1, 2, 3, 1, 2, 3]),
                            lengths=torch.tensor([1, 1, 1, 1, 1, 1]))
    out = ebc(kjt).values()
    assert out.dtype == torch.float32
    out.sum().backward()
    for t in tables:
        after = ebc.table_weight(t.name)
        assert after.dtype == torch.bfloat16 and not torch.equal(after, before[t.name]), t.name
    seeds = {bag.cache.rounding.seed for bag in ebc.bags}
    assert len(seeds) == 3
