"""Hand the GIL back quickly for the length of one data-plane call.

A put or get makes thousands of calls that release the GIL: py-lmdb releases it around
every item it writes or reads, and file I/O, numpy and the native kernels release it too.
Each time, the calling thread must take the GIL back; if another thread of the process is
running Python meanwhile, CPython makes the caller wait until that thread has held it for
a whole switch interval (``sys.getswitchinterval()``, 5 ms by default).  Measured here
(``bench/bench_scale.py``, 16,384 small rows, one other thread running pure Python): puts
ran at 0.009x and gets at 0.029x of their speed alone.

So while a data-plane call runs (and a dump, load by key or checkpoint save/load), the
interval is set to :data:`INTERVAL_S` (50 us unless ``TQSTORE_SWITCH_INTERVAL`` says
otherwise: seconds from 1e-6 to 1, or ``off`` to leave the interpreter's setting alone), and the previous value is put back when the last such call
ends.  (A store's own worker threads count as other threads too: its unit writes and reads
wait for the GIL like anyone's.)  Nested and concurrent calls are counted.  If something else
changed the interval meanwhile, its value is kept.  The other threads lose nothing but
switch more often while the call runs (a switch costs microseconds).
"""
from __future__ import annotations

import functools
import inspect
import logging
import os
import sys
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional

log = logging.getLogger("tqstore")

#: the switch interval a data-plane call runs with, or None (left alone); see the module docstring
DEFAULT_INTERVAL_S = 5e-5


def _interval_from_env(raw: Optional[str]) -> Optional[float]:
    if raw is None or not raw.strip():
        return DEFAULT_INTERVAL_S
    if raw.strip().lower() in ("off", "none", "0"):
        return None
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 1e-6 <= value <= 1:  # (the interpreter keeps whole microseconds)
        log.warning("TQSTORE_SWITCH_INTERVAL=%r is not a number of seconds from 1e-6 to 1, or 'off'; using %g s",
                    raw, DEFAULT_INTERVAL_S)
        return DEFAULT_INTERVAL_S
    return value


INTERVAL_S: Optional[float] = _interval_from_env(os.environ.get("TQSTORE_SWITCH_INTERVAL"))

_lock = threading.Lock()
_depth = 0
_saved: Optional[float] = None  # the interval to put back (None: nothing to put back)
_ours: Optional[float] = None  # the interval as set here, read back (the interpreter rounds it)


@contextmanager
def quick_handoff() -> Iterator[None]:
    """Context manager: inside it the switch interval is at most :data:`INTERVAL_S` (see the
    module docstring)."""
    global _depth, _saved, _ours
    want = INTERVAL_S
    if want is None:
        yield
        return
    with _lock:
        if _depth == 0:
            cur = sys.getswitchinterval()
            _saved = cur if cur > want else None  # (already as quick or quicker: left as it is)
            if _saved is not None:
                sys.setswitchinterval(want)
                _ours = sys.getswitchinterval()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _saved is not None:
                if sys.getswitchinterval() == _ours:  # (changed by someone else meanwhile: theirs stays)
                    sys.setswitchinterval(_saved)
                _saved = _ours = None


def _after_fork_in_child() -> None:
    """A process forked while a call ran (in another thread) has none running: its interval is
    put back and the counter starts again (its lock, perhaps copied held, is new)."""
    global _lock, _depth, _saved, _ours
    _lock = threading.Lock()
    if _depth and _saved is not None and sys.getswitchinterval() == _ours:
        sys.setswitchinterval(_saved)
    _depth, _saved, _ours = 0, None, None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def handing_off(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator: run ``fn`` inside :func:`quick_handoff` (its signature and docstring kept)."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with quick_handoff():
            return fn(*args, **kwargs)

    wrapper.__signature__ = inspect.signature(fn)  # type: ignore[attr-defined]
    del wrapper.__wrapped__
    return wrapper


__all__ = ["INTERVAL_S", "DEFAULT_INTERVAL_S", "quick_handoff", "handing_off"]
