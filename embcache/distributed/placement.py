"""Which rank owns which embedding rows: table-wise placement, row-wise for a table too
large for one rank.

Every row has exactly one owner. Whole tables are placed greedily, largest first, on the
rank with the least load, where a table's load is its share of all rows (host memory,
cache size, checkpoint bytes) plus its share of all lookups (misses and all-to-all bytes:
the `ids_freq` counts say which tables are hot). A table with more rows than
`row_wise_rows` cannot be balanced whole: it is split by rows into one contiguous range
per rank, and each rank serves the lookups that fall in its range (pooled sums are added
up on the rank that asked).

An open table (raw 64-bit keys, `TableLoad.open`) has no ranges of ids: past the same
threshold it is split by **key hash** instead, one shard per rank, shard r holding the keys
with `key_owner(key, world_size) == r` (a fixed hash of the raw key, independent of the
table's salt and of the key index's slots). Each shard is an open table of its own on its
rank; a smaller open table is placed whole.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from embcache.keys import mix64, shift_right
from embcache.partition import slice_bounds

ROWS, KEY_HASH = "rows", "key_hash"  # the kinds of shard
_OWNER_SALT = 0x5DEECE66D2B7E151  # xored into a key before its owner's hash (no other hash uses it)


def key_owner(keys: torch.Tensor, parts: int) -> torch.Tensor:
    """The shard (0..parts-1) owning each raw int64 key of a table split by key hash: the
    high bits of `mix64(key ^ salt)` modulo `parts`, so neither the table's key codes
    (`mix64(key) ^ table salt`) nor the index's home slots correlate with it.

    Example:
        >>> k = torch.arange(10_000)
        >>> torch.bincount(key_owner(k, 2)).tolist()  # about half each
        [4926, 5074]
    """
    keys = torch.as_tensor(keys, dtype=torch.int64)
    return shift_right(mix64(keys ^ _OWNER_SALT), 32) % parts


@dataclass(frozen=True)
class Shard:
    """Rows `[row_start, row_stop)` of table `table` (features `features`), owned by `rank`.

    A key-hash shard (`kind == KEY_HASH`, an open table's) holds instead the keys `k` with
    `key_owner(k, parts) == rank`, whatever rows they take; its `[row_start, row_stop)` is
    only its nominal share of the table's expected keys (`rows`: its size for placement
    and its cache)."""

    table: str
    features: tuple[str, ...]
    rank: int
    row_start: int
    row_stop: int
    table_rows: int
    kind: str = ROWS
    parts: int = 1  # a key-hash table's number of shards

    @property
    def whole(self) -> bool:
        return self.kind == ROWS and self.row_start == 0 and self.row_stop == self.table_rows

    @property
    def by_key(self) -> bool:
        return self.kind == KEY_HASH

    def owns(self, keys: torch.Tensor) -> torch.Tensor:
        """bool per raw key: whether this key-hash shard holds it."""
        return key_owner(keys, self.parts) == self.rank

    @property
    def rows(self) -> int:
        return self.row_stop - self.row_start

    @property
    def name(self) -> str:
        """The shard's table name on its rank: the table's own when whole or split by key
        hash (a rank holds one shard of such a table)."""
        return self.table if self.whole or self.by_key else f"{self.table}@{self.row_start}"

    def feature_key(self, feature: str) -> str:
        """The key of `feature`'s lookups into this shard on its rank."""
        return feature if self.whole or self.by_key else f"{feature}@{self.row_start}"


@dataclass(frozen=True)
class TableLoad:
    """What placement needs to know of a table."""

    name: str
    features: tuple[str, ...]
    rows: int
    lookups: float = 0.0
    whole: bool = False  # never split
    open: bool = False  # raw keys: split by key hash, not by rows


def plan(tables: list[TableLoad], world_size: int, row_wise_rows: int | None = None) -> list[Shard]:
    """Shards of `tables` over `world_size` ranks, in table order (a row-wise table's
    shards in rank order). `row_wise_rows` None: a table is split when it holds more
    than its fair share of all rows (`total / world_size`); an open table past it is
    split by key hash, one shard per rank.

    Example:
        >>> ts = [TableLoad("a", ("fa",), 100, 5.0), TableLoad("b", ("fb",), 10, 5.0),
        ...       TableLoad("c", ("fc",), 10, 1.0)]
        >>> [(s.name, s.rank) for s in plan(ts, 2)]
        [('a@0', 0), ('a@50', 1), ('b', 0), ('c', 1)]
        >>> [(s.name, s.rank) for s in plan(ts, 2, row_wise_rows=1000)]
        [('a', 0), ('b', 1), ('c', 1)]
        >>> ts[0] = TableLoad("a", ("fa",), 100, 5.0, open=True)
        >>> [(s.name, s.rank, s.kind) for s in plan(ts, 2)][:2]
        [('a', 0, 'key_hash'), ('a', 1, 'key_hash')]
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    total_rows = sum(t.rows for t in tables) or 1
    total_lookups = sum(t.lookups for t in tables) or 1.0
    limit = math.ceil(total_rows / world_size) if row_wise_rows is None else row_wise_rows
    load = [0.0] * world_size
    shards: dict[str, list[Shard]] = {}
    for t in tables:  # row-wise first: they load every rank evenly
        if world_size > 1 and t.rows > limit and not t.whole:
            kind = dict(kind=KEY_HASH, parts=world_size) if t.open else {}
            shards[t.name] = [Shard(t.name, t.features, r, *slice_bounds(t.rows, world_size, r), t.rows, **kind)
                              for r in range(world_size)]
            for r, s in enumerate(shards[t.name]):
                load[r] += s.rows / total_rows + t.lookups / world_size / total_lookups
    whole = [t for t in tables if t.name not in shards]
    for t in sorted(whole, key=lambda t: -(t.rows / total_rows + t.lookups / total_lookups)):
        r = min(range(world_size), key=lambda k: (load[k], k))
        load[r] += t.rows / total_rows + t.lookups / total_lookups
        shards[t.name] = [Shard(t.name, t.features, r, 0, t.rows, t.rows)]
    return [s for t in tables for s in shards[t.name]]


def describe(shards: list[Shard], world_size: int) -> str:
    """One line per rank: its tables and rows (what a run logs at start)."""
    lines = []
    for r in range(world_size):
        mine = [s for s in shards if s.rank == r]
        names = ", ".join(s.name if s.whole else f"{s.table}[keys hashed to {s.rank} of {s.parts}]" if s.by_key
                          else f"{s.table}[{s.row_start}:{s.row_stop}]" for s in mine)
        lines.append(f"rank {r}: {sum(s.rows for s in mine):,} rows ({names or 'no tables'})")
    return "\n".join(lines)
