"""`embcache dlrm predict EXPORT --input FILE --out FILE`: click probabilities of a raw file,
batch by batch, through an export (`embcache.serve`), with the parsing and dense transform
of `data prepare`.

Inputs:
- Criteo text (tab-separated, no header): 40 fields (label, I1..I13, C1..C26) or 39 (no
  label), for an export of Criteo-shaped data (26 sparse, 13 dense features); `.gz` too;
- CSV or Parquet with a header: a column per feature of the export (`sparse_0`, ...) and
  per dense feature (`dense_0`, ...), raw values as the input file had them; `label` is
  kept, any other column refused by name. A CSV is read as `data prepare own` reads one
  (every field text; an empty one is missing), `.gz` too; for an export of `data prepare
  own` data, so is a `.tsv` or `.txt` with a header (`.gz` too), as that command reads them.

A bad row stops the command in one line naming file and line (a Parquet file's row, from 1)
and what is wrong: a line with another number of fields than the header, a dense value that
is not a number, a label that is not 0 or 1 (1.0 and 0.0 read as 1 and 0,
as `data prepare` reads them), an id outside its table or not a whole number.

Output (`.csv` or `.parquet`, written under a temporary name, then renamed): `probability`
per input row, in order, beside `label` where the input has one. Values a feature's
vocabulary never saw score as missing and are counted per feature in one line at the end;
`--strict` refuses the first of them instead, naming file, line (or row), feature and value.
An input with no rows (a header only, or an empty Criteo text file) is written as an output
with no rows and the columns it would have had, and a line saying so.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from embcache.data.results_file import write_columns
from embcache.errors import DataFormatError, UserFacingError, format_error

CRITEO_DENSE, CRITEO_SPARSE = 13, 26
TAB_TEXT = (".tsv", ".tab", ".txt")  # tab-separated text `data prepare own` reads with a header


def predict_command(args) -> int:
    from embcache.serve import load_export

    out = Path(args.out)
    if out.suffix not in (".csv", ".parquet"):
        raise UserFacingError(f"{out}: predictions are written as .csv or .parquet")
    source = Path(args.input)
    if not source.is_file():
        raise UserFacingError(f"{source}: no such file")
    try:
        model = load_export(args.export)
    except (OSError, ValueError) as err:
        raise UserFacingError(str(err)) from None
    probabilities, labels, unseen = [], [], {}
    named = feature_names(model)
    for sparse, dense, label, where in _with_progress(raw_batches(source, model, args.batch_rows), args.progress):
        if len(dense):
            probabilities.append(_scored(model, sparse, dense, source, where, args.strict, unseen, named))
        if label is not None:
            labels.append(label)
    columns = {"probability": np.concatenate(probabilities) if probabilities else np.zeros(0, np.float32)}
    if labels:
        columns = {"label": np.concatenate(labels), **columns}
    write_columns(columns, out)
    if len(columns["probability"]):
        print(f"wrote {len(columns['probability']):,} predictions to {out}")
    else:
        print(f"{source} has no rows: wrote {out} with no predictions (columns {', '.join(columns)})")
    if unseen:
        from embcache.serve import describe_unseen

        counts = {named.get(f, f): n for f, n in unseen.items()}
        print(describe_unseen(counts, len(columns["probability"])).replace("strict scoring", "--strict"))
    return 0


def _with_progress(batches, enabled: bool):
    """`batches`, counted by a progress bar opened at the first row: an input refused before
    any (an empty file, a bad header) or with none (a header only) gets its one line without
    a "0 rows" bar before it."""
    from tqdm import tqdm

    bar = None
    try:
        for batch in batches:
            if bar is None and len(batch[1]):
                bar = tqdm(desc="predict", unit=" rows", disable=not enabled)
            yield batch
            if bar is not None:
                bar.update(len(batch[1]))
    finally:
        if bar is not None:
            bar.close()


def feature_names(model) -> dict[str, str]:
    """{feature: "COLUMN (feature)"} for an export of `data prepare own` data, whose user
    knows the features by the columns they were prepared from (`user`, not `sparse_0`); {}
    for any other."""
    columns = model.manifest.get("input_columns") or {}
    return {f: f"{c} ({f})" for c, f in zip(columns.get("sparse", []), model.features)}


def _scored(model, sparse, dense, source: Path, where, strict: bool, unseen: dict, named: dict) -> np.ndarray:
    """One batch's probabilities; its unseen values counted into `unseen`, or with `strict`
    the first refused, naming where it is (`where(i)`: "FILE:LINE" of the batch's row i) and
    its feature (`named`: by its column, see `feature_names`), as is a value its lookup
    cannot take."""
    from embcache.serve import UnseenValueError

    try:
        logits = model.logits(sparse, model.transform_dense(dense), strict=strict, unseen=unseen)
    except UnseenValueError as err:
        feature = named.get(err.feature, err.feature)
        raise UserFacingError(f"{where(err.row)}: {feature} value {err.value!r} is not in the export's "
                              f"vocabulary; --strict refuses it (without --strict it scores as missing)") from None
    except ValueError as err:  # a value the lookup cannot take (`serve.BadValueError`) names its row
        row = getattr(err, "row", None)
        raise UserFacingError(f"{source if row is None else where(row)}: {err}") from None
    return torch.sigmoid(logits).numpy()


def raw_batches(path: Path, model, batch_rows: int):
    """(sparse {feature: raw values}, dense raw `[B, k]` float64 with NaN for missing, labels
    or None, where: row i -> "FILE:LINE" or "FILE: row N") of `path`, `batch_rows` at a time.
    A text file `data prepare own` reads (`.csv`, and for its exports `.tsv` / `.txt`, `.gz`
    too) is read as it read the training file, by its header: the file a model was prepared
    from scores as it is, where taking it for Criteo text refused it."""
    name = path.name.lower().removesuffix(".gz")
    if name.endswith(".parquet"):
        yield from _table_batches(path, model, batch_rows, parquet=True)
    elif name.endswith(".csv") or (model.manifest.get("input_columns") and name.endswith(TAB_TEXT)):
        yield from _table_batches(path, model, batch_rows, parquet=False)
    else:
        yield from _criteo_batches(path, model, batch_rows)


def _criteo_batches(path: Path, model, batch_rows: int):
    import gzip

    k, features = model.manifest["num_dense"], model.features
    if k != CRITEO_DENSE or len(features) != CRITEO_SPARSE:
        raise UserFacingError(f"{path}: Criteo text needs an export of Criteo-shaped data (26 sparse, 13 dense "
                              f"features); this one has {len(features)} and {k}: give a CSV or Parquet with "
                              f"their columns")
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8", errors="replace") as f:
        rows, fields_per_line = [], None
        for lineno, line in enumerate(f, 1):
            fields = line.rstrip("\r\n").split("\t")
            if fields_per_line is None:
                fields_per_line = len(fields)
                if fields_per_line not in (39, 40):
                    raise UserFacingError(f"{path}:{lineno}: {len(fields)} tab-separated fields; Criteo lines have "
                                          f"40 (label, I1..I13, C1..C26) or 39 (no label)")
            if len(fields) != fields_per_line:
                raise UserFacingError(f"{path}:{lineno}: {len(fields)} fields, the first line had {fields_per_line}")
            rows.append((lineno, fields))
            if len(rows) == batch_rows:
                yield _criteo_batch(path, rows, features, fields_per_line == 40)
                rows = []
        if rows:
            yield _criteo_batch(path, rows, features, fields_per_line == 40)


def _criteo_batch(path: Path, rows, features, labelled: bool):
    first = 1 if labelled else 0
    dense = np.full((len(rows), CRITEO_DENSE), np.nan)
    for r, (lineno, fields) in enumerate(rows):
        for j, v in enumerate(fields[first:first + CRITEO_DENSE]):
            if v:
                try:
                    dense[r, j] = float(v)
                except ValueError:
                    raise UserFacingError(f"{path}:{lineno}: I{j + 1} is not a number: {v!r}") from None
    sparse = {f: [fields[first + CRITEO_DENSE + c] or None for _, fields in rows] for c, f in enumerate(features)}
    linenos = [lineno for lineno, _ in rows]
    labels = None
    if labelled:  # read as `data prepare criteo` reads it: 1.0 is 1, 0.5 or 2 refused
        import pyarrow as pa

        from embcache.data.delimited import parse_label

        labels, ok = parse_label(pa.array([fields[0] for _, fields in rows], pa.string()))
        if not ok.all():
            lineno, fields = rows[int(np.argmin(ok))]
            raise UserFacingError(f"{path}:{lineno}: the label {fields[0]!r} is not 0 or 1")
    return sparse, dense, labels, lambda i: f"{path}:{linenos[i]}"


def _input_names(path: Path, names: list[str], model) -> dict[str, str]:
    """{the file's column: the export's} for an export of `data prepare own` data read by the
    columns it was prepared from (`input_columns`: the label, dense and categorical columns
    by their names; the file's other columns are left out); {} for any other file. Such a
    file must hold every categorical column: one left out would score as missing."""
    columns = model.manifest.get("input_columns")
    if not columns or not set(columns["sparse"]) & set(names):
        return {}
    missing = [c for c in columns["sparse"] + columns["dense"] if c not in names]
    if missing:
        raise UserFacingError(f"{path}: no column {', '.join(map(repr, missing[:5]))}: the model was trained on "
                              f"{', '.join(columns['sparse'] + columns['dense'])}")
    renamed = {c: f for c, f in zip(columns["sparse"], model.features)}
    renamed |= {c: f"dense_{j}" for j, c in enumerate(columns["dense"])}
    return renamed | ({columns["label"]: "label"} if columns["label"] in names else {})


def _table_batches(path: Path, model, batch_rows: int, parquet: bool):
    """A CSV's columns as `data prepare own` read the training file (text, `read_blocks`), a
    Parquet file's as they are stored; a line with the wrong number of fields is refused
    naming it, as is a dense value or label `_table_batch` cannot take. An empty line is no row."""
    import pyarrow as pa

    from embcache.data.bad_rows import BadRowLog
    from embcache.data.delimited import is_empty_line, read_blocks
    from embcache.data.own import file_columns

    k = model.manifest["num_dense"]
    dense_names = [f"dense_{j}" for j in range(k)]
    names, delimiter = file_columns(path)
    renamed = _input_names(path, names, model)
    unknown = [n for n in names if n not in set(model.features) | set(dense_names) | {"label"} | set(renamed)]
    if unknown and not renamed:
        raise UserFacingError(f"{path}: unknown column(s) {', '.join(map(repr, unknown[:5]))}; the export's "
                              f"features are {model.features[0]} .. {model.features[-1]}, its dense ones "
                              f"dense_0 .. dense_{k - 1}, and 'label' is kept")
    absent = [] if renamed else [n for n in [*model.features, *dense_names] if n not in names]
    if absent:  # scored as missing in every row without a word otherwise
        raise UserFacingError(f"{path}: no column {', '.join(map(repr, absent[:5]))}"
                              f"{f' (and {len(absent) - 5} more)' if len(absent) > 5 else ''}; the export scores "
                              f"{model.features[0]} .. {model.features[-1]} and dense_0 .. dense_{k - 1}: "
                              f"a column of empty values scores them as missing")
    wrong_width = BadRowLog()
    if parquet:
        import pyarrow.parquet as pq

        blocks = _numbered_parquet(pq.ParquetFile(path).iter_batches(batch_size=batch_rows))
    else:
        blocks = read_blocks(path, names, delimiter, True, wrong_width)
    empty = True
    for block, first, lines in blocks:
        _refuse_wrong_width(path, wrong_width)
        numbers = lines.of(first + np.arange(block.num_rows))
        if not parquet:  # pyarrow gives an empty line as a row of empty fields
            keep = ~is_empty_line(block)
            block, numbers = block.filter(pa.array(keep)), numbers[keep]
        if renamed:
            block = block.select([n for n in block.schema.names if n in renamed])
            block = block.rename_columns([renamed[n] for n in block.schema.names])
        for start in range(0, block.num_rows, batch_rows):
            empty = False
            yield _table_batch(path, block.slice(start, batch_rows), numbers[start:start + batch_rows], model,
                               parquet, {v: c for c, v in renamed.items()})
    _refuse_wrong_width(path, wrong_width)
    if empty:  # a header and no rows: one batch of none, so that the output keeps the input's label column
        labelled = "label" in (renamed.values() if renamed else names)
        yield {f: [] for f in model.features}, np.zeros((0, k)), np.zeros(0, np.int8) if labelled else None, str


def _numbered_parquet(batches):
    """`read_blocks`'s (block, its first row's index, numbering) of Parquet batches: rows count from 1."""
    class Rows:
        @staticmethod
        def of(rows: np.ndarray) -> np.ndarray:
            return np.asarray(rows, dtype=np.int64) + 1

    first = 0
    for batch in batches:
        yield batch, first, Rows
        first += batch.num_rows


def _refuse_wrong_width(path: Path, log) -> None:
    """The first line `read_blocks` skipped for its number of fields, in one line: a skipped
    line would leave its row without a probability."""
    for entry in log.files.values():
        if entry.count:
            line = entry.first_lines[0]
            raise format_error(path, line if line > 0 else None, entry.first_reasons[0])


def _table_batch(path: Path, block, lines: np.ndarray, model, parquet: bool, file_names: dict):
    """(sparse, dense, labels, where) of a block of the export's columns (see `raw_batches`;
    `lines`: each row's line, or Parquet row); a dense value that is no number, or a label
    not 0 or 1, is refused naming its line and the file's column (`file_names`)."""
    from embcache.data.delimited import parse_label
    from embcache.data.own import as_strings

    where = (lambda i: f"{path}: row {lines[i]}") if parquet else (lambda i: f"{path}:{lines[i]}")
    columns = dict(zip(block.schema.names, block.columns))

    def refuse(ok: np.ndarray, name: str, what: str) -> None:
        if not ok.all():
            i = int(np.argmin(ok))
            raise DataFormatError(f"{where(i)}: {file_names.get(name, name)} {columns[name][i].as_py()!r} {what}")

    k = model.manifest["num_dense"]
    dense = np.full((block.num_rows, k), np.nan)
    for j in range(k):
        if f"dense_{j}" in columns:
            dense[:, j], ok = _dense_values(columns[f"dense_{j}"])
            refuse(ok, f"dense_{j}", "is not a number")
    labels = None
    if "label" in columns:
        labels, ok = parse_label(as_strings(columns["label"]))
        refuse(ok, "label", "is not 0 or 1")
    sparse = {f: columns[f].to_pylist() for f in model.features if f in columns}
    if not parquet:  # an empty field is a missing value
        sparse = {f: [v or None for v in values] for f, values in sparse.items()}
    return sparse, dense, labels, where


def _dense_values(col) -> tuple[np.ndarray, np.ndarray]:
    """(float64 values, NaN where missing; mask of the usable ones) of a dense column: a
    Parquet number column as stored (null and NaN missing), text as `data prepare` parses
    it (empty missing, anything but a finite number unusable)."""
    import pyarrow as pa

    from embcache.data.delimited import parse_numbers64
    from embcache.data.own import as_strings

    if pa.types.is_integer(col.type) or pa.types.is_floating(col.type) or pa.types.is_boolean(col.type):
        return col.cast(pa.float64()).to_numpy(zero_copy_only=False), np.ones(len(col), dtype=bool)
    values, empty, number = parse_numbers64(as_strings(col))
    return np.where(empty, np.nan, values), empty | number
