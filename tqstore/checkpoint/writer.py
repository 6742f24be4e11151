"""Writing a checkpoint: the MVCC cut, one writer per unit, MANIFEST.json last, publication.

Steps (docs/FORMAT.md, "Checkpoints"):

1. the cut (:meth:`Store.snapshot` under the store's write lock): every unit seals its
   active segment and opens a read transaction, the controller opens one;
2. into ``<dir>.tmp-XXXXXXXX`` beside the target: the controller and each unit index as
   compact LMDB copies of the cut's transactions, each referenced segment hard-linked
   (same file system), linked from an earlier generation holding the same bytes, or
   copied with copy_file_range and verified frame by frame against the index CRCs; every
   file fsynced, then every directory;
3. MANIFEST.json (sizes and CRC32C of every file) written and fsynced: the commit point;
4. :func:`tqstore._io.files.publish_dir`: rename into place (replacing an existing
   checkpoint through ``<dir>.old``), fsync the parent.

A failure at any step removes the temporary directory and leaves any previous checkpoint
at ``<dir>`` untouched.  The target is checked first (:func:`target.check_target`: only a
checkpoint is replaced, never a file, a user's or a store's directory; symlinks resolved)
and again right before publication.  The lock file of the path (``.<name>.lock`` in the
parent directory, a generation root's ``.tqstore-checkpoints.lock``) is held exclusively
while stale temporary directories are removed and the new one is made, and while the new
checkpoint is published; readers hold it shared, so a load sees the old checkpoint or the
new one.  The temporary directory is marked in use (:func:`tqstore._io.locks.hold_dir`)
while it is written, so a cleaner never removes a concurrent save's work.
"""
from __future__ import annotations

import contextlib
import logging
import os
import secrets
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Tuple

import lmdb
import numpy as np

from .._format import controller_records as CR, unit_records as UR
from .._format.index import LOC_DTYPE
from .._format.segment import segment_name
from .._io import files, locks
from .._io.lmdbenv import DEFAULT_MAP_BYTES, copy_txn_compact
from ..errors import CheckpointError, CorruptionError, StorageIOError, TqstoreError
from . import manifest as M
from . import target as T
from .planner import COPY, LINK, REUSE, Reusable, SegmentSource, SegmentWrite, plan_segment_writes
from .scan import identity, scan_file

log = logging.getLogger("tqstore")

PathLike = Any
_CRC_CACHE_MAX = 1 << 16
_crc_cache: "OrderedDict[str, int]" = OrderedDict()
_crc_lock = threading.Lock()


def _cached_crc(ident: str) -> Optional[int]:
    with _crc_lock:
        v = _crc_cache.get(ident)
        if v is not None:
            _crc_cache.move_to_end(ident)
        return v


def _remember_crc(ident: str, crc: int) -> None:
    with _crc_lock:
        _crc_cache[ident] = crc
        _crc_cache.move_to_end(ident)
        while len(_crc_cache) > _CRC_CACHE_MAX:
            _crc_cache.popitem(last=False)


@dataclass(frozen=True)
class CheckpointInfo:
    """Summary of a completed save.

    ``stall_s`` is what the caller waited for the cut; ``write_s`` the time from the cut to
    the publication.  ``copied_bytes`` were physically written, ``linked_bytes`` hard-linked
    from the store, ``reused_bytes`` hard-linked from an earlier generation;
    ``checksummed_bytes`` of segments were read to compute or check CRCs (segments already
    checksummed by this process or an earlier generation are not read again).
    """

    path: Path
    num_units: int
    rows: int
    partitions: int
    include_storage: bool
    files: int
    total_bytes: int
    copied_bytes: int
    linked_bytes: int
    reused_bytes: int
    checksummed_bytes: int
    stall_s: float
    write_s: float
    metadata: Dict[str, Any] = field(default_factory=dict)


