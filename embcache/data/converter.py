"""The two-pass conversion shared by the Criteo and Avazu converters.

Pass 1 reads every input file once, block by block: it counts each categorical value, counts
the good rows per file (the split protocols need them), and logs every malformed row. Between
the passes the vocabularies are fixed. Pass 2 reads the files again, maps values to ids, routes
each row to its split and writes the canonical format. Memory: one block of text plus the
per-feature (key, count) arrays of pass 1 -- never a whole file. Those arrays grow with the
number of distinct values (16 bytes each) unless `max_ids` caps them: a feature with more
distinct values than the cap is counted in `max_ids` hash buckets instead (see `vocabulary`).

With raw keys (`keys="raw"`) there is no vocabulary: each value's 64-bit key
(`delimited.string_keys`; `int+1` for a derived integer feature) is written as it is, int64,
and counted per key in bounded memory (`frequency.KeyCounter`, capped at `max_counted_keys`
keys per feature). Pass 1 then reads only the files whose good-row counts the split protocol
needs (`TextSource.prescan`: Kaggle's whole file, Terabyte's held-out day, nothing for a
random split) and only counts their good rows; the other files' bad rows are logged in pass 2.

A source with `day_splits` (Terabyte's input days) gets each input file's rows listed as a
split of its own (`day_<n>`), over the same shards: shards are cut at every file's end.
"""
from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa

from embcache.data.bad_rows import BadRowLog
from embcache.errors import check_whole, format_error, writing
from embcache.integrity import save_npz
from embcache.data.ctr_format import (
    KEY_MODES,
    SPLITS,
    CTRDatasetWriter,
    SparseFeature,
    check_output_dir,
)
from embcache.data.frequency import DEFAULT_MAX_COUNTED_KEYS
from embcache.data.delimited import BLOCK_BYTES, is_empty_line, read_blocks
from embcache.data.raw_values import LongValues, converter_values, save_raw_values
from embcache.data.vocabulary import ValueCounter, Vocabulary, check_max_ids


@dataclass
class Parsed:
    """One block parsed: `ok` marks good rows; label/dense/keys/aux cover the good rows only;
    `reasons` gives, for each bad row index, why (`kind: detail`)."""

    ok: np.ndarray
    label: np.ndarray
    dense: np.ndarray
    keys: np.ndarray
    reasons: dict[int, str] = field(default_factory=dict)
    aux: dict[str, np.ndarray] = field(default_factory=dict)


class RowChecks:
    """Collects per-column validity masks and explains the first failing check of each bad row."""

    def __init__(self, block: pa.RecordBatch):
        self.block = block
        self.ok = np.ones(block.num_rows, dtype=bool)
        self.reasons: dict[int, str] = {}
        empty = is_empty_line(block)
        self._fail(empty, lambda i: "empty line")

    def require(self, mask: np.ndarray, kind: str, column: str) -> None:
        col = self.block.column(column)
        self._fail(~mask, lambda i: f"{kind}: {column}={col[i].as_py()[:40]!r}")

    def _fail(self, bad: np.ndarray, why: Callable[[int], str]) -> None:
        new = bad & self.ok
        for i in np.flatnonzero(new):
            self.reasons[int(i)] = why(int(i))
        self.ok &= ~bad


