"""The module-level async KV calls (TransferQueue's ``async_kv_*``) over the default store.

Each awaits the synchronous call run on the API layer's thread pool
(:mod:`tqstore._executor`), so the event loop keeps serving other coroutines while a
large put or get runs.  The default store is looked up on the loop, so a call before
``tq.init()`` raises ``StoreClosedError`` at once.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable

from . import _default, _executor
from .client import call_store
from .kv import DataPlane

ASYNC_KV = ("kv_put", "kv_batch_put", "kv_batch_get", "kv_batch_get_by_meta", "kv_list", "kv_clear")


def _async_function(name: str) -> Callable:
    target = getattr(DataPlane, name)

    async def fn(*args: Any, **kwargs: Any) -> Any:
        store = _default.get_default()
        return await _executor.run_on(_executor.lane_of(name), call_store, store, name, *args, **kwargs)

    sig = inspect.signature(target)
    fn.__signature__ = sig.replace(parameters=list(sig.parameters.values())[1:])  # type: ignore[attr-defined]
    fn.__name__ = fn.__qualname__ = f"async_{name}"
    fn.__module__ = __name__
    fn.__doc__ = f"Awaitable form of :func:`tqstore.{name}` (runs on the API thread pool).\n\n{target.__doc__ or ''}"
    return fn


async_kv_put = _async_function("kv_put")
async_kv_batch_put = _async_function("kv_batch_put")
async_kv_batch_get = _async_function("kv_batch_get")
async_kv_batch_get_by_meta = _async_function("kv_batch_get_by_meta")
async_kv_list = _async_function("kv_list")
async_kv_clear = _async_function("kv_clear")

__all__ = [f"async_{n}" for n in ASYNC_KV]
