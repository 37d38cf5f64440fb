"""An open table: rows made for raw 64-bit keys as they arrive, the coldest retired under
a bound, in front of any row store (the cache, or an uncached reference table).

Row 0 of the store is the table's **default row**: zeros, never given to a key, never
trained. Evaluation and serving read it for a key training never saw (`peek`). Key k's
row is `1 + KeyIndex row`, made on the key's first sight with `keys.initial_rows(k)`: a
function of the key and the seed, so arrival order, retirement and the rank that owns the
key never change a key's first value.

Under `max_rows` (keys held at once) a batch that brings more new keys than there are
free rows first retires the coldest keys: by last use (`retire="lru"`) or by uses
(`"lfu"`, ties to the older), never a key of this batch nor a row the store says a batch
in flight holds. It retires at least `retire_chunk` keys at a time (1/64 of the bound by
default), so the scan over the rows is paid once per chunk, not every batch. With `ttl`,
a key unused for more than `ttl` steps retires at the next batch whatever the bound.
Every decision is a function of the keys seen and the step count alone, so a cached table
and an uncached one (tests) retire the same keys.

The store is anything with `num_rows`, `grow(num_rows)`, `reset_rows(rows, weight)` and
`held_rows() -> int64 array` (see `RowStore`). It grows geometrically (capacity doubles,
up to the bound), so a stream of new keys costs amortised O(1) copies a row.
"""
from __future__ import annotations

from typing import Protocol

import numba
import numpy as np
import torch

from embcache.errors import CheckpointError
from embcache.keys import initial_rows

from .key_index import KeyIndex

RETIRE_POLICIES = ("lru", "lfu")
DEFAULT_ROW = 0  # the store's row for a key never seen


class RowStore(Protocol):
    num_rows: int

    def grow(self, num_rows: int) -> None: ...

    def reset_rows(self, rows: torch.Tensor, weight: torch.Tensor) -> None: ...

    def held_rows(self) -> np.ndarray: ...


@numba.njit(cache=True, nogil=True)
def _touch(rows: np.ndarray, last_seen: np.ndarray, uses: np.ndarray, clock: int) -> None:
    for r in rows:
        last_seen[r] = clock
        uses[r] += 1


