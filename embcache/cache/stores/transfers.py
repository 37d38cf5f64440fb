"""Rows between the host store and the device, without making the host wait.

The cache's bookkeeping (which id sits in which slot, what to evict) runs on the host,
where the ids come from, so the only device work a batch needs is moving rows: misses in,
dirty victims out. Both directions are asynchronous on CUDA:

- In: rows are gathered into page-locked (pinned) buffers and copied with
  `non_blocking=True` on the current stream (the cache's side stream for a prefetch).
  torch's pinned allocator keeps a buffer from reuse until the copy that reads it has
  run, so nothing here waits.
- Out: a victim's row is copied into a pinned buffer on the stream, and an event marks
  the copy's end; the write into the host store happens later, when the event has fired.
  Only a gather of an id whose write is still pending waits for it (the one time the
  host must wait for the device: the row it needs is on its way back). Checkpoints and
  every other reader of the host store settle all pending writes first.

On the CPU there is nothing to overlap and writes land at once. `defer_on_cpu` holds them
back there too (until a conflicting gather or a settle), so the tests exercise the
pending-write logic without a GPU.

Index tensors (slots, lookups) go to the device the same way: copied into pinned memory
by the host, then sent without waiting.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
import torch

from embcache.device import to_device_async

from embcache.cache.stores.host_store import HostStore

MAX_PENDING_WRITES = 16  # beyond this the oldest write is waited for (bounds the pinned memory held)


@dataclass
class _Write:
    ids: torch.Tensor  # host ids, in the order of the rows
    weight: torch.Tensor  # host (pinned) copies, complete once `done` has fired
    state: dict
    done: torch.cuda.Event | None  # None on the CPU: complete, only held back


class RowTransfers:
    """Gathers and write-backs of rows between `host` and `device`, the write-backs
    deferred (see the module docstring)."""

    def __init__(self, host: HostStore, device: torch.device, num_rows: int, defer_on_cpu: bool = False):
        """`defer_on_cpu`: hold CPU write-backs as if they were in flight, as on CUDA (the
        tests of the deferred path run on the CPU with it)."""
        self.host, self.device = host, torch.device(device)
        self.defer_on_cpu = defer_on_cpu
        self.cuda = self.device.type == "cuda"
        self.num_rows = int(num_rows)
        self._pending: deque[_Write] = deque()
        # per id, how many pending writes carry its row (an id may be evicted, missed and
        # evicted again while an earlier write is still in flight); made on the first
        # deferred write, so a CPU cache never pays 4 bytes a row for it
        self._in_flight: np.ndarray | None = None
        self.waits = 0  # gathers that had to wait for a pending write (the host waited)

    def grow(self, num_rows: int) -> None:
        """The host store has grown to `num_rows` rows (an open table)."""
        if self._in_flight is not None and num_rows > self.num_rows:
            self._in_flight = np.concatenate([self._in_flight, np.zeros(num_rows - self.num_rows, np.int32)])
        self.num_rows = max(self.num_rows, int(num_rows))

    # ------------------------------------------------------------------ host -> device
    def to_device(self, t: torch.Tensor) -> torch.Tensor:
        """`t` (host) on the device without waiting: through pinned memory on CUDA."""
        return to_device_async(t, self.device)

    def gather(self, ids: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Rows `ids` (host ids) and their optimizer state, on the device. A row whose
        write-back is still pending is waited for first (it is newer than the store's)."""
        self.settle(ids)
        weight, state = self.host.gather(ids)  # pinned already with CUDA: sent without a second copy
        return self.to_device(weight), {k: self.to_device(v) for k, v in state.items()}

    # ------------------------------------------------------------------ device -> host
    def write(self, ids: torch.Tensor, weight: torch.Tensor, state: dict[str, torch.Tensor]) -> None:
        """Write rows (device tensors) to the host store at `ids` (host ids): at once on
        the CPU, else once their copy off the device has finished."""
        if not self.cuda and not self.defer_on_cpu:
            self.host.scatter(ids, weight, state)
            return
        if len(self._pending) >= MAX_PENDING_WRITES:
            self._complete(self._pending.popleft(), wait=True)
        done = None
        if self.cuda:
            weight, state = _stage(weight), {k: _stage(v) for k, v in state.items()}
            done = torch.cuda.Event()
            done.record()
        else:
            weight, state = weight.clone(), {k: v.clone() for k, v in state.items()}
        ids = ids.cpu()
        if self._in_flight is None:
            self._in_flight = np.zeros(self.num_rows, dtype=np.int32)
        np.add.at(self._in_flight, ids.numpy(), 1)
        self._pending.append(_Write(ids, weight, state, done))

    def settle(self, ids: torch.Tensor | None = None) -> None:
        """Complete the pending writes whose copies have finished; with `ids`, also every
        write up to the last one carrying any of them (waiting if it is still in flight);
        with None, all of them. Writes complete in the order they were made."""
        if not self._pending:
            return
        last = len(self._pending) if ids is None else self._last_carrying(ids)
        if last and ids is not None:
            self.waits += 1
        for _ in range(last):
            self._complete(self._pending.popleft(), wait=True)
        while self._pending and self._pending[0].done is not None and self._pending[0].done.query():
            self._complete(self._pending.popleft(), wait=False)

    def pending(self) -> int:
        return len(self._pending)

    def _last_carrying(self, ids: torch.Tensor) -> int:
        """How many pending writes, from the oldest, must complete before `ids` are read."""
        ids_np = ids.cpu().numpy()
        if ids_np.size == 0 or not self._in_flight[ids_np].any():
            return 0
        wanted = np.unique(ids_np[self._in_flight[ids_np] > 0])
        last = 0
        for i, w in enumerate(self._pending):
            if np.isin(w.ids.numpy(), wanted, assume_unique=False).any():
                last = i + 1
        return last

    def _complete(self, w: _Write, wait: bool) -> None:
        if wait and w.done is not None:
            w.done.synchronize()
        self.host.scatter(w.ids, w.weight, w.state)
        np.subtract.at(self._in_flight, w.ids.numpy(), 1)


def _stage(t: torch.Tensor) -> torch.Tensor:
    """An asynchronous copy of device tensor `t` into pinned host memory."""
    out = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    return out.copy_(t, non_blocking=True)


def wait_for_side_stream(side: torch.cuda.Stream, device: torch.device) -> None:
    """Order the current stream after `side`'s work so far. Inside a CUDA graph's capture
    the side stream first joins the capture (waits on the capturing stream): a captured
    stream may not wait on work captured nowhere (CUDA's "dependency created on uncaptured
    work in another stream"), and a fork then join is what a graph records for it."""
    current = torch.cuda.current_stream(device)
    if torch.cuda.is_current_stream_capturing():
        side.wait_stream(current)
    current.wait_stream(side)
