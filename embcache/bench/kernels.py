"""`embcache bench kernels`'s measurements (see `kernels_cli` for what and why)."""
from __future__ import annotations

import os
import time
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from embcache.bench.criteo_trace import CriteoTrace
from embcache.bench.gpu import SHAPES, _sync
from embcache.device import device_argument
from embcache.train.bench_results import write_json

LR, EPS = 0.01, 1e-10
TILES = (1, 4, 16)  # bags a program of the pooled kernel takes, measured side by side


def timed(fn, steps: int, warmup: int, device) -> float:
    """Seconds a call of `fn`, over `steps` calls after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        fn()
    _sync(device)
    return (time.perf_counter() - t0) / max(steps, 1)


def copy_gbps(mib: int, device, steps: int) -> float:
    """Device-to-device copy: bytes read plus written a second."""
    src = torch.empty(mib << 20, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    seconds = timed(lambda: dst.copy_(src), steps, 2, device)
    return 2 * src.numel() / seconds / 1e9


class TorchPath:
    """torch's sparse path over a whole table: `nn.EmbeddingBag(sparse=True)` and Adagrad."""

    def __init__(self, table: torch.Tensor):
        self.bag = nn.EmbeddingBag(*table.shape, mode="sum", sparse=True, _weight=table.clone())
        self.opt = torch.optim.Adagrad(self.bag.parameters(), lr=LR, eps=EPS)

    def forward(self, ids, offsets):
        return F.embedding_bag(ids, self.bag.weight.detach(), offsets, mode="sum")

    def step(self, ids, offsets, grad_out):
        self.opt.zero_grad(set_to_none=True)
        self.bag(ids, offsets).backward(grad_out)
        with warnings.catch_warnings():  # Adagrad's sparse update warns that it skips the invariant checks:
            # torch's baseline working as intended, nothing for the reader to act on
            warnings.filterwarnings("ignore", message="Sparse invariant checks are implicitly disabled")
            self.opt.step()

    def weight(self) -> torch.Tensor:
        return self.bag.weight.detach()


class TritonPath:
    """The same step as users train a whole table with the project's kernels: a
    `WholeTableBag(kernels="triton")` (pooled lookup; sort and fused update in its backward)."""

    def __init__(self, table: torch.Tensor):
        from embcache.nn.whole_table import WholeTableBag

        self.bag = WholeTableBag(table, "adagrad", lr=LR, eps=EPS, kernels="triton")

    def forward(self, ids, offsets):
        with torch.no_grad():
            return self.bag(ids, offsets)

    def forward_tiled(self, ids, offsets, bags_per_program: int):
        """The same forward, the pooled kernel's bags taken `bags_per_program` a program."""
        from embcache.kernels.pooled import pooled_lookup

        return pooled_lookup(self.bag.table, ids, offsets, None, "sum", bags_per_program=bags_per_program)

    def step(self, ids, offsets, grad_out):
        self.bag(ids, offsets).backward(grad_out)

    def weight(self) -> torch.Tensor:
        return self.bag.weight


def masked_write_ms(n: int, args, device, share: float = 0.05) -> dict:
    """A list of `n` writes into a slot array, `share` of them masked in, as the device
    bookkeeper's lists are: torch's `index_copy_` (masked entries to one trash entry) against
    `scatter_masked` (masked entries skipped), milliseconds each."""
    from embcache.cache.bookkeeping.fixed_size import pick, write_where

    g = torch.Generator().manual_seed(args.seed)
    size = 2 * n
    dst = torch.zeros(size + 1, dtype=torch.long, device=device)
    index = torch.randperm(size, generator=g)[:n].to(device)
    mask = (torch.rand(n, generator=g) < share).to(device)
    target, values = pick(mask, index, size), torch.arange(n, device=device)
    return {k: 1e3 * timed(lambda: write_where(dst, target, values, mask, k), args.steps, args.warmup_steps, device)
            for k in ("torch", "triton")}


def lookup_ms(ids: torch.Tensor, num_rows: int, args, device, ratio: float = 0.015) -> dict:
    """The device bookkeeper's lookup of a batch's ids (`DeviceRowCache._look_up`) against a
    cache of `ratio` of the rows, every other one resident: its torch path against
    `kernels.batch_lookup` (a sort and two launches), milliseconds each."""
    from types import SimpleNamespace

    from embcache.cache.bookkeeping.device_cache import DeviceRowCache
    from embcache.kernels.batch_lookup import look_up

    slots = max(1, int(ratio * num_rows))
    id_to_slot = torch.full((num_rows + 1,), -1, dtype=torch.long, device=device)
    resident = torch.randperm(num_rows, generator=torch.Generator().manual_seed(args.seed))[:slots].to(device)
    id_to_slot[resident] = torch.arange(resident.numel(), device=device)
    torch_path = SimpleNamespace(kernels="torch", _pad={"id_to_slot": id_to_slot}, num_slots=slots,
                                 num_rows=num_rows, device=torch.device(device))
    flat = ids.reshape(-1)
    return {"torch": 1e3 * timed(lambda: DeviceRowCache._look_up(torch_path, flat), args.steps, args.warmup_steps,
                                 device),
            "triton": 1e3 * timed(lambda: look_up(flat, id_to_slot, slots, num_rows), args.steps, args.warmup_steps,
                                  device)}


def batch_inputs(trace: CriteoTrace, shape: str, device) -> tuple[torch.Tensor, torch.Tensor]:
    if shape == "one-hot":
        ids = trace.batch(0).reshape(-1)
        offsets = torch.arange(ids.numel(), dtype=torch.int64)
    else:
        ids, offsets = trace.pooled_batch(0, SHAPES[shape])
    return ids.to(device), offsets.to(device)


