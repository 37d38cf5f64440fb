"""The row-move kernel (`embcache.kernels.row_moves`) under Triton's interpreter (conftest sets
TRITON_INTERPRET=1 where no GPU is): every table of a row moved bit for bit in one launch,
masked pairs untouched, one op on `meta`; and the host link built on it moves what its tensor
path moves."""
import pytest
import torch

from embcache.cache.stores.host_link import HostLink
from embcache.cache.stores.host_store import HostStore
import embcache.kernels.row_moves as row_moves
from embcache.kernels.row_moves import MAX_BLOCK, move_rows

from .test_kernels_fused import _Ops


def _tables(rows, g, widths=(8, 8, 1), dtypes=(torch.bfloat16, torch.float32, torch.float32)):
    return [torch.randn(rows, w, generator=g).to(dt) for w, dt in zip(widths, dtypes)]


@pytest.mark.parametrize("widths", [(8, 8, 1), (3,), (5, 5, 5, 1), (MAX_BLOCK + 3, 2)])
@pytest.mark.parametrize("rows_per_program", [1, 4, 64])  # 1: a GPU's; the interpreter's default 64
def test_rows_move_bit_for_bit_where_masked_in_and_nowhere_else(widths, rows_per_program, monkeypatch):
    monkeypatch.setattr(row_moves, "ROWS_INTERPRETED", rows_per_program)
    g = torch.Generator().manual_seed(0)
    dtypes = [torch.bfloat16, torch.float16, torch.float32, torch.float32][: len(widths)]
    srcs = _tables(40, g, widths, dtypes)
    dsts = [torch.full((12, t.shape[1]), -7.0).to(t.dtype) for t in srcs]
    before = [d.clone() for d in dsts]
    src_rows = torch.tensor([39, 0, 5, 5, 17, 2])
    dst_rows = torch.tensor([0, 11, 3, 3, 4, 99])  # a masked pair's rows are never read: 99 is past the end
    mask = torch.tensor([True, True, True, False, True, False])
    move_rows(srcs, dsts, src_rows, dst_rows, mask)
    for src, dst, old in zip(srcs, dsts, before):
        want = old.clone()
        want[dst_rows[mask]] = src[src_rows[mask]]
        assert torch.equal(dst.view(torch.uint8), want.view(torch.uint8))


def test_the_op_on_meta_is_one_dispatched_op_whatever_the_tables():
    srcs = [torch.empty(50, 8, device="meta"), torch.empty(50, 1, device="meta")]
    dsts = [torch.empty(9, 8, device="meta"), torch.empty(9, 1, device="meta")]
    rows, mask = torch.zeros(6, dtype=torch.long, device="meta"), torch.ones(6, dtype=torch.bool, device="meta")
    with _Ops() as ops:
        move_rows(srcs, dsts, rows, rows, mask)
    assert ops.names == ["embcache.move_rows.default"]


@pytest.mark.parametrize("bad", ["dtype", "width", "count", "mask"])
def test_mismatched_tables_are_refused_in_one_line(bad):
    a, b = torch.zeros(4, 2), torch.zeros(4, 2)
    rows, mask = torch.zeros(2, dtype=torch.long), torch.ones(2, dtype=torch.bool)
    args = {"dtype": ([a], [b.half()], rows, rows, mask), "width": ([a], [torch.zeros(4, 3)], rows, rows, mask),
            "count": ([a] * 5, [b] * 5, rows, rows, mask), "mask": ([a], [b], rows, rows, mask.long())}[bad]
    with pytest.raises(ValueError, match="move_rows"):
        move_rows(*args)
    assert not b.any()


@pytest.mark.parametrize("state", [{}, {"sum": (4, 0.1)}, {"exp_avg": (4, 0.0), "exp_avg_sq": (4, 0.0)}])
def test_the_links_kernel_moves_what_its_tensor_ops_move(state):
    """Reads and writes through `HostLink` with the kernel ("triton") and with tensor ops
    ("tensor"): the same working table and the same host store after each."""
    g = torch.Generator().manual_seed(3)
    weight = torch.randn(30, 4, generator=g)
    stores = [HostStore.create("memory", weight, state, torch.bfloat16, spare_rows=1) for _ in range(2)]
    links = [HostLink(s, "cpu", kernels) for s, kernels in zip(stores, ("triton", "tensor"))]
    assert [link.triton for link in links] == [True, False]
    works = [{n: torch.zeros(7, v.shape[1], dtype=v.dtype) for n, v in link.views.items()} for link in links]
    ids, rows = torch.tensor([4, 29, 0, 13, 8]), torch.tensor([0, 1, 2, 3, 4])
    mask = torch.tensor([True, True, False, True, True])
    for link, work in zip(links, works):
        link.read(ids, rows, mask, work, trash_row=6)
        for t in work.values():
            t[:5] += 1  # the rows trained
        link.write(ids.flip(0), rows, mask.flip(0), work, trash_row=6)
    for name in links[0].views:
        assert torch.equal(works[0][name][:6], works[1][name][:6])  # row 6: the tensor path's trash
        assert torch.equal(links[0].host[name][:30], links[1].host[name][:30])


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_rows_cross_the_link_both_ways_through_the_pinned_view():
    """The host link on CUDA: the kernel passes its check and moves rows between the pinned
    store (read and written through its device view) and a device table as the tensor ops do."""
    g = torch.Generator().manual_seed(4)
    weight = torch.randn(3000, 16, generator=g)
    state = {"exp_avg": (16, 0.0), "exp_avg_sq": (16, 0.0)}
    stores = [HostStore.create("memory", weight, state, torch.bfloat16, pin=True, spare_rows=1) for _ in range(2)]
    links = [HostLink(s, "cuda", kernels) for s, kernels in zip(stores, ("triton", "tensor"))]
    assert [link.triton for link in links] == [True, False]
    n = 1000
    ids = torch.randperm(3000, generator=g)[:n].cuda()
    rows = torch.randperm(n, generator=g).cuda()
    mask = (torch.rand(n, generator=g) < 0.7).cuda()
    works = [{k: torch.zeros(n + 1, v.shape[1], dtype=v.dtype, device="cuda") for k, v in link.views.items()}
             for link in links]
    for link, work in zip(links, works):
        link.read(ids, rows, mask, work, trash_row=n)
        for t in work.values():
            t[:n] += 1
        link.write(ids.flip(0), rows, mask.flip(0), work, trash_row=n)
    torch.cuda.synchronize()
    for name in links[0].views:
        assert torch.equal(works[0][name][:n], works[1][name][:n])
        assert torch.equal(links[0].host[name][:3000], links[1].host[name][:3000])
