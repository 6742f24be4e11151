"""Where a dump lives and how it is published and repaired (docs/FORMAT.md, "Writing and
publication"): the sibling files of ``<dir>``, the exclusive lock every call on the path
holds, the repair of an interrupted publication, the restore marker.

Siblings of a dump directory ``<dir>``:

* ``<dir>.lock``: the lock file (``flock``, exclusive, across processes; created if
  missing, never removed).  Every dump, load and ``read_row_index`` of ``<dir>`` holds it
  (:func:`locked`), so calls on one path never interleave.
* ``<dir>.tmp``: the dump being written (an unfinished one after a crash).
* ``<dir>.old``: the previous dump during publication.
* ``<dir>.restore``: created by ``load_data_by_key`` while a load may still read ``<dir>``
  (:func:`marker_path`); a dump refuses to replace ``<dir>`` while it exists.

:func:`repair` (caller holds the lock) brings the path back to "the last published dump, or
nothing": a leftover ``.tmp`` is removed, a lone ``.old`` renamed back, a stale ``.old``
beside ``<dir>`` removed; a directory of those names that no dump writer left is never
touched (a dump refuses to go on beside it).  Every step goes through :mod:`tqstore._io.files` (failpoints).
"""
from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import socket
from pathlib import Path
from typing import Any, Dict, Iterator, Optional, Set, Tuple

from .._format import dump_records as DR
from .._io import files, locks
from ..checkpoint import target as T
from ..errors import CheckpointError, RestorePendingError
from ..layout_dirs import STORE_FILE

log = logging.getLogger("tqstore")

PathLike = Any
SUFFIXES = (".tmp", ".old", ".lock", ".restore")


def resolve(path: PathLike) -> Path:
    """The dump directory's real path (symlinks resolved), its name checked.

    Raises CheckpointError: an empty name, ``.``/``..``, or one ending in a sibling's suffix;
    InvalidInputError: not a path (:func:`tqstore.checkpoint.target.real_path`)."""
    real = T.real_path(path)
    if real.name in ("", ".", "..") or real.name.endswith(SUFFIXES):
        raise CheckpointError(f"{os.fspath(path)} is not a usable dump directory name (it must not end in "
                              f"{', '.join(SUFFIXES)}: tqstore uses those names beside a dump)")
    return real


#: the longest file name a dump's siblings need beside ``<dir>``: the restore marker's
#: temporary file ``<dir>.restore.tmp`` (:func:`mark`), within the usual 255-byte limit
NAME_MAX_BYTES = 255
LONGEST_SUFFIX = ".restore.tmp"


def check_name_fits(final: Path) -> None:
    """Raise CheckpointError when ``final``'s name leaves no room for its siblings' names (a
    dump written under it could not be loaded: the load's marker needs the longest name).
    Checked by dumps and loads before anything is written; a read needs no sibling but the
    lock and does not check."""
    n = len(os.fsencode(final.name))
    most = NAME_MAX_BYTES - len(LONGEST_SUFFIX)
    if n > most:
        raise CheckpointError(f"dump directory name {final.name[:40]!r}... has {n} bytes; tqstore writes "
                              f"'<name>{LONGEST_SUFFIX}' beside a dump, so the name may hold at most {most} bytes; "
                              f"choose a shorter one (nothing was written)")


def sibling(final: Path, suffix: str) -> Path:
    return final.with_name(final.name + suffix)


def lock_path(final: Path) -> Path:
    """``<dir>.lock``."""
    return sibling(final, ".lock")


def marker_path(final: PathLike) -> Path:
    """``<dir>.restore``: the marker a load creates while it may read the dump."""
    return sibling(resolve(final), ".restore")


def check_target(path: PathLike, *, live_store: Optional[PathLike] = None, unlocked: bool = False) -> Path:
    """:func:`tqstore.checkpoint.target.check_target` for a dump: ``path`` is missing, an empty
    directory or a dump, and not inside a store, checkpoint, generation root or dump (nor
    holding the live store), its name short enough for its siblings (:func:`check_name_fits`).
    ``unlocked``: the caller does not hold the path's lock, so a refusal is checked again under
    it (:func:`~tqstore.checkpoint.target.check_target_settled`; never while holding it: the
    shared lock would wait for the caller's own).  Returns the resolved path.  Raises
    CheckpointError."""
    final = resolve(path)
    check_name_fits(final)
    if unlocked:
        T.check_target_settled(final, T.DUMP, live_store=live_store, lock=lock_path(final))
    else:
        T.check_target(final, T.DUMP, live_store=live_store)
    return final