class SaveHandle:
    """The pending result of ``save_checkpoint(..., blocking=False)``.

    The cut is taken when the handle is returned; the write runs in a background thread.
    :meth:`result` waits and returns the :class:`CheckpointInfo` or raises the save's
    error.  An error not retrieved through :meth:`result` is raised by the store's next
    checkpoint call instead.
    """

    def __init__(self, path: Path, stall_s: float) -> None:
        self.path = path
        self.stall_s = stall_s
        self._event = threading.Event()
        self._info: Optional[CheckpointInfo] = None
        self._error: Optional[BaseException] = None
        self._reported = False

    def done(self) -> bool:
        """True once the save has finished (published or failed)."""
        return self._event.is_set()

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Wait for the save to finish; False on timeout."""
        return self._event.wait(timeout)

    def result(self, timeout: Optional[float] = None) -> CheckpointInfo:
        """The save's summary once it is durable and published.

        Raises:
            TimeoutError: not finished within ``timeout`` seconds.
            CheckpointError, CorruptionError: the save failed (the previous checkpoint at
                the path, if any, is intact).
        """
        if not self._event.wait(timeout):
            raise TimeoutError(f"checkpoint save to {self.path} still running after {timeout} s")
        if self._error is not None:
            self._reported = True
            raise self._error
        assert self._info is not None
        return self._info

    def exception(self, timeout: Optional[float] = None) -> Optional[BaseException]:
        """The save's error (None if it succeeded); waits like :meth:`result`."""
        if not self._event.wait(timeout):
            raise TimeoutError(f"checkpoint save to {self.path} still running after {timeout} s")
        if self._error is not None:
            self._reported = True
        return self._error

    def _finish(self, info: Optional[CheckpointInfo], error: Optional[BaseException]) -> None:
        self._info, self._error = info, error
        self._event.set()

    def __repr__(self) -> str:
        state = "running" if not self.done() else ("failed" if self._error else "done")
        return f"<SaveHandle {self.path} {state}>"


class _State:
    """Per-store checkpoint state: one save in flight, calls serialised."""

    def __init__(self) -> None:
        self.lock = threading.RLock()  # re-entered by a restore that settles, locks, then loads
        self.inflight: Optional[SaveHandle] = None


def state_of(store) -> _State:
    st = store.__dict__.get("_tq_checkpoint_state")
    if st is None:
        st = store.__dict__.setdefault("_tq_checkpoint_state", _State())
    return st


def settle(state: _State) -> None:
    """Wait for the in-flight save; raise its error if nobody has seen it yet."""
    h = state.inflight
    if h is None:
        return
    h.wait()
    state.inflight = None
    if h._error is not None and not h._reported:
        h._reported = True
        raise CheckpointError(f"the background checkpoint save to {h.path} failed: {h._error}") from h._error


def wait_quietly(store) -> None:
    """Wait for an in-flight save (used by ``Store.close``); errors are logged, not raised."""
    st = store.__dict__.get("_tq_checkpoint_state")
    if st is None:
        return
    h = st.inflight
    if h is not None:
        h.wait()
        if h._error is not None and not h._reported:
            log.error("background checkpoint save to %s failed: %s", h.path, h._error)


@contextlib.contextmanager
def path_lock(lock_path: Path) -> Iterator[None]:
    """An exclusive flock on ``lock_path`` (created if missing), released on exit."""
    with locks.flocked(lock_path):
        yield


def default_lock_path(final: Path) -> Path:
    return T.lock_path_for(final)


def clean_stale(parent: Path, name: str) -> None:
    """Remove temporary directories of interrupted saves to ``parent/name`` (caller holds the
    lock); one a running save still marks as in use is left alone."""
    for n in files.listdir(parent):
        if n.startswith(name + ".tmp-"):
            if locks.dir_in_use(parent / n):
                continue
            log.info("removing %s left by an interrupted checkpoint save", parent / n)
            files.rmtree(parent / n)


