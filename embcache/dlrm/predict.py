"""`embcache dlrm predict EXPORT --input FILE --out FILE`: click probabilities of a raw file,
batch by batch, through an export (`embcache.serve`), with the parsing and dense transform
of `data prepare`.

Inputs:
- Criteo text (tab-separated, no header): 40 fields (label, I1..I13, C1..C26) or 39 (no
  label), for an export of Criteo-shaped data (26 sparse, 13 dense features); `.gz` too;
- CSV or Parquet with a header: a column per feature of the export (`sparse_0`, ...) and
  per dense feature (`dense_0`, ...), raw values as the input file had them; `label` is
  kept, any other column refused by name.

Output (`.csv` or `.parquet`, written under a temporary name, then renamed): `probability`
per input row, in order, beside `label` where the input has one. Values a feature's
vocabulary never saw score as missing and are counted per feature in one line at the end;
`--strict` refuses the first of them instead, naming file, line (or row), feature and value.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from embcache.data.results_file import write_columns
from embcache.errors import UserFacingError

CRITEO_DENSE, CRITEO_SPARSE = 13, 26


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
    from tqdm import tqdm

    with tqdm(desc="predict", unit=" rows", disable=not args.progress) as bar:
        for sparse, dense, label, where in raw_batches(source, model, args.batch_rows):
            probabilities.append(_scored(model, sparse, dense, source, where, args.strict, unseen))
            if label is not None:
                labels.append(label)
            bar.update(len(dense))
    columns = {"probability": np.concatenate(probabilities) if probabilities else np.zeros(0, np.float32)}
    if labels:
        columns = {"label": np.concatenate(labels), **columns}
    write_columns(columns, out)
    print(f"wrote {len(columns['probability']):,} predictions to {out}")
    if unseen:
        from embcache.serve import describe_unseen

        print(describe_unseen(unseen, len(columns["probability"])).replace("strict scoring", "--strict"))
    return 0


def _scored(model, sparse, dense, source: Path, where, strict: bool, unseen: dict) -> np.ndarray:
    """One batch's probabilities; its unseen values counted into `unseen`, or with `strict`
    the first refused, naming where it is (`where(i)`: "FILE:LINE" of the batch's row i)."""
    from embcache.serve import UnseenValueError

    try:
        logits = model.logits(sparse, model.transform_dense(dense), strict=strict, unseen=unseen)
    except UnseenValueError as err:
        raise UserFacingError(f"{where(err.row)}: {err.feature} value {err.value!r} is not in the export's "
                              f"vocabulary; --strict refuses it (without --strict it scores as missing)") from None
    except ValueError as err:
        raise UserFacingError(f"{source}: {err}") from None
    return torch.sigmoid(logits).numpy()


def raw_batches(path: Path, model, batch_rows: int):
    """(sparse {feature: raw values}, dense raw `[B, k]` float64 with NaN for missing, labels
    or None, where: row i -> "FILE:LINE" or "FILE: row N") of `path`, `batch_rows` at a time."""
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        yield from _table_batches(path, model, batch_rows, parquet=True)
    elif suffix == ".csv":
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
    if labelled:
        try:
            labels = np.array([int(fields[0]) for _, fields in rows], dtype=np.int8)
        except ValueError:
            lineno = next(n for n, fields in rows if not fields[0].strip().isdigit())
            raise UserFacingError(f"{path}:{lineno}: the label is not 0 or 1") from None
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
    import pyarrow as pa

    k = model.manifest["num_dense"]
    dense_names = [f"dense_{j}" for j in range(k)]
    if parquet:
        import pyarrow.parquet as pq

        names = pq.read_schema(path).names
        batches = pq.ParquetFile(path).iter_batches(batch_size=batch_rows)
    else:
        import pyarrow.csv as pcsv

        import csv

        with path.open(encoding="utf-8", errors="replace", newline="") as f:
            names = next(csv.reader(f), [])  # a quoted header too (pyarrow writes one)
        numeric = set(dense_names) | set((model.manifest.get("input_columns") or {}).get("dense", []))
        batches = pcsv.open_csv(path, read_options=pcsv.ReadOptions(block_size=1 << 22),
                                convert_options=pcsv.ConvertOptions(
                                    column_types={n: pa.string() for n in names if n not in numeric},
                                    strings_can_be_null=True))
    renamed = _input_names(path, names, model)
    unknown = [n for n in names if n not in set(model.features) | set(dense_names) | {"label"} | set(renamed)]
    if unknown and not renamed:
        raise UserFacingError(f"{path}: unknown column(s) {', '.join(map(repr, unknown[:5]))}; the export's "
                              f"features are {model.features[0]} .. {model.features[-1]}, its dense ones "
                              f"dense_0 .. dense_{k - 1}, and 'label' is kept")
    done = 0
    for batch in batches:
        table = pa.Table.from_batches([batch])
        if renamed:
            table = table.select([n for n in table.column_names if n in renamed]).rename_columns(
                [renamed[n] for n in table.column_names if n in renamed])
        n = table.num_rows
        dense = np.full((n, k), np.nan)
        for j, name in enumerate(dense_names):
            if name in table.column_names:
                values = table.column(name).cast(pa.float64(), safe=False).to_numpy(zero_copy_only=False)
                dense[:, j] = values
        sparse = {f: table.column(f).to_pylist() for f in model.features if f in table.column_names}
        labels = table.column("label").to_numpy(zero_copy_only=False).astype(np.int8) \
            if "label" in table.column_names else None
        # a CSV record is a line after the header (a quoted line break would shift this)
        where = (lambda i, d=done: f"{path}: row {d + i + 1}") if parquet else (lambda i, d=done: f"{path}:{d + i + 2}")
        done += n
        yield sparse, dense, labels, where
