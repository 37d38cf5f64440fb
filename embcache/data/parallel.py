"""A split's batches read by several threads at once, yielded in the one-thread order.

One reader thread (`CTRBatches.background`) makes about 2 M Criteo-shaped rows/s; a GPU
step at batch 65,536 takes more. The batches of an epoch are cut from the Parquet footers,
so batch i's rows are known before any is read: the epoch's batches are cut into chunks of
consecutive batches, reader w reads chunks w, w + W, w + 2W, ... in one pass of a
`CTRBatches` of its own that passes over the other readers' batches unread (their row groups
are not decoded; each reader opens every shard once), and the batches are taken back in order,
chunk after chunk. pyarrow's decoding and numpy's conversions release the GIL, so the
readers run on separate cores.

What stays as with one thread:
- the batches, to the bit (each one is made by the same code from the same rows), in the
  same order, their number included (a chunk that finds the epoch's end ends the epoch);
- an error (a bad row, a damaged shard) is raised when the batch it stops is reached, as the
  same exception, after every batch before it: a reader that fails hands the error on in its
  place in the order, and errors of later chunks wait behind it;
- a rank's slice (`part`) and a resume start (`start_batch`), which are the loader's own;
- memory: each reader holds at most one chunk ahead (`chunk_rows` rows, at least `ahead`
  batches), so `readers * chunk` batches in all.

A chunk's first row group is decoded from its start, rows before the chunk included: chunks
many times longer than a row group keep that extra work small (`chunk_rows`).
"""
from __future__ import annotations

import copy
import math
import os
from typing import Callable, Iterator

from embcache.data.background import ReaderThreads
from embcache.data.batch import Batch
from embcache.data.loader import CTRBatches
from embcache.threads import usable_cores

_ITEM, _CHUNK_END, _END, _ERROR = "item", "chunk end", "end", "error"
MAX_DEFAULT_READERS = 8
CHUNK_ROWS = 262_144  # rows a reader reads in one go: 4 row groups of the writer's default 65,536


