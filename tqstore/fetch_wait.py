"""How a client's ``get_meta(mode="fetch")`` waits for producers, in both forms.

:func:`plan` reads a call's arguments and the store's compatibility settings
(:class:`~tqstore.config.CompatSettings`): how long the fetch may wait (the call's
``timeout_s``; with ``polling_mode=False`` and no ``timeout_s``, the configured
``get_meta_timeout_s``, after which an empty answer raises
:class:`~tqstore.errors.WaitTimeoutError`: a ``TimeoutError`` and, as TransferQueue's client
raises it, a ``RuntimeError``).

The synchronous form waits inside the store.  :func:`fetch_async`, the form behind
``async_get_meta``, waits on the event loop instead, for two reasons:

* A wait run on the API thread pool (:mod:`tqstore._executor`, a few threads) would hold
  a thread for as long as it waits: a few waiting consumers would hold back every other
  async call, the producers' ``async_put`` among them.
* A cancelled call's thread would go on waiting, then take rows that nobody receives
  (marked consumed, so never handed out again).

So it asks the store for rows without waiting (a short call on the pool) and, between
asks, awaits the store's put notification (``Store.watch_puts``; at most 50 ms), or, for
a store without one such as a Ray store's client, sleeps 10 ms growing to 100 ms.

Cancellation: while the call waits between asks (nearly all of its time) a cancellation
raises ``CancelledError`` at once, and no row was taken; so does one that arrives while its
ask is still queued behind busy pool threads (the ask is withdrawn and never runs).  The
store cannot give rows back, so a cancellation that arrives while an ask is running
(milliseconds) lets that ask finish.  If it took no rows, ``CancelledError`` is raised.  If
it took rows, the call returns them: ``asyncio.wait_for`` and ``asyncio.timeout`` return
them as the result (an ``asyncio.timeout`` block then ends in ``TimeoutError`` at its next
``await``), and a task cancelled directly is cancelled again at its next ``await`` (unless
a timeout claimed the cancellation), so the cancellation is not lost either.  That holds
for the task the fetch runs in.  When it runs as a task of its own and the task awaiting it
is cancelled in those milliseconds, asyncio decides: awaited directly (``await
asyncio.create_task(...)``), the rows come back and the awaiting task's cancellation is
lost (as with any task that finishes instead of being cancelled); under ``asyncio.gather``,
and as the inner task of ``asyncio.wait_for`` before Python 3.12, the rows are dropped and
stay consumed (``reset_consumption`` hands them out again).

Between asks the wait is woken by puts into the fetch's partition only (and by changes of
the whole store), so consumers waiting on other partitions cost a producer nothing.
"""
from __future__ import annotations

import asyncio
from typing import Any, Dict, NamedTuple, Optional, Tuple

import numpy as np

from . import _executor, config as _config
from .errors import WaitTimeoutError
from .meta import BatchMeta
from .call_checks import check_timeout

#: longest wait between two asks of a store that notifies puts (changes that do not notify,
#: such as a load by key, are seen this late at worst; the synchronous wait asks as often)
WATCHED_POLL_S = 0.05
#: waits between asks of a store that does not notify: the first, growing by half each time to the last
POLL_S = 0.01
POLL_MAX_S = 0.1


def _get_meta_args(data_fields: Any = None, batch_size: Any = None, partition_id: Any = None, mode: str = "fetch",
                   task_name: Any = None, sampling_config: Any = None, *, timeout_s: Any = None) -> Dict[str, Any]:
    """The arguments of ``DataPlane.get_meta`` by name (a plain call binds them: no
    ``inspect.Signature.bind`` per call; a bad call still raises the store's TypeError)."""
    return {"data_fields": data_fields, "batch_size": batch_size, "partition_id": partition_id, "mode": mode,
            "task_name": task_name}


class FetchWait(NamedTuple):
    """A fetch's call without its ``timeout_s``, how long it may wait, and the
    ``WaitTimeoutError`` message an empty answer raises (None: an empty answer is returned)."""

    args: Tuple[Any, ...]
    kwargs: Dict[str, Any]
    wait_s: float
    timeout_error: Optional[str]
    partition_id: Any = None  # (the puts that wake the wait between asks)

    def result(self, meta: BatchMeta) -> BatchMeta:
        """``meta``, or WaitTimeoutError (a TimeoutError and a RuntimeError) when it is empty
        and the call was to raise then."""
        if meta.size == 0 and self.timeout_error is not None:
            raise WaitTimeoutError(self.timeout_error)
        return meta


def _asks_nothing(batch_size: Any) -> bool:
    """``batch_size=0``: the empty answer is the answer (no wait, no timeout error)."""
    return type(batch_size) is not bool and isinstance(batch_size, (int, np.integer)) and batch_size == 0


