"""Which resident entries to give up when new ones must come in.

Each policy keeps one float64 key per slot; the victims are the slots with the smallest
keys among those not protected (protected = needed by the batch in flight). Keys break
ties by recency: a key is `primary + last_use / (clock + 1)`, so of two equally frequent
entries the one used longer ago goes first.

- `lru`: primary = 0 (recency alone).
- `lfu`: primary = online access count of the id (kept per id, so it survives eviction).
- `freq`: primary = the id's frequency in the training data (`ids_freq`) + the online count.

Counts are per batch: an id used five times in one batch counts once.

Admission control (`freq` and `lfu` with `admission=True`; off by default, see docs/cache.md's
cache benchmark): a missed row is admitted only if its key is above the key of the slot it
would take; a colder one is served beside the cache for that step (the cache's exact
overflow path, counted as `bypassed_rows`) and its access is counted, so it gets in once it
has earned it. Without it every miss evicts someone, and a stream of one-off ids keeps
displacing rows that will be used again: where a batch needs more rows than the cache
holds, that is most of the hit rate. (`lru` admits everything: a new row is by definition
the most recent.)

Aging (`half_life`, in batches; off by default): every `half_life` batches all counts,
the prior's weight included, are halved, so what was hot long ago fades and a hot set
that drifts (click logs change from day to day) is followed.

Gathers and scatters use `index_select` / `index_fill_` / `index_copy_` rather than
`t[idx]` indexing: the same result, several times cheaper per call on the CPU.
"""
from __future__ import annotations

import math

import torch

from embcache.cache.choices import POLICIES

# victim selection reads a threshold off a sample of this size once the cache has this many slots
_SAMPLE_SIZE = 4096
_SAMPLED_MIN_SLOTS = 8192