def default_readers() -> int:
    """Half of this process's cores (its share under torchrun: `LOCAL_WORLD_SIZE`), at least
    1 and at most 8. The other half is the step's: torch's threads, the cache's host
    bookkeeping, pinning and copies. A reader makes about 2 M Criteo-shaped rows a core-second
    (`bench loader`: 0.4-0.6 CPU-s a million rows of zstd shards; lz4's, the writer's default
    since, cost about a fifth less: `bench/shard_codecs.py`), so 1.5x the fastest step in view
    (6 M samples/s) takes 5 or more; past 8 a reader would take a core from the step for nothing
    in view, and each holds a chunk (`CHUNK_ROWS`) of decoded rows.

    Example:
        >>> 1 <= default_readers() <= 8
        True
    """
    ranks = os.environ.get("LOCAL_WORLD_SIZE", "1").strip()
    per_rank = usable_cores() // max(int(ranks) if ranks.isdigit() else 1, 1)
    return max(1, min(MAX_DEFAULT_READERS, per_rank // 2))


class ParallelBatches(Iterator[Batch]):
    """The batches of `loader`, read by `readers` threads, in the loader's order.

    Args:
        loader: the `CTRBatches` to read (its split, batch size, shard order, `start_batch`,
            `part` and devices are kept).
        readers: threads reading at once (None: `default_readers()`); 1 reads in one thread,
            chunk by chunk, as `loader.background` does.
        ahead: batches each reader makes before they are taken, at least (a chunk is never
            shorter).
        chunk_rows: rows of the epoch a reader reads in one go (rounded up to whole batches;
            None: `CHUNK_ROWS`); memory is about `readers * chunk_rows` decoded rows.
        transform: applied to each host batch in the reader thread (e.g. a benchmark's own
            input layout); then the result is yielded as it is, not placed on the devices.
        stop: the epoch's batch to end before (None: the end of the epoch); nothing after it
            is read (a benchmark timing the first batches of a split).

    Batches are placed on `loader.device` (ids on `loader.sparse_device`) in the thread that
    takes them, non-blocking from pinned memory. Use it in a `with` block (or call `close()`):
    that stops and joins every reader however the loop ends, Ctrl-C included.

    Example:
        >>> loader = CTRBatches("datasets/synthetic", "train", 2048)  # doctest: +SKIP
        >>> with ParallelBatches(loader, readers=2) as batches:  # doctest: +SKIP
        ...     for batch in batches:
        ...         logits = model(batch.dense, batch.sparse)
    """

    def __init__(self, loader: CTRBatches, readers: int | None = None, ahead: int = 2,
                 chunk_rows: int | None = None, transform: Callable | None = None, stop: int | None = None):
        readers = default_readers() if readers is None else int(readers)
        if readers < 1:
            raise ValueError(f"readers must be >= 1, got {readers}")
        if ahead < 1:
            raise ValueError(f"ahead must be >= 1, got {ahead}")
        self.loader, self.readers, self._transform = loader, readers, transform
        chunk_rows = CHUNK_ROWS if chunk_rows is None else max(int(chunk_rows), 1)
        self.chunk_batches = max(int(ahead), math.ceil(chunk_rows / loader.batch_size))
        end = loader.batches_per_epoch() if stop is None else min(int(stop), loader.batches_per_epoch())
        self._chunks = chunk_plan(loader.start_batch, end, self.chunk_batches, open_end=stop is None)
        self._stop_batch = end if stop is not None else None
        # a reader's queue holds a whole chunk and its end mark: it reads a chunk through while
        # the batches of the chunks before it are taken
        self._readers = ReaderThreads(readers, maxsize=self.chunk_batches + 1)
        self._chunk, self._finished = 0, not self._chunks
        self._readers.start(self._read, [f"embcache-reader-{loader.split}-{w}" for w in range(readers)])

    def __len__(self) -> int:
        if self._stop_batch is None:
            return len(self.loader)
        return max(self._stop_batch - self.loader.start_batch, 0)

    # -------------------------------------------------------------- reader threads
    def _read(self, w: int) -> None:
        """Reader `w`: chunks w, w + W, ... into its queue, each followed by its end mark. One
        pass over the epoch with a `CTRBatches` of its own: the shards are opened once a
        reader, and the other readers' batches are passed over unread (their row groups not
        decoded)."""
        mine = self._chunks[w::self.readers]
        if not mine:
            return
        part = copy.copy(self.loader)
        part.start_batch = mine[0][0]
        batches = part.host_batches(only=lambda index: self._reader_of(index) == w)
        try:
            for start, stop in mine:
                if not self._read_chunk(w, batches, start, stop):
                    return
        except BaseException as err:  # handed to the consumer, raised there in its place
            self._put(w, (_ERROR, err))
        finally:
            batches.close()  # the shard readers it holds

    def _reader_of(self, index: int) -> int:
        """The reader of batch `index` (the last chunk's, to the end of the rows)."""
        chunk = (index - self._chunks[0][0]) // self.chunk_batches
        return min(chunk, len(self._chunks) - 1) % self.readers

    def _read_chunk(self, w: int, batches: Iterator, start: int, stop: int | None) -> bool:
        """Batches `start..stop-1` (None: to the epoch's end) into queue `w`, then a chunk's end
        mark, or the epoch's end where it comes first; False when reading is over."""
        index = start
        while stop is None or index < stop:
            batch = next(batches, None)
            if batch is None:
                return self._put(w, (_END, None)) and False
            if not self._put(w, (_ITEM, batch if self._transform is None else self._transform(batch))):
                return False
            index += 1
        return self._put(w, (_CHUNK_END, None))

    def _put(self, w: int, entry) -> bool:
        return self._readers.put(w, entry)

    # -------------------------------------------------------------- the consumer
    def __iter__(self) -> "ParallelBatches":
        return self

    def __next__(self):
        while not self._finished:
            try:
                kind, value = self._readers.queues[self._chunk % self.readers].get()
            except BaseException:  # Ctrl-C while waiting: no reader outlives it
                self.close()
                raise
            if kind == _ITEM:
                return value if self._transform is not None else self.loader.place(value)
            if kind == _CHUNK_END:
                self._chunk += 1
                if self._chunk < len(self._chunks):
                    continue
            self.close()  # the end (of the epoch, or at `stop`), or an error
            if kind == _ERROR:
                raise value
        raise StopIteration

    def close(self) -> None:
        """Stop the readers and wait for them (each finishes the batch it is making); batches
        made and not taken are dropped. Safe to call more than once."""
        self._finished = True
        self._readers.close()

    def __enter__(self) -> "ParallelBatches":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def chunk_plan(start: int, batches: int, chunk: int, open_end: bool = True) -> list[tuple[int, int | None]]:
    """The chunks `(first batch, stop)` of batches `start..batches-1`, `chunk` at a time
    (none when `start` is past the end). With `open_end` the last one's stop is None: it
    reads to the end of the rows the footers hold, as the one thread does.

    Example:
        >>> chunk_plan(3, 10, 3)
        [(3, 6), (6, 9), (9, None)]
        >>> chunk_plan(3, 10, 3, open_end=False)
        [(3, 6), (6, 9), (9, 10)]
    """
    firsts = list(range(start, batches, chunk))
    return [(first, min(first + chunk, batches) if k < len(firsts) - 1 or not open_end else None)
            for k, first in enumerate(firsts)]
