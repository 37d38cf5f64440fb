"""An open table: rows made for raw 64-bit keys as they arrive, the coldest retired under
a bound, in front of any row store (the cache, or an uncached reference table).

Row 0 of the store is the table's **default row**: zeros, never given to a key, never
trained. Evaluation and serving read it for a key training never saw (`peek`). Key k's
row is `1 + KeyIndex row`, made on the key's first sight with `keys.initial_rows(k)`: a
function of the key and the seed, so arrival order, retirement and the rank that owns the
key never change a key's first value.

Under `max_rows` (keys held at once, one bound a table) a table that a batch takes past
its bound then retires its coldest keys: by last use (`retire="lru"`) or by uses
(`"lfu"`, then the older last use), ties to the smaller key code, never a key of this
batch nor a row the store says a batch in flight holds (a batch with more keys than the
bound keeps them all for its step). It retires at least `retire_chunk` keys at a time
(1/64 of the bound by default), so the scan over the rows is paid once per chunk, not
every batch. With `ttl`, a key unused for more than `ttl` steps retires at the next batch
whatever the bound. Every decision is a function of the keys seen and the step count
alone, so a cached table and an uncached one (tests) retire the same keys.

Several tables can share one index and one store (a collection's open tables of one width,
so that one cache serves them all): a key is then coded with its table (`code`: mix64 of
the key, xor a salt from the table's seed), each row records its table, and a new row
starts from its table's seed and bound. Each table is still bounded on its own, so the
keys kept do not depend on which tables share an index (a rank's, under torchrun).

A table may be given its keys' counts in the training data (`key_freq`, as
`data.ctr_format.load_key_frequencies` gives them): a row made for a key then gets the
key's count as the store's `freq` prior (`set_prior`; 0 for a key not counted), the prior
a vocabulary table gets from `ids_freq`; a retiring key's row loses it. The counts are
looked up (a binary search) for the keys given rows alone, never on a lookup.

A prefetch looks its batch's keys up ahead (`rows_ahead`, the same rows as `peek`) and the
lookup is kept; that batch's `map`, given it (`ahead`: the prefetch's ticket carries it, or
`kept_lookup` finds it by the keys), then probes the hash table only for the keys unknown
at the prefetch: one pass over the index a batch, not two. A kept lookup stays
exact: a key retired in between (not held by the store, so not the prefetch's) is looked
up again, and a key made in between is found by the insert.

The store is anything with `num_rows`, `grow(num_rows)`, `reset_rows(rows, weight)` and
`held_rows() -> int64 array` (see `RowStore`), and `set_prior(rows, counts)` where the
table has counts. It grows geometrically (capacity doubles,
up to the bound), so a stream of new keys costs amortised O(1) copies a row.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from embcache.errors import CheckpointError
from embcache.keys import initial_rows, mix64, unmix64

from embcache.cache.choices import MAX_PENDING_PREFETCHES
from embcache.cache.open_keys.key_index import KeyIndex
from embcache.cache.open_keys.key_counts import _key_counts
from embcache.cache.open_keys.open_table_kernels import _touch, _code, _first_positions, _forget
from embcache.cache.bookkeeping.lookup import same_values

RETIRE_POLICIES = ("lru", "lfu")
_GOLDEN = 0x9E3779B97F4A7C15 - (1 << 64)


class RowStore(Protocol):
    num_rows: int

    def grow(self, num_rows: int) -> None: ...

    def reset_rows(self, rows: torch.Tensor, weight: torch.Tensor) -> None: ...

    def held_rows(self) -> np.ndarray: ...


@dataclass
class _Ahead:
    """A coming batch's keys looked up by its prefetch: its codes, and its index rows then
    (-1: unknown), which its `map` reuses."""

    keys: torch.Tensor
    tables: torch.Tensor | None
    codes: np.ndarray
    rows: np.ndarray
    prefetched: object = None  # the cache's ticket for the prefetch made of these rows

    def matches(self, keys: torch.Tensor, tables: torch.Tensor | None) -> bool:
        return same_values(self.keys, keys) and (tables is None) == (self.tables is None) and \
            (tables is None or same_values(self.tables, tables))


def _coldest(cand: np.ndarray, primary: np.ndarray, want: int, codes_of) -> np.ndarray:
    """The `want` candidates of smallest `primary`, ties to the smaller key code (not the
    row: rows are numbered by arrival into one index, codes are the same in any grouping),
    by a partition rather than a sort of every candidate; `codes_of(rows)` is asked for
    the tied candidates' codes alone."""
    if want >= cand.size:
        return cand
    kth = np.partition(primary, want - 1)[want - 1]
    below = cand[primary < kth]
    ties = cand[primary == kth]
    ties = ties[np.argsort(codes_of(ties), kind="stable")]
    return np.concatenate([below, ties[: want - below.size]])


