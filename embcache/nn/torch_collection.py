"""`TorchEmbeddingBagCollection`: whole tables as plain `nn.EmbeddingBag`s, for a machine
without torchrec.

The uncached baselines (`dlrm train --sparse device|host`) need torchrec's
`EmbeddingBagCollection`; where torchrec is not installed this one stands in. It keeps
torchrec's parameter names (`embedding_bags.<table>.weight`, so state dicts and checkpoints
move between the two), initialises each table as torchrec does (the bags are made first,
then every config's `init_fn` runs in table order), and pools each feature with its own
embedding-bag call on `values` and the complete offsets, in table order, so outputs and
sparse gradients are those of torchrec's collection to the bit.
"""
from __future__ import annotations

import torch
from torch import nn

from embcache.sparse_types import CollectionInterface, KeyedJaggedTensor, KeyedTensor, pooling_mode


class TorchEmbeddingBagCollection(CollectionInterface, nn.Module):
    """Tables of `nn.EmbeddingBag(sparse=True)`; `forward(KeyedJaggedTensor) -> KeyedTensor`.

    Args:
        tables: `EmbeddingBagConfig`s (SUM or MEAN pooling), torchrec's or the stand-in's.
        device: where the tables live; a batch's ids are moved there.
        is_weighted: use the batch's weights as per-sample weights.

    Example:
        >>> import torch
        >>> from embcache.sparse_types import EmbeddingBagConfig, KeyedJaggedTensor
        >>> ebc = TorchEmbeddingBagCollection([EmbeddingBagConfig(name="t", embedding_dim=4,
        ...                                    num_embeddings=10, feature_names=["f"])])
        >>> kjt = KeyedJaggedTensor(keys=["f"], values=torch.tensor([1, 2, 3]), lengths=torch.tensor([2, 1]))
        >>> ebc(kjt).values().shape
        torch.Size([2, 4])
    """

    def __init__(self, tables: list, device: torch.device | str | None = None, is_weighted: bool = False):
        super().__init__()
        names = [t.name for t in tables]
        if len(set(names)) != len(names):
            raise ValueError(f"table names must be unique, got {names}")
        self._configs = list(tables)
        self._is_weighted = is_weighted
        self.embedding_bags = nn.ModuleDict()
        for t in tables:
            mode = pooling_mode(t.pooling)
            if mode is None:
                raise ValueError(f"table {t.name!r}: pooling {t.pooling} not supported (SUM or MEAN)")
            self.embedding_bags[t.name] = nn.EmbeddingBag(t.num_embeddings, t.embedding_dim, mode=mode,
                                                          sparse=True, include_last_offset=True, device=device)
        self._device = torch.device(device) if device is not None else torch.device("cpu")
        self._features = [(t.name, f) for t in tables for f in (t.feature_names or [t.name])]
        self._dims = [t.embedding_dim for t in tables for _ in (t.feature_names or [t.name])]
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Every table's rows from its config's `init_fn`, in table order."""
        for t in self._configs:
            with torch.no_grad():
                t.init_fn(self.embedding_bags[t.name].weight)

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        per_feature = features.to_dict()
        missing = [f for _, f in self._features if f not in per_feature]
        if missing:
            raise ValueError(f"KeyedJaggedTensor lacks features {missing}")
        pooled = []
        # samples that only pad a fixed-capacity batch (`nn.fixed_capacity`), for tables trained
        # in their backward (`nn.in_backward`), which leave them out of their pooled rows
        padded = {"padded_samples": features.padded_samples} if getattr(features, "padded_samples", 0) else {}
        for table, feature in self._features:
            jagged = per_feature[feature]
            weights = jagged.weights().to(self._device) if self._is_weighted else None
            pooled.append(self.embedding_bags[table](jagged.values().to(self._device),
                                                     jagged.offsets().to(self._device), per_sample_weights=weights,
                                                     **padded))
        return KeyedTensor(keys=[f for _, f in self._features], length_per_key=self._dims,
                           values=torch.cat(pooled, dim=1))