@dataclass
class TextSource:
    """What a converter tells the driver about its input.

    Args:
        files: the input files, in order.
        columns: every column name of a line, in order.
        delimiter, header: the text layout.
        dense_names / sparse_names: output column descriptions (stored in meta.json).
        parse: block -> Parsed.
        assign: (file index, indices of the good rows within that file, good rows per file,
            the block's aux arrays) -> split code per row (0 train, 1 val, 2 test).
        observe: optional; called in pass 1 with each block's aux and a function giving the line
            of its i-th good row (e.g. to find the last day, or to refuse the file naming a line).
        prescan: raw keys only: the indices of the files whose good-row counts `assign`
            needs (and `observe` must see) before writing; None: every file. The entries of
            `good_per_file` for the others are None while writing.
        day_splits: a split name per file: each file's rows are also listed as that split
            (shards cut at every file's end).
        blocks: (path, bad-row log or None, block bytes) -> the blocks of a file that is not
            delimited text (`own.parquet_blocks`), as `read_blocks` yields them; None: text.
    """

    files: list[Path]
    columns: list[str]
    delimiter: str
    header: bool
    dense_names: list[str]
    sparse_names: list[str]
    parse: Callable[[pa.RecordBatch], Parsed]
    assign: Callable[[int, np.ndarray, list[int], dict], np.ndarray]
    observe: Callable[[dict, Callable[[int], int]], None] | None = None  # every block's aux, good rows' lines; pass 1
    sparse_columns: list[str | None] | None = None  # input column of each feature (None: derived)
    sparse_keys: list[str] | None = None  # "string" (default) or "int+1" per feature: see raw_values
    prescan: list[int] | None = None
    day_splits: list[str] | None = None
    blocks: Callable | None = None

    def read(self, path: Path, bad: BadRowLog | None, block_bytes: int):
        """The blocks of one input file: `blocks`, or the delimited-text reader."""
        if self.blocks is not None:
            return self.blocks(path, bad, block_bytes)
        return read_blocks(path, self.columns, self.delimiter, self.header, bad, block_bytes)


def convert(src: TextSource, out_dir: str | os.PathLike, source: str, min_count: int = 1,
            max_ids: int | None = None, progress: bool = True, block_bytes: int = BLOCK_BYTES,
            rows_per_shard: int = 2_000_000, extra_meta: dict | None = None, keys: str = "ids",
            max_counted_keys: int | None = DEFAULT_MAX_COUNTED_KEYS, warn_empty_splits: bool = True) -> dict:
    """Run both passes; returns the written meta (bad rows are printed to stderr too; a split
    that came out empty is one warning line, unless `warn_empty_splits` is false). Beside
    the shards: vocabulary.npz (the keys owning ids 1..) and raw_values/ (the raw value of
    every id, so a served model maps raw rows to ids and a table row back to its value).
    With `keys="raw"`: the values' keys instead of ids, no vocabulary (see the module's
    docstring); `min_count` and `max_ids` shape a vocabulary and must stay at their defaults.

    Arguments are checked and the output directory is made (and must be writable) before pass
    1 starts, so a mistake costs seconds, not a pass over the input."""
    if keys not in KEY_MODES:
        raise ValueError(f"keys must be one of {KEY_MODES}, got {keys!r}")
    if keys == "raw":
        if min_count != 1 or max_ids is not None:
            raise ValueError("--min-count and --max-ids-per-feature build a vocabulary; raw keys have none "
                             "(use --keys ids, or leave them out)")
        return _said_empty(src, _convert_raw(src, out_dir, source, progress, block_bytes, rows_per_shard,
                                             extra_meta or {}, max_counted_keys), warn_empty_splits)
    _check_arguments(src, out_dir, min_count, max_ids, block_bytes, rows_per_shard)
    bad = BadRowLog()
    counters, good_per_file = _count_values(src, bad, max_ids, progress, block_bytes)
    bad.report()
    if sum(good_per_file) == 0:
        raise format_error(src.files[0], None, f"no usable rows in {len(src.files)} file(s)")
    vocabs = _build_vocabularies(counters, min_count, max_ids)
    del counters
    features = [SparseFeature(f"sparse_{f}", v.cardinality) for f, v in enumerate(vocabs)]
    writer = CTRDatasetWriter(out_dir, len(src.dense_names), features, source=source,
                              rows_per_shard=rows_per_shard)
    long_values = LongValues(vocabs, src.sparse_columns or [None] * len(vocabs))

    def to_ids(block, parsed):
        ids = [v.lookup(parsed.keys[:, f]) for f, v in enumerate(vocabs)]
        long_values.observe(block, parsed.ok, ids)
        return ids

    _write_rows(src, writer, good_per_file, progress, block_bytes, to_ids)
    extra_meta = {**(extra_meta or {}), **_day_list(src, writer)}
    _save_vocabularies(Path(out_dir), vocabs)
    raw_values = _save_raw_values(Path(out_dir), src, features, vocabs, long_values)
    return _said_empty(src, writer.finish(
        bad_rows=bad.to_json(), min_count=min_count, max_ids_per_feature=max_ids, id_rule=_id_rule(max_ids),
        raw_values=raw_values,
        hashed_features=[f.name for f, v in zip(features, vocabs) if v.hashed],
        vocabulary_file="vocabulary.npz", features=_feature_names(src, features),
        input_files=[str(p) for p in src.files], good_rows_per_file=good_per_file, **(extra_meta or {})),
        warn_empty_splits)


