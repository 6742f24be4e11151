"""Every durable file-system operation of tqstore, each behind a named failpoint.

Policy (what to fsync when) is the caller's; this module only performs the step and
reports it to the failpoint layer, so a test can fail or crash any single step.
Errors are raised as ``OSError`` here; the engine wraps them with context.
"""
from __future__ import annotations

import errno
import logging
import os
import secrets
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Any, Iterator, List, NamedTuple, Optional, Sequence, Union

from .. import _native
from . import failpoints as fp
from .regular import NotRegularFile, check_regular, open_regular, prefetch  # noqa: F401 - re-exported

log = logging.getLogger("tqstore")

PathLike = Union[str, "os.PathLike[str]"]
IOV_MAX = min(os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024, 1024)


def _fp(name: str, *args) -> None:
    if fp.active:
        fp.hit(name)
        fp.observe(name, *args)


def _advance(views: List[memoryview], i: int, n: int) -> int:
    """After a vectored transfer of ``n`` bytes starting at ``views[i]``: skip the views done
    in full, trim a partly done one in place, and return the index of the first view left."""
    while n > 0 and i < len(views):
        if n >= views[i].nbytes:
            n -= views[i].nbytes
            i += 1
        else:
            views[i] = views[i][n:]
            n = 0
    return i


def pwrite_all(fd: int, buffers: Sequence, offset: int) -> int:
    """Write ``buffers`` back to back at ``offset`` (handles partial writes and IOV_MAX).

    Returns bytes written. Failpoint ``write`` (``short`` writes half the data then raises EIO).
    The views it makes of ``buffers`` are released when it returns or raises (an error's
    traceback then pins no mapping a buffer views).
    """
    views = [memoryview(b).cast("B") for b in buffers]
    try:
        return _pwrite_views(fd, [v for v in views if v.nbytes], offset)
    finally:
        for v in views:
            v.release()


def _pwrite_views(fd: int, views: List[memoryview], offset: int) -> int:
    total = sum(v.nbytes for v in views)
    if fp.active:
        try:
            fp.hit("write")
        except fp.ShortWrite:
            half = total // 2
            done = 0
            for v in views:
                if done >= half:
                    break
                n = min(v.nbytes, half - done)
                os.pwrite(fd, v[:n], offset + done)
                done += n
            raise OSError(errno.EIO, "injected short write")
        fp.observe("write", fd, offset, total)
    pos = offset
    i = 0
    while i < len(views):
        chunk = views[i:i + IOV_MAX]
        n = os.pwritev(fd, chunk, pos)
        pos += n
        i = _advance(views, i, n)
    return total


def preadv_all(fd: int, buffers: Sequence, offset: int) -> int:
    """Fill ``buffers`` back to back from ``offset`` (handles short reads and IOV_MAX).

    Returns bytes read: less than the buffers hold only when the file ends first.
    """
    views = [memoryview(b).cast("B") for b in buffers]
    views = [v for v in views if v.nbytes]
    pos = offset
    done = 0
    i = 0
    while i < len(views):
        n = os.preadv(fd, views[i:i + IOV_MAX], pos)
        if n == 0:
            break
        pos += n
        done += n
        i = _advance(views, i, n)
    return done


def read_ranges(fd: int, offsets, lengths, buf) -> int:
    """Read the byte ranges ``offsets[i], lengths[i]`` (i64 arrays) of the open file ``fd``
    back to back into ``buf`` (one ``pread`` per range, in native code without the GIL:
    ``_native.pread_ranges``).  Returns bytes read: less than the ranges hold only when the
    file ends first.  Reads only."""
    return _native.pread_ranges(fd, offsets, lengths, buf)


def start_writeback(fd: int, offset: int, nbytes: int) -> None:
    """Ask the kernel to start writing the dirty pages of ``[offset, offset + nbytes)`` of
    ``fd`` to disk now (``posix_fadvise(DONTNEED)`` starts the writeback without waiting for
    it and drops what is already clean), so that a later fsync finds little left to write.
    A hint: durability still comes from the fsync; changes nothing a crash could observe;
    errors are ignored."""
    if nbytes > 0 and hasattr(os, "posix_fadvise"):
        try:
            os.posix_fadvise(fd, int(offset), int(nbytes), os.POSIX_FADV_DONTNEED)
        except OSError:
            pass


