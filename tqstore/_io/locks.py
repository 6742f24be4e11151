"""Advisory locks (``flock``) across processes: the lock file of a checkpoint path, and the
"in use" mark of a directory being written.

* :func:`flocked` holds a shared (readers) or exclusive (publication, deletion) flock on a
  lock file, created if missing.  Opening (and possibly creating) the lock file is the one
  durable change, behind failpoint ``lock_open``.  A *shared* lock whose file cannot be
  created (read-only directory, read-only file system) or cannot be flocked (a file
  system without flock) is skipped with a DEBUG log: the reader goes on without it, as a
  reader of a directory it cannot write into (no writer without write access can publish
  there either).  An exclusive lock that cannot be taken raises ``OSError``, unless asked
  with ``read_only_ok`` (a load from a location this process cannot write): then an
  existing lock file is locked through a read-only descriptor, and a missing one (or a
  file system without flock) is skipped like a shared lock's.
* :func:`hold_dir` / :func:`dir_in_use`: a writer holds an exclusive flock on the open
  directory it is filling; a cleaner removes a directory only when it can take that flock
  itself (its writer is gone, e.g. killed).  The mark vanishes with the process.

Locks are per open file description: two ``flocked`` calls in one process on one file
conflict like two processes would (shared with shared is fine).
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import stat
import struct
import threading
from typing import Callable, Dict, Iterator, List, Optional, Union

from ..errors import StorageIOError
from . import failpoints as fp
from .regular import NotRegularFile

log = logging.getLogger("tqstore")

PathLike = Union[str, "os.PathLike[str]"]
LOCK_OPEN = "lock_open"
_UNWRITABLE = (errno.EACCES, errno.EPERM, errno.EROFS)
_NO_FLOCK = (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL)
_NOT_REGULAR = (errno.ELOOP, errno.ENXIO, errno.EISDIR)  # (open of a link, a socket, a directory)


def _open_lock_file(path: PathLike, *, shared: bool) -> Optional[int]:
    """The fd of the lock file at ``path`` (created if missing), or, with ``shared`` (a
    lock that may be skipped), a read-only fd of an existing one in a location this process
    cannot write, or None when it does not exist and cannot be created.  Never follows a
    symbolic link and never blocks on the open: a lock file beside a checkpoint or dump may
    be anyone's, and a link would have the lock's file created (or a store's own LOCK
    locked) elsewhere, a FIFO would block the open until a writer came.

    Raises:
        NotRegularFile: ``path`` is a symbolic link or not a regular file.
        OSError: any other failure to open it."""
    if fp.active:
        fp.hit(LOCK_OPEN)
        fp.observe(LOCK_OPEN, str(path))
    try:
        return _regular_lock(path, _open_unblocked(path, os.O_RDWR | os.O_CREAT))
    except OSError as e:
        if not shared or e.errno not in _UNWRITABLE:
            raise
    try:  # a read-only directory (or a lock file we may not write): flock works on a read-only fd
        return _regular_lock(path, _open_unblocked(path, os.O_RDONLY))
    except OSError as e:
        if e.errno in (errno.ENOENT,) + _UNWRITABLE:
            log.debug("cannot create lock file %s (%s); reading without the lock", path, e.strerror)
            return None
        raise


def _open_unblocked(path: PathLike, flags: int) -> int:
    """``open(path, flags)`` without following a link and without blocking on a FIFO
    (``O_NONBLOCK``); a regular file whose open would wait for a lease held elsewhere (an NFS
    delegation, a Samba oplock: ``EWOULDBLOCK`` under ``O_NONBLOCK``) is opened again
    without it, waiting as any open would (a FIFO never answers so).  NotRegularFile for a
    link, a socket or a directory there."""
    flags |= os.O_CLOEXEC | os.O_NOFOLLOW
    try:
        try:
            return os.open(path, flags | os.O_NONBLOCK, 0o644)
        except BlockingIOError:
            return os.open(path, flags, 0o644)
    except OSError as e:
        if e.errno in _NOT_REGULAR:
            raise NotRegularFile(e.errno, "a lock file must be a regular file (a symbolic link, socket or directory "
                                 "is there)", os.fspath(path)) from e
        raise


def _regular_lock(path: PathLike, fd: int) -> int:
    """``fd`` if it is a regular file's; else it is closed and NotRegularFile raised."""
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFile(errno.EINVAL, "a lock file must be a regular file (a FIFO, device or directory "
                                 "is there)", os.fspath(path))
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def flocked(path: PathLike, *, shared: bool = False, read_only_ok: bool = False) -> Iterator[bool]:
    """Hold an flock on the lock file ``path`` (blocking; when it must wait, an INFO record
    says so first) for the ``with`` body.

    Yields True when the lock is held, False when a shared lock (or an exclusive one with
    ``read_only_ok``) was skipped (see the module docstring).  Failpoint ``lock_open``.

    Raises:
        StorageIOError: a symbolic link, FIFO, socket, device or directory is where the lock
            file belongs (an OSError too).
        OSError: the lock file cannot be opened or locked (for a shared lock, or with
            ``read_only_ok``: for another reason than a read-only location or a file system
            without flock).
    """
    skippable = shared or read_only_ok
    try:
        fd = _open_lock_file(path, shared=skippable)
    except NotRegularFile as e:
        raise StorageIOError(f"cannot take the lock {os.fspath(path)}: {e.strerror}; only tqstore makes a file of "
                             f"that name: move away what is there") from e
    if fd is None:
        yield False
        return
    _HELD[fd] = threading.get_ident()
    try:
        try:
            _flock_waiting(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX, path)
        except OSError as e:
            # (EBADF: an exclusive flock through a read-only descriptor where flock is
            # emulated with POSIX locks, as on NFS)
            if not skippable or e.errno not in _NO_FLOCK + ((errno.EBADF,) if read_only_ok else ()):
                raise
            log.debug("cannot flock %s (%s); reading without the lock", path, e.strerror)
            yield False
            return
        yield True
    finally:
        _HELD.pop(fd, None)
        os.close(fd)