def _said_empty(src: TextSource, meta: dict, warn: bool) -> dict:
    """`meta`, after one warning line where train, val or test came out empty (a small file:
    a legitimate test, but a run on it has nothing to validate or test, where it would
    otherwise learn so only from a score of n/a)."""
    empty = [s for s in SPLITS if not meta["splits"].get(s, {}).get("rows")]
    if warn and empty:
        where = src.files[0] if len(src.files) == 1 else Path(src.files[0]).parent
        rows = ", ".join(f"{s} {meta['splits'].get(s, {}).get('rows', 0):,}" for s in SPLITS)
        logging.getLogger(__name__).warning(
            f"{where}: the {' and '.join(empty)} split{'s' if len(empty) > 1 else ''} came out empty ({rows} rows): "
            f"a run on this data has nothing there to score; more rows fill {'them' if len(empty) > 1 else 'it'}")
    return meta


def _check_arguments(src: TextSource, out_dir: str | os.PathLike, min_count: int, max_ids: int | None,
                     block_bytes: int, rows_per_shard: int) -> None:
    """Everything `convert` can check before reading: the numbers, the input files, the output
    directory (made, and writable)."""
    check_max_ids(max_ids)
    check_whole("min_count", min_count, 1)
    check_whole("block_bytes", block_bytes, 1)
    # CTRDatasetWriter checks rows_per_shard too, but it is made only after pass 1
    check_whole("rows_per_shard", rows_per_shard, 1)
    for path in src.files:
        check_input_file(path)
    check_output_dir(out_dir)


def check_input_file(path: str | os.PathLike) -> None:
    """One line unless `path` is a file: a directory is said to be one (a folder of CSV parts
    is no input here), where "no such file" sent the user looking for a typo."""
    if Path(path).is_dir():
        raise format_error(path, None, "a directory, not a file: --input takes one file (join the parts of a "
                                       "split export into one first)")
    if not Path(path).is_file():
        raise format_error(path, None, "no such file")


def _convert_raw(src: TextSource, out_dir: str | os.PathLike, source: str, progress: bool, block_bytes: int,
                 rows_per_shard: int, extra_meta: dict, max_counted_keys: int | None) -> dict:
    """`convert` with raw keys: pass 1 counts the good rows of `src.prescan`'s files only,
    pass 2 writes every value's key."""
    _check_arguments(src, out_dir, 1, None, block_bytes, rows_per_shard)
    if max_counted_keys is not None:
        check_whole("max_counted_keys", max_counted_keys, 1)
    bad = BadRowLog()
    for path in src.files:  # listed in file order, whichever pass reads them
        bad.seen(path)
    prescan = list(range(len(src.files))) if src.prescan is None else sorted(set(src.prescan))
    good_per_file: list[int | None] = [None] * len(src.files)
    if prescan:
        _, counted = _count_values(src, bad, None, progress, block_bytes, files=prescan, count_values=False)
        for index, good in zip(prescan, counted):
            good_per_file[index] = good
        if len(prescan) == len(src.files) and sum(counted) == 0:
            bad.report()
            raise format_error(src.files[0], None, f"no usable rows in {len(src.files)} file(s)")
    features = [SparseFeature(f"sparse_{f}", 0) for f in range(len(src.sparse_names))]
    writer = CTRDatasetWriter(out_dir, len(src.dense_names), features, source=source, rows_per_shard=rows_per_shard,
                              keys="raw", max_counted_keys=max_counted_keys)

    def to_keys(block, parsed):
        return [parsed.keys[:, f].view(np.int64) for f in range(len(features))]

    good = _write_rows(src, writer, good_per_file, progress, block_bytes, to_keys,
                       bad=bad, logged=set(prescan), desc="pass 2/2: writing" if prescan else "writing")
    bad.report()
    if sum(good) == 0:
        raise format_error(src.files[0], None, f"no usable rows in {len(src.files)} file(s)")
    kinds = src.sparse_keys or ["string"] * len(features)
    return writer.finish(
        bad_rows=bad.to_json(),
        key_rule="each value's 64-bit key stored as int64 (the bits of the uint64): 'string' = "
                 "data.delimited.string_keys (a value of up to 8 bytes is its bytes, big-endian; a longer one a "
                 "hash with the top bit set), 'int+1' = the integer plus 1; 0 = missing",
        key_kinds={f.name: k for f, k in zip(features, kinds)}, features=_feature_names(src, features),
        input_files=[str(p) for p in src.files], good_rows_per_file=good, **extra_meta, **_day_list(src, writer))