# ---------------------------------------------------------------------------- the cut
@dataclass
class Cut:
    snap: Any  # StoreSnapshot
    controller_env: Any
    controller_dbs: Dict[str, Any]
    num_units: int
    store_root: Path
    stall_s: float


def take_cut(store) -> Cut:
    """The MVCC cut, under the store's write lock (held only for the cut)."""
    t0 = time.perf_counter()
    with store._write_lock:
        snap = store.snapshot()
        ctrl = store.controller
        cut = Cut(snap, ctrl.env, ctrl.db, store.num_units, Path(store.root), 0.0)
    cut.stall_s = time.perf_counter() - t0
    return cut


# ---------------------------------------------------------------------------- the job
@dataclass
class _UnitResult:
    entries: List[M.FileEntry]
    frames: int
    live_bytes: int
    copied: int
    linked: int
    reused: int
    checksummed: int


class SaveJob:
    """Writes one cut to ``final``. :meth:`run` always releases the cut."""

    def __init__(self, cut: Cut, final: Path, *, include_storage: bool, metadata: Dict[str, Any],
                 copy_segments: bool, reuse: Mapping[str, Reusable], lock_path: Optional[Path],
                 on_published: Optional[Callable[[CheckpointInfo], None]], max_workers: int = 8,
                 kind: T.TargetKind = T.CHECKPOINT) -> None:
        self.cut = cut
        self.final = final
        self.include_storage = include_storage
        self.metadata = metadata
        self.copy_segments = copy_segments
        self.reuse = reuse
        self.lock_path = lock_path or default_lock_path(final)
        self.on_published = on_published
        self.max_workers = max_workers
        self.kind = kind
        raw = cut.snap.controller_txn.get(CR.META_PUT_TOKEN, db=cut.controller_dbs["meta"])
        self.put_token = CR.decode_optional_decimal(raw)  # overwriting puts the controller committed

    def run(self) -> CheckpointInfo:
        t0 = time.perf_counter()
        try:
            info = self._run_locked(t0)
        except TqstoreError:
            raise
        except (OSError, lmdb.Error) as e:
            raise CheckpointError(f"saving checkpoint {self.final} failed: {e}; any previous checkpoint there is "
                                  f"intact") from e
        finally:
            self.cut.snap.release()
        if self.on_published is not None:
            try:
                self.on_published(info)
            except Exception:  # noqa: BLE001 - the checkpoint itself is durable
                log.exception("post-publication step after saving %s failed", self.final)
        return info

    def _run_locked(self, t0: float) -> CheckpointInfo:
        final = self.final
        parent = final.parent
        files.mkdir(parent, exist_ok=True, parents=True)
        with path_lock(self.lock_path):
            clean_stale(parent, final.name)
            tmp = parent / f"{final.name}.tmp-{secrets.token_hex(4)}"
            files.mkdir(tmp)
            mark = locks.hold_dir(tmp)
        try:
            info = self._write(tmp, t0)
            with path_lock(self.lock_path):  # readers hold it shared: they see the old or the new one
                T.check_target(final, self.kind, live_store=self.cut.store_root)  # still ours to replace?
                files.publish_dir(tmp, final)
        except BaseException:
            try:
                files.rmtree(tmp)
            except OSError:
                log.warning("could not remove %s after a failed save", tmp)
            raise
        finally:
            locks.release_dir(mark)
        log.info("saved checkpoint %s: %d rows, %d units, %.1f MiB (%.1f MiB copied) in %.3f s", final, info.rows,
                 info.num_units, info.total_bytes / 2**20, info.copied_bytes / 2**20, info.write_s)
        return info

    def _write(self, tmp: Path, t0: float) -> CheckpointInfo:
        cut = self.cut
        snap = cut.snap
        files.mkdir(tmp / "controller")
        copy_txn_compact(cut.controller_env, tmp / "controller", snap.controller_txn)
        ctrl_entry = _seal_index_file(tmp / M.CONTROLLER_FILE, M.CONTROLLER_FILE, M.ROLE_CONTROLLER, None)
        files.fsync_dir(tmp / "controller")
        txn, dbs = snap.controller_txn, cut.controller_dbs
        raw_next = txn.get(CR.META_NEXT_GIDX, db=dbs["meta"])
        snapshot = {
            "rows": txn.stat(dbs["rows"])["entries"],
            "partitions": txn.stat(dbs["parts"])["entries"],
            "next_gidx": CR.decode_optional_decimal(raw_next),
            "store": str(cut.store_root),
        }
        entries = [ctrl_entry]
        results: List[_UnitResult] = []
        if self.include_storage:
            link = (not self.copy_segments) and files.same_filesystem(cut.store_root, tmp)
            views = snap.unit_views
            workers = max(1, min(self.max_workers, len(views)))
            with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tqstore-ckpt") as pool:
                futs = [pool.submit(self._write_unit, tmp, i, view, link) for i, view in enumerate(views)]
                errors = []
                for f in futs:
                    try:
                        results.append(f.result())
                    except BaseException as e:  # noqa: BLE001 - the first is re-raised below
                        errors.append(e)
                if errors:
                    raise errors[0]
            for r in results:
                entries.extend(r.entries)
        snapshot.update({
            "frames": sum(r.frames for r in results),
            "payload_bytes": sum(r.live_bytes for r in results),
            "segments": sum(1 for e in entries if e.role == M.ROLE_SEGMENT),
        })
        data = M.build(created_unix=time.time(), include_storage=self.include_storage, num_units=cut.num_units,
                       snapshot=snapshot, metadata=self.metadata, files=entries)
        files.write_file(tmp / M.MANIFEST_NAME, data, fsync=True)
        files.fsync_dir(tmp)
        index_bytes = sum(e.size for e in entries if e.role != M.ROLE_SEGMENT)
        return CheckpointInfo(
            path=self.final, num_units=cut.num_units, rows=snapshot["rows"], partitions=snapshot["partitions"],
            include_storage=self.include_storage, files=len(entries) + 1,
            total_bytes=sum(e.size for e in entries) + len(data),
            copied_bytes=index_bytes + len(data) + sum(r.copied for r in results),
            linked_bytes=sum(r.linked for r in results), reused_bytes=sum(r.reused for r in results),
            checksummed_bytes=sum(r.checksummed for r in results),
            stall_s=cut.stall_s, write_s=time.perf_counter() - t0, metadata=dict(self.metadata))

    def _write_unit(self, tmp: Path, i: int, view, link: bool) -> _UnitResult:
        unit = view.unit
        udir = tmp / M.unit_dir_name(i)
        files.mkdir(udir)
        files.mkdir(udir / "index")
        # leftover undo records of an overwriting put (none unless a settle failed): the
        # checkpoint holds the state the controller committed, with no undo records
        undo: List[Tuple[bytes, bytes]] = []
        db_undo = getattr(unit, "db_undo", None)
        if db_undo is not None:
            undo = [(bytes(k), bytes(v)) for k, v in view.txn.cursor(db=db_undo)]
        put_back = {ik: v for (tok, ik), v in ((UR.decode_undo_key(k), v) for k, v in undo) if tok > self.put_token}
        if put_back:
            vals = b"".join(put_back.get(bytes(k), bytes(v)) for k, v in view.txn.cursor(db=unit.db_loc))
        else:
            vals = b"".join(view.txn.cursor(db=unit.db_loc).iternext(keys=False, values=True))
        per_seg = _SegmentFrames(vals)
        segs = view.segs
        unknown = sorted(set(per_seg.segs) - set(segs))
        if unknown:
            raise CorruptionError(f"unit {i} index names segments {unknown[:5]} it does not list; run verify on "
                                  f"the store", path=str(unit.path))
        copy_txn_compact(unit.env, udir / "index", view.txn)
        keep = {s: (segs[s].size, per_seg.live_bytes(s)) for s in per_seg.segs}
        if undo or set(segs) != set(keep) or any(not segs[s].sealed or segs[s].live != keep[s][1] for s in keep):
            _fix_index(udir / "index", keep, put_back, bool(undo))
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
        known = {src.identity: c for src in sources if (c := _cached_crc(src.identity)) is not None}
        plan = plan_segment_writes(sources, link=link, reuse=self.reuse, known_crc=known)
        entries: List[M.FileEntry] = []
        copied = linked = reused = checksummed = 0
        for w in plan:
            crc, method, summed = self._write_segment(w, udir, per_seg.frames(w.source.seg))
            checksummed += summed
            s = w.source
            rel = M.segment_file(i, s.seg)
            entries.append(M.FileEntry(rel, M.ROLE_SEGMENT, s.size, crc, i, s.seg, s.frames, s.live_bytes,
                                       s.identity))
            if method == COPY:
                copied += s.size
            elif method == LINK:
                linked += s.size
            else:
                reused += s.size
        rel = M.unit_index_file(i)
        entries.insert(0, _seal_index_file(tmp / rel, rel, M.ROLE_UNIT_INDEX, i))
        files.fsync_dir(udir / "index")
        files.fsync_dir(udir)
        return _UnitResult(entries, per_seg.total, sum(e.live_bytes or 0 for e in entries), copied, linked, reused,
                           checksummed)

    def _write_segment(self, w: SegmentWrite, udir: Path, frames: Callable[[], List[Tuple[int, int, int]]]
                       ) -> Tuple[int, str, int]:
        """Place one segment; returns (its CRC32C, the method used, bytes read to checksum)."""
        s = w.source
        dst = udir / segment_name(s.seg)
        if w.method == REUSE:
            try:
                if os.stat(w.link_from).st_size == s.size and not files.fsync_failed(w.link_from):
                    files.link(w.link_from, dst)
                    files.fsync_file(dst)
                    return int(w.crc32c), REUSE, 0  # type: ignore[arg-type]
            except FileNotFoundError:
                pass
            log.info("earlier generation's copy of %s is gone (or failed an fsync); writing it again", s.path)
            w = SegmentWrite(s, LINK if (s.sealed and s.file_size == s.size and not self.copy_segments
                                         and files.same_filesystem(s.path, udir)) else COPY, s.path, None)
        if w.method == LINK and files.fsync_failed(s.path):
            # an fsync of this file failed earlier: its pages read back but may not be on disk, and
            # fsyncing it again would report success; write the bytes into a fresh file instead
            w = SegmentWrite(s, COPY, s.path, None)
        if w.method == LINK:
            crc, summed = w.crc32c, 0
            if crc is None:
                crc, summed = _scan_or_raise(s.path, s.size, frames(), what="store segment"), s.size
                _remember_crc(s.identity, crc)
            files.link(s.path, dst)
            files.fsync_file(dst)  # the store's own pages: durable now
            return crc, LINK, summed
        n = files.copy_file(s.path, dst, fsync=False, length=s.size)
        if n != s.size:
            raise CorruptionError(f"segment holds {n} bytes, its index records {s.size}", path=s.path, offset=n)
        crc = _scan_or_raise(str(dst), s.size, frames(), what="copied segment", source=s.path)
        files.fsync_file(dst)
        _remember_crc(s.identity, crc)
        return crc, COPY, s.size


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

    def frames(self, seg: int) -> Callable[[], List[Tuple[int, int, int]]]:
        """A callable giving ``[(offset, length, crc), ...]`` of ``seg`` (built only if called)."""
        start, count, _ = self._where[seg]
        part = self._arr[start:start + count]
        return lambda: list(zip(part["offset"].tolist(), part["length"].tolist(), part["crc"].tolist()))


