"""Iterate in a background thread: a reader fills a bounded queue while the trainer works.

`BackgroundIterator` runs any iteration (reading, decoding, checking and pinning batches)
in one daemon thread, at most `ahead` items before the consumer. What the iteration raises
is raised again in the consumer's thread, after the items before it, as the same exception
(its type and message unchanged), so a bad row is reported as it is without the thread. A
`with` block (or `close()`) stops the thread and waits for it whatever ends the loop: the
iteration's end, a `break`, an exception or Ctrl-C. No thread outlives it.
"""
from __future__ import annotations

import queue
import threading
from typing import Iterable, Iterator, TypeVar

T = TypeVar("T")

_ITEM, _END, _ERROR = "item", "end", "error"
_POLL_S = 0.05  # how often a reader blocked on a full queue looks for a stop


class ReaderThreads:
    """Reader threads, each filling a bounded queue of its own, that a stop reaches: a reader
    blocked on a full queue looks for it every `_POLL_S`, and `close()` stops them, drains
    their queues (a blocked reader wakes) and waits for each. What `BackgroundIterator` (one
    reader) and `data.parallel.ParallelBatches` (several) stand on.

    Example:
        >>> readers = ReaderThreads(1, maxsize=2)
        >>> readers.start(lambda w: readers.put(w, ("item", 7)), ["example"])
        >>> readers.queues[0].get(), readers.close()
        (('item', 7), None)
    """

    def __init__(self, count: int, maxsize: int):
        self.queues = [queue.Queue(maxsize=maxsize) for _ in range(count)]
        self.stopped = threading.Event()
        self.threads: list[threading.Thread] = []

    def start(self, target, names: list[str]) -> None:
        """One daemon thread `target(w)` a queue, named by `names[w]`."""
        self.threads = [threading.Thread(target=target, args=(w,), name=name, daemon=True)
                        for w, name in enumerate(names)]
        for thread in self.threads:
            thread.start()

    def put(self, w: int, entry) -> bool:
        """Queue `entry` in queue `w` unless reading was stopped first (then False)."""
        while not self.stopped.is_set():
            try:
                self.queues[w].put(entry, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def close(self) -> None:
        """Stop every reader and wait for it (each finishes the item it is making); items
        queued and not taken are dropped. Safe to call more than once."""
        self.stopped.set()
        for thread in self.threads:
            while thread.is_alive():
                self._drain()
                thread.join(timeout=_POLL_S)
        self._drain()

    def _drain(self) -> None:
        for q in self.queues:
            try:
                while True:
                    q.get_nowait()
            except queue.Empty:
                pass


class BackgroundIterator(Iterator[T]):
    """The items of `items`, produced by a background thread.

    Args:
        items: any iterable; it is iterated in the background thread only.
        ahead: items produced before the consumer takes them, at most (the queue's size).
        name: the thread's name (seen in debuggers and `threading.enumerate()`).

    Example:
        >>> with BackgroundIterator(range(5), ahead=2) as it:
        ...     list(it)
        [0, 1, 2, 3, 4]
    """

    def __init__(self, items: Iterable[T], ahead: int = 2, name: str = "embcache-reader"):
        if ahead < 1:
            raise ValueError(f"ahead must be >= 1, got {ahead}")
        self._finished = False
        self._readers = ReaderThreads(1, maxsize=ahead)
        self._readers.start(lambda w: self._produce(items), [name])

    def _produce(self, items: Iterable[T]) -> None:
        try:
            for item in items:
                if not self._readers.put(0, (_ITEM, item)):
                    return
            self._readers.put(0, (_END, None))
        except BaseException as err:  # handed to the consumer, raised there
            self._readers.put(0, (_ERROR, err))

    def __iter__(self) -> "BackgroundIterator[T]":
        return self

    def __next__(self) -> T:
        if self._finished:
            raise StopIteration
        kind, value = self._readers.queues[0].get()
        if kind == _ITEM:
            return value
        self.close()
        if kind == _ERROR:
            raise value
        raise StopIteration

    def close(self) -> None:
        """Stop the thread and wait for it (it finishes the item it is making); the items
        queued and not taken are dropped. Safe to call more than once."""
        self._finished = True
        self._readers.close()

    def __enter__(self) -> "BackgroundIterator[T]":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
