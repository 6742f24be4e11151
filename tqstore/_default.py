"""The process-wide default store used by the module-level API (``tq.init`` sets it)."""
from __future__ import annotations

import threading
from typing import Optional

from .errors import StoreClosedError

_lock = threading.Lock()
_store = None


def set_default(store) -> None:
    global _store
    with _lock:
        _store = store


def get_default():
    """The default store. Raises StoreClosedError (a RuntimeError) before ``tq.init()``."""
    s = _store
    if s is None or s.closed:
        raise StoreClosedError("tqstore is not initialized: call tqstore.init() first")
    return s


def peek_default() -> Optional[object]:
    return _store
