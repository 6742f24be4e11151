"""Named failpoints for fault injection in the I/O layer.

Every durable operation in ``tqstore._io`` calls :func:`hit` with its name (e.g.
``"fsync_dir"``, ``"rename"``).  When no failpoint is armed, ``hit`` is a single
global check.  Armed failpoints can raise ``OSError`` (``EIO``, ``ENOSPC``), make a
write short, or kill the process (``os._exit``) at the N-th occurrence.

Arm from code with :func:`arm`, or from the environment before import with
``TQSTORE_FAILPOINTS="rename=kill@3;fsync_file=eio@1"``.  Actions: ``eio``,
``enospc``, ``exdev`` (a hard link across two mounts of one file system), ``short``
(only writes honour it), ``kill``.  ``@N`` (default 1) is the
occurrence, counted from arming; ``@N+`` fires at N and every later one.

The names (tests/test_io_boundary.py checks that no durable syscall of tqstore bypasses them):

=====================  ==================================================================
``write``              every positional write (``files.pwrite_all``: segment appends and
                       headers, ``write_file``)
``create``             ``files.write_file`` creating or truncating a file
``segment_create``     a new segment file (``segfile.SegmentWriter``), before it exists
``truncate``           a truncation (``files.truncate``, ``files.ftruncate``: a segment's
                       torn tail cut when its unit reopens)
``fsync_file``         fsync of a file; ``fsync_dir`` of a directory
``rename``, ``link``,  the directory operations of ``files``; ``mkdir`` also covers
``unlink``, ``mkdir``, ``files.make_temp_dir``; ``rmtree`` also a best-effort removal
``rmtree``             (``ignore_errors=True``, whose failure is then swallowed)
``copy``               a file copy (``files.copy_file``) or an LMDB copy (``lmdbenv``:
                       a snapshot's index copies, a checkpoint's indexes at load)
``lmdb_sync``          an LMDB environment flushed to disk (``lmdbenv.sync_env``: a unit
                       index and the controller at a clean close, the controller when a
                       store opens and removes the clean-close marker)
``lock_open``          opening (creating) a lock file: the store's ``LOCK``, a checkpoint
                       path's ``.lock``, a generation root's lock file
``unit_commit``,       right before an LMDB commit of a unit or the controller (LMDB
``controller_commit``  writes in C: a crash point, not a syscall of ours)
=====================  ==================================================================
"""
from __future__ import annotations

import errno
import os
import threading
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

KILL_EXIT_CODE = 77

_lock = threading.Lock()
_armed: Dict[str, "_Point"] = {}
_counts: Dict[str, int] = {}
_observer: Optional[Callable[..., None]] = None
active = False  # fast path flag: any failpoint armed, counting enabled, or an observer set
_counting = False


@dataclass
class _Point:
    action: str
    at: int
    repeat: bool = False
    fired: int = 0


class ShortWrite(Exception):
    """Internal signal: the write helper should write only part of its data."""


def _refresh() -> None:
    global active
    active = bool(_armed) or _counting or _observer is not None


def arm(name: str, action: str, at: int = 1, *, repeat: bool = False) -> None:
    """Arm failpoint ``name`` to perform ``action`` at its ``at``-th occurrence."""
    if action not in ("eio", "enospc", "exdev", "short", "kill"):
        raise ValueError(f"unknown failpoint action {action!r}")
    with _lock:
        _armed[name] = _Point(action, at, repeat)
        _counts[name] = 0
        _refresh()


def disarm(name: Optional[str] = None) -> None:
    """Disarm one failpoint, or all of them (and reset counters)."""
    with _lock:
        if name is None:
            _armed.clear()
            _counts.clear()
        else:
            _armed.pop(name, None)
        _refresh()


def start_counting() -> None:
    """Count every occurrence of every failpoint (to enumerate crash points)."""
    global _counting
    with _lock:
        _counts.clear()
        _counting = True
        _refresh()


def stop_counting() -> Dict[str, int]:
    """Stop counting and return ``{name: occurrences}`` since :func:`start_counting`."""
    global _counting
    with _lock:
        _counting = False
        out = dict(_counts)
        _refresh()
        return out


def set_observer(fn: Optional[Callable[..., None]]) -> None:
    """Install ``fn(event, *args)`` called on every I/O event (used by the power-loss simulator)."""
    global _observer
    with _lock:
        _observer = fn
        _refresh()


def observe(event: str, *args) -> None:
    obs = _observer
    if obs is not None:
        obs(event, *args)


def hit(name: str) -> None:
    """Count an occurrence of ``name`` and fire it if armed. Raises OSError or exits."""
    if not active:
        return
    with _lock:
        n = _counts.get(name, 0) + 1
        _counts[name] = n
        p = _armed.get(name)
        fire = p is not None and (n == p.at or (p.repeat and n >= p.at))
        if fire:
            p.fired += 1
    if not fire:
        return
    if p.action == "kill":
        os._exit(KILL_EXIT_CODE)
    if p.action == "eio":
        raise OSError(errno.EIO, f"injected EIO at failpoint {name} #{n}")
    if p.action == "enospc":
        raise OSError(errno.ENOSPC, f"injected ENOSPC at failpoint {name} #{n}")
    if p.action == "exdev":
        raise OSError(errno.EXDEV, f"injected EXDEV at failpoint {name} #{n}")
    if p.action == "short":
        raise ShortWrite(name)


def armed() -> List[str]:
    with _lock:
        return sorted(_armed)


def _from_env() -> None:
    spec = os.environ.get("TQSTORE_FAILPOINTS", "").strip()
    if not spec:
        return
    for item in spec.split(";"):
        item = item.strip()
        if not item:
            continue
        name, _, rest = item.partition("=")
        action, _, at = rest.partition("@")
        repeat = at.endswith("+")
        arm(name.strip(), action.strip(), int(at.rstrip("+") or 1), repeat=repeat)


_from_env()
