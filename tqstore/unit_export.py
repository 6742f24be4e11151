"""A unit's export of a snapshot into a checkpoint directory (:meth:`Unit.export_snapshot`).

Owner-side I/O: the unit writes its own files into ``dest_dir`` and answers values
(:class:`~tqstore.ports.UnitExport`).  What lands there (docs/FORMAT.md, "Checkpoints"):

* ``index/data.mdb``: a compact LMDB copy of the snapshot's read transaction, then fixed to
  describe exactly what the checkpoint holds (the segments the index names, all sealed, with
  their live bytes; entries of overwriting puts the controller never committed put back; no
  undo records);
* every segment the index names, placed as :func:`~tqstore.ports.plan_segment_writes` says:
  a hard link to the store's sealed file, a hard link to an identical file of an earlier
  generation, or a copy (``copy_file_range``) checked frame by frame against the index CRCs.
  A linked segment's CRC32C is computed once per identity and process (a cache shared by the
  units of this process); a file whose fsync failed is never linked and fsynced again.

Every file is fsynced, then every directory.
"""
from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Tuple

import lmdb
import numpy as np

from ._format import unit_records as UR
from ._format.index import LOC_DTYPE
from ._format.segment import segment_name
from ._io import files
from ._io.lmdbenv import DEFAULT_MAP_BYTES, copy_txn_compact, read_columns
from ._io.scan import identity, scan_file, seal_index_file
from .errors import CorruptionError, StorageIOError
from .ports import COPY, LINK, REUSE, Reusable, SegmentSource, SegmentWrite, UnitExport, plan_segment_writes

log = logging.getLogger("tqstore")

ROLE_UNIT_INDEX = "unit_index"  # the manifest's roles (docs/FORMAT.md, "MANIFEST.json")
ROLE_SEGMENT = "segment"
INDEX_FILE = "index/data.mdb"

_CRC_CACHE_MAX = 1 << 16
_crc_cache: "OrderedDict[str, int]" = OrderedDict()
_crc_lock = threading.Lock()


def cached_crc(ident: str) -> Optional[int]:
    """The CRC32C of a segment identity this process checksummed already (None if not)."""
    with _crc_lock:
        v = _crc_cache.get(ident)
        if v is not None:
            _crc_cache.move_to_end(ident)
        return v


def remember_crc(ident: str, crc: int) -> None:
    with _crc_lock:
        _crc_cache[ident] = crc
        _crc_cache.move_to_end(ident)
        while len(_crc_cache) > _CRC_CACHE_MAX:
            _crc_cache.popitem(last=False)


def export_unit(unit, view, dest: Path, *, link: bool, reuse: Mapping[str, Reusable], put_token: int,
                known_crc: Mapping[str, int], index_block_bytes: int) -> UnitExport:
    """Write snapshot ``view`` of ``unit`` into the new directory ``dest`` (see the module
    docstring).

    Raises CorruptionError (a segment does not verify), StorageIOError (an LMDB error) or OSError."""
    try:
        return _export(unit, view, dest, link=link, reuse=reuse, put_token=put_token, known_crc=known_crc,
                       index_block_bytes=index_block_bytes)
    except lmdb.Error as e:
        raise StorageIOError(f"unit {unit.unit_id}: exporting snapshot into {dest} failed: {e}") from e


