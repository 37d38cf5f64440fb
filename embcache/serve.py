"""Scoring raw rows with an `embcache dlrm export` directory: numpy, pyarrow and torch only
(no trainer, cache or torchrec), so a server can do what the manifest's "scoring" says.

Example:
    >>> model = load_export("export/")  # doctest: +SKIP
    >>> model.predict([{"sparse_0": "68fd1e64", "sparse_1": "80e26c9b", ..., "dense": [0.0] * 13}])  # doctest: +SKIP
    array([0.23], dtype=float32)
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from embcache.errors import DataFormatError

EXPORT_FORMAT = "embcache-dlrm-export"


@dataclass
class FeatureLookup:
    """Raw value -> id for one feature, by the rule its manifest entry names (see
    `embcache.data.raw_values`)."""

    feature: str
    key: str
    rows: int
    keys: np.ndarray | None = None       # ids 1.. of "string" / "int+1"
    max_ids: int | None = None
    hashed: bool = False
    values: dict | None = None           # value -> id of "exact"
    integer: bool = False                # "exact" values are integers: "196" finds 196

    def ids(self, values: Sequence) -> np.ndarray:
        """int64 ids of `values` (None: missing)."""
        if self.key in ("string", "int+1"):
            from embcache.data.vocabulary import Vocabulary

            return Vocabulary(self.keys, self.max_ids, self.hashed).lookup(self._keys(values))
        if self.key == "exact":
            values = [int(v) for v in values] if self.integer else values
            missing = [v for v in values if v not in self.values]
            if missing:
                raise ValueError(f"{self.feature}: value {missing[0]!r} is not in the vocabulary (no id)")
            return np.array([self.values[v] for v in values], dtype=np.int64)
        ids = np.asarray(values, dtype=np.int64)
        if len(ids) and (ids.min() < 0 or ids.max() >= self.rows):
            raise ValueError(f"{self.feature}: ids must lie in [0, {self.rows}), got {ids.min()}..{ids.max()}")
        return ids

    def _keys(self, values: Sequence) -> np.ndarray:
        """The converters' uint64 key of each value (0: missing)."""
        if self.key == "int+1":
            return np.array([0 if v is None else int(v) + 1 for v in values], dtype=np.uint64)
        import pyarrow as pa

        from embcache.data.delimited import string_keys

        return string_keys(pa.array(["" if v is None else str(v) for v in values], pa.string()))


def _lookup(directory: Path, table: dict) -> FeatureLookup:
    vocab = table["vocabulary"]
    lookup = FeatureLookup(table["feature"], vocab["key"], table["rows"], max_ids=vocab.get("max_ids"),
                           hashed=bool(vocab.get("hashed")))
    if "keys_file" in vocab:
        lookup.keys = np.load(directory / vocab["keys_file"])
    if vocab["key"] == "exact":
        import pyarrow.parquet as pq

        import pyarrow as pa

        column = pq.read_table(directory / vocab["file"]).column("value")
        lookup.values = {v: i for i, v in enumerate(column.to_pylist())}
        lookup.integer = pa.types.is_integer(column.type)
    return lookup


def _read_table(path: Path) -> torch.Tensor:
    """A table as a float32 tensor; `.npy` memory-mapped (read-only: the page cache holds
    the hot rows, and a table larger than memory still serves)."""
    if path.suffix == ".npy":
        import warnings

        array = np.load(path, mmap_mode="r")
        with warnings.catch_warnings():  # torch warns of the read-only mapping; nothing writes to it
            warnings.simplefilter("ignore", UserWarning)
            return torch.from_numpy(array)
    import pyarrow.parquet as pq

    column = pq.read_table(path, columns=["embedding"]).column("embedding").combine_chunks()
    flat = column.values.to_numpy()
    return torch.from_numpy(flat.reshape(len(column), column.type.list_size).copy())


class ExportedDLRM:
    """An export loaded: its tables, lookups and dense program.

    Args:
        directory: what `embcache dlrm export --out` wrote (`.npy` tables are memory-mapped,
            Parquet ones read into memory).
    """

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)
        path = self.directory / "manifest.json"
        try:
            self.manifest = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise DataFormatError(f"{path}: cannot read the export's manifest ({err})") from None
        if self.manifest.get("format") != EXPORT_FORMAT:
            raise DataFormatError(f"{path}: not an {EXPORT_FORMAT} manifest")
        self.features = [t["feature"] for t in self.manifest["tables"]]
        self.multi_hot = {t["feature"]: t["multi_hot"] for t in self.manifest["tables"]}
        self.tables = [_read_table(self.directory / t["file"]) for t in self.manifest["tables"]]
        self.lookups = [_lookup(self.directory, t) for t in self.manifest["tables"]]
        self.dense_model = torch.export.load(self.directory / self.manifest["dense_model"]["file"]).module()

    def pooled(self, sparse: Mapping[str, Sequence]) -> torch.Tensor:
        """`[B, T, D]` of raw values: `sparse[feature]` holds one raw value per row (a list of
        them for a multi-hot feature)."""
        ids = {}
        for feature, lookup in zip(self.features, self.lookups):
            values = sparse[feature]
            if self.multi_hot[feature]:
                ids[feature] = (lookup.ids([x for v in values for x in v]), [len(v) for v in values])
            else:
                ids[feature] = (lookup.ids(list(values)), [1] * len(values))
        return self.pool_ids(ids)

    def pool_ids(self, ids: Mapping[str, tuple[np.ndarray, Sequence[int]]]) -> torch.Tensor:
        """`[B, T, D]`: each table's sum of the rows of each row's ids; `ids[feature]` is
        (flat ids, ids per row)."""
        out = []
        for feature, table in zip(self.features, self.tables):
            flat, lengths = ids[feature]
            offsets = torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64))
            out.append(F.embedding_bag(torch.as_tensor(flat, dtype=torch.int64), table, offsets, mode="sum"))
        return torch.stack(out, 1)

    @torch.no_grad()
    def logits(self, sparse: Mapping[str, Sequence], dense) -> torch.Tensor:
        """`[B]` logits of rows given column-wise: `sparse[feature]` raw values, `dense`
        `[B, num_dense]` as the data's dense columns hold them."""
        return self.logits_of_pooled(self.pooled(sparse), dense)

    @torch.no_grad()
    def logits_of_pooled(self, pooled: torch.Tensor, dense) -> torch.Tensor:
        """`[B]` logits from pooled embeddings `[B, T, D]` (e.g. `pool_ids`) and dense features."""
        # row-major as the trainer's batches are: a transposed input takes another GEMM path,
        # equal only to rounding
        dense = torch.from_numpy(np.ascontiguousarray(dense, dtype=np.float32).reshape(-1, self.manifest["num_dense"]))
        return self.dense_model(pooled, dense).reshape(-1)

    def predict(self, rows: Sequence[Mapping]) -> np.ndarray:
        """Click probabilities of raw rows, each a mapping of feature name -> raw value plus
        "dense" -> the dense features."""
        sparse = {f: [row[f] for row in rows] for f in self.features}
        dense = [row["dense"] for row in rows]
        return torch.sigmoid(self.logits(sparse, dense)).numpy()


def load_export(directory: str | os.PathLike) -> ExportedDLRM:
    return ExportedDLRM(directory)
