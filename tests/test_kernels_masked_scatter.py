"""The masked-scatter kernel (`embcache.kernels.masked_scatter`) under Triton's interpreter
(conftest sets TRITON_INTERPRET=1 where no GPU is): the tensor ops' writes, bit for bit, for
every array type the device bookkeeper keeps, without touching the trash entry they write;
one op on `meta`; and `fixed_size.write_where` giving the same array either way."""
import pytest
import torch

import embcache.kernels.masked_scatter as masked_scatter
from embcache.bench.op_count import count_ops
from embcache.cache.bookkeeping.fixed_size import pick, write_where

DTYPES = [torch.int64, torch.int32, torch.float64, torch.float32, torch.bool]


def _case(dtype, n=300, size=200, seed=0):
    g = torch.Generator().manual_seed(seed)
    dst = (torch.randn(size + 1, generator=g) * 100).to(dtype)  # the last entry: the trash
    index = torch.randperm(size, generator=g)[:n] if n <= size else torch.randint(0, size, (n,), generator=g)
    mask = torch.rand(index.numel(), generator=g) < 0.3
    values = (torch.randn(index.numel(), generator=g) * 100).to(dtype)
    return dst, index, values, mask


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("one_value", [False, True])
def test_the_kernel_writes_what_index_copy_writes_and_leaves_the_trash(dtype, one_value, monkeypatch):
    monkeypatch.setattr(masked_scatter, "BLOCK", 64)  # a list over several programs
    dst, index, values, mask = _case(dtype, n=150)
    if one_value:
        values = values[:1].reshape(())
    want, got = dst.clone(), dst.clone()
    trash = dst.numel() - 1
    write_where(want, pick(mask, index, trash), values, mask, "torch")
    write_where(got, pick(mask, index, trash), values, mask, "triton")
    assert torch.equal(got[:trash], want[:trash]) and got[trash] == dst[trash]


def test_add_counts_each_masked_in_entry_once():
    dst, index, _, mask = _case(torch.int32, n=150)
    one = torch.ones(1, dtype=torch.int32)
    want, got = dst.clone(), dst.clone()
    write_where(want, pick(mask, index, 200), one, mask, "torch", add=True)
    write_where(got, pick(mask, index, 200), one, mask, "triton", add=True)
    assert torch.equal(got[:200], want[:200]) and int((got - dst).sum()) == int(mask.sum())


def test_on_meta_a_masked_write_is_one_op():
    dst, index = torch.empty(10, device="meta"), torch.zeros(6, dtype=torch.long, device="meta")
    values, mask = torch.empty(6, device="meta"), torch.ones(6, dtype=torch.bool, device="meta")
    counted = count_ops(lambda: masked_scatter.scatter_masked(dst, index, values, mask))
    assert dict(counted.ops) == {"scatter_masked": 1}  # (and views, which launch nothing)


def test_mismatched_arguments_are_refused():
    dst, index, values, mask = _case(torch.int64)
    with pytest.raises(ValueError, match="values of its dtype"):
        masked_scatter.scatter_masked(dst, index, values.float(), mask)
    with pytest.raises(ValueError, match="mask bool"):
        masked_scatter.scatter_masked(dst, index, values, mask.long())
    with pytest.raises(ValueError, match="1-D"):
        masked_scatter.scatter_masked(dst.view(-1, 1), index, values, mask)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", DTYPES)
def test_on_cuda_a_long_mostly_masked_list_writes_what_index_copy_writes(dtype):
    """A batch's worth of entries (1.7 M, 5 % of them set), as the device bookkeeper's lists are."""
    g = torch.Generator().manual_seed(1)
    n, size = 1_703_936, 2_000_000
    dst = (torch.randn(size + 1, generator=g) * 100).to(dtype).cuda()
    index = torch.randperm(size, generator=g)[:n].cuda()
    mask = (torch.rand(n, generator=g) < 0.05).cuda()
    values = (torch.randn(n, generator=g) * 100).to(dtype).cuda()
    want, got = dst.clone(), dst.clone()
    write_where(want, pick(mask, index, size), values, mask, "torch")
    write_where(got, pick(mask, index, size), values, mask, "triton")
    assert torch.equal(got[:size], want[:size]) and torch.equal(got[size:], dst[size:])
