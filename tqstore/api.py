"""Module-level, TransferQueue-shaped functions over the default store made by ``init``.

No business logic here: every function forwards to the default :class:`~tqstore.store.Store`.
"""
from __future__ import annotations

import threading
from typing import Any, Dict, Mapping, Optional

from . import _default
from .errors import ConfigError
from .store import Store

_init_lock = threading.Lock()

_STORE_KEYS = {"path", "num_units", "durability", "segment_bytes", "compress", "verify_reads", "max_workers",
               "index_map_bytes"}
_KNOWN_KEYS = _STORE_KEYS | {"backend", "sampler"}


def init(config: Optional[Mapping[str, Any]] = None) -> Store:
    """Open (or create) the default store from ``config`` and return it.

    Keys: ``path`` (store directory; without one, a private temporary store removed on
    close), ``num_units``, ``durability``, ``segment_bytes``, ``compress``, ``verify_reads``,
    ``backend`` (``"embedded"``), ``sampler``.  Calling ``init`` again while a store is
    open raises ``ConfigError``; call ``close()`` first.
    """
    cfg = dict(config or {})
    unknown = set(cfg) - _KNOWN_KEYS
    if unknown:
        raise ConfigError(f"unknown config keys {sorted(unknown)}; known: {sorted(_KNOWN_KEYS)}")
    backend = cfg.pop("backend", "embedded")
    if backend != "embedded":
        raise ConfigError(f"backend {backend!r} is not available in this build; use 'embedded'")
    cfg.pop("sampler", None)
    with _init_lock:
        cur = _default.peek_default()
        if cur is not None and not cur.closed:
            raise ConfigError("tqstore is already initialised; call tqstore.close() first")
        store = Store(cfg.pop("path", None), **cfg)
        _default.set_default(store)
        return store


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


__all__ = ["init", "close", "current_store"]
