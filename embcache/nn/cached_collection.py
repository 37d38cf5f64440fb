"""`CachedEmbeddingBagCollection`: a drop-in for torchrec's `EmbeddingBagCollection`
whose tables share one cache.

Tables with the same embedding dimension and pooling are concatenated into one id space
(table t's row r is row `offset_t + r`) behind a single `CachedEmbeddingBag`, so one
cache of `ceil(cache_ratio * total_rows)` rows serves them all and the hot rows of every
table compete for the same slots. A whole batch of every feature is one embedding-bag
call per group (in DLRM: one call).
"""
from __future__ import annotations

import math
import os
import zlib
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from embcache.device import resolve_device
from embcache.sparse_types import CollectionInterface, EmbeddingBagConfig, KeyedJaggedTensor, KeyedTensor, pooling_mode

from embcache.cache.host_store import MMAP_PREFIX, RowInit, parse_host_store
from embcache.cache.table_files import fresh_directory

from .bag_input import ID_DTYPES, check_feature_ids, check_layout, check_weights, to_device
from .cached_embedding_bag import CachedEmbeddingBag
from .group_kernels import concat_features
from .prefetch_ticket import PrefetchTicket, TakesTickets


class _Group:
    """Tables sharing one cache: their features in output order and row offsets."""

    def __init__(self, key, open_settings: dict | None = None):
        self.key = key
        # open tables' settings (retire, ttl, max_rows a table): their keys share one index
        # (the table itself, an `OpenTable`, is the group's bag's `open`)
        self.open_settings = open_settings
        self.tables: list[EmbeddingBagConfig] = []
        self.row_offsets: list[int] = []
        self.num_rows = 0

    def add(self, config: EmbeddingBagConfig) -> None:
        self.tables.append(config)
        self.row_offsets.append(self.num_rows)
        self.num_rows += config.num_embeddings


@dataclass
class _GroupInput:
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


def group_tables(tables: list[EmbeddingBagConfig], open_tables: dict[str, dict] | None = None) -> list[_Group]:
    """The tables that share a cache: one group per (dim, pooling), in order of first
    appearance; each table's rows follow the previous table's in its group. Open tables
    (named in `open_tables`) of one width, pooling and retirement form a group of their
    own: one cache and one key index, each table bounded on its own."""
    open_tables = open_tables or {}
    unknown = set(open_tables) - {t.name for t in tables}
    if unknown:
        raise ValueError(f"open_tables names no table: {sorted(unknown)}")
    groups: dict[tuple, _Group] = {}
    for t in tables:
        mode = pooling_mode(t.pooling)
        if mode is None:
            raise ValueError(f"table {t.name!r}: pooling {t.pooling} not supported (SUM or MEAN)")
        settings = open_tables.get(t.name)
        if settings is None:
            key = (t.embedding_dim, mode)
        else:  # open tables of one width, pooling and retirement share a cache and a key index
            key = (t.embedding_dim, mode, "open", settings.get("retire", "lru"), settings.get("ttl"))
        group = groups.setdefault(key, _Group(key, {} if settings is not None else None))
        if settings is not None:
            group.open_settings.setdefault("max_rows", []).append(settings.get("max_rows"))
            group.open_settings.setdefault("seeds", []).append(settings.get("seed"))
            group.open_settings.setdefault("init_bounds", []).append(settings.get("init_bound"))
            group.open_settings.setdefault("key_freqs", []).append(settings.get("key_freq"))
            group.open_settings.update({k: v for k, v in settings.items()
                               if k not in ("max_rows", "seed", "init_bound", "key_freq")})
        group.add(t)
    return list(groups.values())


