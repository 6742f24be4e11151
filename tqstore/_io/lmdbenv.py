"""Opening LMDB environments with tqstore's settings and error wrapping."""
from __future__ import annotations

import contextlib
import errno
import logging
import mmap
import os
from pathlib import Path
from typing import Any, Dict, Iterator, Optional, Sequence

import lmdb

from .. import _native
from .._format import lmdb_pages
from .._format.lmdb_pages import LmdbPageError, PageFile, read_databases
from ..errors import CapacityError, CorruptionError, StorageIOError, TqstoreError
from . import failpoints as fp
from . import files
from .lmdbschema import check_schema

log = logging.getLogger("tqstore")

DEFAULT_MAP_BYTES = 1 << 36  # 64 GiB of address space; the file grows only as used


def open_env(path: Path, *, max_dbs: int = 16, sync: bool = False, map_bytes: int = DEFAULT_MAP_BYTES,
             readonly: bool = False, create: bool = True) -> lmdb.Environment:
    """Open (or create) an LMDB environment directory.

    ``sync=False`` (durability "checkpoint") commits to the page cache only: a committed
    transaction survives a process kill but not a power loss.

    Raises:
        StorageIOError: the environment cannot be opened (message names the path).
    """
    check_extent(Path(path) / "data.mdb")
    if create and not readonly:
        _allocate_lock_file(Path(path))
    try:
        return lmdb.open(str(path), map_size=map_bytes, max_dbs=max_dbs, subdir=True, sync=sync,
                         metasync=sync, readahead=False, max_readers=1024, lock=not readonly,
                         readonly=readonly, create=create and not readonly)
    except lmdb.Error as e:
        raise StorageIOError(f"cannot open LMDB index at {path}: {e}{_open_hint(str(e), map_bytes)}") from e


#: bytes of a new environment's lock file, allocated before LMDB maps it: LMDB sizes the file
#: with ftruncate and writes it through a shared mapping, so on a full file system its first
#: write ended the process with SIGBUS.  Above what LMDB asks for ``max_readers=1024``
#: (1023 reader slots of 64 bytes and a 128-byte header): LMDB keeps a larger file's size (its
#: reader table holds more slots).  (The file is made in place, not beside it and linked: a
#: sync walking the new environment's directory met the temporary file as it went.)
LOCK_FILE_BYTES = 128 << 10


