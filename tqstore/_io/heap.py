"""Giving freed heap memory back to the operating system.

A bulk decode (the controller's mirror built on open, a key index built on first use)
makes temporaries of the same size as its result: numpy arrays and lists that glibc's
allocator keeps in the process heap once freed (its mmap threshold grows with every large
block freed), so the process's resident memory stays at the decode's peak.
:func:`trim_heap` asks the allocator to return free pages (glibc ``malloc_trim(0)``).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging
from typing import Any, Optional

log = logging.getLogger("tqstore")

_UNSET: Any = object()
_trim: Any = _UNSET


def _malloc_trim() -> Optional[Any]:
    global _trim
    if _trim is _UNSET:
        _trim = None
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            fn = getattr(libc, "malloc_trim", None)  # glibc only
            if fn is not None:
                fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
                _trim = fn
        except OSError:
            pass
    return _trim


def trim_heap() -> bool:
    """Return the heap's free pages to the operating system (glibc); False where the C
    library has no ``malloc_trim``.  Costs milliseconds; never raises."""
    fn = _malloc_trim()
    if fn is None:
        return False
    try:
        fn(0)
    except Exception as e:  # noqa: BLE001 - an optimisation: never fail the caller
        log.debug("malloc_trim failed: %s", e)
        return False
    return True


__all__ = ["trim_heap"]
