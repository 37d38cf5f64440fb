"""The bookkeeping of one batch's admission in one compiled pass (CPU, numba).

`RowCache._admit` states the algorithm as batched tensor work: about forty tensor ops a
batch, each a full pass over the batch's ids or over every slot (bincount, nonzero,
unique, where, kthvalue, topk, index_fill_, ...). On the CPU each op costs its own pass
over memory and its own dispatch, and together they made a cached step 1.4-1.8x an
uncached one. Here the same decisions are made in a few loops: one over the ids (slot
lookup, distinct touched slots, distinct missing ids, deduplicated through the id->slot
table itself), one over the slots when victims are needed, and loops over the few
admitted and evicted rows. Moving rows between host store and cache stays with the
caller (the host store's backing and row dtype are its business).

The result is the tensor path's, decision for decision: the same hits and misses, the
same victims in the same order (the `k` smallest keys, ties to the lower slot, ascending:
`eviction.select_victims`), the same slots for the same ids, the same policy counters.
tests/test_cache_fused.py replays traces through both and compares every map and counter.
"""
from __future__ import annotations

import numba
import numpy as np
import torch
from numba import prange

from cpu_kernels.intrinsics import atomic_min, prefetch_entry
from embcache.cache.bookkeeping._radix import stable_order_f64, stable_order_i64
from embcache.cache.bookkeeping.eviction import _SAMPLE_SIZE, _SAMPLED_MIN_SLOTS

NO_OWNER = np.iinfo(np.int32).max  # an `owner` entry between passes
_MIN_CHUNK = 1 << 13  # lookups per unit of parallel work, at least
# the lookup asks for the id->slot entry of the id this many places ahead: the table is
# 8 bytes a row of the whole id space (270 MB at Kaggle scale), so most reads miss every
# cache, and the core alone overlaps too few of them (measured on 426 k Zipf ids of 33.8 M
# rows: a gather 2.2x faster at 64 ahead, 1.7x at 32, slower at 8)
_LOOKAHEAD = 64

_NO_PRIOR = np.zeros(0, dtype=np.float64)
_NO_COUNT = np.zeros(0, dtype=np.int32)


def counts_of(id_count: torch.Tensor | None) -> np.ndarray:
    """The policy's per-id online counts as the kernel takes them (empty: none kept)."""
    return _NO_COUNT if id_count is None else id_count.numpy()


def prior_of(prior: torch.Tensor | None) -> np.ndarray:
    return _NO_PRIOR if prior is None else prior.numpy()