class CachedEmbeddingBagCollection(TakesTickets, CollectionInterface, nn.Module):
    """torchrec-compatible collection of cached embedding bags.

    Args:
        tables: `EmbeddingBagConfig`s (torchrec's, or `sparse_types`' stand-in without
            torchrec; SUM or MEAN pooling); each table's
            `init_fn` initialises its rows, as in torchrec.
        cache_ratio: fraction of all rows resident on the device.
        ids_freq: `{table or feature name: 1-D counts}` from the training data.
        is_weighted: use the KJT's weights as per-sample weights.
        device: None picks CUDA when available.
        host_store: "memory" or "mmap:DIR"; with several groups (dims or poolings), group
            i's files go under DIR/group<i>. A mapped group is initialised chunk by chunk:
            at most one table's `init_fn` output is in memory at a time.
        open_tables: `{table name: {"max_rows": .., "retire": .., "ttl": .., "seed": ..}}`
            (settings optional): tables fed raw 64-bit keys instead of ids
            (`CachedEmbeddingBag`'s `keys="raw"`), each a row on first sight;
            `num_embeddings` is then the keys expected. Open tables of one width, pooling
            and retirement share a cache (of `cache_ratio` of their expected keys) and a key
            index. `seed` seeds a table's first rows and its keys' salt (default: `key_seed`
            plus the table's position here; a sharded collection passes the model's);
            `init_bound` bounds its first rows (default `sqrt(1 / num_embeddings)`; a
            shard of a table split by key hash passes the whole table's). `key_freq`:
            its keys' counts, `(keys, counts)` as `load_key_frequencies` gives a
            feature's: the `freq` policy's prior for the rows its keys take, as `ids_freq`
            is a closed table's (a shard of a table split by key hash may take the whole
            table's: only its own keys are looked up).
        bookkeeping: "auto" | "host" | "device": where each group's cache decides which row
            sits where (`CachedEmbeddingBag`); open tables' groups keep the host bookkeeper
            (their key index lives on the host) whatever this says.
        **kwargs: passed to each `CachedEmbeddingBag` (eviction, optimizer, lr, eps,
            row_dtype, rounding, ...).

    Example:
        >>> import torch
        >>> from embcache.sparse_types import EmbeddingBagConfig, KeyedJaggedTensor
        >>> tables = [EmbeddingBagConfig(name="t0", embedding_dim=4, num_embeddings=100,
        ...                              feature_names=["f0"])]
        >>> ebc = CachedEmbeddingBagCollection(tables, cache_ratio=0.1, device="cpu")
        >>> kjt = KeyedJaggedTensor(keys=["f0"], values=torch.tensor([1, 2, 3]),
        ...                         lengths=torch.tensor([2, 1]))
        >>> ebc(kjt).values().shape
        torch.Size([2, 4])
    """

    def __init__(self, tables: list[EmbeddingBagConfig], cache_ratio: float = 0.015,
                 ids_freq: dict[str, torch.Tensor] | None = None, is_weighted: bool = False,
                 device: torch.device | str | None = None, host_store: str = "memory",
                 open_tables: dict[str, dict] | None = None, bookkeeping: str = "auto", **kwargs):
        super().__init__()
        if not tables:
            raise ValueError("CachedEmbeddingBagCollection needs at least one table")
        names = [t.name for t in tables]
        if len(set(names)) != len(names):
            raise ValueError(f"table names must be unique, got {names}")
        self._configs = list(tables)
        self._is_weighted = is_weighted
        self._device = resolve_device(device)
        self._feature_names = [f for t in tables for f in t.feature_names]
        if len(set(self._feature_names)) != len(self._feature_names):
            raise ValueError("a feature may be served by one table only")
        self._lengths_per_embedding = [t.embedding_dim for t in tables for _ in t.feature_names]
        self._groups = group_tables(tables, open_tables)
        self.bags = nn.ModuleList()
        directory = parse_host_store(host_store)
        rounding_seed = kwargs.pop("rounding_seed", 0)
        key_seed = kwargs.pop("key_seed", 0)  # an open table's seed: this plus the table's position
        for i, g in enumerate(self._groups):
            dim, mode = g.key[:2]
            freq = self._group_frequencies(g, ids_freq)
            store = "memory" if directory is None else f"{MMAP_PREFIX}{directory / f'group{i}'}"
            if g.open_settings is not None:
                bounds = g.open_settings["max_rows"]
                self.bags.append(CachedEmbeddingBag(
                    g.num_rows, dim, mode=mode, cache_ratio=cache_ratio, device=self._device, host_store=store,
                    rounding_seed=rounding_seed + i * 0x9E3779B9, keys="raw",
                    key_seed=[key_seed + self._configs.index(t) if seed is None else seed
                              for t, seed in zip(g.tables, g.open_settings["seeds"])],
                    init_bound=[math.sqrt(1.0 / t.num_embeddings) if b is None else b
                                for t, b in zip(g.tables, g.open_settings["init_bounds"])],
                    max_rows=bounds, retire=g.open_settings.get("retire", "lru"),
                    ttl=g.open_settings.get("ttl"), key_freq=_key_freq(g), bookkeeping="host", **kwargs))
                continue
            self.bags.append(CachedEmbeddingBag(g.num_rows, dim, mode=mode, cache_ratio=cache_ratio,
                                                ids_freq=freq, device=self._device,
                                                weight=RowInit(g.num_rows, dim, _GroupFiller(g)),
                                                host_store=store, rounding_seed=rounding_seed + i * 0x9E3779B9,
                                                bookkeeping=bookkeeping, **kwargs))  # groups' row ids overlap: their rounding bits must not
        self._feature_to_table = {f: t for t in tables for f in t.feature_names}

    @staticmethod
    def _group_frequencies(group: _Group, ids_freq) -> torch.Tensor | None:
        if not ids_freq:
            return None
        parts = []
        for t in group.tables:
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

    # --------------------------------------------------------- torchrec's interface
    @torch.compiler.disable  # a compile boundary: torch.compile of a model holding it traces around it
    def forward(self, features: KeyedJaggedTensor, ticket: PrefetchTicket | None = None) -> KeyedTensor:
        """torchrec's forward. `ticket`: what `prefetch` returned for this batch (or given
        by `taking`): its group inputs are reused and each cache takes its prefetch."""
        ticket = self._ticket_for(features, ticket)
        groups = ticket.groups if ticket is not None else self._group_inputs(features)
        tickets = ticket.bags if ticket is not None else [None] * len(groups)
        for bag, group in zip(self.bags, groups):
            if not group.layout_checked:
                check_layout(group.ids, group.offsets, group.weights)
            check_weights(group.weights, bag.mode)
        # every group is checked before any group's cache changes; a batch from the host
        # is checked there (no device sync), and only checked input moves to the device
        pooled: dict[str, torch.Tensor] = {}
        for bag, group, bag_ticket in zip(self.bags, groups, tickets):
            ids = group.ids
            if bag.open is not None:
                ids, bag_ticket = bag.rows_of_keys(ids, group.tables, bag_ticket)
            out = bag.lookup_normalized(*to_device(ids, group.offsets, group.weights, bag.device),
                                        segments=group.segments, ticket=bag_ticket)
            out = out.view(len(group.features), group.batch, bag.embedding_dim)
            if len(self._groups) == 1:
                values = out.transpose(0, 1).reshape(group.batch, -1)
                return KeyedTensor(keys=group.features, length_per_key=self._lengths_per_embedding,
                                   values=values)
            pooled.update(zip(group.features, out.unbind(0)))
        values = torch.cat([pooled[f] for f in self._feature_names], dim=1)
        return KeyedTensor(keys=self._feature_names, length_per_key=self._lengths_per_embedding,
                           values=values)

    @torch.compiler.disable
    def prefetch(self, features: KeyedJaggedTensor) -> PrefetchTicket:
        """Load the rows a coming batch needs (see `CachedEmbeddingBag.prefetch`); returns
        the ticket that batch's forward takes. The ids go as they are (from the loader: on
        the host): the cache decides where its bookkeeping runs and moves only rows."""
        groups = self._group_inputs(features)
        bags = [bag.prefetch_ids(group.ids, group.tables) for bag, group in zip(self.bags, groups)]
        return PrefetchTicket.of(features, groups=groups, bags=bags)

    def pending_prefetches(self) -> int:
        """Prefetched batches not yet looked up (every group's cache gets each prefetch, so
        they agree). A resumed cache has the checkpoint's (a trainer's checkpoint records
        how many it made; one of earlier versions is asked this once)."""
        return min(bag.pending_prefetches() for bag in self.bags)

    def _group_inputs(self, kjt: KeyedJaggedTensor) -> list[_GroupInput]:
        """Each group's lookups in its concatenated id space, every id checked against
        its own table (one comparison per group). Layout and weights are the caller's to
        check: a prefetch does not need them."""
        keys = kjt.keys()
        missing = [f for f in self._feature_names if f not in keys]
        if missing:
            raise ValueError(f"KeyedJaggedTensor lacks features {missing}")
        if kjt.variable_stride_per_key():
            raise ValueError("variable batch size per feature is not supported")
        batch = kjt.stride()
        lengths = kjt.lengths().view(len(keys), batch)
        values = kjt.values()
        if values.dtype not in ID_DTYPES:
            raise ValueError(f"feature ids must be int64 or int32, got {values.dtype}")
        weights = kjt.weights_or_none() if self._is_weighted else None
        if self._is_weighted and weights is None:
            raise ValueError("this collection is weighted but the KeyedJaggedTensor has no weights")
        per_key = lengths.sum(1).tolist()  # one sync for all features (none on the host)
        spans, start = {}, 0
        for i, (key, n) in enumerate(zip(keys, per_key)):
            spans[key] = (i, start, n)
            start += n
        return [_group_input(g, values, lengths, weights, batch, spans) for g in self._groups]

    # --------------------------------------------------------- the cache's interface
    def flush(self) -> None:
        for bag in self.bags:
            bag.flush()

    def table_weight(self, name: str) -> torch.Tensor:
        """Table `name`'s `[num_embeddings, D]` rows, current to the last update (a view
        of the live host store, not a copy: it changes as training goes on)."""
        for bag, g in zip(self.bags, self._groups):
            for t, off in zip(g.tables, g.row_offsets):
                if t.name == name:
                    return bag.host_weight()[off: off + t.num_embeddings]
        raise KeyError(f"no table named {name!r}")

    def cache_stats(self) -> dict:
        return combine_stats(bag.cache_stats() for bag in self.bags)

    # --------------------------------------------------------- tables in id order
    def table_rows(self, name: str) -> dict[str, torch.Tensor]:
        """Table `name`'s rows and their optimizer state (`weight`, `optimizer.<k>`), in
        id order and current: views of the live host store, not copies. An open table's
        are the rows of its live keys (copies), with the keys, their usage and what its
        shared index needs to be rebuilt (`open.<k>`, see `OpenTable.table_part`)."""
        for bag, g in zip(self.bags, self._groups):
            if g.open_settings is not None and name in [t.name for t in g.tables]:  # its keys' rows, with the keys
                part = bag.open.table_part([t.name for t in g.tables].index(name), _members(g))
                return {**bag.table_rows(torch.from_numpy(part["rows"] + 1)),
                        **{f"open.{k}": torch.from_numpy(v.reshape(-1, 1)) for k, v in part.items()}}
            for t, off in zip(g.tables, g.row_offsets):
                if t.name == name:
                    return bag.table_rows(slice(off, off + t.num_embeddings))
        raise KeyError(f"no table named {name!r}")

    def optimizer_steps(self) -> int:
        """Row-optimizer steps taken (the same in every bag: one per training step)."""
        return self.bags[0].optimizer_steps()

    def restore_tables(self, rows: dict[str, dict[str, torch.Tensor]], step: int) -> None:
        """Every table's rows and optimizer state (as `table_rows` gives them), with the
        caches empty: the resume of a run whose residency does not fit this one."""
        missing = [t.name for t in self._configs if t.name not in rows]
        if missing:
            raise ValueError(f"no saved rows for table(s) {', '.join(missing)}")
        for bag, g in zip(self.bags, self._groups):
            if g.open_settings is not None:  # keys first: they say where the rows go
                parts = [rows[t.name] for t in g.tables]
                where = bag.open.load_table_parts(
                    [{k[len("open."):]: v.numpy() for k, v in p.items() if k.startswith("open.")} for p in parts],
                    _members(g))
                bag.restore_rows_at(torch.from_numpy(where), torch.cat([p["weight"] for p in parts]),
                                    {k: torch.cat([p[f"optimizer.{k}"] for p in parts])
                                     for k in bag.optimizer_state_names()}, step, num_rows=bag.open.rows_needed())
                bag.open.restore_prior(bag.cache)
                continue
            bag.restore_rows(
                [(off, rows[t.name]["weight"],
                  {k: rows[t.name][f"optimizer.{k}"] for k in bag.optimizer_state_names()
                   if f"optimizer.{k}" in rows[t.name]})
                 for t, off in zip(g.tables, g.row_offsets)], step)

    def save_checkpoint(self, directory: str | os.PathLike) -> None:
        """Every group's `RowCache.save_checkpoint` under `directory`/group<i>, written
        together into a temporary directory renamed into place: all groups or none. For
        tables on a mapped store, which training on keeps rewriting."""
        with fresh_directory(Path(directory)) as tmp:
            for i, bag in enumerate(self.bags):
                (tmp / f"group{i}").mkdir()
                bag.write_checkpoint(tmp / f"group{i}")

    def load_checkpoint(self, directory: str | os.PathLike) -> None:
        """Resume from `save_checkpoint`: every group checked (sizes, CRC-32, cache
        state) before any changes."""
        checked = [bag.check_checkpoint(Path(directory) / f"group{i}") for i, bag in enumerate(self.bags)]
        for bag, ready in zip(self.bags, checked):
            bag.restore_checkpoint(ready)

    def residency_state(self) -> dict[str, torch.Tensor]:
        """`state_dict()` without the tables and optimizer state: what the cache holds and
        its counters, which with the tables saved apart restore a run exactly."""
        return {k: v for k, v in self.state_dict().items() if not _is_table_key(k)}

    def load_residency(self, residency: dict[str, torch.Tensor]) -> None:
        """Restore `residency_state()` over the tables already in place."""
        full = self.state_dict()
        full.update(residency)
        self.load_state_dict(full)

    def load_stats(self, totals: dict) -> None:
        """Set the statistics to `totals` (kept by the first bag, the rest zero): counts
        carried over from a run whose caches were laid out otherwise."""
        for i, bag in enumerate(self.bags):
            bag.load_stats(totals if i == 0 else {})

    @contextmanager
    def separate_stats(self):
        """Count the lookups of a block (say, validation) apart: yields a function that
        returns the block's combined statistics; `cache_stats()` is as before the block."""
        with ExitStack() as stack:
            inner = [stack.enter_context(bag.separate_stats()) for bag in self.bags]
            yield lambda: combine_stats(s.as_dict() for s in inner)

    @contextmanager
    def evaluation(self):
        """`separate_stats` with every bag read-only (`CachedEmbeddingBag.evaluation`): a
        validation pass leaves the working sets as training left them."""
        with ExitStack() as stack:
            inner = [stack.enter_context(bag.evaluation()) for bag in self.bags]
            yield lambda: combine_stats(s.as_dict() for s in inner)

    def reset_cache_stats(self) -> None:
        for bag in self.bags:
            bag.reset_cache_stats()

    def cache_rows(self) -> int:
        return sum(bag.cache_rows() for bag in self.bags)

    def add_keys(self, features: KeyedJaggedTensor) -> None:
        """Give the keys of `features` rows in their open tables now, at the values their
        first sight in training would give them (known keys unchanged, no use counted):
        open tables started with keys they are known to meet. Closed tables ignore it."""
        for bag, group in zip(self.bags, self._group_inputs(features)):
            if bag.open is not None:
                bag.open.add(group.ids, bag.cache, group.tables)

    def open_stats(self) -> dict[str, dict]:
        """Per open table: keys live, made and retired; per shared key index (`index<i>`),
        its bytes and live keys."""
        out = {}
        for i, (bag, g) in enumerate(zip(self.bags, self._groups)):
            if g.open_settings is not None:
                out.update({t.name: bag.open.table_stats(j) for j, t in enumerate(g.tables)})
                stats = bag.open_stats()
                out[f"index{i}"] = {"key_index_bytes": stats["key_index_bytes"], "live_keys": stats["live_keys"]}
        return out


