"""A `RowCache`'s persistence: its state dict, its checkpoint files, and the checks that
refuse a checkpoint before anything changes.

Kept apart from the engine (`row_cache.py`: lookup, admission, gradients, updates) so
that the hot path reads in one file. `RowCacheState` is a mixin: its methods use the
engine's attributes (`host`, `slots`, `policy`, `dirty`, `holds`, `transfers`, `stats`,
`step`, `book`, `_prefetched`) and a few of its methods (`sync_host`, `drop_prefetches`,
`_load`, `_hold`), and nothing else. The format is the one every earlier
checkpoint has: nothing here changed it.
"""
from __future__ import annotations

import os
import pickle
from pathlib import Path

import torch

from embcache.errors import CheckpointError, first_line, writing
from embcache.integrity import load_torch, save_torch

from embcache.cache.bookkeeping.eviction import POLICIES
from embcache.cache.bookkeeping.lookup import Prefetched
from embcache.cache.stats import check_stats_tensor
from embcache.cache.stores.table_files import fresh_directory

CACHE_FILE = "cache.pt"  # beside the table files of a `save_checkpoint`


def name_tensor(name: str) -> torch.Tensor:
    """A name as a checkpoint keeps it: its UTF-8 bytes (a state dict holds tensors)."""
    return torch.tensor(list(name.encode()), dtype=torch.uint8)


def tensor_name(t: torch.Tensor) -> str:
    return bytes(t.tolist()).decode()


def policy_name(saved: torch.Tensor) -> str:
    """The eviction policy a checkpoint names: by name, or (checkpoints before names) by
    its index in the list of policies of the time, which is still `POLICIES`' order."""
    if saved.dtype == torch.uint8 and saved.dim() == 1:
        name = tensor_name(saved)
        if name not in POLICIES:
            raise ValueError(f"checkpoint names eviction policy {name!r}, not one of {POLICIES}")
        return name
    index = int(saved)
    if not 0 <= index < len(POLICIES):
        raise ValueError(f"checkpoint's eviction policy index {index} is out of range")
    return POLICIES[index]


