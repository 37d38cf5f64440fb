"""Which rank owns which embedding rows: table-wise placement, row-wise for a table too
large for one rank.

Every row has exactly one owner. Whole tables are placed greedily, largest first, on the
rank with the least load, where a table's load is its share of all rows (host memory,
cache size, checkpoint bytes) plus its share of all lookups (misses and all-to-all bytes:
the `ids_freq` counts say which tables are hot). A table with more rows than
`row_wise_rows` cannot be balanced whole: it is split by rows into one contiguous range
per rank, and each rank serves the lookups that fall in its range (pooled sums are added
up on the rank that asked).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from embcache.partition import slice_bounds


@dataclass(frozen=True)
class Shard:
    """Rows `[row_start, row_stop)` of table `table` (features `features`), owned by `rank`."""

    table: str
    features: tuple[str, ...]
    rank: int
    row_start: int
    row_stop: int
    table_rows: int

    @property
    def whole(self) -> bool:
        return self.row_start == 0 and self.row_stop == self.table_rows

    @property
    def rows(self) -> int:
        return self.row_stop - self.row_start

    @property
    def name(self) -> str:
        """The shard's table name on its rank: the table's own when whole."""
        return self.table if self.whole else f"{self.table}@{self.row_start}"

    def feature_key(self, feature: str) -> str:
        """The key of `feature`'s lookups into this shard on its rank."""
        return feature if self.whole else f"{feature}@{self.row_start}"


@dataclass(frozen=True)
class TableLoad:
    """What placement needs to know of a table."""

    name: str
    features: tuple[str, ...]
    rows: int
    lookups: float = 0.0
    whole: bool = False  # never split by rows (an open table: its rows are not ranges of ids)


def plan(tables: list[TableLoad], world_size: int, row_wise_rows: int | None = None) -> list[Shard]:
    """Shards of `tables` over `world_size` ranks, in table order (a row-wise table's
    shards in rank order). `row_wise_rows` None: a table is split when it holds more
    than its fair share of all rows (`total / world_size`).

    Example:
        >>> ts = [TableLoad("a", ("fa",), 100, 5.0), TableLoad("b", ("fb",), 10, 5.0),
        ...       TableLoad("c", ("fc",), 10, 1.0)]
        >>> [(s.name, s.rank) for s in plan(ts, 2)]
        [('a@0', 0), ('a@50', 1), ('b', 0), ('c', 1)]
        >>> [(s.name, s.rank) for s in plan(ts, 2, row_wise_rows=1000)]
        [('a', 0), ('b', 1), ('c', 1)]
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
            shards[t.name] = [Shard(t.name, t.features, r, *slice_bounds(t.rows, world_size, r), t.rows)
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
        names = ", ".join(s.name if s.whole else f"{s.table}[{s.row_start}:{s.row_stop}]" for s in mine)
        lines.append(f"rank {r}: {sum(s.rows for s in mine):,} rows ({names or 'no tables'})")
    return "\n".join(lines)