def _export(unit, view, dest: Path, *, link: bool, reuse: Mapping[str, Reusable], put_token: int,
            known_crc: Mapping[str, int], index_block_bytes: int) -> UnitExport:
    i = unit.unit_id
    files.mkdir(dest, exist_ok=True)  # (created if missing: the caller may have made it)
    files.mkdir(dest / "index")
    link = link and files.can_link(unit.path, dest)
    # leftover undo records of an overwriting put (none unless a settle failed): the
    # checkpoint holds the state the controller committed, with no undo records
    undo = [(bytes(k), bytes(v)) for k, v in view.txn.cursor(db=unit.db_undo)]
    put_back = {ik: v for (tok, ik), v in ((UR.decode_undo_key(k), v) for k, v in undo) if tok > put_token}
    if put_back:
        vals = b"".join(put_back.get(bytes(k), bytes(v)) for k, v in view.txn.cursor(db=unit.db_loc))
    else:
        vals = _loc_values(unit, view.txn)
    per_seg = _SegmentFrames(vals)
    segs = view.segs
    unknown = sorted(set(per_seg.segs) - set(segs))
    if unknown:
        raise CorruptionError(f"unit {i} index names segments {unknown[:5]} it does not list; run verify on "
                              f"the store", path=str(unit.path))
    copy_txn_compact(unit.env, dest / "index", view.txn)
    keep = {s: (segs[s].size, per_seg.live_bytes(s)) for s in per_seg.segs}
    restores = unit.db_restore is not None  # selective restores' entries (settled ones' marks) stay behind
    if undo or restores or set(segs) != set(keep) or any(not segs[s].sealed or segs[s].live != keep[s][1]
                                                         for s in keep):
        _fix_index(dest / "index", keep, put_back, bool(undo), drop_restore=restores)
    sources = []
    for s in per_seg.segs:
        p = unit.path / segment_name(s)
        size = segs[s].size
        try:
            fsize = os.stat(p).st_size
        except FileNotFoundError as e:
            raise CorruptionError(f"segment file of unit {i} is missing", path=str(p)) from e
        if fsize < size:
            raise CorruptionError(f"segment file of unit {i} holds {fsize} bytes, its index records {size}",
                                  path=str(p), offset=fsize)
        sources.append(SegmentSource(i, s, str(p), size, segs[s].sealed, fsize, identity(p, size),
                                     per_seg.count(s), keep[s][1]))
    known = {src.identity: c for src in sources
             if (c := known_crc.get(src.identity, cached_crc(src.identity))) is not None}
    plan = plan_segment_writes(sources, link=link, reuse=reuse, known_crc=known)
    out = UnitExport([], frames=per_seg.total)
    for w in plan:
        crc, method, summed = _write_segment(w, dest, per_seg.frames(w.source.seg), copy_only=not link)
        out.checksummed_bytes += summed
        s = w.source
        out.files.append({"path": segment_name(s.seg), "role": ROLE_SEGMENT, "size": s.size, "crc32c": crc,
                          "unit": i, "seg": s.seg, "frames": s.frames, "live_bytes": s.live_bytes,
                          "origin": s.identity})
        out.live_bytes += s.live_bytes
        if method == COPY:
            out.copied_bytes += s.size
        elif method == LINK:
            out.linked_bytes += s.size
        else:
            out.reused_bytes += s.size
    size, crc, blocks = seal_index_file(dest / INDEX_FILE, index_block_bytes)
    out.files.insert(0, {"path": INDEX_FILE, "role": ROLE_UNIT_INDEX, "size": size, "crc32c": crc, "unit": i,
                         "block_crc32c": list(blocks)})
    files.fsync_dir(dest / "index")
    files.fsync_dir(dest)
    return out


