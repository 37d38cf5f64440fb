"""MXNet RecordIO face datasets (`train.rec` + `train.idx`, as MS1MV2 and Glint360K ship),
read without mxnet.

A record is one or more parts. A part is: magic `0xCED7230A` (uint32 LE), a uint32 `lrec`
whose high 3 bits are a continuation flag (0 whole record, 1 first, 2 middle, 3 last part) and
whose low 29 bits are the part's length, the part's bytes, then zero padding to a multiple of 4.
dmlc's writer splits a payload wherever the magic word sits at a 4-byte-aligned offset in it
(and drops that word), so a reader re-inserts the magic between consecutive parts; that keeps
the magic a reliable record boundary for readers that scan the file.

A payload starts with a 24-byte header `<IfQQ` (flag, label, id, id2); when `flag > 0`,
`flag` float32 labels follow the header and `label` is unused. The rest is the encoded image.
`train.idx` has one `index<TAB>byte offset` line per record. In face datasets, record 0 is
often a header whose first label is the index one past the last image record (images are
records 1 .. that - 1); without such a header every indexed record is an image.
"""
from __future__ import annotations

import os
import re
import struct
from pathlib import Path

import numpy as np
import torch

from embcache.errors import DataFormatError
from embcache.integrity import array_crc32

from .folder import IndexedFaces
from .images import decode_image

MAGIC = 0xCED7230A
_MAGIC_BYTES = struct.pack("<I", MAGIC)
_HEADER = struct.Struct("<IfQQ")
_LENGTH_MASK = (1 << 29) - 1
# a chunk of `.idx` lines is parsed at C speed when all of them look like this; otherwise
# line by line, to name the bad one
_IDX_CHUNK = re.compile(rb"(?:[ \t]*(?:-?\d{1,18}[ \t]+\d{1,18})?[ \t\r]*\n)*")


