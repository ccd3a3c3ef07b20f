"""Device busy time: the wall time during which at least one model batch is in flight in this process,
counted once however many threads run batches at the same time (the summary's device busy fraction).

Holds only the clock. Must not run models or talk to Beam (pipeline/stages/inference.py reports it as a metric).
"""
from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator


class BusyClock:
    """Union of the intervals spent inside busy(): overlapping intervals of several threads count once."""

    def __init__(self, now: Callable[[], float] = time.perf_counter) -> None:
        self._now = now
        self._lock = threading.Lock()
        self._active = 0
        self._since = 0.0
        self._total = 0.0
        self._reported = 0.0
        self._mine = threading.local()  # how deep the calling thread is in busy()

    @contextlib.contextmanager
    def busy(self) -> Iterator[None]:
        self._enter()
        self._mine.depth = getattr(self._mine, "depth", 0) + 1
        try:
            yield
        finally:
            self._mine.depth -= 1
            self._leave()

    @contextlib.contextmanager
    def idle(self) -> Iterator[None]:
        """A stretch in which this thread keeps the device waiting (compiling a program): inside busy() it
        counts only while another thread has a batch in flight; outside busy() it changes nothing."""
        inside = getattr(self._mine, "depth", 0) > 0
        if inside:
            self._leave()
        try:
            yield
        finally:
            if inside:
                self._enter()

    def _enter(self) -> None:
        with self._lock:
            if self._active == 0:
                self._since = self._now()
            self._active += 1

    def _leave(self) -> None:
        with self._lock:
            self._active -= 1
            if self._active == 0:
                self._total += self._now() - self._since

    def take_new_seconds(self) -> float:
        """Busy seconds completed since the last call (each second is handed out once: summing what
        every caller took gives the total)."""
        with self._lock:
            new, self._reported = self._total - self._reported, self._total
            return new


PROCESS_CLOCK = BusyClock()  # one device per process: every model batch of the process counts here