class OpenTable:
    """Keys -> store rows for one table. See the module docstring.

    Args:
        dim: row width. seed, bound: a new key's row is `initial_rows(key, dim, seed, bound)`.
        max_rows: keys held at once (None: no bound; the store grows as keys arrive).
        retire: "lru" | "lfu": which keys retire first under the bound.
        ttl: steps without use after which a key retires (None: never).
        retire_chunk: keys retired at least at once under the bound.
    """

    def __init__(self, dim: int, seed: int, bound: float, max_rows: int | None = None,
                 retire: str = "lru", ttl: int | None = None, retire_chunk: int | None = None):
        if retire not in RETIRE_POLICIES:
            raise ValueError(f"retire must be one of {RETIRE_POLICIES}, got {retire!r}")
        if max_rows is not None and int(max_rows) < 1:
            raise ValueError(f"max_rows must be >= 1, got {max_rows}")
        if ttl is not None and int(ttl) < 1:
            raise ValueError(f"ttl must be >= 1 step, got {ttl}")
        self.dim, self.seed, self.bound = int(dim), int(seed), float(bound)
        self.max_rows = None if max_rows is None else int(max_rows)
        self.retire, self.ttl = retire, (None if ttl is None else int(ttl))
        self.retire_chunk = max(1, int(retire_chunk) if retire_chunk else (self.max_rows or 64) // 64)
        self.index = KeyIndex(self.max_rows)
        self.last_seen = np.zeros(0, np.int64)  # per index row: the step of its last use
        self.uses = np.zeros(0, np.int64)  # per index row: lookups since its key took it
        self.clock = 0
        self.new_keys = 0  # keys given a row
        self.retired = 0  # keys retired (bound or ttl)

    # ------------------------------------------------------------------ lookups
    def map(self, keys: torch.Tensor, store: RowStore) -> torch.Tensor:
        """Store rows of a training batch's `keys` (same shape, int64, on the host): new
        keys get rows (retiring cold keys first when the bound needs it), every key's
        use is recorded."""
        self.clock += 1
        flat = np.ascontiguousarray(keys.reshape(-1).to(torch.int64).cpu().numpy())
        if self.ttl is not None:
            self._retire_expired(flat, store)
        unseen = self.index.unseen(flat)
        if unseen.size:
            self._make_room(unseen.size, flat, store)
        rows, new_rows, new_keys = self.index.insert(flat)
        self._fit(self.index.num_rows)
        if new_rows.size:
            self.last_seen[new_rows] = self.clock
            self.uses[new_rows] = 0
            need = 1 + self.index.num_rows
            if need > store.num_rows:
                cap = 1 + self.max_rows if self.max_rows else need
                store.grow(min(cap, max(need, 2 * store.num_rows)))
            store.reset_rows(torch.from_numpy(new_rows + 1),
                             initial_rows(torch.from_numpy(new_keys), self.dim, self.seed, self.bound))
            self.new_keys += new_rows.size
        _touch(rows, self.last_seen, self.uses, self.clock)
        return torch.from_numpy(rows + 1).view(keys.shape)

    def peek(self, keys: torch.Tensor) -> torch.Tensor:
        """Store rows of `keys` for evaluation or serving: the default row for a key never
        seen (or retired). Changes nothing."""
        flat = np.ascontiguousarray(keys.reshape(-1).to(torch.int64).cpu().numpy())
        return torch.from_numpy(self.index.lookup(flat) + 1).view(keys.shape)

    # ------------------------------------------------------------------ retirement
    def _fit(self, rows: int) -> None:
        if rows > self.last_seen.size:
            grow = max(rows, 2 * self.last_seen.size) - self.last_seen.size
            self.last_seen = np.concatenate([self.last_seen, np.zeros(grow, np.int64)])
            self.uses = np.concatenate([self.uses, np.zeros(grow, np.int64)])

    def _candidates(self, batch_keys: np.ndarray, store: RowStore) -> np.ndarray:
        """Live index rows that may retire now: not this batch's, not held by the store."""
        n = self.index.num_rows
        ok = self.index.live_mask().copy()
        mine = self.index.lookup(batch_keys)
        ok[mine[mine >= 0]] = False
        held = np.asarray(store.held_rows(), dtype=np.int64) - 1
        held = held[(held >= 0) & (held < n)]
        ok[held] = False
        return np.flatnonzero(ok)

    def _make_room(self, unseen: int, batch_keys: np.ndarray, store: RowStore) -> None:
        if self.max_rows is None:
            return
        room = self.index.free_rows + (self.max_rows - self.index.num_rows)
        if unseen <= room:
            return
        cand = self._candidates(batch_keys, store)
        want = min(cand.size, max(unseen - room, self.retire_chunk))
        if unseen - room > cand.size:
            raise ValueError(f"a batch brings {unseen:,} new keys but only {room + cand.size:,} of the table's "
                             f"max_rows={self.max_rows:,} rows can be freed (the rest belong to this batch or "
                             f"batches in flight): raise max_rows")
        if self.retire == "lru":
            order = (cand, self.last_seen[cand])  # np.lexsort: the last key sorts first
        else:
            order = (cand, self.last_seen[cand], self.uses[cand])
        coldest = cand[np.lexsort(order)[:want]]
        self._retire(coldest)

    def _retire_expired(self, batch_keys: np.ndarray, store: RowStore) -> None:
        if self.index.live == 0:
            return
        n = self.index.num_rows
        expired = self.index.live_mask() & (self.clock - self.last_seen[:n] > self.ttl)
        if expired.any():
            cand = self._candidates(batch_keys, store)
            self._retire(cand[expired[cand]])

    def _retire(self, rows: np.ndarray) -> None:
        if rows.size:
            self.index.retire(np.sort(rows))
            self.retired += rows.size

    # ------------------------------------------------------------------ reading
    def live_rows(self) -> tuple[np.ndarray, np.ndarray]:
        """(keys, store rows) of every key held, in row order."""
        rows = np.flatnonzero(self.index.live_mask())
        return self.index.keys_of(rows), rows + 1

    def stats(self) -> dict:
        return {"live_keys": int(self.index.live), "new_keys": int(self.new_keys),
                "retired_keys": int(self.retired), "key_index_bytes": int(self.index.nbytes())}

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        n = self.index.num_rows
        return {"index": self.index.state_dict(), "last_seen": self.last_seen[:n].copy(),
                "uses": self.uses[:n].copy(), "clock": self.clock, "new_keys": self.new_keys,
                "retired": self.retired, "max_rows": self.max_rows, "retire": self.retire, "ttl": self.ttl,
                "seed": self.seed, "dim": self.dim}

    def load_state_dict(self, state: dict) -> None:
        """Refuses (CheckpointError, nothing changed) a state made for another table."""
        for name in ("max_rows", "retire", "ttl", "seed", "dim"):
            if state.get(name) != getattr(self, name):
                raise CheckpointError(f"the checkpoint's open table has {name}={state.get(name)!r}, "
                                      f"this one {getattr(self, name)!r}")
        index = KeyIndex(self.max_rows)
        index.load_state_dict(state["index"])
        n = index.num_rows
        last_seen, uses = np.asarray(state["last_seen"], np.int64), np.asarray(state["uses"], np.int64)
        if last_seen.shape != (n,) or uses.shape != (n,):
            raise CheckpointError(f"the checkpoint's open table has {n:,} rows but usage for "
                                  f"{last_seen.shape} / {uses.shape}")
        self.index = index
        self.last_seen, self.uses = last_seen.copy(), uses.copy()
        self.clock, self.new_keys, self.retired = int(state["clock"]), int(state["new_keys"]), int(state["retired"])

    # the scalars of `state_dict`, in the order of the "scalars" tensor (None stored as -1)
    _SCALARS = ("clock", "new_keys", "retired", "max_rows", "retire", "ttl", "seed", "dim")
    _ARRAYS = {"index.row_key": ("index", "row_key"), "index.free_rows": ("index", "free_rows"),
               "last_seen": (None, "last_seen"), "uses": (None, "uses")}

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """`state_dict` as int64 `[n, 1]` tensors (loadable with weights_only, and savable
        as table files): the arrays, and the scalars in one column."""
        state = self.state_dict()
        out = {}
        for name, (outer, key) in self._ARRAYS.items():
            array = state[outer][key] if outer else state[key]
            out[name] = torch.from_numpy(np.asarray(array, dtype=np.int64).reshape(-1, 1).copy())
        values = [RETIRE_POLICIES.index(state[k]) if k == "retire" else (-1 if state[k] is None else int(state[k]))
                  for k in self._SCALARS]
        out["scalars"] = torch.tensor(values, dtype=torch.int64).view(-1, 1)
        return out

    def load_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        """Inverse of `state_tensors`; CheckpointError (nothing changed) for a bad state."""
        missing = sorted({"scalars", *self._ARRAYS} - set(tensors))
        if missing:
            raise CheckpointError(f"the checkpoint's open table lacks {missing}")
        scalars = tensors["scalars"].reshape(-1).tolist()
        if len(scalars) != len(self._SCALARS):
            raise CheckpointError(f"the checkpoint's open table has {len(scalars)} settings, expected "
                                  f"{len(self._SCALARS)}")
        state: dict = {"index": {}}
        for name, value in zip(self._SCALARS, scalars):
            if name == "retire":
                value = RETIRE_POLICIES[value] if 0 <= value < len(RETIRE_POLICIES) else value
            elif name in ("max_rows", "ttl") and value == -1:
                value = None
            state[name] = value
        for name, (outer, key) in self._ARRAYS.items():
            array = tensors[name].reshape(-1).numpy()
            if outer:
                state[outer][key] = array.astype(np.int32 if key == "free_rows" else np.int64)
            else:
                state[key] = array
        state["index"]["max_rows"] = -1 if state["max_rows"] is None else state["max_rows"]
        self.load_state_dict(state)

    def rows_needed(self) -> int:
        """Store rows this table's keys use (the default row included)."""
        return 1 + self.index.num_rows