class _GroupFiller:
    """A group's initial rows, made by each table's `init_fn` (as torchrec does), for any
    range of rows: a table the range covers whole is initialised in place; one it cuts is
    initialised whole once, kept until the range moves past it, and copied from. Each
    table's `init_fn` runs once, in table order, so the values (and any use of the global
    generator) are those of one pass over the whole group."""

    def __init__(self, group: _Group):
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


def _group_input(group: _Group, values: torch.Tensor, lengths: torch.Tensor,
                 weights: torch.Tensor | None, batch: int, spans: dict) -> _GroupInput:
    """`spans`: feature -> (its row of `lengths`, where its ids start in `values`, how
    many there are)."""
    features, segments, w_parts, tables, row_offsets = [], [], [], [], []
    for t, row_offset in zip(group.tables, group.row_offsets):
        segments.append([])
        for f in t.feature_names:
            i, s, n = spans[f]
            tables.append((f, t.name, t.num_embeddings))
            row_offsets.append(row_offset)
            segments[-1].append(n)
            if weights is not None:
                w_parts.append(weights[s: s + n])
            features.append(f)
    w = torch.cat(w_parts) if w_parts else None
    if group.open_settings is not None:  # raw keys: any int64, nothing to check or shift; each key's table
        ids = torch.cat([values[spans[f][1]: spans[f][1] + spans[f][2]] for f in features]).long()
        all_lengths = torch.cat([lengths[spans[f][0]] for f in features])
        position = {t.name: i for i, t in enumerate(group.tables)}
        table_of = np.array([position[name] for _, name, _ in tables], dtype=np.int64)
        key_tables = torch.from_numpy(np.repeat(table_of, [spans[f][2] for f in features]))  # numpy: 5x torch's
        return _GroupInput(ids, torch.cumsum(all_lengths, 0) - all_lengths, w, features, batch, segments,
                           tables=key_tables)
    if values.device.type == "cpu" and lengths.device.type == "cpu":
        ids, offsets, bad_id, (bad_feature, bad_sample) = concat_features(
            values, lengths, [spans[f][1] for f in features], [spans[f][2] for f in features],
            [spans[f][0] for f in features], row_offsets, [rows for _, _, rows in tables], batch)
        if bad_id >= 0:  # the tensor path's message, from its own check
            _concat_checked(values, lengths, features, spans, tables, row_offsets)
        if bad_feature >= 0:
            raise ValueError(f"feature {features[bad_feature]!r}: sample {bad_sample} has a negative length "
                             f"({int(lengths[spans[features[bad_feature]][0], bad_sample])})")
        return _GroupInput(ids, offsets, w, features, batch, segments, layout_checked=True)
    ids, offsets = _concat_checked(values, lengths, features, spans, tables, row_offsets)
    return _GroupInput(ids, offsets, w, features, batch, segments)


