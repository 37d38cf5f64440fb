"""The tables of a collection, grouped by the cache they share: closed and open groups.

Tables with the same embedding dimension and pooling share one cache: their ids are
concatenated into one id space (table t's row r is row `offset_t + r`) behind one
`CachedEmbeddingBag` (a `ClosedGroup`). Open tables (fed raw 64-bit keys) of one width,
pooling and retirement share one `KeyedEmbeddingBag`, a cache and a key index (an
`OpenGroup`). Each kind knows how to make its bag, how a batch's features become its bag's
input, and how its tables are read and restored in id order; the collection asks each group
alike, with no branch on which kind it is.
"""
from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import numpy as np
import torch

from embcache.cache.stores.host_store import RowInit
from embcache.device import host_numbers, values_on_host
from embcache.sparse_types import EmbeddingBagConfig, pooling_mode

from .bag_input import check_feature_ids
from .input_errors import InputErrors, check_feature_ids_on_device
from .cached_embedding_bag import CachedEmbeddingBag, KeyedEmbeddingBag
from .group_kernels import concat_features

# an open table's own settings, and where an open group lists them (one a table)
_OPEN_PER_TABLE = {"max_rows": "max_rows", "seed": "seeds", "init_bound": "init_bounds", "key_freq": "key_freqs"}


@dataclass
class GroupInput:
    """One group's share of a batch, as its bag takes it. `segments`: per table, the
    number of lookups of each of its features (an uncached collection sums each table's
    gradient on its own, and the cache must sum in the same order)."""

    ids: torch.Tensor  # 1-D, int64, in the group's concatenated id space
    offsets: torch.Tensor
    weights: torch.Tensor | None
    features: list[str]
    batch: int
    segments: list[list[int]]
    layout_checked: bool = False  # offsets made here from checked lengths: nothing to read again
    tables: torch.Tensor | None = None  # an open group's: each key's table (position in the group)


class TableGroup:
    """Tables sharing one cache: their features in output order and row offsets."""

    def __init__(self, key: tuple):
        self.key = key
        self.tables: list[EmbeddingBagConfig] = []
        self.row_offsets: list[int] = []
        self.num_rows = 0

    def add(self, config: EmbeddingBagConfig) -> None:
        self.tables.append(config)
        self.row_offsets.append(self.num_rows)
        self.num_rows += config.num_embeddings

    def _layout(self, weights: torch.Tensor | None, spans: dict):
        """The group's features in order, per table its features' lookup counts, their
        weights joined, and per feature (feature, table name, rows). `spans`: feature ->
        (its row of `lengths`, where its ids start in `values`, how many there are)."""
        features, segments, w_parts, tables, row_offsets = [], [], [], [], []
        for t, row_offset in zip(self.tables, self.row_offsets):
            segments.append([])
            for f in t.feature_names:
                i, s, n = spans[f]
                tables.append((f, t.name, t.num_embeddings))
                row_offsets.append(row_offset)
                segments[-1].append(n)
                if weights is not None:
                    w_parts.append(weights[s: s + n])
                features.append(f)
        return features, segments, torch.cat(w_parts) if w_parts else None, tables, row_offsets

    def add_keys(self, bag: CachedEmbeddingBag, group: GroupInput) -> None:
        """Rows for the batch's new keys now (an open group's; a closed one has none)."""

    def open_stats(self, bag: CachedEmbeddingBag, index: int) -> dict[str, dict]:
        return {}


