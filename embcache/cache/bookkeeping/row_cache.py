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
row-wise optimizer whose state lives beside the rows. A row's duplicate gradients are
summed exactly as torch's `coalesce` sums them for the uncached table (it sorts the ids
with an unstable sort, so the order of the sum depends on the ids, not on the slots), so
the result equals training the whole table directly, to the bit.

A checkpoint (`state_dict`) is an observation: it writes dirty rows back without clearing
their dirty bits or counting them as cache traffic, and it records residency, dirty bits
and pending prefetches, so a run resumed from it continues exactly, statistics included.
That persistence, with the checks that refuse a checkpoint before anything changes, is
`row_cache_state.RowCacheState`, a base class kept apart so that this file is the hot path of
admission; the optimizer step from a batch's gradient is `row_updates.RowUpdates`, and the
rows' life an open table drives (grow, reset, held, prior) `row_lifecycle.RowLifecycle`.
"""
from __future__ import annotations

import importlib
import inspect
import logging
import math
from collections import deque

import numba
import numpy as np
import torch

from embcache.cache.bookkeeping import fused_admission
from embcache.cache.choices import MAX_PENDING_PREFETCHES, resolve_bookkeeping, resolve_cache_kernels
from embcache.cache.bookkeeping.eviction import EvictionPolicy
from embcache.cache.stores.host_store import HostStore
from embcache.cache.bookkeeping.lookup import Lookup, Overflow, Prefetched, ratio_at_least, same_values  # noqa: F401 (Lookup: part of this module's API)
from embcache.cache.optimizers import RowOptimizer, RowRounding
from embcache.cache.bookkeeping.row_cache_state import RowCacheState
from embcache.cache.bookkeeping.row_lifecycle import RowLifecycle
from embcache.cache.bookkeeping.row_updates import RowUpdates
from embcache.cache.bookkeeping.slot_map import SlotMap
from embcache.cache.stats import CacheStats
from embcache.cache.stores.transfers import RowTransfers, wait_for_side_stream

logger = logging.getLogger(__name__)



class RowCache(RowUpdates, RowLifecycle, RowCacheState):
    """A device working set of `cache_rows` rows over a host table of N rows.

    Args:
        weight: initial `[N, D]` float table on CPU, id order (kept by the host store).
        cache_rows: capacity C of the device cache.
        optimizer: the row-wise optimizer (its state tables travel with the rows).
        eviction: "freq" | "lfu" | "lru".
        ids_freq: per-id counts from the training data (warm-up and `freq`).
        warmup_ratio: fraction of the cache filled with the hottest ids up front.
        device: where the cache's rows live.
        bookkeeping: "host" | "device" | "auto". Where the slot map, eviction metadata,
            holds and dirty bits live and are decided: on the host beside the ids (a
            compiled pass; this class), or on the rows' device in fixed-size tensor ops
            that never make the host wait (`DeviceRowCache`, which `RowCache(...,
            bookkeeping="device")` builds). "auto": device when the rows are on CUDA and
            the host store in memory, host otherwise. Both make the same decisions.
        host_store: "memory" | "mmap:DIR" (`HostStore`); `weight` may then be a `RowInit`,
            so that a huge table is made chunk by chunk, never whole in memory.
        row_dtype: how rows are stored, in the host store and the cache (float32,
            float16, bfloat16); optimizer state stays float32.
        rounding: how updated rows are written in `row_dtype` (default: to nearest).
        kernels: "torch" | "triton" | "auto": the device bookkeeper's (`resolve_cache_kernels`).
        reuse_prefetch: a forward reuses its prefetch's decisions where it placed every id
            (`_reuse`); off, a prefetched batch goes through the general lookup
            (`_serve_beside`), which must decide exactly the same there (the tests compare
            the two).
    """

    # how the host bookkeeper decides a batch's admission: "auto" (the compiled pass over a
    # dense slot map), "fused" or "tensor" (the batched tensor ops: the reference the
    # compiled pass and the device bookkeeper are held to); tests set it on an instance
    admission_pass = "auto"
    # lookups without `keep` leave the cache as it is (`_peek`): set for a validation pass
    frozen = False

    bookkeeping = "host"  # what this class is: a `DeviceRowCache` says "device"
    # bookkeeper name -> its class: the device one registers itself (`__init_subclass__`)
    # when its module loads, which `__new__` makes happen on first use
    _bookkeepers: dict[str, type] = {}
    _bookkeeper_modules = {"device": ".device_cache"}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        RowCache._bookkeepers[cls.bookkeeping] = cls

    def __new__(cls, *args, **kwargs):
        """`RowCache(..., bookkeeping=...)` is also the factory, as `implicit` keeps its CPU
        and GPU models behind one: "device" (or "auto" with CUDA rows in memory) gives a
        `DeviceRowCache`, which takes the same arguments."""
        if cls is RowCache and (args or kwargs):  # not a copy or an unpickling
            bound = inspect.signature(RowCache.__init__).bind(None, *args, **kwargs)
            bound.apply_defaults()
            a = bound.arguments
            kind = resolve_bookkeeping(a["bookkeeping"], a["device"], a["host_store"])
            if kind != "host":
                if kind not in RowCache._bookkeepers:
                    importlib.import_module(RowCache._bookkeeper_modules[kind], __package__)
                cls = RowCache._bookkeepers[kind]
        return super().__new__(cls)

    def __init__(self, weight: torch.Tensor, cache_rows: int, optimizer: RowOptimizer,
                 eviction: str = "freq", ids_freq: torch.Tensor | None = None,
                 warmup_ratio: float = 0.7, device: torch.device | str = "cpu", admission: bool = False,
                 half_life: int | None = None, host_store: str = "memory",
                 row_dtype: torch.dtype = torch.float32, rounding: RowRounding | None = None,
                 bookkeeping: str = "auto", reuse_prefetch: bool = True, kernels: str = "auto"):
        self.device = torch.device(device)
        self.kernels = resolve_cache_kernels(kernels, self.device, self.bookkeeping)
        self.reuse_prefetch = reuse_prefetch
        # on the host, no batch's bookkeeping makes the host wait for the device: ids
        # arrive there, and only rows and lookup indices travel (`RowTransfers`); the
        # device bookkeeper keeps it all beside the rows
        self.book = self.device if self.bookkeeping == "device" else torch.device("cpu")
        num_rows, dim = weight.shape
        self.num_rows, self.dim, self.num_slots = num_rows, dim, int(cache_rows)
        on_cuda = self.device.type == "cuda"
        self.optimizer = optimizer
        self.rounding = rounding or RowRounding(row_dtype)
        state_init = {k: (w, optimizer.initial_state_value(k)) for k, w in optimizer.state_widths(dim).items()}
        self.host = HostStore.create(host_store, weight, state_init, row_dtype, pin=on_cuda,
                                     spare_rows=int(self.bookkeeping == "device"))
        self.weight = torch.zeros(self.num_slots, dim, dtype=row_dtype, device=self.device)
        self.state = optimizer.init_state(self.num_slots, dim, device=self.device)
        self.transfers = RowTransfers(self.host, self.device, num_rows)
        self.slots = SlotMap(num_rows, self.num_slots, self.book)
        self.policy = EvictionPolicy(eviction, num_rows, self.num_slots, ids_freq, self.book, admission, half_life)
        self.dirty = torch.zeros(self.num_slots, dtype=torch.bool, device=self.book)
        # per slot, the batches in flight (prefetched, or between forward and backward)
        # that need its row: a held slot cannot be evicted
        self.holds = torch.zeros(self.num_slots, dtype=torch.int32, device=self.book)
        # the compiled admission pass's marks: per slot, the last pass (epoch) that touched it
        self._mark, self._epoch = np.zeros(self.num_slots, dtype=np.int64), 0
        self._owner = fused_admission.new_owner(self.num_slots)  # its scratch for distinct slots
        self.stats = CacheStats()
        self._warned_small = False  # `_warn_small` said it
        self.step = 0  # optimizer steps taken (Adam's bias correction counts these)
        self._row_bytes = self.host.row_bytes()
        self._prefetched: deque[Prefetched] = deque()
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
        hot = hot[counts > 0].to(self.book)
        target = free[: hot.numel()]
        self._load(hot, target, count_bytes=False)
        self.slots.assign(hot, target)
        self.policy.on_admit(hot, target)
        return hot.numel()

    def prepare(self, ids: torch.Tensor, keep: bool, segments: list[list[int]] | None = None,
                ticket: Prefetched | None = None) -> Lookup:
        """Make the rows of one batch available; `keep` holds them until `release`
        (needed when a backward will update them). Consumes its prefetch (`ticket`, or
        else the one made for the same ids; see `_take_prefetched`), whose
        hits and misses are counted now, as this batch's. Ids from the host (as a loader
        gives them) make the host wait for the device nowhere here: the bookkeeping runs
        on the host and the returned indices and rows travel without waiting."""
        ids = ids.to(self.book)
        self.wait_for_prefetches()
        if self.frozen and not keep:
            return self._peek(ids, segments)
        consumed = self._take_prefetched(ids, ticket)
        same_ids = consumed is not None and same_values(consumed.ids, ids)
        reusable = consumed is not None and consumed.slots is not None and self.reuse_prefetch
        partly_reusable = (reusable and not same_ids and ticket is not None
                           and consumed.ids.shape == ids.shape)
        if same_ids and reusable:
            indices, touched, overflow = self._reuse(consumed), consumed.held, None
        elif same_ids:  # its prefetch could not place every id (or the fast path is off)
            indices, touched, overflow = self._serve_beside(ids)
            if overflow is not None and consumed.held.numel() + overflow.ids.numel() > self.num_slots:
                self._warn_small(consumed.held.numel() + overflow.ids.numel())
        elif partly_reusable:  # an open table's batch whose new keys got rows since its prefetch
            indices, touched, overflow, hits, misses = self._reuse_part(consumed, ids)
        else:
            indices, touched, overflow, _, hits, misses = self._admit(ids, serve_overflow=True)
            if overflow is not None and hits + misses > self.num_slots:
                self._warn_small(hits + misses)
        if same_ids:
            hits, misses = consumed.hits, consumed.misses
        elif consumed is not None and not partly_reusable:  # the rows the prefetch loaded (held since) are this batch's misses
            loaded = consumed.held.numel() - consumed.hits
            hits, misses = hits - loaded, misses + loaded
        self.stats.hits += hits
        self.stats.misses += misses
        self.stats.batches += 1
        # a kept batch whose prefetch was reused takes over that prefetch's holds
        taken_over = keep and consumed is not None and touched is consumed.held
        held = touched if keep else None
        if keep and not taken_over:
            self._hold(held, +1)
        if consumed is not None and not taken_over:
            self._hold(consumed.held, -1)
        outside = None
        if overflow is not None and indices.device.type == "cpu":
            outside = int((indices >= self.num_slots).sum())
        return Lookup(self.transfers.to_device(indices), overflow, held, ids if keep else None, segments, outside)

    def _peek(self, ids: torch.Tensor, segments: list[list[int]] | None) -> Lookup:
        """A frozen cache's lookup (validation): resident rows where they are, the others
        served beside the cache; nothing admitted, evicted or counted as a use, so that the
        working set and the policy are training's alone. Hits and misses per distinct id,
        as training counts them."""
        unique, where = torch.unique(ids.reshape(-1), return_inverse=True)
        slots = self.slots.lookup(unique)
        absent = torch.nonzero(slots < 0).flatten()
        overflow = None
        if absent.numel():
            overflow = self._serve_overflow(unique.index_select(0, absent), 0)
            slots.index_copy_(0, absent, self.num_slots + torch.arange(absent.numel(), device=slots.device))
        self.stats.hits += unique.numel() - absent.numel()
        self.stats.misses += absent.numel()
        self.stats.batches += 1
        indices = slots.index_select(0, where).view(ids.shape)
        return Lookup(self.transfers.to_device(indices), overflow, None, None, segments)

    def _warn_small(self, distinct: int) -> None:
        """Say once that a batch needs more distinct rows than the cache has slots (the
        overflow path keeps training exact, but every such step pays for it)."""
        if self._warned_small:
            return
        self._warned_small = True
        logger.warning(f"the cache holds {self.num_slots:,} rows, a batch needs {distinct:,} distinct rows of "
                       f"{self.num_rows:,}: the rest are served beside the cache every such step (exact, slower; "
                       f"overflow_rows); a cache ratio (--cache-ratio) of {ratio_at_least(distinct, self.num_rows)} "
                       f"or more holds such a batch")

    def _reuse(self, consumed: Prefetched) -> torch.Tensor:
        """The lookup of a batch whose prefetch placed every id: what a second admission
        pass would decide, without it. Every row is resident in a slot the prefetch has held
        since, so that pass would find only hits, at exactly the held slots; all it would
        change is the policy's record of the access (the clock, and one use per slot)."""
        self.policy.tick()
        self._touch(consumed.held)
        return consumed.slots

    def _serve_beside(self, ids: torch.Tensor):
        """The lookup of a prefetched batch whose prefetch could not place every id: its
        admission was that prefetch's, so the ids still absent are served beside the
        cache for this step (overflow, their use counted), none admitted now. (A batch's
        rows are admitted once, where it is first seen: what the device bookkeeper can do
        without asking the device whether they were all placed.) Returns (indices, the
        distinct resident slots the batch touches, overflow or None)."""
        self.policy.tick()
        slots = self.slots.lookup(ids).reshape(-1)
        absent = torch.nonzero(slots < 0).flatten()
        overflow = None
        if absent.numel():
            missing, where = torch.unique(ids.reshape(-1).index_select(0, absent), return_inverse=True)
            overflow = self._serve_overflow(missing, 0)
            self.policy.on_bypass(missing)
            slots.index_copy_(0, absent, self.num_slots + where)
        touched = torch.unique(slots[slots < self.num_slots])  # resident: not the overflow rows
        self._touch(touched)
        return slots.view(ids.shape), touched, overflow

    def _reuse_part(self, consumed: Prefetched, ids: torch.Tensor):
        """The lookup of a batch whose prefetch (named by its ticket) placed every id it was given, but
        whose ids differ at some positions (an open table's prefetch gives a key unknown then
        the default row; its forward, the key's new row): the prefetch's slots where the ids
        agree, an admission pass over the other positions alone. It decides what a second
        pass over the whole batch decides (the same victims: the prefetch's slots are held
        either way; the same uses, at one clock), at the cost of the differing positions.
        Returns (indices, the distinct slots the batch touches, overflow, hits, misses),
        counted as that second pass counts them."""
        flat, before, slots = ids.reshape(-1), consumed.ids.reshape(-1), consumed.slots.reshape(-1)
        differ = torch.nonzero(flat != before).flatten()
        differ_indices, added, overflow, _, hits, misses = self._admit(flat.index_select(0, differ),
                                                                       serve_overflow=True)
        mark = torch.zeros(self.num_slots, dtype=torch.bool, device=self.book)
        mark[added] = True  # the pass's slots: used (and counted) by it already
        kept = consumed.held[~mark.index_select(0, consumed.held)]
        hits += consumed.hits - (consumed.held.numel() - kept.numel())
        # slots the prefetch gave only the differing positions are no longer the batch's
        stale = slots.index_select(0, differ)
        mark.zero_()
        mark[stale] = True
        mark[added] = False
        if bool(mark.any()):
            agree = torch.ones(flat.numel(), dtype=torch.bool, device=self.book)
            agree[differ] = False
            used = slots[agree]
            mark[used[mark.index_select(0, used)]] = False  # stale slots still used elsewhere stay
            dropped = mark.index_select(0, kept)
            hits -= int(dropped.sum())
            kept = kept[~dropped]
        self._touch(kept)
        indices = slots.clone()
        indices.index_copy_(0, differ, differ_indices.reshape(-1))
        return indices.view(ids.shape), torch.cat([kept, added]), overflow, hits, misses + consumed.misses

    def _touch(self, slots: torch.Tensor) -> None:
        """Record a use of distinct resident `slots` at the policy's clock."""
        if self._can_fuse():
            fused_admission.touch(slots.numpy(), self.policy.slot_primary.numpy(),
                                  self.policy.slot_last.numpy(), self.policy.clock, self.policy.id_count is not None)
        else:
            self.policy.on_access(None, slots)

    def prefetch(self, ids: torch.Tensor) -> Prefetched:
        """Load the rows of a coming batch now (on a side stream with CUDA, so the copies
        overlap the current step); they are held until that batch's `prepare` (given the
        returned ticket, or the same ids)."""
        ids = self._book_ids(ids)
        if len(self._prefetched) >= MAX_PENDING_PREFETCHES:
            self._hold(self._prefetched.popleft().held, -1)
        if self._stream is None:
            return self._prefetch(ids)
        self._stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self._stream):
            return self._prefetch(ids)

    def _book_ids(self, ids: torch.Tensor) -> torch.Tensor:
        """A prefetch's ids where the bookkeeping reads them (the device bookkeeper takes
        them as given and sends them itself, on the prefetch's stream)."""
        return ids.to(self.book)

    def _prefetch(self, ids: torch.Tensor) -> Prefetched:
        indices, touched, _, placed_all, hits, misses = self._admit(ids, serve_overflow=False)
        self._hold(touched, +1)
        self._prefetched.append(entry := Prefetched(ids, touched, hits, misses, indices if placed_all else None))
        return entry

    def wait_for_prefetches(self) -> None:
        """Order the compute stream after the side stream (the host never waits): every touch
        of the maps, holds, rows or a prefetch's results there comes after the prefetches."""
        if self._stream is not None:
            wait_for_side_stream(self._stream, self.device)

    def _take_prefetched(self, ids: torch.Tensor, ticket: Prefetched | None = None) -> Prefetched | None:
        """This batch's prefetch, if still pending; older ones are dropped (their rows stay
        resident, their counts are not the batch's): the one `ticket` names (whatever its
        ids: an open table's batch has its own row for a key that had the default row at
        its prefetch), else the one made for exactly these ids."""
        for i, entry in enumerate(self._prefetched):
            if entry is ticket if ticket is not None else same_values(entry.ids, ids):
                return self._pop_through(i)
        return None

    def oldest_restored(self) -> Prefetched | None:
        """The oldest pending prefetch if a checkpoint restored it (made for the batch that
        comes first; no one holds its ticket)."""
        oldest = self._prefetched[0] if self._prefetched else None
        return oldest if oldest is not None and oldest.restored else None

    def _pop_through(self, i: int) -> Prefetched:
        """The i-th pending prefetch, the ones before it dropped."""
        for _ in range(i):
            self._hold(self._prefetched.popleft().held, -1)
        return self._prefetched.popleft()

    def _hold(self, slots: torch.Tensor, delta: int) -> None:
        """Hold (delta=+1) or let go of (-1) distinct `slots`. A count, not a flag: a
        training batch and several prefetches may hold one slot at once."""
        if self.holds.device.type == "cpu":  # host bookkeeping: over threads (the slots are distinct)
            fused_admission.hold(self.holds.numpy(), slots.to(torch.int64).contiguous().numpy(), delta)
            return
        self.holds.index_add_(0, slots, self.holds.new_full((1,), delta).expand(slots.numel()))

    def release(self, lookup: Lookup) -> None:
        """Let go of a batch's rows: after its update, or when its forward's graph is
        freed without a backward. Idempotent."""
        if lookup.held is not None:
            self.wait_for_prefetches()
            self._hold(lookup.held, -1)
            lookup.held = None

    def _admit(self, ids: torch.Tensor, serve_overflow: bool):
        """Returns (per-lookup indices, the distinct resident slots the batch touches,
        overflow rows or None, whether every missing row got a slot, hits, misses). On the CPU the decisions are made by one
        compiled pass (`fused_admission`); elsewhere, and as its reference, by the batched
        tensor ops below: the same decisions either way."""
        if self.admission_pass == "fused" or (self.admission_pass == "auto" and self._can_fuse()):
            return self._admit_fused(ids, serve_overflow)
        return self._admit_tensor(ids, serve_overflow)

    def _can_fuse(self) -> bool:
        return self.book.type == "cpu" and self.slots.id_to_slot is not None

    def _admit_fused(self, ids: torch.Tensor, serve_overflow: bool):
        policy = self.policy
        policy.tick()
        self._epoch += 1
        flat = ids.reshape(-1).to(torch.int64).contiguous().numpy()
        out, touched, hits, missing, victims, evicted, target, declined = fused_admission.admit(
            flat, self.slots.id_to_slot.numpy(),
            self.slots.slot_to_id.numpy(), self.holds.numpy(), self._mark, self._epoch,
            policy.slot_primary.numpy(), policy.slot_last.numpy(),
            fused_admission.counts_of(policy.id_count), fused_admission.prior_of(policy.prior),
            policy.prior_weight, policy.clock, policy.admission, serve_overflow, self._owner,
            fused_admission.lookup_chunk(flat.shape[0], numba.get_num_threads()))
        self._evict_rows(torch.from_numpy(victims), torch.from_numpy(evicted))
        target, missing = torch.from_numpy(target), torch.from_numpy(missing)
        self._load(missing[: target.numel()], target)
        overflow = None
        if serve_overflow and target.numel() < missing.numel():
            overflow = self._serve_overflow(missing[target.numel():], declined)
        return (torch.from_numpy(out).view(ids.shape), torch.from_numpy(touched), overflow,
                target.numel() == missing.numel(), hits, missing.numel())

    def _admit_tensor(self, ids: torch.Tensor, serve_overflow: bool):
        """Per-access bookkeeping runs on the distinct slots (found by one bincount over
        the slots), not on every lookup."""
        self.policy.tick()
        slots = self.slots.lookup(ids)
        # bin 0 collects absent ids (-1); bin s+1 counts slot s
        uses = torch.bincount(slots + 1, minlength=self.num_slots + 1)
        in_batch = uses[1:] > 0
        admitted = 0
        missing = ids.new_empty(0)
        overflow = None
        if int(uses[0]):
            absent = torch.nonzero(slots < 0).flatten()
            missing, where = torch.unique(ids.index_select(0, absent), return_inverse=True)
            free = self.slots.free_slots(missing.numel())
            victims = self.policy.select_victims(missing.numel() - free.numel(),
                                                 (self.holds > 0) | in_batch, self.slots.occupied())
            declined = 0
            if self.policy.admission and victims.numel():
                declined = victims.numel()
                missing, order, victims = self.policy.admissions(missing, victims, free.numel())
                declined -= victims.numel()
                inverse = torch.empty_like(order)
                inverse[order] = torch.arange(order.numel(), device=order.device)
                where = inverse.index_select(0, where)
            self._evict(victims)
            target = torch.cat([free, victims])
            fits = missing[: target.numel()]
            self._load(fits, target)
            self.slots.assign(fits, target)
            self.policy.on_admit(fits, target)
            in_batch.index_fill_(0, target, True)
            admitted = fits.numel()
            # the absent positions' new slots, through the unique inverse (no second
            # lookup in the per-id table); missing ids that did not fit stay -1, or point
            # past the cache into the overflow rows, which keep `missing`'s order
            new_slot = torch.full_like(missing, -1)
            new_slot[: target.numel()] = target
            if fits.numel() < missing.numel() and serve_overflow:
                overflow = self._serve_overflow(missing[fits.numel():], declined)
                self.policy.on_bypass(missing[fits.numel():])
                new_slot[fits.numel():] = self.num_slots + torch.arange(
                    missing.numel() - fits.numel(), device=missing.device)
            slots.index_copy_(0, absent, new_slot.index_select(0, where))
        touched = torch.nonzero(in_batch).flatten()
        self.policy.on_access(self.slots.slot_to_id.index_select(0, touched), touched)
        return slots, touched, overflow, admitted == missing.numel(), touched.numel() - admitted, missing.numel()

    def _evict(self, victims: torch.Tensor) -> None:
        if victims.numel() == 0:
            return
        ids = self.slots.slot_to_id.index_select(0, victims)
        self.policy.on_evict(ids, victims)
        self._evict_rows(victims, ids)
        self.slots.release(victims)

    def _evict_rows(self, victims: torch.Tensor, ids: torch.Tensor) -> None:
        """The rows leaving `victims` (which held `ids`): the dirty ones go to the host."""
        if victims.numel() == 0:
            return
        dirty = self.dirty.index_select(0, victims)
        if bool(dirty.any()):
            out = victims[dirty]
            self._write_back(out, ids[dirty])
            self.stats.bytes_d2h += out.numel() * self._row_bytes
            self.dirty.index_fill_(0, victims, False)
        self.stats.evictions += victims.numel()

    def _load(self, ids: torch.Tensor, target: torch.Tensor, count_bytes: bool = True) -> None:
        """Copy host rows `ids` (with their state) into slots `target` (both host-side,
        with the bookkeeping)."""
        if ids.numel() == 0:
            return
        weight, state = self.transfers.gather(ids)
        slots = self.transfers.to_device(target)
        self.weight.index_copy_(0, slots, weight)
        for k, v in state.items():
            self.state[k].index_copy_(0, slots, v)
        self.dirty.index_fill_(0, target, False)
        if count_bytes:
            self.stats.bytes_h2d += ids.numel() * self._row_bytes

    def _serve_overflow(self, ids: torch.Tensor, declined: int) -> Overflow:
        """Rows that get no slot this batch (`declined` of them by admission control, the
        rest for want of room), served from a side table."""
        weight, state = self.transfers.gather(ids)
        self.stats.overflow_rows += ids.numel() - declined
        self.stats.bypassed_rows += declined
        self.stats.bytes_h2d += ids.numel() * self._row_bytes
        return Overflow(ids, weight, state, self.transfers.to_device(ids))

    # ------------------------------------------------------------------ host side
    def flush(self) -> None:
        """Write every dirty row (and its state) back to the host store."""
        out = self.sync_host()
        if out.numel():
            self.stats.bytes_d2h += out.numel() * self._row_bytes
            self.dirty.index_fill_(0, out, False)

    def sync_host(self) -> torch.Tensor:
        """Make the host store current without changing the cache: dirty rows are copied
        back but stay dirty, and the copy is not cache traffic. What a checkpoint or a
        snapshot of the table needs, with no effect on what the run does next. Returns
        the dirty slots."""
        self.wait_for_prefetches()
        out = torch.nonzero(self.dirty).flatten()
        if out.numel():
            self._write_back(out)
        self.transfers.settle()  # every pending write-back lands, in order
        return out

    def _write_back(self, slots: torch.Tensor, ids: torch.Tensor | None = None) -> None:
        """Copy resident `slots` (rows and optimizer state) to their ids' host rows (`ids`:
        the slots' ids, where the map no longer has them)."""
        ids = self.slots.slot_to_id.index_select(0, slots) if ids is None else ids
        rows = self.transfers.to_device(slots)
        self.transfers.write(ids, self.weight.index_select(0, rows),
                             {k: v.index_select(0, rows) for k, v in self.state.items()})

    def pending_prefetches(self) -> int:
        """Prefetched batches not yet consumed by a `prepare` (a resumed cache has its
        checkpoint's)."""
        return len(self._prefetched)

    def drop_prefetches(self) -> None:
        while self._prefetched:
            self._hold(self._prefetched.popleft().held, -1)
