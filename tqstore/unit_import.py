"""A unit's side of a checkpoint load (:meth:`Unit.stage_import`, :meth:`Unit.verify_import`)
and the reader of a checkpoint's unit index copy.

Owner-side I/O: the unit builds a new unit directory of the state the store will switch to,
from files of the checkpoint it can reach, as the loader's plan (a
:class:`~tqstore.ports.UnitImport`) says; its live directory is never touched.

* "same" (as many units as the checkpoint): the index copy (its pages and entries
  checked by the loader first) is copied byte for byte (it is a compacted copy: no free
  page; else it is compacted again); segments are hard-linked (same file
  system) or copied at once and fsynced; :func:`verify_same` then checks every segment's
  CRC32C and every indexed frame (the caller runs it while it opens the new state);
* "reshard": read this unit's frames of each source segment in batches (only their byte
  ranges) straight into the buffer of the new segment they go to, check each frame's
  structure, padding, row and CRC32C against the source index there, append the frames
  byte for byte (whole blocks with direct I/O, in the background, while the next batch is
  read) and index them in key order at the end.
"""
from __future__ import annotations

import functools
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
from ._io.lmdbenv import copy_env, open_env, put_items, read_columns
from ._io.scan import listed_file_problem, scan_file
from ._io.segfile import StagedSegmentWriter
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


BATCH_BYTES = 8 << 20  # of a target's frames read, checked and appended at a time
INDEX_BATCH = 65536  # index entries built and put at a time


# ---------------------------------------------------------------------------- reading an index copy
def read_unit_index(env_dir: Path, *, check_format) -> Tuple[Any, bytes, Dict[int, int]]:
    """The entries of a checkpoint's unit index (already checked, in process or by a walk):
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
    copy_env(src / plan.index_dir, target / "index")  # (its bytes: a checkpoint's index has no free page)
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
    read this unit's frames of each source segment, a batch of at most ``BATCH_BYTES`` at a
    time, straight into the buffer of the new segment they go to (one ``pread`` per run of
    adjacent frames, without the GIL: nothing between them is read), check each frame there
    (the frame-check kernel: structure, exact extent, padding, CRC32C, the CRC the source
    index recorded, the row its key names), append the batch byte for byte (direct I/O where
    the file system takes it: no second copy), and index the frames in key order at the end.
    Returns bytes read."""
    SegInfo = UR.SegInfo
    t = plan.target
    src = Path(plan.src_dir)
    n = len(t.offset)
    files.mkdir(target)
    env = open_env(target / "index", max_dbs=4)
    infos: Dict[int, Any] = {}
    w: List[Optional[StagedSegmentWriter]] = [None]
    batch = max(1 << 16, min(BATCH_BYTES, segment_bytes))
    new_seg = np.zeros(n, np.uint32)
    new_off = np.zeros(n, np.uint64)
    gidx = t.gidx if t.gidx is not None else _key_gidxs(t.keys)
    read = 0
    try:
        db_loc = env.open_db(b"loc")
        db_segs = env.open_db(b"segs")

        def close_writer() -> None:
            cur = w[0]
            if cur is not None:
                cur.finish()
                infos[cur.seg_id] = SegInfo(cur.size, cur.size - SEGMENT_HEADER_SIZE, True)
                cur.close()
                w[0] = None

        def writer_for(nbytes: int) -> StagedSegmentWriter:
            """The segment the next ``nbytes`` go to (a new one past ``segment_bytes``)."""
            cur = w[0]
            if cur is None or (cur.size > SEGMENT_HEADER_SIZE and cur.size + nbytes > segment_bytes):
                seg_id = (cur.seg_id + 1) if cur is not None else 1
                close_writer()
                cur = w[0] = StagedSegmentWriter(target, unit_id, seg_id, capacity=batch)
            return cur

        for src_unit, seg, lo, hi in t.groups():
            path = str(src / plan.seg_paths[(src_unit, seg)])
            try:
                fd = files.open_regular(path, under=src)
            except FileNotFoundError as e:
                raise CorruptionError("checkpoint segment listed in MANIFEST.json is missing", path=path) from e
            except files.NotRegularFile as e:
                raise CorruptionError(f"checkpoint segment: {e.strerror}", path=str(e.filename or path)) from e
            try:
                cum = np.cumsum(t.length[lo:hi])
                i = lo
                while i < hi:  # a batch: the next frames of at most `batch` bytes (at least one frame)
                    done = int(cum[i - lo - 1]) if i > lo else 0
                    j = max(i + 1, lo + int(np.searchsorted(cum, done + batch, side="right")))
                    read += _copy_batch(fd, path, t, gidx, i, j, writer_for, new_seg, new_off)
                    i = j
            finally:
                os.close(fd)
        close_writer()
        vals = np.zeros(n, LOC_DTYPE)
        vals["seg"], vals["offset"], vals["length"], vals["crc"] = new_seg, new_off, t.length, t.crc
        order = _key_order(t, gidx)
        take = getattr(t.keys, "take", None)  # a planner KeyList: the keys picked at once
        with env.begin(write=True) as txn:
            cur = txn.cursor(db_loc)
            vtype = np.dtype((np.void, LOC_DTYPE.itemsize))
            for a in range(0, n, INDEX_BATCH):  # in key order: appended, no search per entry
                sel = order[a:a + INDEX_BATCH]
                keys = take(sel) if take is not None else [t.keys[k] for k in sel.tolist()]
                put_items(cur, list(zip(keys, vals[sel].view(vtype).tolist())), ascending=True)
            for s, info in infos.items():
                txn.put(UR.seg_key(s), info.pack(), db=db_segs)
        env.sync(True)
    finally:
        if w[0] is not None:
            w[0].close()
        env.close()
    return read


