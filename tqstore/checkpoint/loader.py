"""Loading a checkpoint into a running store, transactionally.

The new state is built beside the live one by :meth:`Store.install_state` (which fsyncs
it, opens it and switches the ``CURRENT`` pointer with one rename); every byte taken from
the checkpoint is verified first.  Any failure before the switch leaves the running store
exactly as it was.

* every file is first checked to be a regular file (no symbolic link, FIFO or device) of
  the size MANIFEST.json records; every LMDB file is walked in a child process
  (:mod:`tqstore._io.lmdbwalk`, in parallel with the CRC checks of the index files) before
  this process maps it, and is then copied compacted (no free pages);
* same unit count: the controller and index files are checked and copied; every index
  entry must name bytes inside a listed segment (the checks of a deep
  :func:`verify_checkpoint`, same code); segments are hard-linked (same file system) or
  copied at once, and their CRC32C and every indexed frame are checked by background
  threads while the store opens the new parts (``before_switch`` waits for it);
* another unit count: the controller is copied with its unit count updated; every frame
  is routed to unit ``gidx % M`` (:func:`planner.plan_reshard`) and each target unit, in
  parallel, reads only its frames' byte ranges, checks each frame (the frame-check kernel) and appends
  the frames byte for byte to new segment files, indexing them as it goes;
* a checkpoint saved with ``include_storage=False``: the controller only; every row keeps
  its key, tag and consumption but no field is produced (no payload was saved).
"""
from __future__ import annotations

import logging
import mmap
import os
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import lmdb
import numpy as np

from .._format import controller_records as CR, unit_records as UR
from .._format.frame import check_run, first_fault
from .._format.index import LOC_DTYPE
from .._format.layout import SEGMENT_HEADER_SIZE
from .._format.segment import segment_name
from .._io import files
from .._io.lmdbenv import copy_env_compact, open_env
from .._io.lmdbwalk import LmdbWalk
from .._io.segfile import SegmentWriter
from ..errors import CheckpointError, CorruptionError, TqstoreError
from ..unit import check_index_format
from . import manifest as M
from .planner import FrameTable, TargetPlan, plan_load_mode, plan_reshard
from .scan import BadFrame, scan_file
from .verify import (
    _check_controller, _read_unit_index, bad_block, file_problem, frames_of, lmdb_walk, read_manifest, resolve_checkpoint_dir,
    unit_frames, walk_problems,
)

log = logging.getLogger("tqstore")

WINDOW_BYTES = 16 << 20  # of a source segment mapped at a time by one target
INDEX_BATCH = 20000


@dataclass(frozen=True)
class LoadInfo:
    """Summary of a completed load."""

    path: Path
    source_units: int
    num_units: int
    mode: str  # "same" | "reshard" | "metadata"
    rows: int
    total_bytes: int  # bytes of the checkpoint's files
    read_bytes: int  # bytes read and verified
    elapsed_s: float
    metadata: Dict[str, Any] = field(default_factory=dict)
    lmdb_walk_s: float = 0.0  # the out-of-process walk of the LMDB files (runs beside the CRC checks)


def _check_file(src: Path, e: M.FileEntry, *, frames=()) -> int:
    """Verify a checkpoint file against its manifest entry (and the ``frames`` its unit
    index names in it), stopping at the first bad block or frame; returns bytes read."""
    p = src / e.path
    prob = file_problem(src, e)
    if prob is not None:
        raise CorruptionError(f"checkpoint file: {prob.message}", path=prob.path, offset=prob.offset)
    res = scan_file(p, e.size, frames=frames, block_bytes=M.INDEX_BLOCK_BYTES if e.block_crc32c else None,
                    under=src, expect_blocks=e.block_crc32c, stop_at_bad=True)
    if res.bad or res.stopped or (res.nread == e.size and res.crc != e.crc32c):
        raise locate_damage(p, e, res)
    if res.nread != e.size:
        raise CorruptionError("checkpoint file is truncated", path=str(p), offset=res.nread)
    return res.nread


