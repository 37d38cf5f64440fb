"""How many CPU threads a run's torch and numba work use (`--threads`).

Both libraries start as many threads as the machine has cores, whatever this process may
use: under a CPU affinity mask (taskset, a container's cpuset, a scheduler's allocation)
or beside other torchrun ranks on the same node that is more threads than cores, and
threads that wait for cores they do not get slow a step many times over (measured on 2
shared cores: DLRM from ~50 k to ~2.8 k samples/s). The default here is the cores this
process may use (`os.sched_getaffinity`) shared out among torchrun's local ranks
(`LOCAL_WORLD_SIZE`; outside torchrun, an `OMP_NUM_THREADS` of the user's). torch's and numba's pools take turns within a step (the cache's
host bookkeeping runs between torch's operations), so both get that many; the passive
OpenMP wait policy set in `embcache/__init__.py` keeps an idle pool from spinning on the
other's cores.

Light: torch and numba are imported only by `set_threads`.
"""
from __future__ import annotations

import os


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask; the machine's count where the
    platform has no masks)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def default_threads() -> int:
    """`usable_cores()` divided among the processes torchrun started on this node
    (`LOCAL_WORLD_SIZE`), at least 1. Without torchrun an `OMP_NUM_THREADS` the user set
    is taken as it is (under torchrun it is the launcher's 1, whatever the cores).

    Example:
        >>> default_threads() >= 1
        True
    """
    env = os.environ
    if "LOCAL_WORLD_SIZE" not in env and env.get("OMP_NUM_THREADS", "").strip().isdigit():
        return max(int(env["OMP_NUM_THREADS"]), 1)
    return max(usable_cores() // _local_ranks(), 1)


def _local_ranks() -> int:
    """The processes torchrun started on this node (`LOCAL_WORLD_SIZE`; 1 without it)."""
    try:
        return max(int(os.environ.get("LOCAL_WORLD_SIZE", "1")), 1)
    except ValueError:
        return 1


def local_share(cores: list[int], local_rank: int, local_ranks: int) -> list[int]:
    """Local rank `local_rank`'s share of `cores`: the sorted cores cut into `local_ranks`
    contiguous slices, as even as can be (all of them where there are fewer cores than ranks).

    Example:
        >>> [local_share(list(range(16)), r, 2) for r in (0, 1)]
        [[0, 1, 2, 3, 4, 5, 6, 7], [8, 9, 10, 11, 12, 13, 14, 15]]
    """
    from embcache.partition import slice_bounds

    cores = sorted(cores)
    if local_ranks <= 1 or len(cores) < local_ranks:
        return cores
    start, stop = slice_bounds(len(cores), local_ranks, local_rank)
    return cores[start:stop]


def pin_local_rank() -> list[int] | None:
    """Under torchrun with several processes on this node: keep this one (and every thread
    it starts from now on: torch's, numba's, gloo's) on its own share of the cores
    (`local_share`). Without it the OS moves threads between the ranks' cores, and a rank's
    communication threads run on the core another rank computes on: measured on 2 shared
    cores, 2 DLRM ranks trained 15-21 % faster pinned, at 0.9x the CPU a sample. Returns the
    cores, or None where nothing was pinned (one process on the node, no affinity masks, or
    fewer cores than ranks)."""
    try:
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        cores = sorted(os.sched_getaffinity(0))
    except (ValueError, AttributeError, OSError):
        return None
    mine = local_share(cores, local_rank, _local_ranks())
    if mine == cores:  # the node's only process, or fewer cores than processes
        return None
    os.sched_setaffinity(0, mine)
    return mine


def set_threads(threads: int | None = None) -> int:
    """Use `threads` (None: `default_threads()`) for torch's intra-op pool and numba's
    parallel kernels in this thread; returns the number set (numba's is capped at the pool
    it started with, `NUMBA_NUM_THREADS`)."""
    import torch

    n = default_threads() if threads is None else int(threads)
    if n < 1:
        raise ValueError(f"threads must be >= 1, got {n}")
    torch.set_num_threads(n)
    try:
        import numba
    except ImportError:  # the cache's kernels need numba; a torch-only tool may run without it
        return n
    numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
    return n
