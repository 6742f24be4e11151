"""A unit's side of a checkpoint load (:meth:`Unit.stage_import`, :meth:`Unit.verify_import`)
and the reader of a checkpoint's unit index copy.

Owner-side I/O: the unit builds a new unit directory of the state the store will switch to,
from files of the checkpoint it can reach, as the loader's plan (a
:class:`~tqstore.ports.UnitImport`) says; its live directory is never touched.

* "same" (as many units as the checkpoint): the index copy (walked out of process and
  checked by the loader first) is copied compacted; segments are hard-linked (same file
  system) or copied at once and fsynced; :func:`verify_same` then checks every segment's
  CRC32C and every indexed frame (the caller runs it while it opens the new state);
* "reshard": map a window of each source segment at a time, touch only this unit's frames
  in it, check each frame's structure, padding and CRC32C against the source index, append
  the frames byte for byte to new segments and index them as it goes.
"""
from __future__ import annotations

import functools
import mmap
import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import lmdb
import numpy as np

from ._format import unit_records as UR
from ._format.frame import check_run, first_fault
from ._format.lmdb_pages import Packed
from ._format.index import LOC_DTYPE
from ._format.layout import SEGMENT_HEADER_SIZE
from ._format.segment import segment_name
from ._io import files
from ._io.lmdbenv import copy_env_compact, open_env, read_columns
from ._io.scan import listed_file_problem, scan_file
from ._io.segfile import SegmentWriter
from .errors import CorruptionError, FormatVersionError, StorageIOError, TqstoreError
from .ports import UnitImport

def _lmdb_errors(fn):
    """An LMDB error while staging becomes a StorageIOError naming the directory."""
    @functools.wraps(fn)
    def wrapped(target, *args, **kwargs):
        try:
            return fn(target, *args, **kwargs)
        except lmdb.Error as e:
            raise StorageIOError(f"staging {target} from a checkpoint failed: {e}") from e
    return wrapped


WINDOW_BYTES = 16 << 20  # of a source segment mapped at a time by one target
INDEX_BATCH = 20000


# ---------------------------------------------------------------------------- reading an index copy
def read_unit_index(env_dir: Path, *, check_format) -> Tuple[Any, bytes, Dict[int, int]]:
    """The entries of a checkpoint's unit index copy (already walked out of process):
    ``(keys, concatenated LOC values, {segment: recorded size})``, ``keys`` a list of bytes
    or, read in bulk from the file's pages (:func:`tqstore._io.lmdbenv.read_columns`), a
    :class:`~tqstore._format.lmdb_pages.Packed`.  Read only.
    ``check_format`` is the unit index's format check (``check_index_format`` of
    :mod:`tqstore.unit`, handed in: this module sits below it); the records decode through
    :mod:`tqstore._format.unit_records`.

    Raises:
        StorageIOError: it cannot be opened.
        FormatVersionError: another unit index format.
        ValueError: it cannot be read (the message says why).
    """
    env = open_env(env_dir, max_dbs=8, readonly=True)
    try:
        check_format(env, env_dir, create=False)
        with env.begin() as txn:
            keys: Any = []
            values = b""
            cols = read_columns(env, txn, [b"loc"])
            if cols is not None:
                c = cols.get(b"loc")
                if c is not None:
                    keys, values = Packed(c.keys, c.key_lens), c.values
                    if len(c) and (c.value_lens != LOC_DTYPE.itemsize).any():
                        raise ValueError("a loc value is not 20 bytes")
            else:
                try:
                    db = env.open_db(b"loc", txn=txn, create=False)
                    keys = list(txn.cursor(db).iternext(values=False))
                    values = b"".join(txn.cursor(db).iternext(keys=False))
                except lmdb.NotFoundError:
                    pass  # a unit that never held a row
            recorded: Dict[int, int] = {}
            try:
                sdb = env.open_db(b"segs", txn=txn, create=False)
                for k, v in txn.cursor(sdb):
                    recorded[UR.decode_seg_key(k)] = UR.SegInfo.unpack(v).size
            except lmdb.NotFoundError:
                pass
        return keys, values, recorded
    except FormatVersionError:
        raise
    except (lmdb.Error, ValueError, KeyError, TypeError, TqstoreError) as e:
        raise ValueError(str(e)) from e
    finally:
        env.close()


