"""The engine of the embedding cache: keeps a device-resident working set of rows
consistent with the host store, one batch at a time.

Per batch, all as batched tensor work (no Python loop over ids):
look up every id's slot -> the absent ids (unique) -> free slots, then victims chosen by
the eviction policy among slots this batch (and any batch still in flight) does not
need -> dirty victims written back -> absent rows (with optimizer state) copied in ->
lookups remapped to slots. Rows that do not fit (a batch needing more unique rows than
the cache holds) are served from a temporary side table and written back after their
update: counted in `overflow_rows`, never an error.

Gradients arrive as sparse COO tensors over the working table and are applied by a
row-wise optimizer whose state lives beside the rows, so the result equals training the
whole table directly.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import torch

from .eviction import POLICIES, EvictionPolicy
from .host_store import HostStore
from .optimizers import RowOptimizer
from .slot_map import SlotMap
from .stats import CacheStats

MAX_PENDING_PREFETCHES = 8


@dataclass
class Overflow:
    """Rows of one batch that did not fit in the cache, kept beside it for one step."""

    ids: torch.Tensor  # sorted unique ids
    weight: torch.Tensor
    state: dict


@dataclass
class Lookup:
    """Where one batch's lookups point: `indices` index `cache.weight` (then the
    overflow rows, from `num_slots` on); `pinned` slots stay resident until released."""

    indices: torch.Tensor
    overflow: Overflow | None
    pinned: torch.Tensor | None


@dataclass
class _Prefetched:
    ids: torch.Tensor
    pinned: torch.Tensor


class RowCache:
    """A device working set of `cache_rows` rows over a host table of N rows.

    Args:
        weight: initial `[N, D]` float table on CPU, id order (kept by the host store).
        cache_rows: capacity C of the device cache.
        optimizer: the row-wise optimizer (its state tables travel with the rows).
        eviction: "freq" | "lfu" | "lru".
        ids_freq: per-id counts from the training data (warm-up and `freq`).
        warmup_ratio: fraction of the cache filled with the hottest ids up front.
        device: where the cache lives.
    """

    def __init__(self, weight: torch.Tensor, cache_rows: int, optimizer: RowOptimizer,
                 eviction: str = "freq", ids_freq: torch.Tensor | None = None,
                 warmup_ratio: float = 0.7, device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        num_rows, dim = weight.shape
        self.num_rows, self.dim, self.num_slots = num_rows, dim, int(cache_rows)
        on_cuda = self.device.type == "cuda"
        self.optimizer = optimizer
        self.host = HostStore(weight, optimizer.init_state(num_rows, dim), pin=on_cuda)
        self.weight = torch.zeros(self.num_slots, dim, dtype=weight.dtype, device=self.device)
        self.state = optimizer.init_state(self.num_slots, dim, device=self.device)
        self.slots = SlotMap(num_rows, self.num_slots, self.device)
        self.policy = EvictionPolicy(eviction, num_rows, self.num_slots, ids_freq, self.device)
        self.dirty = torch.zeros(self.num_slots, dtype=torch.bool, device=self.device)
        self.pins = torch.zeros(self.num_slots, dtype=torch.int32, device=self.device)
        self._position = torch.zeros(self.num_slots, dtype=torch.long, device=self.device)
        self.stats = CacheStats()
        self.step = 0  # optimizer steps taken (Adam's bias correction counts these)
        self._row_bytes = self.host.row_bytes()
        self._prefetched: deque[_Prefetched] = deque()
        self._stream = torch.cuda.Stream(self.device) if on_cuda else None
        if ids_freq is not None and warmup_ratio > 0:
            self.warm_up(ids_freq, warmup_ratio)

    # ------------------------------------------------------------------ admission
    def warm_up(self, ids_freq: torch.Tensor, warmup_ratio: float) -> int:
        """Load the hottest ids (by `ids_freq`) into empty slots, hottest first."""
        free = self.slots.free_slots()
        k = min(free.numel(), int(math.floor(warmup_ratio * self.num_slots)))
        if k <= 0:
            return 0
        counts, hot = torch.topk(ids_freq.to(torch.float64).cpu(), k)
        hot = hot[counts > 0].to(self.device)
        target = free[: hot.numel()]
        self._load(hot, target, count_bytes=False)
        self.slots.assign(hot, target)
        self.policy.on_admit(hot, target)
        return hot.numel()

    def prepare(self, ids: torch.Tensor, keep: bool) -> Lookup:
        """Make the rows of one batch available; `keep` pins them until `release`
        (needed when a backward will update them). Consumes a matching prefetch."""
        self._wait_for_prefetch()
        consumed = self._take_prefetched(ids)
        indices, touched, overflow = self._admit(ids, count=consumed is None, serve_overflow=True)
        pinned = None
        if keep:
            pinned = touched
            self._pin(pinned, +1)
        if consumed is not None:
            self._pin(consumed.pinned, -1)
        return Lookup(indices, overflow, pinned)

    def prefetch(self, ids: torch.Tensor) -> None:
        """Load the rows of a coming batch now (on a side stream with CUDA, so the copies
        overlap the current step); they stay pinned until that batch's `prepare`."""
        if len(self._prefetched) >= MAX_PENDING_PREFETCHES:
            self._pin(self._prefetched.popleft().pinned, -1)
        if self._stream is None:
            self._prefetch(ids)
            return
        self._stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self._stream):
            self._prefetch(ids)

    def _prefetch(self, ids: torch.Tensor) -> None:
        _, touched, _ = self._admit(ids, count=True, serve_overflow=False)
        self._pin(touched, +1)
        self._prefetched.append(_Prefetched(ids, touched))

    def _wait_for_prefetch(self) -> None:
        if self._stream is not None:
            torch.cuda.current_stream(self.device).wait_stream(self._stream)

    def _take_prefetched(self, ids: torch.Tensor) -> _Prefetched | None:
        """The prefetch made for exactly these ids, if any; older ones are dropped."""
        for i, entry in enumerate(self._prefetched):
            if entry.ids.shape == ids.shape and torch.equal(entry.ids, ids):
                for _ in range(i):
                    self._pin(self._prefetched.popleft().pinned, -1)
                return self._prefetched.popleft()
        return None

    def _pin(self, slots: torch.Tensor, delta: int) -> None:
        """Pin (delta=+1) or unpin (-1) distinct `slots`."""
        self.pins[slots] += delta

    def release(self, lookup: Lookup) -> None:
        if lookup.pinned is not None:
            self._pin(lookup.pinned, -1)
            lookup.pinned = None

    def _admit(self, ids: torch.Tensor, count: bool, serve_overflow: bool):
        """Returns (per-lookup indices, the distinct resident slots the batch touches,
        overflow rows or None). Per-access bookkeeping runs on the distinct slots (found
        by one bincount over the slots), not on every lookup."""
        clock = self.policy.tick()
        slots = self.slots.lookup(ids)
        # bin 0 collects absent ids (-1); bin s+1 counts slot s
        uses = torch.bincount(slots + 1, minlength=self.num_slots + 1)
        in_batch = uses[1:] > 0
        admitted = 0
        missing = ids.new_empty(0)
        overflow = None
        if int(uses[0]):
            absent = torch.nonzero(slots < 0).flatten()
            missing, where = torch.unique(ids[absent], return_inverse=True)
            free = self.slots.free_slots(missing.numel())
            victims = self.policy.select_victims(missing.numel() - free.numel(),
                                                 (self.pins > 0) | in_batch, self.slots.occupied())
            self._evict(victims)
            target = torch.cat([free, victims])
            fits = missing[: target.numel()]
            self._load(fits, target)
            self.slots.assign(fits, target)
            self.policy.on_admit(fits, target)
            in_batch[target] = True
            admitted = fits.numel()
            # the absent positions' new slots, through the unique inverse (no second
            # lookup in the per-id table); missing ids that did not fit stay -1, or point
            # past the cache into the overflow rows, which keep `missing`'s order
            new_slot = torch.full_like(missing, -1)
            new_slot[: target.numel()] = target
            if fits.numel() < missing.numel() and serve_overflow:
                overflow = self._serve_overflow(missing[fits.numel():])
                new_slot[fits.numel():] = self.num_slots + torch.arange(
                    missing.numel() - fits.numel(), device=missing.device)
            slots[absent] = new_slot[where]
        touched = torch.nonzero(in_batch).flatten()
        self.policy.on_access(self.slots.slot_to_id[touched], touched)
        if count:
            self.stats.hits += touched.numel() - admitted
            self.stats.misses += missing.numel()
            self.stats.batches += 1
        return slots, touched, overflow

    def _evict(self, victims: torch.Tensor) -> None:
        if victims.numel() == 0:
            return
        self.policy.on_evict(self.slots.slot_to_id[victims], victims)
        ids = self.slots.release(victims)
        dirty = self.dirty[victims]
        if bool(dirty.any()):
            out = victims[dirty]
            self.host.scatter(ids[dirty], self.weight[out], {k: v[out] for k, v in self.state.items()})
            self.stats.bytes_d2h += out.numel() * self._row_bytes
            self.dirty[victims] = False
        self.stats.evictions += victims.numel()

    def _load(self, ids: torch.Tensor, target: torch.Tensor, count_bytes: bool = True) -> None:
        if ids.numel() == 0:
            return
        weight, state = self.host.gather(ids)
        nb = self.device.type == "cuda"
        self.weight.index_copy_(0, target, weight.to(self.device, non_blocking=nb))
        for k, v in state.items():
            self.state[k].index_copy_(0, target, v.to(self.device, non_blocking=nb))
        self.dirty[target] = False
        if count_bytes:
            self.stats.bytes_h2d += ids.numel() * self._row_bytes

    def _serve_overflow(self, ids: torch.Tensor) -> Overflow:
        weight, state = self.host.gather(ids)
        self.stats.overflow_rows += ids.numel()
        self.stats.bytes_h2d += ids.numel() * self._row_bytes
        return Overflow(ids, weight.to(self.device), {k: v.to(self.device) for k, v in state.items()})

    # ------------------------------------------------------------------ updates
    def apply_gradient(self, grad: torch.Tensor, lookup: Lookup) -> None:
        """One optimizer step from a sparse gradient over the working table (the cache,
        then the batch's overflow rows), then release the batch's pins."""
        self.step += 1
        overflow = lookup.overflow
        grad = grad.to(self.weight.dtype)
        if overflow is None:
            if self.optimizer.needs_coalesced and lookup.pinned is not None:
                grad = self._coalesce(grad, lookup.pinned)
            self.optimizer.update(self.weight, self.state, grad, self.step)
            # the batch's pinned slots are exactly the cached rows it looked up
            self.dirty[lookup.pinned if lookup.pinned is not None else grad._indices()[0]] = True
        else:
            rows, values = grad._indices()[0], grad._values()
            inside = rows < self.num_slots
            in_cache = torch.sparse_coo_tensor(rows[inside].unsqueeze(0), values[inside],
                                               (self.num_slots, self.dim), check_invariants=False)
            outside = torch.sparse_coo_tensor((rows[~inside] - self.num_slots).unsqueeze(0),
                                              values[~inside], (overflow.ids.numel(), self.dim),
                                              check_invariants=False)
            self.optimizer.update(self.weight, self.state, in_cache, self.step)
            self.optimizer.update(overflow.weight, overflow.state, outside, self.step)
            self.dirty[lookup.pinned if lookup.pinned is not None else rows[inside]] = True
            self.host.scatter(overflow.ids, overflow.weight, overflow.state)
            self.stats.bytes_d2h += overflow.ids.numel() * self._row_bytes
        self.release(lookup)

    def _coalesce(self, grad: torch.Tensor, touched: torch.Tensor) -> torch.Tensor:
        """Sum the per-lookup gradient rows into the batch's distinct slots (`touched`,
        sorted), with one index_add instead of the sort inside `Tensor.coalesce()`."""
        rows, values = grad._indices()[0], grad._values()
        position = self._position
        position[touched] = torch.arange(touched.numel(), device=self.device)
        summed = values.new_zeros((touched.numel(), self.dim)).index_add_(0, position[rows], values)
        return torch.sparse_coo_tensor(touched.unsqueeze(0), summed, grad.size(), is_coalesced=True,
                                       check_invariants=False)

    # ------------------------------------------------------------------ host side
    def flush(self) -> None:
        """Write every dirty row (and its state) back to the host store."""
        self._wait_for_prefetch()
        out = torch.nonzero(self.dirty).flatten()
        if out.numel():
            ids = self.slots.slot_to_id[out]
            self.host.scatter(ids, self.weight[out], {k: v[out] for k, v in self.state.items()})
            self.stats.bytes_d2h += out.numel() * self._row_bytes
            self.dirty[out] = False

    def drop_prefetches(self) -> None:
        while self._prefetched:
            self._pin(self._prefetched.popleft().pinned, -1)

    def state_dict(self) -> dict:
        """The full table in id order with its optimizer state, after a flush, plus what
        makes a resumed run continue exactly (step count, residency, policy, stats)."""
        self.flush()
        return {
            "weight": self.host.weight,
            **{f"optimizer.{k}": v for k, v in self.host.state.items()},
            "step": torch.tensor(self.step),
            "slot_to_id": self.slots.slot_to_id.cpu().clone(),
            "stats": self.stats.to_tensor(),
            **{f"policy.{k}": (torch.tensor(POLICIES.index(v)) if k == "kind" else
                               v if torch.is_tensor(v) else torch.tensor(v))
               for k, v in self.policy.state_dict().items()},
        }

    def load_state_dict(self, sd: dict) -> None:
        weight = sd["weight"]
        if tuple(weight.shape) != (self.num_rows, self.dim):
            raise ValueError(f"checkpoint table is {tuple(weight.shape)}, this cache's is "
                             f"{(self.num_rows, self.dim)}")
        for k in self.host.state:
            if f"optimizer.{k}" not in sd:
                raise ValueError(f"checkpoint lacks optimizer state {k!r} (was it saved with "
                                 f"another optimizer than {self.optimizer.name!r}?)")
        self.drop_prefetches()
        self.pins.zero_()
        self.host.weight.copy_(weight)
        for k, v in self.host.state.items():
            v.copy_(sd[f"optimizer.{k}"])
        self.step = int(sd["step"])
        self.stats.load_tensor(sd["stats"])
        policy = {k[len("policy."):]: v for k, v in sd.items() if k.startswith("policy.")}
        policy["clock"] = int(policy["clock"])
        policy["kind"] = POLICIES[int(policy["kind"])]
        self.policy.load_state_dict(policy)
        self.slots.load_state_dict({"slot_to_id": sd["slot_to_id"]})
        self.dirty.zero_()
        occupied = torch.nonzero(self.slots.slot_to_id >= 0).flatten()
        self._load(self.slots.slot_to_id[occupied], occupied, count_bytes=False)
