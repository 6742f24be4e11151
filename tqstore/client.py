"""The streaming clients: ``tq.get_client()`` (TransferQueue's ``TransferQueueClient`` shape).

A client is a thin handle that forwards every call to a store: the one it was made for,
or — for ``get_client()`` without arguments — whatever default store ``tq.init`` has
opened at the time of each call, so a client survives ``close()`` + ``init()``.

:class:`AsyncTransferQueueClient` has the ``async_*`` form of every call; each runs the
synchronous call on the API layer's own small thread pool (:mod:`tqstore._executor`), so
engine work never blocks the event loop; ``async_get_meta``'s fetch waits for producers on
the event loop, not on a pool thread, and a cancelled one takes no rows
(:mod:`tqstore.fetch_wait`).  :class:`TransferQueueClient` has both forms.
Every call is timed into :data:`tqstore.metrics.REGISTRY`.
"""
from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, List, Optional, Union

from . import _default, _executor, fetch_wait, metrics as _metrics
from .errors import InvalidInputError, StoreClosedError
from .kv import DataPlane
from .meta import BatchMeta

#: Store methods a client (and the module API) forwards, in documentation order.
FORWARDED = (
    "get_meta", "put", "get_data", "clear_partition", "clear_samples", "get_consumption_status",
    "get_production_status", "check_consumption_status", "check_production_status", "reset_consumption",
    "get_partition_list", "kv_put", "kv_batch_put", "kv_batch_get", "kv_batch_get_by_meta", "kv_list", "kv_clear",
)

#: calls a client adds over the module API (TransferQueue's client surface)
EXTRA = ("set_custom_meta", "kv_retrieve_meta", "kv_retrieve_keys", "save_controller_checkpoint",
         "load_controller_checkpoint", "save_storage_checkpoint", "load_storage_checkpoint", "dump_data_by_key",
         "load_data_by_key", "recover_data_load")

#: the calls of EXTRA that are store methods (a served store answers each in one call of its host:
#: set_custom_meta checks the rows and writes the tags under the store's write lock)
STORE_EXTRA = ("set_custom_meta", "kv_retrieve_meta", "kv_retrieve_keys")

_ROW_OPS = {"put", "kv_put", "kv_batch_put", "get_data", "kv_batch_get", "kv_batch_get_by_meta", "get_meta"}


def call_store(store: Any, name: str, *args: Any, **kwargs: Any) -> Any:
    """``store.<name>(*args, **kwargs)``, timed into the metrics registry, with the
    TransferQueue polling-mode rule of ``get_meta`` applied (see :class:`~tqstore.config.CompatSettings`)."""
    with _metrics.REGISTRY.timed(name) as box:
        if name == "get_meta":
            out = _get_meta(store, *args, **kwargs)
        else:
            out = getattr(store, name)(*args, **kwargs)
        if name in _ROW_OPS:
            box["rows"] = _metrics.rows_of(out)
        return out


def _get_meta(store: Any, *args: Any, **kwargs: Any) -> BatchMeta:
    how = fetch_wait.plan(store, args, kwargs)
    if how is None:  # not a fetch: nothing waits
        return store.get_meta(*args, **kwargs)
    return fetch_wait.fetch(store, how)


async def _async_get_meta(store: Any, *args: Any, **kwargs: Any) -> BatchMeta:
    """``get_meta`` for the async forms: a fetch waits on the event loop (:mod:`tqstore.fetch_wait`)."""
    how = fetch_wait.plan(store, args, kwargs)
    if how is None:
        return await _executor.run(call_store, store, "get_meta", *args, **kwargs)  # (it may create rows)
    with _metrics.REGISTRY.timed("get_meta") as box:
        out = await fetch_wait.fetch_async(store, how)
        box["rows"] = _metrics.rows_of(out)
        return out


def _client_method(name: str) -> Callable:
    target = getattr(DataPlane, name)

    @functools.wraps(target)
    def method(self, *args: Any, **kwargs: Any) -> Any:
        return call_store(self.store, name, *args, **kwargs)

    method.__signature__ = inspect.signature(target)  # type: ignore[attr-defined]
    del method.__wrapped__
    return method


