"""A store's ``LOCK`` and the stores this process has open: one open per store, across
processes (an exclusive ``flock`` on ``LOCK``) and within one (a second open of the same
directory says so instead of blaming "another process" for the flock this process holds);
and what a forked child may do with its parent's stores (nothing: :func:`fork_error`).

A forked child closes its copies of the ``LOCK`` descriptors (``os.register_at_fork``): an
flock belongs to the open file, which the child's copy kept alive, so the parent's close did
not free the store while any child lived (its reopen, and every other process's open, were
refused).
"""
from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Dict, Tuple

from ._io import locks
from .errors import StorageIOError, StoreClosedError

# realpath of every store root open in this process -> the pid that opened it (a forked
# child inherits the dict but not the store), and the descriptor holding its LOCK flock
_OPEN_ROOTS: Dict[str, int] = {}
_LOCK_FDS: Dict[str, int] = {}
_OPEN_LOCK = threading.Lock()


def take(root: Path) -> Tuple[int, str]:
    """Lock the store at ``root``: ``(descriptor holding the flock, its real path)``.

    Raises StorageIOError: already open in this process, open in another one, or LOCK cannot
    be locked."""
    real = os.path.realpath(root)
    with _OPEN_LOCK:
        if _OPEN_ROOTS.get(real) == os.getpid():
            raise StorageIOError(f"store {root} is already open in this process; use the open Store "
                                 f"(or close it first)")
        try:
            fd = locks.lock_exclusive_nowait(root / "LOCK")
        except BlockingIOError as e:
            raise StorageIOError(f"store {root} is open in another process (LOCK is held)") from e
        except OSError as e:
            raise StorageIOError(f"cannot lock store {root} (its LOCK file): {e}") from e
        _OPEN_ROOTS[real] = os.getpid()
        _LOCK_FDS[real] = fd
    return fd, real


def release(real: str, fd: int) -> None:
    """Release what :func:`take` returned."""
    with _OPEN_LOCK:
        if _OPEN_ROOTS.get(real) == os.getpid():
            del _OPEN_ROOTS[real]
            _LOCK_FDS.pop(real, None)
        locks.unlock(fd)


def fork_error(root: Path, pid: int) -> StoreClosedError:
    """What a call of a forked child on its parent's store (opened by ``pid``) raises."""
    return StoreClosedError(
        f"store {root} was opened by process {pid}; this process ({os.getpid()}) is a fork of it and may not use "
        f"it (its open index files and locks are the parent's: using them here loses data). Open a store in the "
        f"child instead, or pass it data; a torch DataLoader over tqstore needs num_workers=0")


def _after_fork_in_child() -> None:
    global _OPEN_LOCK
    for fd in _LOCK_FDS.values():
        try:
            os.close(fd)
        except OSError:
            pass
    _LOCK_FDS.clear()
    _OPEN_ROOTS.clear()
    _OPEN_LOCK = threading.Lock()  # (another thread of the parent may have held it at the fork)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


__all__ = ["take", "release", "fork_error"]
