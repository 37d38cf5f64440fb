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
    try:
        local_ranks = max(int(env.get("LOCAL_WORLD_SIZE", "1")), 1)
    except ValueError:
        local_ranks = 1
    return max(usable_cores() // local_ranks, 1)


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
