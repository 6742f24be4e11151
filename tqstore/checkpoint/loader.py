"""Loading a checkpoint into a running store, transactionally.

The new state is built beside the live one by :meth:`Store.install_state` (which fsyncs
it, opens it and switches the ``CURRENT`` pointer with one rename); every byte taken from
the checkpoint is verified first.  Any failure before the switch leaves the running store
exactly as it was.  This module checks and plans; each port stages its own part of the new
state (``ControllerPort.stage_import``, ``UnitPort.stage_import`` / ``verify_import`` with a
:class:`~tqstore.ports.UnitImport` plan; the unit side is :mod:`tqstore.unit_import`).

* every file is first checked to be a regular file (no symbolic link, FIFO or device) of
  the size MANIFEST.json records; no LMDB file is mapped by LMDB in this process before
  every page LMDB can reach in it read checked and every entry has the shape its schema
  requires (:func:`~tqstore.checkpoint.verify.lmdb_problems`: the checked page reader of
  :mod:`tqstore._format.lmdb_pages` in this process, tens of milliseconds for a million
  entries; a file that does not read so is walked in a child process,
  :mod:`tqstore._io.lmdbwalk`, which decides).  The controller's copy (same unit count) is
  checked as the copy, the bytes LMDB will map.  Copies have no free page (a save's files
  are compacted copies, copied byte for byte);
* every file is its own task, all started at once: its CRC32C, then its check, reading
  and staging, so the segments of one unit are verified while other indexes are still read
  and the controller's entries are decoded and checked;
* same unit count: the controller and index files are checked and copied; every index
  entry must name bytes inside a listed segment (the checks of a deep
  :func:`verify_checkpoint`, same code); segments are hard-linked (same file system) or
  copied at once, and their CRC32C and every indexed frame are checked by background
  threads while the store opens the new parts (``before_switch`` waits for it);
* another unit count: the controller is copied with its unit count updated; every frame
  is routed to unit ``gidx % M`` (:func:`planner.plan_reshard`) and each target unit, in
  parallel, reads only its frames' byte ranges, checks each frame (the frame-check kernel) and appends
  the frames byte for byte to new segment files, indexing them in key order at the end; the
  loader asks the kernel to read each source unit's segments ahead (a hint, capped) as soon as
  its index file is read, so the disk works while the indexes are checked and planned;
* a checkpoint saved with ``include_storage=False``: the controller only; every row keeps
  its key, tag and consumption but no field is produced (no payload was saved).
"""
from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from .._gcpause import pausing
from .._io import files
from .._io.workpool import WorkPool
from .._io.scan import BadFrame, scan_file
from ..errors import CheckpointError, CorruptionError, TqstoreError
from ..ports import ControllerPort, UnitImport, UnitPort
from . import manifest as M
from .planner import FrameTable, plan_load_mode, plan_reshard
from .verify import (
    bad_block, check_controller_counts, file_problem, frames_of, lmdb_problems, read_manifest, resolve_checkpoint_dir,
    segment_header_problem, unit_frames,
)

log = logging.getLogger("tqstore")
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
    lmdb_check_s: float = 0.0  # the longest check of one LMDB file (in process, or a walk; beside the others)


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


