"""The sparse types of the DLRM path: torchrec's own where torchrec imports, else small
in-house stand-ins with the part of torchrec's API this project uses.

Why both: torchrec (and the fbgemm-gpu it wants) is not on every machine the trainer has to
run on; a CUDA host with torch alone must still train and benchmark the cache. Everything in
embcache takes `KeyedJaggedTensor`, `KeyedTensor`, `EmbeddingBagConfig` and `PoolingType`
from here, never from torchrec, so one import decides for the whole package; with torchrec
installed nothing changes (its classes are these names). They sit on the ground floor
because both the data loaders (which build the batches) and the modules (which take them)
import them; `embcache.nn.sparse_types`, their home before, still offers them.

The stand-ins (`*Lite`) are always defined, so tests can hold them against torchrec's:

- `KeyedJaggedTensorLite(keys, values, lengths=None, offsets=None, weights=None)`: ids of
  F features for B samples, feature-major (all of feature 0's samples, then feature 1's);
  `keys()`, `values()`, `lengths()`, `offsets()`, `weights()`, `weights_or_none()`,
  `stride()`, `variable_stride_per_key()`, `length_per_key()`, `to_dict()`, `[key]`,
  `to(device, non_blocking=...)`, `pin_memory()`, `from_lengths_sync`, `from_offsets_sync`.
- `KeyedTensorLite(keys, length_per_key, values, key_dim=1)`: pooled outputs side by side;
  `keys()`, `values()`, `length_per_key()`, `offset_per_key()`, `key_dim()`, `to_dict()`,
  `[key]`, `to(device, non_blocking=...)`.
- `EmbeddingBagConfigLite` (a dataclass: `num_embeddings`, `embedding_dim`, `name`,
  `feature_names`, `init_fn`, `pooling`; torchrec's default `init_fn`, uniform in
  +-sqrt(1/N)) and `PoolingTypeLite` (SUM, MEAN, NONE).

Example:
    >>> import torch
    >>> kjt = KeyedJaggedTensorLite(keys=["a", "b"], values=torch.tensor([1, 2, 3, 4]),
    ...                             lengths=torch.tensor([2, 0, 1, 1]))
    >>> kjt.stride(), kjt.length_per_key(), kjt["b"].values().tolist()
    (2, [2, 2], [3, 4])
"""
from __future__ import annotations

import enum
import logging
import math
from dataclasses import dataclass, field
from functools import partial
from typing import Callable

import torch


def _complete_cumsum(lengths: torch.Tensor) -> torch.Tensor:
    """Offsets with the leading 0 (n + 1 of them), in the lengths' dtype."""
    out = torch.zeros(lengths.numel() + 1, dtype=lengths.dtype, device=lengths.device)
    torch.cumsum(lengths, 0, out=out[1:])
    return out


def known_length_per_key(kjt) -> list[int] | None:
    """The ids per feature where a batch carries them on the host already (given when it
    was made: torchrec's `length_per_key=`, or this module's), else None: reading them
    then needs the lengths, a host sync where they are on a device."""
    known = getattr(kjt, "_length_per_key", None)
    return None if known is None else [int(n) for n in known]


class CollectionInterface:
    """What torchrec's DLRM and the trainer ask of an embedding-bag collection besides its
    forward: its tables' configs, whether it takes per-id weights, and its device. A
    collection sets `_configs`, `_is_weighted` and `_device`."""

    def embedding_bag_configs(self) -> list:
        return self._configs

    def is_weighted(self) -> bool:
        return self._is_weighted

    @property
    def device(self) -> torch.device:
        return self._device


class _Jagged:
    """What a jagged tensor and a keyed one answer alike: ids (`values`), their counts per
    sample (`lengths`) and optional per-id weights."""

    _values: torch.Tensor
    _lengths: torch.Tensor
    _weights: torch.Tensor | None

    def values(self) -> torch.Tensor:
        return self._values

    def lengths(self) -> torch.Tensor:
        return self._lengths

    def weights(self) -> torch.Tensor:
        if self._weights is None:
            raise ValueError(f"this {type(self).__name__.removesuffix('Lite')} has no weights")
        return self._weights

    def weights_or_none(self) -> torch.Tensor | None:
        return self._weights


