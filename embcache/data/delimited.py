"""Streaming reader of large delimited text files (Criteo TSV, Avazu CSV, optionally gzip) and
the vectorized field parsers the converters share.

Files are read with pyarrow's streaming CSV reader, block by block, every field as a string,
so memory is bounded by the block size and a malformed value never aborts a block. Every
physical line is accounted for: a line with the wrong number of fields is skipped and logged
(with its line number) by the reader itself, an empty line arrives as a row of empty strings
for the caller to classify, and `LineNumbers` maps a delivered row back to its physical line.
"""
from __future__ import annotations

import codecs
import contextlib
import csv
import os
import sys
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from embcache.data.bad_rows import BadRowLog
from embcache.errors import first_line, format_error

BLOCK_BYTES = 16 << 20  # ~100k Criteo lines per block
BOM = "\ufeff"  # a UTF-8 byte-order mark, as decoded
_NUMBER = r"^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?$"


class LineNumbers:
    """Physical line of the k-th delivered row of a file, given the rows the reader skipped and
    the line breaks inside quoted fields (a CSV value may hold a newline: its row then spans
    several lines, and every later row starts that many lines further on).

    pyarrow numbers rows as records (a quoted newline does not count), so the numbering is
    done in records first, then the line breaks of the records before are added. Memory is
    bounded by the block, not the file: skipped rows before the last row the consumer has
    finished with (`forget_before`) are kept as counts only; the others (at most those of a
    block or two) are kept for the exact mapping.
    """

    def __init__(self, header_lines: int):
        self.header = header_lines
        self.before = 0            # skipped records before every row still to be asked about
        self.recent: list[int] = []  # ascending record numbers of the other skipped records
        self.recent_breaks: list[int] = []  # line breaks inside each of those records
        self.breaks_before = 0     # line breaks inside the records before every row still to be asked about
        self._recent_array: np.ndarray | None = None
        self._breaks_array: np.ndarray | None = None
        self._first = 0            # the current block: its first row, its rows' breaks before each row
        self._prefix = np.zeros(1, dtype=np.int64)

    def skip(self, number: int | None, breaks: int = 0) -> None:
        """The reader skipped a record (reported in order) holding `breaks` line breaks; None
        when it does not know which: such a record is taken to lie before every row (as any skip
        before a row shifts it)."""
        if number is None or number < 0:
            self.before += 1
            self.breaks_before += breaks
        else:
            self.recent.append(int(number))
            self.recent_breaks.append(breaks)
            self._recent_array = None

    def block(self, first: int, breaks: np.ndarray | None) -> None:
        """The reader delivered a block starting at row `first` whose rows hold `breaks` line
        breaks each (None: none); the rows before it are done with."""
        self.breaks_before += int(self._prefix[-1])
        self._first = first
        self._prefix = np.zeros(1, dtype=np.int64) if breaks is None else np.concatenate(([0], np.cumsum(breaks)))

    def records(self, rows: np.ndarray) -> np.ndarray:
        """1-based record numbers (the header counted) of delivered rows."""
        rows = np.asarray(rows, dtype=np.int64)
        self._arrays()
        # row r is the first record R with R - header - (skipped records <= R) = r + 1. With the
        # skipped records s_0 < s_1 < ..., s_i lies before it exactly when s_i - i <= r + 1 +
        # header + before (s_i - i does not decrease), so one search counts them.
        base = rows + 1 + self.header + self.before
        skipped = self._recent_array
        return base + np.searchsorted(skipped - np.arange(len(skipped)), base, side="right")

    def of(self, rows: np.ndarray) -> np.ndarray:
        """1-based line numbers of delivered rows (0-based indices among delivered rows, none
        before the `forget_before` mark nor, but for the first past it, past the last block)."""
        rows = np.asarray(rows, dtype=np.int64)
        records = self.records(rows)
        return records + self._breaks(records, rows)

    def of_skipped(self, numbers: np.ndarray) -> np.ndarray:
        """1-based line numbers of skipped records (pyarrow's numbers), once the rows before
        them are delivered (none before the last block)."""
        numbers = np.asarray(numbers, dtype=np.int64)
        self._arrays()
        skipped = np.searchsorted(self._recent_array, numbers, side="left")
        return numbers + self._breaks(numbers, numbers - 1 - self.header - self.before - skipped)

    def _breaks(self, records: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Line breaks inside the records before record `records`, which follows `rows` delivered rows."""
        delivered = self._prefix[np.clip(rows - self._first, 0, len(self._prefix) - 1)]
        skipped = self._breaks_array[np.searchsorted(self._recent_array, records, side="left")]
        return self.breaks_before + delivered + skipped

    def _arrays(self) -> None:
        if self._recent_array is None:
            self._recent_array = np.asarray(self.recent, dtype=np.int64)
            self._breaks_array = np.concatenate(([0], np.cumsum(self.recent_breaks, dtype=np.int64)))

    def forget_before(self, delivered: int) -> None:
        """Rows below `delivered` will not be asked about again: fold the skipped records before
        the last of them into counts."""
        if delivered <= 0 or not self.recent:
            return
        last = int(self.records(np.array([delivered - 1]))[0])
        folded = int(np.searchsorted(self._recent_array, last))
        if folded:
            self.before += folded
            self.breaks_before += int(self._breaks_array[folded])
            del self.recent[:folded], self.recent_breaks[:folded]
            self._recent_array = None


def read_blocks(path: str | os.PathLike, column_names: list[str], delimiter: str, header: bool,
                bad_rows: BadRowLog | None, block_bytes: int = BLOCK_BYTES
                ) -> Iterator[tuple[pa.RecordBatch, int, LineNumbers]]:
    """Yield `(block of string columns, index of its first row among delivered rows, line map)`.

    Lines with a different number of fields are skipped and logged in `bad_rows` (when given).
    With `header`, the first line must name exactly `column_names`. gzip is detected from a
    `.gz` suffix. An unreadable or truncated file raises DataFormatError naming it.
    """
    path = Path(path)
    lines = LineNumbers(1 if header else 0)
    quoted = delimiter == ","
    skipped = _SkippedRows(path, lines, bad_rows, len(column_names), quoted)
    on_invalid = skipped.on_invalid
    _check_text(path)
    if header:
        _check_header(path, column_names, delimiter)
    try:
        stream = pa.input_stream(str(path), compression="detect")
        with _quiet_decode_errors(on_invalid):
            reader = pacsv.open_csv(
                stream,
                read_options=pacsv.ReadOptions(column_names=None if header else column_names,
                                               block_size=block_bytes, use_threads=False),
                # a quoted CSV field may hold a newline: without newlines_in_values a block cut at
                # that newline broke its row in two (a "bad" row, the row's data mangled)
                parse_options=pacsv.ParseOptions(delimiter=delimiter, quote_char='"' if quoted else False,
                                                 newlines_in_values=quoted,
                                                 ignore_empty_lines=False, invalid_row_handler=on_invalid),
                convert_options=pacsv.ConvertOptions(column_types={c: pa.string() for c in column_names},
                                                     include_columns=column_names, strings_can_be_null=False,
                                                     quoted_strings_can_be_null=False))
    except FileNotFoundError:
        raise format_error(path, None, "no such file") from None
    except (OSError, pa.ArrowException) as err:
        raise _read_error(path, lines, err) from None
    if bad_rows is not None:
        bad_rows.seen(path)
    delivered = 0
    while True:
        try:
            with _quiet_decode_errors(on_invalid):
                block = reader.read_next_batch()
        except StopIteration:
            skipped.log()
            return
        except (OSError, pa.ArrowException) as err:
            raise _read_error(path, lines, err, delivered) from None
        lines.block(delivered, line_breaks(block) if quoted else None)
        skipped.log(before=int(lines.records(np.array([delivered + block.num_rows]))[0]))
        yield block, delivered, lines
        delivered += block.num_rows
        lines.forget_before(delivered)  # the consumer is done with this block's rows


class _SkippedRows:
    """The reader's invalid-row handler: a record with the wrong number of fields is skipped,
    and logged in `bad_rows` under its line once the rows before it are delivered (pyarrow
    reports it while parsing, before the line breaks inside the rows before it are known)."""

    def __init__(self, path: Path, lines: LineNumbers, bad_rows: BadRowLog | None, expected: int, quoted: bool):
        self.path, self.lines, self.bad_rows, self.expected, self.quoted = path, lines, bad_rows, expected, quoted
        self.pending: list[tuple[int, str]] = []  # (record number, reason) of skipped records not yet logged

    def on_invalid(self, row) -> str:
        self.lines.skip(row.number, _text_breaks(row.text) if self.quoted else 0)
        if self.bad_rows is not None:
            reason = f"wrong column count: {row.actual_columns} fields, expected {self.expected}"
            if row.number is None:
                self.bad_rows.add(self.path, -1, reason)
            else:
                self.pending.append((row.number, reason))
        return "skip"

    def log(self, before: int | None = None) -> None:
        """Log the pending records numbered below `before` (every one when None)."""
        ready = [p for p in self.pending if before is None or p[0] < before]
        if not ready:
            return
        del self.pending[:len(ready)]  # reported in order: the ready ones come first
        for line, (_, reason) in zip(self.lines.of_skipped(np.array([n for n, _ in ready])), ready):
            self.bad_rows.add(self.path, int(line), reason)


def _text_breaks(text: str | None) -> int:
    """Line breaks in a record's text (CRLF, LF or a lone CR each one, as the reader ends lines)."""
    return 0 if not text else text.count("\n") + text.count("\r") - text.count("\r\n")


def line_breaks(block: pa.RecordBatch) -> np.ndarray | None:
    """Line breaks inside each row's fields (a quoted CSV value may hold some); None: none."""
    total = None
    for col in block.columns:
        data = col.buffers()[2]  # the column's characters: one byte test, the fast path of a large file
        chars = np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, np.uint8)
        if ((chars == 10) | (chars == 13)).any():
            found = pc.count_substring_regex(col, "\r\n|\r|\n").to_numpy(zero_copy_only=False)
            total = found.astype(np.int64) if total is None else total + found
    return total


