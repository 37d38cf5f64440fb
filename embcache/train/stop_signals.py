"""Ctrl-C and SIGTERM while a run trains: the first stops the run after the step it is in, the
second at once (see `run`'s docstring)."""
from __future__ import annotations

import os
import signal
import threading
import time


class StopSignals:
    """While a run trains (a `with` block in the main thread): the first SIGINT or SIGTERM
    is noted (`received`) for the loop to stop at the next step's end, and a short line on
    stderr says so; the second calls `at_once`, which raises to stop the run where it is
    (the handlers are the previous ones again from then on). Under torchrun only SIGINT is
    taken (the launcher's SIGTERM means a peer failed: `embcache.distributed.world`), and a
    second SIGINT within `SAME_SIGNAL_S` of the first is the launcher passing the user's
    Ctrl-C on, not a second one. Elsewhere than the main thread nothing is installed."""

    SAME_SIGNAL_S = 3.0

    def __init__(self, at_once, distributed: bool = False, announce: bool = True, what: str = "step"):
        self.received: int | None = None  # the first signal's number
        self._at = 0.0
        self._at_once, self._distributed, self._announce, self._what = at_once, distributed, announce, what
        self._previous: dict[int, object] = {}

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT,) if self._distributed else (signal.SIGINT, signal.SIGTERM):
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        self._restore()

    def _restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        self._previous = {}

    def _handle(self, signum, frame) -> None:
        now = time.monotonic()
        if self.received is None:
            self.received, self._at = signum, now
            if self._announce:  # os.write: the interrupted code may be inside a print to stderr
                again = "Ctrl-C" if signum == signal.SIGINT else "the signal"
                os.write(2, f"\n{signal.Signals(signum).name}: stopping after this {self._what}; {again} again stops "
                            f"at once\n".encode())
            return
        if self._distributed and now - self._at < self.SAME_SIGNAL_S:
            return
        self._restore()
        self._at_once()
