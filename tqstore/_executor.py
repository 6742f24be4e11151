"""The API layer's thread pools for the ``async_*`` calls.

Engine work (unit I/O, CRC checks, LMDB transactions) runs here, never on the event loop.
Dedicated pools rather than the store's per-unit pool: a store call fans its per-unit
work out to that pool and waits for it, so running the call itself there could exhaust
it and deadlock.  Two lanes: ``"write"`` for the calls that take the store's write lock
(puts, clears, checkpoints; any call not known to be a read) and ``"read"`` for reads and
a fetch's asks (:func:`lane_of`): puts waiting their turn for the write lock hold only
write-lane threads, so a read or a fetch never queues behind them (with one pool, 8
producers' puts held all 4 threads and a fetch's ``timeout_s=0.2`` took 1 to 1.7 s).
Threads are created on first use; ``TQSTORE_ASYNC_WORKERS`` sets the number of each lane
(default 4).  The pools are the process's, not a store's: their idle threads outlive
``tq.close()`` (a later store uses them) and end at exit; a child forked meanwhile starts
pools of its own.
"""
from __future__ import annotations

import asyncio
import atexit
import contextvars
import functools
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Dict

from .errors import ConfigError

_lock = threading.Lock()
_pools: Dict[str, ThreadPoolExecutor] = {}
LANES = ("read", "write")

#: data-plane calls that never take the store's write lock: reads and status queries (a
#: fetch's asks are submitted to the read lane by :mod:`tqstore.fetch_wait`; ``get_meta``'s
#: other modes may create rows)
READ_CALLS = frozenset({
    "get_data", "get_consumption_status", "get_production_status", "check_consumption_status",
    "check_production_status", "get_partition_list", "kv_batch_get", "kv_batch_get_by_meta", "kv_list",
    "kv_retrieve_keys"})


def lane_of(name: str) -> str:
    """The lane of the data-plane call ``name``: ``"read"`` for :data:`READ_CALLS`, else ``"write"``."""
    return "read" if name in READ_CALLS else "write"


def _workers() -> int:
    """``TQSTORE_ASYNC_WORKERS`` (default 4).  Raises ConfigError for anything but an integer >= 1."""
    raw = os.environ.get("TQSTORE_ASYNC_WORKERS", "4")
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1:
        raise ConfigError(f"TQSTORE_ASYNC_WORKERS must be an integer >= 1 (threads per lane of the async calls), "
                          f"got {raw!r}")
    return n


def pool(lane: str = "write") -> ThreadPoolExecutor:
    """The shared pool of ``lane`` (created on first use)."""
    if lane not in LANES:
        raise ValueError(f"unknown lane {lane!r}")
    with _lock:
        p = _pools.get(lane)
        if p is None:
            workers = _workers()
            prefix = "tqstore-async" if lane == "write" else "tqstore-async-read"
            p = _pools[lane] = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=prefix)
        return p


def shutdown() -> None:
    """Stop the pools after running calls finish (a later async call starts new ones)."""
    with _lock:
        ps = list(_pools.values())
        _pools.clear()
    for p in ps:
        p.shutdown(wait=True)


atexit.register(shutdown)


def _after_fork_in_child() -> None:
    """A forked child has none of the pool's threads, though the pool object says it has:
    the child's first async call starts a pool of its own (it hung forever)."""
    global _lock, _pools
    _lock, _pools = threading.Lock(), {}


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def submit_on(lane: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> "Future[Any]":
    """``fn(*args, **kwargs)`` queued on the pool of ``lane`` (context variables carried
    over): its ``concurrent.futures.Future``, which ``cancel()`` stops only before it starts."""
    ctx = contextvars.copy_context()
    return pool(lane).submit(functools.partial(ctx.run, fn, *args, **kwargs))


async def run_on(lane: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Await ``fn(*args, **kwargs)`` run on the pool of ``lane`` (context variables carried over)."""
    return await asyncio.wrap_future(submit_on(lane, fn, *args, **kwargs))


async def run(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """:func:`run_on` the write lane (a call not known to be a read)."""
    return await run_on("write", fn, *args, **kwargs)


__all__ = ["pool", "run", "run_on", "submit_on", "lane_of", "LANES", "READ_CALLS", "shutdown"]