class RowCacheState:
    """State dicts and checkpoints of a `RowCache` (see the module docstring)."""

    def state_dict(self) -> dict:
        """The full table in id order with its optimizer state, plus what makes a resumed
        run continue exactly: step count, residency and dirty bits, policy, statistics
        and the prefetches not yet consumed. Taking it changes nothing.

        The tables are the live host store, not copies (a mapped store's are views of its
        files): save them at once (`torch.save` copies), or use `save_checkpoint`, which
        copies them file by file and needs no memory for a table larger than RAM."""
        self.sync_host()
        return {**self.host.tensors(), **self._cache_state()}

    def _cache_state(self) -> dict:
        """Everything of `state_dict` but the tables (the store must be current)."""
        pending = list(self._prefetched)
        held = [self._held_slots(p).cpu() for p in pending]
        return {
            "step": torch.tensor(self.step),
            "slot_to_id": self.slots.slot_to_id.cpu().clone(),
            "dirty": self.dirty.cpu().clone(),
            "stats": self.stats.to_tensor(),
            "prefetch.ids": torch.cat([p.ids.cpu() for p in pending]) if pending
            else torch.zeros(0, dtype=torch.long),
            "prefetch.sizes": torch.tensor([p.ids.numel() for p in pending], dtype=torch.long),
            "prefetch.counts": torch.tensor([[int(p.hits), int(p.misses)] for p in pending],
                                            dtype=torch.long).reshape(-1, 2),
            # the slots each prefetch holds: not every resident row of its batch (a row
            # admitted after the prefetch, by a later batch, is not held for it)
            "prefetch.held": torch.cat(held) if pending else torch.zeros(0, dtype=torch.long),
            "prefetch.held_sizes": torch.tensor([h.numel() for h in held], dtype=torch.long),
            **{f"policy.{k}": (name_tensor(v) if k == "kind" else v if torch.is_tensor(v) else torch.tensor(v))
               for k, v in self.policy.state_dict().items()},
            # which bookkeeper wrote it, by name (a checkpoint resumes under either)
            "bookkeeping": name_tensor(self.bookkeeping),
        }

    def save_checkpoint(self, directory: str | os.PathLike) -> None:
        """Write a checkpoint that training on cannot change: every table copied into
        `directory` as a raw file with its CRC-32 (chunk by chunk, whatever the backing,
        so a table larger than memory needs no memory), the rest of `state_dict` as
        `cache.pt`, the header last. It goes to a temporary directory renamed into place,
        so a run killed meanwhile leaves the previous checkpoint whole. Taking it changes
        nothing (as `state_dict`)."""
        with fresh_directory(Path(directory)) as tmp:
            self.write_checkpoint(tmp)

    def write_checkpoint(self, directory: Path) -> None:
        """The files of `save_checkpoint`, into an existing empty `directory` (one of
        several written together, say)."""
        self.sync_host()
        with writing(directory / CACHE_FILE):
            save_torch(self._cache_state(), directory / CACHE_FILE)  # sealed with its CRC-32
        self.host.save_files(directory)  # writes the header last

    def load_checkpoint(self, directory: str | os.PathLike) -> None:
        """Resume from `save_checkpoint`. Checked before anything changes: the header
        names this cache's tables with their shapes and types, every file has the size
        they need and the CRC-32 the header recorded, and `cache.pt` fits this cache
        (CheckpointError naming the file otherwise). Then the tables are read in chunk by
        chunk, overwriting whatever the store holds (rows written after the checkpoint
        included), and the cache state as `load_state_dict` restores it."""
        self.restore_checkpoint(self.check_checkpoint(directory))

    def check_checkpoint(self, directory: str | os.PathLike) -> tuple:
        """The checks of `load_checkpoint`, changing nothing; returns what
        `restore_checkpoint` takes."""
        directory = Path(directory)
        self.host.verify_files(directory)
        path = directory / CACHE_FILE
        try:
            sd = load_torch(path)  # its CRC-32 checked first; plain data only
            policy, same_cache = self._check_state_dict(sd, tables=False)
        except CheckpointError:  # a damaged file, named already
            raise
        except (OSError, RuntimeError, ValueError, KeyError, pickle.UnpicklingError) as err:
            raise CheckpointError(f"{path}: {first_line(err)}") from None
        return directory, sd, policy, same_cache

    def restore_checkpoint(self, checked: tuple) -> None:
        directory, sd, policy, same_cache = checked
        self._clear_cache()
        self.host.load_files(directory)
        self._restore_cache(sd, policy, same_cache)

    def required_keys(self) -> list[str]:
        """The `state_dict` keys a checkpoint must have to be loaded at all (the rest
        restore residency, which a checkpoint of another cache size does not carry, or
        were added by later versions)."""
        return ["weight", *(f"optimizer.{k}" for k in self.host.state), "step", "slot_to_id", "stats",
                "policy.kind", "policy.clock"]

    def _residency_keys(self) -> list[str]:
        """The keys that restore this cache's residency and policy exactly."""
        keys = ["policy.slot_last", "policy.slot_primary"]
        return keys + ["policy.id_count"] if self.policy.id_count is not None else keys

    def load_state_dict(self, sd: dict) -> None:
        """Restore a `state_dict`. Everything is checked before anything changes. A
        checkpoint taken with another cache size or eviction policy still restores the
        table, optimizer state, step and statistics exactly; the cache then starts empty."""
        policy, same_cache = self._check_state_dict(sd)
        # ---- checked: now change
        self._clear_cache()
        for k, v in self.host.tensors().items():
            if sd[k] is not v:  # a state_dict of this very store needs no copy
                v.copy_(sd[k])
        self._restore_cache(sd, policy, same_cache)

    def _clear_cache(self) -> None:
        self.transfers.settle()  # a pending write must not land over the restored tables
        self.drop_prefetches()
        self.holds.zero_()
        self.slots.clear()
        self.dirty.zero_()

    def _restore_cache(self, sd: dict, policy: dict, same_cache: bool) -> None:
        """Step, statistics, and (when they fit) residency, dirty bits and prefetches,
        over tables already in place."""
        self.step = int(sd["step"])
        self.stats.load_tensor(sd["stats"])
        if not same_cache:
            if self.policy.id_count is not None and "policy.id_count" in sd:
                self.policy.id_count.copy_(sd["policy.id_count"])
            self.policy.clock = policy["clock"]
            self.policy.prior_weight = float(policy.get("prior_weight", 1.0))
            return
        self.policy.load_state_dict(policy)
        self.slots.load_state_dict({"slot_to_id": sd["slot_to_id"]})
        occupied = torch.nonzero(self.slots.slot_to_id >= 0).flatten()
        self._load(self.slots.slot_to_id[occupied], occupied, count_bytes=False)
        if "dirty" in sd:
            self.dirty.copy_(sd["dirty"].to(self.book) & (self.slots.slot_to_id >= 0))
        if "prefetch.ids" in sd:
            held = (sd["prefetch.held"], sd["prefetch.held_sizes"]) if "prefetch.held" in sd else None
            self._restore_prefetches(sd["prefetch.ids"], sd["prefetch.sizes"], sd["prefetch.counts"], held)

    def restore_rows(self, weight: torch.Tensor, state: dict[str, torch.Tensor], step: int) -> None:
        """Put a table and its optimizer state in place with the cache empty: how a run
        resumes from rows saved in id order (by another number of processes, say), where
        no residency fits. Shapes and types are checked before anything changes."""
        self.restore_row_parts([(0, weight, state)], step)

    def restore_row_parts(self, parts: list[tuple[int, torch.Tensor, dict[str, torch.Tensor]]], step: int) -> None:
        """`restore_rows` from pieces `(first row, rows, state)` that together cover the
        table once, each copied straight into the store: pieces mapped from files (a
        checkpoint of a table larger than memory) are never gathered into one tensor."""
        covered = 0
        for first, weight, state in sorted(parts, key=lambda p: p[0]):
            if first != covered or weight.dim() != 2 or weight.shape[1] != self.dim:
                raise ValueError(f"rows from {first} of shape {tuple(weight.shape)} do not continue a table of "
                                 f"{(self.num_rows, self.dim)} at row {covered}")
            self._check_saved_rows(weight, state)
            covered += weight.shape[0]
        if covered != self.num_rows:
            raise ValueError(f"table is {covered} rows, this cache's is {(self.num_rows, self.dim)}")

        def write() -> None:
            for first, weight, state in parts:
                self.host.weight[first: first + weight.shape[0]].copy_(weight)
                for k, v in self.host.state.items():
                    v[first: first + weight.shape[0]].copy_(state[k])

        self._replace_rows(write, step)

    def restore_rows_at(self, ids: torch.Tensor, weight: torch.Tensor, state: dict[str, torch.Tensor],
                        step: int) -> None:
        """`restore_row_parts` for rows scattered over the table (an open table's, whose
        rows are not ranges of ids), the cache emptied; the other rows keep their values."""
        if weight.dim() != 2 or weight.shape != (ids.numel(), self.dim):
            raise ValueError(f"rows of shape {tuple(weight.shape)} for {ids.numel()} ids of width {self.dim}")
        self._check_saved_rows(weight, state)

        def write() -> None:
            self.host.weight.index_copy_(0, ids, weight.to(self.host.weight.dtype))
            for k, v in self.host.state.items():
                v.index_copy_(0, ids, state[k].to(v.dtype))

        self._replace_rows(write, step)

    def put_rows(self, pieces: list[tuple[int, torch.Tensor]]) -> None:
        """Rows `(first id, rows)` written over the table, with their optimizer state, the
        other rows, the step and the statistics as they are, and the cache emptied: a state
        dict of torch's form (rows only) loaded into a cache. Checked (place, width, row
        type) before anything changes; whether the rows are finite is the caller's to check
        (`nn.rows_only`, which names each table)."""
        for first, weight in pieces:
            if weight.dim() != 2 or weight.shape[1] != self.dim or not 0 <= first <= self.num_rows - weight.shape[0]:
                raise ValueError(f"rows of shape {tuple(weight.shape)} from id {first} do not fit a table of "
                                 f"{(self.num_rows, self.dim)}")
            self._check_row_dtype(weight)
        self.sync_host()  # resident rows' optimizer state (and the rows not replaced) reach the store first

        def write() -> None:
            for first, weight in pieces:
                self.host.weight[first: first + weight.shape[0]].copy_(weight)

        self._replace_rows(write, self.step)

    def _check_saved_rows(self, weight: torch.Tensor, state: dict[str, torch.Tensor]) -> None:
        """ValueError unless `weight` has this cache's row type and `state` every optimizer
        table of this cache, one row per row of `weight`."""
        self._check_row_dtype(weight)
        for k, v in self.host.state.items():
            if k not in state or tuple(state[k].shape) != (weight.shape[0], v.shape[1]):
                raise ValueError(f"optimizer state {k!r} missing or of another shape (saved with another "
                                 f"optimizer than {self.optimizer.name!r}?)")

    def _replace_rows(self, write, step: int) -> None:
        """Run `write` (which puts checked rows into the host store) with nothing in flight,
        then empty the cache: the restored rows are the store's, none resident or dirty."""
        self.transfers.settle()
        self.drop_prefetches()
        self.holds.zero_()
        write()
        self.step = int(step)
        self.slots.clear()
        self.dirty.zero_()

    def _check_state_dict(self, sd: dict, tables: bool = True) -> tuple[dict, bool]:
        """Raise ValueError for a checkpoint this cache cannot load, so that a failed load
        changes nothing. Returns the policy state and whether the checkpoint's residency
        fits this cache (same number of slots and eviction policy). `tables=False`: the
        tables come apart (`load_checkpoint` verifies their files)."""
        self._check_tables(sd, tables)
        slot_to_id = sd["slot_to_id"]
        policy = {k[len("policy."):]: v for k, v in sd.items() if k.startswith("policy.")}
        policy["clock"] = int(policy["clock"])
        policy["kind"] = policy_name(policy["kind"])
        same_cache = slot_to_id.numel() == self.num_slots and policy["kind"] == self.policy.kind
        if same_cache:
            sizes = {"policy.slot_last": self.num_slots, "policy.slot_primary": self.num_slots,
                     "policy.id_count": self.num_rows, "dirty": self.num_slots}
            for k in self._residency_keys() + (["dirty"] if "dirty" in sd else []):
                if k not in sd:
                    raise ValueError(f"checkpoint lacks {k!r} (its {policy['kind']!r} eviction state)")
                if sd[k].numel() != sizes[k]:
                    raise ValueError(f"checkpoint {k!r} has {sd[k].numel()} entries, this cache's {sizes[k]}")
            resident = slot_to_id[slot_to_id >= 0]
            if bool(((resident < 0) | (resident >= self.num_rows)).any()) or \
                    resident.unique().numel() != resident.numel():
                raise ValueError("checkpoint residency is damaged (ids out of range or held twice)")
            self._check_prefetch_holds(sd)
        return policy, same_cache

    def _check_prefetch_holds(self, sd: dict) -> None:
        """The slots pending prefetches hold: as many as their sizes say, each a slot."""
        if "prefetch.held" not in sd:
            return
        held, sizes = sd["prefetch.held"], sd["prefetch.held_sizes"]
        if int(sizes.sum()) != held.numel() or sizes.numel() != sd["prefetch.sizes"].numel() or \
                (held.numel() and bool(((held < 0) | (held >= self.num_slots)).any())):
            raise ValueError("checkpoint's pending prefetches are damaged (held slots out of range or miscounted)")

    def _check_tables(self, sd: dict, tables: bool = True) -> None:
        """What every load restores: the table, its optimizer state and the counters."""
        table_keys = set(self.host.tensors())
        for k in self.required_keys():
            if k not in sd and (tables or k not in table_keys):
                raise ValueError(f"checkpoint lacks {k!r}: not a CachedEmbeddingBag state_dict")
        check_stats_tensor(sd["stats"])
        if tables:
            self._check_table_values(sd)

    def _check_table_values(self, sd: dict) -> None:
        weight = sd["weight"]
        if tuple(weight.shape) != (self.num_rows, self.dim):
            raise ValueError(f"checkpoint table is {tuple(weight.shape)}, this cache's is "
                             f"{(self.num_rows, self.dim)}")
        self._check_row_dtype(weight)
        for k, v in self.host.state.items():
            if f"optimizer.{k}" not in sd:
                raise ValueError(f"checkpoint lacks optimizer state {k!r} (was it saved with "
                                 f"another optimizer than {self.optimizer.name!r}?)")
            if tuple(sd[f"optimizer.{k}"].shape) != tuple(v.shape):
                raise ValueError(f"checkpoint optimizer state {k!r} is {tuple(sd[f'optimizer.{k}'].shape)}, "
                                 f"this cache's is {tuple(v.shape)}")
        if not (bool(torch.isfinite(weight).all()) and
                all(bool(torch.isfinite(sd[f"optimizer.{k}"]).all()) for k in self.host.state)):
            raise ValueError("checkpoint table or optimizer state holds NaN or inf")

    def _check_row_dtype(self, weight: torch.Tensor) -> None:
        """Rows of another type would change the arithmetic of every later step."""
        if weight.dtype != self.host.weight.dtype:
            raise ValueError(f"checkpoint rows are {str(weight.dtype).removeprefix('torch.')}, this cache stores "
                             f"{str(self.host.weight.dtype).removeprefix('torch.')} (saved with another row_dtype?)")

    def _restore_prefetches(self, ids: torch.Tensor, sizes: torch.Tensor, counts: torch.Tensor,
                            held: tuple[torch.Tensor, torch.Tensor] | None) -> None:
        """The pending prefetches, each holding the slots it held when saved (checkpoints
        of earlier versions lack them: every resident row of its batch is held then)."""
        parts = ids.to(self.book).split(sizes.tolist())
        held_parts = held[0].to(self.book).split(held[1].tolist()) if held is not None else [None] * len(parts)
        for part, slots, (hits, misses) in zip(parts, held_parts, counts.tolist()):
            if slots is None:
                slots = torch.unique(self.slots.lookup(part))
                slots = slots[slots >= 0]
            held_now = self._held_from_slots(slots)
            self._hold(held_now, +1)
            self._prefetched.append(Prefetched(part, held_now, int(hits), int(misses), restored=True))

    def _held_slots(self, p: Prefetched) -> torch.Tensor:
        """The slots a pending prefetch holds, as a list (how a checkpoint keeps them)."""
        return p.held

    def _held_from_slots(self, slots: torch.Tensor):
        """A checkpoint's list of held slots as this cache keeps a prefetch's holds."""
        return slots
