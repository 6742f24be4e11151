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

import contextlib
import logging
import os
import threading
import time
from pathlib import Path
from typing import Callable, Dict, Iterator, Tuple, TypeVar

from ._io import locks
from .errors import StorageIOError, StoreClosedError

# realpath of every store root open in this process -> the pid that opened it (a forked
# child inherits the dict but not the store), and the descriptor holding its LOCK flock
_OPEN_ROOTS: Dict[str, int] = {}
_LOCK_FDS: Dict[str, int] = {}
_OPEN_LOCK = threading.Lock()
log = logging.getLogger("tqstore")
T = TypeVar("T")

#: how long an open waits for a tqstore command of another process holding the store's LOCK
CHECK_WAIT_S = 600.0


_COMMAND = threading.local()


@contextlib.contextmanager
def as_command() -> Iterator[None]:
    """Stores this thread opens inside the block take their ``LOCK`` as a tqstore command's
    (the command line's ``verify`` and ``compact``): marked, so that another process's open
    waits for the command to end instead of refusing (:func:`take`)."""
    _COMMAND.on = True
    try:
        yield
    finally:
        _COMMAND.on = False


def take(root: Path) -> Tuple[int, str]:
    """Lock the store at ``root``: ``(descriptor holding the flock, its real path)``.  While a
    tqstore command of another process (``inspect``, ``ls``, ``verify``, ``compact``) holds
    ``LOCK``, it waits for the command to end (:func:`waiting_for_commands`); a store open in
    another process is refused at once.

    Raises StorageIOError: already open in this process, open in another one, held by a
    command longer than :data:`CHECK_WAIT_S`, or LOCK cannot be locked."""
    real = os.path.realpath(root)
    command = getattr(_COMMAND, "on", False)

    def attempt() -> int:
        with _OPEN_LOCK:
            if _OPEN_ROOTS.get(real) == os.getpid():
                raise StorageIOError(f"store {root} is already open in this process; use the open Store "
                                     f"(or close it first)")
            fd = (locks.lock_for_check_nowait if command else locks.lock_exclusive_nowait)(root / "LOCK")
            _OPEN_ROOTS[real] = os.getpid()
            _LOCK_FDS[real] = fd
            return fd

    try:
        return waiting_for_commands(root, attempt), real
    except BlockingIOError as e:
        raise StorageIOError(f"store {root} is open in another process (its LOCK is held): close it there, or "
                             f"open another path") from e
    except OSError as e:
        raise StorageIOError(f"cannot lock store {root} (its LOCK file): {e}") from e


def waiting_for_commands(root: Path, attempt: Callable[[], T]) -> T:
    """``attempt()``, which takes the store's ``LOCK`` without waiting (BlockingIOError when it
    is held), tried again while a tqstore command of another process holds that LOCK (its
    mark: :func:`tqstore._io.locks.check_mark_held`), at most :data:`CHECK_WAIT_S`; an INFO
    record says once what it waits for.

    Raises:
        BlockingIOError: something else holds the LOCK (a store open in another process).
        StorageIOError: a command held it longer than :data:`CHECK_WAIT_S`.
    """
    since, misses = None, 0
    while True:
        try:
            return attempt()
        except BlockingIOError as e:
            held = e
        if not locks.check_mark_held(root / "LOCK"):
            misses += 1
            if misses > 1:  # (the first: a command may have ended between the flock and the look at its mark)
                raise held
            continue
        misses = 0
        if since is None:
            since = time.monotonic()
            log.info("store %s is held by a tqstore command (inspect, ls, verify or compact) in another process; "
                     "waiting for it to end", root)
        elif time.monotonic() - since > CHECK_WAIT_S:
            raise StorageIOError(f"store {root} has been held by a tqstore command (inspect, ls, verify or compact) "
                                 f"in another process for {CHECK_WAIT_S:.0f} s; open it once that has ended") from held
        time.sleep(0.02)


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


__all__ = ["take", "release", "fork_error", "as_command", "waiting_for_commands"]
