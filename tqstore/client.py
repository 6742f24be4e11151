"""The streaming client: ``tq.get_client()`` (TransferQueue's ``TransferQueueClient`` shape).

A client is a thin handle that forwards every call to a store: the one it was made for,
or — for ``get_client()`` without arguments — whatever default store ``tq.init`` has
opened at the time of each call, so a client survives ``close()`` + ``init()``.
"""
from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Optional

from . import _default
from .kv import DataPlane

#: Store methods a client (and the module API) forwards, in documentation order.
FORWARDED = (
    "get_meta", "put", "get_data", "clear_partition", "clear_samples", "get_consumption_status",
    "get_production_status", "check_consumption_status", "check_production_status", "reset_consumption",
    "get_partition_list", "kv_put", "kv_batch_put", "kv_batch_get", "kv_batch_get_by_meta", "kv_list", "kv_clear",
)


def _signature_without_self(func: Callable) -> inspect.Signature:
    sig = inspect.signature(func)
    return sig.replace(parameters=list(sig.parameters.values())[1:])


def _client_method(name: str) -> Callable:
    target = getattr(DataPlane, name)

    @functools.wraps(target)
    def method(self, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.store, name)(*args, **kwargs)

    method.__signature__ = inspect.signature(target)  # type: ignore[attr-defined]
    del method.__wrapped__
    return method


class TransferQueueClient:
    """Forwards the data-plane calls (``get_meta``, ``put``, ``get_data``, ``kv_*``, ...) to a store.

    Args:
        store: the store to use; None (default) means the default store of ``tq.init``,
            looked up at each call (StoreClosedError when there is none).
    """

    def __init__(self, store: Optional[Any] = None) -> None:
        self._store = store

    @property
    def store(self):
        """The store calls go to."""
        return self._store if self._store is not None else _default.get_default()

    def __repr__(self) -> str:
        return f"TransferQueueClient(store={self._store!r})" if self._store is not None else \
            "TransferQueueClient(default store)"


for _name in FORWARDED:
    setattr(TransferQueueClient, _name, _client_method(_name))


__all__ = ["TransferQueueClient", "FORWARDED"]
