"""The pooled-lookup kernel (`embcache.kernels.pooled`) against `F.embedding_bag`, and the
kernels' choice (`resolve_kernels`). Without a GPU Triton's interpreter runs the kernel on
CPU tensors (tests/conftest.py sets TRITON_INTERPRET=1): slow, one Python step per program,
so the tables and batches here are small. `torch.compile` of the op fails under the
interpreter: the `cuda` test checks it on a GPU."""
from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

pytest.importorskip("triton", reason="the embedding kernels need Triton (pip install triton)")

from embcache import CachedEmbeddingBag  # noqa: E402
from embcache.kernels import pooled, resolve, resolve_kernels  # noqa: E402
from embcache.kernels.pooled import pooled_lookup  # noqa: E402
from embcache.nn.cached_collection import CachedEmbeddingBagCollection  # noqa: E402
from embcache.sparse_types import EmbeddingBagConfig, KeyedJaggedTensor  # noqa: E402

HAVE_CUDA = torch.cuda.is_available()
DEVICE = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
ROWS, DIM = 40, 12
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def multi_hot(num_bags=16, seed=0, device=DEVICE):
    """Bags of 0 to 5 ids, the first and the last empty, one holding an id three times and
    one the table's last row: (indices, offsets)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 6, (num_bags,), generator=g)
    lengths[0] = lengths[-1] = 0
    lengths[3], lengths[5] = 4, 2
    indices = torch.randint(0, ROWS, (int(lengths.sum()),), generator=g)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)[:-1]])
    indices[offsets[3]:offsets[3] + 3] = 7  # a repeated id
    indices[offsets[5] + 1] = ROWS - 1  # the table's last row
    return indices.to(device), offsets.to(device)


def one_hot(num_bags=16, seed=0, device=DEVICE):
    g = torch.Generator().manual_seed(seed)
    indices = torch.randint(0, ROWS, (num_bags,), generator=g)
    indices[-1] = ROWS - 1
    return indices.to(device), torch.arange(num_bags, device=device)


def table_of(dtype, seed=0, device=DEVICE):
    return torch.randn(ROWS, DIM, generator=torch.Generator().manual_seed(seed)).to(device, dtype)


def torch_pooled(table, indices, offsets, weights, mode):
    return F.embedding_bag(indices, table.float(), offsets, mode=mode, per_sample_weights=weights)


def assert_as_torch(out, table, indices, offsets, weights=None, mode="sum"):
    """To the bit: the kernel sums each bag in torch's order, with torch's roundings (on the
    CPU, a weighted term by a fused multiply-add, as FBGEMM). On a GPU a weighted sum is
    held within the products' rounding: whether torch's CUDA kernel fuses each product into
    its add (as `tl.fma` does) is its compiler's choice, 2 (L + 1) units of 2^-24 of the
    sum of |terms| for a bag of L terms (two sequential sums, each within L + 1 roundings)."""
    ref = torch_pooled(table, indices, offsets, weights, mode)
    assert out.dtype == torch.float32 and out.shape == ref.shape
    if out.device.type == "cuda" and weights is not None:
        lengths = torch.diff(offsets, append=offsets.new_tensor([indices.numel()]))
        terms = F.embedding_bag(indices, table.float().abs(), offsets, mode="sum", per_sample_weights=weights.abs())
        assert ((out - ref).abs() <= 2 * (lengths[:, None] + 1) * 2.0 ** -24 * terms).all()
    else:
        assert torch.equal(out, ref), (out - ref).abs().max()


# ------------------------------------------------------------------------ against torch
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode, weighted", [("sum", False), ("mean", False), ("sum", True)])
@pytest.mark.parametrize("batch", [one_hot, multi_hot])
def test_the_kernel_equals_embedding_bag_to_the_bit(dtype, mode, weighted, batch):
    table = table_of(dtype)
    indices, offsets = batch()
    weights = torch.rand(indices.shape, device=DEVICE) * 4 - 2 if weighted else None
    assert_as_torch(pooled_lookup(table, indices, offsets, weights, mode), table, indices, offsets, weights, mode)


@pytest.mark.parametrize("bags_per_program", [1, 2, 4, 32])  # 1: a GPU's default; the interpreter's is 64
@pytest.mark.parametrize("mode, weighted", [("sum", False), ("mean", False), ("sum", True)])
def test_any_tile_of_bags_gives_the_same_bits(bags_per_program, mode, weighted):
    """Bags pooled side by side in tiles (the last one part empty, bags of 0 to 5 ids in
    one tile): each still sums its own terms in index order, equal to torch to the bit."""
    table = table_of(torch.float32)
    indices, offsets = multi_hot(num_bags=37)
    weights = torch.rand(indices.numel(), generator=torch.Generator().manual_seed(1)).to(DEVICE) if weighted else None
    out = pooled_lookup(table, indices, offsets, weights, mode, bags_per_program=bags_per_program)
    assert_as_torch(out, table, indices, offsets, weights, mode)
    with pytest.raises(ValueError, match="power of two"):
        pooled_lookup(table, indices, offsets, weights, mode, bags_per_program=3)


def test_a_dim_wider_than_a_block_is_split_over_programs(monkeypatch):
    monkeypatch.setattr(pooled, "MAX_BLOCK", 4)  # 12 columns: three programs a bag, none masked
    table = torch.randn(ROWS, 10, device=DEVICE)  # 10 columns: the third block masked at its end
    indices, offsets = multi_hot(6)
    weights = torch.rand(indices.shape, device=DEVICE)
    assert_as_torch(pooled_lookup(table, indices, offsets, weights), table, indices, offsets, weights)
    assert_as_torch(pooled_lookup(table, indices, offsets, mode="mean"), table, indices, offsets, mode="mean")


def test_bags_with_no_ids_are_zeros():
    table, offsets = table_of(torch.float16), torch.zeros(3, dtype=torch.long, device=DEVICE)
    indices = torch.zeros(0, dtype=torch.long, device=DEVICE)
    for mode in ("sum", "mean"):
        out = pooled_lookup(table, indices, offsets, mode=mode)
        assert torch.equal(out, torch.zeros(3, DIM, device=DEVICE))
        assert_as_torch(out, table, indices, offsets, mode=mode)


def test_the_wrapper_refuses_what_the_kernel_would_misread():
    table, (indices, offsets) = table_of(torch.float32), one_hot(4)
    with pytest.raises(ValueError, match="mode must be one of"):
        pooled_lookup(table, indices, offsets, mode="max")
    with pytest.raises(ValueError, match="need mode='sum'"):
        pooled_lookup(table, indices, offsets, torch.ones(4, device=DEVICE), mode="mean")
    with pytest.raises(ValueError, match="1-D int64"):
        pooled_lookup(table, indices.int(), offsets)
    with pytest.raises(ValueError, match="float32, float16 or bfloat16"):
        pooled_lookup(table.double(), indices, offsets)


# ------------------------------------------------------------------------ one op
class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("weighted", [False, True])
def test_on_meta_the_lookup_is_one_dispatched_op(weighted):
    table = torch.empty(ROWS, DIM, dtype=torch.bfloat16, device="meta")
    indices = torch.empty(30, dtype=torch.long, device="meta")
    offsets = torch.empty(7, dtype=torch.long, device="meta")
    weights = torch.empty(30, device="meta") if weighted else None
    with _Ops() as ops:
        out = pooled_lookup(table, indices, offsets, weights, "sum")
    assert ops.seen == ["embcache.pooled_lookup.default"]
    assert (out.device.type, out.shape, out.dtype) == ("meta", (7, DIM), torch.float32)


# ------------------------------------------------------------------------ the choice
def test_the_choices_resolve(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert [resolve_kernels(c, "cpu") for c in ("torch", "auto", "triton")] == ["torch", "torch", "triton"]
    assert [resolve_kernels(c, torch.device("cuda")) for c in ("torch", "auto", "triton")] == \
        ["torch", "triton", "triton"]


def test_auto_without_triton_falls_back_in_one_line(monkeypatch, caplog):
    monkeypatch.setattr(resolve, "_why_triton_is_missing", lambda: "ImportError: No module named 'triton'")
    with caplog.at_level(logging.WARNING, logger="embcache"):
        assert resolve_kernels("auto", "cuda") == "torch"
    assert len(caplog.records) == 1 and "\n" not in caplog.records[0].getMessage()
    assert "torch's embedding kernels serve" in caplog.records[0].getMessage()
    with pytest.raises(ValueError, match="kernels='triton' needs Triton") as err:
        resolve_kernels("triton", "cuda")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("choice, device, env, match", [
    ("triton", "cpu", None, "needs Triton's interpreter: set TRITON_INTERPRET=1"),
    ("triton", "cpu", "0", "needs Triton's interpreter"),
    ("cuda", "cuda", "1", r"kernels must be one of \('torch', 'triton', 'auto'\), got 'cuda'"),
])
def test_a_choice_that_cannot_be_honoured_is_one_line(monkeypatch, choice, device, env, match):
    if env is None:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    else:
        monkeypatch.setenv("TRITON_INTERPRET", env)
    with pytest.raises(ValueError, match=match) as err:
        resolve_kernels(choice, device)
    assert "\n" not in str(err.value)


def test_importing_the_package_imports_no_triton():
    code = ("import sys, embcache, embcache.kernels\n"
            "assert embcache.kernels.resolve_kernels('auto', 'cpu') == 'torch'\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'triton'))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert done.stdout.strip() == "[]"


# ------------------------------------------------------------------------ in the bag
@pytest.mark.parametrize("row_dtype, mode, weighted", [("float32", "sum", True), ("bfloat16", "mean", False)])
def test_a_device_bookkept_bag_forwards_as_with_torchs_kernels(row_dtype, mode, weighted):
    """Training forwards (rows past the cache's capacity served as overflow rows), their
    updates, then an evaluation forward: the same bits with either kernels. SGD, whose fused
    update equals torch's to the bit on the CPU (Adagrad's differs by the CPU's inexact
    square root: tests/test_kernels_fused.py)."""
    weight = torch.randn(ROWS, DIM, generator=torch.Generator().manual_seed(3))
    bags = {k: CachedEmbeddingBag(ROWS, DIM, mode=mode, cache_ratio=0.2, weight=weight, device=DEVICE,
                                  optimizer="sgd", lr=0.1, bookkeeping="device", kernels=k, row_dtype=row_dtype)
            for k in ("torch", "triton")}
    assert bags["triton"].cache.kernels == "triton"
    batches = [multi_hot(12, seed=s, device="cpu") for s in range(3)]
    outs = {}
    for kernels, bag in bags.items():
        outs[kernels] = []
        for ids, offsets in batches:
            weights = torch.rand(ids.shape, generator=torch.Generator().manual_seed(1)) if weighted else None
            out = bag(ids, offsets, weights)
            (out * torch.linspace(-1, 1, DIM)).sum().backward()
            outs[kernels].append(out.detach())
        bag.eval()
        with torch.no_grad():
            outs[kernels].append(bag(*batches[0]))
    assert bags["torch"].cache_stats()["overflow_rows"] > 0
    for a, b in zip(outs["torch"], outs["triton"]):
        if DEVICE == "cuda" and weighted:  # within the products' rounding (`assert_as_torch`)
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        else:
            assert torch.equal(a, b)
    assert torch.equal(bags["torch"].full_weight(), bags["triton"].full_weight())


def test_a_collections_group_is_one_launch_equal_to_torchs(monkeypatch):
    """Three tables of one group: one kernel launch a forward, the same bits as torch's."""
    launches = []
    kernel = pooled._pooled_op
    monkeypatch.setattr(pooled, "_pooled_op", lambda *args: launches.append(args[2].numel()) or kernel(*args))
    tables = [EmbeddingBagConfig(name=f"t{i}", embedding_dim=8, num_embeddings=20 + 5 * i, feature_names=[f"f{i}"])
              for i in range(3)]
    lengths = torch.tensor([0, 2, 1, 3, 1, 0, 2, 4, 1, 0, 3, 0])  # 4 samples, 3 features
    values = torch.randint(0, 20, (int(lengths.sum()),), generator=torch.Generator().manual_seed(0))
    kjt = KeyedJaggedTensor.from_lengths_sync(["f0", "f1", "f2"], values, lengths)
    outs = {}
    for kernels in ("torch", "triton"):
        torch.manual_seed(0)
        ebc = CachedEmbeddingBagCollection(tables, cache_ratio=0.2, device=DEVICE, bookkeeping="device",
                                           kernels=kernels, row_dtype="float16")
        first = ebc(kjt).values()
        first.sum().backward()
        outs[kernels] = (first.detach(), ebc(kjt).values().detach())
    assert launches == [12, 12]  # one launch over the 12 bags of the 3 features, per forward
    assert all(torch.equal(a, b) for a, b in zip(outs["torch"], outs["triton"]))