def _scan_or_raise(path: str, size: int, frames, *, what: str, source: Optional[str] = None) -> int:
    res = scan_file(path, size, frames=frames)
    if res.nread != size:
        raise CorruptionError(f"{what} is truncated at {res.nread} of {size} bytes", path=source or path,
                              offset=res.nread)
    if res.bad:
        b = res.bad[0]
        raise b.error(f"{what}: {b.message} ({len(res.bad)} bad frame(s))", path=source or path)
    return res.crc


def _seal_index_file(path: Path, rel: str, role: str, unit: Optional[int]) -> M.FileEntry:
    """fsync an LMDB copy and describe it (size, CRC32C, per-block CRCs)."""
    files.fsync_file(path)
    size = os.stat(path).st_size
    res = scan_file(path, size, block_bytes=M.INDEX_BLOCK_BYTES)
    if res.nread != size:
        raise StorageIOError(f"{path} changed while it was being checksummed")
    return M.FileEntry(rel, role, size, res.crc, unit, block_crc32c=tuple(res.blocks or [0]))


def _fix_index(index_dir: Path, keep: Dict[int, Tuple[int, int]], put_back: Dict[bytes, bytes],
               drop_undo: bool) -> None:
    """Make a copied unit index describe exactly what the checkpoint holds: the segments
    ``keep`` (id -> (size, live bytes)), all sealed; entries of uncommitted overwriting
    puts put back (``put_back``: index key -> replaced location); no undo records.

    (The cut may list a still-empty active segment, or dead segments kept only by another
    snapshot's pin.)  LMDB is opened without a lock file: the copy is private to this save.
    """
    SegInfo = UR.SegInfo  # the unit index's own record type

    env = lmdb.open(str(index_dir), map_size=DEFAULT_MAP_BYTES, max_dbs=4, lock=False, sync=False, metasync=False,
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
        env.sync(True)
    finally:
        env.close()


# ---------------------------------------------------------------------------- entry point
def save(store, checkpoint_dir: PathLike, *, include_storage: bool = True, metadata: Optional[Mapping] = None,
         blocking: bool = True, copy_segments: bool = False, reuse: Optional[Mapping[str, Reusable]] = None,
         lock_path: Optional[Path] = None, on_published: Optional[Callable[[CheckpointInfo], None]] = None,
         before_cut: Optional[Callable[[], None]] = None, kind: T.TargetKind = T.CHECKPOINT):
    """Save ``store`` to ``checkpoint_dir`` (see :meth:`CheckpointMixin.save_checkpoint`).

    ``checkpoint_dir`` is resolved (symlinks followed: a symlinked path publishes at its
    target) and checked with :func:`target.check_target` before the cut.
    """
    meta = M.check_metadata(metadata)
    final = T.check_target(checkpoint_dir, kind, live_store=store.root)
    if final.name in ("", ".", "..") or final.name.endswith(".old") or ".tmp-" in final.name:
        raise CheckpointError(f"{final} is not a usable checkpoint directory name")
    state = state_of(store)
    with state.lock:
        settle(state)
        if before_cut is not None:
            before_cut()
        cut = take_cut(store)
        job = SaveJob(cut, final, include_storage=include_storage, metadata=meta, copy_segments=copy_segments,
                      reuse=reuse or {}, lock_path=lock_path, on_published=on_published,
                      max_workers=max(1, min(8, store.num_units)), kind=kind)
        if blocking:
            return job.run()
        handle = SaveHandle(final, cut.stall_s)

        def body() -> None:
            try:
                info = job.run()
            except BaseException as e:  # noqa: BLE001 - handed to the caller through the handle
                log.error("background checkpoint save to %s failed: %s", final, e)
                handle._finish(None, e)
                return
            handle._finish(info, None)

        state.inflight = handle
        try:
            threading.Thread(target=body, name="tqstore-checkpoint-save", daemon=False).start()
        except BaseException:
            state.inflight = None
            cut.snap.release()
            raise
        return handle
