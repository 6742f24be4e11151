"""Ctrl-C held back across the moments in which a store's files and its in-memory state
must change together.

A put, a clear or a fetch commits LMDB transactions and then updates what the store holds
in memory (the controller's mirror of its index: the next global index, the keys, what a
task consumed; the units' location caches), and a put over several units settles their undo
records after the controller's commit.  A ``KeyboardInterrupt`` raised between those steps
left them disagreeing: the next put in the same process was given row indexes the index
had already handed out, and its keys damaged the controller index (a store that then would
not open); an overwriting put's new values stayed readable after it raised.  Inside a
:func:`deferred` block of the main thread, SIGINT is recorded instead of handled; when the
outermost block ends, the handler that was installed runs (Python's default one raises
``KeyboardInterrupt`` there), so the interrupt arrives right after the call, whose state is
whole: committed or rolled back.  The blocks are short (one put, clear or fetch), so a
Ctrl-C is late by that much at most; long calls (saves, dumps, loads) are not deferred.

Nothing changes in other threads (Python runs signal handlers in the main thread only, so
``KeyboardInterrupt`` never arises in them), nor where handlers cannot be set.  A SIGINT
disposition that is no Python callable (ignored, or the default action) is put back at
once, and a SIGINT that arrived meanwhile is sent again then.  The swap is made safe
against an interruption halfway (the handler replaced is saved before it is replaced, and
a later block or a forked child puts it back), and a child forked meanwhile starts with the
handler the block replaced.  Other signals are not deferred: a SIGTERM handler that raises
during a put is what a process kill is to the store (its open repairs it).
"""
from __future__ import annotations

import os
import signal
import threading

try:  # (the C module: signal.signal and signal.getsignal convert handlers to enums, some µs a call)
    import _signal as _sig
except ImportError:  # pragma: no cover - not CPython
    _sig = signal  # type: ignore[assignment]
from contextlib import contextmanager
from typing import Any, Iterator, List

# (main thread only) blocks entered and not left; the SIGINT handler the outermost replaced
# (saved before it is replaced; None when none is); the frames of the SIGINTs held
_depth = 0
_saved: Any = None
_held: List[Any] = []


def _record(signum: int, frame: Any) -> None:
    _held.append(frame)


def _put_back() -> None:
    """Put the saved handler back if it is replaced (by a block that ended, or one interrupted
    between saving and its bookkeeping), and forget it."""
    global _saved
    h = _saved
    if h is not None:
        if _sig.getsignal(signal.SIGINT) is _record:
            _sig.signal(signal.SIGINT, h)
        _saved = None


def _hold() -> bool:
    global _depth, _saved
    if threading.current_thread() is not threading.main_thread():
        return False
    if _depth:
        _depth += 1
        return True
    if _saved is not None:  # (a block interrupted halfway left it replaced)
        _put_back()
    _held.clear()
    try:
        _saved = _sig.getsignal(signal.SIGINT)
        _sig.signal(signal.SIGINT, _record)
    except ValueError:  # (not the main interpreter: no handlers to set)
        _saved = None
        return False
    _depth = 1
    return True


def _unhold() -> None:
    """End one :func:`_hold`; at the outermost, put the handler back, then run it (or send
    the signal again, for a disposition that is no Python callable) if a SIGINT was held."""
    global _depth
    _depth -= 1
    if _depth:
        return
    held = _held[:1]
    _held.clear()
    h = _saved
    _put_back()
    if held:
        if callable(h):
            h(signal.SIGINT, held[0])
        elif h != signal.SIG_IGN:
            signal.raise_signal(signal.SIGINT)


@contextmanager
def deferred() -> Iterator[None]:
    """Hold SIGINT back for the ``with`` body (see the module docstring)."""
    if not _hold():
        yield
        return
    try:
        yield
    finally:
        _unhold()


def _after_fork_in_child() -> None:
    """A child forked inside a block (by another thread, or by this one) starts with the
    handler the block replaced, and holds nothing."""
    global _depth
    _depth = 0
    _held.clear()
    try:
        _put_back()
    except ValueError:
        pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


__all__ = ["deferred"]