def _flock_waiting(fd: int, op: int, path: PathLike) -> None:
    """``flock(fd, op)``, blocking; when the lock is held elsewhere, one INFO record (and the
    listeners of :func:`telling_waits`) say what the call waits for first, so a caller that
    seems stuck behind another process's save, dump or load is not left guessing."""
    try:
        fcntl.flock(fd, op | fcntl.LOCK_NB)
        return
    except OSError as e:
        if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise
    note = (f"waiting for the lock {path}: another process or call holds it (a save, dump, load or prune of "
            f"that path in progress)")
    log.info("%s", note)
    for tell in list(_WAIT_LISTENERS):
        tell(note)
    fcntl.flock(fd, op)


_WAIT_LISTENERS: List[Callable[[str], None]] = []


@contextlib.contextmanager
def telling_waits(tell: Callable[[str], None]) -> Iterator[None]:
    """For the ``with`` body, call ``tell(note)`` whenever a :func:`flocked` lock must wait for
    another holder (the command-line tool writes the note to stderr)."""
    _WAIT_LISTENERS.append(tell)
    try:
        yield
    finally:
        _WAIT_LISTENERS.remove(tell)


def lock_exclusive_nowait(path: PathLike) -> int:
    """Open the lock file ``path`` (created if missing, never truncated) and take an exclusive
    flock on it without waiting; returns the descriptor, which holds the lock until
    :func:`unlock` (or the process's end).  The store's ``LOCK``.  Failpoint ``lock_open``.

    Raises:
        BlockingIOError: another open file description holds the lock.
        OSError: the lock file cannot be opened or locked.
    """
    fd = _open_lock_file(path, shared=False)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BaseException:
        os.close(fd)
        raise
    return fd


#: the byte of a store's ``LOCK`` on which a tqstore command (``inspect``, ``ls``, ``verify``,
#: ``compact``) holds a read lock (an open file description's) while it holds the file's flock:
#: an open that finds the flock taken waits for such a command instead of refusing (those locks
#: and flocks are independent on Linux; the mark goes with the command's descriptor)
CHECK_MARK_BYTE = 1
#: Linux's ``struct flock`` (l_type, l_whence, l_start, l_len, l_pid, with the C alignment and its tail)
_FLOCK = "hhqqi4x"
#: open file description locks (Linux 3.15+): the mark belongs to the descriptor that took it, so
#: closing another descriptor of the file in the same process does not drop it (a classic POSIX
#: lock went with any close of the file by its process: an open's failed attempt beside an
#: in-process command), and another descriptor of the same process sees it
_OFD_SETLK = getattr(fcntl, "F_OFD_SETLK", None)
_OFD_GETLK = getattr(fcntl, "F_OFD_GETLK", None)


