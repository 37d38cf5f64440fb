"""The device bookkeeper: a `RowCache` whose bookkeeping lives beside its rows and never
makes the host wait.

The host bookkeeper (`RowCache`) decides every batch on the host, beside the ids, and
sends the device rows and indices. Here the ids go to the device and everything is decided
there: the id -> slot map, the eviction keys and counts (the `ids_freq` prior too), holds,
dirty bits, and the rows themselves, read from and written to the pinned host store by
device kernels through its unified view (`host_link`). Each step is a fixed list of tensor
operations sized by the batch's ids or the cache's slots, so the host only issues launches:
no `unique`, `nonzero`, boolean-mask indexing, `.item()` or copy to the host, and no
Python branch on a value. How, where the host bookkeeper would branch or compact:

- dedup: a stable sort of the batch's ids and a neighbour compare; a distinct id's rank
  among the missing ones is a running sum of "first of its value and absent";
- free slots: a running sum over "slot empty" numbers them in slot order;
- victims: one stable sort of every slot's eviction key, non-candidates (held, used by
  this batch, empty) keyed +inf, so that they come last; the r-th miss after the free
  slots takes the r-th victim;
- counts (misses, free slots, victims, admissions won) stay 0-d device tensors, and every
  list is as long as the batch: an entry past a count is masked, and a masked write goes
  to a spare entry past the end of the array it writes (the "trash": index C of the slot
  arrays, N of the id arrays, the working table's last row, the store's spare row).

It makes the host bookkeeper's decisions exactly (same slots for the same ids, same
victims in the same order, same counters; tests/test_device_bookkeeping.py replays traces
through both). Rows that do not fit this batch (overflow, admission declined) are read
into rows of the working table past the cache (a region per batch in flight), updated
there with the cache's rows in one optimizer call, and written back to the host store by
the device.

Open tables keep the host bookkeeper (their key index is a host structure); a mapped
host store too (the device cannot map a file's pages).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from embcache.device import to_device_async

from embcache.cache.bookkeeping.fixed_size import DeviceCount, pick, write_where
from embcache.cache.stores.host_link import HostLink
from embcache.cache.bookkeeping.lookup import Lookup, Overflow, Prefetched, same_values
from embcache.cache.bookkeeping.device_updates import DeviceUpdates
from embcache.cache.bookkeeping.row_cache import RowCache
from embcache.cache.stats import CacheStats

# the statistics counted on the device, in `CacheStats` field names (batches is the host's)
COUNTERS = ("hits", "misses", "evictions", "bytes_h2d", "bytes_d2h", "overflow_rows", "bypassed_rows")
INF = float("inf")


@dataclass
class Scratch:
    """A batch's overflow rows in its region of the working table: entry r (of the
    batch's distinct missing ids, in admission order) is `ids[r]` at working row `rows[r]`
    where `mask[r]`."""

    region: list  # [start, size, busy] of `DeviceRowCache._regions`
    ids: torch.Tensor
    rows: torch.Tensor
    mask: torch.Tensor


class DeviceRowCache(DeviceUpdates, RowCache):
    """`RowCache` with the bookkeeping on the rows' device (see the module docstring);
    built by `RowCache(..., bookkeeping="device")` (or "auto" on CUDA), same arguments."""

    bookkeeping = "device"

    def __init__(self, weight, cache_rows, optimizer, eviction="freq", ids_freq=None, warmup_ratio=0.7,
                 device="cpu", admission=False, half_life=None, host_store="memory",
                 row_dtype=torch.float32, rounding=None, bookkeeping="device", reuse_prefetch=True, kernels="auto"):
        super().__init__(weight, cache_rows, optimizer, eviction, ids_freq, 0.0, device, admission, half_life,
                         host_store, row_dtype, rounding, bookkeeping, reuse_prefetch, kernels)
        C = self.num_slots
        self._regions: list[list] = []  # [start, size, busy]: working rows past the cache
        self._work_ids = torch.full((C + 1,), -1, dtype=torch.long, device=self.device)
        self.slots.slot_to_id = self._work_ids[:C]
        self._pad: dict[str, torch.Tensor] = {}
        self.slots.id_to_slot = self._padded("id_to_slot", self.slots.id_to_slot, -1)
        self.dirty = self._padded("dirty", self.dirty, False)
        self.holds = self._padded("holds", self.holds, 0)
        p = self.policy
        p.slot_last = self._padded("slot_last", p.slot_last, 0.0)
        p.slot_primary = self._padded("slot_primary", p.slot_primary, 0.0)
        if p.id_count is not None:
            p.id_count = self._padded("id_count", p.id_count, 0)
        if p.prior is not None:
            p.prior = self._padded("prior", p.prior, 0.0)
        self.link = HostLink(self.host, self.device, "triton" if self.kernels == "triton" else "auto")
        self._counters = torch.zeros(len(COUNTERS), dtype=torch.int64, device=self.device)
        self._count_index: dict[tuple, torch.Tensor] = {}
        self._zero = torch.zeros((), dtype=torch.int64, device=self.device)
        self._one_count = torch.ones(1, dtype=torch.int32, device=self.device)  # a use, for masked index_add_
        self._arange = torch.arange(max(C, 1), device=self.device)
        self._fresh = True  # nothing admitted yet: every slot free, in order
        self._clock = DeviceCount(torch.float64, self.device)  # the policy's, as the kernels stamp it
        self._step_count = DeviceCount(torch.int64, self.device)  # the step, as half rows' rounding hashes it
        if ids_freq is not None and warmup_ratio > 0:
            self.warm_up(ids_freq, warmup_ratio)

    def _padded(self, name: str, t: torch.Tensor, fill) -> torch.Tensor:
        """`t` copied into an array one entry longer (the trash entry); returns the view
        of its first entries, which the host-side code (maps, policy, checkpoints) keeps."""
        buf = torch.full((t.numel() + 1,), fill, dtype=t.dtype, device=t.device)
        buf[: t.numel()].copy_(t)
        self._pad[name] = buf
        return buf[: t.numel()]

    # ------------------------------------------------------------------ the working table
    @property
    def weight(self) -> torch.Tensor:
        return self._work["weight"][: self.num_slots]

    @weight.setter
    def weight(self, t: torch.Tensor) -> None:  # the cache's rows, then the trash row
        self._work = {"weight": torch.cat([t, t.new_zeros(1, t.shape[1])])}

    @property
    def state(self) -> dict[str, torch.Tensor]:
        return {k[len("optimizer."):]: v[: self.num_slots] for k, v in self._work.items() if k != "weight"}

    @state.setter
    def state(self, state: dict[str, torch.Tensor]) -> None:
        for k, v in state.items():
            self._work[f"optimizer.{k}"] = torch.cat([v, v.new_zeros(1, v.shape[1])])

    def working_table(self) -> torch.Tensor:
        return self._work["weight"]

    def _trash_row(self) -> int:
        return self._work["weight"].shape[0] - 1

    def _slot_ids(self) -> torch.Tensor:
        return self._work_ids

    def _take_region(self, size: int) -> list:
        """A region of `size` working rows for one batch's overflow: a free one large
        enough, else a new one appended (the rows before it keep their places, so the
        lookups of batches in flight stay valid)."""
        for region in self._regions:
            if not region[2] and region[1] >= size:
                region[2] = True
                return region
        start = self._trash_row()
        grown = {}
        for name, t in self._work.items():
            new = t.new_zeros((start + size + 1, t.shape[1]))
            new[:start].copy_(t[:start])
            grown[name] = new
        self._work = grown
        ids = self._work_ids.new_full((start + size + 1,), -1)
        ids[:start].copy_(self._work_ids[:start])
        self._work_ids = ids
        self.slots.slot_to_id = ids[: self.num_slots]
        region = [start, size, True]
        self._regions.append(region)
        return region

    # ------------------------------------------------------------------ statistics
    @property
    def stats(self) -> CacheStats:
        """The statistics, with what the device counted since last asked (one read of the
        device: asking is not free, a step never asks)."""
        if "_counters" in self.__dict__:
            self._fold_counters()
        return self._stats

    @stats.setter
    def stats(self, stats: CacheStats) -> None:
        if "_counters" in self.__dict__:
            self._fold_counters()  # what was counted so far belongs to the statistics being replaced
        self._stats = stats

    def host_counts(self) -> tuple[int, int, int]:
        """What a step counts on the host: (optimizer steps, the policy's clock, batches
        looked up). A step replayed from a CUDA graph runs none of its host side, which
        `advance_host_counts` then adds (the clock its kernels stamp is the device's own,
        advanced by the replay: `_tick`)."""
        return self.step, self.policy.clock, self._stats.batches

    def advance_host_counts(self, steps: int, clock: int, batches: int) -> None:
        self.step += steps
        self.policy.clock += clock
        self._clock.replayed(clock)  # the replays advanced the device's copies as much
        self._step_count.replayed(steps)
        self._stats.batches += batches

    def _fold_counters(self) -> None:
        if self.device.type == "meta":  # counted, but without values: nothing to add
            return
        values = self._counters.tolist()
        self._counters.zero_()
        for name, v in zip(COUNTERS, values):
            setattr(self._stats, name, getattr(self._stats, name) + int(v))

    def _count(self, **deltas: torch.Tensor) -> None:
        """Add 0-d int64 device tensors to the named counters: two operations, whatever the names."""
        names = tuple(deltas)
        index = self._count_index.get(names)
        if index is None:
            index = self._count_index[names] = torch.tensor([COUNTERS.index(k) for k in names], device=self.device)
        values = [v if isinstance(v, torch.Tensor) else torch.tensor(v, device=self.device)  # a checkpoint's
                  for v in deltas.values()]
        self._counters.index_add_(0, index, torch.stack(values))

    # ------------------------------------------------------------------ ids on the device
    def _on_device(self, ids: torch.Tensor) -> torch.Tensor:
        return to_device_async(ids.reshape(-1).to(torch.long), self.device)

    def _book_ids(self, ids: torch.Tensor) -> torch.Tensor:
        return ids  # sent by `_prefetch`, on the prefetch's stream (the match is made on these)

    def _prefetch(self, ids: torch.Tensor) -> Prefetched:
        _, touched, hits, misses, _ = self._admit_on_device(self._on_device(ids), None)
        self._hold(touched, +1)
        self._prefetched.append(entry := Prefetched(ids, touched, hits, misses))
        return entry

    def prepare(self, ids: torch.Tensor, keep: bool, segments: list[list[int]] | None = None,
                ticket: Prefetched | None = None) -> Lookup:
        """As `RowCache.prepare`. A prefetched batch is not admitted again: its ids are
        looked up, the ones its prefetch could not place served beside the cache
        (`_serve_beside`), which is what the host bookkeeper does whether or not they were
        all placed (a value this side never reads). Others get a full admission pass."""
        self.wait_for_prefetches()
        if self.frozen and not keep:
            return self._peek(ids, segments)
        consumed = self._take_prefetched(ids, ticket)
        same_ids = consumed is not None and same_values(consumed.ids, ids)
        flat = self._on_device(ids)
        region = self._take_region(max(flat.numel(), 1))
        if same_ids:
            indices, touched, hits, misses, scratch = self._serve_beside(flat, region)
        else:
            indices, touched, hits, misses, scratch = self._admit_on_device(flat, region)
        if same_ids:
            hits, misses = consumed.hits, consumed.misses
        elif consumed is not None:  # the rows that prefetch loaded (held since) are this batch's misses
            loaded = consumed.held.sum() - consumed.hits
            hits, misses = hits - loaded, misses + loaded
        self._count(hits=hits, misses=misses)
        self._stats.batches += 1
        if keep:
            self._hold(touched, +1)
        if consumed is not None:
            self._hold(consumed.held, -1)
        lookup = Lookup(indices.view(ids.shape), None, touched if keep else None, flat if keep else None, segments)
        if keep:
            lookup.scratch = scratch
        else:  # read by this forward's kernels, queued before any later write to the region
            region[2] = False
        return lookup

    # ------------------------------------------------------------------ admission
    def _admit_on_device(self, flat: torch.Tensor, region: list | None):
        """One admission pass over a batch's ids (1-D, on the device), deciding what
        `RowCache._admit_tensor` decides. Returns (each lookup's working row, -1 for an
        id left out by a prefetch; the mask of the slots the batch touches; hits; misses
        (0-d); the overflow's `Scratch`, with `region` given, else None)."""
        clock = self._tick()
        if flat.numel() == 0:
            return self._no_lookups(flat)
        slots, hit, in_batch, missing, m, where = self._look_up(flat)
        C, N, n = self.num_slots, self.num_rows, flat.numel()
        r = torch.arange(n, device=self.device)
        free_list, nfree, victims, kv, taken, declined, missing, where = self._choose(n, m, r, missing, where,
                                                                                     in_batch, clock)
        fits = nfree + taken
        written = self._evict_on_device(victims, self._arange[:kv] < taken)
        # ---- admit: the r-th missing id takes the r-th free slot, then the (r - free)-th victim
        target = pick(r < nfree, free_list, victims.index_select(0, (r - nfree).clamp(0, kv - 1)))
        admitted = r < fits
        self._admit_rows(pick(admitted, missing, N), target, admitted, pick(admitted, target, C), in_batch, clock)
        new_row = pick(admitted, target, -1)
        row_bytes = self._row_bytes
        deltas = dict(evictions=taken, bytes_h2d=fits * row_bytes, bytes_d2h=written.sum() * row_bytes)
        # ---- the rest of the missing ids: beside the cache, in this batch's region
        scratch = None
        if region is not None:
            rows, outside = self._read_beside(missing, r, m, region, fits)
            new_row = pick(outside, rows, new_row)
            over = m - fits
            deltas.update(overflow_rows=over - declined, bypassed_rows=declined,
                          bytes_h2d=(fits + over) * row_bytes)
            scratch = Scratch(region, missing, rows, outside)
        indices = pick(hit, slots, new_row.index_select(0, where))
        touched = self._record_use(in_batch, clock)
        self._count(**deltas)
        return indices, touched, touched.sum() - fits, m, scratch

    def _choose(self, n: int, m, r, missing, where, in_batch, clock):
        """The admission's choices, all fixed-size: the free slots in slot order (the
        first n are all a batch can take), the victims (the smallest keys among slots
        neither held, used by the batch, nor empty), how many victims leave (`taken`) and
        how many missing ids an admission policy keeps out (`declined`); with admission
        the missing ids come hottest first (`missing`, `where` reordered). Returns
        (free_list, nfree, victims, kv, taken, declined, missing, where)."""
        p, C, dev = self.policy, self.num_slots, self.device
        occupied = self.slots.slot_to_id >= 0
        free = ~occupied
        free_count = free.sum()
        free_rank = torch.cumsum(free, 0) - 1
        free_list = torch.full((n + 1,), C, dtype=torch.long, device=dev)
        keep = free & (free_rank < n)
        write_where(free_list, pick(keep, free_rank, n), self._arange[:C], keep, self.kernels)
        free_list = free_list[:n]
        nfree = torch.minimum(free_count, m)
        candidates = occupied & ~((self.holds > 0) | in_batch[:C])
        keys = pick(candidates, p.keys(clock), torch.full_like(p.slot_last, INF))
        kv = min(n, C)
        vkeys, victims = torch.sort(keys, stable=True)
        vkeys, victims = vkeys[:kv], victims[:kv]
        wanted = torch.clamp(torch.minimum(m - free_count, candidates.sum()), min=0)
        j = self._arange[:kv]
        if p.admission:  # the hottest missing ids first; each past the free slots beats its victim or stays out
            ckeys = self.policy.candidate_keys(missing, clock, **self._count_arrays())
            ckeys = pick(r < m, ckeys, torch.full_like(ckeys, -INF))
            order = pick(wanted > 0, torch.argsort(ckeys, descending=True, stable=True), r)
            missing, ckeys = missing.index_select(0, order), ckeys.index_select(0, order)
            contender = ckeys.index_select(0, (nfree + j).clamp(max=n - 1))
            taken = ((j < wanted) & (contender > vkeys)).sum()
            inverse = torch.empty_like(order).index_copy_(0, order, r)
            where = inverse.index_select(0, where)
        else:
            taken = wanted
        return free_list, nfree, victims, kv, taken, wanted - taken, missing, where

    def _evict_on_device(self, victims: torch.Tensor, leaving: torch.Tensor) -> torch.Tensor:
        """Evict the `leaving` victims: keep their counts, write the dirty ones back, empty
        their slots. Returns the mask of the victims written back."""
        p, pad, C, N = self.policy, self._pad, self.num_slots, self.num_rows
        out_slot = pick(leaving, victims, C)
        out_ids = pick(leaving, self.slots.slot_to_id.index_select(0, victims), N)
        if p.id_count is not None:
            count = pad["slot_primary"].index_select(0, out_slot)
            if p.prior is not None:
                count = count - p._prior(out_ids, pad["prior"])
            write_where(pad["id_count"], out_ids, count.round().to(torch.int32), leaving, self.kernels)
        written = leaving & pad["dirty"].index_select(0, out_slot)
        self.link.write(out_ids, victims, written, self._work, self._trash_row())
        write_where(pad["dirty"], out_slot, False, leaving, self.kernels)
        write_where(pad["id_to_slot"], out_ids, -1, leaving, self.kernels)
        write_where(self._work_ids, pick(leaving, victims, self._trash_row()), -1, leaving, self.kernels)
        return written

    def _admit_rows(self, in_ids, target, admitted, in_slot, in_batch, clock) -> None:
        """Read the `admitted` ids' rows into their `target` slots and give the slots their
        ids, clean bits and counts; the batch uses them."""
        pad = self._pad
        self.link.read(in_ids, target, admitted, self._work, self._trash_row())
        k = self.kernels
        write_where(pad["dirty"], in_slot, False, admitted, k)
        write_where(self._work_ids, pick(admitted, target, self._trash_row()), in_ids, admitted, k)
        write_where(pad["id_to_slot"], in_ids, target, admitted, k)
        write_where(pad["slot_last"], in_slot, clock, admitted, k)
        if self.policy.id_count is None:
            write_where(pad["slot_primary"], in_slot, 0.0, admitted, k)
        else:
            write_where(pad["slot_primary"], in_slot, self.policy._counts(in_ids, **self._count_arrays()), admitted, k)
        write_where(in_batch, in_slot, True, admitted, k)

    def _serve_beside(self, flat: torch.Tensor, region: list):
        """`RowCache._serve_beside` on the device: a lookup, the absent ids (distinct, by
        sort) read into the batch's region, the batch's use of its slots. Returns what
        `_admit_on_device` returns (its hits and misses are the prefetch's, counted by the
        caller)."""
        clock = self._tick()
        if flat.numel() == 0:
            return self._no_lookups(flat)
        slots, hit, in_batch, missing, m, where = self._look_up(flat)
        rows, outside = self._read_beside(missing, torch.arange(flat.numel(), device=self.device), m, region)
        indices = pick(hit, slots, rows.index_select(0, where))
        touched = self._record_use(in_batch, clock)
        self._count(overflow_rows=m, bytes_h2d=m * self._row_bytes)
        return indices, touched, self._zero, self._zero, Scratch(region, missing, rows, outside)

    def _read_beside(self, missing: torch.Tensor, r: torch.Tensor, m: torch.Tensor, region: list,
                     fits: torch.Tensor | None = None):
        """The missing ids from the `fits`-th on (all of them without `fits`) read into the
        batch's region of the working table, each use counted as the host bookkeeper's
        `on_bypass` counts it. Returns (each entry's working row, the mask of the entries
        that are read)."""
        if fits is None:
            outside, rows = r < m, r + region[0]
        else:
            outside, rows = (r >= fits) & (r < m), region[0] + (r - fits).clamp(min=0)
        self.link.read(missing, rows, outside, self._work, self._trash_row())
        write_where(self._work_ids, pick(outside, rows, self._trash_row()), pick(outside, missing, -1), outside,
                    self.kernels)
        if self.policy.id_count is not None:
            write_where(self._pad["id_count"], pick(outside, missing, self.num_rows), self._one_count, outside,
                        self.kernels, add=True)
        return rows, outside

    def _record_use(self, in_batch: torch.Tensor, clock: torch.Tensor) -> torch.Tensor:
        """The batch's use of every slot it touches (`in_batch`, with its trash entry);
        returns the mask of those slots."""
        touched = in_batch[: self.num_slots]
        self.policy.slot_last.masked_fill_(touched, clock)
        if self.policy.id_count is not None:
            self.policy.slot_primary.add_(touched)
        return touched

    def _no_lookups(self, flat: torch.Tensor):
        """What a pass over an empty batch returns: nothing looked up, touched or missed."""
        touched = torch.zeros(self.num_slots, dtype=torch.bool, device=self.device)
        return flat.new_empty(0), touched, self._zero, self._zero, None

    def _tick(self) -> torch.Tensor:
        """A lookup pass begins: the policy's clock advances (its aging with it), on the host
        and on the device, whose copy (0-d float64) is what the pass stamps and divides by.
        The device's advances by one add where it held the host's previous count, so a step
        replayed from a CUDA graph stamps a clock of its own, not the capture's (the host's
        count catches up after the replay: `advance_host_counts`); where anything else moved
        the host's count (a checkpoint loaded), it is set to the host's. One op either way."""
        self.policy.tick()
        self._fresh = False
        return self._clock.follow(self.policy.clock)

    def _look_up(self, flat: torch.Tensor):
        """A batch's lookup and its distinct missing ids, in fixed sizes: (each lookup's slot,
        -1 absent; whether it hit; the mask of slots it hits, one entry longer (the trash);
        the distinct missing ids ascending, padded with the trash id N to the batch's length;
        how many (0-d); each lookup's id's rank among them, valid where absent). The dedup
        is a stable sort and a neighbour compare; a rank is a running sum (in three
        launches with kernels "triton": `kernels.batch_lookup`)."""
        C, N, n, dev = self.num_slots, self.num_rows, flat.numel(), self.device
        if self.kernels == "triton":
            from embcache.kernels.batch_lookup import look_up

            return look_up(flat, self._pad["id_to_slot"], C, N)
        slots = self._pad["id_to_slot"].index_select(0, flat)
        hit = slots >= 0
        in_batch = torch.zeros(C + 1, dtype=torch.bool, device=dev)
        in_batch.index_fill_(0, pick(hit, slots, C), True)
        sid, perm = torch.sort(flat, stable=True)
        first = torch.ones(n, dtype=torch.bool, device=dev)
        first[1:] = sid[1:] != sid[:-1]
        miss_first = first & ~hit.index_select(0, perm)
        rank = torch.cumsum(miss_first, 0) - 1  # at every sorted position: its id's rank among the missing
        missing = torch.full((n + 1,), N, dtype=torch.long, device=dev)
        missing.index_copy_(0, pick(miss_first, rank, n), sid)
        where = torch.empty_like(rank).index_copy_(0, perm, rank).clamp_(min=0)
        return slots, hit, in_batch, missing[:n], rank[-1] + 1, where

    def _count_arrays(self) -> dict:
        """The policy's per-id arrays a trash entry longer, for its `_counts` of ids that
        may be the trash id."""
        return {"id_count": self._pad.get("id_count"), "prior": self._pad.get("prior")}

    def _hold(self, slots: torch.Tensor, delta: int) -> None:
        """Holds as a mask over the slots (what the device bookkeeper keeps per batch), or
        a list of slots (a checkpoint's)."""
        if slots.dtype == torch.bool:
            self.holds.add_(slots, alpha=delta)
        else:
            self.holds.index_add_(0, slots.to(self.device), self.holds.new_full((1,), delta).expand(slots.numel()))

    def release(self, lookup: Lookup) -> None:
        super().release(lookup)
        if lookup.scratch is not None:
            lookup.scratch.region[2] = False
            lookup.scratch = None

    # ------------------------------------------------------------------ validation
    def _peek(self, ids: torch.Tensor, segments: list[list[int]] | None) -> Lookup:
        """A frozen cache's lookup: resident rows where they are, the others read from the
        host store into rows beside the working table for this forward alone."""
        flat = self._on_device(ids)
        n = flat.numel()
        slots = self._pad["id_to_slot"].index_select(0, flat)
        hit = slots >= 0
        side = self.link.read_new(flat, ~hit)["weight"]
        indices = pick(hit, slots, self.working_table().shape[0] + torch.arange(n, device=self.device))
        sid, perm = torch.sort(flat)
        first = torch.ones(n, dtype=torch.bool, device=self.device)
        first[1:] = sid[1:] != sid[:-1]
        hit_sorted = hit.index_select(0, perm)
        misses = (first & ~hit_sorted).sum()
        self._count(hits=(first & hit_sorted).sum(), misses=misses, overflow_rows=misses,
                    bytes_h2d=misses * self._row_bytes)
        self._stats.batches += 1
        return Lookup(indices.view(ids.shape), Overflow(flat, side, {}, flat), None, None, segments)

    def warm_up(self, ids_freq: torch.Tensor, warmup_ratio: float) -> int:
        """As `RowCache.warm_up`. At construction the free slots are every slot in order,
        known without asking the device (so a cache on `meta` warms up too)."""
        if not self._fresh:
            return super().warm_up(ids_freq, warmup_ratio)
        k = min(self.num_slots, int(warmup_ratio * self.num_slots))
        if k <= 0:
            return 0
        counts, hot = torch.topk(ids_freq.to(torch.float64).cpu(), k)
        hot = hot[counts > 0]
        target = torch.arange(hot.numel(), device=self.device)
        hot = hot.to(self.device)
        self._load(hot, target, count_bytes=False)
        self.slots.assign(hot, target)
        self.policy.on_admit(hot, target)
        self._fresh = False
        return hot.numel()

    # ------------------------------------------------------------------ rows in and out, whole lists
    def _load(self, ids: torch.Tensor, target: torch.Tensor, count_bytes: bool = True) -> None:
        """Host rows `ids` into slots `target` (exact lists: warm-up, a restored residency)."""
        if ids.numel() == 0:
            return
        ids, target = ids.to(self.device), target.to(self.device)
        self.link.read(ids, target, torch.ones_like(ids, dtype=torch.bool), self._work, self._trash_row())
        self.dirty.index_fill_(0, target, False)
        if count_bytes:
            self._count(bytes_h2d=torch.tensor(ids.numel() * self._row_bytes, device=self.device))

    def sync_host(self) -> torch.Tensor:
        if self.device.type == "cuda":  # the device's own writes into the store land first
            torch.cuda.synchronize(self.device)
        return super().sync_host()

    def _clear_cache(self) -> None:
        super()._clear_cache()
        for region in self._regions:
            region[2] = False

    def _held_slots(self, p: Prefetched) -> torch.Tensor:
        return torch.nonzero(p.held).flatten()

    def _held_from_slots(self, slots: torch.Tensor) -> torch.Tensor:
        mask = torch.zeros(self.num_slots, dtype=torch.bool, device=self.device)
        mask[slots.to(self.device)] = True
        return mask

    # ------------------------------------------------------------------ open tables: host bookkeeping
    def _open_tables_refused(self, *_, **__):
        raise ValueError("open tables keep the host bookkeeper (their key index lives on the host): "
                         "give bookkeeping='host'")

    grow = reset_rows = held_rows = set_prior = _open_tables_refused