def _key_gidxs(keys: Sequence[bytes]) -> np.ndarray:
    """The rows (u64) the index keys ``keys`` name (their first 8 bytes, big-endian)."""
    return np.frombuffer(b"".join(k[:8] for k in keys), ">u8").astype(np.uint64) if len(keys) \
        else np.zeros(0, np.uint64)


def _key_order(t, gidx: np.ndarray) -> np.ndarray:
    """Positions of ``t``'s frames in the order of their index keys."""
    if t.key_rank is not None:  # a row's frames come from one source, whose keys ascend: (gidx, rank)
        return np.lexsort((np.asarray(t.key_rank, np.int64), gidx))
    keys = list(t.keys)
    return np.asarray(sorted(range(len(keys)), key=keys.__getitem__), np.int64)


def _copy_batch(fd: int, path: str, t, gidx: np.ndarray, i: int, j: int, writer_for,
                new_seg: np.ndarray, new_off: np.ndarray) -> int:
    """Frames ``i:j`` of ``t`` (one source segment, ``fd``): read back to back into the space of
    the segment they go to, verify, append; their new locations go to ``new_seg``/``new_off``.
    Returns bytes read."""
    off = t.offset[i:j]
    ln = t.length[i:j]
    total = int(ln.sum())
    rel = np.cumsum(ln) - ln  # where each frame lies in the batch
    runs = np.flatnonzero(np.r_[True, off[1:] != off[:-1] + ln[:-1]])  # adjacent frames: one read
    w = writer_for(total)
    view = w.space(total)
    try:
        got = files.read_ranges(fd, off[runs], np.add.reduceat(ln, runs), view)
        if got != total:
            k = int(np.searchsorted(rel + ln, got, side="right"))
            raise CorruptionError("checkpoint segment is truncated: a frame lies past its end", path=path,
                                  offset=int(off[k]))
        loc = np.zeros(j - i, LOC_DTYPE)
        loc["offset"], loc["length"], loc["crc"] = rel, ln, t.crc[i:j]
        want = np.ascontiguousarray(gidx[i:j], np.uint64)
        res = check_run(view, loc, want)  # every check of a reader; readers refuse what fails
        bad = first_fault(view, loc, res, want)
        if bad is not None:
            k, fault = bad
            raise fault.error(path=path, offset=int(off[k]), prefix="checkpoint segment: ")
    finally:
        view.release()
    at = w.commit(total)
    new_seg[i:j] = w.seg_id
    new_off[i:j] = at + rel
    return total