@contextlib.contextmanager
def _quiet_decode_errors(handler):
    """Silence the "Exception ignored in: <function on_invalid>" report of a line that is not
    UTF-8: pyarrow fails to decode such a line for the invalid-row handler before calling it,
    reports that as unraisable, then raises its own parse error, which `_read_error` words.
    Any other unraisable report goes to the hook that was there."""
    previous = sys.unraisablehook

    def hook(unraisable):
        if not (isinstance(unraisable.exc_value, UnicodeDecodeError) and unraisable.object is handler):
            previous(unraisable)

    sys.unraisablehook = hook
    try:
        yield
    finally:
        sys.unraisablehook = previous


TEXT_CHECK_BYTES = 1 << 20


def _check_text(path: Path) -> None:
    """The start of the file must be UTF-8 text: a binary file (or gzip without a `.gz` name)
    is refused at once, naming the line, rather than read as lines of garbage."""
    try:
        found = first_non_utf8(path, TEXT_CHECK_BYTES)
    except FileNotFoundError:
        raise format_error(path, None, "no such file") from None
    except (OSError, pa.ArrowException) as err:
        raise format_error(path, None, f"cannot read: {first_line(err)}") from None
    if found is not None:
        hint = "" if path.suffix == ".gz" else " (gzip is read from a .gz name)"
        raise _not_text(path, *found, f": is it a binary or compressed file?{hint}")


