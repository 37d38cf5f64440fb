"""Prepared Parquet shards checked before their rows are used.

The writer (`CTRDatasetWriter`) writes each page with its CRC (Parquet's page checksum) and
records each closed shard's file CRC-32 in meta.json (`shard_crc32`, by relative path). A
loader verifies a shard's file CRC when it first opens it in a process, before any of its rows
reach a batch; a mismatch is one line naming the file and, where a page's own checksum finds
it, the row group. Parquet's reader alone checks nothing: a flipped byte in a value's page
trains on as a changed value. The file CRC costs one read of a shard the loader then reads
again from the page cache (`bench dlrm` measures it against an epoch).

Data sets prepared before the checksums load with one note that they cannot be verified.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

from embcache.errors import DataFormatError, first_line, format_error
from embcache.integrity import file_crc32

META_KEY = "shard_crc32"
logger = logging.getLogger("embcache")
_verified: dict[str, tuple[int, int]] = {}  # path -> (size, mtime_ns) of the file as verified
_noted: set[str] = set()


def verify_shard(data_dir: str | os.PathLike, relative: str, meta: dict) -> None:
    """Check the shard `relative` of the data set in `data_dir` against meta.json's CRC-32
    (once per process while the file is unchanged); DataFormatError naming the file (and the
    row group) when it does not match."""
    path = Path(data_dir) / relative
    crcs = meta.get(META_KEY)
    if crcs is None:
        key = str(Path(data_dir).resolve())
        if key not in _noted:
            _noted.add(key)
            logger.warning(f"{Path(data_dir) / 'meta.json'}: prepared before shards carried checksums: its shards "
                           f"cannot be verified (prepare it again to have them checked)")
        return
    if relative not in crcs:
        raise format_error(Path(data_dir) / "meta.json", None, f"lists {relative} without its checksum")
    try:
        stat = path.stat()
    except OSError as err:
        raise format_error(path, None, f"cannot read Parquet shard: {err.strerror or err}") from None
    key = str(path.resolve())
    if _verified.get(key) == (stat.st_size, stat.st_mtime_ns):
        return
    got = file_crc32(path)
    if got != int(crcs[relative]):
        where = damaged_row_group(path)
        raise format_error(path, None, f"corrupt Parquet shard{where}: CRC-32 {got:08x}, prepared with "
                                       f"{int(crcs[relative]):08x}; the run stops before using it (prepare the "
                                       f"data again, or restore the file)")
    _verified[key] = (stat.st_size, stat.st_mtime_ns)


def damaged_row_group(path: Path) -> str:
    """", row group K" for the first row group whose pages fail their own checksums; ""
    when none does (the damage is in the file's footer or between pages)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path, page_checksum_verification=True)
        for k in range(pf.num_row_groups):
            try:
                pf.read_row_group(k)
            except (OSError, pa.ArrowException) as err:
                return f", row group {k} ({first_line(err)})"
    except (OSError, pa.ArrowException) as err:
        return f" (its footer: {first_line(err)})"
    return ""


def record_shard(crcs: dict, out: Path, relative: str) -> None:
    """Add the closed shard `relative` (under `out`) to the `shard_crc32` map `crcs`."""
    crcs[relative] = file_crc32(out / relative)


__all__ = ["verify_shard", "record_shard", "damaged_row_group", "META_KEY", "DataFormatError"]
