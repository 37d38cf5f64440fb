"""The device's view of pinned host rows (`embcache.cache.stores.unified_view`) and the link's
measurements built on it (`embcache.bench.link`, `bench probe`). On the CPU the view is the
tensor itself; on CUDA (`-m cuda`) it is a device tensor over the same pages, and the test
checks that reads and writes through it land on the right host bytes."""
import json

import pytest
import torch

from embcache.bench import link
from embcache.cache.stores.unified_view import device_view
from embcache.cli import main

HAVE_CUDA = torch.cuda.is_available()
cuda = [pytest.mark.cuda, pytest.mark.skipif(not HAVE_CUDA, reason="needs a CUDA GPU")]


def test_the_view_on_the_cpu_is_the_tensor_itself():
    host = torch.arange(12.0).view(4, 3)
    assert device_view(host, "cpu") is host


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int64])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=cuda)])
def test_gathers_and_writes_through_the_view_are_the_host_rows(device, dtype):
    host = torch.arange(40 * 6, dtype=torch.float32).view(40, 6).to(dtype)
    if device == "cuda":
        host = host.pin_memory()
    view = device_view(host, device)
    assert view.device.type == device and view.shape == host.shape and view.dtype == dtype
    idx = torch.tensor([7, 0, 39, 7, 12], device=device)
    assert torch.equal(view.index_select(0, idx).cpu(), host[idx.cpu()])
    rows = torch.full((2, 6), -3, dtype=dtype, device=device)
    view.index_copy_(0, torch.tensor([5, 30], device=device), rows)
    if device == "cuda":
        torch.cuda.synchronize()
    assert bool((host[[5, 30]] == -3).all()) and torch.equal(host[6], torch.arange(36, 42).to(dtype))


@pytest.mark.skipif(not HAVE_CUDA, reason="needs a CUDA GPU")
@pytest.mark.cuda
def test_pageable_memory_is_refused_with_a_reason():
    with pytest.raises(ValueError, match="pinned"):
        device_view(torch.zeros(4, 4), "cuda")


def test_random_rows_check_their_own_bytes_and_restore_the_table():
    table = link.host_table(1 << 16, torch.device("cpu"))
    before = table.clone()
    r = link.random_rows(table, 128, torch.device("cpu"), rows=64, reps=2)
    assert r["gathered_right"] and r["written_right"]
    assert r["gather_gbps"] > 0 and r["gather_rows_per_s"] == pytest.approx(r["gather_gbps"] * 1e9 / 128)
    assert torch.equal(table, before)  # the scatter's rows were put back


def test_bench_probe_reports_each_row_width_and_both_sorts(tmp_path):
    assert main(["bench", "probe", "--device", "cpu", "--table-mib", "1", "--rows", "256", "--batch-size", "4",
                 "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "probe.json").read_text())
    assert data["pinned_copy_gbps"] is None  # no link without CUDA
    assert data["unified_view"]["ok"] and [r["row_bytes"] for r in data["unified_view"]["rows"]] == [64, 128, 512]
    assert [(s["shape"], s["ids"]) for s in data["sorts"]] == [("one-hot", 4 * 26), ("multi-hot", 4 * 214)]
    assert "triton_gather" not in data  # CUDA only


@pytest.mark.skipif(not HAVE_CUDA, reason="needs a CUDA GPU")
@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_triton_row_moves_equal_the_tensor_ones(dtype):
    """The device bookkeeper's masked moves: the Triton kernel (masked entries move nothing)
    and the tensor ops (masked entries go through the spare row) leave the same rows."""
    from embcache.cache.stores.host_link import HostLink
    from embcache.cache.stores.host_store import HostStore

    g = torch.Generator().manual_seed(0)
    results = []
    for kernels in ("triton", "tensor"):
        store = HostStore.create("memory", torch.randn(200, 12, generator=g.manual_seed(0)), {"sum": (12, 0.5)},
                                 dtype, pin=True, spare_rows=1)
        link = HostLink(store, torch.device("cuda"), kernels)
        assert link.triton == (kernels == "triton")
        work = {name: torch.zeros(41, t.shape[1], dtype=t.dtype, device="cuda") for name, t in store.with_spare().items()}
        ids = torch.randperm(200, generator=g.manual_seed(1))[:40].cuda()
        rows = torch.randperm(40, generator=g.manual_seed(2)).cuda()
        mask = (torch.rand(40, generator=g.manual_seed(3)) < 0.5).cuda()
        link.read(ids, rows, mask, work, trash_row=40)
        for t in work.values():
            t[:40] += 1
        link.write(ids.flip(0), rows, mask, work, trash_row=40)
        torch.cuda.synchronize()
        results.append(({k: v[:40][mask[rows.argsort()]].cpu() for k, v in work.items()}, store.weight.clone(),
                        store.state["sum"].clone()))
    (work_a, weight_a, sum_a), (work_b, weight_b, sum_b) = results
    assert all(torch.equal(work_a[k], work_b[k]) for k in work_a)
    assert torch.equal(weight_a, weight_b) and torch.equal(sum_a, sum_b)
