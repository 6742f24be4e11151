"""Module-level, TransferQueue-shaped functions over the default store made by ``init``.

No business logic here: every function forwards to the default :class:`~tqstore.store.Store`.
"""
from __future__ import annotations

import copy
import functools
import inspect
import logging
import os
import sys
import threading
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Tuple, Union

from . import _default, config as _config, metrics as _metrics
from .client import FORWARDED, TransferQueueClient, call_store
from .checkpoint import CheckpointManager as _CheckpointManager
from .dump import read_row_index as _read_row_index
from .errors import ConfigError
from .kv import DataPlane
from .samplers import describe_sampler, make_sampler
from .store import Store

log = logging.getLogger("tqstore")

if TYPE_CHECKING:  # pragma: no cover
    from .ray.remote_store import RemoteStore

_init_lock = threading.Lock()


def init(config: Any = None, *, conf: Any = None) -> Union[Store, "RemoteStore"]:
    """Open (or create) the default store from ``config`` (or ``conf=``, TransferQueue's name
    for it; giving both is a ``ConfigError``) and return it.

    Keys: ``path`` (store directory; without one, a private temporary store removed on
    close), ``num_units``, ``durability``, ``segment_bytes``, ``compress``, ``verify_reads``,
    ``result_type``, ``strict_schema``, ``total_storage_size`` (see :class:`~tqstore.store.Store`),
    ``backend`` (``"embedded"``, or ``"ray"``: below), ``sampler`` (a name such as ``"grpo_group_n"``, a
    ``BaseSampler`` instance or class, or ``{"name": ..., **kwargs}``; default sequential).

    ``backend: "ray"``: the store is served by a named Ray actor (:mod:`tqstore.ray.store_host`),
    its units and controller actors of their own spread over the cluster's nodes; the first
    process to call ``init`` with a name starts and owns it (``ray`` section: ``name``,
    default ``"default"``, and ``nodes``), every other process of the cluster that calls
    ``init`` with that name attaches to it, with the same settings or none
    (:func:`tqstore.ray.remote_store.connect`).  The returned object is then a
    :class:`~tqstore.ray.remote_store.RemoteStore`; ``close()`` ends the store in its owner
    and detaches elsewhere.
    TransferQueue's config (a mapping or an OmegaConf ``DictConfig`` with ``controller``,
    ``backend`` and ``metrics`` sections) is accepted too and mapped by :mod:`tqstore.config`
    (docs/MIGRATING.md has the table).
    In a Ray task or actor, a config that does not name ``backend`` (none at all, as in
    TransferQueue's workers' ``tq.init()``, or TransferQueue's) attaches to the store served
    on the cluster under ``"default"``; when none is served it raises ``ConfigError`` rather
    than open a store private to that worker, which nothing else would see.  Pass
    ``{"backend": "embedded"}`` for such a private store.
    Calling ``init`` again while its store is open returns that store when the call gives no
    config or the same one (TransferQueue's ``init`` attaches to the running system: a Ray
    worker that Ray reuses for another task runs that task's ``tq.init()`` again); a call with
    another config raises ``ConfigError`` naming what differs (call ``close()`` first).
    """
    if conf is not None:
        if config is not None:
            raise ConfigError("init() got both config and conf (TransferQueue's name for it): pass one")
        config = conf
    cfg, sampler_spec, settings = _config.translate(config)
    sampler = make_sampler(sampler_spec)  # ConfigError before anything is opened
    with _init_lock:
        global _opened_with
        cur = _default.peek_default()
        asked = _init_key(cfg, sampler if sampler_spec is not None else None, settings)
        if cur is not None and not cur.closed and _still_served(cur):
            if config is None or _opened_with is None or asked == _opened_with:
                log.info("tqstore is already initialized%s: init returns the open store",
                         "" if config is None else " with this config")
                return cur
            raise ConfigError(f"tqstore is already initialized with another config (it differs in "
                              f"{_differences(_opened_with, asked)}); call tqstore.close() first")
        attach = not settings.backend_named and "ray" in sys.modules and _in_ray_worker()
        if settings.backend == "ray" or attach:
            from .ray.remote_store import connect

            settings.backend = "ray"
            store = connect(settings.ray_name, cfg.pop("path", None), cfg,
                            sampler if sampler_spec is not None else None, settings.ray_nodes, attach_only=attach)
        else:
            store = Store(cfg.pop("path", None), **cfg)
            store.set_sampler(sampler)
        _config.remember(store, settings)
        _default.set_default(store)
        _opened_with = asked
        return store


