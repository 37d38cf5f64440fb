"""Which process this is among how many, and how a multi-process run starts and fails.

A run launched by `torchrun` finds RANK / WORLD_SIZE / LOCAL_RANK (and the rendezvous) in
its environment; `launch()` joins the process group there (gloo on the CPU, NCCL on CUDA)
with a bounded timeout. Without torchrun (or with one process) nothing is initialised and
every helper here is a no-op, so the single-process code path is the world-size-1 case of
the distributed one, not a second implementation.

Failures are the part users meet first, so they get the most care:

- a rank whose input is bad publishes its one-line error in the rendezvous store before it
  exits; every other rank, whose next collective then fails, prints that rank's line
  instead of a gloo/NCCL trace;
- a rank that dies or hangs makes the others' collectives fail within `timeout_s`, and they
  print one line saying so (the last checkpoint is untouched: it is replaced atomically);
- torchrun stops the survivors with SIGTERM when one worker fails; that too ends in one line.
"""
from __future__ import annotations

import contextlib
import datetime
import gc
import os
import signal
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist

from embcache.distributed.settings import DEFAULT_TIMEOUT_S
from embcache.errors import UserFacingError, first_line
from embcache.partition import slice_bounds  # World.slice; importers found it here before

ERROR_KEY = "embcache/error"  # the rendezvous-store key where a failing rank leaves its line


class PeerFailure(UserFacingError, RuntimeError):
    """Another rank failed, died or hung: this rank cannot go on. The process group is
    left as it is (tearing it down can wait forever on the dead peer), and the command
    ends the process right after printing the line (`exit_now`)."""

    exit_now = True


@dataclass(frozen=True)
class World:
    """This process's place in the run: rank `rank` of `size` (local rank on its node)."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        """Rank 0 alone writes metrics, progress, summaries and checkpoint manifests."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1

    def device(self, device: torch.device) -> torch.device:
        """`device` for this rank: on CUDA each local rank gets its own GPU."""
        if device.type == "cuda" and self.distributed and device.index is None:
            return torch.device("cuda", self.local_rank % max(torch.cuda.device_count(), 1))
        return device

    def slice(self, n: int) -> tuple[int, int]:
        """This rank's `[start, stop)` of `n` items split in rank order, the first `n %
        size` ranks one longer (how a global batch is divided)."""
        return slice_bounds(n, self.size, self.rank)


