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
        self._queue: queue.Queue = queue.Queue(maxsize=ahead)
        self._stop = threading.Event()
        self._finished = False
        self._thread = threading.Thread(target=self._produce, args=(items,), name=name, daemon=True)
        self._thread.start()

    def _produce(self, items: Iterable[T]) -> None:
        try:
            for item in items:
                if not self._put((_ITEM, item)):
                    return
            self._put((_END, None))
        except BaseException as err:  # handed to the consumer, raised there
            self._put((_ERROR, err))

    def _put(self, entry) -> bool:
        """Queue `entry` unless the consumer stopped first (then False)."""
        while not self._stop.is_set():
            try:
                self._queue.put(entry, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self) -> "BackgroundIterator[T]":
        return self

    def __next__(self) -> T:
        if self._finished:
            raise StopIteration
        kind, value = self._queue.get()
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
        self._stop.set()
        while self._thread.is_alive():
            self._drain()
            self._thread.join(timeout=_POLL_S)
        self._drain()

    def _drain(self) -> None:
        try:
            while True:
                self._queue.get_nowait()
        except queue.Empty:
            pass

    def __enter__(self) -> "BackgroundIterator[T]":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