class ClosedGroup(TableGroup):
    """Tables of ids, concatenated into one id space behind one `CachedEmbeddingBag`."""

    def make_bag(self, cache_ratio: float, device, host_store: str, rounding_seed: int, ids_freq,
                 bookkeeping: str, **kwargs) -> CachedEmbeddingBag:
        dim, mode = self.key[:2]
        return CachedEmbeddingBag(self.num_rows, dim, mode=mode, cache_ratio=cache_ratio,
                                  ids_freq=self.frequencies(ids_freq), device=device,
                                  weight=RowInit(self.num_rows, dim, _GroupFiller(self)), host_store=host_store,
                                  rounding_seed=rounding_seed, bookkeeping=bookkeeping, **kwargs)

    def frequencies(self, ids_freq) -> torch.Tensor | None:
        """The group's rows' counts from `{table or feature name: counts}` (None: none given)."""
        if not ids_freq:
            return None
        parts = []
        for t in self.tables:
            counts = ids_freq.get(t.name)
            if counts is None:
                found = [ids_freq[f] for f in t.feature_names if f in ids_freq]
                counts = torch.stack([c.to(torch.float64) for c in found]).sum(0) if found else None
            if counts is None:
                counts = torch.zeros(t.num_embeddings)
            if counts.numel() != t.num_embeddings:
                raise ValueError(f"ids_freq for table {t.name!r} has {counts.numel()} counts, "
                                 f"the table {t.num_embeddings} rows")
            parts.append(counts.to(torch.float64).cpu())
        return torch.cat(parts)

    def input(self, values: torch.Tensor, lengths: torch.Tensor, weights: torch.Tensor | None, batch: int,
              spans: dict, errors: InputErrors | None = None) -> GroupInput:
        """The batch's ids of this group's features, each checked against its own table
        and shifted into the group's id space. `errors`: ids off the CPU checked there."""
        features, segments, w, tables, row_offsets = self._layout(weights, spans)
        if errors is None and values_on_host(values) and values_on_host(lengths):
            ids, offsets, bad_id, (bad_feature, bad_sample) = concat_features(
                values, lengths, [spans[f][1] for f in features], [spans[f][2] for f in features],
                [spans[f][0] for f in features], row_offsets, [rows for _, _, rows in tables], batch)
            if bad_id >= 0:  # the tensor path's message, from its own check
                _concat_checked(values, lengths, features, spans, tables, row_offsets)
            if bad_feature >= 0:
                raise ValueError(f"feature {features[bad_feature]!r}: sample {bad_sample} has a negative length "
                                 f"({int(lengths[spans[features[bad_feature]][0], bad_sample])})")
            return GroupInput(ids, offsets, w, features, batch, segments, layout_checked=True)
        ids, offsets = _concat_checked(values, lengths, features, spans, tables, row_offsets, errors)
        return GroupInput(ids, offsets, w, features, batch, segments)

    def table_rows(self, bag: CachedEmbeddingBag, name: str) -> dict[str, torch.Tensor] | None:
        """Table `name`'s rows and optimizer state in id order: views of the live store."""
        for t, off in zip(self.tables, self.row_offsets):
            if t.name == name:
                return bag.table_rows(slice(off, off + t.num_embeddings))
        return None

    def restore(self, bag: CachedEmbeddingBag, rows: dict[str, dict[str, torch.Tensor]], step: int) -> None:
        bag.restore_rows(
            [(off, rows[t.name]["weight"],
              {k: rows[t.name][f"optimizer.{k}"] for k in bag.optimizer_state_names()
               if f"optimizer.{k}" in rows[t.name]})
             for t, off in zip(self.tables, self.row_offsets)], step)


class OpenGroup(TableGroup):
    """Open tables of one width, pooling and retirement: one `KeyedEmbeddingBag`, its
    cache and key index shared, each table bounded on its own. `settings`: the tables'
    shared ones (retire, ttl) and, one a table, `max_rows`, `seeds`, `init_bounds`,
    `key_freqs`."""

    def __init__(self, key: tuple):
        super().__init__(key)
        self.settings: dict = {}

    def add_table(self, config: EmbeddingBagConfig, settings: dict, first_seed: int) -> None:
        """`first_seed`: the table's seed where its settings give none."""
        settings = {**settings, "seed": first_seed if settings.get("seed") is None else settings["seed"]}
        for name, listed in _OPEN_PER_TABLE.items():
            self.settings.setdefault(listed, []).append(settings.get(name))
        self.settings.update({k: v for k, v in settings.items() if k not in _OPEN_PER_TABLE})
        self.add(config)

    def make_bag(self, cache_ratio: float, device, host_store: str, rounding_seed: int, ids_freq,
                 bookkeeping: str, **kwargs) -> KeyedEmbeddingBag:
        """`ids_freq`, `bookkeeping` and `kernels` do not apply: a key's row is made on first
        sight (its counts are `key_freq`), and the key index lives on the host, so do the
        decisions (and the update is the host bookkeeper's: torch's kernels)."""
        kwargs.pop("kernels", None)
        dim, mode = self.key[:2]
        return KeyedEmbeddingBag(
            self.num_rows, dim, mode=mode, cache_ratio=cache_ratio, device=device, host_store=host_store,
            rounding_seed=rounding_seed, key_seed=self.settings["seeds"],
            init_bound=[math.sqrt(1.0 / t.num_embeddings) if b is None else b
                        for t, b in zip(self.tables, self.settings["init_bounds"])],
            max_rows=self.settings["max_rows"], retire=self.settings.get("retire", "lru"),
            ttl=self.settings.get("ttl"), key_freq=self._key_freq(), bookkeeping="host", **kwargs)

    def input(self, values: torch.Tensor, lengths: torch.Tensor, weights: torch.Tensor | None, batch: int,
              spans: dict, errors=None) -> GroupInput:
        """Raw keys: any int64, nothing to check or shift; each key's table beside it."""
        features, segments, w, tables, _ = self._layout(weights, spans)
        ids = torch.cat([values[spans[f][1]: spans[f][1] + spans[f][2]] for f in features]).long()
        all_lengths = torch.cat([lengths[spans[f][0]] for f in features])
        position = {t.name: i for i, t in enumerate(self.tables)}
        table_of = np.array([position[name] for _, name, _ in tables], dtype=np.int64)
        key_tables = torch.from_numpy(np.repeat(table_of, [spans[f][2] for f in features]))  # numpy: 5x torch's
        return GroupInput(ids, torch.cumsum(all_lengths, 0) - all_lengths, w, features, batch, segments,
                          tables=key_tables)

    def table_rows(self, bag: KeyedEmbeddingBag, name: str) -> dict[str, torch.Tensor] | None:
        """Table `name`'s live keys' rows (copies), with the keys (`KeyedEmbeddingBag.table_part`)."""
        names = [t.name for t in self.tables]
        return bag.table_part(names.index(name), self.members()) if name in names else None

    def restore(self, bag: KeyedEmbeddingBag, rows: dict[str, dict[str, torch.Tensor]], step: int) -> None:
        bag.restore_table_parts([rows[t.name] for t in self.tables], self.members(), step)

    def add_keys(self, bag: KeyedEmbeddingBag, group: GroupInput) -> None:
        bag.add_keys(group.ids, group.tables)

    def open_stats(self, bag: KeyedEmbeddingBag, index: int) -> dict[str, dict]:
        """Per table: keys live, made and retired; the shared index's (`index<i>`) bytes and live keys."""
        stats = bag.open_stats()
        return {**{t.name: bag.table_stats(j) for j, t in enumerate(self.tables)},
                f"index{index}": {"key_index_bytes": stats["key_index_bytes"], "live_keys": stats["live_keys"]}}

    def _key_freq(self) -> list | None:
        """The tables' key counts, one entry a table (None: no counts), checked with the
        table's name in any message; None where no table has counts."""
        from embcache.cache.open_keys.key_counts import KeyCounts

        freqs = self.settings["key_freqs"]
        if all(kf is None for kf in freqs):
            return None
        return [None if kf is None else KeyCounts.of(kf, f"open table {t.name!r}") for t, kf in zip(self.tables, freqs)]

    def members(self) -> int:
        """A digest of the tables' names: a checkpoint's rows go back to their own row
        numbers only into the same grouping."""
        return zlib.crc32("\n".join(t.name for t in self.tables).encode())