def _async_method(name: str) -> Callable:
    sync = getattr(TransferQueueClient, name)

    async def method(self, *args: Any, **kwargs: Any) -> Any:
        store = self.store  # resolved on the loop: StoreClosedError at once, before the hop
        if name == "get_meta":  # a fetch waits on the loop, not on a pool thread
            return await _async_get_meta(store, *args, **kwargs)
        return await _executor.run_on(_executor.lane_of(name), self._dispatch, store, name, *args, **kwargs)

    method.__name__ = method.__qualname__ = f"async_{name}"
    how = ("a fetch waits for producers on the event loop, each ask of the store runs on the API thread pool; "
           "see tqstore.fetch_wait" if name == "get_meta" else "runs on the API thread pool")
    method.__doc__ = f"Awaitable form of :meth:`TransferQueueClient.{name}` ({how}).\n\n" + (sync.__doc__ or "")
    method.__signature__ = inspect.signature(sync)  # type: ignore[attr-defined]
    return method


class _ClientBase:
    def __init__(self, store: Optional[Any] = None, *, client_id: Optional[str] = None) -> None:
        if store is not None and not callable(getattr(store, "get_meta", None)):
            hint = (" (TransferQueue's first argument is the client id: pass client_id=... by keyword)"
                    if isinstance(store, str) else "")
            raise InvalidInputError(f"{type(self).__name__}: store must be a tqstore store or None (the default "
                                    f"store), got {type(store).__name__} {store!r:.60}{hint}")
        self._store = store
        self._closed = False
        self.client_id = client_id or f"tqstore-client-{id(self):x}"

    @property
    def store(self):
        """The store calls go to."""
        if self._closed:
            raise StoreClosedError(f"client {self.client_id} is closed")
        return self._store if self._store is not None else _default.get_default()

    def close(self) -> None:
        """Close this client (idempotent).  The store stays open: ``tq.close()`` closes it."""
        self._closed = True

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(store={self._store!r})" if self._store is not None else \
            f"{type(self).__name__}(default store)"

    def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return self._dispatch(self.store, name, *args, **kwargs)

    def _dispatch(self, store: Any, name: str, *args: Any, **kwargs: Any) -> Any:
        if name in FORWARDED or name in STORE_EXTRA:
            return call_store(store, name, *args, **kwargs)
        return getattr(self, "_" + name)(store, *args, **kwargs)

    # ------------------------------------------------------------------ bodies (store passed explicitly)
    def _save_controller_checkpoint(self, store: Any, path: str) -> Any:
        return _metrics.timed_call("save_checkpoint", store.save_checkpoint, path, include_storage=False)

    def _load_controller_checkpoint(self, store: Any, path: str) -> Any:
        return _metrics.timed_call("load_checkpoint", store.load_checkpoint, path)

    def _save_storage_checkpoint(self, store: Any, checkpoint_dir: str) -> Any:
        return _metrics.timed_call("save_checkpoint", store.save_checkpoint, checkpoint_dir)

    def _load_storage_checkpoint(self, store: Any, checkpoint_dir: str) -> Any:
        return _metrics.timed_call("load_checkpoint", store.load_checkpoint, checkpoint_dir)

    def _dump_data_by_key(self, store: Any, dump_dir: str, keys: List[str], partition_id: str, *,
                          blocking: bool = True) -> Any:
        return _metrics.timed_call("dump_data_by_key", store.dump_data_by_key, dump_dir, keys, partition_id,
                                   blocking=blocking)

    def _load_data_by_key(self, store: Any, dump_dir: str) -> Any:
        return _metrics.timed_call("load_data_by_key", store.load_data_by_key, dump_dir)

    def _recover_data_load(self, store: Any, dump_dir: str, cancel: bool = False) -> bool:
        return _metrics.timed_call("recover_data_load", store.recover_data_load, dump_dir, cancel=cancel)


