"""Scoring raw rows with an `embcache dlrm export` directory: numpy, pyarrow and torch only
(no trainer, cache or torchrec), so a server can do what the manifest's "scoring" says.

Example:
    >>> row = {"sparse_0": "68fd1e64", "sparse_1": "80e26c9b", "dense": [1, 5, 0, None, 382, 4, 15, 2, 181, 1, 2, 0, 2]}
    >>> load_export("export/").predict([row])  # doctest: +SKIP
    array([0.23], dtype=float32)
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from embcache.errors import DataFormatError, first_line
from embcache.integrity import file_crc32
from embcache.safe_load import inside, read_json_object

DENSE_LOG1P = "log1p(max(x, 0))"  # `embcache.data.ctr_format.DENSE_LOG1P` (this module imports no data code)

EXPORT_FORMAT = "embcache-dlrm-export"
KEY_RULES = ("open", "first-day", "hash")  # how a raw-key table finds a key's row (`dlrm_export.KeyRule`)


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
    rule: str | None = None              # a raw-key table's KEY_RULES: key 0 (missing) is a key like any other

    @property
    def missing_id(self) -> int | None:
        """The id of a missing value: 0 where the vocabulary gives missing (and unknown) values
        a row ("string", "int+1"); None where it has no such row ("exact", "identity"): a
        missing value then adds nothing to its row's pooled embedding."""
        return 0 if self.key in ("string", "int+1", "raw") else None

    def ids(self, values: Sequence) -> np.ndarray:
        """int64 ids of `values` (None: missing, id 0 of a "string" or "int+1" vocabulary;
        the other kinds give it no id, see `bag`)."""
        if self.rule is not None:
            return self.ids_of_keys(self._keys(values))
        if self.key in ("string", "int+1"):
            from embcache.data.vocabulary import Vocabulary

            return Vocabulary(self.keys, self.max_ids, self.hashed).lookup(self._keys(values))
        if any(v is None for v in values):
            raise ValueError(f"{self.feature}: a missing value has no id in an {self.key!r} vocabulary")
        if self.key == "exact":
            values = [self._exact(v) for v in values]
            found = [self.values.get(v) for v in values]
            for at, (v, i) in enumerate(zip(values, found)):
                if i is None:
                    raise BadValueError(f"{self.feature}: value {v!r} is not in the vocabulary (no id)", at)
            return np.array(found, dtype=np.int64)
        if isinstance(values, np.ndarray) and values.dtype.kind in "iu":
            ids = values.astype(np.int64)
        else:
            try:
                ids = np.array([_whole(v) for v in values], dtype=np.int64)
            except (TypeError, ValueError, OverflowError):
                at = _first_not_whole(values)
                raise BadValueError(f"{self.feature}: ids are whole numbers (the value is the id), "
                                    f"got {values[at]!r}", at) from None
        outside = np.flatnonzero((ids < 0) | (ids >= self.rows))
        if len(outside):
            at = int(outside[0])
            raise BadValueError(f"{self.feature}: ids must lie in [0, {self.rows}), got {int(ids[at])}", at)
        return ids

    def ids_of_keys(self, keys: np.ndarray) -> np.ndarray:
        """A raw-key table's rows of 64-bit keys (as the data holds them) by its rule, as
        training mapped them: "hash": `splitmix64(key) % rows` (the trainer's `HashedKeys`);
        "open" / "first-day": 1.. for a key in `keys`, 0 for any other (an open table's zeros
        for a key never trained or retired; a first-day table's trained row of later keys)."""
        if self.rule == "hash":
            from embcache.data.key_maps import HashedKeys

            return HashedKeys([self.rows]).map_feature(0, np.asarray(keys, dtype=np.uint64))
        from embcache.data.vocabulary import Vocabulary

        return Vocabulary(self.keys).lookup(keys, zero_is_missing=False)

    @property
    def tells_unseen(self) -> bool:
        """Whether an unseen value is told apart here: it takes id 0, the row of missing
        values ("string", "int+1"; an "open" or "first-day" raw-key table). "exact" and
        "identity" refuse an unknown value instead; a "hash" rule gives every key a row."""
        return self.rule in ("open", "first-day") or (self.rule is None and self.key in ("string", "int+1"))

    def unseen(self, values: Sequence, ids: np.ndarray) -> np.ndarray:
        """bool per value of `values` (flat, `ids` theirs): given (not None, not "") but
        mapped to id 0, the row of missing values: training never saw it, saw it fewer than
        `--min-count` times, or never filled its hash bucket (a hashed feature)."""
        if not self.tells_unseen:
            return np.zeros(len(ids), dtype=bool)
        given = np.fromiter((v is not None and not (isinstance(v, str) and v == "") for v in values),
                            dtype=bool, count=len(ids))
        return given & (np.asarray(ids) == 0)

    def bag(self, rows: Sequence[Sequence]) -> tuple[np.ndarray, list[int]]:
        """(flat ids, ids per row) of rows of values; a None value is missing (`missing_id`,
        or left out where there is none)."""
        if self.missing_id is None:
            rows = [[v for v in row if v is not None] for row in rows]
        lengths = [len(row) for row in rows]
        try:
            return self.ids([v for row in rows for v in row]), lengths
        except BadValueError as err:
            err.row = _row_of(err.index, lengths)
            raise

    def _exact(self, value):
        """An "exact" value as the vocabulary holds it ("196" finds 196 in an integer one)."""
        if not self.integer:
            return value
        try:
            return _whole(value)
        except (TypeError, ValueError, OverflowError):
            return value  # not an integer: not in the vocabulary

    def _keys(self, values: Sequence) -> np.ndarray:
        """The converters' uint64 key of each value (0: missing); "raw": the value is its key
        (an int64, as the data holds it)."""
        if self.key == "raw":
            try:
                return np.array([0 if v is None else _whole(v) for v in values], dtype=np.int64).view(np.uint64)
            except (TypeError, ValueError, OverflowError):
                at = _first_not_whole(values)
                raise BadValueError(f"{self.feature}: keys are whole numbers (the value is its 64-bit key), "
                                    f"got {values[at]!r}", at) from None
        if self.key == "int+1":
            keys = []
            for at, v in enumerate(values):
                try:
                    keys.append(0 if v is None else max(_whole(v) + 1, 0))
                except (TypeError, ValueError, OverflowError):
                    raise BadValueError(f"{self.feature}: values are whole numbers, got {v!r}", at) from None
            return np.array(keys, dtype=np.uint64)
        import pyarrow as pa

        from embcache.data.delimited import string_keys

        return string_keys(pa.array(["" if v is None else str(v) for v in values], pa.string()))