def _day_list(src: TextSource, writer: CTRDatasetWriter) -> dict:
    """meta.json's "day_splits" (`ctr_format.day_splits`) for a source with day splits."""
    if not src.day_splits:
        return {}
    return {"day_splits": [{"split": name, "rows": writer.views[name]["rows"]} for name in src.day_splits]}


def _count_values(src: TextSource, bad: BadRowLog, max_ids: int | None, progress: bool,
                  block_bytes: int, files: list[int] | None = None,
                  count_values: bool = True) -> tuple[list[ValueCounter], list[int]]:
    """Pass 1: one ValueCounter per sparse feature fed with every good row (none without
    `count_values`), and the good rows per file (of `files`, indices of `src.files`; default
    all); malformed rows go to `bad`, every good block's aux to `src.observe`."""
    counters = [ValueCounter(max_ids) for _ in src.sparse_names] if count_values else []
    good_per_file = []
    chosen = src.files if files is None else [src.files[i] for i in files]
    with _bar(progress, "pass 1/2: counting values" if count_values else "pass 1/2: counting rows") as bar:
        for path in chosen:
            good = 0
            for block, first, lines in src.read(path, bad, block_bytes):
                parsed = src.parse(block)
                _log_bad_rows(bad, path, parsed, first, lines)
                for f, counter in enumerate(counters):
                    counter.update(parsed.keys[:, f])
                if src.observe is not None:  # a good row's line is worked out only when asked (an error's)
                    rows = first + np.flatnonzero(parsed.ok)
                    src.observe(parsed.aux, lambda i, rows=rows, lines=lines: int(lines.of(rows[i:i + 1])[0]))
                good += len(parsed.label)
                bar.update(block.num_rows)
            good_per_file.append(good)
    return counters, good_per_file


def _log_bad_rows(bad: BadRowLog, path: Path, parsed: Parsed, first: int, lines) -> None:
    """Add a block's bad rows to `bad` under their line numbers in `path` (the block starts at
    row `first` of the file; `lines.of` maps rows to lines)."""
    if parsed.reasons:
        idx = np.array(sorted(parsed.reasons), dtype=np.int64)
        for i, line in zip(idx, lines.of(first + idx)):
            bad.add(path, int(line), parsed.reasons[int(i)])


def _build_vocabularies(counters: list[ValueCounter], min_count: int, max_ids: int | None) -> list[Vocabulary]:
    """Between the passes: each feature's counts become its fixed value -> id map."""
    vocabs = []
    for counter in counters:
        keys, counts = counter.result()
        vocabs.append(Vocabulary.build(keys, counts, min_count=min_count, max_ids=max_ids, hashed=counter.hashed))
    return vocabs


