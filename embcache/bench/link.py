"""The host<->device link as the cache uses it, measured: a plain pinned copy, random rows
gathered from (and scattered into) pinned host memory through the device's unified view
(`embcache.cache.stores.unified_view`), and the device sorts that dedup ids by neighbour compare.

`bench probe` reports all of them; `bench gpu` takes the random-row rate at its row width
as the link's bound (the rate a step that moves B bytes of scattered rows can reach).
On the CPU the same code runs over ordinary memory (the view is the tensor itself), which
keeps it tested where there is no GPU; its figures then say nothing of a link.
"""
from __future__ import annotations

import statistics
import time

import torch

from embcache.cache.stores.unified_view import device_view

ROW_BYTES = (64, 128, 512)  # 16-, 32- and 128-float rows: the dims 16, 32 and 128 of float32 tables


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_seconds(fn, device: torch.device, reps: int, warmup: int = 1) -> float:
    """The median wall time of `fn()` over `reps` runs, each waited for (CUDA events on a GPU)."""
    for _ in range(warmup):
        fn()
    _sync(device)
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def pinned_copy_gbps(device: torch.device, mib: int = 256, reps: int = 10) -> float | None:
    """Host->device bandwidth of a plain pinned copy: what bulk copies can reach (None off CUDA)."""
    if device.type != "cuda":
        return None
    src = torch.empty(mib * 2**20, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty_like(src, device=device)
    seconds = median_seconds(lambda: dst.copy_(src, non_blocking=True), device, reps)
    return src.numel() / seconds / 1e9


def host_table(num_bytes: int, device: torch.device) -> torch.Tensor:
    """A host buffer of `num_bytes` (pinned where the device is CUDA), filled with its own
    float32 positions so that any row read through the view can be checked."""
    n = num_bytes // 4
    table = torch.empty(n, dtype=torch.float32, pin_memory=device.type == "cuda")
    torch.arange(n, out=table)  # exact to 2**24; past it the check compares the same rounding
    return table


def as_rows(table: torch.Tensor, row_bytes: int) -> torch.Tensor:
    """The flat float32 `table` as rows of `row_bytes` (a tail shorter than a row left out)."""
    width = row_bytes // 4
    return table[: table.numel() // width * width].view(-1, width)


def random_rows(table: torch.Tensor, row_bytes: int, device: torch.device, rows: int, reps: int = 5,
                seed: int = 0) -> dict:
    """Gather `rows` random rows of `row_bytes` from the host `table` through the device view
    into device memory, and scatter as many distinct rows back: GB/s and rows/s of each,
    and whether the bytes that arrived (and those written) are the right ones."""
    host = as_rows(table, row_bytes)
    width = host.shape[1]
    view = device_view(host, device)
    g = torch.Generator(device="cpu").manual_seed(seed)
    idx = torch.randint(host.shape[0], (rows,), generator=g).to(device)
    targets = torch.randperm(host.shape[0], generator=g)[:rows].to(device)
    out = torch.empty(rows, width, device=device)
    gather_s = median_seconds(lambda: torch.index_select(view, 0, idx, out=out), device, reps)
    gathered_right = bool(torch.equal(out.cpu(), host[idx.cpu()]))
    saved = host[targets.cpu()].clone()
    src = out.neg()
    scatter_s = median_seconds(lambda: view.index_copy_(0, targets, src), device, reps)
    _sync(device)
    written_right = bool(torch.equal(host[targets.cpu()], src.cpu()))
    host[targets.cpu()] = saved
    moved = rows * row_bytes
    return {"row_bytes": row_bytes, "rows": rows,
            "gather_gbps": moved / gather_s / 1e9, "gather_rows_per_s": rows / gather_s,
            "scatter_gbps": moved / scatter_s / 1e9, "scatter_rows_per_s": rows / scatter_s,
            "gathered_right": gathered_right, "written_right": written_right}


def same_row_reads(table: torch.Tensor, row_bytes: int, device: torch.device, rows: int, reps: int = 5) -> dict:
    """`rows` reads of one and the same host row through the view, against as many random
    rows: what a masked entry of a fixed-size list costs the tensor-op link, which sends it
    to the spare row (cheap where the device caches the row, a link trip each where not)."""
    host = as_rows(table, row_bytes)
    width = host.shape[1]
    view = device_view(host, device)
    idx = torch.zeros(rows, dtype=torch.long, device=device)
    out = torch.empty(rows, width, device=device)
    seconds = median_seconds(lambda: torch.index_select(view, 0, idx, out=out), device, reps)
    return {"row_bytes": row_bytes, "rows": rows, "same_row_rows_per_s": rows / seconds}


def random_row_gbps(device: torch.device, row_bytes: int, table_mib: int = 1024, rows: int = 1 << 18) -> dict:
    """`random_rows` over a fresh host table of `table_mib` (the bound `bench gpu` uses)."""
    table = host_table(table_mib * 2**20, device)
    rows = min(rows, table.numel() * 4 // row_bytes)
    return random_rows(table, row_bytes, device, rows)


def sort_ms(device: torch.device, n: int, high: int, reps: int = 10, seed: int = 0) -> dict:
    """Milliseconds of `torch.sort` of `n` random int64 ids below `high` on `device` (the
    dedup's sort), and of the stable sort that keeps first occurrences first."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    ids = torch.randint(high, (n,), generator=g).to(device)
    plain = median_seconds(lambda: torch.sort(ids), device, reps)
    stable = median_seconds(lambda: torch.sort(ids, stable=True), device, reps)
    return {"ids": n, "sort_ms": 1e3 * plain, "stable_sort_ms": 1e3 * stable}


def triton_random_rows(table: torch.Tensor, row_bytes: int, device: torch.device, rows: int, reps: int = 5,
                       seed: int = 0) -> dict:
    """The same random-row gather as `random_rows`, by the device bookkeeper's Triton row
    kernel (`kernels.row_moves.move_rows`, every entry unmasked) reading the pinned host
    table through its device view (`unified_view`): what the bookkeeper's link reaches, and
    a check of torch's gather kernel against it. CUDA only."""
    from embcache.cache.stores.unified_view import device_view
    from embcache.kernels.row_moves import move_rows

    host = as_rows(table, row_bytes)
    view = device_view(host, device)
    g = torch.Generator(device="cpu").manual_seed(seed)
    idx = torch.randint(host.shape[0], (rows,), generator=g).to(device)
    out = torch.empty(rows, host.shape[1], device=device)
    to = torch.arange(rows, device=device)
    every = torch.ones(rows, dtype=torch.bool, device=device)
    seconds = median_seconds(lambda: move_rows([view], [out], idx, to, every), device, reps)
    return {"row_bytes": row_bytes, "rows": rows, "gather_gbps": rows * row_bytes / seconds / 1e9,
            "gather_rows_per_s": rows / seconds, "gathered_right": bool(torch.equal(out.cpu(), host[idx.cpu()]))}