# (st_dev, st_ino) of files whose fsync failed in this process: their dirty pages may be
# lost although the page cache still shows them, and a second fsync would report success
# (PostgreSQL's "fsyncgate").  Callers never fsync such a file again to make data durable:
# they write the data into a new file instead (see :func:`fsync_failed`).
_fsync_failed: set = set()


def _note_fsync_failure(fd: int) -> None:
    try:
        st = os.fstat(fd)
    except OSError:
        return
    _fsync_failed.add((st.st_dev, st.st_ino))


def fsync_failed(path: PathLike) -> bool:
    """True if an fsync of the file at ``path`` (the same inode) failed in this process:
    do not link it and fsync it again as if that made it durable; copy its bytes instead."""
    if not _fsync_failed:
        return False
    try:
        st = os.stat(path)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) in _fsync_failed


def fsync_fd(fd: int, label: str = "") -> None:
    """fsync an open file. Failpoint ``fsync_file``. Never retry on failure (caller abandons);
    a failure is remembered for :func:`fsync_failed`."""
    try:
        _fp("fsync_file", fd, label)
        os.fsync(fd)
    except OSError:
        _note_fsync_failure(fd)
        raise


def fsync_file(path: PathLike) -> None:
    """fsync the file at ``path``. Failpoint ``fsync_file``; a failure is remembered for
    :func:`fsync_failed`."""
    fd = os.open(path, os.O_RDONLY)
    try:
        _fp("fsync_file", fd, str(path))
        os.fsync(fd)
    except OSError:
        _note_fsync_failure(fd)
        raise
    finally:
        os.close(fd)


def fsync_dir(path: PathLike) -> None:
    """fsync a directory so its entries (creates, renames, unlinks) are durable. Failpoint ``fsync_dir``."""
    _fp("fsync_dir", str(path))
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file(path: PathLike, data: bytes, *, fsync: bool = True, new: bool = False) -> None:
    """Create or truncate ``path`` and write ``data``; fsync it when asked.  ``new``: the
    file must not exist (``O_EXCL``).  Never through a symbolic link (``O_NOFOLLOW``: one
    there raises OSError ``ELOOP``; with ``new`` any file there raises ``EEXIST``).
    Failpoints ``create``, ``write``, ``fsync_file``."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_EXCL if new else os.O_TRUNC)
    fd = os.open(path, flags, 0o644)
    try:
        _fp("create", str(path))
        pwrite_all(fd, [data], 0)
        if fsync:
            fsync_fd(fd, str(path))
    finally:
        os.close(fd)


class Ranges(NamedTuple):
    """Byte ranges of one buffer (``offsets``, ``lengths``: i64 arrays), an item of
    :func:`write_buffers` written back to back without a view per range: a dump shard's
    frames, straight from the mapped segment."""

    src: Any
    offsets: Any
    lengths: Any

    def views(self, made: List[memoryview]) -> List[memoryview]:
        """One view of ``src`` per range (the slow path: failpoints active); every view made
        is appended to ``made`` too, for the caller to release."""
        m = memoryview(self.src).cast("B")
        made.append(m)
        out = [m[o:o + n] for o, n in zip(self.offsets.tolist(), self.lengths.tolist()) if n]
        made.extend(out)
        return out


def write_buffers(path: PathLike, buffers: Sequence, *, fsync: bool = True, writeback_bytes: int = 0) -> int:
    """Create the new file ``path`` (it must not exist) and write ``buffers`` back to back
    with vectored writes (no copy into one buffer: they may be views of mapped segments);
    fsync it when asked.  A :class:`Ranges` item writes its ranges with one native call
    without the GIL (``_native.pwrite_ranges``).  ``writeback_bytes`` > 0: the buffers go in
    groups of about that many bytes, and the writeback of each group is started as soon as
    it is written (:func:`start_writeback`; a :class:`Ranges` item every that many bytes of
    it), so the disk works while the rest is written and the fsync that makes the file
    durable finds little left to do (a hint: what a crash can leave is the same).  Returns
    bytes written.  Failpoints ``create``, ``write`` (once per group; with failpoints active
    a :class:`Ranges` item is written as views of its ranges, grouped as other buffers),
    ``fsync_file``."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    made: List[memoryview] = []  # (released however this ends: a traceback must not pin a mapping)
    try:
        _fp("create", str(path))
        if fp.active:
            buffers = [v for b in buffers for v in (b.views(made) if isinstance(b, Ranges) else (b,))]
        n = 0
        for group in _groups(buffers, writeback_bytes):
            if isinstance(group, Ranges):
                done = _native.pwrite_ranges(fd, group.src, group.offsets, group.lengths, n, max(0, writeback_bytes))
            else:
                done = pwrite_all(fd, group, n)
                if writeback_bytes > 0:
                    start_writeback(fd, n, done)
            n += done
        if not buffers:
            pwrite_all(fd, [], 0)  # (an empty file still passes the ``write`` failpoint once)
        if fsync:
            fsync_fd(fd, str(path))
        return n
    finally:
        for v in reversed(made):
            v.release()
        os.close(fd)