def _whole(value) -> int:
    """`int(value)` of an integer, a whole float or a string of an integer; ValueError or
    TypeError for anything else (None, 2.5, "abc", True)."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError("a bool is not an id")
    if isinstance(value, (float, np.floating)) and not float(value).is_integer():
        raise ValueError("not a whole number")
    return int(value)


def _first_not_whole(values: Sequence) -> int:
    """The position of the first value `_whole` refuses."""
    for at, value in enumerate(values):
        try:
            _whole(value)
        except (TypeError, ValueError, OverflowError):
            return at
    raise AssertionError("every value is whole")


def _row_of(index: int, lengths: Sequence[int]) -> int:
    """The row holding flat value `index` of rows of `lengths` values."""
    return int(np.searchsorted(np.cumsum(lengths), index, side="right"))


class BadValueError(ValueError):
    """A value its feature's lookup cannot take (not a whole number where the value is the
    id, outside the table, not in an "exact" vocabulary): `index` is its place among the
    values looked up, `row` its row once `FeatureLookup.bag` knows it, so that a file's
    reader can name the line."""

    def __init__(self, message: str, index: int, row: int | None = None):
        super().__init__(message)
        self.index, self.row = index, row


def _lookup(directory: Path, table: dict) -> FeatureLookup:
    vocab = table["vocabulary"]
    lookup = FeatureLookup(table["feature"], vocab["key"], table["rows"], max_ids=vocab.get("max_ids"),
                           hashed=bool(vocab.get("hashed")), rule=_key_rule(directory, table))
    if "keys_file" in vocab:
        lookup.keys = _load_npy(directory / vocab["keys_file"])
    if vocab["key"] == "exact":
        import pyarrow.parquet as pq

        import pyarrow as pa

        column = pq.read_table(directory / vocab["file"]).column("value")
        lookup.values = {v: i for i, v in enumerate(column.to_pylist())}
        lookup.integer = pa.types.is_integer(column.type)
    return lookup


def _key_rule(directory: Path, table: dict) -> str | None:
    """A table's raw-key rule (exports from before rules name an open table by "open"
    alone); one line naming the manifest for a rule this version cannot apply, or a hash
    rule whose rows are not the table's (it would score other rows than training did)."""
    vocab = table["vocabulary"]
    rule = vocab.get("rule", "open" if vocab.get("open") else None)
    where = f"{directory / 'manifest.json'}: table {table.get('name', table['feature'])}"
    if rule is not None and rule not in KEY_RULES:
        raise DataFormatError(f"{where}: vocabulary rule {rule!r} is not one of {', '.join(KEY_RULES)} "
                              f"(an export of a newer embcache?)")
    if rule == "hash" and vocab.get("rows") != table["rows"]:
        raise DataFormatError(f"{where}: the hash rule's rows ({vocab.get('rows')}) are not the table's "
                              f"({table['rows']})")
    return rule