def _stale_entry(listed: Set[str], hosts: Dict[str, str], store_root: PathLike) -> Set[str]:
    """The entries of ``listed`` naming the store at ``store_root`` that were written on this
    host (``hosts``; an entry of an earlier version, or of a store at the same path on another
    machine sharing the dump's file system, is not this store's to judge)."""
    here = this_host()
    return {s for s in _listing(listed, store_root) if hosts.get(s) == here}


def _gone_entries(listed: Set[str], hosts: Dict[str, str]) -> Set[str]:
    """The entries of ``listed`` written on this host that name no store any more (no
    ``STORE.json`` there: the store was deleted, and its pending restore with it)."""
    here = this_host()
    return {s for s in listed if hosts.get(s) == here and os.path.isabs(s)
            and not os.path.lexists(os.path.join(s, STORE_FILE))}


def take_off_stale(final: Path, store_root: PathLike, store_has_restore: bool) -> None:
    """Under the dump's lock, before a dump by the store at ``store_root``: when
    ``<dir>.restore`` lists that store (an entry written on this host) and it has no restore
    of the dump (``store_has_restore`` False), the entry was left by a load that died after
    its restore was settled or before it began (a kill): no load of the store reads the dump
    (its loads hold the lock for their whole run), so the entry is taken off (the marker goes
    with its last entry).  Entries written on this host of stores that are gone (their
    directory holds no ``STORE.json``) are taken off too.  Other stores' entries stay."""
    if not os.path.lexists(sibling(final, ".restore")):
        return
    listed, hosts = read_marker_entries(final)
    if not listed:
        return
    gone = _gone_entries(listed, hosts)
    stale = set() if store_has_restore else _stale_entry(listed, hosts, store_root)
    if gone:
        log.info("restore marker of %s: taking off the entries of %s: no store is there any more", final,
                 ", ".join(sorted(gone)))
    if stale:
        log.info("restore marker of %s: taking off the entry of %s, whose load of it ended without taking it off "
                 "(it has no restore of it)", final, os.path.realpath(os.fspath(store_root)))
    if gone or stale:
        _write_marker(final, listed - gone - stale, hosts)


def load_running(final: Path) -> bool:
    """Whether ``<dir>.restore`` exists while a call holds ``<dir>.lock``: a load of the dump
    may be running now (a load holds the lock from its first check to the removal of its
    marker), so a dump waits for the lock and checks the marker again under it instead of
    refusing at once.  Reads only."""
    return os.path.lexists(sibling(final, ".restore")) and locks.lock_in_use(lock_path(final))


def refuse_if_restoring(final: Path, *, store_root: Optional[PathLike] = None, store_has_restore: bool = True) -> None:
    """Raise RestorePendingError when ``<dir>.restore`` exists (naming the stores it lists).
    ``store_root`` is the store asking; when the marker lists it alone and ``store_has_restore``
    is False, nothing is raised: the entry is stale, and the dump takes it off under the lock
    (:func:`take_off_stale`); so are entries written on this host of stores that are gone.  Entries of other stores are left: a store elsewhere at the same
    path (another node's disk) may still have a pending restore of the dump."""
    m = sibling(final, ".restore")
    if os.path.lexists(m):
        listed, hosts = read_marker_entries(final)
        if listed and store_root is not None and \
                not listed - _gone_entries(listed, hosts) - \
                (set() if store_has_restore else _stale_entry(listed, hosts, store_root)):
            return  # (only entries of stores gone or this store's stale one: the dump takes them off under the lock)
        stores = sorted(listed or ())
        who = f" by the store(s) {', '.join(stores)}" if stores else \
            " (the marker cannot be read: it names no store; remove it by hand once no store's load of the dump " \
            "is pending)" if listed is None else ""
        ended = ""
        if listed and store_root is not None and not store_has_restore and _listing(listed, store_root):
            ended = (f" (this store, {os.path.realpath(os.fspath(store_root))}, has no restore of it left: its load "
                     f"ended without taking it off the marker; its recover_data_load({str(final)!r}) returns False "
                     f"and takes it off)")
        raise RestorePendingError(f"a load of dump {final}{who} is unresolved ({m} exists): it may still read the "
                                  f"dump, so it is not replaced; call recover_data_load({str(final)!r}) (or with "
                                  f"cancel=True) on {'each of those stores' if len(stores) > 1 else 'that store'} "
                                  f"first{ended} (the entry of a store deleted since goes by itself when it was "
                                  f"written on this host; else remove {m} by hand once no load of the dump is "
                                  f"pending)")