#: what the open default store was initialized with (:func:`_init_key`)
_opened_with: Optional[Tuple[Dict[str, Any], Optional[str], Dict[str, Any]]] = None


def _init_key(cfg: Mapping[str, Any], sampler: Any, settings: Any) -> Tuple[Dict[str, Any], Optional[str],
                                                                             Dict[str, Any]]:
    """An ``init`` config as compared with the next ``init``'s: the store's keys (its path
    resolved: the same directory however it is spelled), the sampler as its class and
    arguments (None: none given), and a copy of the API-layer settings (``init`` changes the
    ones it is given)."""
    keys = dict(cfg)
    if keys.get("path") is not None:
        keys["path"] = os.path.realpath(os.path.expanduser(os.fspath(keys["path"])))
    return keys, None if sampler is None else describe_sampler(sampler), copy.deepcopy(vars(settings))


def _still_served(store: Any) -> bool:
    """False for a Ray store whose host no longer serves its name (the driver closed it and
    perhaps started another of that name since): this process's handle to it is stale and is
    detached, so that ``init`` attaches anew; True for any other open store."""
    serving = getattr(store, "serving", None)
    if serving is None or serving():
        return True
    log.info("%s is no longer served: detaching this process's handle, init attaches anew", store)
    store.close()
    return False


def _differences(was: Tuple[Dict[str, Any], Any, Dict[str, Any]], now: Tuple[Dict[str, Any], Any, Dict[str, Any]]
                 ) -> str:
    """The keys two ``init`` configs differ in, in words."""
    (cfg0, spec0, set0), (cfg1, spec1, set1) = was, now
    names = sorted(k for k in set(cfg0) | set(cfg1) if cfg0.get(k, _MISSING) != cfg1.get(k, _MISSING))
    if spec0 != spec1:
        names.append(f"sampler ({spec1 or 'none given'}; the open store's: {spec0 or 'the default'})")
    fields = [f for f in set0 if set0[f] != set1.get(f, _MISSING)]
    names.extend(f for f in fields if f != "ignored")
    if "ignored" in fields and not names:
        names.append("the keys it ignores")
    return ", ".join(names) or "its settings"


_MISSING = object()


def _in_ray_worker() -> bool:
    from .ray.remote_store import in_ray_worker

    return in_ray_worker()


def close() -> None:
    """Close the default store (idempotent)."""
    with _init_lock:
        cur = _default.peek_default()
        if cur is not None:
            cur.close()
        _default.set_default(None)


def current_store() -> Store:
    """The default store; RuntimeError (StoreClosedError) before ``init``."""
    return _default.get_default()


def get_client(store: Optional[Store] = None) -> TransferQueueClient:
    """A client forwarding the data-plane calls to ``store``, or, when None, to the default
    store (looked up at each call, so the client outlives ``close()`` + ``init()``)."""
    return TransferQueueClient(store)


def _module_function(name: str) -> Callable:
    target = getattr(DataPlane, name)

    @functools.wraps(target)
    def fn(*args: Any, **kwargs: Any) -> Any:
        return call_store(_default.get_default(), name, *args, **kwargs)

    sig = inspect.signature(target)
    fn.__signature__ = sig.replace(parameters=list(sig.parameters.values())[1:])  # type: ignore[attr-defined]
    del fn.__wrapped__
    fn.__qualname__ = name
    fn.__module__ = __name__
    return fn