def _read_table(path: Path) -> torch.Tensor:
    """A table as a float32 tensor; `.npy` memory-mapped (read-only: the page cache holds
    the hot rows, and a table larger than memory still serves)."""
    if path.suffix == ".npy":
        import warnings

        array = _load_npy(path, mmap_mode="r")
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
        self.manifest = read_json_object(path, "export manifest")
        if self.manifest.get("format") != EXPORT_FORMAT:
            raise DataFormatError(f"{path}: not an {EXPORT_FORMAT} manifest")
        try:  # a manifest from someone else may hold anything where a list or a key belongs
            check_named_files(self.directory, self.manifest)
            verify_files(self.directory, self.manifest)
            self.features = [t["feature"] for t in self.manifest["tables"]]
            self.multi_hot = {t["feature"]: t["multi_hot"] for t in self.manifest["tables"]}
            self.tables = [_read_table(self.directory / t["file"]) for t in self.manifest["tables"]]
            self.lookups = [_lookup(self.directory, t) for t in self.manifest["tables"]]
            dense = self.directory / self.manifest["dense_model"]["file"]
        except (KeyError, TypeError, AttributeError) as err:
            raise DataFormatError(f"{path}: not a readable export manifest ({type(err).__name__}: {err})") from None
        check_dense_program(dense)
        self.dense_model = torch.export.load(dense).module()

    def pooled(self, sparse: Mapping[str, Sequence], rows: int | None = None, *, strict: bool = False,
               unseen: dict | None = None) -> torch.Tensor:
        """`[B, T, D]` of raw values: `sparse[feature]` holds one raw value per row (a list of
        them for a multi-hot feature). None, or a feature left out, is missing: the row of
        missing and unknown values where the vocabulary has one ("string", "int+1"), else
        nothing (an empty bag: zeros, as a multi-hot row with no values). `rows` (B) is
        needed only when no feature is given. A value given that the vocabulary never saw
        scores as missing too (`FeatureLookup.unseen`); `unseen` (a dict) gains per feature
        how many there were, and `strict` refuses the first (`UnseenValueError`)."""
        rows = self._rows(sparse, rows)
        ids = {}
        for feature, lookup in zip(self.features, self.lookups):
            values = sparse.get(feature)
            values = [None] * rows if values is None else list(values)
            if len(values) != rows:
                raise ValueError(f"{feature}: {len(values)} values, expected {rows} (one per row)")
            per_row = [[] if v is None else _listed(feature, v) for v in values] if self.multi_hot[feature] \
                else [[v] for v in values]
            ids[feature] = lookup.bag(per_row)
            if lookup.tells_unseen and (strict or unseen is not None):  # nobody reads a count not asked for
                _count_unseen(feature, lookup, per_row, ids[feature], strict, unseen)
        return self.pool_ids(ids)

    def _rows(self, sparse: Mapping[str, Sequence], rows: int | None) -> int:
        given = [f for f in self.features if sparse.get(f) is not None]
        if given:
            return len(sparse[given[0]])
        if rows is None:
            raise ValueError(f"none of the export's features is given ({self.features[0]} .. {self.features[-1]})")
        return rows

    def pool_ids(self, ids: Mapping[str, tuple[np.ndarray, Sequence[int]]]) -> torch.Tensor:
        """`[B, T, D]`: each table's sum of the rows of each row's ids; `ids[feature]` is
        (flat ids, ids per row)."""
        out = []
        for feature, table in zip(self.features, self.tables):
            flat, lengths = ids[feature]
            offsets = torch.from_numpy(np.cumsum([0, *lengths])[:-1].astype(np.int64))  # none for no rows
            out.append(F.embedding_bag(torch.as_tensor(flat, dtype=torch.int64), table, offsets, mode="sum"))
        return torch.stack(out, 1)

    @torch.no_grad()
    def logits(self, sparse: Mapping[str, Sequence], dense, *, strict: bool = False,
               unseen: dict | None = None) -> torch.Tensor:
        """`[B]` logits of rows given column-wise: `sparse[feature]` raw values (see `pooled`,
        also for `strict` and `unseen`), `dense` `[B, num_dense]` as the data's dense
        columns hold them."""
        dense = self._dense_array(dense)
        return self.logits_of_pooled(self.pooled(sparse, len(dense), strict=strict, unseen=unseen), dense)

    @torch.no_grad()
    def logits_of_pooled(self, pooled: torch.Tensor, dense) -> torch.Tensor:
        """`[B]` logits from pooled embeddings `[B, T, D]` (e.g. `pool_ids`) and dense features."""
        dense = self._dense_array(dense)
        if len(dense) != len(pooled):
            raise ValueError(f"dense: {len(dense)} rows, expected {len(pooled)} (one per row)")
        return self.dense_model(pooled, torch.from_numpy(dense)).reshape(-1)

    def _dense_array(self, dense) -> np.ndarray:
        """`dense` as a row-major float32 `[B, num_dense]` array (a transposed input takes
        another GEMM path, equal only to rounding, so it is copied into row order); one line
        naming the expected shape when it has another."""
        k = self.manifest["num_dense"]
        try:
            array = np.ascontiguousarray(dense, dtype=np.float32)
        except (TypeError, ValueError) as err:
            raise ValueError(f"dense: not a [B, {k}] array of numbers ({first_line(err)})") from None
        if array.ndim == 1 and (k == 1 or len(array) == k):  # one feature per row, or one row
            array = array.reshape(-1, k)
        if array.ndim != 2 or array.shape[1] != k:
            raise ValueError(f"dense: shape {list(array.shape)}, expected [B, {k}] ({self._dense_names()})")
        return array

    def _refuse_infinite(self, raw: np.ndarray, prefix: str = "") -> None:
        """An infinite dense value scored probability 0 (NaN prepared) without a word; `data prepare`
        skips a row holding one. BadValueError naming the column (`row`: its row in a `[B, k]` batch)."""
        for at in np.argwhere(np.isinf(raw))[:1]:
            raise BadValueError(f"{prefix}{self._dense_list()[at[-1]]} value {raw[tuple(at)]} is not a finite number "
                                f"(a missing value is empty, None or NaN)", 0, int(at[0]) if raw.ndim == 2 else None)

    def _dense_list(self) -> list:
        return self.manifest.get("dense_features") or [f"dense_{j}" for j in range(self.manifest["num_dense"])]

    def _dense_names(self) -> str:
        names = self._dense_list()
        return ", ".join(map(str, names)) if len(names) <= 4 else f"{names[0]} .. {names[-1]}"

    def predict(self, rows: Sequence[Mapping], dense_prepared: bool = False, *, strict: bool = False,
                unseen: dict | None = None) -> np.ndarray:
        """Click probabilities of raw rows, each a mapping of feature name -> raw value plus
        "dense" -> the raw dense features (a sequence of `num_dense` numbers, None or NaN
        for a missing one), which go through the manifest's `dense_transform` as `data
        prepare` put them (`dense_prepared`: they already did). A feature left out or None
        is missing (see `pooled`); a key that is neither a feature of the export nor
        "dense" is refused, naming it (a row keyed `C1` would otherwise score as if every
        feature were missing).

        A value the vocabulary never saw (a typo, a stored id where the raw value belongs)
        scores as missing, and is not silent: `strict` refuses it in one line
        (`UnseenValueError`, a ValueError); otherwise `unseen`, where given, gains the count
        per feature, and where not, one warning names the features and their counts."""
        k = self.manifest["num_dense"]
        known = set(self.features) | {"dense"}
        dense = np.empty((len(rows), k), dtype=np.float32)
        for i, row in enumerate(rows):
            unknown = [key for key in row if key not in known]
            if unknown:
                raise ValueError(f"row {i}: unknown feature(s) {', '.join(map(repr, unknown[:5]))}; the export's "
                                 f"are {self._sparse_names()} and 'dense'")
            if row.get("dense") is None:
                raise ValueError(f"row {i}: no 'dense' (its {k} dense features: {self._dense_names()})")
            try:
                values = np.asarray([np.nan if v is None else v for v in np.asarray(row["dense"], dtype=object)
                                     .reshape(-1)], dtype=np.float64)
            except (TypeError, ValueError) as err:
                raise ValueError(f"row {i}: 'dense' must be {k} numbers ({first_line(err)})") from None
            if len(values) != k:
                raise ValueError(f"row {i}: 'dense' has {len(values)} values, expected {k} ({self._dense_names()})")
            self._refuse_infinite(values, f"row {i}: ")
            dense[i] = values if dense_prepared else self.transform_dense(values)
        sparse = {f: [row.get(f) for row in rows] for f in self.features}
        counts = {} if unseen is None else unseen
        probabilities = torch.sigmoid(self.logits(sparse, dense, strict=strict, unseen=counts)).numpy()
        if unseen is None and counts:
            logging.getLogger("embcache").warning(f"predict: {describe_unseen(counts, len(rows))}")
        return probabilities

    def transform_dense(self, raw) -> np.ndarray:
        """Raw dense values as the data's dense columns hold them: the manifest's
        `dense_transform` (Criteo's counts: clamped at 0, then log(x + 1); missing -> 0), or
        the values as they are where it names none (exports from before it was recorded
        included)."""
        raw = np.asarray(raw, dtype=np.float64)
        self._refuse_infinite(raw)
        rule = self.manifest.get("dense_transform")
        if rule is None:
            return np.nan_to_num(raw, nan=0.0).astype(np.float32)
        if rule != DENSE_LOG1P:
            raise ValueError(f"{self.directory / 'manifest.json'}: dense_transform {rule!r} is not one this "
                             f"version applies ({DENSE_LOG1P!r})")
        return np.log1p(np.maximum(np.nan_to_num(raw, nan=0.0), 0.0)).astype(np.float32)

    def _sparse_names(self) -> str:
        names = self.features
        return ", ".join(names) if len(names) <= 4 else f"{names[0]} .. {names[-1]}"


