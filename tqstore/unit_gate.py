"""The reads running on one unit (:class:`ReadGate`), so that its close waits for them.

A unit's close (the store's close, or a checkpoint load switching the store to new units)
closes its LMDB environment and unmaps its segments; doing that under a read of another
thread crashed the process (a segmentation fault in LMDB) or raised LMDB's error about a
closed environment.  Reads enter the gate (:func:`tqstore.unit_read._open_unit_read`); the
close refuses new reads, then waits for the running ones.
"""
from __future__ import annotations

import threading

from .errors import StoreClosedError


class ReadGate:
    """The reads running on one unit, so that its close waits for them: closing its LMDB
    environment or unmapping a segment under a read of another thread would crash the
    process.  A read that starts once the close began raises StoreClosedError."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.closed = False
        self._running = 0
        self._mutex = threading.Lock()
        self._idle = threading.Event()  # (set once closed and no read runs)

    def enter(self) -> None:
        with self._mutex:
            if self.closed:
                raise StoreClosedError(f"{self.what} is closed")
            self._running += 1

    def leave(self) -> None:
        with self._mutex:
            self._running -= 1
            if self.closed and not self._running:
                self._idle.set()

    def close(self) -> None:
        """Refuse new reads, then wait for the running ones to end (idempotent)."""
        with self._mutex:
            self.closed = True
            if not self._running:
                self._idle.set()
        self._idle.wait()


__all__ = ["ReadGate"]