class EvictionPolicy:
    """Per-slot eviction keys for a working set of `num_slots` slots over `num_ids` ids.

    One small class a policy (`LRU`, `LFU`, `Freq`), each saying what its keys are made of:
    whether it counts uses per id (`counts_uses`) and takes the data's counts as a prior
    (`takes_prior`). `EvictionPolicy(kind, ...)` builds the one named; both bookkeepers read
    the same keys off it (`keys`, `candidate_keys`, the per-slot and per-id arrays), and a
    checkpoint names it (`kind`).

    Counts are kept per slot while an id is resident (hits touch only small per-slot
    arrays) and written to the per-id table when it leaves, so a returning id resumes its
    count: `on_evict` must be called before a slot is emptied.

    Args:
        kind: "freq" | "lfu" | "lru".
        num_ids, num_slots: sizes of the id space and of the working set.
        ids_freq: per-id prior counts (used by `freq`; zeros when absent).
        device: where the per-slot (and per-id count) tensors live.
    """

    kind = ""
    counts_uses = False  # a per-id online count, kept across evictions (lfu, freq)
    takes_prior = False  # the data's counts add to the keys (freq)
    _kinds: dict[str, type] = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        EvictionPolicy._kinds[cls.kind] = cls

    def __new__(cls, kind: str = "", *args, **kwargs):
        if cls is EvictionPolicy:
            if kind not in POLICIES:
                raise ValueError(f"eviction must be one of {POLICIES}, got {kind!r}")
            cls = EvictionPolicy._kinds[kind]
        return super().__new__(cls)

    def __init__(self, kind: str, num_ids: int, num_slots: int,
                 ids_freq: torch.Tensor | None = None, device: torch.device | str = "cpu",
                 admission: bool = False, half_life: int | None = None):
        self.admission = bool(admission) and self.counts_uses
        self.half_life = int(half_life) if half_life else None
        self.prior_weight = 1.0  # halved with the counts when aging
        self.clock = 0  # advanced once per batch by `tick`
        self.slot_last = torch.zeros(num_slots, dtype=torch.float64, device=device)
        self.slot_primary = torch.zeros(num_slots, dtype=torch.float64, device=device)
        self.id_count = None
        self.prior = None
        if self.counts_uses:
            self.id_count = torch.zeros(num_ids, dtype=torch.int32, device=device)
        if self.takes_prior and ids_freq is not None:
            self.prior = ids_freq.to(device=device, dtype=torch.float64)

    def grow(self, num_ids: int) -> None:
        """More ids (an open table's new rows), never seen: no count, no prior."""
        if self.id_count is not None and num_ids > self.id_count.numel():
            self.id_count = torch.cat([self.id_count, self.id_count.new_zeros(num_ids - self.id_count.numel())])
        if self.prior is not None and num_ids > self.prior.numel():
            self.prior = torch.cat([self.prior, self.prior.new_zeros(num_ids - self.prior.numel())])

    def forget(self, ids: torch.Tensor) -> None:
        """Ids given to new keys (an open table's reused rows): their counts start again."""
        if self.id_count is not None:
            self.id_count.index_fill_(0, ids.to(self.id_count.device), 0)
        if self.prior is not None:
            self.prior.index_fill_(0, ids.to(self.prior.device), 0)

    def set_prior(self, ids: torch.Tensor, counts: torch.Tensor) -> None:
        """The prior counts of `ids` (an open table's rows, each given its key's count when a
        key takes it, since its ids are only known as keys arrive). `freq` alone has a
        prior; the first one given starts every other id at 0, which adds nothing to its
        keys, so a table without counts decides as before. Set for rows not resident with
        a live key (an open table's rows just reset, or retired, whose counts start again
        when a key takes them): a resident row's count is kept against its prior when it
        leaves."""
        if not self.takes_prior or ids.numel() == 0:
            return
        if self.prior is None:
            self.prior = torch.zeros(self.id_count.numel(), dtype=torch.float64, device=self.id_count.device)
        self.prior.index_copy_(0, ids.to(self.prior.device), counts.to(self.prior))

    def tick(self) -> int:
        self.clock += 1
        if self.half_life and self.id_count is not None and self.clock % self.half_life == 0:
            self.id_count.bitwise_right_shift_(1)
            self.slot_primary.mul_(0.5)
            self.prior_weight *= 0.5
        return self.clock

    def _prior(self, ids: torch.Tensor, prior: torch.Tensor | None = None) -> torch.Tensor:
        """The weighted prior of `ids`, from the policy's array or `prior` (the device
        bookkeeper's, a trash entry longer)."""
        return (self.prior if prior is None else prior).index_select(0, ids) * self.prior_weight

    def _counts(self, ids: torch.Tensor, id_count: torch.Tensor | None = None,
                prior: torch.Tensor | None = None) -> torch.Tensor:
        """The primary key of `ids` outside the cache: online count (+ weighted prior), from
        the policy's arrays or the ones given (as `_prior`)."""
        primary = (self.id_count if id_count is None else id_count).index_select(0, ids).to(torch.float64)
        return primary + self._prior(ids, prior) if self.prior is not None else primary

    def on_access(self, ids: torch.Tensor, slots: torch.Tensor) -> None:
        """Record one batch's use of distinct resident slots (`ids` are their ids)."""
        self.slot_last.index_fill_(0, slots, float(self.clock))
        if self.id_count is not None:
            self.slot_primary.index_add_(0, slots, self.slot_primary.new_ones(1).expand(slots.numel()))

    def on_admit(self, ids: torch.Tensor, slots: torch.Tensor) -> None:
        """New `ids` entered `slots` (their access is recorded by `on_access`)."""
        self.slot_last.index_fill_(0, slots, float(self.clock))
        if self.id_count is None:
            self.slot_primary.index_fill_(0, slots, 0.0)
            return
        self.slot_primary.index_copy_(0, slots, self._counts(ids))

    def on_evict(self, ids: torch.Tensor, slots: torch.Tensor) -> None:
        """`ids` are about to leave `slots`: keep their online counts."""
        if self.id_count is None or ids.numel() == 0:
            return
        count = self.slot_primary.index_select(0, slots)
        if self.prior is not None:
            count = count - self._prior(ids)
        self.id_count.index_copy_(0, ids, count.round().to(torch.int32))

    def keys(self, clock: torch.Tensor | None = None) -> torch.Tensor:
        """Each slot's eviction key at the policy's clock, or at `clock` (the device
        bookkeeper's copy of it, a 0-d tensor: the same value, not a host number)."""
        return self.slot_primary + self.slot_last / ((self.clock if clock is None else clock) + 1)

    def candidate_keys(self, ids: torch.Tensor, clock: torch.Tensor | None = None, **arrays) -> torch.Tensor:
        """The keys absent `ids` would have once admitted and counted (this use included);
        `clock` and `arrays` (`id_count`, `prior`) as `keys` and `_counts` take them."""
        clock = self.clock if clock is None else clock
        return self._counts(ids, **arrays) + 1 + clock / (clock + 1)

    def on_bypass(self, ids: torch.Tensor) -> None:
        """`ids` were used this batch without being admitted: count the use."""
        if self.id_count is not None and ids.numel():
            self.id_count.index_add_(0, ids, self.id_count.new_ones(1).expand(ids.numel()))

    def admissions(self, missing: torch.Tensor, victims: torch.Tensor, free: int):
        """Which of the `missing` ids get in: returns (`missing` reordered hottest first,
        the permutation applied, the victims actually worth evicting). The `free` hottest
        take free slots; the next ones each face one victim, coldest victim first, and get
        in only if hotter. Missing ids descend and victims ascend, so the admitted ones are
        a prefix."""
        keys = self.candidate_keys(missing)
        order = torch.argsort(keys, descending=True, stable=True)
        keys, missing = keys.index_select(0, order), missing.index_select(0, order)
        vkeys = self.keys().index_select(0, victims)
        vorder = torch.argsort(vkeys, stable=True)
        victims, vkeys = victims.index_select(0, vorder), vkeys.index_select(0, vorder)
        contenders = keys[free: free + victims.numel()]
        wins = int((contenders > vkeys[: contenders.numel()]).sum())
        return missing, order, victims[:wins]

    def select_victims(self, k: int, protected: torch.Tensor, occupied: torch.Tensor) -> torch.Tensor:
        """The `k` occupied, unprotected slots to evict (fewer if fewer exist)."""
        return select_victims(self.keys(), k, occupied & ~protected)

    def state_dict(self) -> dict:
        state = {"kind": self.kind, "clock": self.clock, "slot_last": self.slot_last.cpu().clone(),
                 "slot_primary": self.slot_primary.cpu().clone(), "prior_weight": self.prior_weight}
        if self.id_count is not None:
            state["id_count"] = self.id_count.cpu().clone()
        return state

    def load_state_dict(self, state: dict) -> None:
        if state["kind"] != self.kind:
            raise ValueError(f"checkpoint used eviction {state['kind']!r}, this cache {self.kind!r}")
        self.clock = int(state["clock"])
        self.prior_weight = float(state.get("prior_weight", 1.0))
        self.slot_last.copy_(state["slot_last"])
        self.slot_primary.copy_(state["slot_primary"])
        if self.id_count is not None:
            self.id_count.copy_(state["id_count"])


