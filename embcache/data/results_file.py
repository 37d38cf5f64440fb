"""Results a command writes for people and their tools (recommendations, predictions): named
columns as a `.csv` or `.parquet` file, by the path's extension, written under a temporary
name and renamed, so that a file at the path is always whole.

Example:
    >>> import tempfile, pathlib
    >>> with tempfile.TemporaryDirectory() as d:
    ...     path = write_columns({"user": ["u1"], "score": [0.5]}, pathlib.Path(d) / "out.csv")
    ...     path.read_text().splitlines()
    ['"user","score"', '"u1",0.5']
"""
from __future__ import annotations

from pathlib import Path

SUFFIXES = (".csv", ".parquet")


def write_columns(columns: dict, out: str | Path) -> Path:
    import pyarrow as pa

    out = Path(out)
    if out.suffix not in SUFFIXES:
        raise ValueError(f"{out}: results are written as {' or '.join(SUFFIXES)}")
    table = pa.table(columns)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    if out.suffix == ".parquet":
        import pyarrow.parquet as pq

        pq.write_table(table, tmp)
    else:
        import pyarrow.csv as pcsv

        pcsv.write_csv(table, tmp)
    tmp.replace(out)
    return out
