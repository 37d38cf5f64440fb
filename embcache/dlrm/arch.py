"""DLRM's dense part in plain torch: bottom MLP, dot interaction, top MLP.

torchrec's `DLRM` computes the same thing, but torchrec (and the fbgemm-gpu it wants) is not
on every machine this project runs on: a CUDA host without them still trains and
benchmarks the cache through this module. The modules here use torchrec's parameter names
(`dense_arch.model._mlp.0._linear.weight`, `over_arch.model.1.bias`, ...), so a state dict
moves between the two unchanged, and the same ops in the same order, so the two compute
the same logits to the bit (tests/test_dlrm_arch.py compares them where torchrec is
installed).

`DLRM` adds the sparse part around them: a model whose children are torchrec's
(`sparse_arch.embedding_bag_collection`, `dense_arch`, `inter_arch`, `over_arch`), so the
trainer's checkpoints are the same whichever of the two built the model.
"""
from __future__ import annotations

import torch
from torch import nn


class _Perceptron(nn.Module):
    """Linear then ReLU (the ReLU can be dropped for the output layer)."""

    def __init__(self, in_size: int, out_size: int, relu: bool = True):
        super().__init__()
        self._linear = nn.Linear(in_size, out_size, bias=True)
        self.relu = relu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self._linear(x)
        return torch.relu(y) if self.relu else y


class _MLP(nn.Module):
    def __init__(self, in_size: int, layer_sizes: list[int]):
        super().__init__()
        sizes = [in_size, *layer_sizes]
        self._mlp = nn.Sequential(*[_Perceptron(sizes[i], sizes[i + 1]) for i in range(len(layer_sizes))])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._mlp(x)


class DenseArch(nn.Module):
    """The bottom MLP: dense features -> one D-dim vector per sample (ReLU on every layer)."""

    def __init__(self, in_features: int, layer_sizes: list[int]):
        super().__init__()
        self.model = _MLP(in_features, layer_sizes)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.model(features)


class InteractionArch(nn.Module):
    """Pairwise dot products of the dense vector and the F pooled embeddings (each pair
    once, in row-major upper-triangle order), after the dense vector itself."""

    def __init__(self, num_sparse_features: int):
        super().__init__()
        self.F = int(num_sparse_features)
        i, j = torch.triu_indices(self.F + 1, self.F + 1, offset=1)
        # the pairs as positions in the flattened [F+1, F+1] product: `index_select`'s backward
        # is an `index_add_` of distinct positions, where `z[:, i, j]`'s is a sorting
        # `index_put_` (4.6 ms of a 34 ms step on an H200 at batch 65,536); the same bits
        self.register_buffer("pair_positions", i * (self.F + 1) + j, persistent=False)

    def forward(self, dense_features: torch.Tensor, sparse_features: torch.Tensor) -> torch.Tensor:
        if self.F <= 0:
            return dense_features
        combined = torch.cat((dense_features.unsqueeze(1), sparse_features), dim=1)
        interactions = torch.bmm(combined, torch.transpose(combined, 1, 2))
        flat = interactions.flatten(1).index_select(1, self.pair_positions)
        return torch.cat((dense_features, flat), dim=1)


class OverArch(nn.Module):
    """The top MLP: ReLU layers, then a final linear layer (the logit)."""

    def __init__(self, in_features: int, layer_sizes: list[int]):
        super().__init__()
        if len(layer_sizes) <= 1:
            raise ValueError("the over arch needs at least two layers (hidden sizes and the output)")
        self.model = nn.Sequential(_MLP(in_features, layer_sizes[:-1]),
                                   nn.Linear(layer_sizes[-2], layer_sizes[-1], bias=True))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.model(features)


def interaction_width(num_tables: int, dim: int) -> int:
    """Width of the interaction's output: D + F + F choose 2."""
    return dim + num_tables + num_tables * (num_tables - 1) // 2