def current() -> World:
    """The world this process belongs to (size 1 when no process group is initialised)."""
    if dist.is_available() and dist.is_initialized():
        return World(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", 0)))
    return World()


def launched() -> bool:
    """Started by torchrun (or an equivalent launcher) with more than one process."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


@contextlib.contextmanager
def launch(device: torch.device | None = None, timeout_s: float = DEFAULT_TIMEOUT_S):
    """Join the process group for the duration of a command (nothing when not launched).

    Yields the `World`. A UserFacingError raised inside is published to the other ranks
    before it propagates; a collective that fails because another rank failed, died or hung
    becomes a `PeerFailure` naming what happened.
    """
    if not launched():
        yield World()
        return
    backend = "nccl" if device is not None and device.type == "cuda" else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
    global _TIMEOUT
    _TIMEOUT = datetime.timedelta(seconds=timeout_s)
    dist.init_process_group(backend, timeout=_TIMEOUT)
    world = current()
    previous = signal.signal(signal.SIGTERM, _stopped_by_launcher)
    healthy = False
    try:
        yield world
        healthy = True
    except PeerFailure:
        raise
    except UserFacingError as err:
        _failing()
        err.args = (f"rank {world.rank}: {err}",)  # every rank's line says whose it is
        _publish(str(err))
        healthy = True  # the peers are alive: the group can be torn down
        raise err.with_traceback(None) from None  # no frame keeps a trainer (and its DDP) alive
    except (RuntimeError, dist.DistBackendError) as err:
        _failing()
        if not _is_collective_failure(err):
            raise
        raise PeerFailure(_peer_failure_line(world, err, timeout_s)) from None
    except _Terminated:
        _failing()
        raise PeerFailure(f"rank {world.rank}: stopped by the launcher because another rank failed"
                          f"{_peer_detail()}; the last checkpoint is intact") from None
    finally:
        if healthy:
            # a DDP reducer that outlives the process group can deadlock gloo's exit: free it first
            gc.collect()
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
        if not _is_failing():
            signal.signal(signal.SIGTERM, previous)
        # else SIGTERM stays ignored: this rank's error is on its way to the caller's one line, and the
        # launcher's SIGTERM (its default action) would end the process between here and that line. A
        # failing rank exits; the launcher follows its SIGTERM with SIGKILL after a grace period anyway.


_TIMEOUT = datetime.timedelta(seconds=DEFAULT_TIMEOUT_S)


def new_group():
    """A process group of all ranks with the run's timeout (`dist.new_group` would take
    torch's default, 30 minutes, and a hung peer would hold the run that long)."""
    return dist.new_group(backend=dist.get_backend(), timeout=_TIMEOUT)


class _Terminated(BaseException):
    """SIGTERM from the launcher (a BaseException, so no `except Exception` swallows it)."""


def _stopped_by_launcher(signum, frame):
    if sys.exc_info()[0] is not None:  # a failure is on its way out already: it ends in its own line
        _failing()
        return
    raise _Terminated()


def _failing() -> None:
    """This rank is already stopping with a line of its own: the launcher's SIGTERM (sent
    once a peer has exited, perhaps for the same bad input) is ignored from here to the
    end of `launch`, so that it cannot replace that line by a traceback (a `_Terminated`
    raised inside an `except` branch here, as during the store call that publishes the
    line, would escape every branch). The handler does the same where the signal lands
    while any exception is being handled (an `except` or a `finally` on its way out)."""
    signal.signal(signal.SIGTERM, _ignored)


def _ignored(signum, frame) -> None:
    """SIGTERM's handler once this rank is failing (a function of its own, so `_is_failing` knows it)."""


def _is_failing() -> bool:
    return signal.getsignal(signal.SIGTERM) is _ignored


def _is_collective_failure(err: BaseException) -> bool:
    if isinstance(err, dist.DistBackendError):
        return True
    text = str(err).lower()
    return any(s in text for s in ("gloo", "nccl", "connection closed", "connection reset",
                                   "timed out", "timeout", "broken pipe", "socket"))


def _store():
    try:
        return dist.distributed_c10d._get_default_store()
    except Exception:  # no group, or the store's host is gone
        return None


def _publish(line: str) -> None:
    """Leave this rank's error where the others look when their collective fails."""
    store = _store()
    if store is not None:
        with contextlib.suppress(Exception):
            store.set(ERROR_KEY, line)


def _peer_detail() -> str:
    store = _store()
    if store is None:
        return ""
    try:
        if store.check([ERROR_KEY]):
            return f" ({store.get(ERROR_KEY).decode()})"
    except Exception:
        pass
    return ""


def _peer_failure_line(world: World, err: BaseException, timeout_s: float) -> str:
    detail = _peer_detail()
    if detail:
        return f"rank {world.rank}: stopped because another rank failed{detail}"
    hung = "timed out" in str(err).lower() or "timeout" in str(err).lower()
    what = (f"no answer from another rank within --dist-timeout {timeout_s:g} s (it hung or died)" if hung
            else "another rank died (its connection closed)")
    return f"rank {world.rank}: {what} ({_backend_reason(err)}); the last checkpoint is intact, resume with --resume"


def _backend_reason(err: BaseException) -> str:
    """The gist of a gloo/NCCL message, without its source location and advice.

    Example:
        >>> _backend_reason(RuntimeError("[/x/gloo/pair.cc:553] Connection closed by peer [127.0.0.1]:3249. This is"))
        'Connection closed by peer [127.0.0.1]:3249'
    """
    text = first_line(err)
    while text.startswith("["):
        text = text.partition("] ")[2] or text[1:]
    return text.split(". ")[0].rstrip(".")[:120]


# ---------------------------------------------------------------------- small collectives
def barrier() -> None:
    if current().distributed:
        dist.barrier()


def all_sum(values: dict[str, float | int]) -> dict[str, float | int]:
    """Sum each value over the ranks (float64; ints stay ints). Identity on one process."""
    if not current().distributed or not values:
        return dict(values)
    keys = sorted(values)
    t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=collective_device())
    dist.all_reduce(t)
    return {k: (int(round(v)) if isinstance(values[k], int) else v) for k, v in zip(keys, t.tolist())}


def collective_device() -> torch.device:
    """Where tensors for a collective must live: the GPU under NCCL, else the CPU."""
    if current().distributed and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def broadcast_object(obj, src: int = 0):
    """`obj` from rank `src` on every rank (unchanged on one process)."""
    if not current().distributed:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def gather_objects(obj) -> list:
    """Every rank's `obj`, in rank order, on every rank."""
    if not current().distributed:
        return [obj]
    out = [None] * current().size
    dist.all_gather_object(out, obj)
    return out