class UnseenValueError(ValueError):
    """`strict` scoring met a value its feature's vocabulary never saw (one line: the row,
    the feature and the value)."""

    def __init__(self, row: int, feature: str, value):
        self.row, self.feature, self.value = row, feature, value
        super().__init__(f"row {row}: {feature} value {value!r} is not in the export's vocabulary ({UNSEEN_WHY}); "
                         f"strict scoring refuses it (without strict it scores as missing)")


UNSEEN_WHY = "never seen in training, rarer than --min-count, or in a hash bucket training never filled"


def _count_unseen(feature: str, lookup: FeatureLookup, per_row: list[list], bag: tuple[np.ndarray, list[int]],
                  strict: bool, unseen: dict | None) -> None:
    """Add a feature's unseen values to `unseen[feature]`, or refuse the first (`strict`)."""
    values = [v for row in per_row for v in row]
    mask = lookup.unseen(values, bag[0])
    count = int(mask.sum())
    if not count:
        return
    if strict:
        first = int(np.argmax(mask))
        raise UnseenValueError(_row_of(first, bag[1]), feature, values[first])
    if unseen is not None:
        unseen[feature] = unseen.get(feature, 0) + count


def describe_unseen(counts: Mapping[str, int], rows: int) -> str:
    """One line of per-feature counts of values scored as missing because the vocabulary
    never saw them, e.g. "values the vocabulary never saw, scored as missing: sparse_0 3,
    sparse_25 1 (of 700 rows; ...)"."""
    listed = ", ".join(f"{f} {n:,}" for f, n in counts.items())
    return (f"values the vocabulary never saw, scored as missing: {listed} (of {rows:,} rows; {UNSEEN_WHY}; "
            f"strict scoring refuses them)")


