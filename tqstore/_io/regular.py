"""Opening files that must be regular files, read-only, without following links or blocking
(a checkpoint or dump from anywhere: its files are checked before a byte is read).
Re-exported by :mod:`tqstore._io.files`."""
from __future__ import annotations

import errno
import fcntl
import os
import stat
from typing import Optional, Sequence, Union

PathLike = Union[str, "os.PathLike[str]"]


class NotRegularFile(OSError):
    """:func:`open_regular` refused a path: a symbolic link, a FIFO, a device, a socket or a
    directory where a regular file belongs, or a component between ``under`` and the file
    that is not a real directory (``filename`` names the offending path)."""


_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def open_regular(path: PathLike, *, under: Optional[PathLike] = None) -> int:
    """Open ``path`` read-only, only if it is a regular file; returns the descriptor.

    Never blocks and never follows a symbolic link: the file is opened with ``O_NOFOLLOW |
    O_NONBLOCK`` (a FIFO or a device opens at once and is then refused by ``fstat``; the
    flag is cleared before the descriptor is returned).  With ``under`` (an ancestor
    directory of ``path``, itself followed as given), every directory between ``under``
    and the file is opened relative to its parent with ``O_NOFOLLOW | O_DIRECTORY``, so a
    symbolic link or a non-directory anywhere inside ``under`` is refused too, without a
    race between checking and opening.

    Raises:
        FileNotFoundError: ``path`` (or a directory on the way) does not exist.
        NotRegularFile: a symbolic link, a non-regular file, or a component that is not a
            real directory.
        OSError: any other failure of ``open`` or ``fstat``.
    """
    path = os.fspath(path)
    if under is None:
        parts = [path]
        dfd = None
    else:
        rel = os.path.relpath(path, os.fspath(under))
        parts = rel.split(os.sep)
        if rel.startswith(".." + os.sep) or rel == ".." or any(p in ("", ".", "..") for p in parts):
            raise NotRegularFile(errno.EINVAL, f"not a path inside {os.fspath(under)}", path)
        dfd = os.open(os.fspath(under), os.O_RDONLY | os.O_DIRECTORY | _O_CLOEXEC)
    try:
        where = os.fspath(under) if under is not None else ""
        for comp in parts[:-1]:
            where = os.path.join(where, comp)
            try:
                nfd = os.open(comp, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _O_CLOEXEC, dir_fd=dfd)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise NotRegularFile(e.errno, "not a real directory (a symbolic link or a file)", where) from e
                raise
            if dfd is not None:
                os.close(dfd)
            dfd = nfd
        try:
            fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | _O_CLOEXEC, dir_fd=dfd)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENXIO, errno.ENOTDIR):
                raise NotRegularFile(e.errno, "not a regular file (a symbolic link, socket or device)", path) from e
            raise
    finally:
        if dfd is not None:
            os.close(dfd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(errno.EINVAL, f"not a regular file ({_kind_of(st.st_mode)})", path)
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_regular(path: PathLike, *, under: Optional[PathLike] = None) -> os.stat_result:
    """:func:`open_regular`, ``fstat`` and close: the file's stat, with the same refusals."""
    fd = open_regular(path, under=under)
    try:
        return os.fstat(fd)
    finally:
        os.close(fd)


PREFETCH_CHUNK = 2 << 20  # bytes asked for per posix_fadvise(WILLNEED) call (the kernel reads at most its
#: readahead window or its largest request per call: a smaller window reads only part of each chunk)


def prefetch(path: PathLike, ranges: Sequence, *, under: Optional[PathLike] = None) -> None:
    """Ask the kernel to start reading the byte ``ranges`` (``(offset, length)`` pairs) of the
    regular file ``path`` into the page cache (``posix_fadvise(WILLNEED)``), so that a later
    read finds them there.  A hint: changes nothing durable, and any error (a missing file, a
    platform without it) is ignored."""
    if not hasattr(os, "posix_fadvise"):
        return
    try:
        fd = open_regular(path, under=under)
    except OSError:
        return
    try:
        for off, n in ranges:
            # one call per chunk: the kernel reads at most its readahead window per call
            for at in range(int(off), int(off) + int(n), PREFETCH_CHUNK):
                os.posix_fadvise(fd, at, min(PREFETCH_CHUNK, int(off) + int(n) - at), os.POSIX_FADV_WILLNEED)
    except OSError:
        pass
    finally:
        os.close(fd)


def _kind_of(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character "
                       "device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return name
    return f"mode {mode:#o}"


__all__ = ["NotRegularFile", "open_regular", "check_regular", "prefetch"]
