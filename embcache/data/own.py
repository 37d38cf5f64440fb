"""A user's own CTR file (CSV, TSV, or Parquet, `.gz` text too) -> the canonical CTR format,
with the columns named: a 0/1 label, dense columns, categorical columns, and a chosen split.

The two streaming passes of `converter` (block by block, never the whole file): pass 1
counts each categorical value (and the good rows, and samples the time column of a time
split), pass 2 writes. Categorical values become ids per feature as Criteo's do (id 0:
missing or rarer than `min_count`; `raw_values/` keeps the value behind every id), so an
export serves raw rows of the same columns.

Splits (`held_out`: the share of val + test, halved between them):
    random   each row by a seeded hash of its position: train 1 - held_out, val and test
             held_out / 2 each.
    time     by a time column (numbers, or ISO dates / times; one with a zone as its UTC instant,
             and a column of times with and without one refused: `times`): rows before the (1 - held_out)
             quantile of the times train, the latest held_out / 2 are test, val between. The
             quantiles come from a uniform sample of at most `TIME_SAMPLE` times, so memory
             stays bounded; no training row is later than a val row, nor a val row than a test row.
    tail     the file's last rows (in file order): the last held_out of the good rows, first
             half val, second half test (Criteo Kaggle's protocol with held_out 1/7).

Dense values: `log1p` (the default, Criteo's: negatives clamped to 0, then log(x + 1)) or
`none` (as they are); an empty field is 0. A row whose label is not 0 or 1, a dense value that
is not a number, or a time that is not one is skipped and logged with its line (a Parquet
file's row).
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from embcache.data.converter import Parsed, RowChecks, TextSource, check_input_file, convert, hashed_fraction
from embcache.data.ctr_format import DENSE_LOG1P
from embcache.data.delimited import header_fields, parse_count_feature, parse_label, parse_numbers64, string_keys
from embcache.data.times import ZoneKinds, parse_times
from embcache.errors import DataFormatError, check_whole, format_error

SPLITS = ("random", "time:COLUMN", "tail")
DENSE_TRANSFORMS = ("log1p", "none")
TIME_SAMPLE = 1 << 20  # times kept to place a time split's cut-offs


def parse_split(text: str) -> tuple[str, str | None]:
    """`random`, `tail` or `time:COLUMN` -> (kind, time column or None).

    Example:
        >>> parse_split("time:ts"), parse_split("tail")
        (('time', 'ts'), ('tail', None))
    """
    kind, _, column = text.partition(":")
    if kind in ("random", "tail") and not column:
        return kind, None
    if kind == "time" and column:
        return kind, column
    raise ValueError(f"--split {text!r}: expected random, tail or time:COLUMN")


def file_columns(path: Path) -> tuple[list[str], str | None]:
    """(the column names of `path`, its delimiter: None for Parquet), from its header or schema."""
    name = path.name.lower().removesuffix(".gz")
    if name.endswith(".parquet"):
        import pyarrow.parquet as pq

        try:
            return pq.read_schema(path).names, None
        except (OSError, pa.ArrowException) as err:
            raise format_error(path, None, f"cannot read the Parquet schema ({err})") from None
    delimiter = "," if name.endswith(".csv") else "\t" if name.endswith((".tsv", ".tab", ".txt")) else None
    if delimiter is None:
        raise format_error(path, None, "not .csv, .tsv, .txt or .parquet (.gz for text): the format is unknown")
    header, _ = header_fields(path, delimiter)  # as the block reader reads it (a byte-order mark is no name)
    if not header:
        raise format_error(path, 1, "the file is empty: a header line naming the columns comes first")
    return header, delimiter


class _Rows:
    """A Parquet file's row numbers (1-based) as `LineNumbers` gives lines."""

    @staticmethod
    def of(rows: np.ndarray) -> np.ndarray:
        return np.asarray(rows, dtype=np.int64) + 1


