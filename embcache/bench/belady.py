"""Belady's offline optimum for a batched cache: the ceiling the online policies are
measured against. With the whole trace known, evict the resident rows whose next use is
farthest away (never one the current batch needs). Counts hits and misses like the real
cache: unique rows per batch. Built on the same SlotMap and victim selection."""
from __future__ import annotations

import torch

from embcache.cache.bookkeeping.eviction import select_victims
from embcache.cache.bookkeeping.slot_map import SlotMap

NEVER = float("inf")


def next_uses(uniques: list[torch.Tensor]) -> list[torch.Tensor]:
    """For each batch's unique ids, the index of the next batch that uses each id."""
    ids = torch.cat(uniques)
    when = torch.cat([torch.full((u.numel(),), t, dtype=torch.float64) for t, u in enumerate(uniques)])
    order = torch.argsort(ids * len(uniques) + when.long(), stable=True)
    sorted_ids, sorted_when = ids[order], when[order]
    nxt = torch.full_like(sorted_when, NEVER)
    same = sorted_ids[1:] == sorted_ids[:-1]
    nxt[:-1][same] = sorted_when[1:][same]
    out = torch.empty_like(nxt)
    out[order] = nxt
    return list(torch.split(out, [u.numel() for u in uniques]))


def belady_hit_rate(batches: list[torch.Tensor], num_rows: int, cache_rows: int,
                    skip: int = 0, initial: torch.Tensor | None = None, bypass: bool = False) -> dict:
    """Simulate Belady on `batches` of ids, starting with `initial` ids resident (the
    warm-up the online policies get); statistics from batch `skip` on.

    `bypass`: a missed row may be served without being admitted (as the cache's overflow
    path serves it), so a row is admitted only if its next use comes before that of the
    row it would evict, and a row never used again is not admitted at all: the optimum
    for a cache with admission control."""
    uniques = [torch.unique(b) for b in batches]
    nexts = next_uses(uniques)
    slots = SlotMap(num_rows, cache_rows)
    slot_next = torch.full((cache_rows,), NEVER, dtype=torch.float64)
    if initial is not None and initial.numel():
        slots.assign(initial, torch.arange(initial.numel()))
        first_use = {}
        for t, u in reversed(list(enumerate(uniques))):
            first_use.update(dict.fromkeys(u.tolist(), t))
        slot_next[: initial.numel()] = torch.tensor(
            [first_use.get(i, NEVER) for i in initial.tolist()], dtype=torch.float64)
    hits = misses = 0
    for t, (ids, nxt) in enumerate(zip(uniques, nexts)):
        where = slots.lookup(ids)
        present = where >= 0
        slot_next[where[present]] = nxt[present]
        missing, missing_next = ids[~present], nxt[~present]
        if t >= skip:
            hits += int(present.sum())
            misses += missing.numel()
        if missing.numel() == 0:
            continue
        # admit the missing rows used soonest first, in case not all fit
        order = torch.argsort(missing_next)
        missing, missing_next = missing[order], missing_next[order]
        needed = torch.zeros(cache_rows, dtype=torch.bool)
        needed[where[present]] = True
        free = slots.free_slots(missing.numel())
        # farthest next use first: the smallest key is the largest next use
        victims = select_victims(-slot_next, missing.numel() - free.numel(), slots.occupied() & ~needed)
        if bypass:
            victims, free, missing, missing_next = _worth_admitting(victims, free, missing, missing_next, slot_next)
        slots.release(victims)
        target = torch.cat([free, victims])
        take = min(target.numel(), missing.numel())
        slots.assign(missing[:take], target[:take])
        slot_next[target[:take]] = missing_next[:take]
    total = hits + misses
    return {"hits": hits, "misses": misses, "hit_rate": hits / total if total else 0.0}


def _worth_admitting(victims, free, missing, missing_next, slot_next):
    """With bypass: rows never used again stay out; of the rest (soonest first), the first
    take the free slots and each next one replaces the victim used latest only if it is
    used sooner than that victim."""
    used_again = missing_next < NEVER
    missing, missing_next = missing[used_again], missing_next[used_again]
    free = free[: missing.numel()]
    victims = victims[torch.argsort(slot_next[victims], descending=True)]
    contenders = missing_next[free.numel(): free.numel() + victims.numel()]
    wins = int((contenders < slot_next[victims][: contenders.numel()]).sum())
    return victims[:wins], free, missing, missing_next