def locate_damage(p: Path, e: M.FileEntry, res) -> CorruptionError:
    """The most precise CorruptionError for a file whose CRC did not match."""
    if res.bad:
        b: BadFrame = res.bad[0]
        return b.error(f"checkpoint {e.role.replace('_', ' ')}: {b.message}", path=str(p))
    offset, where = bad_block(e, res)
    return CorruptionError(f"checkpoint file checksum mismatch{where}", path=str(p), offset=offset,
                           expected_crc=e.crc32c, actual_crc=None if res.stopped else res.crc)


def _set_controller_units(ctrl_dir: Path, n: int) -> None:
    env = open_env(ctrl_dir, max_dbs=12)
    try:
        meta = env.open_db(b"meta")
        with env.begin(write=True) as txn:
            txn.put(CR.META_NUM_UNITS, CR.encode_decimal(n), db=meta)
        env.sync(True)
    finally:
        env.close()


def _clear_produced(ctrl_dir: Path, num_units: int) -> None:
    from ..controller import Controller

    c = Controller(ctrl_dir, num_units=num_units)
    try:
        c.drop_fields({g: set(r.fields) for g, r in c.rows.items() if r.fields})
        c.env.sync(True)
    finally:
        c.close()


class Builder:
    """The ``build(new_state_dir)`` callback handed to :meth:`Store.install_state`.

    Same unit count: the controller and unit indexes are verified before anything opens
    them; the segments are placed (linked or copied) at once and verified by background
    threads while the store opens the new parts; :meth:`finish` (``before_switch``) waits
    for that verification and raises what it found, so nothing unverified is switched in.
    """

    def __init__(self, src: Path, man: M.Manifest, num_units: int, segment_bytes: int, max_workers: int,
                 walk: Optional[LmdbWalk] = None) -> None:
        self.src = src
        self.walk = walk
        self._frames: Dict[int, Dict[int, List[Tuple[int, int, int]]]] = {}
        self.man = man
        self.num_units = num_units
        self.segment_bytes = segment_bytes
        self.max_workers = max_workers
        self.mode = plan_load_mode(man.num_units, num_units, man.include_storage)
        self.read_bytes = 0
        self._pending: List[Any] = []
        self._vpool: Optional[ThreadPoolExecutor] = None

    def _walked(self) -> None:
        """Wait for the out-of-process walk of the LMDB files; raise what it found.  Nothing
        in this process maps a checkpoint's LMDB file before this returned."""
        if self.walk is None:
            return
        t0 = time.perf_counter()
        probs = walk_problems(self.walk)
        log.debug("LMDB walk of %s: %.3f s, waited %.3f s", self.src, self.walk.elapsed_s, time.perf_counter() - t0)
        if probs:
            raise probs[0].to_error()

    def __call__(self, new_dir: Path) -> str:
        ctrl = self.man.by_role(M.ROLE_CONTROLLER)[0]
        self.read_bytes += _check_file(self.src, ctrl)
        workers = max(1, min(self.max_workers, max(self.num_units, self.man.num_units)))
        if self.mode != "metadata":  # index CRCs while the walk runs
            idx = [self.man.find(M.unit_index_file(i)) for i in range(self.man.num_units)]
            with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tqstore-load") as pool:
                self.read_bytes += sum(pool.map(lambda e: _check_file(self.src, e), idx))
        self._walked()
        probs = _check_controller(self.src, self.man)  # unit and row counts, as a deep verify
        if probs:
            raise probs[0].to_error()
        files.mkdir(new_dir / "controller")
        copy_env_compact(self.src / "controller", new_dir / "controller")
        if self.man.num_units != self.num_units:
            _set_controller_units(new_dir / "controller", self.num_units)
        if self.mode == "metadata":
            _clear_produced(new_dir / "controller", self.num_units)
            return self.mode
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tqstore-load") as pool:
            if self.mode == "same":
                # a checkpoint file whose fsync failed in this process is copied, never linked and fsynced again
                link = files.same_filesystem(self.src, new_dir) and not any(
                    files.fsync_failed(self.src / e.path) for i in range(self.num_units)
                    for e in self.man.segments(i).values())
                self.read_bytes += sum(pool.map(lambda i: self._same_unit(new_dir, i, link), range(self.num_units)))
                # make the new state durable before the verification reads start competing with the
                # journal commits (install_state's own fsync pass then finds every file clean)
                files.fsync_tree(new_dir)
                verify_root = self.src if link else new_dir  # what the new state's files hold
                self._vpool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tqstore-verify")
                self._pending = [self._vpool.submit(self._verify_unit, verify_root, i) for i in range(self.num_units)]
            else:
                plan = self._plan(pool)
                self.read_bytes += sum(pool.map(lambda t: self._reshard_unit(new_dir, t), plan.targets))
        return self.mode

    def finish(self) -> None:
        """Wait for the background verification of the segments; raise the first problem."""
        errors = []
        for f in self._pending:
            try:
                self.read_bytes += f.result()
            except BaseException as e:  # noqa: BLE001 - the first is raised below
                errors.append(e)
        self._pending = []
        if errors:
            raise errors[0]

    def abandon(self) -> None:
        """After a failed install: stop the verification threads (their results do not matter)."""
        for f in self._pending:
            f.cancel()
        if self._vpool is not None:
            self._vpool.shutdown(wait=True)
            self._vpool = None
        self._pending = []

    # -------------------------------------------------------------- same unit count
    def _same_unit(self, new_dir: Path, i: int, link: bool) -> int:
        """Check and copy unit ``i``'s (verified, walked) index; link or copy its segments
        (verified later, frame by frame)."""
        udir = new_dir / M.unit_dir_name(i)
        files.mkdir(udir)
        files.mkdir(udir / "index")
        self._frames[i] = frames_of(self._unit_table(i))
        copy_env_compact(self.src / M.unit_dir_name(i) / "index", udir / "index")
        for seg, e in sorted(self.man.segments(i).items()):
            dst = udir / segment_name(seg)
            if link:
                files.link(self.src / e.path, dst)
            else:
                got = files.copy_file(self.src / e.path, dst, fsync=False)
                if got != e.size:
                    raise CorruptionError("checkpoint segment is shorter than MANIFEST.json records",
                                          path=str(self.src / e.path), offset=got)
        return 0

    def _unit_table(self, i: int) -> FrameTable:
        """Unit ``i``'s index entries, with the checks of a deep verify (shared code): the
        format version, every entry inside a listed segment, the segment records' sizes
        and the frame counts MANIFEST.json records."""
        table, probs = unit_frames(self.src, self.man, i)
        if not probs and table is not None:
            segs, counts = np.unique(table.seg, return_counts=True)
            have = dict(zip(segs.tolist(), counts.tolist()))
            for seg, e in sorted(self.man.segments(i).items()):
                if e.frames is not None and have.get(seg, 0) != e.frames:
                    raise CorruptionError(f"the unit index names {have.get(seg, 0)} frames in this segment, "
                                          f"MANIFEST.json records {e.frames}", path=str(self.src / e.path))
        if probs:
            raise probs[0].to_error()
        assert table is not None
        return table

    def _verify_unit(self, root: Path, i: int) -> int:
        n = 0
        frames = self._frames.get(i, {})
        for seg, e in sorted(self.man.segments(i).items()):
            try:
                n += _check_file(root, e, frames=frames.get(seg, ()))
            except CorruptionError as err:
                raise self._pinpoint(i, e) or (err if root == self.src else CorruptionError(
                    f"segment copied from the checkpoint does not verify: {err}", path=str(self.src / e.path)))
        return n

    def _pinpoint(self, unit: int, e: M.FileEntry) -> Optional[CorruptionError]:
        """A damaged segment: rescan it frame by frame to name the offset of the bad frame."""
        frames: Dict = defaultdict(list)
        if _read_unit_index(self.src, self.man, unit, frames):
            return None
        p = self.src / e.path
        try:
            res = scan_file(p, e.size, frames=sorted(frames.get((unit, e.seg), ())))
        except OSError:
            return None
        return locate_damage(p, e, res) if res.bad else None

    # -------------------------------------------------------------- another unit count
    def _plan(self, pool):
        refs = dict(zip(range(self.man.num_units), pool.map(self._unit_table, range(self.man.num_units))))
        return plan_reshard(refs, self.num_units)

    def _reshard_unit(self, new_dir: Path, t: TargetPlan) -> int:
        """Build target unit ``t``: map a window of each source segment at a time, touch only
        the target's frames in it, check each frame (the frame-check kernel: structure, exact
        extent, padding, CRC32C, the CRC the source index recorded), append the frames byte for
        byte to new segments and index them."""
        SegInfo = UR.SegInfo

        udir = new_dir / M.unit_dir_name(t.unit)
        files.mkdir(udir)
        env = open_env(udir / "index", max_dbs=4)
        infos: Dict[int, SegInfo] = {}
        items: List[tuple] = []
        w: List[Optional[SegmentWriter]] = [None]
        window = max(1 << 16, min(WINDOW_BYTES, self.segment_bytes))
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
                if cur is None or (cur.size > SEGMENT_HEADER_SIZE and cur.size + nbytes > self.segment_bytes):
                    seg_id = (cur.seg_id + 1) if cur is not None else 1
                    close_writer()
                    cur = w[0] = SegmentWriter(udir, t.unit, seg_id, create=True)
                return cur.seg_id, cur.append(iov)

            for src_unit, seg, lo, hi in t.groups():
                path = str(self.src / M.segment_file(src_unit, seg))
                try:
                    fd = files.open_regular(path, under=self.src)
                except FileNotFoundError as e:
                    raise CorruptionError("checkpoint segment listed in MANIFEST.json is missing", path=path) from e
                except files.NotRegularFile as e:
                    raise CorruptionError(f"checkpoint segment: {e.strerror}", path=str(e.filename or path)) from e
                try:
                    i = lo
                    while i < hi:
                        wstart = int(t.offset[i]) & ~(mmap.ALLOCATIONGRANULARITY - 1)
                        j = i + 1 + int(np.searchsorted(ends[i + 1:hi], wstart + window, side="right"))
                        self._copy_window(fd, path, wstart, int(ends[j - 1]), t, i, j, append, items)
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

    @staticmethod
    def _copy_window(fd: int, path: str, wstart: int, wend: int, t: TargetPlan, i: int, j: int, append,
                     items: List[tuple]) -> None:
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