class LRU(EvictionPolicy):
    """Recency alone (a new row is the most recent: admission control has nothing to compare)."""

    kind = "lru"


class LFU(EvictionPolicy):
    """Uses counted per id (kept when a row leaves), recency breaking ties."""

    kind = "lfu"
    counts_uses = True


class Freq(EvictionPolicy):
    """The id's count in the training data plus its uses so far, recency breaking ties."""

    kind = "freq"
    counts_uses = True
    takes_prior = True


def select_victims(keys: torch.Tensor, k: int, candidates: torch.Tensor) -> torch.Tensor:
    """Indices of the `k` smallest `keys` among `candidates` (a boolean mask), fewer if
    fewer candidates exist, in ascending order of (key, index): ties go to the lower
    index, so the choice is one answer, whatever the device or the kernel computing it
    (the compiled CPU pass in `fused_admission` makes the same).

    When k is small against the cache, a threshold is read off a strided sample of the
    keys (about twice the expected k-th smallest) and the sort runs only on the keys at or
    below it: if at least k keys are there, the k smallest of all are among them, so the
    answer is the same as sorting every slot, at a fraction of the cost. Otherwise every
    key is sorted."""
    k = min(int(k), int(candidates.sum()))
    if k <= 0:
        return torch.empty(0, dtype=torch.long, device=keys.device)
    masked = torch.where(candidates, keys, torch.full_like(keys, float("inf")))
    n = masked.numel()
    if n >= _SAMPLED_MIN_SLOTS and k * 8 <= n:
        sample = masked[:: max(1, n // _SAMPLE_SIZE)]
        rank = min(sample.numel(), 2 * math.ceil(k * sample.numel() / n) + 8)
        threshold = torch.kthvalue(sample, rank).values
        below = torch.nonzero(masked <= threshold).flatten()
        if below.numel() >= k:
            return below.index_select(0, torch.sort(masked.index_select(0, below), stable=True).indices[:k])
    return torch.sort(masked, stable=True).indices[:k]