def measure(shape: str, batch_size: int, paths: dict, args, device, copy: float) -> dict:
    """One shape and batch: both paths' forward and step times, bytes, shares, and how far
    apart one more step leaves their tables (both have taken the same steps before)."""
    trace = CriteoTrace(scale=args.scale, batch_size=batch_size, batches=1, seed=args.seed)
    ids, offsets = batch_inputs(trace, shape, device)
    lookups, bags, dim = ids.numel(), offsets.numel(), args.dim
    distinct = int(ids.unique().numel())
    grad_out = torch.randn(bags, dim, generator=torch.Generator().manual_seed(args.seed)).to(device)
    for path in paths.values():  # one step each: how far apart they land
        path.step(ids, offsets, grad_out)
    diff = (paths["torch"].weight() - paths["triton"].weight()).abs().max().item()
    row = {"shape": shape, "batch_size": batch_size, "dim": dim, "lookups": lookups, "distinct_rows": distinct,
           "max_table_diff_after_one_step": diff}
    fwd_bytes = lookups * dim * 4 + bags * dim * 4 + lookups * 8 + bags * 8
    bwd_bytes = lookups * dim * 4 + distinct * dim * 4 * 4 + lookups * 8 * 4
    for name, path in paths.items():
        fwd = timed(lambda: path.forward(ids, offsets), args.steps, args.warmup_steps, device)
        step = timed(lambda: path.step(ids, offsets, grad_out), args.steps, args.warmup_steps, device)
        bwd = max(step - fwd, 1e-12)
        row[name] = {"forward_ms": 1e3 * fwd, "step_ms": 1e3 * step, "backward_ms": 1e3 * bwd,
                     "forward_gbps": fwd_bytes / fwd / 1e9, "backward_gbps": bwd_bytes / bwd / 1e9,
                     "samples_per_s": batch_size / step}
        row[name]["forward_share_of_copy"] = row[name]["forward_gbps"] / copy
        row[name]["backward_share_of_copy"] = row[name]["backward_gbps"] / copy
    row["masked_write_ms"] = masked_write_ms(lookups, args, device)
    row["lookup_ms"] = lookup_ms(ids, trace.num_rows, args, device)
    tiles = {}  # the pooled kernel's tile of bags, side by side (same bits, other loads in flight)
    for bags_per_program in TILES:
        fwd = timed(lambda: paths["triton"].forward_tiled(ids, offsets, bags_per_program), args.steps,
                    args.warmup_steps, device)
        tiles[str(bags_per_program)] = fwd_bytes / fwd / 1e9 / copy
    row["triton"]["forward_share_by_bags_per_program"] = tiles
    row["forward_speedup"] = row["torch"]["forward_ms"] / row["triton"]["forward_ms"]
    row["backward_speedup"] = row["torch"]["backward_ms"] / row["triton"]["backward_ms"]
    row["step_speedup"] = row["torch"]["step_ms"] / row["triton"]["step_ms"]
    return row


def run_all(args) -> int:
    device = device_argument(args.device)
    torch.manual_seed(args.seed)
    copy = copy_gbps(args.copy_mib, device, args.steps)
    trace = CriteoTrace(scale=args.scale, batch_size=1, batches=1, seed=args.seed)
    bound = trace.num_rows ** -0.5
    table = torch.rand(trace.num_rows, args.dim, device=device).mul_(2 * bound).sub_(bound)
    paths = {"torch": TorchPath(table), "triton": TritonPath(table)}  # each a copy of the start, with its state
    del table  # four tables the size of the whole stay: 69 GB at Kaggle's rows and dim 128 (an H100 has 80)
    rows = []
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (Triton's interpreter)"
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"  # kernels_cli sets it where no GPU is

    def save():  # after every row: a run cut short by its time limit keeps what it measured
        return write_json({"benchmark": "kernels", "device": str(device), "device_name": name, "copy_gbps": copy,
                           "triton_interpreted": interpreted,  # its times and speed-ups then are no speed
                           "config": {k: v for k, v in vars(args).items() if k != "func"}, "rows": rows},
                          args.name, args.out)

    for shape in args.shapes:
        for batch_size in args.batch_sizes:
            print(f"bench kernels: measuring {shape} batch {batch_size:,} ...", flush=True)
            row = measure(shape, batch_size, paths, args, device, copy)
            rows.append(row)
            path = save()
            print(row_line(row, interpreted), flush=True)
    print(f"bench kernels: wrote {path}")
    return 0


def row_line(row: dict, interpreted: bool) -> str:
    """A row as one line. Under Triton's interpreter the times measure the interpreter, not
    the kernels: the line gives the agreement alone (the times stay in the JSON, marked)."""
    head = f"bench kernels: {row['shape']} batch {row['batch_size']:,}: "
    agree = f"tables agree to {row['max_table_diff_after_one_step']:.1e}"
    if interpreted:
        return head + agree + " (Triton's interpreter: no speed measured; the JSON's times are the interpreter's)"
    t, k = row["torch"], row["triton"]
    return (head + f"forward {k['forward_share_of_copy']:.0%} of the copy (torch {t['forward_share_of_copy']:.0%}, "
            f"x{row['forward_speedup']:.1f}), backward + adagrad {k['backward_share_of_copy']:.0%} "
            f"(torch {t['backward_share_of_copy']:.0%}, x{row['backward_speedup']:.1f}), {agree}; "
            "forward by bags a program: " + ", ".join(
                f"{b} {v:.0%}" for b, v in k["forward_share_by_bags_per_program"].items())
            + "; a mostly masked list of writes: index_copy_ {torch:.2f} ms, scatter_masked {triton:.2f} ms".format(
                **row["masked_write_ms"])
            + "; the cache's lookup: torch {torch:.2f} ms, Triton {triton:.2f} ms".format(**row["lookup_ms"]))
