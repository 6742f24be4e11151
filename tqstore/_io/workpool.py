"""Thread pools whose work still runs while Python exits, and whose refusal after their owner
shut them down is the owner's error.

When the main thread ends, Python tells every ``ThreadPoolExecutor`` to refuse new work
("cannot schedule new futures after interpreter shutdown") *before* it waits for the threads
still running: a trainer's producer thread, a lane of the async calls.  A put or a read such
a thread was making failed half-way with a bare ``RuntimeError`` (a put's rows written to
some units, then undone: an acknowledged-looking call lost).  :class:`WorkPool` runs such
work on the calling thread instead, one task after the other: slower, but the call ends as
it would have.  Work handed to a pool its owner shut down raises the owner's error
(``closed_error``: a store's ``StoreClosedError``), not ``RuntimeError``.
"""
from __future__ import annotations

import concurrent.futures.thread as _cft
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Optional


def interpreter_exiting() -> bool:
    """True once Python's exit has told the thread pools to refuse new work."""
    return bool(getattr(_cft, "_shutdown", False))


def run_here(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> "Future[Any]":
    """``fn(*args, **kwargs)`` run now on the calling thread: a done future of its result or error."""
    fut: "Future[Any]" = Future()
    try:
        fut.set_result(fn(*args, **kwargs))
    except BaseException as e:  # noqa: BLE001 - handed over in the future, as a pool does
        fut.set_exception(e)
    return fut


class WorkPool(ThreadPoolExecutor):
    """A ``ThreadPoolExecutor`` whose ``submit`` (and so ``map``) runs the work on the calling
    thread when Python's exit refuses it, and raises ``closed_error()`` (when given) for work
    submitted after :meth:`shutdown`."""

    def __init__(self, max_workers: Optional[int] = None, thread_name_prefix: str = "",
                 closed_error: Optional[Callable[[], BaseException]] = None) -> None:
        super().__init__(max_workers=max_workers, thread_name_prefix=thread_name_prefix)
        self._closed_error = closed_error
        self._owner_shut = False  # (not the executor's own flag: its workers set that too at Python's exit)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._owner_shut = True
        super().shutdown(wait=wait, cancel_futures=cancel_futures)

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> "Future[Any]":
        try:
            return super().submit(fn, *args, **kwargs)
        except RuntimeError:
            if self._owner_shut:
                if self._closed_error is not None:
                    raise self._closed_error() from None
                raise
            if not interpreter_exiting():
                raise
        return run_here(fn, *args, **kwargs)


__all__ = ["WorkPool", "interpreter_exiting", "run_here"]