def lock_for_check_nowait(path: PathLike) -> int:
    """:func:`lock_exclusive_nowait` for a tqstore command on the store whose ``LOCK`` is
    ``path``: the command's mark (:data:`CHECK_MARK_BYTE`) is taken first, shared (checks run side
    by side), so an open meeting the flock knows whom it waits for.  A file system without
    POSIX locks gives no mark, only the flock.  Raises as :func:`lock_exclusive_nowait`."""
    fd = _open_lock_file(path, shared=False)
    try:
        if _OFD_SETLK is not None:
            try:
                fcntl.fcntl(fd, _OFD_SETLK, struct.pack(_FLOCK, fcntl.F_RDLCK, os.SEEK_SET, CHECK_MARK_BYTE, 1, 0))
            except OSError as e:
                if e.errno not in _NO_FLOCK:
                    raise
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_mark_held(path: PathLike) -> bool:
    """True when a tqstore command holds the mark of the ``LOCK`` file ``path`` (through another
    descriptor: another process, or a command of this one); False when none does or it cannot
    be told.  Asks the kernel (``F_OFD_GETLK``: nothing is locked or released) for a lock
    conflicting with a write lock on the mark's byte, and counts only a read lock on exactly
    that byte: a whole-file lock (NFS emulates a store's flock with one) is no command's."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)  # (no O_CREAT: nothing is written)
    except OSError:
        return False
    try:
        if _OFD_GETLK is None:
            return False
        ask = struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, CHECK_MARK_BYTE, 1, 0)
        got = struct.unpack(_FLOCK, fcntl.fcntl(fd, _OFD_GETLK, ask))
    except OSError:
        return False
    finally:
        os.close(fd)
    kind, _whence, start, length, _pid = got
    return kind == fcntl.F_RDLCK and start == CHECK_MARK_BYTE and length == 1


def unlock(fd: int) -> None:
    """Release a lock taken by :func:`lock_exclusive_nowait` (closes its descriptor)."""
    os.close(fd)


def ensure_lock_file(path: PathLike) -> bool:
    """Create the (empty) lock file ``path`` if missing; False if the location is read-only.
    Failpoint ``lock_open``."""
    try:
        fd = _open_lock_file(path, shared=True)
    except OSError as e:
        log.debug("cannot create lock file %s: %s", path, e)
        return False
    if fd is None:
        return False
    os.close(fd)
    return True


def hold_dir(path: PathLike) -> Optional[int]:
    """Mark the directory ``path`` as in use by this writer: an exclusive flock on an fd of it,
    held until :func:`release_dir`.  None (and a DEBUG log) where directories cannot be flocked."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        log.debug("cannot mark %s as in use (%s)", path, e)
        return None
    _HELD[fd] = threading.get_ident()
    return fd


def release_dir(fd: Optional[int]) -> None:
    """Drop the mark of :func:`hold_dir` (None: nothing to drop)."""
    if fd is not None:
        _HELD.pop(fd, None)
        os.close(fd)


#: descriptors holding a :func:`flocked` lock or a :func:`hold_dir` mark -> the thread that holds it
_HELD: Dict[int, int] = {}


def _after_fork_in_child() -> None:
    """A forked child closes its copies of the descriptors other threads of the parent hold
    locks through: a flock belongs to the open file, which the child's copy kept alive, so a
    save's publication (or a cleaner) waited for the child to end.  The forking thread's own
    are kept (its ``with`` blocks go on in the child and close them)."""
    me = threading.get_ident()
    for fd, tid in list(_HELD.items()):
        if tid != me:
            try:
                os.close(fd)
            except OSError:
                pass
            del _HELD[fd]


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def dir_in_use(path: PathLike) -> bool:
    """True while another open file description (a writer of this or another process) holds
    the :func:`hold_dir` mark of ``path``; False when it is free, gone or cannot be flocked."""
    return _held_elsewhere(path, os.O_DIRECTORY)


def lock_in_use(path: PathLike) -> bool:
    """True while another open file description (a call of this or another process) holds
    the lock file ``path`` (:func:`flocked`); False when it is free, missing (nothing is
    created) or cannot be flocked."""
    return _held_elsewhere(path, 0)


def _held_elsewhere(path: PathLike, flags: int) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | flags)  # (a FIFO must not block)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        return e.errno in (errno.EWOULDBLOCK, errno.EAGAIN)
    finally:
        os.close(fd)
    return False