def load(store, checkpoint_dir) -> LoadInfo:
    """Load a checkpoint into ``store`` (see :meth:`CheckpointMixin.load_checkpoint`)."""
    from .writer import settle, state_of

    t0 = time.perf_counter()
    state = state_of(store)
    with state.lock:
        settle(state)
        src = resolve_checkpoint_dir(checkpoint_dir)
        man = read_manifest(src)
        for e in man.files:  # cheap checks before taking the store's write lock: regular files, sizes
            prob = file_problem(src, e)
            if prob is not None:
                raise CorruptionError(f"checkpoint file: {prob.message}", path=prob.path, offset=prob.offset)
        lmdb_files = [e for e in man.files if e.role == M.ROLE_CONTROLLER or
                      (e.role == M.ROLE_UNIT_INDEX and plan_load_mode(man.num_units, store.num_units,
                                                                       man.include_storage) != "metadata")]
        walk = lmdb_walk(src, lmdb_files, first_only=True)  # runs while the lock is taken and CRCs are checked
        build = Builder(src, man, store.num_units, store._opts["segment_bytes"], max(1, min(8, store.num_units)),
                        walk=walk)
        try:
            # one MVCC cut, verified byte for byte: consistent by construction, no reconcile pass
            mode = store.install_state(build, reconcile=False, before_switch=build.finish)
        except TqstoreError:
            raise
        except (OSError, lmdb.Error) as e:
            raise CheckpointError(f"loading checkpoint {src} failed: {e}; the store is unchanged") from e
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:  # a value the new state cannot decode
            raise CorruptionError(f"checkpoint {src} holds an index value that cannot be decoded: {e!r}; the store "
                                  f"is unchanged", path=str(src)) from e
        finally:
            build.abandon()
            walk.cancel()
    info = LoadInfo(src, man.num_units, store.num_units, mode, man.rows, man.total_bytes, build.read_bytes,
                    time.perf_counter() - t0, dict(man.metadata), walk.elapsed_s)
    log.info("loaded checkpoint %s (%s, %d -> %d units, %d rows) in %.3f s", src, mode, man.num_units,
             store.num_units, man.rows, info.elapsed_s)
    return info
