"""Tables as raw files in a directory with a small JSON header: the layout of a
memory-mapped host store and of a checkpoint of any store.

Layout of a directory:

    header.json        {"format", "version", "tensors": {name: {"file", "shape",
                       "dtype", "bytes"[, "crc32"]}}}
    <name>.bin         the tensor's rows, C order, native byte order, no padding
    .lock              held by the live store (one store per directory)

A store's header is written last and removed before its files are rewritten, so a
directory without a header was never finished. A checkpoint's header also holds each
file's CRC-32, which a resume checks before it changes anything. Every problem found in a
directory is one line naming the file.

Writing goes through whole files only: a new file is made under a temporary name,
preallocated to its full size (a full disk fails there, before a byte is written) and
renamed into place when complete.
"""
from __future__ import annotations

import contextlib
import ctypes
import fcntl
import gc
import json
import os
import shutil
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from embcache.errors import CheckpointError, DataFormatError, DataOutputError, describe_os_error, writing

HEADER = "header.json"
FORMAT = "embcache-tables"
VERSION = 1
CHUNK_BYTES = 64 << 20  # what one read, write or fill step holds in memory
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
          "int64": torch.int64}  # int64: an open table's key index beside its rows
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
MADV_RANDOM = 1  # <sys/mman.h> on Linux


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of a directory: its file name, shape and element type."""

    name: str
    shape: tuple[int, int]
    dtype: torch.dtype

    @property
    def file(self) -> str:
        return f"{self.name}.bin"

    @property
    def nbytes(self) -> int:
        return self.shape[0] * self.shape[1] * self.dtype.itemsize

    def describe(self) -> dict:
        return {"file": self.file, "shape": list(self.shape), "dtype": DTYPE_NAMES[self.dtype], "bytes": self.nbytes}


def chunk_rows(spec: TensorSpec) -> int:
    """Rows per chunk: about CHUNK_BYTES, and a multiple of 16 so that every chunk but the
    last holds a multiple of 16 elements (how torch's normal sampler stays the same when
    a table is drawn chunk by chunk)."""
    per_row = max(spec.shape[1] * 4, 1)  # float32 while being made
    return max(16, (CHUNK_BYTES // per_row) // 16 * 16)


def row_chunks(num_rows: int, dim: int, rows: int) -> list[tuple[int, int]]:
    """[start, stop) ranges of `rows` rows; a last range of fewer than 16 elements joins
    the one before (torch draws a tensor's last 16 normal values apart from the rest)."""
    bounds = [(s, min(s + rows, num_rows)) for s in range(0, num_rows, rows)]
    if len(bounds) > 1 and (bounds[-1][1] - bounds[-1][0]) * dim < 16:
        last = bounds.pop()
        bounds[-1] = (bounds[-1][0], last[1])
    return bounds


# ---------------------------------------------------------------------- headers
def read_header(directory: Path) -> dict | None:
    """The directory's header, or None when it has none. A header that cannot be read is
    a one-line error naming it."""
    path = directory / HEADER
    if not path.exists():
        return None
    try:
        header = json.loads(path.read_text())
        if header.get("format") != FORMAT or not isinstance(header.get("tensors"), dict):
            raise ValueError("not an embcache table header")
        return header
    except (OSError, ValueError, AttributeError, RecursionError) as err:  # a list for a header; nesting too deep
        raise DataFormatError(f"{path}: unreadable ({err})") from None


def write_header(directory: Path, specs: list[TensorSpec], crcs: dict[str, int] | None = None) -> None:
    tensors = {s.name: {**s.describe(), **({"crc32": crcs[s.name]} if crcs else {})} for s in specs}
    _write_atomic(directory / HEADER, json.dumps({"format": FORMAT, "version": VERSION, "tensors": tensors},
                                                 indent=1).encode())


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with _WriteGuard(tmp):
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)


class _WriteGuard:
    """Turns an OSError while writing `path` into one line naming it; the partial file goes."""

    def __init__(self, path: Path):
        self.path = path

    def __enter__(self):
        return self

    def __exit__(self, kind, err, tb):
        if err is None or not isinstance(err, OSError) or isinstance(err, DataOutputError):
            return False
        self.path.unlink(missing_ok=True)
        raise DataOutputError(describe_os_error(err, self.path, "cannot write")) from None