def _groups(buffers: Sequence, nbytes: int) -> Iterator[Any]:
    """``buffers`` in order, in consecutive groups (lists) of at least ``nbytes`` bytes (the
    last may hold less; a buffer is never split; ``nbytes`` <= 0: no limit); a
    :class:`Ranges` item is yielded alone, as it is."""
    group: List = []
    size = 0
    for b in buffers:
        if isinstance(b, Ranges):
            if group:
                yield group
                group, size = [], 0
            yield b
            continue
        group.append(b)
        size += memoryview(b).nbytes
        if nbytes > 0 and size >= nbytes:
            yield group
            group, size = [], 0
    if group:
        yield group


def write_file_atomic(path: PathLike, data: bytes, *, fsync: bool = True) -> None:
    """Replace ``path`` with ``data`` atomically: temp sibling, fsync, rename, fsync parent.

    After a crash the file holds either the old or the new content, never a mix.  A write
    that fails removes its temp sibling.  Whatever was at ``<name>.tmp`` (a crash's leftover,
    or a link or FIFO someone put there) is removed first and the temp file made new: a
    write never goes through a link to another file, nor blocks on a FIFO.  Failpoints
    ``unlink``, ``create``, ``write``, ``fsync_file``, ``rename``, ``fsync_dir``.
    """
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    unlink(tmp)
    try:
        write_file(tmp, data, fsync=fsync, new=True)
    except BaseException:
        _drop_tmp(tmp)
        raise
    rename(tmp, path)
    if fsync:
        fsync_dir(path.parent)


