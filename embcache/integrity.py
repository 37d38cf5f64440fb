"""A CRC-32 inside every zip-based file the project writes (torch checkpoints, `.npz`
models), checked before anything is read from it.

torch's zip reader checks no payload byte: a flipped bit in a tensor loads as a wrong weight.
So the writer seals the file: its CRC-32 goes into the zip's own comment field, the last
bytes of the file, where torch, numpy and every zip reader still read the file as before. The
CRC covers every byte before the comment's length field (all entries, their headers and the
central directory). A reader verifies the whole file first (`verify_zip`): a mismatch is one
line naming the file; a file written before seals existed (no comment) loads with a note,
once per file, that it cannot be verified.

CRC-32 as the table files use (`embcache.cache.stores.table_files`): it finds every burst of up to
32 flipped bits and any other damage but 1 in 4 billion, at memory speed (~3.5 GB/s here).

Example:
    >>> import tempfile, pathlib, numpy as np
    >>> with tempfile.TemporaryDirectory() as d:
    ...     path = pathlib.Path(d) / "m.npz"
    ...     np.savez(path, a=np.arange(3))
    ...     _ = seal_zip(path)
    ...     verify_zip(path), int(np.load(path, allow_pickle=False)["a"].sum())
    (True, 3)
"""
from __future__ import annotations

import contextlib
import logging
import os
import struct
import zlib
from pathlib import Path

from embcache.errors import CheckpointError

TAG = b"embcache-crc32:"
TRAILER_BYTES = len(TAG) + 8  # the tag and 8 hex digits
_EOCD = b"PK\x05\x06"  # the zip's end-of-central-directory record: 22 bytes, then the comment
_EOCD_BYTES = 22
_CHUNK = 16 << 20
_noted: set[str] = set()
logger = logging.getLogger("embcache")


class ChecksumError(CheckpointError):
    """A file whose content does not match the checksum written with it."""


def file_crc32(path: str | os.PathLike, stop: int | None = None, file=None) -> int:
    """CRC-32 of a file's first `stop` bytes (all of them by default), read in chunks from
    `file` (an open binary file, read from its start) or from `path`."""
    if file is None:
        with open(path, "rb") as f:
            return file_crc32(path, stop, f)
    crc, left = 0, stop
    file.seek(0)
    while left is None or left > 0:
        chunk = file.read(_CHUNK if left is None else min(_CHUNK, left))
        if not chunk:
            break
        crc = zlib.crc32(chunk, crc)
        if left is not None:
            left -= len(chunk)
    return crc