# ---------------------------------------------------------------------------- the restore marker
#: the largest restore marker read (a real one lists a few store paths)
MARKER_MAX_BYTES = 1 << 20


def read_marker(final: Path) -> Optional[Set[str]]:
    """The stores ``<dir>.restore`` lists (each a store's real path): those whose load of the
    dump may still read it.  Empty when there is no marker; None when there is one that
    cannot be read as a marker (an I/O error, more than :data:`MARKER_MAX_BYTES`, not a
    marker's JSON: it is written atomically, so only a failing disk or a hand edit does
    that), logged: its list is unknown, so it must be neither rewritten nor removed.  Both
    forms are read: ``{"stores": [path, ...]}`` and the one-store ``{"store": path}`` of
    earlier versions."""
    return read_marker_entries(final)[0]


def read_marker_entries(final: Path) -> Tuple[Optional[Set[str]], Dict[str, str]]:
    """``(stores, hosts)`` of ``<dir>.restore``: :func:`read_marker`'s answer, and the host each
    entry was written on (``"hosts": {path: host}``; none for entries of earlier versions)."""
    m = sibling(final, ".restore")
    try:
        raw = files.read_regular(m, max_bytes=MARKER_MAX_BYTES)
        if raw is None and not os.path.lexists(m):
            return set(), {}
        doc = json.loads(bytes(raw)) if raw is not None else None
    except FileNotFoundError:
        return set(), {}
    except (OSError, ValueError, RecursionError, files.NotRegularFile) as e:
        log.warning("restore marker %s cannot be read (%s)", m, e)
        return None, {}
    hosts = doc.get("hosts") if isinstance(doc, dict) else None
    hosts = {k: v for k, v in hosts.items() if isinstance(k, str) and isinstance(v, str)} \
        if isinstance(hosts, dict) else {}
    if isinstance(doc, dict) and isinstance(doc.get("stores"), list) and \
            all(isinstance(x, str) for x in doc["stores"]):
        return set(doc["stores"]), hosts
    if isinstance(doc, dict) and isinstance(doc.get("store"), str):
        return {doc["store"]}, {}
    log.warning("restore marker %s is not a marker (or holds more than %d bytes)", m, MARKER_MAX_BYTES)
    return None, {}


def this_host() -> str:
    """How a marker names the machine an entry was written on (its host name)."""
    return socket.gethostname()


def _write_marker(final: Path, stores: Set[str], hosts: Optional[Dict[str, str]] = None) -> None:
    m = sibling(final, ".restore")
    if stores:
        doc: Dict[str, Any] = {"stores": sorted(stores)}
        kept = {s: h for s, h in (hosts or {}).items() if s in stores}
        if kept:
            doc["hosts"] = dict(sorted(kept.items()))
        try:
            files.write_file_atomic(m, json.dumps(doc).encode() + b"\n")
        except BaseException:
            with contextlib.suppress(OSError):  # (its temporary file; the marker is the old or the new one)
                files.unlink(m.with_name(m.name + ".tmp"))
            raise
    else:
        files.unlink(m)  # (not fsynced: a marker a crash brings back lists a store with no
        # restore of the dump, which recover_data_load takes off)


def mark(final: Path, store_root: PathLike) -> None:
    """Add the store to ``<dir>.restore`` (created if missing; atomic, durable).  Called under
    the dump's lock.  Raises CheckpointError, writing nothing, when a marker is there that
    cannot be read (:func:`read_marker`): rewriting it could drop another store's pending
    load from it; CheckpointError too when the marker cannot be written (the marker is then
    the old one or the new one)."""
    stores, hosts = read_marker_entries(final)
    m = sibling(final, ".restore")
    if stores is None:
        raise CheckpointError(f"the restore marker {m} of dump {final} cannot be read as one (see the log): it may "
                              f"list other stores whose loads of the dump are unresolved, so it is neither rewritten "
                              f"nor removed; check it, and remove it only when no store has a pending restore of "
                              f"that dump (recover_data_load settles one)")
    me = os.path.realpath(os.fspath(store_root))
    try:
        _write_marker(final, stores | {me}, dict(hosts, **{me: this_host()}))
    except OSError as e:
        raise CheckpointError(f"writing the restore marker {m} of dump {final} failed: {e}; nothing was "
                              f"loaded") from e