# ---------------------------------------------------------------------------- same unit count
@_lmdb_errors
def stage_same(target: Path, plan: UnitImport) -> int:
    """Copy the unit's index; link or copy its segments (checked later by :func:`verify_same`)."""
    src = Path(plan.src_dir)
    files.mkdir(target)
    files.mkdir(target / "index")
    copy_env_compact(src / plan.index_dir, target / "index")
    for seg, rel, size, _crc in sorted(plan.segments):
        dst = target / segment_name(seg)
        if plan.link:
            files.link(src / rel, dst)
        else:
            got = files.copy_file(src / rel, dst, fsync=False)
            if got != size:
                raise CorruptionError("checkpoint segment is shorter than MANIFEST.json records",
                                      path=str(src / rel), offset=got)
    # durable before the verification reads start competing with the journal commits (the
    # caller's own fsync pass then finds every file clean)
    files.fsync_tree(target)
    return 0


def verify_same(target: Path, plan: UnitImport) -> int:
    """Check every staged segment: the files it holds are the checkpoint's when linked, else
    the copies in ``target``.  Returns bytes read."""
    src = Path(plan.src_dir)
    n = 0
    for seg, rel, size, crc in sorted(plan.segments):
        frames = plan.frames.get(seg, ())
        root, path = (src, src / rel) if plan.link else (target, target / segment_name(seg))
        try:
            n += _check_segment(root, path, size, crc, frames)
        except CorruptionError as err:
            raise _pinpoint(src / rel, size, frames) or (err if plan.link else CorruptionError(
                f"segment copied from the checkpoint does not verify: {err}", path=str(src / rel)))
    return n


def _check_segment(root: Path, p: Path, size: int, crc: int, frames: Sequence[Tuple[int, int, int]]) -> int:
    """Verify a segment file against its manifest entry and the frames its unit index names,
    stopping at the first bad frame; returns bytes read."""
    prob = listed_file_problem(p, size, under=root)
    if prob is not None:
        raise CorruptionError(f"checkpoint file: {prob[1]}", path=prob[0], offset=prob[2])
    res = scan_file(p, size, frames=frames, under=root, stop_at_bad=True)
    if res.bad or res.stopped or (res.nread == size and res.crc != crc):
        raise _damage(p, crc, res)
    if res.nread != size:
        raise CorruptionError("checkpoint file is truncated", path=str(p), offset=res.nread)
    return res.nread


def _damage(p: Path, crc: int, res) -> CorruptionError:
    if res.bad:
        b = res.bad[0]
        return b.error(f"checkpoint segment: {b.message}", path=str(p))
    return CorruptionError("checkpoint file checksum mismatch", path=str(p), offset=None, expected_crc=crc,
                           actual_crc=None if res.stopped else res.crc)


def _pinpoint(p: Path, size: int, frames) -> Optional[CorruptionError]:
    """A damaged segment: rescan the checkpoint's file frame by frame to name the bad frame."""
    try:
        res = scan_file(p, size, frames=frames if isinstance(frames, np.ndarray) else sorted(frames))
    except OSError:
        return None
    return _damage(p, 0, res) if res.bad else None


