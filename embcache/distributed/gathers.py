"""Gathers of tensor rows over the ranks, in rank order (the one-process order of a global
batch or of a table split by `slice_bounds`): the face trainer's global batch and its pool
updates (with the ranks' batch counts in the same all-gather), and the class-sharded heads'
batches and checkpoints. The world's small collectives (sums, objects, barriers) are in
`world`."""
from __future__ import annotations

import warnings

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_fn

from embcache.partition import slice_bounds

from .world import World, collective_device

# torch 2.x marks these autograd-aware collectives deprecated in favour of a private module;
# they are the public way to all-gather with a gradient, so keep them quiet
warnings.filterwarnings("ignore", message=r"torch\.distributed\.nn\.functional", category=FutureWarning)


def gather_counts(values: list[int], world: World) -> torch.Tensor:
    """[size, len(values)] ints: every rank's `values`, in rank order (one small all-gather)."""
    t = torch.tensor(values, dtype=torch.long, device=collective_device())
    out = [torch.empty_like(t) for _ in range(world.size)]
    dist.all_gather(out, t)
    return torch.stack(out).cpu()


def gather_rows(t: torch.Tensor, counts: list[int], grad: bool = False) -> torch.Tensor:
    """Every rank's rows of `t` (rank r holds `counts[r]`), concatenated in rank order.

    With `grad`, the result stays in the autograd graph and each rank's rows get back the
    gradient summed over the ranks (`torch.distributed.nn.functional.all_gather`)."""
    width = max(counts)
    dev = t.device
    padded = t.to(collective_device())
    if t.shape[0] < width:
        padded = torch.cat([padded, padded.new_zeros((width - t.shape[0],) + tuple(t.shape[1:]))])
    if grad:
        parts = dist_fn.all_gather(padded)
    else:
        parts = [torch.empty_like(padded) for _ in counts]
        dist.all_gather(parts, padded.contiguous())
    return torch.cat([p[:n] for p, n in zip(parts, counts)]).to(dev)


def gather_rows_and_counts(t: torch.Tensor, counts: list[int], width: int, async_op: bool = False):
    """`gather_rows` of a float64 `t` of at most `width` rows a rank, and every rank's
    `counts` ([size, len(counts)] int64, in rank order), in one all-gather: a rank that
    needs its peers' counts to read their rows does not pay a collective for them first.
    With `async_op`, a function that waits for the all-gather and returns them, so that the
    caller can compute meanwhile.

    The counts travel as a header row (float64 holds integers below 2**53 exactly), so `t`
    needs at least 1 + len(counts) columns."""
    n, k = t.shape[0], len(counts)
    if t.dtype != torch.float64 or n > width or t.shape[1] < k + 1:
        raise ValueError(f"gather_rows_and_counts: {n} float64 rows of {t.shape[1]} columns for a width of {width} "
                         f"and {k} counts (got {t.dtype})")
    payload = t.new_zeros((width + 1, t.shape[1]))
    payload[0, :k + 1] = torch.tensor([n, *counts], dtype=torch.float64)
    payload[1:n + 1] = t
    payload = payload.to(collective_device())
    parts = [torch.empty_like(payload) for _ in range(dist.get_world_size())]
    work = dist.all_gather(parts, payload, async_op=True)

    def result() -> tuple[torch.Tensor, torch.Tensor]:
        work.wait()
        heads = torch.stack([p[0, :k + 1] for p in parts]).long().cpu()
        rows = torch.cat([p[1:int(h[0]) + 1] for p, h in zip(parts, heads)]).to(t.device)
        return rows, heads[:, 1:]

    return result if async_op else result()


def gather_shards_to_main(shard: torch.Tensor, total_rows: int, world: World) -> torch.Tensor | None:
    """The whole table from every rank's row range (`slice_bounds` order), on rank 0; None
    elsewhere. Collective."""
    bounds = [slice_bounds(total_rows, world.size, r) for r in range(world.size)]
    width = max(hi - lo for lo, hi in bounds)
    padded = shard.detach().to(collective_device())
    if padded.shape[0] < width:
        padded = torch.cat([padded, padded.new_zeros((width - padded.shape[0],) + tuple(padded.shape[1:]))])
    parts = [torch.empty_like(padded) for _ in bounds] if world.is_main else None
    dist.gather(padded.contiguous(), parts, dst=0)
    if not world.is_main:
        return None
    return torch.cat([p[:hi - lo] for p, (lo, hi) in zip(parts, bounds)]).to(shard.device)
