"""Ctrl-C (and the other signals a Python handler turns into an exception) held back across
the moments in which a store's files and its in-memory state must change together.

A put, a clear or a fetch commits an LMDB transaction and then updates what the store holds
in memory (the controller's mirror of its index: the next global index, the keys; a unit's
location cache).  A ``KeyboardInterrupt`` raised between the two leaves them disagreeing:
the next put in the same process was given row indexes the index had already handed out,
and its keys damaged the controller index (a store that then would not open).  Inside a
:func:`deferred` block, or while a :class:`DeferringRLock` is held, by the main thread,
the :data:`SIGNALS` that have a Python handler (SIGINT's is Python's default one, which
raises ``KeyboardInterrupt``; a trainer's SIGTERM handler for preemption may raise
``SystemExit``) are recorded instead of handled; when the outermost one ends, the handlers
that were installed run, so the interrupt arrives right after the step, whose state is
whole: committed or rolled back.  The steps are
short (one put, clear or controller call), so a Ctrl-C is late by that much at most.

Nothing changes in other threads (Python runs signal handlers in the main thread only, so
``KeyboardInterrupt`` never arises in them), nor for a SIGINT disposition that is no Python
callable (ignored; or the default action, which ends the process: the store's crash
recovery covers that), nor where handlers cannot be set.  A signal that arrives several
times meanwhile is handled once.
"""
from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

#: the signals held back when a Python handler is installed for them: Ctrl-C, a job
#: scheduler's preemption (a trainer's SIGTERM handler often raises SystemExit) and a
#: watchdog's timer (a SIGALRM handler raising TimeoutError)
SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGALRM") if hasattr(signal, n))

# (main thread only) holds entered and not left; the handlers they replaced; the signals held, in order
_depth = 0
_prev: Dict[int, Any] = {}
_held: List[Tuple[int, Any]] = []


def _hold() -> bool:
    """Begin holding the signals back (nested: counted); False where nothing is held (see above)."""
    global _depth
    if threading.current_thread() is not threading.main_thread():
        return False
    if _depth:
        _depth += 1
        return True
    try:
        for sig in SIGNALS:
            prev = signal.getsignal(sig)
            if callable(prev) and prev is not _record:  # (ignored or the default action: left as it is)
                signal.signal(sig, _record)
                _prev[sig] = prev
    except ValueError:  # (not the main interpreter: no handlers to set)
        for sig, h in _prev.items():
            signal.signal(sig, h)
        _prev.clear()
        return False
    if not _prev:
        return False
    _depth = 1
    return True


def _record(signum: int, frame: Any) -> None:
    _held.append((signum, frame))


def _unhold() -> Optional[Callable[[], None]]:
    """End one :func:`_hold`; at the outermost, put the handlers back and return a call of
    those whose signals arrived meanwhile (once each, in order; the caller makes it once its
    own cleanup is done), else None."""
    global _depth
    _depth -= 1
    if _depth:
        return None
    prev = dict(_prev)
    _prev.clear()
    for sig, h in prev.items():
        signal.signal(sig, h)
    if not _held:
        return None
    first: Dict[int, Any] = {}
    for sig, frame in _held:
        first.setdefault(sig, frame)
    _held.clear()

    def fire() -> None:
        for sig, frame in first.items():
            prev[sig](sig, frame)
    return fire


@contextmanager
def deferred() -> Iterator[None]:
    """Hold the signals back for the ``with`` body (see the module docstring)."""
    if not _hold():
        yield
        return
    try:
        yield
    finally:
        fire = _unhold()
        if fire is not None:
            fire()


class DeferringRLock:
    """A re-entrant lock (the controller's) whose holder, in the main thread, may ask for the
    signals to be held back until it releases it (:meth:`hold_until_released`, called before a
    commit whose in-memory update follows): the calls that only read pay nothing."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._main_depth = 0  # (the main thread's acquisitions; only it changes these two)
        self._holding = False

    def __enter__(self) -> "DeferringRLock":
        self._lock.acquire()
        if threading.current_thread() is threading.main_thread():
            self._main_depth += 1
        return self

    def hold_until_released(self) -> None:
        """Hold the signals back until the outermost release of this lock (a no-op in another
        thread, or when this thread does not hold the lock)."""
        if not self._holding and self._main_depth and threading.current_thread() is threading.main_thread():
            self._holding = _hold()

    def __exit__(self, *exc: Any) -> None:
        fire = None
        if self._main_depth and threading.current_thread() is threading.main_thread():
            self._main_depth -= 1
            if not self._main_depth and self._holding:
                self._holding = False
                fire = _unhold()
        self._lock.release()
        if fire is not None:
            fire()


__all__ = ["SIGNALS", "deferred", "DeferringRLock"]