def parquet_blocks(columns: list[str]):
    """`TextSource.blocks` for a Parquet file: its batches, `columns` only, every one as
    strings (a bool as 0/1, a timestamp or date as its integer)."""
    def blocks(path: Path, bad, block_bytes: int):
        import pyarrow.parquet as pq

        if bad is not None:
            bad.seen(path)
        first = 0
        rows = max(1, block_bytes // 256)
        for batch in pq.ParquetFile(path).iter_batches(batch_size=rows, columns=columns):
            arrays = [as_strings(batch.column(i)) for i in range(batch.num_columns)]
            yield pa.RecordBatch.from_arrays(arrays, names=batch.schema.names), first, _Rows
            first += batch.num_rows
    return blocks


def as_strings(col: pa.Array) -> pa.Array:
    """A column as the text reader gives it: strings, "" where null."""
    if pa.types.is_boolean(col.type):
        col = col.cast(pa.int8())
    elif pa.types.is_timestamp(col.type) or pa.types.is_date(col.type):
        col = col.cast(pa.int64() if pa.types.is_timestamp(col.type) or pa.types.is_date64(col.type) else pa.int32())
    return pc.fill_null(col.cast(pa.string()), "")


def parse_numbers(col: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(float32 values, empty -> 0; mask of rows whose field is empty or a finite number)."""
    values, empty, number = parse_numbers64(col)
    return values.astype(np.float32), empty | number


class _TimeCuts:
    """A time split's cut-offs: pass 1 keeps a uniform sample of the times (the `TIME_SAMPLE`
    smallest of a seeded random priority), and refuses `path`'s column of times with and
    without a zone (`zones`: their order is a guess); pass 2 asks for the quantiles once."""

    def __init__(self, held_out: float, seed: int, path: Path, zones: ZoneKinds):
        self.held_out, self.rng = held_out, np.random.default_rng(seed)
        self.path, self.zones = path, zones
        self.times = np.zeros(0)
        self.priority = np.zeros(0)
        self.cuts: tuple[float, float] | None = None

    def observe(self, aux: dict, line_of) -> None:
        mixed = self.zones.see(aux["zoned"], aux["time_text"], line_of)
        if mixed:
            raise format_error(self.path, *mixed)  # the column's fault, not a row's: no row to skip
        times = aux["time"]
        self.times = np.concatenate([self.times, times])
        self.priority = np.concatenate([self.priority, self.rng.random(len(times))])
        if len(self.times) > 2 * TIME_SAMPLE:
            keep = np.argpartition(self.priority, TIME_SAMPLE)[:TIME_SAMPLE]
            self.times, self.priority = self.times[keep], self.priority[keep]

    def split(self, times: np.ndarray) -> np.ndarray:
        if self.cuts is None:
            keep = np.argsort(self.priority, kind="stable")[:TIME_SAMPLE]
            sample = self.times[keep]
            self.cuts = (float(np.quantile(sample, 1 - self.held_out, method="higher")),
                         float(np.quantile(sample, 1 - self.held_out / 2, method="higher")))
        val, test = self.cuts
        return np.where(times < val, 0, np.where(times < test, 1, 2))


def convert_own(input_path: str | os.PathLike, out_dir: str | os.PathLike, *, label: str, dense: list[str],
                sparse: list[str], split: str = "random", held_out: float = 0.2, seed: int = 0,
                dense_transform: str = "log1p", **kwargs) -> dict:
    """Convert one file of the user's (see the module docstring); returns meta. `kwargs` go
    to `converter.convert` (min_count, max_ids, progress, rows_per_shard, keys)."""
    path = Path(input_path)
    kind, time_col = parse_split(split)
    if not 0 < held_out < 1:
        raise ValueError(f"held_out must lie in (0, 1), got {held_out}")
    check_whole("seed", seed, 0, 2**32)
    if dense_transform not in DENSE_TRANSFORMS:
        raise ValueError(f"dense_transform must be one of {DENSE_TRANSFORMS}, got {dense_transform!r}")
    check_input_file(path)
    names, delimiter = file_columns(path)
    _check_columns(path, names, label, dense, sparse, time_col, header_line=None if delimiter is None else 1)
    used = list(dict.fromkeys([label, *dense, *sparse, *([time_col] if time_col else [])]))
    where = "row" if delimiter is None else "line"
    cuts = _TimeCuts(held_out, seed, path, ZoneKinds(time_col, where)) if kind == "time" else None

    def parse(block: pa.RecordBatch) -> Parsed:
        return _parse(block, label, dense, sparse, time_col, dense_transform)

    def assign(file_index, rows, good_per_file, aux):
        if kind == "random":
            u = hashed_fraction(seed, file_index, rows)
            return np.where(u < 1 - held_out, 0, np.where(u < 1 - held_out / 2, 1, 2))
        if kind == "tail":
            total = good_per_file[0]
            train_end = total - int(round(total * held_out))
            return np.where(rows < train_end, 0, np.where(rows < train_end + (total - train_end) // 2, 1, 2))
        return cuts.split(aux["time"])

    src = TextSource(files=[path], columns=names, delimiter=delimiter or ",", header=True,
                     dense_names=list(dense), sparse_names=list(sparse), parse=parse, assign=assign,
                     observe=cuts.observe if cuts else None, sparse_columns=list(sparse),
                     prescan=[] if kind == "random" else None,
                     blocks=parquet_blocks(used) if delimiter is None else None)
    protocol = {"random": f"random by a hash of (seed, row position): val and test {held_out / 2:g} each",
                "tail": f"the last {held_out:g} of the rows in file order: first half val, second half test",
                "time": f"by {time_col}: the latest {held_out / 2:g} of the rows test, the {held_out / 2:g} "
                        f"before them val"}[kind]
    meta = convert(src, out_dir, source=f"own data ({path.name})", extra_meta={
        "split_protocol": protocol, "split_seed": seed if kind == "random" else None,
        "dense_transform": DENSE_LOG1P if dense_transform == "log1p" else None,
        "columns": {"label": label, "dense": list(dense), "sparse": list(sparse), "time": time_col}},
        warn_empty_splits=False, **kwargs)  # an empty split is refused here (`_check_splits`)
    _check_splits(path, meta, split)
    return meta


def _check_columns(path: Path, names: list[str], label: str, dense: list[str], sparse: list[str],
                   time_col: str | None, header_line: int | None = None) -> None:
    """One line naming the columns asked for that `path` lacks, and the ones it has; or one
    it names twice (a spreadsheet's copied column): which of the two is meant is unknown,
    and the reader would stop on it with a traceback."""
    if not sparse:
        raise ValueError("name at least one categorical column (--sparse-cols): they are the embedding tables")
    if not dense:
        raise ValueError("name at least one dense column (--dense-cols): DLRM's bottom MLP takes them")
    wanted = [label, *dense, *sparse, *([time_col] if time_col else [])]
    missing = [c for c in dict.fromkeys(wanted) if c not in names]
    if missing:
        has = ", ".join(names[:30]) + (" ..." if len(names) > 30 else "")
        spaced = [n for n in names if n != n.strip() and n.strip() in missing]
        if spaced:  # "a, b, c": the listing above hid the spaces that part the names asked for from the file's
            has = (f"{', '.join(map(repr, names[:30]))}: spaces around the names (and so the values too) are "
                   f"part of them in CSV; write the file with a plain {','!r} between the fields")
        raise DataFormatError(f"{path}: no column {', '.join(map(repr, missing))}; it has {has}")
    repeated = [c for c in dict.fromkeys(wanted) if names.count(c) > 1]
    if repeated:
        where = "header" if header_line else "schema"
        raise format_error(path, header_line, f"the {where} names column {repeated[0]!r} {names.count(repeated[0])} "
                                              f"times: rename all but one, so that it is clear which is meant")
    named = [label, *dense, *sparse]  # the time column may be one of them too
    twice = [c for c in dict.fromkeys(named) if named.count(c) > 1]
    if twice:
        raise ValueError(f"column(s) {', '.join(map(repr, twice))} named twice among label, dense and sparse")


def _parse(block: pa.RecordBatch, label: str, dense: list[str], sparse: list[str], time_col: str | None,
           dense_transform: str) -> Parsed:
    checks = RowChecks(block)
    labels, ok = parse_label(block.column(label))
    checks.require(ok, "bad label (expected 0 or 1)", label)
    columns = []
    for name in dense:
        values, ok = (parse_count_feature if dense_transform == "log1p" else parse_numbers)(block.column(name))
        checks.require(ok, "not a number", name)
        columns.append(values)
    aux = {}
    if time_col is not None:
        times, ok, zoned = parse_times(block.column(time_col))
        checks.require(ok, "not a time (a number, or an ISO date or time)", time_col)
        aux = {"time": times, "zoned": zoned}
    keys = np.stack([string_keys(block.column(name)) for name in sparse], 1)
    good = checks.ok
    aux = {k: v[good] for k, v in aux.items()}
    if time_col is not None:  # as written, for the refusal of a column with and without zones
        aux["time_text"] = pc.filter(block.column(time_col), pa.array(good))
    return Parsed(good, labels[good], np.stack(columns, 1)[good], keys[good], checks.reasons, aux=aux)


def _check_splits(path: Path, meta: dict, split: str) -> None:
    """A split that came out empty is one line (a time column with a few distinct times may
    put every row at or after a cut-off)."""
    empty = [s for s in ("train", "val", "test") if not meta["splits"].get(s, {}).get("rows")]
    if empty:
        rows = ", ".join(f"{s} {meta['splits'].get(s, {}).get('rows', 0):,}" for s in ("train", "val", "test"))
        raise DataFormatError(f"{path}: --split {split} leaves {', '.join(empty)} empty ({rows} rows); "
                              f"more rows, another --held-out or another split fill it")
