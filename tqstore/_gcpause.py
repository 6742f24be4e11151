"""Pause Python's cyclic garbage collector for the length of one bulk put or get.

A put or get of many rows allocates tens of thousands of small container objects
(index items, controller rows, lists of views).  Each burst of 700 allocations runs a
young-generation collection, every tenth of those an older one, and every tenth of
those may run a full collection that walks every live object of the process — with
torch imported that is hundreds of thousands of objects and ~0.1 s, more than a
400 MB put takes.  Nothing these calls build needs collecting while they run, so the
collector is paused for the call and resumed after it: one young collection then
covers the whole call, and cycles made meanwhile (by any thread) are collected then,
never lost.  Nested and concurrent calls are counted; the collector resumes when the
last one ends, and only if it was enabled when the first one began.
"""
from __future__ import annotations

import functools
import gc
import os
import threading
from contextlib import contextmanager
from typing import Iterator

_lock = threading.Lock()
_depth = 0
_resume = False


@contextmanager
def paused() -> Iterator[None]:
    """Context manager: the collector is off inside (see the module docstring)."""
    global _depth, _resume
    with _lock:
        if _depth == 0:
            _resume = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _resume:
                gc.enable()


def _after_fork_in_child() -> None:
    """A process forked while a call ran (in another thread) has none running: its collector
    runs again if the call paused it, and the counter starts again (its lock is new)."""
    global _lock, _depth, _resume
    _lock = threading.Lock()
    if _depth and _resume:
        gc.enable()
    _depth, _resume = 0, False


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def pausing(fn):
    """Decorator: run ``fn`` with the collector paused."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with paused():
            return fn(*args, **kwargs)
    return wrapper