# ---------------------------------------------------------------------------- another unit count
@_lmdb_errors
def stage_reshard(target: Path, plan: UnitImport, unit_id: int, segment_bytes: int) -> int:
    """Build the unit directory ``target`` from the frames of ``plan.target`` (a TargetPlan):
    map a window of each source segment at a time, touch only this unit's frames in it, check
    each frame (the frame-check kernel: structure, exact extent, padding, CRC32C, the CRC the
    source index recorded), append the frames byte for byte to new segments and index them.
    Returns bytes read."""
    SegInfo = UR.SegInfo
    t = plan.target
    src = Path(plan.src_dir)
    files.mkdir(target)
    env = open_env(target / "index", max_dbs=4)
    infos: Dict[int, Any] = {}
    items: List[tuple] = []
    w: List[Optional[SegmentWriter]] = [None]
    window = max(1 << 16, min(WINDOW_BYTES, segment_bytes))
    ends = t.offset + t.length
    read = 0
    try:
        db_loc = env.open_db(b"loc")
        db_segs = env.open_db(b"segs")

        def close_writer() -> None:
            cur = w[0]
            if cur is not None:
                cur.fsync()
                infos[cur.seg_id] = SegInfo(cur.size, cur.size - SEGMENT_HEADER_SIZE, True)
                cur.close()
                w[0] = None

        def append(iov: List[memoryview], nbytes: int) -> Tuple[int, int]:
            cur = w[0]
            if cur is None or (cur.size > SEGMENT_HEADER_SIZE and cur.size + nbytes > segment_bytes):
                seg_id = (cur.seg_id + 1) if cur is not None else 1
                close_writer()
                cur = w[0] = SegmentWriter(target, unit_id, seg_id, create=True)
            return cur.seg_id, cur.append(iov)

        for src_unit, seg, lo, hi in t.groups():
            path = str(src / plan.seg_paths[(src_unit, seg)])
            try:
                fd = files.open_regular(path, under=src)
            except FileNotFoundError as e:
                raise CorruptionError("checkpoint segment listed in MANIFEST.json is missing", path=path) from e
            except files.NotRegularFile as e:
                raise CorruptionError(f"checkpoint segment: {e.strerror}", path=str(e.filename or path)) from e
            try:
                i = lo
                while i < hi:
                    wstart = int(t.offset[i]) & ~(mmap.ALLOCATIONGRANULARITY - 1)
                    j = i + 1 + int(np.searchsorted(ends[i + 1:hi], wstart + window, side="right"))
                    _copy_window(fd, path, wstart, int(ends[j - 1]), t, i, j, append, items)
                    read += int(t.length[i:j].sum())
                    if len(items) >= INDEX_BATCH:
                        with env.begin(write=True) as txn:
                            txn.cursor(db_loc).putmulti(items)
                        items.clear()
                    i = j
            finally:
                os.close(fd)
        close_writer()
        with env.begin(write=True) as txn:
            if items:
                txn.cursor(db_loc).putmulti(items)
            for s, info in infos.items():
                txn.put(UR.seg_key(s), info.pack(), db=db_segs)
        env.sync(True)
    finally:
        if w[0] is not None:
            w[0].close()
        env.close()
    return read


def _copy_window(fd: int, path: str, wstart: int, wend: int, t, i: int, j: int, append, items: List[tuple]) -> None:
    """Frames ``i:j`` of ``t`` lie in ``[wstart, wend)`` of the source: verify, append, index."""
    try:
        mm = mmap.mmap(fd, wend - wstart, prot=mmap.PROT_READ, offset=wstart)
    except (ValueError, OSError) as e:
        raise CorruptionError(f"checkpoint segment cannot be mapped (truncated?): {e}", path=path,
                              offset=wstart) from e
    wmv = memoryview(mm)
    iov: List[memoryview] = []
    try:
        loc = np.zeros(j - i, LOC_DTYPE)
        loc["offset"], loc["length"], loc["crc"] = t.offset[i:j], t.length[i:j], t.crc[i:j]
        res = check_run(wmv, loc, base=wstart)  # every check of a reader; readers refuse what fails
        got = first_fault(wmv, loc, res, base=wstart)
        if got is not None:
            k, fault = got
            raise fault.error(path=path, offset=int(t.offset[i + k]), prefix="checkpoint segment: ")
        # adjacent frames go out as one slice of the mapping
        r = t.offset[i:j] - wstart
        ln = t.length[i:j]
        starts = np.flatnonzero(np.r_[True, r[1:] != r[:-1] + ln[:-1]])
        a = r[starts].tolist()
        b = np.r_[r[starts[1:] - 1] + ln[starts[1:] - 1], r[-1] + ln[-1]].tolist()
        iov = [wmv[x:y] for x, y in zip(a, b)]
        total = int(ln.sum())
        sid, base = append(iov, total)
        iov.clear()
        vals = np.empty(j - i, LOC_DTYPE)
        vals["seg"] = sid
        vals["offset"] = base + np.cumsum(ln) - ln
        vals["length"] = ln
        vals["crc"] = t.crc[i:j]
        vb = vals.tobytes()
        size = LOC_DTYPE.itemsize
        items.extend(zip(t.keys[i:j], [vb[x:x + size] for x in range(0, len(vb), size)]))
    finally:
        iov.clear()
        try:
            wmv.release()
            mm.close()
        except BufferError:  # a view still held by an exception's traceback: unmapped when collected
            pass
