"""`CachedEmbeddingBagCollection`: a drop-in for torchrec's `EmbeddingBagCollection`
whose tables share one cache.

Tables with the same embedding dimension and pooling are concatenated into one id space
(table t's row r is row `offset_t + r`) behind a single `CachedEmbeddingBag`, so one
cache of `ceil(cache_ratio * total_rows)` rows serves them all and the hot rows of every
table compete for the same slots. A whole batch of every feature is one embedding-bag
call per group (in DLRM: one call). The groups, closed (ids) and open (raw keys, a
`KeyedEmbeddingBag` each), are `nn.table_groups`'.
"""
from __future__ import annotations

import os
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from pathlib import Path

import torch
from torch import nn

from embcache.device import resolve_device, values_on_host
from embcache.sparse_types import (CollectionInterface, EmbeddingBagConfig, KeyedJaggedTensor, KeyedTensor,
                                   known_length_per_key)

from embcache.cache.stores.host_store import MMAP_PREFIX, parse_host_store
from embcache.cache.stores.table_files import fresh_directory

from .bag_input import ID_DTYPES, check_layout, check_weights
from .input_errors import InputErrors
from .prefetch_ticket import PrefetchTicket, TakesTickets
from .rows_only import collection_rows_only, torchrec_state_dict, torchrec_tables
from .table_groups import GroupInput, group_tables



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
        kernels: "auto" | "torch" | "triton", passed to each closed group's bag (open
            tables keep torch's, as they keep the host bookkeeper).
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
        # an open table's seed: its settings', else `key_seed` plus the table's position
        self._groups = group_tables(tables, open_tables, key_seed=kwargs.pop("key_seed", 0))
        self.bags = nn.ModuleList()
        directory = parse_host_store(host_store)
        rounding_seed = kwargs.pop("rounding_seed", 0)
        for i, g in enumerate(self._groups):
            store = "memory" if directory is None else f"{MMAP_PREFIX}{directory / f'group{i}'}"
            # groups' row ids overlap: their rounding bits must not
            self.bags.append(g.make_bag(cache_ratio, self._device, store, rounding_seed + i * 0x9E3779B9,
                                        ids_freq=ids_freq, bookkeeping=bookkeeping, **kwargs))
        self._feature_to_table = {f: t for t in tables for f in t.feature_names}
        self.input_errors = InputErrors()  # what device batches' checks found, raised when read
        self._rows_only_prefix: str | None = None  # a load of torchrec's form under way (`nn.rows_only`)
        self.register_load_state_dict_post_hook(_drop_bags_missing_after_rows_only)

    # --------------------------------------------------------- torchrec's interface
    @torch.compiler.disable  # a compile boundary: torch.compile of a model holding it traces around it
    def forward(self, features: KeyedJaggedTensor, ticket: PrefetchTicket | None = None) -> KeyedTensor:
        """torchrec's forward. `ticket`: what `prefetch` returned for this batch (or given
        by `taking`): its group inputs are reused and each cache takes its prefetch."""
        ticket = self._ticket_for(features, ticket)
        groups = ticket.groups if ticket is not None else self._group_inputs(features)
        tickets = ticket.bags if ticket is not None else [None] * len(groups)
        # every group is checked before any group's cache changes; a batch from the host
        # is checked there (no device sync), and only checked input moves to the device
        groups = [self._checked(bag, group) for bag, group in zip(self.bags, groups)]
        pooled: dict[str, torch.Tensor] = {}
        padded = getattr(features, "padded_samples", 0)  # samples that only pad (`nn.fixed_capacity`): dropped
        for bag, group, bag_ticket in zip(self.bags, groups, tickets):
            out = bag.lookup_checked(group.ids, group.offsets, group.weights, group.segments, group.tables,
                                     bag_ticket, padded=(group.batch, padded) if padded else None)
            out = out.view(len(group.features), group.batch, bag.embedding_dim)
            if padded:
                out = out[:, : group.batch - padded]
            if len(self._groups) == 1:
                values = out.transpose(0, 1).reshape(group.batch - padded, -1)
                return KeyedTensor(keys=group.features, length_per_key=self._lengths_per_embedding,
                                   values=values)
            pooled.update(zip(group.features, out.unbind(0)))
        values = torch.cat([pooled[f] for f in self._feature_names], dim=1)
        return KeyedTensor(keys=self._feature_names, length_per_key=self._lengths_per_embedding,
                           values=values)

    def _checked(self, bag, group: GroupInput) -> GroupInput:
        """`group`'s layout and weights checked: on the host, or on the device for a batch
        there (`nn.input_errors`: kept in `input_errors`, the group made harmless)."""
        errors = self._device_errors(group.ids)
        offsets = group.offsets
        if not group.layout_checked:
            offsets = check_layout(group.ids, group.offsets, group.weights, errors)[1]
        weights = check_weights(group.weights, bag.mode, errors)
        return group if errors is None else replace(group, offsets=offsets, weights=weights)

    def _device_errors(self, ids: torch.Tensor) -> InputErrors | None:
        """Where the value checks of a batch go: the ledger for ids off the CPU, else None
        (checked on the host, where reading them costs no sync)."""
        return None if values_on_host(ids) else self.input_errors

    def raise_input_errors(self) -> None:
        """Raise what the checks of a batch on the device found (see `nn.input_errors`), if
        any: this collection's and its bags'. The collection does when its stats, rows or
        checkpoint are read; a trainer where it reads the step's loss."""
        self.input_errors.raise_pending()
        for bag in self.bags:
            bag.raise_input_errors()

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

    def _group_inputs(self, kjt: KeyedJaggedTensor) -> list[GroupInput]:
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
        per_key = known_length_per_key(kjt)  # carried by the batch: no sync (a captured step's)
        if per_key is None:
            per_key = lengths.sum(1).tolist()  # one sync for all features (none on the host)
        spans, start = {}, 0
        for i, (key, n) in enumerate(zip(keys, per_key)):
            spans[key] = (i, start, n)
            start += n
        errors = self._device_errors(values)
        return [g.input(values, lengths, weights, batch, spans, errors) for g in self._groups]

    # --------------------------------------------------------- state dicts of torchrec's form
    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        """torchrec's `EmbeddingBagCollection` state dict (`embedding_bags.<table>.weight`,
        say inside a torchrec DLRM's) loads too: the rows only (`nn.rows_only`)."""
        given = torchrec_tables(self, state_dict, prefix)
        if given:
            self._rows_only_prefix = prefix
            collection_rows_only(self, state_dict, prefix, given, missing_keys, error_msgs)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    def torchrec_state_dict(self, prefix: str = "") -> dict[str, torch.Tensor]:
        """Every table's current rows (copies) under torchrec's names, for
        `torchrec.EmbeddingBagCollection.load_state_dict`; `prefix` as in a model's state
        dict (`"sparse_arch.embedding_bag_collection."` in a DLRM). Tables of raw keys
        have no such form (ValueError)."""
        self.raise_input_errors()
        return torchrec_state_dict(self, prefix)

    def table_groups(self) -> list:
        """The tables grouped by the cache they share, one group a bag (`nn.table_groups`)."""
        return list(self._groups)

    # --------------------------------------------------------- the cache's interface
    def requires_grad_(self, requires_grad: bool = True) -> "CachedEmbeddingBagCollection":
        """Freeze (False) or thaw every table: torch's `requires_grad_` reaches parameters
        only, and the rows are none (`CachedEmbeddingBag.requires_grad_`)."""
        for bag in self.bags:
            bag.requires_grad_(requires_grad)
        return self

    def flush(self) -> None:
        self.raise_input_errors()
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
        self.raise_input_errors()
        return combine_stats(bag.cache_stats() for bag in self.bags)

    # --------------------------------------------------------- tables in id order
    def table_rows(self, name: str) -> dict[str, torch.Tensor]:
        """Table `name`'s rows and their optimizer state (`weight`, `optimizer.<k>`), in
        id order and current: views of the live host store, not copies. An open table's
        are the rows of its live keys (copies), with the keys, their usage and what its
        shared index needs to be rebuilt (`open.<k>`, see `OpenTable.table_part`)."""
        for bag, g in zip(self.bags, self._groups):
            rows = g.table_rows(bag, name)
            if rows is not None:
                return rows
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
            g.restore(bag, rows, step)

    def save_checkpoint(self, directory: str | os.PathLike) -> None:
        """Every group's `RowCache.save_checkpoint` under `directory`/group<i>, written
        together into a temporary directory renamed into place: all groups or none. For
        tables on a mapped store, which training on keeps rewriting."""
        self.raise_input_errors()
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
        for bag, g, group in zip(self.bags, self._groups, self._group_inputs(features)):
            g.add_keys(bag, group)

    def open_stats(self) -> dict[str, dict]:
        """Per open table: keys live, made and retired; per shared key index (`index<i>`),
        its bytes and live keys."""
        return {k: v for i, (bag, g) in enumerate(zip(self.bags, self._groups)) for k, v in g.open_stats(bag, i).items()}


def _drop_bags_missing_after_rows_only(collection: CachedEmbeddingBagCollection, incompatible) -> None:
    """After a load of torchrec's form, the bags' own keys were never expected: not missing."""
    prefix, collection._rows_only_prefix = collection._rows_only_prefix, None
    if prefix is not None:
        incompatible.missing_keys[:] = [k for k in incompatible.missing_keys if not k.startswith(prefix + "bags.")]


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
