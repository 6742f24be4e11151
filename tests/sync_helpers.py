"""Hooks that let a test observe that a thread is waiting, instead of sleeping and timing it.

Every wait here is bounded and every test asserts the result of ``Event.wait(timeout)``,
so a broken behaviour fails with a message (or a timeout) rather than hanging.
"""
from __future__ import annotations

import threading
from typing import List, Tuple

NOTIFY_ONLY_WAIT_S = 20.0


def watch_fetch_waits(store, monkeypatch, *, notify_only: bool = False) -> Tuple[threading.Event, List[bool]]:
    """Wrap the condition a fetch (``get_meta(..., timeout_s=...)``) waits on for producers.

    Returns ``(waiting, results)``: ``waiting`` is set each time a fetch starts to wait
    (while it still holds the metadata lock, so anything a producer commits afterwards
    happens during the wait); ``results`` gets each wait's result, True when a notify
    ended it, False when its timeout did.  With ``notify_only`` a wait ignores the
    fetch's poll interval and lasts up to ``NOTIFY_ONLY_WAIT_S``, so a waiting fetch only
    sees new rows early if a producer wakes it.
    """
    cond = store._data.cond
    orig = cond.wait
    waiting = threading.Event()
    results: List[bool] = []

    def wait(timeout=None):
        waiting.set()
        r = orig(NOTIFY_ONLY_WAIT_S if notify_only else timeout)
        results.append(r)
        return r

    monkeypatch.setattr(cond, "wait", wait)
    return waiting, results


def watch_handle_waits(handle) -> threading.Event:
    """An Event set when any thread calls ``handle.wait()`` (a SaveHandle), e.g. a second
    save or ``close`` waiting for the save in flight."""
    orig = handle.wait
    called = threading.Event()

    def wait(timeout=None):
        called.set()
        return orig(timeout)

    handle.wait = wait
    return called