def _concat_checked(values, lengths, features, spans, tables, row_offsets):
    """`concat_features` as tensor ops (ids not on the CPU), or the message of its check."""
    id_parts = [values[spans[f][1]: spans[f][1] + spans[f][2]] for f in features]
    counts = [p.numel() for p in id_parts]
    ids = torch.cat(id_parts)
    check_feature_ids(ids, counts, tables)
    ids = ids.long()
    if any(row_offsets):  # into the group's id space
        ids += torch.repeat_interleave(torch.tensor(row_offsets, device=ids.device),
                                       torch.tensor(counts, device=ids.device), output_size=ids.numel())
    all_lengths = torch.cat([lengths[spans[f][0]] for f in features])
    offsets = torch.cumsum(all_lengths, 0) - all_lengths
    return ids, offsets


def _key_freq(group: _Group) -> list | None:
    """An open group's key counts, one entry a table (None: no counts), checked with the
    table's name in any message; None where no table has counts."""
    from embcache.cache.key_counts import KeyCounts

    freqs = group.open_settings["key_freqs"]
    if all(kf is None for kf in freqs):
        return None
    return [None if kf is None else KeyCounts.of(kf, f"open table {t.name!r}") for t, kf in zip(group.tables, freqs)]


def _members(group: _Group) -> int:
    """A digest of an open group's table names: a checkpoint's rows go back to their own
    row numbers only into the same grouping."""
    return zlib.crc32("\n".join(t.name for t in group.tables).encode())


def _is_table_key(key: str) -> bool:
    tail = key.split(".", 2)[-1]  # "bags.0.weight" -> "weight", "bags.0.optimizer.sum" -> "optimizer.sum"
    return tail == "weight" or tail.startswith("optimizer.")


def combine_stats(per_cache) -> dict:
    """Several caches' statistics as one: counts add up; the hit rate is recomputed."""
    total: dict = {}
    for stats in per_cache:
        for k, v in stats.items():
            if k != "hit_rate":
                total[k] = total.get(k, 0) + v
    lookups = total["hits"] + total["misses"]
    total["hit_rate"] = total["hits"] / lookups if lookups else 0.0
    return total
