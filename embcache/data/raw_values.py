"""The raw value behind every id: what a served model needs to turn a raw row into ids, and
what a person needs to read an embedding table.

A prepared data directory records, under meta.json's "raw_values", one entry per sparse
feature::

    {"key": "string" | "int+1" | "exact" | "identity", "id_0": "missing or rare" | "a value",
     "hashed": bool, "file": "raw_values/sparse_3.parquet"}

and `file` holds one row per id, in id order: column `value` (the raw value; null for id 0
when it stands for missing or rare values) or, for a hashed feature, column `bucket` (the
hash bucket owning the id: many raw values share it, so no value can be given back).

How a raw value finds its id (`key`):
    string    the converters' rule: `string_keys(value)` looked up in vocabulary.npz
              (hashed first when the feature is hashed); unknown, rare or empty -> 0.
    int+1     an integer v >= 0 whose key is v + 1, then as `string`.
    exact     the value's position in `file`; a value not listed has no id.
    identity  the value is the id (synthetic data: there is nothing behind it).

A key is the value's own bytes when it has at most 8 and the first is ASCII; such a key is
decoded here. Any other key is a hash or ambiguous, so the converter collects those values'
strings while it writes (`LongValues`).
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from embcache.data.vocabulary import Vocabulary
from embcache.errors import writing

RAW_VALUES_DIR = "raw_values"
KEY_KINDS = ("string", "int+1", "exact", "identity")
_TOP_BIT = np.uint64(1 << 63)


def decode_keys(keys: np.ndarray) -> pa.Array:
    """The strings behind keys made of their own bytes (vectorized: no Python string per
    key, so a feature of tens of millions of values costs seconds); null where the key is a
    hash, or an 8-byte value whose first byte is not ASCII (the two cannot be told apart).

    Example:
        >>> from embcache.data.delimited import string_keys
        >>> decode_keys(string_keys(pa.array(["68fd1e64", "a", "a-value-longer-than-8"]))).to_pylist()
        ['68fd1e64', 'a', None]
    """
    keys = np.asarray(keys, dtype=np.uint64)
    raw = pa.array(keys.astype(">u8").view("S8"), type=pa.binary(), mask=(keys & _TOP_BIT) != 0)
    try:
        return raw.cast(pa.string())
    except pa.ArrowInvalid:  # bytes that are not UTF-8: replaced, as a reader would show them
        return pa.array([None if b is None else b.decode("utf-8", "replace") for b in raw.to_pylist()], pa.string())


class LongValues:
    """Pass 2's collector of the strings `decode_keys` cannot give back, for the ids that
    own such keys (none at all on Criteo and Avazu, whose values are at most 8 bytes).

    Args:
        vocabs: the features' vocabularies.
        columns: the input column of each feature; None for a derived feature (no string).
    """

    def __init__(self, vocabs: list[Vocabulary], columns: list[str | None]):
        self.columns = columns
        self.wanted = {f: set((np.flatnonzero(v.keys & _TOP_BIT) + 1).tolist())
                       for f, (v, c) in enumerate(zip(vocabs, columns)) if c is not None and not v.hashed}
        self.found: dict[int, dict[int, str]] = {f: {} for f in self.wanted}

    def observe(self, block: pa.RecordBatch, good: np.ndarray, ids: list[np.ndarray]) -> None:
        """Record the strings of still-wanted ids among a block's good rows (`ids` per feature)."""
        for f, wanted in self.wanted.items():
            if not wanted:
                continue
            unique, first_row = np.unique(ids[f], return_index=True)
            hits = [(i, row) for i, row in zip(unique.tolist(), first_row.tolist()) if i in wanted]
            if hits:
                column = block.column(self.columns[f]).filter(pa.array(good))
                for i, row in hits:
                    self.found[f][i] = column[row].as_py()
                    wanted.discard(i)


def converter_values(vocab: Vocabulary, key: str, long_values: dict[int, str] | None = None) -> pa.Table:
    """One feature's file for a converter's vocabulary: `value` per id (id 0 null), or
    `bucket` per id when the feature is hashed."""
    if vocab.hashed:
        return pa.table({"bucket": pa.concat_arrays([pa.nulls(1, pa.uint64()), pa.array(vocab.keys)])})
    if key == "int+1":
        ints = (vocab.keys - np.uint64(1)).astype(np.int64)
        return pa.table({"value": pa.concat_arrays([pa.nulls(1, pa.int64()), pa.array(ints)])})
    values = pa.concat_arrays([pa.nulls(1, pa.string()), decode_keys(vocab.keys)])
    if long_values:  # rare (values over 8 bytes): filled in one by one
        filled = values.to_pylist()
        for i, text in long_values.items():
            filled[i] = text
        values = pa.array(filled, pa.string())
    return pa.table({"value": values})


def save_raw_values(out_dir: str | os.PathLike, tables: dict[str, pa.Table], entries: dict[str, dict]) -> dict:
    """Write each feature's file under `raw_values/` (temporary name, then renamed); returns
    meta.json's "raw_values" (`entries` gain their "file")."""
    out = Path(out_dir)
    directory = out / RAW_VALUES_DIR
    with writing(directory):
        directory.mkdir(parents=True, exist_ok=True)
    features = {}
    for name, entry in entries.items():
        if name in tables:
            path = directory / f"{name}.parquet"
            tmp = directory / f".{name}.parquet.tmp-{os.getpid()}"
            with writing(path):
                pq.write_table(tables[name], tmp)
                os.replace(tmp, path)
            entry = {**entry, "file": f"{RAW_VALUES_DIR}/{name}.parquet"}
        features[name] = entry
    return {"features": features}


def identity_values(names: list[str]) -> dict:
    """meta.json's "raw_values" for data whose ids are the values themselves."""
    return {"features": {n: {"key": "identity", "id_0": "a value", "hashed": False} for n in names}}