def unmark(final: Path, store_root: PathLike) -> None:
    """Take the store off ``<dir>.restore``; the marker goes with the last store it lists, and
    stays while another store's load may still read the dump.  A store is recognised by its
    real path, or by the path as given (an earlier version wrote it unresolved, possibly
    relative).  A marker that cannot be read (:func:`read_marker`) is left as it is (logged):
    it may list other stores.  Called under the dump's lock."""
    root = os.fspath(store_root)
    me = os.path.realpath(root)
    stores, hosts = read_marker_entries(final)
    if stores is None:
        log.warning("restore marker %s left in place: it cannot be read, and may list other stores than %s",
                    sibling(final, ".restore"), me)
        return
    mine = _listing(stores, store_root)
    if mine or (not stores and os.path.lexists(sibling(final, ".restore"))):
        _write_marker(final, stores - mine, hosts)


def _listing(stores: Set[str], store_root: PathLike) -> Set[str]:
    """The entries of a marker's ``stores`` that name the store at ``store_root``: its real
    path, or the path as given (an earlier version wrote it unresolved, possibly relative)."""
    root = os.fspath(store_root)
    me = os.path.realpath(root)
    return {s for s in stores if s in (me, root) or os.path.realpath(s) == me}


@contextlib.contextmanager
def locked(final: Path, *, shared_ok: bool = False, read_only_ok: bool = False) -> Iterator[bool]:
    """Hold the exclusive lock ``<dir>.lock`` (blocking) for the body; yields True.

    ``shared_ok``: a reader in a location where the lock file cannot be created (read-only)
    goes on without it and yields False (it must not repair).  ``read_only_ok``: a load of a
    dump in a location this process cannot write (:func:`writable`) locks an existing lock
    file through a read-only descriptor and goes on without the lock (yielding False) when
    there is none; it must not repair or write either.  Failpoint ``lock_open``.

    Raises CheckpointError: the lock cannot be taken."""
    lp = lock_path(final)
    try:
        files.mkdir(final.parent, exist_ok=True, parents=True)
    except OSError as e:
        if not (shared_ok or read_only_ok):
            raise CheckpointError(f"cannot create the parent directory of dump {final}: {e}") from e
    stack = contextlib.ExitStack()
    try:
        held = stack.enter_context(locks.flocked(lp, read_only_ok=read_only_ok))
    except OSError as e:
        if not ((shared_ok or read_only_ok) and e.errno in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOENT)):
            raise CheckpointError(f"cannot take the lock {lp} of dump {final}: {e}") from e
        held = False
    if not held:
        log.debug("cannot take the lock %s; reading dump %s without it (a location this process cannot write)",
                  lp, final)
    with stack:
        yield held


def writable(final: Path) -> bool:
    """Whether this process may create files beside ``<dir>`` (its lock file, its marker):
    False on a read-only file system or in a directory it may not write, where no dump can
    be written or replaced through this process either."""
    return os.access(final.parent, os.W_OK)


def present(final: Path) -> bool:
    """Something of a dump is at ``final``: its directory (not a directory of another kind:
    :func:`other_kind`), a ``.restore`` marker, or a sibling ``.old`` or ``.tmp`` that a dump
    writer left (:func:`_left_by_dump`; a user's directory of that name does not count)."""
    return ((os.path.isdir(final) and other_kind(final) is None) or os.path.lexists(sibling(final, ".restore"))
            or any(_left_by_dump(sibling(final, s)) for s in (".old", ".tmp")))


def other_kind(d: Path) -> Optional[str]:
    """What the directory ``d`` is when it is surely no dump (a load or a read of it, a wrong
    path, then creates no lock file beside it): a checkpoint, a store, a generation root or an
    empty directory, in words; else None."""
    try:
        if not os.listdir(d):
            return "an empty directory"
    except OSError:
        return None
    if T.is_checkpoint_dir(d):
        return "a tqstore checkpoint (load it with load_checkpoint)"
    if os.path.lexists(os.path.join(d, STORE_FILE)) or T.generation_steps(d) is not None:
        return T.describe(d)
    return None