def seal_zip(path: str | os.PathLike) -> int:
    """Write the CRC-32 of the zip file at `path` into its comment (which must be empty, as
    torch and numpy write it); returns the CRC. Call before the file is renamed into place."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.seek(max(0, size - _EOCD_BYTES))
        tail = f.read()
        if len(tail) != _EOCD_BYTES or not tail.startswith(_EOCD) or tail[-2:] != b"\0\0":
            raise ValueError(f"{path}: not a zip file with an empty comment; cannot seal it")
        crc = file_crc32(path, size - 2, f)
        f.seek(size - 2)
        f.write(struct.pack("<H", TRAILER_BYTES) + TAG + b"%08x" % crc)
        f.flush()
        os.fsync(f.fileno())
    return crc


def verify_zip(path: str | os.PathLike, what: str = "file", file=None) -> bool:
    """True when the file's CRC matches the one sealed into it; False (with a note, once per
    file) when it has none (a zip written before seals existed); ChecksumError naming the
    file when it does not match, or when the file's end is neither a seal nor a plain zip's
    (a damaged seal is not taken for an old file).

    Every byte is read through one open file: `file` when given (the caller then loads from
    that same handle), else one opened here. A writer that renames a new version over `path`
    meanwhile (a run's next checkpoint) cannot mix the old file's seal with the new file's
    bytes."""
    path = Path(path)
    if file is None:
        with open(path, "rb") as f:
            return verify_zip(path, what, f)
    size = os.fstat(file.fileno()).st_size
    file.seek(max(0, size - _EOCD_BYTES - TRAILER_BYTES))
    tail = file.read()
    sealed = tail[:4] == _EOCD and tail[20:22] == struct.pack("<H", TRAILER_BYTES) and tail[22:].startswith(TAG)
    if sealed:
        try:
            want = int(tail[22 + len(TAG):], 16)
        except ValueError:
            raise ChecksumError(f"{path}: corrupt {what} (its checksum is not readable)") from None
        got = file_crc32(path, size - TRAILER_BYTES - 2, file)
        if got != want:
            raise ChecksumError(f"{path}: corrupt {what}: CRC-32 {got:08x}, written with {want:08x}; it changed after "
                                f"it was written (a disk or copy error?) and is not used")
        check_entries(path, what, file, size)  # a valid seal proves no more than that the file arrived as written
        return True
    if not (tail[-_EOCD_BYTES:-_EOCD_BYTES + 4] == _EOCD and tail[-2:] == b"\0\0"):
        raise ChecksumError(f"{path}: corrupt or truncated {what} (its end is neither embcache's checksum nor a "
                            f"zip's end record)")
    check_entries(path, what, file, size)
    key = str(path.resolve())
    if key not in _noted:
        _noted.add(key)
        logger.warning(f"{path} has no checksum (written before embcache sealed its files): it cannot be "
                       f"verified, and is used as it is")
    return False


def check_entries(path: Path, what: str, file, size: int) -> None:
    """Every entry of the zip stored as it is, inside the file: torch and numpy write no
    other, and a compressed entry from someone else is a zip bomb's way to make a 200 KB file
    fill 200 MB (1,000 times; a 200 MB checkpoint, 200 GB) before a byte of it is checked.
    Stored, an entry's bytes are the file's, so what a load allocates is bounded by its size.
    ChecksumError naming the file and the entry otherwise (its central directory is read only)."""
    import zipfile

    try:
        file.seek(0)
        entries = zipfile.ZipFile(file).infolist()
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as err:
        raise ChecksumError(f"{path}: corrupt or truncated {what} (its zip directory: {err})") from None
    for e in entries:
        if e.compress_type != zipfile.ZIP_STORED or e.file_size != e.compress_size \
                or e.header_offset + e.compress_size > size:
            raise ChecksumError(f"{path}: not a {what} embcache reads: its entry {e.filename[:80]!r} holds "
                                f"{e.file_size:,} bytes in {e.compress_size:,} (compressed, or beyond the file's "
                                f"{size:,}); torch and numpy store every entry as it is, so it is not used")


@contextlib.contextmanager
def open_verified(path: str | os.PathLike, what: str = "file"):
    """The file at `path`, opened once, `verify_zip`-checked through that handle and sought
    to its start: load from it, and the bytes loaded are the bytes checked."""
    with open(path, "rb") as f:
        verify_zip(path, what, f)
        f.seek(0)
        yield f


def save_torch(obj, path: str | os.PathLike) -> None:
    """`torch.save(obj, path)`, sealed (the caller renames it into place, or writes it
    inside a directory renamed into place)."""
    import torch

    with open(path, "wb") as f:
        torch.save(obj, f)
    seal_zip(path)


def load_torch(path: str | os.PathLike, what: str = "file", **kwargs):
    """`embcache.safe_load.load_pickled(path, what, **kwargs)` (plain data only) after
    `verify_zip`."""
    from embcache.safe_load import load_pickled

    with open_verified(path, what) as f:
        return load_pickled(path, what, file=f, **kwargs)


def save_npz(path: str | os.PathLike, arrays: dict) -> None:
    """`np.savez` to a temporary name, sealed, renamed into place."""
    import numpy as np

    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}.npz")
    try:
        np.savez(tmp, **arrays)
        seal_zip(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def array_crc32(array) -> int:
    """CRC-32 of a numpy array's bytes in C order (what a sidecar or a schema records)."""
    import numpy as np

    return zlib.crc32(memoryview(np.ascontiguousarray(array)).cast("B"))