def check_matches(directory: Path, header: dict, specs: list[TensorSpec], error=DataFormatError) -> None:
    """Raise `error` naming the file unless the directory holds exactly `specs`, each file
    complete (of its header's size)."""
    saved = header["tensors"]
    want = {s.name: s for s in specs}
    if set(saved) != set(want):
        raise error(f"{directory / HEADER}: holds tables {sorted(saved)}, this store needs {sorted(want)} "
                    f"(another optimizer? use another directory or delete this one)")
    for name, spec in want.items():
        entry, path = saved[name], directory / spec.file
        if list(entry.get("shape", [])) != list(spec.shape) or entry.get("dtype") != DTYPE_NAMES[spec.dtype]:
            raise error(f"{path}: a {entry.get('dtype')} table of shape {tuple(entry.get('shape', []))}, "
                        f"this store's is {DTYPE_NAMES[spec.dtype]} {spec.shape} (use another directory or delete it)")
        if not path.is_file():
            raise error(f"{path}: missing")
        size = path.stat().st_size
        if size != spec.nbytes:
            raise error(f"{path}: {size:,} bytes, its table needs {spec.nbytes:,} ({'truncated' if size < spec.nbytes else 'too long'})")


# ---------------------------------------------------------------------- files
def allocate(path: Path, nbytes: int) -> None:
    """Make `path` (a temporary name) with `nbytes` reserved on disk: a full disk fails
    here, before anything is written; the partial file is removed."""
    with _WriteGuard(path):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            if nbytes:
                os.posix_fallocate(fd, 0, nbytes)
        finally:
            os.close(fd)


def fill_file(path: Path, spec: TensorSpec, fill: Callable[[torch.Tensor, int], None]) -> None:
    """Write the whole table into `path` chunk by chunk: `fill(out, start)` puts float32
    rows `[start, start + len(out))` in `out`; they are rounded to the file's type. Written
    with ordinary writes (not through a mapping), so the process does not hold the pages."""
    rows, dim = spec.shape
    with _WriteGuard(path), open(path, "r+b") as f:
        for start, stop in row_chunks(rows, dim, chunk_rows(spec)):
            out = torch.empty(stop - start, dim, dtype=torch.float32)
            fill(out, start)
            f.write(_as_bytes(out.to(spec.dtype)))
        f.flush()


def create_files(directory: Path, specs: list[TensorSpec],
                 fills: dict[str, Callable[[torch.Tensor, int], None]]) -> dict[str, torch.Tensor]:
    """Make (or remake, when it holds the same tables) a store in `directory` and map it.

    Order: check what is there (another shape: error naming the file, nothing changed);
    reserve every new file under a temporary name (a full disk: error, the temporaries
    removed, nothing changed); remove the header; fill the files; rename the new ones
    into place; write the header. An interruption leaves no header, so the directory is
    never taken for a complete store."""
    _check_existing(directory, specs)
    fresh = [s for s in specs if not (directory / s.file).exists()]
    temps = {s.name: directory / f".{s.file}.tmp" for s in fresh}
    try:
        for s in fresh:
            allocate(temps[s.name], s.nbytes)
        (directory / HEADER).unlink(missing_ok=True)
        for s in specs:
            fill_file(temps.get(s.name, directory / s.file), s, fills[s.name])
        for s in fresh:
            os.replace(temps[s.name], directory / s.file)
    finally:
        for tmp in temps.values():
            tmp.unlink(missing_ok=True)
    write_header(directory, specs)
    return {s.name: map_tensor(directory, s) for s in specs}


def lock_directory(directory: Path):
    """Create `directory` if needed and hold its lock (an open file, released when it is
    closed or collected): a second store on the same files, in this process or another,
    would overwrite the rows the first is training."""
    with writing(directory):
        directory.mkdir(parents=True, exist_ok=True)
        lock = open(directory / ".lock", "a+b")
    if not _try_lock(lock):
        # The holder may be a store of this process that nothing references any more (a
        # finished trainer in a reference cycle): collecting it releases its lock.
        gc.collect()
        if not _try_lock(lock):
            lock.close()
            raise DataFormatError(f"{directory}: in use by another host store (one store per directory)")
    return lock


def _try_lock(lock) -> bool:
    try:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _check_existing(directory: Path, specs: list[TensorSpec]) -> None:
    """A directory holding other tables (or damaged files of these) is not overwritten."""
    header = read_header(directory)
    if header is not None:
        check_matches(directory, header, specs)
        return
    for s in specs:
        path = directory / s.file
        if path.exists() and path.stat().st_size != s.nbytes:
            raise DataFormatError(f"{path}: {path.stat().st_size:,} bytes, not a {DTYPE_NAMES[s.dtype]} table of "
                                  f"shape {s.shape} ({s.nbytes:,} bytes): use another directory or delete it")


