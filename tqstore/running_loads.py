"""Loads by key running in this process, and the calls that wait for them.

From its begin to its end, a load by key (:mod:`tqstore.dump.restore`) has a restore
record in the controller, and the calls that record blocks (clears of its partition, puts
of its keys, dumps of it, full checkpoint saves and loads) raise
:class:`~tqstore.errors.RestorePendingError` naming it.  For a load another thread of this
process is running (or a ``recover_data_load`` is settling), that error would only say
"too early": so a call made through :func:`waits_for_running_loads` that meets it waits
for that load to end and runs again (the guards raise before anything is written, so the
second run is the same call).  A
restore no load of this store runs (left by a crash, or by an error its load could not
undo) raises at once, as before, and so does a call made by the load's own thread or
while the store's write or metadata lock is held (waiting there would block the load).
"""
from __future__ import annotations

import contextlib
import functools
import threading
from typing import Any, Callable, Dict, Iterator, Optional, TypeVar

from .errors import RestorePendingError

F = TypeVar("F", bound=Callable[..., Any])


class RunningLoads:
    """The restore ids of one store's loads running in this process (and their threads)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._threads: Dict[str, threading.Thread] = {}

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

    def wait(self, rid: Optional[str]) -> bool:
        """Wait until the load of restore ``rid`` ends when another thread of this process
        runs it; True then (the caller runs its call again), False at once otherwise."""
        me = threading.current_thread()
        with self._cond:
            if rid is None or self._threads.get(rid, me) is me:
                return False
            self._cond.wait_for(lambda: rid not in self._threads)
        return True


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


def waits_for_running_loads(fn: F) -> F:
    """Wrap the store method ``fn`` so that a RestorePendingError for a load this process
    runs in another thread waits for that load and calls ``fn`` again (module docstring)."""

    @functools.wraps(fn)
    def call(store, *args, **kwargs):
        while True:
            try:
                return fn(store, *args, **kwargs)
            except RestorePendingError as e:
                if _holds_store_locks(store) or not of(store).wait(getattr(e, "rid", None)):
                    raise

    return call  # type: ignore[return-value]


__all__ = ["RunningLoads", "of", "waits_for_running_loads"]