class JaggedTensorLite(_Jagged):
    """One feature's ids for a batch: `values` cut into samples by `lengths`."""

    def __init__(self, values: torch.Tensor, lengths: torch.Tensor, weights: torch.Tensor | None = None):
        self._values, self._lengths, self._weights = values, lengths, weights

    def offsets(self) -> torch.Tensor:
        return _complete_cumsum(self._lengths)


class KeyedJaggedTensorLite(_Jagged):
    """A batch's sparse features (see the module docstring); give `lengths` or `offsets`."""

    def __init__(self, keys: list[str], values: torch.Tensor, weights: torch.Tensor | None = None,
                 lengths: torch.Tensor | None = None, offsets: torch.Tensor | None = None,
                 stride: int | None = None, length_per_key: list[int] | None = None, padded_samples: int = 0):
        if lengths is None and offsets is None:
            raise ValueError("a KeyedJaggedTensor needs lengths or offsets")
        self._keys, self._values, self._weights = list(keys), values, weights
        # the last samples only pad each feature to a fixed number of ids (`nn.fixed_capacity`):
        # a collection pools them and drops them from its output
        self.padded_samples = int(padded_samples)
        self._length_per_key = None if length_per_key is None else [int(n) for n in length_per_key]
        self._lengths = lengths if lengths is not None else offsets[1:] - offsets[:-1]
        self._offsets = offsets
        count = self._lengths.numel()
        self._stride = int(stride) if stride is not None else (count // len(self._keys) if self._keys else 0)

    @classmethod
    def from_lengths_sync(cls, keys, values, lengths, weights=None, stride=None) -> "KeyedJaggedTensorLite":
        return cls(keys, values, weights=weights, lengths=lengths, stride=stride)

    @classmethod
    def from_offsets_sync(cls, keys, values, offsets, weights=None, stride=None) -> "KeyedJaggedTensorLite":
        return cls(keys, values, weights=weights, offsets=offsets, stride=stride)

    def keys(self) -> list[str]:
        return self._keys

    def offsets(self) -> torch.Tensor:
        if self._offsets is None:
            self._offsets = _complete_cumsum(self._lengths)
        return self._offsets

    def stride(self) -> int:
        """Samples in the batch (the same for every feature)."""
        return self._stride

    def variable_stride_per_key(self) -> bool:
        return False

    def length_per_key(self) -> list[int]:
        """Ids per feature: as given (`length_per_key=`), else summed (one host sync on a
        device tensor)."""
        if self._length_per_key is not None:
            return list(self._length_per_key)
        if not self._keys:
            return []
        return self._lengths.view(len(self._keys), -1).sum(1).tolist()

    def to_dict(self) -> dict[str, JaggedTensorLite]:
        per_key = self.length_per_key()
        values = self._values.split(per_key)
        lengths = self._lengths.view(len(self._keys), -1).unbind(0) if self._keys else ()
        weights = self._weights.split(per_key) if self._weights is not None else [None] * len(self._keys)
        return {k: JaggedTensorLite(v, n, w) for k, v, n, w in zip(self._keys, values, lengths, weights)}

    def __getitem__(self, key: str) -> JaggedTensorLite:
        return self.to_dict()[key]

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "KeyedJaggedTensorLite":
        move = (lambda t: None if t is None else t.to(device, non_blocking=non_blocking))
        return KeyedJaggedTensorLite(self._keys, move(self._values), weights=move(self._weights),
                                     lengths=move(self._lengths), offsets=move(self._offsets), stride=self._stride)

    def pin_memory(self) -> "KeyedJaggedTensorLite":
        pin = (lambda t: None if t is None else t.pin_memory())
        return KeyedJaggedTensorLite(self._keys, pin(self._values), weights=pin(self._weights),
                                     lengths=pin(self._lengths), offsets=pin(self._offsets), stride=self._stride)

    def __repr__(self) -> str:
        return f"KeyedJaggedTensorLite(keys={self._keys}, stride={self._stride}, ids={self._values.numel()})"


class KeyedTensorLite:
    """Pooled embeddings of several features side by side along `key_dim`."""

    def __init__(self, keys: list[str], length_per_key: list[int], values: torch.Tensor, key_dim: int = 1):
        self._keys, self._length_per_key = list(keys), list(length_per_key)
        self._values, self._key_dim = values, key_dim

    def keys(self) -> list[str]:
        return self._keys

    def values(self) -> torch.Tensor:
        return self._values

    def length_per_key(self) -> list[int]:
        return self._length_per_key

    def offset_per_key(self) -> list[int]:
        out = [0]
        for n in self._length_per_key:
            out.append(out[-1] + n)
        return out

    def key_dim(self) -> int:
        return self._key_dim

    def to_dict(self) -> dict[str, torch.Tensor]:
        return dict(zip(self._keys, self._values.split(self._length_per_key, dim=self._key_dim)))

    def __getitem__(self, key: str) -> torch.Tensor:
        return self.to_dict()[key]

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "KeyedTensorLite":
        return KeyedTensorLite(self._keys, self._length_per_key,
                               self._values.to(device, non_blocking=non_blocking), self._key_dim)

    def __repr__(self) -> str:
        return f"KeyedTensorLite(keys={self._keys}, values={tuple(self._values.shape)})"


class PoolingTypeLite(enum.Enum):
    SUM = "SUM"
    MEAN = "MEAN"
    NONE = "NONE"


@dataclass
class EmbeddingBagConfigLite:
    """One table: its rows, width, name, the features that look it up, how its rows are
    initialised (default: uniform in +-sqrt(1/N), as torchrec's) and pooled."""

    num_embeddings: int
    embedding_dim: int
    name: str = ""
    feature_names: list[str] = field(default_factory=list)
    init_fn: Callable[[torch.Tensor], torch.Tensor | None] | None = None
    pooling: PoolingTypeLite = PoolingTypeLite.SUM

    def __post_init__(self) -> None:
        if self.init_fn is None:
            bound = math.sqrt(1 / self.num_embeddings)
            self.init_fn = partial(torch.nn.init.uniform_, a=-bound, b=bound)

    def num_features(self) -> int:
        return len(self.feature_names)


def _import_torchrec():
    """torchrec's four classes, or the reason they are not available."""
    try:
        from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
        from torchrec.sparse.jagged_tensor import JaggedTensor, KeyedJaggedTensor, KeyedTensor
    except (ImportError, OSError) as err:  # not installed, blocked, or its native library did not load
        return None, f"{type(err).__name__}: {err}"
    return (KeyedJaggedTensor, KeyedTensor, JaggedTensor, EmbeddingBagConfig, PoolingType), None


_TORCHREC, TORCHREC_ERROR = _import_torchrec()
HAVE_TORCHREC = _TORCHREC is not None
if HAVE_TORCHREC:
    KeyedJaggedTensor, KeyedTensor, JaggedTensor, EmbeddingBagConfig, PoolingType = _TORCHREC
    # building a torchrec KeyedJaggedTensor (the loaders', the benchmarks', torchrec's DLRM) asks torch.fx
    # whether it is tracing, and torch logs that question's deprecation once a process: neither ours nor the
    # user's to fix (that logger says nothing else)
    logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)
else:
    KeyedJaggedTensor, KeyedTensor, JaggedTensor = KeyedJaggedTensorLite, KeyedTensorLite, JaggedTensorLite
    EmbeddingBagConfig, PoolingType = EmbeddingBagConfigLite, PoolingTypeLite


def pooling_mode(pooling) -> str | None:
    """"sum" or "mean" for a SUM or MEAN pooling of either kind (torchrec's or the stand-in's);
    None for any other."""
    return {"SUM": "sum", "MEAN": "mean"}.get(getattr(pooling, "name", None))


__all__ = ["KeyedJaggedTensor", "KeyedTensor", "JaggedTensor", "EmbeddingBagConfig", "PoolingType",
           "HAVE_TORCHREC", "TORCHREC_ERROR", "pooling_mode", "KeyedJaggedTensorLite", "KeyedTensorLite",
           "JaggedTensorLite", "EmbeddingBagConfigLite", "PoolingTypeLite"]