def group_tables(tables: list[EmbeddingBagConfig], open_tables: dict[str, dict] | None = None,
                 key_seed: int = 0) -> list[TableGroup]:
    """The tables that share a cache: one group per (dim, pooling), in order of first
    appearance; each table's rows follow the previous table's in its group. Open tables
    (named in `open_tables`) of one width, pooling and retirement form a group of their
    own: one cache and one key index, each table bounded on its own; an open table's
    seed is its settings' or `key_seed` plus its position in `tables`."""
    open_tables = open_tables or {}
    unknown = set(open_tables) - {t.name for t in tables}
    if unknown:
        raise ValueError(f"open_tables names no table: {sorted(unknown)}")
    groups: dict[tuple, TableGroup] = {}
    for position, t in enumerate(tables):
        mode = pooling_mode(t.pooling)
        if mode is None:
            raise ValueError(f"table {t.name!r}: pooling {t.pooling} not supported (SUM or MEAN)")
        settings = open_tables.get(t.name)
        if settings is None:
            groups.setdefault((t.embedding_dim, mode), ClosedGroup((t.embedding_dim, mode))).add(t)
            continue
        key = (t.embedding_dim, mode, "open", settings.get("retire", "lru"), settings.get("ttl"))
        groups.setdefault(key, OpenGroup(key)).add_table(t, settings, key_seed + position)
    return list(groups.values())


class _GroupFiller:
    """A group's initial rows, made by each table's `init_fn` (as torchrec does), for any
    range of rows: a table the range covers whole is initialised in place; one it cuts is
    initialised whole once, kept until the range moves past it, and copied from. Each
    table's `init_fn` runs once, in table order, so the values (and any use of the global
    generator) are those of one pass over the whole group."""

    def __init__(self, group: TableGroup):
        self.group = group
        self._kept: tuple[int, torch.Tensor] | None = None

    def __call__(self, out: torch.Tensor, start: int) -> None:
        stop = start + out.shape[0]
        for i, (t, off) in enumerate(zip(self.group.tables, self.group.row_offsets)):
            lo, hi = max(start, off), min(stop, off + t.num_embeddings)
            if lo >= hi:
                continue
            if lo == off and hi == off + t.num_embeddings:
                t.init_fn(out[lo - start: hi - start])
                continue
            if self._kept is None or self._kept[0] != i:
                whole = torch.empty(t.num_embeddings, out.shape[1])
                t.init_fn(whole)
                self._kept = (i, whole)
            out[lo - start: hi - start] = self._kept[1][lo - off: hi - off]


def _concat_checked(values, lengths, features, spans, tables, row_offsets, errors=None):
    """`concat_features` as tensor ops (ids not on the CPU), or the message of its check
    (`errors`: kept there, the ids made harmless; see `nn.input_errors`)."""
    id_parts = [values[spans[f][1]: spans[f][1] + spans[f][2]] for f in features]
    counts = [p.numel() for p in id_parts]
    ids = torch.cat(id_parts)
    if errors is None:
        check_feature_ids(ids, counts, tables)
    elif ids.numel():
        ids = check_feature_ids_on_device(ids, counts, tables, errors)
    ids = ids.long()
    if any(row_offsets):  # into the group's id space
        ids += torch.repeat_interleave(host_numbers(row_offsets, ids.device), host_numbers(counts, ids.device),
                                       output_size=ids.numel())
    all_lengths = torch.cat([lengths[spans[f][0]] for f in features])
    offsets = torch.cumsum(all_lengths, 0) - all_lengths
    return ids, offsets