def lookup_chunk(n: int, threads: int) -> int:
    """Lookups per unit of parallel work: a few units a thread, none too small. Any chunk
    gives the same result (tests use tiny ones)."""
    return max(_MIN_CHUNK, -(-n // (4 * threads)))


def new_owner(num_slots: int) -> np.ndarray:
    """The per-slot scratch array `admit` needs (it leaves it as it found it)."""
    return np.full(num_slots, NO_OWNER, dtype=np.int32)


@numba.njit(parallel=True, cache=True, nogil=True)
def _lookup_hits(ids, id_to_slot, owner, mark, epoch, out, chunk, touched, absent_pos, n_chunks):
    """The parallel part of the lookup: every id's slot (-1 if absent); the distinct
    resident slots touched, in the order of their first lookup (marked with `epoch`); the
    positions of the absent lookups, in order.

    Distinct without a lock: each touched slot is claimed by the first chunk of lookups
    that holds it (an atomic minimum of chunk numbers in `owner`), and that chunk lists it
    at its first lookup there, so the chunks' lists, one after the other, are the
    first-seen order of a serial pass. Returns per chunk the number of touched slots and
    of absent lookups; the lists are at the start of each chunk's span of `touched` and
    `absent_pos`."""
    n = ids.shape[0]
    counts = np.zeros((n_chunks, 2), dtype=np.int64)
    for c in prange(n_chunks):
        stop = min(n, (c + 1) * chunk)
        for i in range(c * chunk, stop):
            if i + _LOOKAHEAD < stop:
                prefetch_entry(id_to_slot, ids[i + _LOOKAHEAD])
            s = id_to_slot[ids[i]]
            out[i] = s
            if s >= 0 and owner[s] > c:  # most lookups of a hot row find it claimed already
                atomic_min(owner, s, c)
    for c in prange(n_chunks):
        lo = c * chunk
        n_touched, n_absent = 0, 0
        for i in range(lo, min(n, lo + chunk)):
            s = out[i]
            if s < 0:
                absent_pos[lo + n_absent] = i
                n_absent += 1
            elif owner[s] == c:
                owner[s] = NO_OWNER
                mark[s] = epoch
                touched[lo + n_touched] = s
                n_touched += 1
        counts[c, 0] = n_touched
        counts[c, 1] = n_absent
    return counts


@numba.njit(parallel=True, cache=True, nogil=True)
def _compact(parts, counts, chunk, out):
    """Chunk c's first `counts[c]` entries of `parts` (at `c * chunk`), all in chunk order."""
    starts = np.zeros(counts.shape[0] + 1, dtype=np.int64)
    for c in range(counts.shape[0]):
        starts[c + 1] = starts[c] + counts[c]
    for c in prange(counts.shape[0]):
        for k in range(counts[c]):
            out[starts[c] + k] = parts[c * chunk + k]
    return starts[-1]


@numba.njit(cache=True, nogil=True)
def _lookup(ids, id_to_slot, owner, mark, epoch, out, touched, absent_pos, absent_code, missing, chunk):
    """Slot of every id (-1 if absent); the distinct resident slots touched, in the order
    of their first lookup (marked with `epoch`); the distinct missing ids in first-seen
    order, each absent position tagged with its missing index. The resident lookups are
    parallel (`_lookup_hits`); the absent ones, few once the cache is warm, are
    deduplicated serially through `id_to_slot` itself: a missing id is tagged there as
    -2 - j while the pass runs (no sort, no hash table) and reset to -1 after."""
    n = ids.shape[0]
    n_chunks = (n + chunk - 1) // chunk
    scratch = np.empty(n, dtype=np.int64)
    counts = _lookup_hits(ids, id_to_slot, owner, mark, epoch, out, chunk, scratch, absent_pos, n_chunks)
    n_touched = _compact(scratch, counts[:, 0].copy(), chunk, touched)
    n_absent = _compact(absent_pos, counts[:, 1].copy(), chunk, scratch)
    n_missing = 0
    for a in range(n_absent):
        i = scratch[a]
        absent_pos[a] = i
        s = id_to_slot[ids[i]]
        if s == -1:
            s = -2 - n_missing
            id_to_slot[ids[i]] = s
            missing[n_missing] = ids[i]
            n_missing += 1
        absent_code[a] = -2 - s
    for j in range(n_missing):
        id_to_slot[missing[j]] = -1
    return n_touched, n_absent, n_missing


_SLOT_SPAN = 1 << 16  # slots per unit of parallel work in the passes over every slot


@numba.njit(parallel=True, cache=True, nogil=True)
def _matching_slots(values, bound, limit):
    """The first `limit` slots s (ascending) with `values[s] <= bound` (empty slots: a
    slot_to_id of -1; candidate victims: a key below a threshold). Counted per span of
    slots in parallel, then collected per span in parallel, in order."""
    n = values.shape[0]
    n_spans = (n + _SLOT_SPAN - 1) // _SLOT_SPAN
    counts = np.zeros(n_spans, dtype=np.int64)
    for c in prange(n_spans):
        k = 0
        for s in range(c * _SLOT_SPAN, min(n, (c + 1) * _SLOT_SPAN)):
            if values[s] <= bound:
                k += 1
        counts[c] = k
    total = min(limit, counts.sum())
    out = np.empty(total, dtype=np.int64)
    starts = np.zeros(n_spans + 1, dtype=np.int64)
    for c in range(n_spans):
        starts[c + 1] = starts[c] + counts[c]
    for c in prange(n_spans):
        k = starts[c]
        if k >= total:
            continue
        for s in range(c * _SLOT_SPAN, min(n, (c + 1) * _SLOT_SPAN)):
            if k >= total:
                break
            if values[s] <= bound:
                out[k] = s
                k += 1
    return out


@numba.njit(cache=True, nogil=True)
def _free_slots(slot_to_id, limit):
    """The `limit` lowest empty slots (fewer if fewer are empty)."""
    if limit <= 0:
        return np.empty(0, dtype=np.int64)
    return _matching_slots(slot_to_id, -1, limit)


@numba.njit(cache=True, nogil=True)
def _slot_key(slot_primary, slot_last, s, denom):
    """A resident slot's eviction key, as `EvictionPolicy.keys` computes it."""
    return slot_primary[s] + slot_last[s] / denom


@numba.njit(parallel=True, cache=True, nogil=True)
def _eviction_keys(slot_to_id, holds, mark, epoch, slot_primary, slot_last, clock, keys):
    """Every slot's key (inf where it may not be evicted); returns how many may be."""
    denom = float(clock + 1)
    evictable = 0
    for s in prange(slot_to_id.shape[0]):
        if slot_to_id[s] >= 0 and holds[s] == 0 and mark[s] != epoch:
            keys[s] = _slot_key(slot_primary, slot_last, s, denom)
            evictable += 1
        else:
            keys[s] = np.inf
    return evictable


@numba.njit(cache=True, nogil=True)
def _victims(k, slot_to_id, holds, mark, epoch, slot_primary, slot_last, clock):
    """The `k` evictable slots with the smallest keys (ties: lower slot first), in
    ascending (key, slot) order; fewer if fewer are evictable. As `select_victims`, a
    threshold read off a strided sample narrows the sort to the keys below it when that
    still leaves k of them. (One pass that computes each key and collects those below
    the threshold at once measured 2-5x slower than these two branch-free passes.)"""
    n = slot_to_id.shape[0]
    keys = np.empty(n, dtype=np.float64)
    evictable = _eviction_keys(slot_to_id, holds, mark, epoch, slot_primary, slot_last, clock, keys)
    k = min(k, evictable)
    if k <= 0:
        return np.empty(0, dtype=np.int64)
    if n >= _SAMPLED_MIN_SLOTS and k * 8 <= n:
        sample = keys[:: max(1, n // _SAMPLE_SIZE)].copy()
        rank = min(sample.shape[0], 2 * int(np.ceil(k * sample.shape[0] / n)) + 8)
        threshold = np.partition(sample, rank - 1)[rank - 1]
        below = _matching_slots(keys, threshold, n)
        if below.shape[0] >= k:
            return below[stable_order_f64(keys[below])[:k]]
    return stable_order_f64(keys)[:k]


@numba.njit(parallel=True, cache=True, nogil=True)
def _counts(ids, id_count, prior, prior_weight):
    """A missing id's primary key outside the cache: online count (+ weighted prior)."""
    out = np.empty(ids.shape[0], dtype=np.float64)
    for j in prange(ids.shape[0]):
        c = float(id_count[ids[j]])
        if prior.shape[0]:
            c = c + prior[ids[j]] * prior_weight
        out[j] = c
    return out


@numba.njit(cache=True, nogil=True)
def _admissions(missing, victims, n_free, id_count, prior, prior_weight, clock, slot_primary, slot_last):
    """Admission control, as `EvictionPolicy.admissions`: `missing` hottest first
    (stable), the permutation applied, and how many victims are worth evicting (the
    contenders beyond the free slots that are hotter than the victim they face)."""
    keys = _counts(missing, id_count, prior, prior_weight) + 1.0 + clock / (clock + 1.0)
    order = stable_order_f64(-keys)
    keys = keys[order]
    denom = float(clock + 1)
    wins = 0
    for v in range(min(victims.shape[0], keys.shape[0] - n_free)):
        s = victims[v]
        if keys[n_free + v] > _slot_key(slot_primary, slot_last, s, denom):
            wins += 1
    return missing[order], order, wins


@numba.njit(cache=True, nogil=True)
def _inverse(order):
    inv = np.empty_like(order)
    for r in range(order.shape[0]):
        inv[order[r]] = r
    return inv


@numba.njit(cache=True, nogil=True)
def admit(ids, id_to_slot, slot_to_id, holds, mark, epoch, slot_primary, slot_last, id_count, prior,
          prior_weight, clock, admission, serve_overflow, owner, chunk):
    """One batch's admission decisions, applied to the maps and the policy's counters.

    Returns (per-lookup slots, overflow rows numbered from num_slots on; the distinct slots
    the batch touches; hits; the missing ids in admission order; the victims; the ids they
    held; the target slots, the first `len(target)` missing ids go there; how many missing
    rows admission control declined). The caller moves the rows: victims' dirty rows out,
    then the missing rows into `target`. `owner`: the scratch of `new_owner`; `chunk`:
    lookups per unit of parallel work (`lookup_chunk`)."""
    n, num_slots = ids.shape[0], slot_to_id.shape[0]
    counted = id_count.shape[0] > 0
    out = np.empty(n, dtype=np.int64)
    touched = np.empty(min(n, num_slots), dtype=np.int64)
    absent_pos = np.empty(n, dtype=np.int64)
    where = np.empty(n, dtype=np.int64)
    found = np.empty(n, dtype=np.int64)
    n_touched, n_absent, n_missing = _lookup(ids, id_to_slot, owner, mark, epoch, out, touched, absent_pos, where,
                                             found, chunk)
    hits = n_touched
    order = stable_order_i64(found[:n_missing])
    missing = found[:n_missing][order]
    where = _inverse(order)[where[:n_absent]]
    free = _free_slots(slot_to_id, n_missing)
    victims = np.empty(0, dtype=np.int64)
    if n_missing > free.shape[0]:
        victims = _victims(n_missing - free.shape[0], slot_to_id, holds, mark, epoch, slot_primary, slot_last,
                           clock)
    declined = 0
    if admission and victims.shape[0]:
        missing, order, wins = _admissions(missing, victims, free.shape[0], id_count, prior, prior_weight, clock,
                                           slot_primary, slot_last)
        declined = victims.shape[0] - wins
        victims = victims[:wins]
        where = _inverse(order)[where]
    evicted = _evict(victims, slot_to_id, id_to_slot, slot_primary, id_count, prior, prior_weight)
    target = np.concatenate((free, victims))
    _assign(missing, target, slot_to_id, id_to_slot, slot_primary, slot_last, id_count, prior, prior_weight,
            clock, mark, epoch, touched, n_touched)
    n_touched += target.shape[0]
    new_slot = np.full(n_missing, -1, dtype=np.int64)
    new_slot[: target.shape[0]] = target
    if serve_overflow:
        for j in range(target.shape[0], n_missing):
            new_slot[j] = num_slots + j - target.shape[0]
            if counted:
                id_count[missing[j]] += 1
    _place_absent(out, absent_pos, where, new_slot, n_absent)
    touched = touched[:n_touched]
    touch(touched, slot_primary, slot_last, clock, counted)  # the access itself: recency, one more use
    return out, touched, hits, missing, victims, evicted, target, declined


@numba.njit(parallel=True, cache=True, nogil=True)
def _place_absent(out, absent_pos, where, new_slot, n_absent):
    for a in prange(n_absent):
        out[absent_pos[a]] = new_slot[where[a]]


@numba.njit(parallel=True, cache=True, nogil=True)
def hold(holds, slots, delta):
    """`holds[s] += delta` for distinct `slots` (as `RowCache._hold`)."""
    for k in prange(slots.shape[0]):
        holds[slots[k]] += delta


@numba.njit(parallel=True, cache=True, nogil=True)
def touch(slots, slot_primary, slot_last, clock, counted):
    """Record one batch's use of distinct resident `slots` (as `EvictionPolicy.on_access`)."""
    for k in prange(slots.shape[0]):
        s = slots[k]
        slot_last[s] = clock
        if counted:
            slot_primary[s] += 1.0


@numba.njit(parallel=True, cache=True, nogil=True)
def _evict(victims, slot_to_id, id_to_slot, slot_primary, id_count, prior, prior_weight):
    """Empty the victims' slots, keeping their ids' online counts (as `on_evict`). The
    victims are distinct slots holding distinct ids, so they go in parallel."""
    evicted = np.empty(victims.shape[0], dtype=np.int64)
    for v in prange(victims.shape[0]):
        s = victims[v]
        i = slot_to_id[s]
        evicted[v] = i
        if id_count.shape[0]:
            count = slot_primary[s]
            if prior.shape[0]:
                count = count - prior[i] * prior_weight
            id_count[i] = np.int32(np.rint(count))
        id_to_slot[i] = -1
        slot_to_id[s] = -1
    return evicted


@numba.njit(parallel=True, cache=True, nogil=True)
def _assign(missing, target, slot_to_id, id_to_slot, slot_primary, slot_last, id_count, prior, prior_weight,
            clock, mark, epoch, touched, n_touched):
    """Place the first `len(target)` missing ids, as `SlotMap.assign` + `on_admit`, and
    add their slots to `touched` after its first `n_touched`. Distinct ids into distinct
    slots: in parallel."""
    placed = missing[: target.shape[0]]
    primary = _counts(placed, id_count, prior, prior_weight) if id_count.shape[0] else \
        np.zeros(placed.shape[0], dtype=np.float64)
    for j in prange(target.shape[0]):
        s, i = target[j], placed[j]
        slot_to_id[s] = i
        id_to_slot[i] = s
        slot_last[s] = clock
        slot_primary[s] = primary[j]
        mark[s] = epoch
        touched[n_touched + j] = s