class DLRMDense(nn.Module):
    """Everything of DLRM but its tables: `(pooled [B, F, D], dense [B, k]) -> logit [B, 1]`.

    Args:
        num_dense: dense features per sample (k).
        num_tables: pooled embeddings per sample (F), in table order.
        dim: embedding dimension (D).
        dense_arch, over_arch: hidden sizes (the bottom MLP ends at D, the top one at 1).
    """

    def __init__(self, num_dense: int, num_tables: int, dim: int, dense_arch: list[int], over_arch: list[int]):
        super().__init__()
        self.dense_arch = DenseArch(num_dense, [*dense_arch, dim])
        self.inter_arch = InteractionArch(num_tables)
        self.over_arch = OverArch(interaction_width(num_tables, dim), [*over_arch, 1])

    def forward(self, pooled: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        return self.over_arch(self.inter_arch(self.dense_arch(dense), pooled))


class SparseArch(nn.Module):
    """A collection's pooled embeddings as `[B, F, D]`, features in the tables' order (every
    table of one width D). Holds the collection as `embedding_bag_collection`, as torchrec's
    `SparseArch` does, so the parameter names are torchrec's."""

    def __init__(self, embedding_bag_collection: nn.Module):
        super().__init__()
        self.embedding_bag_collection = embedding_bag_collection
        configs = embedding_bag_collection.embedding_bag_configs()
        if not configs:
            raise ValueError("DLRM needs at least one embedding table")
        dims = {t.embedding_dim for t in configs}
        if len(dims) != 1:
            raise ValueError(f"every table of a DLRM has one embedding dimension, got {sorted(dims)}")
        self.D = dims.pop()
        self.feature_names = [f for t in configs for f in (t.feature_names or [t.name])]
        self.F = len(self.feature_names)

    def forward(self, features) -> torch.Tensor:
        pooled = self.embedding_bag_collection(features).to_dict()
        return torch.cat([pooled[f] for f in self.feature_names], dim=1).reshape(-1, self.F, self.D)


class DLRM(nn.Module):
    """DLRM in plain torch: `(dense [B, k], KeyedJaggedTensor) -> logit [B, 1]`; computes what
    torchrec's `DLRM` computes, to the bit, with the same parameter names and initial values
    (its layers are made in the same order, on `dense_device`).

    Args:
        embedding_bag_collection: the sparse part (cached, sharded or whole tables); its
            tables share one dimension D.
        dense_in_features: dense features per sample (k).
        dense_arch_layer_sizes: the bottom MLP's sizes, ending at D.
        over_arch_layer_sizes: the top MLP's sizes, ending at 1.
        dense_device: where the MLPs live.

    Example:
        >>> import torch
        >>> from embcache.sparse_types import EmbeddingBagConfig, KeyedJaggedTensor
        >>> from embcache.nn.torch_collection import TorchEmbeddingBagCollection
        >>> ebc = TorchEmbeddingBagCollection([EmbeddingBagConfig(name="t", embedding_dim=4,
        ...                                    num_embeddings=10, feature_names=["f"])])
        >>> model = DLRM(ebc, dense_in_features=3, dense_arch_layer_sizes=[8, 4], over_arch_layer_sizes=[8, 1])
        >>> kjt = KeyedJaggedTensor(keys=["f"], values=torch.tensor([1, 2, 3]), lengths=torch.tensor([2, 1]))
        >>> model(torch.rand(2, 3), kjt).shape
        torch.Size([2, 1])
    """

    def __init__(self, embedding_bag_collection: nn.Module, dense_in_features: int,
                 dense_arch_layer_sizes: list[int], over_arch_layer_sizes: list[int],
                 dense_device: torch.device | None = None):
        super().__init__()
        self.sparse_arch = SparseArch(embedding_bag_collection)
        if dense_arch_layer_sizes[-1] != self.sparse_arch.D:
            raise ValueError(f"the bottom MLP ends at {dense_arch_layer_sizes[-1]}, the tables' dimension is "
                             f"{self.sparse_arch.D}: they must match")
        with torch.device(dense_device or torch.device("cpu")):
            self.dense_arch = DenseArch(dense_in_features, dense_arch_layer_sizes)
            self.inter_arch = InteractionArch(self.sparse_arch.F)
            self.over_arch = OverArch(interaction_width(self.sparse_arch.F, self.sparse_arch.D),
                                      over_arch_layer_sizes)

    def forward(self, dense_features: torch.Tensor, sparse_features) -> torch.Tensor:
        embedded_dense = self.dense_arch(dense_features)
        embedded_sparse = self.sparse_arch(sparse_features)
        return self.over_arch(self.inter_arch(embedded_dense, embedded_sparse))