def read_index(idx_path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """(record keys, byte offsets) from a `.idx` file, sorted by key; when a key is listed
    twice the later line wins, as in mxnet. Parsed in chunks into int64 arrays: Glint360K's
    17M lines as Python ints and a dict would take gigabytes."""
    pairs, line_no = [], 0
    with open(idx_path, "rb") as f:
        while True:
            lines = f.readlines(1 << 20)
            if not lines:
                break
            if not lines[-1].endswith(b"\n"):
                lines[-1] += b"\n"
            chunk = b"".join(lines)
            if _IDX_CHUNK.fullmatch(chunk) is None:
                _raise_bad_index_line(idx_path, lines, line_no)
            pairs.append(np.array(chunk.split(), dtype=np.int64).reshape(-1, 2))
            line_no += len(lines)
    both = np.concatenate(pairs) if pairs else np.empty((0, 2), dtype=np.int64)
    if not len(both):
        raise DataFormatError(f"{idx_path}: empty index")
    order = np.argsort(both[:, 0], kind="stable")
    keys, offsets = both[order, 0], both[order, 1]
    last = np.append(keys[1:] != keys[:-1], True)  # the last of equal keys: the later line
    return keys[last], offsets[last]


def _raise_bad_index_line(idx_path, lines: list[bytes], first_line_no: int):
    for n, line in enumerate(lines, first_line_no + 1):
        if _IDX_CHUNK.fullmatch(line) is None:
            text = line.decode("utf-8", "replace").strip()
            raise DataFormatError(f"{idx_path}:{n}: expected 'index<TAB>offset', got {text!r}")
    raise AssertionError("unreachable: a chunk fails only through one of its lines")


class RecordFile:
    """Random access to the records of a `.rec` through its `.idx`."""

    def __init__(self, rec_path: str | os.PathLike, idx_path: str | os.PathLike | None = None):
        self.rec_path = Path(rec_path)
        self.idx_path = Path(idx_path) if idx_path else self.rec_path.with_suffix(".idx")
        for p in (self.rec_path, self.idx_path):
            if not p.is_file():
                raise DataFormatError(f"{p}: no such file")
        self.keys, self.offsets = read_index(self.idx_path)
        self._f = None

    def _file(self):
        if self._f is None:
            self._f = open(self.rec_path, "rb")
        return self._f

    def offset_of(self, key: int) -> int:
        pos = int(np.searchsorted(self.keys, key))
        if pos == len(self.keys) or int(self.keys[pos]) != key:
            raise DataFormatError(f"{self.rec_path}#{key}: record not in {self.idx_path.name}")
        return int(self.offsets[pos])

    def payload(self, key: int, limit: int | None = None) -> bytes:
        """The payload of record `key`, its parts joined; with `limit`, reading stops once
        that many bytes are in hand (the rest of the record is not read)."""
        where = f"{self.rec_path}#{key}"
        f = self._file()
        pos = self.offset_of(key)
        out, part = bytearray(), 0
        while True:
            f.seek(pos)
            head = f.read(8)
            if len(head) < 8:
                raise DataFormatError(f"{where}: truncated record at byte {pos} (part {part + 1})")
            magic, lrec = struct.unpack("<II", head)
            if magic != MAGIC:
                raise DataFormatError(f"{where}: bad magic 0x{magic:08x} at byte {pos} "
                                      f"({'not a RecordIO record' if part == 0 else f'part {part + 1}'})")
            cflag, length = lrec >> 29, lrec & _LENGTH_MASK
            if cflag not in ((0, 1) if part == 0 else (2, 3)):
                expected = "0 or 1 (whole or first part)" if part == 0 else "2 or 3 (middle or last part)"
                raise DataFormatError(f"{where}: part {part + 1} at byte {pos} has continuation flag {cflag}, "
                                      f"expected {expected}: garbled multi-part record")
            if part:
                out += _MAGIC_BYTES  # the word the writer split at
            take = length if limit is None else min(length, max(0, limit - len(out)))
            data = f.read(take)
            if len(data) < take:
                raise DataFormatError(f"{where}: truncated record (part {part + 1}: {len(data)} of {length} bytes)")
            out += data
            if cflag in (0, 3) or (limit is not None and len(out) >= limit):
                return bytes(out)
            pos += 8 + (length + 3) // 4 * 4
            part += 1

    def first_label(self, key: int) -> tuple[int, float]:
        """(flag, first label) of a record, reading only its header (not the image)."""
        flag, labels, _ = self._unpack(self.payload(key, limit=_HEADER.size + 4), key, max_labels=1)
        return flag, float(labels[0])

    def header(self, key: int) -> tuple[int, np.ndarray, bytes]:
        """(flag, labels, image bytes) of a record."""
        data = self.payload(key)
        flag, labels, end = self._unpack(data, key)
        return flag, labels, data[end:]

    def _unpack(self, data: bytes, key: int, max_labels: int | None = None) -> tuple[int, np.ndarray, int]:
        """(flag, float32 labels, where the image starts) of record `key`'s payload `data`:
        the header's label when `flag` is 0, else the `flag` labels after it (only the first
        `max_labels` of them, which is all `data` must hold, when that is given)."""
        if len(data) < _HEADER.size:
            raise DataFormatError(f"{self.rec_path}#{key}: record shorter than its 24-byte header")
        flag, label, _, _ = _HEADER.unpack_from(data)
        start = _HEADER.size
        if flag > 0:
            end = start + 4 * (flag if max_labels is None else min(flag, max_labels))
            if len(data) < end:
                raise DataFormatError(f"{self.rec_path}#{key}: header names {flag} labels, record too short")
            return flag, np.frombuffer(data[start:end], dtype="<f4"), end
        return flag, np.array([label], dtype=np.float32), start

    def close(self):
        if self._f is not None:
            self._f.close()
            self._f = None


def check_labels(labels: np.ndarray, keys: np.ndarray, rec_path, num_classes: int | None) -> None:
    """Raise, naming the first bad record, unless every label is a class index: finite, a
    non-negative integer, below `num_classes` or, when that is not given, below the number of
    image records (labels are dense class indices, so there cannot be more classes than
    images). The bound keeps a garbled label such as 3e9 from sizing the per-class tables."""
    bound = num_classes if num_classes else len(labels)
    finite = np.isfinite(labels)
    checks = (
        (~finite, lambda v: f"non-finite label {v:g}"),
        (finite & (labels < 0), lambda v: f"negative label {v:g}"),
        (finite & (labels != np.floor(labels)), lambda v: f"label {v:g} is not an integer"),
        (finite & (labels >= bound),
         (lambda v: f"label {v:g} out of range [0, {num_classes})") if num_classes else
         (lambda v: f"label {v:g} out of range: not below the {bound:,} image records "
                    f"(pass --num-classes for a larger label space)")),
    )
    bad = np.zeros(len(labels), dtype=bool)
    for mask, _ in checks:
        bad |= mask
    if not bad.any():
        return
    first = int(np.argmax(bad))
    describe = next(d for mask, d in checks if mask[first])
    raise DataFormatError(f"{rec_path}#{int(keys[first])}: {describe(float(labels[first]))}; "
                          f"{int(bad.sum())} bad label(s) in all")


class RecordIOFaces(IndexedFaces):
    """Labelled face images from `train.rec`/`train.idx`.

    Labels are read from every image record's header once (and cached beside the file as
    `<name>.labels.npy` where it is writable). A label that is not a class index (see
    `check_labels`) is an error naming the record.
    """

    def __init__(self, rec_path: str | os.PathLike, idx_path: str | os.PathLike | None = None,
                 image_size: int = 112, num_classes: int | None = None, progress: bool = True):
        self.records = RecordFile(rec_path, idx_path)
        keys = self.records.keys
        flag, first = self.records.first_label(int(keys[0]))
        if flag > 0 and int(keys[0]) == 0:  # the insightface-style header record
            end = int(first) if np.isfinite(first) else 0
            keys = keys[(keys >= 1) & (keys < end)]
        self.image_keys = keys
        labels = self._labels(progress, num_classes)
        super().__init__(torch.from_numpy(labels), image_size,
                         f"RecordIO {self.records.rec_path} ({len(keys):,} images)", position="record")
        if num_classes:
            self.num_classes = max(self.num_classes, num_classes)
            self.counts = torch.bincount(self.labels, minlength=self.num_classes)
            self.offsets = torch.cat([torch.zeros(1, dtype=torch.long), self.counts.cumsum(0)])

    def _labels(self, progress: bool, num_classes: int | None) -> np.ndarray:
        """Checked int64 labels, from the cache when it was written for this very file (size,
        mtime in ns and image count, stored as int64 so the stamp compares exactly) and its
        labels' CRC-32 matches (else they are read again)."""
        rec = self.records.rec_path
        cache = rec.with_suffix(".labels.npy")
        st = rec.stat()
        stamp = np.array([st.st_size, st.st_mtime_ns, len(self.image_keys)], dtype=np.int64)
        labels = None
        if cache.is_file():
            try:
                saved = np.load(cache, allow_pickle=False)
                # the stamp, then the labels' CRC-32: a damaged cache is read again from the file
                if (saved.dtype == np.int64 and len(saved) == 4 + len(self.image_keys)
                        and np.array_equal(saved[:3], stamp) and saved[3] == array_crc32(saved[4:])):
                    labels = saved[4:]
            except (OSError, ValueError):
                pass
        if labels is not None:  # checked when cached, but perhaps against another --num-classes
            check_labels(labels, self.image_keys, rec, num_classes)
            return labels
        from tqdm import tqdm

        labels = np.empty(len(self.image_keys), dtype=np.float64)
        for i, key in enumerate(tqdm(self.image_keys, desc=f"reading labels of {rec.name}", disable=not progress,
                                     leave=False)):
            labels[i] = self.records.first_label(int(key))[1]
        check_labels(labels, self.image_keys, rec, num_classes)
        labels = labels.astype(np.int64)
        _save_atomically(cache, np.concatenate([stamp, [array_crc32(labels)], labels]))
        return labels

    def read(self, index: int) -> torch.Tensor:
        key = int(self.image_keys[index])
        _, _, image = self.records.header(key)
        return decode_image(image, f"{self.records.rec_path}#{key}", self.image_size)


def _save_atomically(path: Path, array: np.ndarray) -> None:
    """Best effort (a read-only dataset directory just means no cache); written beside and
    renamed, so that a concurrent start never reads half a file."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            np.save(f, array)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)


def write_recordio(rec_path: str | os.PathLike, items, header: bool = True) -> tuple[Path, Path]:
    """Write `(label, image bytes)` items as `rec_path` + its `.idx` (record 0 a header when
    `header`, as face datasets do), splitting records at aligned magic words as dmlc does.
    For tests and for converting an image folder."""
    rec_path = Path(rec_path)
    idx_path = rec_path.with_suffix(".idx")
    items = list(items)
    with open(rec_path, "wb") as rec, open(idx_path, "w") as idx:
        def put(key, payload):
            idx.write(f"{key}\t{rec.tell()}\n")
            rec.write(encode_record(payload))

        first = 1 if header else 0
        if header:
            put(0, _HEADER.pack(2, 0.0, 0, 0) + np.array([len(items) + 1, len(items) + 1], "<f4").tobytes())
        for i, (label, image) in enumerate(items):
            put(first + i, _HEADER.pack(0, float(label), first + i, 0) + image)
    return rec_path, idx_path


def encode_record(payload: bytes) -> bytes:
    """`payload` as RecordIO parts, the way dmlc's `RecordIOWriter::WriteRecord` writes it."""
    if len(payload) >= 1 << 29:
        raise ValueError(f"a RecordIO record holds less than 2**29 bytes, got {len(payload):,}")
    out, start = bytearray(), 0
    for i in range(0, len(payload) - 3, 4):
        if payload[i:i + 4] == _MAGIC_BYTES:
            out += struct.pack("<II", MAGIC, (1 if start == 0 else 2) << 29 | (i - start)) + payload[start:i]
            start = i + 4
    rest = len(payload) - start
    out += struct.pack("<II", MAGIC, (3 if start else 0) << 29 | rest) + payload[start:]
    return bytes(out + b"\0" * (-rest % 4))