# ------------------------------------------------------------------------ on a GPU
@pytest.mark.cuda
@pytest.mark.skipif(not HAVE_CUDA, reason="needs a CUDA GPU (the compiled kernel and torch.compile)")
@pytest.mark.parametrize("dtype", DTYPES)
def test_the_compiled_kernel_equals_torch_on_the_gpu(dtype):
    """Unweighted sum and mean to the bit (the same order and IEEE division as torch's CUDA
    kernel), weighted sums within `assert_as_torch`'s bound; also through `torch.compile`
    (which fails under the interpreter), on bags of up to 39 ids of dim 128."""
    table = torch.randn(5000, 128, device="cuda").to(dtype)
    lengths = torch.randint(0, 40, (2048,), device="cuda")
    lengths[0] = lengths[-1] = 0
    offsets = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)[:-1]])
    indices = torch.randint(0, 5000, (int(lengths.sum()),), device="cuda")
    indices[-1] = 4999
    weights = torch.rand(indices.shape, device="cuda") * 4 - 2
    torch._dynamo.reset()  # each dtype compiles the one lambda anew: three dtypes x three calls would pass
    compiled = torch.compile(lambda t, i, o, w, m: pooled_lookup(t, i, o, w, m), fullgraph=True)  # dynamo's limit of 8
    for run in (pooled_lookup, compiled):
        for mode in ("sum", "mean"):
            assert_as_torch(run(table, indices, offsets, None, mode), table, indices, offsets, mode=mode)
        assert_as_torch(run(table, indices, offsets, weights, "sum"), table, indices, offsets, weights)
    for bags_per_program in (4, 16) if dtype == torch.float32 else ():  # tiles: one bag a program's bits
        for mode in ("sum", "mean"):
            assert torch.equal(pooled_lookup(table, indices, offsets, None, mode, bags_per_program),
                               pooled_lookup(table, indices, offsets, None, mode))
        assert torch.equal(pooled_lookup(table, indices, offsets, weights, "sum", bags_per_program),
                           pooled_lookup(table, indices, offsets, weights, "sum"))