def _write_segment(w: SegmentWrite, dest: Path, frames: Callable[[], np.ndarray], *,
                   copy_only: bool) -> Tuple[int, str, int]:
    """Place one segment; returns (its CRC32C, the method used, bytes read to checksum)."""
    s = w.source
    dst = dest / segment_name(s.seg)
    if w.method == REUSE:
        try:
            old = os.stat(w.link_from)
            if old.st_size == s.size and not files.fsync_failed(w.link_from):
                summed = _reuse_check(w, old, frames, copy_only=copy_only)
                if summed is not None:
                    # durable since that generation was published (its files were fsynced before
                    # its manifest): no fsync of the file again, the directory's fsync makes the
                    # new name durable (a fixed cost per reused segment kept out of every generation)
                    files.link(w.link_from, dst)
                    return int(w.crc32c), REUSE, summed  # type: ignore[arg-type]
        except FileNotFoundError:
            pass
        except OSError as e:
            if e.errno not in files.LINK_REFUSED:
                raise
            log.info("cannot link %s into %s (%s): copying", w.link_from, dst, e)
            copy_only = True
        log.info("earlier generation's copy of %s is gone, failed an fsync or is not to be reused; writing it "
                 "again", s.path)
        w = SegmentWrite(s, LINK if (s.sealed and s.file_size == s.size and not copy_only
                                     and files.can_link(s.path, dest)) else COPY, s.path, None)
    if w.method == LINK and files.fsync_failed(s.path):
        # an fsync of this file failed earlier: its pages read back but may not be on disk, and
        # fsyncing it again would report success; write the bytes into a fresh file instead
        w = SegmentWrite(s, COPY, s.path, None)
    if w.method == LINK:
        crc, summed = w.crc32c, 0
        if crc is None:
            crc, summed = _scan_or_raise(s.path, s.size, frames(), what="store segment"), s.size
            remember_crc(s.identity, crc)
        files.link(s.path, dst)
        files.fsync_file(dst)  # the store's own pages: durable now
        return crc, LINK, summed
    n = files.copy_file(s.path, dst, fsync=False, length=s.size)
    if n != s.size:
        raise CorruptionError(f"segment holds {n} bytes, its index records {s.size}", path=s.path, offset=n)
    # the copy's writeback (its fsync) runs while the copy is read back and checked: the disk
    # and the CPU work side by side; both have ended, cleanly, before the segment counts as saved
    flush = _Flush(dst)
    try:
        crc = _scan_or_raise(str(dst), s.size, frames(), what="copied segment", source=s.path)
    except BaseException:
        flush.join(quiet=True)  # the check's error is the one to report
        raise
    flush.join()
    remember_crc(s.identity, crc)
    return crc, COPY, s.size


def _reuse_check(w: SegmentWrite, old: os.stat_result, frames: Callable[[], np.ndarray], *,
                 copy_only: bool) -> Optional[int]:
    """Whether an earlier generation's file may stand for segment ``w.source`` in a new one:
    the bytes read to check it (0: none needed), or None (write the segment again).  It may
    when it is the store's own file (the same inode: the generation linked it), or, when the
    save copies, when its frames and its CRC32C check against the manifest's (a separate file,
    which a copy-mode generation holds or someone put in place of a link: a damaged copy is
    never carried into the new generation, where the prune after it could leave no
    generation that verifies).  A link-mode save links the store's own file instead of a
    separate one."""
    s = w.source
    try:
        live = os.stat(s.path)
        if (live.st_dev, live.st_ino) == (old.st_dev, old.st_ino):
            return 0
    except FileNotFoundError:
        pass
    if not copy_only:
        log.info("earlier generation's %s is not the store's file %s: linking the store's", w.link_from, s.path)
        return None
    try:
        crc = _scan_or_raise(w.link_from, s.size, frames(), what="earlier generation's segment")
    except (CorruptionError, OSError) as e:  # (damaged, or a bad sector of the old file)
        log.warning("earlier generation's copy of segment %s does not verify (%s): copying it again", s.path, e)
        return None
    if crc != w.crc32c:
        log.warning("earlier generation's copy of segment %s holds CRC32C %08x, its manifest %08x: copying it "
                    "again", s.path, crc, w.crc32c)
        return None
    return s.size


class _Flush:
    """``files.fsync_file(path)`` in a thread of its own; :meth:`join` waits and raises its error."""

    def __init__(self, path: Path) -> None:
        self._error: Optional[BaseException] = None
        self._t = threading.Thread(target=self._run, args=(path,), name="tqstore-ckpt-fsync", daemon=True)
        self._t.start()

    def _run(self, path: Path) -> None:
        try:
            files.fsync_file(path)
        except BaseException as e:  # noqa: BLE001 - raised by join()
            self._error = e

    def join(self, *, quiet: bool = False) -> None:
        self._t.join()
        if self._error is not None and not quiet:
            raise self._error


def _loc_values(unit, txn):
    """Every location value of the unit index as ``txn`` sees it, concatenated in key order:
    read in bulk from the index file's pages when the file reads that way
    (:func:`~tqstore._io.lmdbenv.read_columns`), else through an LMDB cursor.  (A cursor
    costs a few microseconds an entry when the units of a save run side by side: they
    contend for the GIL at every entry; the bulk read is one call.)"""
    cols = read_columns(unit.env, txn, [b"loc"])
    if cols is not None:
        c = cols.get(b"loc")
        if c is None:
            return b""
        if not len(c) or (c.value_lens == LOC_DTYPE.itemsize).all():
            return c.values
    return b"".join(txn.cursor(db=unit.db_loc).iternext(keys=False, values=True))