def _listed(feature: str, values) -> list:
    """A multi-hot feature's values of one row as a list (a lone string is refused: it would
    be read as its characters)."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise ValueError(f"{feature}: a multi-hot feature takes a list of values per row, got {values!r}")
    return list(values)


def verify_files(directory: Path, manifest: dict) -> None:
    """Every file the manifest lists against its CRC-32, before any is used: a damaged
    table would score with wrong rows and no word. An export written before the checksums
    loads with one note."""
    crcs = manifest.get("files_crc32")
    if crcs is None:
        logging.getLogger("embcache").warning(f"{directory / 'manifest.json'}: exported before files carried "
                                              f"checksums: they cannot be verified")
        return
    for relative, want in crcs.items():
        path = directory / relative
        if not path.is_file():
            raise DataFormatError(f"{path}: missing (the export's manifest lists it)")
        got = file_crc32(path)
        if got != int(want):
            raise DataFormatError(f"{path}: corrupt export file: CRC-32 {got:08x}, exported with {int(want):08x}; "
                                  f"export again")


def _load_npy(path: Path, **kwargs) -> np.ndarray:
    """`np.load` of plain numbers (never pickled objects); one line naming the file else."""
    try:
        return np.load(path, allow_pickle=False, **kwargs)
    except ValueError as err:  # an object array (pickled Python objects), or not an .npy at all
        raise DataFormatError(f"{path}: not an array of plain numbers ({first_line(err)}); not used") from None


def check_named_files(directory: Path, manifest: dict) -> None:
    """Every file the manifest names is inside the export's folder: a relative path with
    no `..`. A manifest from someone else naming `../x` or `/etc/x` would read (and, for
    the dense program, unpickle) a file the user never handed over; one line refuses it."""
    tables = manifest.get("tables") or []
    named = [t.get("file") for t in tables] + list((manifest.get("files_crc32") or {}))
    named += [t.get("vocabulary", {}).get(k) for t in tables for k in ("keys_file", "file")]
    named.append((manifest.get("dense_model") or {}).get("file"))
    for name in named:
        if name is None:
            continue
        if not inside(name):
            raise DataFormatError(f"{directory / 'manifest.json'}: names {name!r}, outside the export's folder; "
                                  f"an export names only files inside it, so it is not used")


def check_dense_program(path: Path) -> None:
    """The dense program holds tensors and JSON only, checked before `torch.export.load`,
    which would unpickle a weight marked `use_pickle`, a custom or opaque constant, or (after
    its own safe try) a pickled member such as its sample inputs with the full unpickler:
    each is refused here in one line, and every pickled member must load as plain data
    (`embcache.safe_load`)."""
    import io
    import zipfile

    from embcache.safe_load import allowed_globals

    def refuse(why: str):
        return DataFormatError(f"{path}: {why}; the dense program holds tensors only, so it is not loaded")

    try:
        with zipfile.ZipFile(path) as archive:
            members = {name: archive.read(name) for name in archive.namelist()
                       if name.endswith((".pt", "weights_config.json", "constants_config.json"))}
    except (OSError, zipfile.BadZipFile) as err:
        raise DataFormatError(f"{path}: not a torch.export program ({first_line(err)})") from None
    for name, data in members.items():
        if name.endswith(".json"):
            try:
                entries = json.loads(data)["config"].values()
            except (ValueError, KeyError, AttributeError, TypeError):
                raise refuse(f"{name} is not a config of tensors") from None
            odd = [e for e in entries if not isinstance(e, dict) or e.get("use_pickle")
                   or not str(e.get("path_name", "")).startswith(("weight_", "tensor_"))]
            if odd:
                raise refuse(f"{name} lists a pickled or custom object ({str(odd[0])[:80]})")
            continue
        try:
            with torch.serialization.safe_globals(list(allowed_globals())):
                torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        except Exception as err:  # a pickle that needs more than plain data, or a damaged one
            raise refuse(f"{name} is not plain data ({type(err).__name__}: {first_line(err)[:120]})") from None


def load_export(directory: str | os.PathLike) -> ExportedDLRM:
    return ExportedDLRM(directory)