def _not_text(path: Path, line: int, byte: int, hint: str = ""):
    return format_error(path, line, f"not UTF-8 text (byte 0x{byte:02x}){hint}")


def first_non_utf8(path: str | os.PathLike, limit: int | None = None) -> tuple[int, int] | None:
    """(1-based line, byte) of the first byte that is not UTF-8 in the (decompressed) file,
    reading at most `limit` bytes (a character cut by the limit is not taken for a bad one);
    None when there is none."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    line, read = 1, 0
    with pa.input_stream(str(path), compression="detect") as stream:
        while limit is None or read < limit:
            chunk = stream.read(1 << 20 if limit is None else min(1 << 20, limit - read))
            read += len(chunk)
            try:
                decoder.decode(chunk, final=not chunk)
            except UnicodeDecodeError as err:
                pending = len(err.object) - len(chunk)  # bytes of a character begun in the last chunk
                at = max(err.start - pending, 0)
                return line + chunk.count(b"\n", 0, at), err.object[err.start]
            if not chunk:
                break
            line += chunk.count(b"\n")
    return None


def header_fields(path: str | os.PathLike, delimiter: str) -> tuple[list[str], str]:
    """(the column names of the first line, the line itself), read as the block reader reads
    it: a UTF-8 byte-order mark at the start (Excel's "CSV UTF-8") is no part of the first
    name, since pyarrow drops it too; otherwise every reader that checks a header against
    the blocks' column names would refuse a file the blocks read well."""
    path = Path(path)
    try:
        with pa.input_stream(str(path), compression="detect") as stream:
            first = stream.read(1 << 16).split(b"\n", 1)[0].decode("utf-8", "replace").rstrip("\r")
    except FileNotFoundError:
        raise format_error(path, None, "no such file") from None
    except (OSError, pa.ArrowException) as err:
        raise format_error(path, None, f"cannot read: {first_line(err)}") from None
    first = first.removeprefix(BOM)
    names = next(csv.reader([first]), []) if delimiter == "," else first.split(delimiter)  # quoted as the reader reads
    return names, first


def _check_header(path: Path, column_names: list[str], delimiter: str) -> None:
    """The first line must name exactly `column_names` (before pyarrow sees the file, so the
    error says what is wrong rather than which column pyarrow missed)."""
    names, first = header_fields(path, delimiter)
    if names != column_names:
        raise format_error(path, 1, f"header {first[:120]!r} does not name the expected columns "
                                    f"{delimiter.join(column_names)[:120]!r}")


def _read_error(path: Path, lines: LineNumbers, err: Exception, delivered: int | None = None):
    if isinstance(err, pa.ArrowException) and ("UTF8" in str(err) or "Expected" in str(err)):
        # a line that is not UTF-8 (in a field, or one of the wrong column count): name it
        # rather than print pyarrow's message with the line's bytes in it
        try:
            found = first_non_utf8(path)
        except (OSError, pa.ArrowException):
            found = None
        if found is not None:
            return _not_text(path, *found)
    near = "" if delivered is None else f" (after line {int(lines.of(np.array([delivered]))[0]) - 1})"
    return format_error(path, None, f"cannot read{near}: {first_line(err)}")


# --------------------------------------------------------------------------- field parsers
def is_empty_line(block: pa.RecordBatch) -> np.ndarray:
    """Rows whose every field is empty: the reader's form of an empty line."""
    empty = np.ones(block.num_rows, dtype=bool)
    for col in block.columns:
        empty &= pc.equal(pc.utf8_length(col), 0).to_numpy(zero_copy_only=False)
    return empty


def parse_label(col: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(int8 labels, mask of rows whose field is "0" or "1", or a number equal to one of them:
    "1.0", as pandas writes a float label column, where a Parquet float column's 1.0 already
    read as "1" and a CSV's skipped every row)."""
    one = pc.equal(col, "1").to_numpy(zero_copy_only=False)
    zero = pc.equal(col, "0").to_numpy(zero_copy_only=False)
    rest = ~(one | zero)
    if rest.any():  # the exact spellings above are the fast path of a large file
        values, _, number = parse_numbers64(col)
        one |= rest & number & (values == 1)
        zero |= rest & number & (values == 0)
    return one.astype(np.int8), one | zero


def parse_numbers64(col: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(float64 values, 0 where the field is empty or no finite number; mask of the empty
    fields; mask of the finite numbers): every dense and time column's first step."""
    empty = pc.equal(pc.utf8_length(col), 0).to_numpy(zero_copy_only=False)
    number = pc.match_substring_regex(col, _NUMBER).to_numpy(zero_copy_only=False)
    values = np.zeros(len(col), dtype=np.float64)
    if number.any():
        values[number] = pc.cast(pc.filter(col, pa.array(number)), pa.float64()).to_numpy()
    finite = np.isfinite(values)  # "1e400" matches the pattern but is no usable number
    values[~finite] = 0.0
    return values, empty, number & finite


def parse_count_feature(col: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(float32 `log(max(x, 0) + 1)` with empty -> 0, mask of rows whose field is empty or a
    finite number).

    Clamping at 0 then log1p is the DLRM reference's transform of Criteo's integer counts
    (which include -1 and -2)."""
    values, empty, number = parse_numbers64(col)
    return np.log1p(np.maximum(values, 0.0)).astype(np.float32), empty | number


def splitmix64(x: np.ndarray) -> np.ndarray:
    """A good 64-bit integer hash (SplitMix64's finalizer) of a uint64 array, vectorized; wraps
    on overflow."""
    z = x + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def string_keys(col: pa.Array) -> np.ndarray:
    """A uint64 key per string: 0 for the empty string (missing), the bytes themselves for up to
    8 bytes (exact, so Criteo's 8-hex-digit values never collide), a 64-bit hash with the top
    bit set for longer strings. Vectorized over the Arrow buffers, no Python loop over rows."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    col = col.cast(pa.string())
    n = len(col)
    offsets = np.frombuffer(col.buffers()[1], dtype=np.int32)[col.offset: col.offset + n + 1].astype(np.int64)
    data_buffer = col.buffers()[2]
    data = np.frombuffer(data_buffer, dtype=np.uint8) if data_buffer is not None else np.zeros(0, np.uint8)
    starts, lengths = offsets[:-1], np.diff(offsets)
    if n == 0 or len(data) == 0:
        return np.zeros(n, dtype=np.uint64)

    def word(starts: np.ndarray, lengths: np.ndarray, k: int) -> np.ndarray:
        """Bytes 8k..8k+7 of every string packed big-endian (zeros past the end)."""
        j = np.arange(8)
        idx = starts[:, None] + 8 * k + j[None, :]
        inside = (8 * k + j)[None, :] < lengths[:, None]
        b = np.where(inside, data[np.minimum(idx, len(data) - 1)], 0).astype(np.uint64)
        return (b << (np.uint64(8) * (np.uint64(7) - j.astype(np.uint64)))[None, :]).sum(axis=1, dtype=np.uint64)

    if np.all((lengths == 8) | (lengths == 0)):  # fast path: Criteo's 8-hex-digit values
        keys = np.zeros(n, dtype=np.uint64)
        full = lengths == 8
        packed = data[offsets[0]:offsets[-1]]
        keys[full] = packed.view(">u8").astype(np.uint64) if len(packed) else keys[full]
        return keys
    keys = word(starts, lengths, 0)
    long = lengths > 8
    if long.any():
        ls, ll = starts[long], lengths[long]
        h = splitmix64(keys[long] ^ ll.astype(np.uint64))
        for k in range(1, int((ll.max() + 7) // 8)):
            h = splitmix64(h ^ word(ls, ll, k))
        keys[long] = h | np.uint64(1 << 63)
    return keys