def _allocate_lock_file(path: Path) -> None:
    """Create ``path``'s ``lock.mdb`` with :data:`LOCK_FILE_BYTES` allocated, when it does not
    exist yet (an existing one, perhaps mapped by another process, is never changed; where
    ``posix_fallocate`` is missing or fails otherwise, LMDB sizes the file, as before).  A new
    environment is made by one process (a store's, under its lock; a load's staged copy), so
    no other process maps the file between its creation and its allocation.

    Raises StorageIOError when the file system has no room for it (the empty file removed)."""
    lock = path / "lock.mdb"
    if os.path.lexists(lock) or not hasattr(os, "posix_fallocate"):
        return
    try:
        files.mkdir(path, exist_ok=True, parents=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    except FileExistsError:
        return  # (another process made it: LMDB sizes it, as it always did)
    except OSError as e:
        raise StorageIOError(f"cannot create LMDB index at {path}: {e}{_space_note(path)}") from e
    try:
        os.posix_fallocate(fd, 0, LOCK_FILE_BYTES)
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            log.debug("could not allocate %s ahead (%s): LMDB sizes it", lock, e)
            return
        with contextlib.suppress(OSError):
            files.unlink(lock)
        raise StorageIOError(f"cannot create LMDB index at {path}: no room for its lock file: {e}"
                             f"{_space_note(path)}") from e
    finally:
        os.close(fd)


def _open_hint(msg: str, map_bytes: int) -> str:
    """What to change when an index cannot be opened for want of a process resource."""
    if os.strerror(errno.ENOMEM) in msg:
        return (f" (its map of {map_bytes} bytes of address space could not be reserved: every index of a store "
                f"maps 'index_map_bytes', one per unit and one for the controller; lower that setting)")
    if os.strerror(errno.EMFILE) in msg or os.strerror(errno.ENFILE) in msg:
        return " (the process's open-file limit is reached: a store holds about 4 files per unit; raise 'ulimit -n')"
    return ""


def check_extent(data: Path) -> None:
    """CorruptionError when the LMDB data file ``data`` has no valid meta pages or is too
    short for the root pages they name (truncated: LMDB would end the process with SIGBUS
    at its first read); nothing when it does not exist yet (LMDB creates it).  A file cut
    elsewhere can still fail later, as before."""
    try:
        with open(data, "rb") as f:  # (the head first, then the size: a writer elsewhere only grows the file)
            head = f.read(lmdb_pages.HEAD_BYTES)
            size = os.fstat(f.fileno()).st_size
        if not head:
            return  # (created, never written: LMDB initialises it)
    except FileNotFoundError:
        return
    except OSError as e:
        raise StorageIOError(f"cannot read LMDB index {data}: {e}") from e
    try:
        lmdb_pages.check_extent(head, size)
    except lmdb_pages.LmdbPageError as e:
        raise CorruptionError(f"LMDB index is damaged or truncated ({e}): it cannot be opened safely",
                              path=str(data)) from None


@contextlib.contextmanager
def wrap_errors(what: str, path) -> Iterator[None]:
    """Turn lmdb errors and bare OS errors into tqstore errors naming ``what`` and ``path``."""
    try:
        yield
    except TqstoreError:
        raise
    except lmdb.MapFullError as e:
        raise CapacityError(f"{what}: LMDB index at {path} is full; raise the 'index_map_bytes' setting",
                            setting="index_map_bytes") from e
    except lmdb.Error as e:
        raise StorageIOError(f"{what}: LMDB error in {path}: {e}{_space_note(path)}") from e
    except OSError as e:
        raise StorageIOError(f"{what} failed in {path}: {e}{_space_note(path)}") from e


#: free bytes under which an I/O error's message says the file system is (nearly) full
LOW_SPACE_BYTES = 64 << 20


def _space_note(path) -> str:
    """``"; the file system ... is full"`` when the one holding ``path`` has less than
    :data:`LOW_SPACE_BYTES` free (LMDB reports a write cut short by a full disk as an
    "Input/output error", which reads as failing hardware), else ``""``."""
    try:
        st = os.statvfs(os.fspath(path))
    except (OSError, TypeError, ValueError):
        return ""
    free = st.f_bavail * st.f_frsize
    return f" (its file system has {free} bytes free: it may be full)" if free < LOW_SPACE_BYTES else ""


def lmdb_commit_point(name: str) -> None:
    """Failpoint before an LMDB commit (LMDB writes itself in C; crash tests kill here)."""
    if fp.active:
        fp.hit(name)
        fp.observe(name)


def put_items(cur, items, *, ascending: bool = False) -> None:
    """Put ``items`` (``(key, value)`` pairs) through cursor ``cur``; the database ends up the
    same either way.  ``ascending``: the keys are expected to ascend, so when the first lies
    above the database's last key they are appended (MDB_APPEND: no search per entry).  LMDB
    refuses an appended key that is not above the last one; then the plain put runs over all
    of ``items`` (the entries already appended are put again, unchanged)."""
    if ascending and items and (not cur.last() or cur.key() < items[0][0]) \
            and cur.putmulti(items, append=True)[1] == len(items):
        return
    cur.putmulti(items)


def sync_env(env: lmdb.Environment) -> None:
    """Flush the environment's committed transactions to disk (fsync), also when it was
    opened with ``sync=False``.  Failpoint ``lmdb_sync`` (observed with the directory).
    Raises ``lmdb.Error`` (the caller adds context)."""
    if fp.active:
        fp.hit("lmdb_sync")
        fp.observe("lmdb_sync", str(env.path()))
    env.sync(True)


@contextlib.contextmanager
def _mapped(path: str) -> Iterator[Optional[mmap.mmap]]:
    """A read-only map of this process of the file ``path`` (None when it is empty), closed
    after.  Raises OSError."""
    with open(path, "rb") as f:
        try:
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # an empty file
            mm = None
    try:
        yield mm
    finally:
        if mm is not None:
            try:
                mm.close()
            except BufferError:  # (a view still held by a traceback: closed when collected)
                pass


def read_columns(env: lmdb.Environment, txn: lmdb.Transaction, names: Sequence[bytes]) -> Optional[Dict[bytes, Any]]:
    """The entries of the named databases ``names`` as read transaction ``txn`` sees them,
    read in bulk from the data file's pages (:mod:`tqstore._format.lmdb_pages`; ``txn``
    keeps its pages from being reused meanwhile): ``{name: Columns}``, a missing database
    left out.  None when the file does not read that way (another layout, a later commit
    overwrote the transaction's meta page, the pure-Python build): the caller then iterates
    through lmdb.  Reads only."""
    if _native.IMPLEMENTATION != "native":
        return None
    path = os.path.join(env.path(), "data.mdb")
    try:
        with _mapped(path) as mm:
            return None if mm is None else read_databases(mm, list(names), txnid=txn.id())
    except OSError:
        return None
    except LmdbPageError as e:
        log.debug("%s: read through lmdb (%s)", path, e)
        return None


def copy_txn_compact(env: lmdb.Environment, dst: Path, txn: lmdb.Transaction) -> None:
    """Write a compacted copy of the open environment ``env`` as read transaction ``txn``
    sees it into the existing, empty directory ``dst`` (``dst/data.mdb``): a snapshot's
    index copy.  Failpoint ``copy`` (raised as the ``lmdb.Error`` LMDB's copy gives for that
    errno).  Raises ``lmdb.Error`` (the caller adds context)."""
    if fp.active:
        try:
            fp.hit("copy")
        except OSError as e:
            raise lmdb.Error(f"mdb_env_copy3: {e.strerror}") from e
        fp.observe("copy", str(env.path()), str(dst))
    env.copy(str(dst), compact=True, txn=txn)


def copy_env_compact(src: Path, dst: Path, *, max_dbs: int = 16) -> None:
    """Write a compacted copy of the LMDB environment ``src`` into the existing, empty
    directory ``dst`` (``dst/data.mdb``), reading ``src`` read-only without a lock file.

    Only the pages reachable from the main database are read (a walk that
    :mod:`tqstore._io.lmdbwalk` can do first, out of process) and the copy has no free
    pages, so a store writing into it never reads the source's free list.  Failpoint
    ``copy``.  Raises ``lmdb.Error`` (the caller adds context).
    """
    if fp.active:
        fp.hit("copy")
        fp.observe("copy", str(src), str(dst))
    env = lmdb.open(str(src), map_size=DEFAULT_MAP_BYTES, max_dbs=max_dbs, subdir=True, readonly=True, lock=False,
                    readahead=False, create=False)
    try:
        env.copy(str(dst), compact=True)
    finally:
        env.close()


def copy_env_file(src: Path, dst: Path) -> bool:
    """Copy the data file of the LMDB environment ``src`` into the existing, empty directory
    ``dst`` byte for byte (kernel-side, not fsynced) when its current meta page records an
    empty free list, and answer True; else copy nothing and answer False.

    Every compacted copy has an empty free list, so every index file a checkpoint holds
    copies this way, as it would by :func:`copy_env_compact` but without walking and rewriting
    it: the copy has no free page either.  Only the file's two meta pages are read (a read-only
    map of this process, never LMDB's), so this may run before an out-of-process walk of
    ``src`` has ended.  Failpoint ``copy`` (in :func:`files.copy_file`).  Raises OSError."""
    path = os.path.join(src, "data.mdb")
    try:
        with _mapped(path) as mm:
            empty = mm is not None and PageFile(mm).free_list_empty
    except LmdbPageError as e:
        log.debug("%s: copied through LMDB (%s)", path, e)
        return False
    if not empty:
        return False
    files.copy_file(path, os.path.join(dst, "data.mdb"), fsync=False)
    return True


def check_env_pages(env_dir: Path, schema: Optional[str] = None) -> int:
    """Read every page LMDB can reach in the data file of ``env_dir`` with the checked page
    reader (:mod:`tqstore._format.lmdb_pages`; this process's own read-only map, never
    LMDB's): the current meta page, an empty free list, the main database and every named
    database, each page once, every node and overflow page inside the file.  With
    ``schema`` (``"unit_index"`` or ``"controller"``), every entry is also checked as the
    out-of-process walk checks it (:mod:`tqstore._io.lmdbschema`).  A file that passes can
    be opened by LMDB in this process without an out-of-process walk first: LMDB reads no
    page that was not checked (writes take new pages past the last one, the free list being
    empty).  Returns the entries of the named databases.  Raises LmdbPageError (a database
    with sorted duplicates included: this reader does not read those; SchemaMismatch, its
    subclass, for an entry the schema does not allow), OSError."""
    with _mapped(os.path.join(env_dir, "data.mdb")) as mm:
        if mm is None:
            raise LmdbPageError("an empty file")
        pf = PageFile(mm)
        if not pf.free_list_empty:
            raise LmdbPageError("the free list is not empty")
        try:
            dbs = pf.databases()
            if schema is not None:
                return check_schema(pf, dbs, schema)
            return sum(len(pf.columns(db)) for db in dbs.values())
        except IndexError as e:  # a gather past the end of the file
            raise LmdbPageError(f"an offset past the end of the file ({e})") from None


def copy_env(src: Path, dst: Path) -> None:
    """A copy of the LMDB environment ``src`` with no free page in the existing, empty
    directory ``dst``: its bytes (:func:`copy_env_file`) or, when its free list is not empty,
    a compacted copy (:func:`copy_env_compact`: ``src`` must have been walked).  Not fsynced.
    Raises OSError, ``lmdb.Error``."""
    if not copy_env_file(src, dst):
        copy_env_compact(src, dst)


def warm_file(path: Path, *, chunk_bytes: int = 8 << 20) -> int:
    """Read the file ``path`` once, front to back, so that its pages are in the page cache
    before a walk of its environment faults them in one at a time (environments are opened
    with ``readahead=False``, and a compacted copy LMDB writes goes around the page cache:
    the first walk of a just staged index would read it 4 KiB at a time).  Returns bytes
    read (0 when it does not exist).  Reads only.  Raises OSError."""
    try:
        fd = os.open(str(path), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return 0
    try:
        buf = bytearray(chunk_bytes)
        done = 0
        while True:
            n = os.readv(fd, [buf])
            done += n
            if n < len(buf):
                return done
    finally:
        os.close(fd)


def prefixed(txn: Any, db: Any, prefix: bytes) -> Iterator[tuple]:
    """``(key, value)`` of every entry of ``db`` whose key starts with ``prefix``, in key order
    (keys as bytes; values as the cursor gives them).  Do not write ``db`` while iterating."""
    cur = txn.cursor(db)
    if cur.set_range(prefix):
        for k, v in cur:
            k = bytes(k)
            if not k.startswith(prefix):
                break
            yield k, v