class TransferQueueClient(_ClientBase):
    """Forwards the data-plane calls (``get_meta``, ``put``, ``get_data``, ``kv_*``, ...) to a store,
    in synchronous and ``async_*`` forms.

    Args:
        store: the store to use; None (default) means the default store of ``tq.init``,
            looked up at each call (StoreClosedError when there is none).
        client_id: a name for logs and errors.

    Raises:
        InvalidInputError: ``store`` is neither None nor a store (a str: TransferQueue's
            first argument is the client id).
    """

    # ------------------------------------------------------------------ TransferQueue's extra calls
    def set_custom_meta(self, metadata: BatchMeta) -> None:
        """Store ``metadata.custom_meta`` as the rows' tags (replacing them; no field is written).

        Raises StorageKeyNotFoundError (a KeyNotFoundError) when the meta is stale (its rows
        were cleared).
        """
        return self._call("set_custom_meta", metadata)

    def kv_retrieve_meta(self, keys: Union[str, List[str]], partition_id: str, create: bool = False) -> BatchMeta:
        """The BatchMeta of ``keys``, over the fields every one of those rows has produced (in
        the partition's schema order, so that ``get_data`` of it reads them), as the store's
        :meth:`~tqstore.Store.kv_retrieve_meta`.

        Keys that do not exist are created (no fields) with ``create=True`` and left out otherwise;
        an unknown partition gives an empty BatchMeta.  Raises as the store's call.
        """
        return self._call("kv_retrieve_meta", keys, partition_id, create)

    def kv_retrieve_keys(self, global_indexes: Union[int, List[int]], partition_id: str) -> List[Optional[str]]:
        """The user keys of rows by global index, as TransferQueue: None for a global index that is
        not a row of the partition or has no key.

        Raises:
            TypeError: ``global_indexes`` is not an int or a list of ints.
            InvalidInputError: an empty list.
            RuntimeError: the partition does not exist ("Some global_indexes have no corresponding keys!").
        """
        return self._call("kv_retrieve_keys", global_indexes, partition_id)

    def save_controller_checkpoint(self, path: str) -> Any:
        """``save_checkpoint(path, include_storage=False)``: keys, tags, consumption and sampler state only."""
        return self._call("save_controller_checkpoint", path)

    def load_controller_checkpoint(self, path: str) -> Any:
        """``load_checkpoint(path)`` (tqstore loads whole checkpoints; see docs/MIGRATING.md)."""
        return self._call("load_controller_checkpoint", path)

    def save_storage_checkpoint(self, checkpoint_dir: str) -> Any:
        """``save_checkpoint(checkpoint_dir)``: the whole store (one consistent cut, controller included)."""
        return self._call("save_storage_checkpoint", checkpoint_dir)

    def load_storage_checkpoint(self, checkpoint_dir: str) -> Any:
        """``load_checkpoint(checkpoint_dir)``."""
        return self._call("load_storage_checkpoint", checkpoint_dir)

    def dump_data_by_key(self, dump_dir: str, keys: List[str], partition_id: str, *, blocking: bool = True) -> Any:
        """Dump exactly ``keys`` of ``partition_id`` to ``dump_dir`` (see ``Store.dump_data_by_key``):
        each owning unit writes its own shard; the payloads never pass through the client."""
        return self._call("dump_data_by_key", dump_dir, keys, partition_id, blocking=blocking)

    def load_data_by_key(self, dump_dir: str) -> Any:
        """``Store.load_data_by_key(dump_dir)``: merge a dump's keys into the store."""
        return self._call("load_data_by_key", dump_dir)

    def recover_data_load(self, dump_dir: str, cancel: bool = False) -> bool:
        """``Store.recover_data_load(dump_dir, cancel)``: settle an unresolved load."""
        return self._call("recover_data_load", dump_dir, cancel)


for _name in FORWARDED:
    setattr(TransferQueueClient, _name, _client_method(_name))
for _name in FORWARDED + EXTRA:
    setattr(TransferQueueClient, f"async_{_name}", _async_method(_name))


class AsyncTransferQueueClient(_ClientBase):
    """The ``async_*`` calls of :class:`TransferQueueClient` only (TransferQueue's async client)."""


for _name in FORWARDED + EXTRA:
    setattr(AsyncTransferQueueClient, f"async_{_name}", getattr(TransferQueueClient, f"async_{_name}"))


__all__ = ["TransferQueueClient", "AsyncTransferQueueClient", "FORWARDED", "EXTRA", "call_store"]