class Builder:
    """The ``build(new_state_dir)`` callback handed to :meth:`Store.install_state`: checks and
    plans, then asks each port to stage its part of the new state (owner-side I/O).

    Same unit count: the controller and unit indexes are verified before anything opens
    them; each unit places its segments (linked or copied) at once and verifies them in
    background threads while the store opens the new parts; :meth:`finish`
    (``before_switch``) waits for that verification and raises what it found, so nothing
    unverified is switched in.
    """

    def __init__(self, src: Path, man: M.Manifest, controller: ControllerPort, units: Sequence[UnitPort],
                 max_workers: int) -> None:
        self.src = src
        self.lmdb_check_s = 0.0  # the longest check of one LMDB file
        self.man = man
        self.controller = controller
        self.units = list(units)
        self.num_units = len(self.units)
        self.max_workers = max_workers
        self.mode = plan_load_mode(man.num_units, self.num_units, man.include_storage)
        self.read_bytes = 0
        self._count_lock = threading.Lock()
        self._pending: List[Any] = []
        self._vpool: Optional[ThreadPoolExecutor] = None
        self.new_dir: Optional[Path] = None  # the state directory being built (set by __call__)
        self._early: Any = None  # the install's EarlyParts (set by __call__)

    def _read(self, n: int) -> None:
        with self._count_lock:
            self.read_bytes += n

    def _checked(self, e: M.FileEntry) -> None:
        """Check ``e`` (an LMDB file of the checkpoint) before this process maps it: in
        process, else walked in a child process (:func:`lmdb_problems`); raise what was found."""
        t0 = time.perf_counter()
        probs = lmdb_problems(self.src, [e], first_only=True)
        dt = time.perf_counter() - t0
        with self._count_lock:
            self.lmdb_check_s = max(self.lmdb_check_s, dt)
        log.debug("LMDB check of %s: %.3f s", self.src / e.path, dt)
        if probs:
            raise probs[0].to_error()

    def _controller_part(self, new_dir: Path) -> None:
        """The controller's file: CRC, check, staging, unit and row counts against the
        manifest (as a deep verify).  Its entries are decoded and checked once, by the store's
        open of the staged copy (the same checked decoder as a deep verify's), not a second
        time: with the install's ``early`` parts that open runs here, beside the units' staging
        and CRC checks, else :meth:`Store.install_state` runs it after the build.

        Same unit count and storage included: the file's bytes are staged first and the copy
        checked, every page and entry (``ControllerPort.stage_import(src_checked=False,
        sync=False)``): the checkpoint's file is never mapped, the copy is what LMDB opens, and
        its fsync (``ControllerPort.sync_staged``) runs beside that open.  Otherwise, or when
        the copy does not read checked, the checkpoint's file is checked (:meth:`_checked`:
        in process, else walked) before it is staged."""
        ctrl = self.man.by_role(M.ROLE_CONTROLLER)[0]
        self._read(_check_file(self.src, ctrl))
        target, src = str(new_dir / "controller"), str(self.src / "controller")
        num_units = self.num_units if self.man.num_units != self.num_units else None
        clear = self.mode == "metadata"
        copy_checked = num_units is None and not clear and self.controller.stage_import(
            target, src, src_checked=False, sync=False)
        with WorkPool(max_workers=1, thread_name_prefix="tqstore-fsync") as pool:
            # the byte copy's fsync runs beside its counts' check and decode; joined (its error
            # raised) before this returns, and before any error of theirs propagates
            synced = pool.submit(self.controller.sync_staged, target) if copy_checked else None
            if not copy_checked:
                self._checked(ctrl)
            probs = check_controller_counts(self.src, self.man, read_from=Path(target) if copy_checked else None)
            if probs:
                raise probs[0].to_error()
            if not copy_checked:
                self.controller.stage_import(target, src, num_units=num_units, clear_produced=clear)
            if self._early is not None:  # the checked decode, beside the units' work
                self._early.open_controller()
            if synced is not None:
                synced.result()

    def _index_part(self, i: int) -> FrameTable:
        """Unit ``i``'s index file: CRC (stopping at the first bad block), check (in process,
        else walked), entries read and checked against the manifest."""
        e = self.man.find(M.unit_index_file(i))
        self._read(_check_file(self.src, e))
        if self.mode == "reshard":  # its segments' reads start now (a hint), while the index is checked and planned
            threading.Thread(target=prefetch_segments, daemon=True, name="tqstore-prefetch",
                             args=(self.src, self.man, i, PREFETCH_BYTES // self.man.num_units)).start()
        self._checked(e)
        return self._unit_table(i)

    @pausing  # tens of thousands of small objects per source unit: no full collection of the heap meanwhile
    def __call__(self, new_dir: Path, early: Any = None) -> str:
        """Every file's checks and staging as tasks that start at once: each unit index is
        checked and read in its own task, each unit stages right after and its segments'
        verification starts in the background, while the controller's entries are decoded
        and checked beside them (``early``: the :class:`~tqstore.state_switch.EarlyParts` of the install,
        whose ``open_controller()`` opens the staged controller in the controller's task).
        All tasks have ended (none still writes into ``new_dir``) when this returns or raises."""
        self.new_dir = Path(new_dir)
        self._early = early
        n_src = self.man.num_units if self.mode != "metadata" else 0
        workers = max(1, min(self.max_workers, max(self.num_units, n_src)))
        link = False
        if self.mode == "same":
            # a checkpoint file whose fsync failed in this process is copied, never linked and fsynced again
            link = files.can_link(self.src, new_dir) and not any(
                files.fsync_failed(self.src / e.path) for i in range(self.num_units)
                for e in self.man.segments(i).values())
            self._vpool = WorkPool(max_workers=workers, thread_name_prefix="tqstore-verify")

        def same(i: int) -> None:  # plan (the index read and checked), stage, verify in the background
            plan = self._same_plan(i, link, self._index_part(i))
            target = str(new_dir / M.unit_dir_name(i))
            assert self._vpool is not None
            if link:  # linked: the verification reads the checkpoint's own files, so it starts before the staging
                self._pending.append((i, self._vpool.submit(self.units[i].verify_import, target, plan)))
            self._read(self.units[i].stage_import(target, plan))
            if not link:  # copied: it reads the copies
                self._pending.append((i, self._vpool.submit(self.units[i].verify_import, target, plan)))

        with WorkPool(max_workers=workers + 1, thread_name_prefix="tqstore-load") as pool:
            ctrl = pool.submit(self._controller_part, new_dir)
            if self.mode == "same":
                _first_error([ctrl] + [pool.submit(same, i) for i in range(self.num_units)])
            elif self.mode == "reshard":  # the targets start once every source index is read
                tables = [pool.submit(self._index_part, i) for i in range(n_src)]
                try:
                    _first_error(tables)
                    seg_paths = {(e.unit, e.seg): e.path for e in self.man.by_role(M.ROLE_SEGMENT)}
                    plan = plan_reshard({i: f.result() for i, f in enumerate(tables)}, self.num_units)
                    _first_error([pool.submit(self._reshard_target, new_dir, t, seg_paths) for t in plan.targets])
                finally:
                    _first_error([ctrl])
            else:
                ctrl.result()
        return self.mode

    def _reshard_target(self, new_dir: Path, t, seg_paths) -> None:
        self._read(self.units[t.unit].stage_import(str(new_dir / M.unit_dir_name(t.unit)),
                                                   UnitImport("reshard", str(self.src), target=t,
                                                              seg_paths=seg_paths)))

    def finish(self) -> None:
        """Wait for the background verification of the segments; raise the first problem."""
        errors = []
        for _i, f in sorted(self._pending, key=lambda p: p[0]):
            try:
                self._read(f.result())
            except BaseException as e:  # noqa: BLE001 - the first is raised below
                errors.append(e)
        self._pending = []
        if errors:
            raise errors[0]

    def abandon(self) -> None:
        """After a failed install: stop the verification threads (their results do not matter)."""
        for _i, f in self._pending:
            f.cancel()
        if self._vpool is not None:
            self._vpool.shutdown(wait=True)
            self._vpool = None
        self._pending = []

    def _same_plan(self, i: int, link: bool, table: FrameTable) -> UnitImport:
        """Unit ``i``'s part: its (verified, checked) index, its segments, the frames to check."""
        segs = sorted(self.man.segments(i).items())
        return UnitImport("same", str(self.src), index_dir=f"{M.unit_dir_name(i)}/index",
                          segments=[(seg, e.path, e.size, e.crc32c) for seg, e in segs],
                          frames=frames_of(table), link=link)

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


#: bytes of a checkpoint's segments a reshard load asks the kernel to read ahead at its start (all sources)
PREFETCH_BYTES = 1 << 30


def prefetch_segments(src: Path, man: M.Manifest, unit: int, max_bytes: int) -> None:
    """Start reading source unit ``unit``'s segments of a checkpoint into the page cache, at
    most ``max_bytes`` (a hint, see :func:`tqstore._io.files.prefetch`): a reshard load runs
    it once the unit's index file is read, while the indexes are checked and planned, so the
    targets, which read every live frame segment after segment, find the bytes read or on
    their way.  Raises nothing."""
    left = max_bytes
    for _seg, e in sorted(man.segments(unit).items()):
        if left <= 0:
            return
        files.prefetch(src / e.path, [(0, min(e.size, left))], under=src)
        left -= e.size


def _first_error(futs: Sequence[Future]) -> None:
    """Wait for every future; raise the first error (by submission order) once all ended."""
    errors = []
    for f in futs:
        try:
            f.result()
        except BaseException as e:  # noqa: BLE001 - the first is raised below
            errors.append(e)
    if errors:
        raise errors[0]


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
            if e.role == M.ROLE_SEGMENT:  # (another version is refused naming the checkpoint's file, whatever
                for prob in segment_header_problem(src, e):  # the unit counts: the reshard reads frames only)
                    raise prob.to_error()
        build = Builder(src, man, store.controller, store.units, max(1, min(8, store.num_units)))
        try:
            # one MVCC cut, verified byte for byte: consistent by construction, no reconcile pass
            mode = store.install_state(build, reconcile=False, before_switch=build.finish, early_open=True)
        except CorruptionError as e:
            staged = build.new_dir / "controller" if build.new_dir is not None else None
            if staged is not None and e.path is not None and Path(e.path).parent == staged:
                # the open of the staged copy decoded and checked the entries: name the checkpoint's file
                raise type(e)(f"checkpoint controller index: {e.message}; the store is unchanged",
                              path=str(src / M.CONTROLLER_FILE), offset=e.offset, expected_crc=e.expected_crc,
                              actual_crc=e.actual_crc) from e
            raise
        except TqstoreError:
            raise
        except OSError as e:
            raise CheckpointError(f"loading checkpoint {src} failed: {e}; the store is unchanged") from e
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:  # a value the new state cannot decode
            raise CorruptionError(f"checkpoint {src} holds an index value that cannot be decoded: {e!r}; the store "
                                  f"is unchanged", path=str(src)) from e
        finally:
            build.abandon()
    info = LoadInfo(src, man.num_units, store.num_units, mode, man.rows, man.total_bytes, build.read_bytes,
                    time.perf_counter() - t0, dict(man.metadata), build.lmdb_check_s)
    log.info("loaded checkpoint %s (%s, %d -> %d units, %d rows) in %.3f s", src, mode, man.num_units,
             store.num_units, man.rows, info.elapsed_s)
    return info