def _write_rows(src: TextSource, writer: CTRDatasetWriter, good_per_file: list[int | None], progress: bool,
                block_bytes: int, to_sparse: Callable, bad: BadRowLog | None = None, logged: set[int] = frozenset(),
                desc: str = "pass 2/2: writing") -> list[int]:
    """Pass 2: read the files again, turn each block's values into its sparse columns
    (`to_sparse(block, parsed)`: ids, or keys) and write each good row to its split; returns
    the good rows per file. With `bad`, the malformed rows of the files not in `logged` (not
    read by pass 1) are logged. With `src.day_splits`, each file's rows become a split too."""
    known = None if any(g is None for g in good_per_file) else sum(good_per_file)
    good_rows = []
    with _bar(progress, desc, total=known) as bar:
        for file_index, path in enumerate(src.files):
            log = bad if bad is not None and file_index not in logged else None
            before = {s: (len(writer.splits[s]["files"]), writer.splits[s]["rows"]) for s in SPLITS}
            done = 0
            for block, first, lines in src.read(path, log, block_bytes):
                parsed = src.parse(block)
                if log is not None:
                    _log_bad_rows(log, path, parsed, first, lines)
                n = len(parsed.label)
                sparse = to_sparse(block, parsed)
                codes = src.assign(file_index, np.arange(done, done + n), good_per_file, parsed.aux)
                for code, split in enumerate(SPLITS):
                    rows = np.flatnonzero(codes == code)
                    if len(rows):
                        writer.write(split, parsed.label[rows], parsed.dense[rows], [i[rows] for i in sparse])
                done += n
                bar.update(n)
            good_rows.append(done)
            if src.day_splits:
                writer.cut()
                files = [f for s in SPLITS for f in writer.splits[s]["files"][before[s][0]:]]
                writer.add_view(src.day_splits[file_index], files, done)
    return good_rows


def _id_rule(max_ids: int | None) -> str:
    """meta.json's "id_rule": how raw values became ids."""
    return ("0 = missing or rarer than min_count; others 1.. in ascending order of the raw value's key"
            + ("; a feature with more than max_ids-1 distinct values (hashed_features) is hashed first: "
               "bucket = 1 + splitmix64(key) % (max_ids-1), min_count applies to buckets, kept buckets "
               "get 1.. in ascending order" if max_ids else ""))


def _feature_names(src: TextSource, features: list[SparseFeature]) -> dict[str, str]:
    """meta.json's "features": output column -> the input column it came from."""
    return {**dict(zip([f"dense_{j}" for j in range(len(src.dense_names))], src.dense_names)),
            **{f.name: n for f, n in zip(features, src.sparse_names)}}


def _save_vocabularies(out: Path, vocabs: list[Vocabulary]) -> None:
    """vocabulary.npz: per feature, the sorted keys that own ids 1.. (for mapping new data;
    hash buckets for the features meta.json lists in hashed_features)."""
    with writing(out / "vocabulary.npz"):
        save_npz(out / "vocabulary.npz", {f"sparse_{f}": v.keys for f, v in enumerate(vocabs)})  # sealed


def _save_raw_values(out: Path, src: TextSource, features: list[SparseFeature], vocabs: list[Vocabulary],
                     long_values: LongValues) -> dict:
    """raw_values/: each feature's raw value per id (see `raw_values`); meta.json's entry."""
    keys = src.sparse_keys or ["string"] * len(vocabs)
    tables, entries = {}, {}
    for f, (feature, vocab) in enumerate(zip(features, vocabs)):
        tables[feature.name] = converter_values(vocab, keys[f], long_values.found.get(f))
        entries[feature.name] = {"key": keys[f], "id_0": "missing or rare", "hashed": vocab.hashed}
    return save_raw_values(out, tables, entries)


def _bar(enabled: bool, desc: str, total: int | None = None):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="row", unit_scale=True, disable=not enabled, file=sys.stderr)


def hashed_fraction(seed: int, file_index: int, rows: np.ndarray) -> np.ndarray:
    """A deterministic uniform [0, 1) number per (seed, file, row): a random split that needs
    no state and streams."""
    from embcache.data.delimited import splitmix64

    x = (rows.astype(np.uint64) * np.uint64(0x100000001B3)) ^ np.uint64(file_index << 40) ^ np.uint64(seed * 7919 + 1)
    return (splitmix64(splitmix64(x)) >> np.uint64(11)).astype(np.float64) / 2.0**53