def map_tensor(directory: Path, spec: TensorSpec, shared: bool = True) -> torch.Tensor:
    """The file as a `[rows, dim]` tensor sharing its pages (writes go to the file; with
    `shared=False` they stay private, so a checkpoint read this way cannot be changed).
    The size was checked before: `torch.from_file` would silently grow a short file."""
    numel = spec.shape[0] * spec.shape[1]
    flat = torch.from_file(str(directory / spec.file), shared=shared, size=numel, dtype=spec.dtype)
    _advise_random(flat)
    return flat.view(spec.shape)


def _advise_random(mapped: torch.Tensor) -> None:
    """Tell the kernel the rows are read at random (`MADV_RANDOM`): without it every page
    fault reads ahead around the page (up to 128 KiB on Linux), 30x what a missed row
    of a few hundred bytes needs, and fills the page cache with rows nobody asked for.
    Advice only: where it is not available the store works the same, slower."""
    size = mapped.numel() * mapped.element_size()
    if not size or not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise(ctypes.c_void_p(mapped.data_ptr()), ctypes.c_size_t(size), MADV_RANDOM)
    except (OSError, AttributeError):
        pass


def _as_bytes(t: torch.Tensor) -> memoryview:
    return memoryview(t.contiguous().view(torch.uint8).numpy()).cast("B")


# ---------------------------------------------------------------------- copies
def save_tensors(directory: Path, tensors: dict[str, torch.Tensor]) -> None:
    """Write `tensors` (`[rows, dim]` each, any backing) as files with their CRC-32 and
    the header last, chunk by chunk: a checkpoint of a table larger than memory."""
    specs, crcs = [], {}
    for name, t in tensors.items():
        spec = TensorSpec(name, tuple(t.shape), t.dtype)
        path = directory / spec.file
        allocate(path, spec.nbytes)
        crc = 0
        with _WriteGuard(path), open(path, "r+b") as f:
            for start, stop in row_chunks(spec.shape[0], spec.shape[1], chunk_rows(spec)):
                data = _as_bytes(t[start:stop])
                crc = zlib.crc32(data, crc)
                f.write(data)
            f.flush()
            os.fsync(f.fileno())
        specs.append(spec)
        crcs[name] = crc
    write_header(directory, specs, crcs)


@contextlib.contextmanager
def fresh_directory(final: Path):
    """Yield an empty temporary directory beside `final`; when the block succeeds it
    replaces `final` (renames: the old version goes only once the new one is in place),
    when it fails it is removed and `final` is left as it was."""
    tmp = final.with_name(f".{final.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        with writing(tmp):
            tmp.mkdir(parents=True)
        yield tmp
        old = final.with_name(f".{final.name}.old")
        if final.exists():
            os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def verify_saved(directory: Path, specs: list[TensorSpec]) -> None:
    """Check a saved directory against the tables it must restore: header, names, shapes,
    types, sizes and every file's CRC-32. Raises CheckpointError naming the file."""
    header = read_header(directory)
    if header is None:
        raise CheckpointError(f"{directory / HEADER}: missing (not a complete table checkpoint)")
    check_matches(directory, header, specs, error=CheckpointError)
    for spec in specs:
        want = header["tensors"][spec.name].get("crc32")
        got = _crc_of(directory / spec.file)
        if want is None or got != want:
            raise CheckpointError(f"{directory / spec.file}: checksum {got:#010x}, the header says "
                                  f"{want if want is None else f'{want:#010x}'} (damaged)")


def _crc_of(path: Path) -> int:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            crc = zlib.crc32(chunk, crc)
    return crc


def load_into(directory: Path, spec: TensorSpec, out: torch.Tensor) -> None:
    """Read a verified file into `out` (any backing), chunk by chunk."""
    with open(directory / spec.file, "rb") as f:
        for start, stop in row_chunks(spec.shape[0], spec.shape[1], chunk_rows(spec)):
            target = out[start:stop]
            buf = bytearray(target.numel() * target.element_size())
            f.readinto(buf)
            target.copy_(torch.frombuffer(buf, dtype=torch.uint8).view(spec.dtype).view(target.shape))