get_meta = _module_function("get_meta")
put = _module_function("put")
get_data = _module_function("get_data")
clear_partition = _module_function("clear_partition")
clear_samples = _module_function("clear_samples")
get_consumption_status = _module_function("get_consumption_status")
get_production_status = _module_function("get_production_status")
check_consumption_status = _module_function("check_consumption_status")
check_production_status = _module_function("check_production_status")
reset_consumption = _module_function("reset_consumption")
get_partition_list = _module_function("get_partition_list")
kv_put = _module_function("kv_put")
kv_batch_put = _module_function("kv_batch_put")
kv_batch_get = _module_function("kv_batch_get")
kv_batch_get_by_meta = _module_function("kv_batch_get_by_meta")
kv_list = _module_function("kv_list")
kv_clear = _module_function("kv_clear")
assert set(FORWARDED) <= set(globals()), "every client method has a module-level function"


def save_checkpoint(checkpoint_dir, *, include_storage: bool = True, metadata: Optional[Mapping[str, Any]] = None,
                    blocking: bool = True):
    """Save the default store's state to ``checkpoint_dir``; see ``Store.save_checkpoint``."""
    store = current_store()
    return _metrics.timed_call("save_checkpoint", store.save_checkpoint, checkpoint_dir,
                               include_storage=include_storage, metadata=metadata, blocking=blocking)


def load_checkpoint(checkpoint_dir):
    """Replace the default store's state with a checkpoint; see ``Store.load_checkpoint``."""
    store = current_store()
    return _metrics.timed_call("load_checkpoint", store.load_checkpoint, checkpoint_dir)


def dump_data_by_key(dump_dir, keys: List[str], partition_id: str, *, blocking: bool = True):
    """Dump exactly ``keys`` of ``partition_id`` of the default store to ``dump_dir``; see
    ``Store.dump_data_by_key``."""
    store = current_store()
    return _metrics.timed_call("dump_data_by_key", store.dump_data_by_key, dump_dir, keys, partition_id,
                               blocking=blocking)


def read_row_index(dump_dir) -> Dict[str, Any]:
    """The row index of a dump (no payload read); see :func:`tqstore.dump.read_row_index`."""
    return _read_row_index(dump_dir)


def load_data_by_key(dump_dir) -> Dict[str, Any]:
    """Merge a dump's keys into the default store; see ``Store.load_data_by_key``."""
    store = current_store()
    return _metrics.timed_call("load_data_by_key", store.load_data_by_key, dump_dir)


def recover_data_load(dump_dir, cancel: bool = False) -> bool:
    """Settle an unresolved load from ``dump_dir``; see ``Store.recover_data_load``."""
    store = current_store()
    return _metrics.timed_call("recover_data_load", store.recover_data_load, dump_dir, cancel=cancel)


class CheckpointManager(_CheckpointManager):
    __doc__ = (f"{_CheckpointManager.__doc__}\n\n    ``tqstore.CheckpointManager`` also counts its ``save`` and "
               f"``restore`` in the metrics, as ``save_checkpoint`` and ``load_checkpoint`` calls (a "
               f"``blocking=False`` save's write as ``save_checkpoint_background``).\n")

    def save(self, step: int, metadata: Optional[Mapping[str, Any]] = None, *, blocking: bool = True,
             include_storage: bool = True):
        return _metrics.timed_call("save_checkpoint", super().save, step, metadata, blocking=blocking,
                                   include_storage=include_storage)

    def restore(self, step: Optional[int] = None) -> int:
        return _metrics.timed_call("load_checkpoint", super().restore, step)

    save.__doc__ = _CheckpointManager.save.__doc__
    restore.__doc__ = _CheckpointManager.restore.__doc__


def get_metrics_endpoint() -> Any:
    """Counters and latencies of this process's API calls (puts, gets, get_meta, clears, saves,
    loads, dumps): Prometheus text format when ``prometheus_client`` is installed, else a
    mapping (``tqstore.metrics.snapshot()``).  Works without ``init``.

    TransferQueue returns the ``host:port`` of an HTTP exporter instead; docs/MIGRATING.md.
    """
    return _metrics.endpoint_payload()


__all__ = ["init", "close", "current_store", "get_client", *FORWARDED, "save_checkpoint", "load_checkpoint",
           "dump_data_by_key", "read_row_index", "load_data_by_key", "recover_data_load", "get_metrics_endpoint",
           "CheckpointManager"]