def locked_if_present(final: Path, *, shared_ok: bool = False, read_only_ok: bool = False):
    """:func:`locked` when :func:`present`; else a context yielding False that creates nothing
    (no lock file, no parent directory): reading or loading a path that holds no dump leaves
    nothing behind (a caller that gets False must not go on as if it held the lock: a dump
    may be published there meanwhile).  For loads; a dump takes :func:`locked`."""
    return locked(final, shared_ok=shared_ok, read_only_ok=read_only_ok) if present(final) \
        else contextlib.nullcontext(False)


def _left_by_dump(d: Path) -> bool:
    """``d`` is a directory (not a symbolic link) that a dump writer may have left: a dump, or
    one that holds only names a dump writes, or none (a crash right after ``<dir>.tmp`` was
    made, or during the removal of ``<dir>.old``, leaves it empty), each a regular file (a
    directory of such a name, or a link, is no dump writer's): removing it destroys nothing
    of the user's."""
    if not T.real_dir(d):
        return False
    if T.is_dump_dir(d):
        return True
    try:
        with os.scandir(d) as entries:
            return all((e.name in (DR.MANIFEST_NAME, DR.ROW_INDEX_NAME) or DR.is_shard_name(e.name))
                       and e.is_file(follow_symlinks=False) for e in entries)
    except OSError:
        return False


def repair(final: Path, *, writer: bool = False) -> None:
    """Settle an interrupted dump or publication of ``final`` (caller holds the lock): a lone
    ``<dir>.old`` that is a dump is renamed back; a leftover ``.tmp``, and any other ``.old``,
    are removed when a dump writer may have left them (:func:`_left_by_dump`).  A directory
    of one of those names that a dump did not leave is never touched: a reader (``writer``
    False) goes on beside it; a ``writer``, which needs the names, raises.

    Raises CheckpointError: (``writer``) a sibling ``.tmp`` or ``.old`` that tqstore did not
    write is in the way; or the repair failed (the error of the file system named; what is
    left is repaired by the next access)."""
    try:
        _repair(final, writer)
    except OSError as e:
        raise CheckpointError(f"repairing the interrupted publication of dump {final} failed: {e}; the next "
                              f"access tries again") from e


def _repair(final: Path, writer: bool) -> None:
    tmp, old = sibling(final, ".tmp"), sibling(final, ".old")
    if os.path.lexists(tmp):
        if _left_by_dump(tmp):
            log.info("removing %s left by an interrupted dump", tmp)
            files.rmtree(tmp)
        elif writer:
            raise _in_the_way(tmp, final, "an unfinished dump")
    if os.path.lexists(old):
        if not os.path.lexists(final) and T.real_dir(old) and T.is_dump_dir(old):
            log.info("restoring %s: a dump's replacement was interrupted between its renames", final)
            files.rename(old, final)
            files.fsync_dir(final.parent)
        elif _left_by_dump(old):
            log.info("removing %s left by an interrupted dump publication", old)
            files.rmtree(old)
        elif writer:
            raise _in_the_way(old, final, "a dump's previous version")


def _in_the_way(d: Path, final: Path, what: str) -> CheckpointError:
    return CheckpointError(f"{d} is in the way of dump {final} and does not look like {what} "
                           f"({T.describe(d)}); move it away")


def fresh_tmp(final: Path) -> Path:
    """Create ``<dir>.tmp`` (after :func:`repair`: it does not exist)."""
    tmp = sibling(final, ".tmp")
    files.mkdir(tmp)
    return tmp


def publish(tmp: Path, final: Path) -> None:
    """``<dir>`` to ``<dir>.old`` (parent fsynced), ``tmp`` to ``<dir>`` (parent fsynced),
    ``<dir>.old`` removed: :func:`tqstore._io.files.publish_dir`."""
    files.publish_dir(tmp, final)


def readable_dir(final: Path) -> Optional[Path]:
    """The directory a reader uses: ``<dir>``, or ``<dir>.old`` when ``<dir>`` is missing (an
    interrupted replacement a reader without the lock could not repair); None if neither."""
    if os.path.lexists(final):
        return final
    old = sibling(final, ".old")
    return old if os.path.lexists(old) else None


__all__ = ["resolve", "lock_path", "marker_path", "check_target", "refuse_if_restoring", "read_marker", "mark",
           "unmark", "present", "locked", "locked_if_present", "writable", "repair",
           "fresh_tmp", "publish", "readable_dir", "SUFFIXES"]
