"""MXNet RecordIO face datasets (`train.rec` + `train.idx`, as MS1MV2 and Glint360K ship),
read without mxnet.

A record is: magic `0xCED7230A` (uint32 LE), a uint32 whose low 29 bits are the payload length
(the high 3 bits a continuation flag, 0 for a whole record), the payload, then zero padding to a
multiple of 4 bytes. A payload starts with a 24-byte header `<IfQQ` (flag, label, id, id2);
when `flag > 0`, `flag` float32 labels follow the header and `label` is unused. The rest is the
encoded image. `train.idx` has one `index<TAB>byte offset` line per record. In face datasets,
record 0 is often a header whose first label is the index one past the last image record
(images are records 1 .. that - 1); without such a header every indexed record is an image.
"""
from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np
import torch

from embcache.data.bad_rows import DataFormatError
from .folder import IndexedFaces
from .images import decode_image

MAGIC = 0xCED7230A
_HEADER = struct.Struct("<IfQQ")


def read_index(idx_path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """(record keys, byte offsets) from a `.idx` file, in key order."""
    keys, offsets = [], []
    with open(idx_path) as f:
        for line_no, line in enumerate(f, 1):
            parts = line.split()
            if not parts:
                continue
            if len(parts) != 2 or not parts[0].lstrip("-").isdigit() or not parts[1].isdigit():
                raise DataFormatError(f"{idx_path}:{line_no}: expected 'index<TAB>offset', got {line.strip()!r}")
            keys.append(int(parts[0]))
            offsets.append(int(parts[1]))
    if not keys:
        raise DataFormatError(f"{idx_path}: empty index")
    keys, offsets = np.array(keys, dtype=np.int64), np.array(offsets, dtype=np.int64)
    order = np.argsort(keys, kind="stable")
    return keys[order], offsets[order]


class RecordFile:
    """Random access to the records of a `.rec` through its `.idx`."""

    def __init__(self, rec_path: str | os.PathLike, idx_path: str | os.PathLike | None = None):
        self.rec_path = Path(rec_path)
        self.idx_path = Path(idx_path) if idx_path else self.rec_path.with_suffix(".idx")
        for p in (self.rec_path, self.idx_path):
            if not p.is_file():
                raise DataFormatError(f"{p}: no such file")
        self.keys, self.offsets = read_index(self.idx_path)
        self.key_pos = {int(k): i for i, k in enumerate(self.keys)}
        self.size = self.rec_path.stat().st_size
        self._f = None

    def _file(self):
        if self._f is None:
            self._f = open(self.rec_path, "rb")
        return self._f

    def payload(self, key: int) -> bytes:
        where = f"{self.rec_path}#{key}"
        if key not in self.key_pos:
            raise DataFormatError(f"{where}: record not in {self.idx_path.name}")
        offset = int(self.offsets[self.key_pos[key]])
        f = self._file()
        f.seek(offset)
        head = f.read(8)
        if len(head) < 8:
            raise DataFormatError(f"{where}: truncated record at byte {offset}")
        magic, lrec = struct.unpack("<II", head)
        if magic != MAGIC:
            raise DataFormatError(f"{where}: bad magic 0x{magic:08x} at byte {offset} (not a RecordIO record)")
        cflag, length = lrec >> 29, lrec & ((1 << 29) - 1)
        if cflag != 0:
            raise DataFormatError(f"{where}: multi-part record (continuation flag {cflag}) is not supported")
        data = f.read(length)
        if len(data) < length:
            raise DataFormatError(f"{where}: truncated record ({len(data)} of {length} bytes)")
        return data

    def header(self, key: int) -> tuple[int, np.ndarray, bytes]:
        """(flag, labels, image bytes) of a record."""
        data = self.payload(key)
        if len(data) < _HEADER.size:
            raise DataFormatError(f"{self.rec_path}#{key}: record shorter than its 24-byte header")
        flag, label, _, _ = _HEADER.unpack_from(data)
        start = _HEADER.size
        if flag > 0:
            end = start + 4 * flag
            if len(data) < end:
                raise DataFormatError(f"{self.rec_path}#{key}: header names {flag} labels, record too short")
            labels = np.frombuffer(data[start:end], dtype="<f4")
            return flag, labels, data[end:]
        return flag, np.array([label], dtype=np.float32), data[start:]

    def close(self):
        if self._f is not None:
            self._f.close()
            self._f = None


class RecordIOFaces(IndexedFaces):
    """Labelled face images from `train.rec`/`train.idx`.

    Labels are read from every image record's header once (and cached beside the file as
    `<name>.labels.npy` where it is writable). A label that is not a non-negative integer, or
    is not below `num_classes` when that is given, is an error naming the record.
    """

    def __init__(self, rec_path: str | os.PathLike, idx_path: str | os.PathLike | None = None,
                 image_size: int = 112, num_classes: int | None = None, progress: bool = True):
        self.records = RecordFile(rec_path, idx_path)
        keys = self.records.keys
        flag, first, _ = self.records.header(int(keys[0]))
        if flag > 0 and int(keys[0]) == 0:  # the insightface-style header record
            end = int(first[0])
            keys = keys[(keys >= 1) & (keys < end)]
        self.image_keys = keys
        labels = self._labels(progress)
        bad = np.nonzero((labels < 0) | (labels != np.floor(labels)) |
                         ((labels >= num_classes) if num_classes else False))[0]
        if bad.size:
            limit = f" [0, {num_classes})" if num_classes else " (non-negative integers)"
            raise DataFormatError(f"{self.records.rec_path}#{int(keys[bad[0]])}: label {labels[bad[0]]:g} "
                                  f"out of range{limit}; {bad.size} such record(s)")
        super().__init__(torch.from_numpy(labels.astype(np.int64)), image_size,
                         f"RecordIO {self.records.rec_path} ({len(keys):,} images)")
        if num_classes:
            self.num_classes = max(self.num_classes, num_classes)
            self.counts = torch.bincount(self.labels, minlength=self.num_classes)
            self.offsets = torch.cat([torch.zeros(1, dtype=torch.long), self.counts.cumsum(0)])

    def _labels(self, progress: bool) -> np.ndarray:
        rec = self.records.rec_path
        cache = rec.with_suffix(".labels.npy")
        stamp = np.array([rec.stat().st_size, rec.stat().st_mtime_ns, len(self.image_keys)], dtype=np.int64)
        if cache.is_file():
            try:
                saved = np.load(cache)
                if np.array_equal(saved[:3].astype(np.int64), stamp):
                    return saved[3:].astype(np.float64)
            except (OSError, ValueError):
                pass
        from tqdm import tqdm

        labels = np.empty(len(self.image_keys), dtype=np.float64)
        for i, key in enumerate(tqdm(self.image_keys, desc=f"reading labels of {rec.name}", disable=not progress,
                                     leave=False)):
            labels[i] = self.records.header(int(key))[1][0]
        try:
            np.save(cache, np.concatenate([stamp.astype(np.float64), labels]))
        except OSError:
            pass
        return labels

    def read(self, index: int) -> torch.Tensor:
        key = int(self.image_keys[index])
        _, _, image = self.records.header(key)
        return decode_image(image, f"{self.records.rec_path}#{key}", self.image_size)


def write_recordio(rec_path: str | os.PathLike, items, header: bool = True) -> tuple[Path, Path]:
    """Write `(label, image bytes)` items as `rec_path` + its `.idx` (record 0 a header when
    `header`, as face datasets do). For tests and for converting an image folder."""
    rec_path = Path(rec_path)
    idx_path = rec_path.with_suffix(".idx")
    items = list(items)
    with open(rec_path, "wb") as rec, open(idx_path, "w") as idx:
        def put(key, payload):
            idx.write(f"{key}\t{rec.tell()}\n")
            rec.write(struct.pack("<II", MAGIC, len(payload)))
            rec.write(payload)
            rec.write(b"\0" * (-len(payload) % 4))

        first = 1 if header else 0
        if header:
            put(0, _HEADER.pack(2, 0.0, 0, 0) + np.array([len(items) + 1, len(items) + 1], "<f4").tobytes())
        for i, (label, image) in enumerate(items):
            put(first + i, _HEADER.pack(0, float(label), first + i, 0) + image)
    return rec_path, idx_path
