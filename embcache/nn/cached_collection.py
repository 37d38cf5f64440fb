"""`CachedEmbeddingBagCollection`: a drop-in for torchrec's `EmbeddingBagCollection`
whose tables share one cache.

Tables with the same embedding dimension and pooling are concatenated into one id space
(table t's row r is row `offset_t + r`) behind a single `CachedEmbeddingBag`, so one
cache of `ceil(cache_ratio * total_rows)` rows serves them all and the hot rows of every
table compete for the same slots. A whole batch of every feature is one embedding-bag
call per group (in DLRM: one call).
"""
from __future__ import annotations

from contextlib import ExitStack, contextmanager

import torch
from torch import nn
from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor, KeyedTensor

from embcache.device import resolve_device

from .cached_embedding_bag import CachedEmbeddingBag

_POOLING = {PoolingType.SUM: "sum", PoolingType.MEAN: "mean"}


class _Group:
    """Tables sharing one cache: their features in output order and row offsets."""

    def __init__(self, key):
        self.key = key
        self.tables: list[EmbeddingBagConfig] = []
        self.row_offsets: list[int] = []
        self.num_rows = 0

    def add(self, config: EmbeddingBagConfig) -> None:
        self.tables.append(config)
        self.row_offsets.append(self.num_rows)
        self.num_rows += config.num_embeddings


class CachedEmbeddingBagCollection(nn.Module):
    """torchrec-compatible collection of cached embedding bags.

    Args:
        tables: torchrec `EmbeddingBagConfig`s (SUM or MEAN pooling); each table's
            `init_fn` initialises its rows, as in torchrec.
        cache_ratio: fraction of all rows resident on the device.
        ids_freq: `{table or feature name: 1-D counts}` from the training data.
        is_weighted: use the KJT's weights as per-sample weights.
        device: None picks CUDA when available.
        **kwargs: passed to each `CachedEmbeddingBag` (eviction, optimizer, lr, eps, ...).

    Example:
        >>> from torchrec import EmbeddingBagConfig, KeyedJaggedTensor
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
                 device: torch.device | str | None = None, **kwargs):
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
        groups: dict[tuple, _Group] = {}
        for t in tables:
            if t.pooling not in _POOLING:
                raise ValueError(f"table {t.name!r}: pooling {t.pooling} not supported (SUM or MEAN)")
            key = (t.embedding_dim, _POOLING[t.pooling])
            groups.setdefault(key, _Group(key)).add(t)
        self._groups = list(groups.values())
        self.bags = nn.ModuleList()
        for g in self._groups:
            dim, mode = g.key
            weight = torch.empty(g.num_rows, dim)
            for t, off in zip(g.tables, g.row_offsets):
                t.init_fn(weight[off: off + t.num_embeddings])
            freq = self._group_frequencies(g, ids_freq)
            self.bags.append(CachedEmbeddingBag(g.num_rows, dim, mode=mode, cache_ratio=cache_ratio,
                                                ids_freq=freq, device=self._device, weight=weight,
                                                **kwargs))
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
    def embedding_bag_configs(self) -> list[EmbeddingBagConfig]:
        return self._configs

    def is_weighted(self) -> bool:
        return self._is_weighted

    @property
    def device(self) -> torch.device:
        return self._device

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        # every group's input is checked before any group's cache changes
        per_group = [(bag, bag.normalize_input(ids, offsets, weights), segments, feats, batch)
                     for bag, (ids, offsets, weights, feats, batch, segments)
                     in zip(self.bags, self._split(features))]
        pooled: dict[str, torch.Tensor] = {}
        for bag, normalized, segments, feats, batch in per_group:
            out = bag.lookup_normalized(*normalized, segments=segments)
            out = out.view(len(feats), batch, bag.embedding_dim)
            if len(self._groups) == 1:
                values = out.transpose(0, 1).reshape(batch, -1)
                return KeyedTensor(keys=feats, length_per_key=self._lengths_per_embedding,
                                   values=values)
            pooled.update(zip(feats, out.unbind(0)))
        values = torch.cat([pooled[f] for f in self._feature_names], dim=1)
        return KeyedTensor(keys=self._feature_names, length_per_key=self._lengths_per_embedding,
                           values=values)

    def prefetch(self, features: KeyedJaggedTensor) -> None:
        """Load the rows a coming batch needs (see `CachedEmbeddingBag.prefetch`)."""
        for bag, (ids, _, _, _, _, _) in zip(self.bags, self._split(features)):
            bag.cache.prefetch(ids.to(bag.device))  # ids checked by _split already

    def _split(self, kjt: KeyedJaggedTensor):
        """Per group: 1-D ids in the concatenated id space, bag offsets, weights, the
        group's feature names, the batch size and, per table, the number of lookups of
        each of its features (an uncached collection sums each table's gradient on its
        own); checks every id against its table."""
        keys = kjt.keys()
        missing = [f for f in self._feature_names if f not in keys]
        if missing:
            raise ValueError(f"KeyedJaggedTensor lacks features {missing}")
        if kjt.variable_stride_per_key():
            raise ValueError("variable batch size per feature is not supported")
        batch = kjt.stride()
        lengths = kjt.lengths().view(len(keys), batch)
        values = kjt.values()
        if values.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"feature ids must be int64 or int32, got {values.dtype}")
        weights = kjt.weights_or_none() if self._is_weighted else None
        if self._is_weighted and weights is None:
            raise ValueError("this collection is weighted but the KeyedJaggedTensor has no weights")
        per_key = lengths.sum(1)
        starts = torch.cumsum(per_key, 0) - per_key
        key_index = {k: i for i, k in enumerate(keys)}
        out = []
        for g in self._groups:
            feats, id_parts, len_parts, w_parts, segments = [], [], [], [], []
            for t, row_offset in zip(g.tables, g.row_offsets):
                segments.append([])
                for f in t.feature_names:
                    i = key_index[f]
                    s, n = int(starts[i]), int(per_key[i])
                    ids = values[s: s + n]
                    if n and (bool((ids < 0).any()) or bool((ids >= t.num_embeddings).any())):
                        pos = int(torch.nonzero((ids < 0) | (ids >= t.num_embeddings))[0])
                        raise ValueError(f"feature {f!r}: id {int(ids[pos])} at position {pos} is "
                                         f"outside table {t.name!r} [0, {t.num_embeddings})")
                    id_parts.append(ids.long() + row_offset)
                    segments[-1].append(n)
                    len_parts.append(lengths[i])
                    if weights is not None:
                        w_parts.append(weights[s: s + n])
                    feats.append(f)
            all_lengths = torch.cat(len_parts)
            offsets = torch.cumsum(all_lengths, 0) - all_lengths
            out.append((torch.cat(id_parts), offsets, torch.cat(w_parts) if w_parts else None,
                        feats, batch, segments))
        return out

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

    @contextmanager
    def separate_stats(self):
        """Count the lookups of a block (say, validation) apart: yields a function that
        returns the block's combined statistics; `cache_stats()` is as before the block."""
        with ExitStack() as stack:
            inner = [stack.enter_context(bag.separate_stats()) for bag in self.bags]
            yield lambda: combine_stats(s.as_dict() for s in inner)

    def reset_cache_stats(self) -> None:
        for bag in self.bags:
            bag.reset_cache_stats()

    def cache_rows(self) -> int:
        return sum(bag.cache.num_slots for bag in self.bags)


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
