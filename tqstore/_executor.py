"""The API layer's thread pool for the ``async_*`` calls.

Engine work (unit I/O, CRC checks, LMDB transactions) runs here, never on the event loop.
A dedicated pool rather than the store's per-unit pool: a store call fans its per-unit
work out to that pool and waits for it, so running the call itself there could exhaust
it and deadlock.  Threads are created on first use; ``TQSTORE_ASYNC_WORKERS`` sets their
number (default 4).
"""
from __future__ import annotations

import asyncio
import atexit
import contextvars
import functools
import os
import threading
from concurrent.futures import ThreadPoolExecutor
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


async def run(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Await ``fn(*args, **kwargs)`` run on the pool (context variables carried over)."""
    loop = asyncio.get_running_loop()
    ctx = contextvars.copy_context()
    return await loop.run_in_executor(pool(), functools.partial(ctx.run, fn, *args, **kwargs))


__all__ = ["pool", "run", "shutdown"]