class _SegmentFrames:
    """The frames a unit index names, grouped by segment and sorted by offset (vectorised:
    a store holds millions of frames and most segments need only their count)."""

    def __init__(self, values: bytes) -> None:
        arr = np.frombuffer(values, LOC_DTYPE)
        arr = arr[np.lexsort((arr["offset"], arr["seg"]))]
        self._arr = arr
        self.total = len(arr)
        segs, starts, counts = np.unique(arr["seg"], return_index=True, return_counts=True)
        live = np.add.reduceat(arr["length"].astype(np.int64), starts) if len(arr) else np.zeros(0, np.int64)
        self.segs: List[int] = [int(x) for x in segs]
        self._where = {int(s): (int(a), int(c), int(b)) for s, a, c, b in zip(segs, starts, counts, live)}

    def count(self, seg: int) -> int:
        return self._where[seg][1]

    def live_bytes(self, seg: int) -> int:
        return self._where[seg][2]

    def frames(self, seg: int) -> Callable[[], np.ndarray]:
        """A callable giving the ``(n, 3)`` uint64 rows ``(offset, length, crc)`` of ``seg``
        sorted by offset (built only if called; an array, not tuples: no per-frame Python
        object, so a save's memory does not grow with the frames it checks)."""
        start, count, _ = self._where[seg]
        part = self._arr[start:start + count]

        def rows() -> np.ndarray:
            out = np.empty((count, 3), np.uint64)
            out[:, 0], out[:, 1], out[:, 2] = part["offset"], part["length"], part["crc"]
            return out
        return rows


def _scan_or_raise(path: str, size: int, frames, *, what: str, source: Optional[str] = None) -> int:
    res = scan_file(path, size, frames=frames)
    if res.nread != size:
        raise CorruptionError(f"{what} is truncated at {res.nread} of {size} bytes", path=source or path,
                              offset=res.nread)
    if res.bad:
        b = res.bad[0]
        raise b.error(f"{what}: {b.message} ({len(res.bad)} bad frame(s))", path=source or path)
    return res.crc


def _fix_index(index_dir: Path, keep: Dict[int, Tuple[int, int]], put_back: Dict[bytes, bytes],
               drop_undo: bool, *, drop_restore: bool = False) -> None:
    """Make a copied unit index describe exactly what the checkpoint holds: the segments
    ``keep`` (id -> (size, live bytes)), all sealed; entries of uncommitted overwriting
    puts put back (``put_back``: index key -> replaced location); no undo records and no
    ``restore`` database (``drop_restore``: a checkpoint is never cut while a restore is unresolved).

    (The cut may list a still-empty active segment, or dead segments kept only by another
    snapshot's pin.)  LMDB is opened without a lock file: the copy is private to this save.
    """
    SegInfo = UR.SegInfo  # the unit index's own record type

    env = lmdb.open(str(index_dir), map_size=DEFAULT_MAP_BYTES, max_dbs=8, lock=False, sync=False, metasync=False,
                    readahead=False, subdir=True, create=False)
    try:
        db = env.open_db(b"segs")
        db_loc = env.open_db(b"loc")
        with env.begin(write=True) as txn:
            for k, v in list(txn.cursor(db)):
                s = UR.decode_seg_key(k)
                if s not in keep:
                    txn.delete(k, db=db)
                else:
                    info = SegInfo.unpack(v)
                    info.sealed = True
                    info.size, info.live = keep[s]
                    txn.put(k, info.pack(), db=db)
            for k, v in put_back.items():
                txn.put(k, v, db=db_loc)
            if drop_undo:
                txn.drop(env.open_db(b"undo", txn=txn), delete=False)
            if drop_restore:
                try:
                    txn.drop(env.open_db(b"restore", txn=txn, create=False), delete=True)
                except lmdb.NotFoundError:
                    pass
        env.sync(True)
    finally:
        env.close()
