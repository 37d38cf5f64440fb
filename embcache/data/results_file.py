"""Results a command writes for people and their tools (recommendations, predictions): named
columns as a `.csv` or `.parquet` file, by the path's extension, written under a temporary
name and renamed, so that a file at the path is always whole. A command checks its path with
`check_output` before the work whose results go there; a path that cannot take them is one
line naming it (`DataOutputError`), never a traceback after the work.

Example:
    >>> import tempfile, pathlib
    >>> with tempfile.TemporaryDirectory() as d:
    ...     path = write_columns({"user": ["u1"], "score": [0.5]}, pathlib.Path(d) / "out.csv")
    ...     path.read_text().splitlines()
    ['"user","score"', '"u1",0.5']
"""
from __future__ import annotations

import contextlib
from pathlib import Path

from embcache.errors import DataOutputError, UserFacingError
from embcache.paths import check_output_file, write_failure

SUFFIXES = (".csv", ".parquet")


def check_output(out: str | Path, what: str = "results") -> Path:
    """Refuse, before any work, an `out` that `write_columns` could not write (another
    extension, a directory, a folder that cannot be created or written) in one line naming
    it and `what` goes there: the work is not lost to a mistyped path."""
    out = Path(out)
    if out.suffix not in SUFFIXES:
        raise UserFacingError(f"{out}: {what} are written as {' or '.join(SUFFIXES)}")
    return check_output_file(out)


def write_columns(columns: dict, out: str | Path) -> Path:
    import pyarrow as pa

    out = Path(out)
    if out.suffix not in SUFFIXES:
        raise ValueError(f"{out}: results are written as {' or '.join(SUFFIXES)}")
    table = pa.table(columns)
    tmp = out.with_name(out.name + ".tmp")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        if out.suffix == ".parquet":
            import pyarrow.parquet as pq

            pq.write_table(table, tmp)
        else:
            import pyarrow.csv as pcsv

            pcsv.write_csv(table, tmp)
        tmp.replace(out)
    except OSError as err:  # pyarrow's own errors are OSErrors too (ArrowIOError)
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        reason = write_failure(err).replace(str(tmp), str(out))
        raise DataOutputError(f"{out}: cannot write: {reason}") from None
    return out