def write_buffers_atomic(path: PathLike, buffers: Sequence, *, fsync: bool = True) -> int:
    """Replace ``path`` with ``buffers`` written back to back, atomically: ``<name>.tmp``
    (one a crash left is removed first), fsync, rename over ``path``, fsync of the
    directory.  After a crash ``path`` holds the old or the new content, never a mix; a
    write that fails removes ``<name>.tmp``.  Returns bytes written.  Failpoints ``unlink``, ``create``, ``write``, ``fsync_file``,
    ``rename``, ``fsync_dir``."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    unlink(tmp)
    try:
        n = write_buffers(tmp, buffers, fsync=fsync)
    except BaseException:
        _drop_tmp(tmp)
        raise
    rename(tmp, path)
    if fsync:
        fsync_dir(path.parent)
    return n


def _drop_tmp(tmp: Path) -> None:
    """Remove the temporary file of a replacement that failed before its rename (best effort:
    on a full disk it would hold the space the failure lacked; one left is removed by the
    next replacement of the same file)."""
    try:
        unlink(tmp)
    except OSError:
        pass


def read_regular(path: PathLike, *, max_bytes: int) -> Optional[bytearray]:
    """The whole content of the regular file ``path`` read into one new buffer (no copy
    after the read); None when it does not exist or holds more than ``max_bytes``.
    Raises NotRegularFile (a symbolic link, a device, a FIFO), OSError."""
    try:
        fd = open_regular(path)
    except FileNotFoundError:
        return None
    try:
        size = os.fstat(fd).st_size
        if size > max_bytes:
            return None
        buf = bytearray(size)
        n = preadv_all(fd, [buf], 0)
        return buf if n == size else buf[:n]
    finally:
        os.close(fd)


def rename(src: PathLike, dst: PathLike) -> None:
    """Atomic rename (replaces ``dst`` if it is a file or empty dir). Failpoint ``rename``."""
    _fp("rename", str(src), str(dst))
    os.rename(src, dst)


def link(src: PathLike, dst: PathLike) -> None:
    """Hard link ``dst`` to ``src``. Failpoint ``link``."""
    _fp("link", str(src), str(dst))
    os.link(src, dst)


def unlink(path: PathLike, *, missing_ok: bool = True) -> None:
    """Remove a file. Failpoint ``unlink``."""
    _fp("unlink", str(path))
    try:
        os.unlink(path)
    except FileNotFoundError:
        if not missing_ok:
            raise


def mkdir(path: PathLike, *, exist_ok: bool = False, parents: bool = False) -> None:
    """Create a directory. Failpoint ``mkdir``."""
    _fp("mkdir", str(path))
    Path(path).mkdir(parents=parents, exist_ok=exist_ok)


def rmtree(path: PathLike, *, ignore_errors: bool = False) -> None:
    """Remove a directory tree if it exists. Failpoint ``rmtree``.

    ``ignore_errors``: best-effort cleanup; an ``OSError`` (an injected one included) is
    swallowed, as with ``shutil.rmtree(path, ignore_errors=True)``."""
    try:
        _fp("rmtree", str(path))
        shutil.rmtree(path, ignore_errors=False) if os.path.exists(path) else None
    except OSError:
        if not ignore_errors:
            raise


def make_temp_dir(prefix: str) -> Path:
    """A new private directory (mode 0700) in the system's temporary directory, as
    ``tempfile.mkdtemp(prefix=prefix)`` makes it. Failpoint ``mkdir``."""
    _fp("mkdir", os.path.join(tempfile.gettempdir(), prefix + "*"))
    return Path(tempfile.mkdtemp(prefix=prefix))


def truncate(path: PathLike, size: int) -> None:
    """Truncate a file to ``size`` bytes. Failpoint ``truncate``."""
    _fp("truncate", str(path), size)
    os.truncate(path, size)


def ftruncate(fd: int, size: int, path: PathLike) -> None:
    """Truncate the open file ``fd`` (at ``path``, for the failpoint's observer) to ``size``
    bytes. Failpoint ``truncate``."""
    _fp("truncate", str(path), size)
    os.ftruncate(fd, size)



def copy_file(src: PathLike, dst: PathLike, *, fsync: bool = True, chunk_bytes: int = 64 << 20,
              length: Optional[int] = None) -> int:
    """Copy ``src`` (its first ``length`` bytes when given) to a new file ``dst`` with
    copy_file_range (kernel-side), falling back to read/write. fsyncs ``dst`` when asked.
    Failpoints ``copy`` and ``fsync_file``. Returns bytes copied (less than ``length`` only
    if ``src`` is shorter).
    """
    _fp("copy", str(src), str(dst))
    sfd = os.open(src, os.O_RDONLY)
    try:
        dfd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            size = os.fstat(sfd).st_size
            if length is not None:
                size = min(size, int(length))
            done = 0
            use_cfr = hasattr(os, "copy_file_range")
            while done < size:
                n = 0
                if use_cfr:
                    try:
                        n = os.copy_file_range(sfd, dfd, min(chunk_bytes, size - done), done, done)
                    except OSError as e:
                        if e.errno not in (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
                            raise
                        use_cfr = False
                        continue
                else:
                    data = os.pread(sfd, min(chunk_bytes, size - done), done)
                    n = os.pwrite(dfd, data, done) if data else 0
                if n == 0:
                    break
                done += n
            if fsync:
                fsync_fd(dfd, str(dst))
            return done
        finally:
            os.close(dfd)
    finally:
        os.close(sfd)


class PublishedNotDurable(OSError):
    """:func:`publish_dir` put the new directory in place, then the fsync that makes the
    rename durable failed: ``final`` holds the new directory now, and after a crash it may
    hold the previous one again (each whole, never a mix)."""


def publish_dir(tmp: PathLike, final: PathLike) -> None:
    """Make the complete, fsynced directory ``tmp`` visible as ``final``: the one publish step.

    ``final`` absent: rename ``tmp`` to ``final``, fsync the parent.  ``final`` present: it
    is renamed to ``<final>.old`` first (parent fsynced), then ``tmp`` takes its place
    (parent fsynced), then ``<final>.old`` is removed.  ``tmp`` and ``final`` must share a
    parent.  At every crash point a reader finds the previous or the new directory: the
    new one at ``final``, or (only between the two renames) the previous one at
    ``<final>.old`` with ``final`` missing.  A stale ``<final>.old`` next to an existing
    ``final`` is garbage and is removed here.  Failpoints ``rename``, ``fsync_dir``, ``rmtree``.

    Raises OSError; :class:`PublishedNotDurable` when ``tmp`` is at ``final`` already and only
    the fsync that makes it durable failed.
    """
    tmp, final = Path(tmp), Path(final)
    parent = final.parent
    old = final.with_name(final.name + ".old")
    if os.path.lexists(final):
        if os.path.lexists(old):
            rmtree(old)
        rename(final, old)
        fsync_dir(parent)
    rename(tmp, final)
    try:
        fsync_dir(parent)
    except OSError as e:
        raise PublishedNotDurable(e.errno, f"{e.strerror or e} (making {final} durable, once the new directory was "
                                           f"in place)", str(parent)) from e
    if os.path.lexists(old):
        try:
            rmtree(old)
        except OSError:
            pass  # published; a stale <final>.old is removed by the next publish to ``final``


#: the errnos of a hard link the file system or mount refuses (copy instead)
LINK_REFUSED = frozenset({errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP})


def can_link(a: PathLike, b: PathLike) -> bool:
    """True if a hard link from the file ``a`` (or a regular file in the directory ``a``)
    into the directory ``b`` works: one file system and one mount of it, tried with a probe
    link in ``b`` removed at once (two bind mounts of one file system share ``st_dev`` but
    refuse links: EXDEV).  False when either path is missing: the caller copies.  Raises
    OSError when the probe fails otherwise (an I/O error: the caller's own step fails)."""
    try:
        if os.stat(a).st_dev != os.stat(b).st_dev:
            return False
        src = os.fspath(a)
        if stat.S_ISDIR(os.stat(src).st_mode):
            with os.scandir(src) as it:
                src = next((e.path for e in it if e.is_file(follow_symlinks=False)), None)
            if src is None:  # nothing to link from there: nothing will be linked
                return True
    except OSError:
        return False
    probe = os.path.join(os.fspath(b), f".tqstore-link-probe-{secrets.token_hex(4)}")
    try:
        link(src, probe)
    except FileNotFoundError:
        return False
    except OSError as e:
        if e.errno not in LINK_REFUSED:
            raise
        log.debug("no hard links from %s into %s (%s): copying instead", a, b, e)
        return False
    unlink(probe)
    return True


#: Files :func:`fsync_tree` leaves alone: an LMDB environment's lock file holds no data (LMDB
#: sets it up again whenever no process has the environment open), and it appears when the
#: environment is opened, perhaps by another thread during the walk: syncing it would only make
#: the walk's I/O depend on that timing.
UNSYNCED_NAMES = frozenset({"lock.mdb"})


def fsync_tree(root: PathLike) -> None:
    """fsync every file and directory under ``root`` (directories after their contents),
    except the LMDB lock files of :data:`UNSYNCED_NAMES`."""
    for dirpath, dirnames, filenames in os.walk(root, topdown=False):
        for name in filenames:
            if name not in UNSYNCED_NAMES:
                fsync_file(os.path.join(dirpath, name))
        fsync_dir(dirpath)


def listdir(path: PathLike) -> List[str]:
    try:
        return sorted(os.listdir(path))
    except FileNotFoundError:
        return []
