"""Loads by key running in this process, and the calls that wait for them.

From its begin to its end, a load by key (:mod:`tqstore.dump.restore`) has a restore
record in the controller, and the calls that record blocks (clears of its partition, puts
of its keys, dumps of it, full checkpoint saves and loads) raise
:class:`~tqstore.errors.RestorePendingError` naming it.  For a load another thread of this
process is running (or a ``recover_data_load`` is settling), that error would only say
"too early": so a call made through :func:`waits_for_running_loads` that meets it waits
for that load to end and runs again (the guards raise before anything is written, so the
second run is the same call; a call spanning partitions checks them all first).  The wait
has no time limit: it lasts as long as the load (its start and end are logged at
INFO).  A call that meets a restore whose load ended just before it looked runs again too.  A restore no load of this store runs (left by
a crash, or by an error its load could not undo) raises at once, as before, and so does a
call made by the load's own thread or while the store's write or metadata lock is held
(waiting there would block the load).
"""
from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from typing import Any, Callable, Dict, Iterator, Optional, TypeVar

from .errors import RestorePendingError

F = TypeVar("F", bound=Callable[..., Any])

log = logging.getLogger("tqstore")


class RunningLoads:
    """The restore ids of one store's loads running in this process (and their threads)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._threads: Dict[str, threading.Thread] = {}
        self._beginning = 0  # loads between the start of their begin and their registration

    @contextlib.contextmanager
    def beginning(self) -> Iterator[None]:
        """Around a load's begin and its :meth:`running` registration: a caller that meets the
        new restore's record before it is registered waits for the registration."""
        with self._cond:
            self._beginning += 1
        try:
            yield
        finally:
            with self._cond:
                self._beginning -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def running(self, rid: str) -> Iterator[None]:
        """Mark the restore ``rid`` as run by this thread for the ``with`` body; callers
        waiting for it are woken when it ends, however it ends."""
        with self._cond:
            self._threads[rid] = threading.current_thread()
        try:
            yield
        finally:
            with self._cond:
                self._threads.pop(rid, None)
                self._cond.notify_all()

    def wait(self, rid: Optional[str], gone: Callable[[str], bool]) -> bool:
        """Wait until the load of restore ``rid`` ends when another thread of this process
        runs it; True then (the caller runs its call again).  When none runs it: True if the
        restore is ``gone`` (its load ended just before this call looked), else False (a
        restore left by a crash or an error: the caller raises)."""
        if rid is None:
            return False
        me = threading.current_thread()
        with self._cond:
            self._cond.wait_for(lambda: not self._beginning)
            runner = self._threads.get(rid)
            if runner is me:
                return False
            if runner is not None:  # (logged: a call that seems stuck says what it waits for)
                log.info("thread %r waits for the load by key of restore %s (run by thread %r) to end",
                         me.name, rid, runner.name)
                t0 = time.monotonic()
                self._cond.wait_for(lambda: rid not in self._threads)
                log.info("thread %r waited %.3f s for restore %s; its call runs again", me.name,
                         time.monotonic() - t0, rid)
                return True
        return gone(rid)

    def wait_others(self) -> None:
        """Wait until no other thread of this process runs (or begins) a load by key or a
        recovery of this store (``Store.close``: their units and pool must stay open)."""
        me = threading.current_thread()

        def idle() -> bool:
            return not self._beginning and all(t is me for t in self._threads.values())

        with self._cond:
            if not idle():
                log.info("close of the store waits for the load by key of thread(s) %s to end",
                         sorted({t.name for t in self._threads.values() if t is not me}))
                self._cond.wait_for(idle)


def of(store: Any) -> RunningLoads:
    """The :class:`RunningLoads` of ``store`` (made on first use)."""
    loads = store.__dict__.get("_tq_running_loads")
    if loads is None:
        loads = store.__dict__.setdefault("_tq_running_loads", RunningLoads())
    return loads


def _holds_store_locks(store: Any) -> bool:
    for name in ("_write_lock", "_meta_lock"):
        is_owned = getattr(getattr(store, name, None), "_is_owned", None)
        if is_owned is not None and is_owned():
            return True
    return False


def _gone(store: Any) -> Callable[[str], bool]:
    def gone(rid: str) -> bool:
        controller = getattr(store, "controller", None)  # (a store served elsewhere has none here)
        try:
            return controller is not None and controller.restore(rid) is None
        except Exception:  # noqa: BLE001 - cannot tell: the caller raises the error it met
            return False
    return gone


def waits_for_running_loads(fn: F, *, store_of: Callable[[Any], Any] = lambda owner: owner) -> F:
    """Wrap the method ``fn`` (of a store, or of an object whose store ``store_of`` gives) so
    that a RestorePendingError for a load this process runs in another thread waits for that
    load and calls ``fn`` again (module docstring)."""

    @functools.wraps(fn)
    def call(owner, *args, **kwargs):
        while True:
            try:
                return fn(owner, *args, **kwargs)
            except RestorePendingError as e:
                store = store_of(owner)
                if _holds_store_locks(store) or not of(store).wait(getattr(e, "rid", None), _gone(store)):
                    raise

    return call  # type: ignore[return-value]


__all__ = ["RunningLoads", "of", "waits_for_running_loads"]