def table_salts(seeds: list[int]) -> torch.Tensor:
    """Each table's salt, from its seed (distinct seeds, distinct salts): a table's key codes
    are the same whichever tables share its index (a rank's), so ties between keys break
    the same way on any placement."""
    return mix64((torch.tensor(seeds, dtype=torch.int64) + 1) * _GOLDEN)


class OpenTable:
    """Keys -> store rows for one table, or several sharing a store. See the module docstring.

    Args:
        dim: row width.
        seed, bound: a new key's row is `initial_rows(key, dim, seed, bound)`; lists of
            them (one a table) make a shared table of `len(seed)` tables.
        max_rows: keys held at once (None: no bound; the store grows as keys arrive); a
            list: one bound (or None) a table.
        retire: "lru" | "lfu": which keys retire first under the bound.
        ttl: steps without use after which a key retires (None: never).
        retire_chunk: keys retired at least at once under the bound.
        key_freq: the keys' counts, the store's `freq` prior for their rows: `(keys,
            counts)` (keys ascending and distinct), or a list of them (or None) one a
            table of a shared table. None: no prior (rows made start at 0).
    """

    def __init__(self, dim: int, seed: int | list[int], bound: float | list[float],
                 max_rows: int | list[int | None] | None = None, retire: str = "lru", ttl: int | None = None,
                 retire_chunk: int | None = None, key_freq=None):
        if retire not in RETIRE_POLICIES:
            raise ValueError(f"retire must be one of {RETIRE_POLICIES}, got {retire!r}")
        per_table = list(max_rows) if isinstance(max_rows, (list, tuple)) else None
        if any(m is not None and int(m) < 1 for m in (per_table or [max_rows])):
            raise ValueError(f"max_rows must be >= 1, got {max_rows}")
        if ttl is not None and int(ttl) < 1:
            raise ValueError(f"ttl must be >= 1 step, got {ttl}")
        seeds = [int(x) for x in seed] if isinstance(seed, (list, tuple)) else [int(seed)]
        bounds = [float(x) for x in bound] if isinstance(bound, (list, tuple)) else [float(bound)] * len(seeds)
        if len(bounds) != len(seeds):
            raise ValueError(f"one bound a table: {len(seeds)} seeds, {len(bounds)} bounds")
        self.dim, self.seeds, self.bounds, self.tables = int(dim), seeds, bounds, len(seeds)
        self.seed = seeds[0]
        if per_table is None:
            per_table = [max_rows] * self.tables if self.tables == 1 else [None] * self.tables
        if len(per_table) != self.tables:
            raise ValueError(f"one max_rows a table: {self.tables} tables, {len(per_table)} bounds")
        # each table's bound (-1: none): a table's keys retire for its own new keys only, so the
        # keys kept do not depend on which tables share the index (the placement over ranks)
        self.table_bounds = np.array([-1 if m is None else int(m) for m in per_table], np.int64)
        self.max_rows = None if (self.table_bounds < 0).any() else int(self.table_bounds.sum())
        self.retire, self.ttl = retire, (None if ttl is None else int(ttl))
        self.chunks = np.maximum(1, np.full(self.tables, int(retire_chunk)) if retire_chunk else self.table_bounds // 64)
        if len(set(seeds)) != len(seeds):
            raise ValueError(f"tables sharing an open table need distinct seeds (their keys' salts), got {seeds}")
        self.key_counts = _key_counts(key_freq, self.tables)
        self.salts = table_salts(seeds)
        self._salts = self.salts.numpy()
        self.index = KeyIndex(None)  # bounded table by table, after each batch (`_enforce_bounds`)
        self.live_per_table = np.zeros(self.tables, np.int64)
        self.last_seen = np.zeros(0, np.int64)  # per index row: the step of its last use
        self.uses = np.zeros(0, np.int64)  # per index row: lookups since its key took it
        self.row_table = np.zeros(0, np.int64)  # per index row: the table its key belongs to
        self._scratch = np.zeros(0, np.int64)  # per index row, -1: `_first_positions`' work space
        self.clock = 0
        self._ahead: deque[_Ahead] = deque()  # `rows_ahead`'s lookups, oldest first
        self.new_per_table = np.zeros(self.tables, np.int64)  # keys given a row
        self.retired_per_table = np.zeros(self.tables, np.int64)  # keys retired (bound or ttl)

    @property
    def new_keys(self) -> int:
        return int(self.new_per_table.sum())

    @property
    def retired(self) -> int:
        return int(self.retired_per_table.sum())

    # ------------------------------------------------------------------ lookups
    def code(self, keys: torch.Tensor, tables: torch.Tensor | None = None) -> np.ndarray:
        """The index's key for raw `keys` of `tables` (one table index per key; None:
        table 0): mix64(key) xor the table's salt."""
        flat = np.ascontiguousarray(keys.reshape(-1).to(torch.int64).cpu().numpy())
        which = np.zeros(0, np.int64) if tables is None else \
            np.ascontiguousarray(tables.reshape(-1).to(torch.int64).cpu().numpy())
        out = np.empty_like(flat)
        _code(flat, which, self._salts, out)
        return out

    def raw_keys(self, rows: np.ndarray) -> np.ndarray:
        """The raw keys of live index rows."""
        codes = torch.from_numpy(self.index.keys_of(rows))
        salt = self.salts.index_select(0, torch.from_numpy(self.row_table[rows]))
        return unmix64(codes ^ salt).numpy()

    def map(self, keys: torch.Tensor, store: RowStore, tables: torch.Tensor | None = None,
            ahead: _Ahead | None = None) -> torch.Tensor:
        """Store rows of a training batch's `keys` (same shape, int64, on the host; `tables`:
        each key's table, for a shared table): new keys get rows, every key's use is
        recorded, then tables past their bound retire their coldest keys. `ahead`: the
        lookup `rows_ahead` kept for these keys, reused if still kept (only the keys it did
        not know are probed); older kept lookups go."""
        self.clock += 1
        ahead = self._take_ahead(ahead)
        if ahead is None:
            flat = self.code(keys, tables)
            if self.ttl is not None:
                self._retire_expired(self.index.lookup(flat), store)
            rows, new_rows, _ = self.index.insert(flat)  # one pass over the hash table
        else:
            flat, rows = ahead.codes, ahead.rows
            unknown = np.flatnonzero(rows < 0)
            if self.ttl is not None:  # the keys made since the lookup are this batch's too
                known = rows.copy()
                known[unknown] = self.index.lookup(flat[unknown])
                self._retire_expired(known, store)
            new_rows = np.zeros(0, np.int64)
            if unknown.size:  # the same rows, in the same order, as an insert of the whole batch
                rows[unknown], new_rows, _ = self.index.insert(flat[unknown])
        self._fit(self.index.num_rows)
        if new_rows.size:
            self._made(new_rows, rows, keys, tables, store)
        _touch(rows, self.last_seen, self.uses, self.clock)
        if new_rows.size and (self.table_bounds >= 0).any():
            self._enforce_bounds(rows, store)
        return torch.from_numpy(rows + 1).view(keys.shape)

    def add(self, keys: torch.Tensor, store: RowStore, tables: torch.Tensor | None = None) -> None:
        """Rows for the keys not held yet, at their first values, as `map` would make them,
        but no use recorded and the clock left standing: a table started with keys it is
        known to meet."""
        flat = self.code(keys, tables)
        rows, new_rows, _ = self.index.insert(flat)
        self._fit(self.index.num_rows)
        if new_rows.size:
            self._made(new_rows, rows, keys, tables, store)
            if (self.table_bounds >= 0).any():
                self._enforce_bounds(rows, store)

    def rows_ahead(self, keys: torch.Tensor, tables: torch.Tensor | None = None) -> tuple[torch.Tensor, _Ahead]:
        """`peek` for a coming training batch (its prefetch): the lookup is kept, and that
        batch's `map` given it probes only the keys unknown now. Returns (rows, the kept
        lookup): the forward passes it to `map`, and finds the cache's prefetch through it
        (`prefetched`) although new keys changed some of its rows by then."""
        codes = self.code(keys, tables)
        rows = self.index.lookup(codes)
        if len(self._ahead) >= MAX_PENDING_PREFETCHES:  # lookups kept for coming batches
            self._ahead.popleft()
        entry = _Ahead(keys, tables, codes, rows)  # (the caller gets a copy: rows + 1)
        self._ahead.append(entry)
        return torch.from_numpy(rows + 1).view(keys.shape), entry

    def kept_lookup(self, keys: torch.Tensor, tables: torch.Tensor | None = None,
                    ahead: _Ahead | None = None) -> _Ahead | None:
        """The kept lookup for a training batch of `keys`: `ahead` (its prefetch's ticket) if
        still kept (a ninth kept lookup drops the first), else, given none, the oldest kept
        lookup of exactly these keys."""
        if ahead is not None:
            return ahead if any(entry is ahead for entry in self._ahead) else None
        return next((entry for entry in self._ahead if entry.matches(keys, tables)), None)

    def _take_ahead(self, ahead: _Ahead | None) -> _Ahead | None:
        """`ahead` if still kept (None: dropped, as a ninth lookup kept drops the first),
        the ones kept before it dropped."""
        for i, entry in enumerate(self._ahead):
            if entry is ahead:
                for _ in range(i + 1):
                    self._ahead.popleft()
                return entry
        return None

    def _made(self, new_rows: np.ndarray, rows: np.ndarray, keys: torch.Tensor, tables: torch.Tensor | None,
              store: RowStore) -> None:
        """Record new rows and give them their keys' first values in the store."""
        at = _first_positions(rows, new_rows, self._scratch)  # each new row's first position in the batch
        raw = keys.reshape(-1).to(torch.int64).cpu().numpy()[at]
        table = np.zeros(new_rows.size, np.int64) if tables is None else tables.reshape(-1).cpu().numpy()[at]
        self.row_table[new_rows] = table
        self.last_seen[new_rows] = self.clock
        self.uses[new_rows] = 0
        made = np.bincount(table, minlength=self.tables)
        self.new_per_table += made
        self.live_per_table += made
        need = 1 + self.index.num_rows
        if need > store.num_rows:  # doubling, up to the bounds (and a batch's keys past them)
            cap = 1 + self.max_rows + new_rows.size if self.max_rows else need
            store.grow(max(need, min(cap, 2 * store.num_rows)))
        values = initial_rows(torch.from_numpy(raw), self.dim, torch.tensor(self.seeds)[table],
                              torch.tensor(self.bounds, dtype=torch.float64)[table])
        store.reset_rows(torch.from_numpy(new_rows + 1), values)
        if self.key_counts is not None:
            store.set_prior(torch.from_numpy(new_rows + 1), torch.from_numpy(self._counts_of(raw, table)))

    def _counts_of(self, raw: np.ndarray, table: np.ndarray) -> np.ndarray:
        """The counts of raw keys of `table` (one table index a key), each in its own
        table's counts (0: not counted, or a table without counts)."""
        out = np.zeros(raw.size, np.float64)
        for t in np.unique(table).tolist():
            counts = self.key_counts[t]
            if counts is not None:
                mine = table == t
                out[mine] = counts.lookup(raw[mine])
        return out

    def restore_prior(self, store: RowStore) -> None:
        """After a load (a resumed run): the store's prior as training left it, each live
        key's row its count and every other row none (a retiring key's row loses its
        count, so that the prior is a function of the keys held)."""
        if self.key_counts is None:
            return
        prior = np.zeros(store.num_rows, np.float64)
        rows = self.live_index_rows()
        prior[rows + 1] = self._counts_of(self.raw_keys(rows), self.row_table[rows])
        store.set_prior(torch.arange(store.num_rows), torch.from_numpy(prior))

    def peek(self, keys: torch.Tensor, tables: torch.Tensor | None = None) -> torch.Tensor:
        """Store rows of `keys` for evaluation or serving: the default row for a key never
        seen (or retired). Changes nothing."""
        return torch.from_numpy(self.index.lookup(self.code(keys, tables)) + 1).view(keys.shape)

    # ------------------------------------------------------------------ retirement
    def _fit(self, rows: int) -> None:
        if rows > self.last_seen.size:
            grow = max(rows, 2 * self.last_seen.size) - self.last_seen.size
            self.last_seen = np.concatenate([self.last_seen, np.zeros(grow, np.int64)])
            self.uses = np.concatenate([self.uses, np.zeros(grow, np.int64)])
            self.row_table = np.concatenate([self.row_table, np.zeros(grow, np.int64)])
            self._scratch = np.concatenate([self._scratch, np.full(grow, -1, np.int64)])

    def _retirable(self, batch_rows: np.ndarray, store: RowStore) -> np.ndarray:
        """bool per index row: a live key that may retire now, not this batch's, not held
        by the store."""
        n = self.index.num_rows
        ok = self.index.live_mask().copy()
        ok[batch_rows[batch_rows >= 0]] = False
        held = np.asarray(store.held_rows(), dtype=np.int64) - 1
        held = held[(held >= 0) & (held < n)]
        ok[held] = False
        return ok

    def _enforce_bounds(self, batch_rows: np.ndarray, store: RowStore) -> None:
        """Tables past their bound retire their coldest keys (at least a 64th of the bound at
        once, so the scan is paid once a chunk); the keys of this batch and of batches in
        flight stay, so a batch bringing more keys than its table's bound holds them all for
        its step."""
        over = self.live_per_table - self.table_bounds
        retirable = None  # one scan of the rows for every table over its bound
        for t in np.flatnonzero((self.table_bounds >= 0) & (over > 0)).tolist():
            if retirable is None:
                retirable = self._retirable(batch_rows, store)
            cand = np.flatnonzero(retirable & (self.row_table[: retirable.size] == t))
            want = min(cand.size, max(int(over[t]), int(self.chunks[t])))
            if want <= 0:
                continue
            if self.retire == "lru":
                primary = self.last_seen[cand]
            else:  # fewest uses, then the older last use (the product stays far below 2**63)
                primary = self.uses[cand] * (self.clock + 1) + self.last_seen[cand]
            self._retire(_coldest(cand, primary, want, self.index.keys_of), store)

    def _retire_expired(self, batch_rows: np.ndarray, store: RowStore) -> None:
        if self.index.live == 0:
            return
        n = self.index.num_rows
        expired = self.index.live_mask() & (self.clock - self.last_seen[:n] > self.ttl)
        if expired.any():
            self._retire(np.flatnonzero(expired & self._retirable(batch_rows, store)), store)

    def _retire(self, rows: np.ndarray, store: RowStore) -> None:
        if rows.size:
            if self.key_counts is not None:  # the row's count goes with its key (`restore_prior`)
                store.set_prior(torch.from_numpy(rows + 1), torch.zeros(rows.size, dtype=torch.float64))
            gone = np.bincount(self.row_table[rows], minlength=self.tables)
            self.retired_per_table += gone
            self.live_per_table -= gone
            self.index.retire(np.sort(rows))
            if self._ahead:  # kept lookups forget the retired keys' rows (they may be reused)
                mask = np.zeros(self.index.num_rows, np.bool_)
                mask[rows] = True
                for entry in self._ahead:
                    _forget(entry.rows, mask)

    # ------------------------------------------------------------------ reading
    def live_index_rows(self, table: int | None = None) -> np.ndarray:
        """Index rows of the keys held (of `table` only, if given), in row order."""
        live = self.index.live_mask()
        if table is not None:
            live = live & (self.row_table[: live.size] == table)
        return np.flatnonzero(live)

    def live_rows(self, table: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """(raw keys, store rows) of every key of `table` held, in row order."""
        rows = self.live_index_rows(table)
        return self.raw_keys(rows), rows + 1

    def stats(self) -> dict:
        return {"live_keys": int(self.index.live), "new_keys": self.new_keys,
                "retired_keys": self.retired, "key_index_bytes": int(self.index.nbytes())}

    def table_stats(self, table: int) -> dict:
        return {"live_keys": int(self.live_index_rows(table).size), "new_keys": int(self.new_per_table[table]),
                "retired_keys": int(self.retired_per_table[table])}

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        n = self.index.num_rows
        return {"index": self.index.state_dict(), "last_seen": self.last_seen[:n].copy(),
                "uses": self.uses[:n].copy(), "row_table": self.row_table[:n].copy(), "clock": self.clock,
                "new_per_table": self.new_per_table.copy(), "retired_per_table": self.retired_per_table.copy(),
                "table_bounds": self.table_bounds.copy(),
                "max_rows": self.max_rows, "retire": self.retire, "ttl": self.ttl, "seed": self.seed,
                "dim": self.dim, "tables": self.tables}

    def load_state_dict(self, state: dict) -> None:
        """Refuses (CheckpointError, nothing changed) a state made for another table."""
        for name in ("max_rows", "retire", "ttl", "seed", "dim", "tables"):
            if state.get(name) != getattr(self, name):
                raise CheckpointError(f"the checkpoint's open table has {name}={state.get(name)!r}, "
                                      f"this one {getattr(self, name)!r}")
        bounds = np.asarray(state.get("table_bounds", self.table_bounds), np.int64)
        if not np.array_equal(bounds, self.table_bounds):
            raise CheckpointError(f"the checkpoint's open table has bounds {bounds.tolist()} a table, this one "
                                  f"{self.table_bounds.tolist()}")
        index = KeyIndex(None)
        index.load_state_dict(state["index"])
        n = index.num_rows
        arrays = {k: np.asarray(state[k], np.int64) for k in ("last_seen", "uses", "row_table")}
        if any(a.shape != (n,) for a in arrays.values()):
            raise CheckpointError(f"the checkpoint's open table has {n:,} rows but usage for "
                                  f"{[a.shape for a in arrays.values()]}")
        if n and not bool(((arrays["row_table"] >= 0) & (arrays["row_table"] < self.tables)).all()):
            raise CheckpointError(f"the checkpoint's open table names tables outside 0..{self.tables - 1}")
        counts = {k: np.asarray(state[k], np.int64) for k in ("new_per_table", "retired_per_table")}
        if any(c.shape != (self.tables,) for c in counts.values()):
            raise CheckpointError("the checkpoint's open table counts keys for another number of tables")
        self.index = index
        self._ahead.clear()
        self.last_seen, self.uses, self.row_table = (arrays[k].copy() for k in ("last_seen", "uses", "row_table"))
        self._scratch = np.full(n, -1, np.int64)
        live = index.live_mask()
        self.live_per_table = np.bincount(self.row_table[:n][live], minlength=self.tables).astype(np.int64)
        self.new_per_table, self.retired_per_table = counts["new_per_table"].copy(), counts["retired_per_table"].copy()
        self.clock = int(state["clock"])

    # the scalars of `state_dict`, in the order of the "scalars" tensor (None stored as -1)
    _SCALARS = ("clock", "max_rows", "retire", "ttl", "seed", "dim", "tables")
    _ARRAYS = {"index.row_key": ("index", "row_key"), "index.free_rows": ("index", "free_rows"),
               "last_seen": (None, "last_seen"), "uses": (None, "uses"), "row_table": (None, "row_table"),
               "new_per_table": (None, "new_per_table"), "retired_per_table": (None, "retired_per_table"),
               "table_bounds": (None, "table_bounds")}

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
        state["index"]["max_rows"] = -1
        self.load_state_dict(state)

    # ------------------------------------------------------------------ table by table
    def table_part(self, table: int, members: int) -> dict[str, np.ndarray]:
        """One table's keys as a checkpoint part holds them (int64 columns): its live index
        rows, raw keys and usage, with what the whole index needs to be rebuilt exactly
        when the same tables share it again (`members`: a digest of their names)."""
        rows = self.live_index_rows(table)
        return {"rows": rows, "keys": self.raw_keys(rows), "last_seen": self.last_seen[rows],
                "uses": self.uses[rows], "free_rows": self.index.state_dict()["free_rows"].astype(np.int64),
                "group": np.array([self.clock, self.index.num_rows, self.new_per_table[table],
                                   self.retired_per_table[table], members, self.tables], np.int64)}

    def load_table_parts(self, parts: list[dict[str, np.ndarray]], members: int) -> np.ndarray:
        """Rebuild the index from every table's `table_part` (in table order); returns the
        store rows each part's rows now live in (concatenated in part order). Saved by the
        same tables sharing an index (same `members`, same free rows): every key back in
        its row, the free rows and their order as they were (a resumed run continues
        exactly). Otherwise (a checkpoint of another grouping, written on another number
        of ranks): the keys in new rows, numbered in order; their values carry over."""
        if len(parts) != self.tables:
            raise CheckpointError(f"{len(parts)} saved tables for an open table of {self.tables}")
        groups = [p["group"].reshape(-1) for p in parts]
        free = parts[0]["free_rows"].reshape(-1)
        exact = all(int(g[4]) == members and int(g[5]) == self.tables and int(g[1]) == int(groups[0][1])
                    for g in groups) and all(np.array_equal(p["free_rows"].reshape(-1), free) for p in parts)
        codes = [self.code(torch.from_numpy(p["keys"].reshape(-1).copy()),
                           torch.full((p["keys"].size,), t, dtype=torch.int64)) for t, p in enumerate(parts)]
        state = {"clock": max(int(g[0]) for g in groups), "max_rows": self.max_rows, "retire": self.retire,
                 "table_bounds": self.table_bounds.copy(),
                 "ttl": self.ttl, "seed": self.seed, "dim": self.dim, "tables": self.tables,
                 "new_per_table": np.array([int(g[2]) for g in groups], np.int64),
                 "retired_per_table": np.array([int(g[3]) for g in groups], np.int64)}
        if exact:
            n = int(groups[0][1])
            placed = [p["rows"].reshape(-1).astype(np.int64) for p in parts]
            free_rows = free.astype(np.int32)
        else:
            n = sum(c.size for c in codes)
            starts = np.cumsum([0] + [c.size for c in codes])
            placed = [np.arange(starts[t], starts[t + 1], dtype=np.int64) for t in range(len(codes))]
            free_rows = np.zeros(0, np.int32)
        row_key, row_table = np.zeros(n, np.int64), np.zeros(n, np.int64)
        last_seen, uses = np.zeros(n, np.int64), np.zeros(n, np.int64)
        for t, (rows, p) in enumerate(zip(placed, parts)):
            if rows.size and (rows.min() < 0 or rows.max() >= n):
                raise CheckpointError(f"a saved open table's rows lie outside its {n:,} rows")
            row_key[rows], row_table[rows] = codes[t], t
            last_seen[rows], uses[rows] = p["last_seen"].reshape(-1), p["uses"].reshape(-1)
        state.update({"index": {"row_key": row_key, "free_rows": free_rows,
                                "max_rows": -1},
                      "last_seen": last_seen, "uses": uses, "row_table": row_table})
        self.load_state_dict(state)
        return np.concatenate(placed) + 1 if placed else np.zeros(0, np.int64)

    def rows_needed(self) -> int:
        """Store rows this table's keys use (the default row included)."""
        return 1 + self.index.num_rows