def plan(store: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Optional[FetchWait]:
    """How ``get_meta(*args, **kwargs)`` on ``store`` waits; None for a call that is not a
    fetch (or does not bind: the store raises its TypeError).

    Raises InvalidInputError for a ``timeout_s`` that is not a number of seconds."""
    try:
        bound = _get_meta_args(*args, **kwargs)
    except TypeError:
        return None
    if bound["mode"] != "fetch":
        return None
    rest = {k: v for k, v in kwargs.items() if k != "timeout_s"}
    settings = _config.settings_for(store)
    if settings.polling_mode or "timeout_s" in kwargs or _asks_nothing(bound["batch_size"]):
        return FetchWait(args, rest, check_timeout(kwargs.get("timeout_s")), None, bound["partition_id"])
    # TransferQueue with polling_mode=False: wait for enough rows, then WaitTimeoutError
    wait_s = settings.get_meta_timeout_s
    return FetchWait(args, rest, wait_s,
                     f"Timeout while waiting for sufficient data for task {bound['task_name']!r}. "
                     f"Required: {bound['batch_size']} rows with fields {bound['data_fields']} in partition "
                     f"{bound['partition_id']!r} (waited {wait_s} s; polling_mode=False)", bound["partition_id"])


def fetch(store: Any, how: FetchWait) -> BatchMeta:
    """The synchronous fetch: the store waits (see :meth:`~tqstore.streaming.Streaming.get_meta`)."""
    return how.result(store.get_meta(*how.args, **how.kwargs, timeout_s=how.wait_s))


async def _ask(store: Any, how: FetchWait) -> BatchMeta:
    """One fetch that does not wait, run on the pool; a cancellation meanwhile withdraws it
    while it is queued, else lets it finish (see the module docstring)."""
    queued = _executor.submit_on("read", store.get_meta, *how.args, **how.kwargs, timeout_s=0.0)
    job = asyncio.wrap_future(queued)
    cancelled = False
    while not job.done():
        try:
            await asyncio.wait((job,))  # (a cancellation of this task does not reach the job)
        except asyncio.CancelledError:
            cancelled = True
            if queued.cancel():  # not started (the pool's threads were busy): it never runs
                raise
    if job.cancelled():  # (the pool shut down before it ran)
        raise asyncio.CancelledError()
    if job.exception() is not None:
        if cancelled:
            raise asyncio.CancelledError() from None
        raise job.exception()
    meta = job.result()
    if cancelled:
        if meta.size == 0:
            raise asyncio.CancelledError()
        _cancel_again(asyncio.current_task())
    return meta


def _cancel_again(task: Optional["asyncio.Task[Any]"]) -> None:
    """Deliver the cancellation this task's fetch held back (it returns the rows it took) at
    the task's next ``await``, unless a timeout claimed it meanwhile (Python 3.11+: the
    task's count of pending cancellations is 0 then).  The count is left as it was, so an
    ``asyncio.timeout`` block around that ``await`` still ends in TimeoutError, not in a
    CancelledError it cannot tell from one of its own."""
    if task is None:
        return
    pending = getattr(task, "cancelling", None)

    def again() -> None:
        if task.done() or (pending is not None and pending() == 0):
            return
        task.cancel()
        if pending is not None:
            task.uncancel()  # (the cancellation redelivered, not a new one)

    asyncio.get_running_loop().call_soon(again)


async def _woken_or_timeout(woken: asyncio.Event, timeout: float) -> None:
    """Wait until ``woken`` is set or ``timeout`` seconds pass.  (Not ``asyncio.wait_for``:
    before Python 3.12 it drops a cancellation that arrives as the event is set, and the
    cancelled fetch went on waiting and took rows.)"""
    waiter = asyncio.ensure_future(woken.wait())
    try:
        await asyncio.wait((waiter,), timeout=timeout)
    finally:
        waiter.cancel()


async def fetch_async(store: Any, how: FetchWait) -> BatchMeta:
    """The fetch of ``how`` awaited on the event loop (see the module docstring)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + how.wait_s
    woken = asyncio.Event()
    watch = getattr(store, "watch_puts", None)
    stop = watch(lambda: loop.call_soon_threadsafe(woken.set), partition_id=how.partition_id) \
        if watch is not None else None
    try:
        delay = WATCHED_POLL_S if stop is not None else POLL_S
        while True:
            woken.clear()  # before the ask: a put during it wakes the wait after it
            meta = await _ask(store, how)
            left = deadline - loop.time()
            if meta.size or left <= 0:
                return how.result(meta)
            await _woken_or_timeout(woken, min(left, delay))
            if stop is None:
                delay = min(POLL_MAX_S, delay * 1.5)
    finally:
        if stop is not None:
            stop()


__all__ = ["FetchWait", "plan", "fetch", "fetch_async", "WATCHED_POLL_S", "POLL_S", "POLL_MAX_S"]
