"""The API layer's thread pool for the ``async_*`` calls.

Engine work (unit I/O, CRC checks, LMDB transactions) runs here, never on the event loop.
A dedicated pool rather than the store's per-unit pool: a store call fans its per-unit
work out to that pool and waits for it, so running the call itself there could exhaust
it and deadlock.  Threads are created on first use; ``TQSTORE_ASYNC_WORKERS`` sets their
number (default 4).  The pool is the process's, not a store's: its idle threads outlive
``tq.close()`` (a later store uses them) and end at exit; a child forked meanwhile starts
a pool of its own.
"""
from __future__ import annotations

import asyncio
import atexit
import contextvars
import functools
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Optional

_lock = threading.Lock()
_pool: Optional[ThreadPoolExecutor] = None


def pool() -> ThreadPoolExecutor:
    """The shared pool (created on first use)."""
    global _pool
    with _lock:
        if _pool is None:
            workers = max(1, int(os.environ.get("TQSTORE_ASYNC_WORKERS", "4")))
            _pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tqstore-async")
        return _pool


def shutdown() -> None:
    """Stop the pool after running calls finish (a later async call starts a new one)."""
    global _pool
    with _lock:
        p, _pool = _pool, None
    if p is not None:
        p.shutdown(wait=True)


atexit.register(shutdown)


def _after_fork_in_child() -> None:
    """A forked child has none of the pool's threads, though the pool object says it has:
    the child's first async call starts a pool of its own (it hung forever)."""
    global _lock, _pool
    _lock, _pool = threading.Lock(), None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def submit(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> "Future[Any]":
    """``fn(*args, **kwargs)`` queued on the pool (context variables carried over): its
    ``concurrent.futures.Future``, which ``cancel()`` stops only before it starts."""
    ctx = contextvars.copy_context()
    return pool().submit(functools.partial(ctx.run, fn, *args, **kwargs))


async def run(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Await ``fn(*args, **kwargs)`` run on the pool (context variables carried over)."""
    return await asyncio.wrap_future(submit(fn, *args, **kwargs))


__all__ = ["pool", "run", "submit", "shutdown"]
