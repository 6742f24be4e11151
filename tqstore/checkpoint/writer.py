"""Writing a checkpoint: the MVCC cut, every port's export, MANIFEST.json last, publication.

Orchestration only: the bytes move inside the controller and the units (owner-side I/O,
through :class:`~tqstore.ports.ControllerPort` and :class:`~tqstore.ports.UnitPort`).
Steps (docs/FORMAT.md, "Checkpoints"):

1. the cut (:meth:`Store.snapshot` under the store's write lock): every unit seals its
   active segment and pins a snapshot, the controller opens one; the cut is a set of ids;
2. into ``<dir>.tmp-XXXXXXXX`` beside the target, all in parallel:
   ``controller.export_snapshot`` writes a compact LMDB copy of the controller at the cut
   into ``controller/`` and answers the cut's summary (rows, partitions, next global
   index, put token: the one the cut read, else nothing is published); each unit's
   ``export_snapshot`` writes into ``unit-NNN/``: its index copy and each referenced
   segment hard-linked (same file system), linked from an earlier generation holding the
   same bytes, or copied with copy_file_range and verified frame by frame against the
   index CRCs (:mod:`tqstore.unit_export`); every file fsynced, then every directory; the
   ports answer manifest entries;
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
while it is written, so a cleaner never removes a concurrent save's work.  When a part is
gone (a unit's or the controller's actor, on the Ray backend) the save raises
:class:`~tqstore.errors.DistributedError` whose ``outcomes`` say what each part did.
"""
from __future__ import annotations

import atexit
import contextlib
import logging
import os
import secrets
import threading
import time
import weakref
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence

from .._format.names import check_flag
from ..call_checks import check_wait
from .._io import files, locks
from .._io.workpool import WorkPool
from ..errors import CheckpointError, DistributedError, StorageIOError, TqstoreError, WaitTimeoutError
from ..ports import ControllerExport, Reusable, UnitExport, check_no_restore
from . import manifest as M
from . import target as T

log = logging.getLogger("tqstore")

PathLike = Any


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
    error.  An error is raised by the store's next save, load or dump instead only when
    nobody asked for it: a handle whose :meth:`result` or :meth:`exception` was called
    (also one still waiting there, in another thread) reports its error there alone.
    """

    def __init__(self, path: Path, stall_s: float) -> None:
        self.path = path
        self.stall_s = stall_s
        self._event = threading.Event()
        self._info: Optional[CheckpointInfo] = None
        self._error: Optional[BaseException] = None
        self._reported = False
        self._claimed = False  # result() or exception() was called: the error is its caller's
        self._callbacks: List[Callable[[Optional[BaseException]], None]] = []
        self._callbacks_lock = threading.Lock()

    def done(self) -> bool:
        """True once the save has finished (published or failed)."""
        return self._event.is_set()

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Wait for the save to finish; False on timeout.  InvalidInputError for a ``timeout``
        that is not None or a number of seconds."""
        return self._event.wait(check_wait(timeout))

    def _timed_out(self, timeout: Optional[float]) -> WaitTimeoutError:
        return WaitTimeoutError.still_running(getattr(self, "what", "checkpoint save"), self.path, timeout)

    def result(self, timeout: Optional[float] = None) -> CheckpointInfo:
        """The save's summary once it is durable and published.

        Raises:
            WaitTimeoutError (a TimeoutError): not finished within ``timeout`` seconds.
            CheckpointError, CorruptionError: the save failed (the previous checkpoint at
                the path, if any, is intact, unless the message says the new one is in place
                and only making it durable failed).
        """
        self._claimed = True
        if not self.wait(timeout):
            raise self._timed_out(timeout)
        if self._error is not None:
            self._reported = True
            raise self._error
        assert self._info is not None
        return self._info

    def exception(self, timeout: Optional[float] = None) -> Optional[BaseException]:
        """The save's error (None if it succeeded); waits like :meth:`result`."""
        self._claimed = True
        if not self.wait(timeout):
            raise self._timed_out(timeout)
        if self._error is not None:
            self._reported = True
        return self._error

    def claim(self) -> None:
        """Take the handle's error for its caller (as :meth:`result` does when it starts
        waiting): the store's next call will not raise it.  (A Ray store's handle claims its
        host's before it polls.)"""
        self._claimed = True

    def add_done_callback(self, fn: Callable[[Optional[BaseException]], None]) -> None:
        """Call ``fn(error)`` (None: published) once the save has finished, on the thread that
        finished it, or at once when it has.  The error stays the handle's (not claimed: the
        store's next call still raises it when nobody asks); an error of ``fn`` is logged."""
        with self._callbacks_lock:
            if not self._event.is_set():
                self._callbacks.append(fn)
                return
        self._call_back(fn)

    def _call_back(self, fn: Callable[[Optional[BaseException]], None]) -> None:
        try:
            fn(self._error)
        except Exception:  # noqa: BLE001 - a caller's callback: logged, the save's outcome stands
            log.exception("a done callback of the %s to %s failed", getattr(self, "what", "checkpoint save"), self.path)

    def _finish(self, info: Optional[CheckpointInfo], error: Optional[BaseException]) -> None:
        self._info, self._error = info, error
        with self._callbacks_lock:
            self._event.set()
            callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            self._call_back(fn)

    def __repr__(self) -> str:
        state = "running" if not self.done() else ("failed" if self._error else "done")
        return f"<SaveHandle {self.path} {state}>"


class _State:
    """Per-store checkpoint state: one save in flight, calls serialised."""

    def __init__(self) -> None:
        self.lock = threading.RLock()  # re-entered by a restore that settles, locks, then loads
        self.inflight: Optional[SaveHandle] = None


_STATES: "weakref.WeakSet[_State]" = weakref.WeakSet()  # every store's, for the wait at interpreter exit


def state_of(store) -> _State:
    st = store.__dict__.get("_tq_checkpoint_state")
    if st is None:
        st = store.__dict__.setdefault("_tq_checkpoint_state", _State())
        _STATES.add(st)
    return st


def _finish_at_exit() -> None:
    """At interpreter exit, before thread pools refuse new work: wait for every store's
    background save or dump in flight, so that it publishes (it needs its pools to finish; a
    save still starting was dropped with "cannot schedule new futures after interpreter
    shutdown").  Errors are logged, as at ``close``."""
    for st in list(_STATES):
        h = st.inflight
        if h is not None:
            h.wait()
            if h._error is not None and not h._reported:
                log.error("background %s to %s failed: %s", getattr(h, "what", "checkpoint save"), h.path, h._error)


# (threading's exit hooks run before the executors' own, which stop new work: atexit's run after those)
getattr(threading, "_register_atexit", atexit.register)(_finish_at_exit)


def settle(state: _State) -> None:
    """Wait for the in-flight save; raise its error if nobody asked for it (no caller of its
    handle's ``result``/``exception``, which another thread may be waiting in: the error is
    that caller's alone)."""
    h = state.inflight
    if h is None:
        return
    h.wait()
    state.inflight = None
    if h._error is not None and not h._reported and not h._claimed:
        h._reported = True
        raise CheckpointError(f"the background {getattr(h, 'what', 'checkpoint save')} to {h.path} failed: "
                              f"{h._error}") from h._error


def wait_quietly(store) -> None:
    """Wait for an in-flight save (used by ``Store.close``); errors are logged, not raised."""
    st = store.__dict__.get("_tq_checkpoint_state")
    if st is None:
        return
    h = st.inflight
    if h is not None:
        h.wait()
        if h._error is not None and not h._reported:
            log.error("background %s to %s failed: %s", getattr(h, "what", "checkpoint save"), h.path, h._error)


@contextlib.contextmanager
def path_lock(lock_path: Path) -> Iterator[None]:
    """An exclusive flock on ``lock_path`` (created if missing), released on exit."""
    with locks.flocked(lock_path):
        yield


def default_lock_path(final: Path) -> Path:
    return T.lock_path_for(final)


def clean_stale(parent: Path, name: str) -> None:
    """Remove temporary directories of interrupted saves to ``parent/name`` (caller holds the
    lock): ``<name>.tmp-XXXXXXXX`` (8 lowercase hex digits) directories that hold only what a
    save writes (:func:`~tqstore.checkpoint.target.is_save_leftover`); one a running save
    still marks as in use is left alone, and so is anything else of a similar name (a
    user's file or directory, a symbolic link, a store)."""
    for n in files.listdir(parent):
        if T.is_tmp_name(n, name) and T.is_save_leftover(parent / n):
            if locks.dir_in_use(parent / n):
                continue
            log.info("removing %s left by an interrupted checkpoint save", parent / n)
            files.rmtree(parent / n)


# ---------------------------------------------------------------------------- the cut
@dataclass
class Cut:
    snap: Any  # StoreSnapshot: ids, resolved by snap.controller and snap.ports
    num_units: int
    store_root: Path
    stall_s: float
    put_token: int = 0  # the controller's last committed overwriting put at the cut


def take_cut(store) -> Cut:
    """The MVCC cut, under the store's write lock (held only for the cut): no put commits
    meanwhile, so the controller's ``put_token`` read here is the one its snapshot holds."""
    t0 = time.perf_counter()
    with store._write_lock:
        check_no_restore(store.controller, None, "a full checkpoint save")  # a cut never holds half a restore
        snap = store.snapshot()
        cut = Cut(snap, store.num_units, Path(store.root), 0.0, int(snap.controller.put_token))
    cut.stall_s = time.perf_counter() - t0
    return cut


def write_error(doing: str, noun: str, e: OSError) -> CheckpointError:
    """The CheckpointError for a save (or dump: ``noun``) that failed with ``e`` while
    ``doing``: the previous one at the path is intact, unless only the fsync after the
    replacing rename failed (:class:`~tqstore._io.files.PublishedNotDurable`): then the new one
    is in place, and a crash may bring the previous one back."""
    if isinstance(e, files.PublishedNotDurable):
        return CheckpointError(f"{doing}: the new {noun} is in place, but making it durable failed: {e}; after a "
                               f"crash the previous one may be there instead (either is whole)")
    return CheckpointError(f"{doing} failed: {e}; any previous {noun} there is intact")


# ---------------------------------------------------------------------------- the job
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

    def run(self) -> CheckpointInfo:
        t0 = time.perf_counter()
        try:
            info = self._run_locked(t0)
        except StorageIOError as e:  # (a part's I/O error: the save failed as any other write would)
            raise write_error(f"saving checkpoint {self.final}", "checkpoint", e) from e
        except TqstoreError:
            raise
        except OSError as e:
            raise write_error(f"saving checkpoint {self.final}", "checkpoint", e) from e
        finally:
            self.cut.snap.release_after(f"the save of {self.final}")
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
        """cut (ids) -> the controller's export beside every unit's export, in parallel -> MANIFEST.json."""
        cut = self.cut
        snap = cut.snap
        futures: List[Future] = []
        if self.include_storage:
            ports = snap.ports
            workers = max(1, min(self.max_workers, len(ports)))

            def export(i: int) -> UnitExport:
                return ports[i].export_snapshot(snap.unit_snaps[i], str(tmp / M.unit_dir_name(i)),
                                                link=not self.copy_segments, reuse=self.reuse,
                                                put_token=cut.put_token, index_block_bytes=M.INDEX_BLOCK_BYTES)

            # the units start first: none waits for the controller's copy (a fixed cost of
            # every generation), the put token they need was read at the cut
            futures = [export_pool(workers).submit(export, i) for i in range(len(ports))]
        try:
            ctrl: ControllerExport = snap.controller.export_snapshot(snap.controller_snap, str(tmp / "controller"),
                                                                     index_block_bytes=M.INDEX_BLOCK_BYTES)
        except BaseException as e:
            wait(futures)  # none still writes into the directory the caller removes next
            raise parts_failed(self.final, e, futures) or e
        try:
            results: List[UnitExport] = gather(futures)
        except BaseException as e:
            raise parts_failed(self.final, None, futures) or e
        if int(ctrl.summary["put_token"]) != cut.put_token:
            raise CheckpointError(f"the controller's snapshot holds put token {ctrl.summary['put_token']}, the cut "
                                  f"read {cut.put_token}; nothing was published (report this as a bug)")
        entries = [_entry("controller", e, M.ROLE_CONTROLLER) for e in ctrl.files]
        snapshot = {k: ctrl.summary[k] for k in ("rows", "partitions", "next_gidx")}
        snapshot["store"] = str(cut.store_root)
        for i, r in enumerate(results):
            entries.extend(_entry(M.unit_dir_name(i), e, e["role"]) for e in r.files)
        snapshot.update({
            "frames": sum(r.frames for r in results),
            "payload_bytes": sum(r.live_bytes for r in results),
            "segments": sum(1 for e in entries if e.role == M.ROLE_SEGMENT),
        })
        data = M.build(created_unix=time.time(), include_storage=self.include_storage, num_units=cut.num_units,
                       snapshot=snapshot, metadata=self.metadata, files=entries)
        files.write_file(tmp / M.MANIFEST_NAME, data, fsync=True, new=True)
        files.fsync_dir(tmp)
        index_bytes = sum(e.size for e in entries if e.role != M.ROLE_SEGMENT)
        return CheckpointInfo(
            path=self.final, num_units=cut.num_units, rows=snapshot["rows"], partitions=snapshot["partitions"],
            include_storage=self.include_storage, files=len(entries) + 1,
            total_bytes=sum(e.size for e in entries) + len(data),
            copied_bytes=index_bytes + len(data) + sum(r.copied_bytes for r in results),
            linked_bytes=sum(r.linked_bytes for r in results), reused_bytes=sum(r.reused_bytes for r in results),
            checksummed_bytes=sum(r.checksummed_bytes for r in results),
            stall_s=cut.stall_s, write_s=time.perf_counter() - t0, metadata=dict(self.metadata))


_ROLES = {M.ROLE_CONTROLLER, M.ROLE_UNIT_INDEX, M.ROLE_SEGMENT}


def _entry(prefix: str, e: Mapping[str, Any], role: str) -> M.FileEntry:
    """A manifest entry from a port's answer (``path`` relative to the directory it exported into)."""
    if role not in _ROLES or e.get("role") != role:
        raise CheckpointError(f"an export answered a file of role {e.get('role')!r} where {role!r} belongs")
    blocks = e.get("block_crc32c")
    return M.FileEntry(f"{prefix}/{e['path']}", role, int(e["size"]), int(e["crc32c"]), e.get("unit"), e.get("seg"),
                       e.get("frames"), e.get("live_bytes"), e.get("origin"),
                       tuple(blocks) if blocks is not None else None)


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
    blocking = check_flag("blocking", blocking)
    include_storage = check_flag("include_storage", include_storage)
    copy_segments = check_flag("copy_segments", copy_segments)
    final = T.check_target_settled(checkpoint_dir, kind, live_store=store.root,
                                   lock=lock_path or default_lock_path(checkpoint_dir))
    if final.name in ("", ".", "..") or final.name.endswith(".old") or ".tmp-" in final.name:
        raise CheckpointError(f"{final} is not a usable checkpoint directory name")
    state = state_of(store)
    background_pool()
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
        return start_in_background(state, cut, SaveHandle(final, cut.stall_s), job.run,
                                   f"background checkpoint save to {final}", _start_thread)


_POOL: Optional[ThreadPoolExecutor] = None
_POOL_LOCK = threading.Lock()
_EXPORT_POOLS: Dict[int, ThreadPoolExecutor] = {}


def background_pool() -> ThreadPoolExecutor:
    """The threads background saves run on: kept between calls and started before the first
    non-blocking save needs one (:func:`save` calls this first), so handing a save over costs
    a queue put, not a thread start: ``Thread.start`` waits for the new thread, which then
    runs the save holding the GIL, and the caller's stall became that thread's first
    time slice.  At interpreter exit, a save or dump in flight is waited for before any pool
    stops taking work (:func:`_finish_at_exit`), so it publishes; made anew in a forked child."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = WorkPool(max_workers=4, thread_name_prefix="tqstore-checkpoint-save")
            _POOL.submit(lambda: None)  # its first thread starts now, not in a save's stall
        return _POOL


def parts_failed(final: Path, ctrl_error: Optional[BaseException], futures: Sequence[Future]
                 ) -> Optional[DistributedError]:
    """When a part of the save is gone (a :class:`DistributedError` from the controller's
    export, ``ctrl_error``, or from a unit's, ``futures`` all ended): one DistributedError whose
    ``outcomes`` say what happened to every part (``"exported"``, or the error); else None."""
    errors = [ctrl_error] + [f.exception() for f in futures]
    if not any(isinstance(e, DistributedError) for e in errors):
        return None
    names = ["controller"] + [f"unit {i}" for i in range(len(futures))]
    outcomes = {n: "exported" if e is None else f"failed: {type(e).__name__}: {e}" for n, e in zip(names, errors)}
    bad = [n for n, e in zip(names, errors) if e is not None]
    return DistributedError(f"saving checkpoint {final}: {', '.join(bad)} failed; nothing was published and any "
                            f"previous checkpoint there is intact", outcomes=outcomes)


def gather(futures: Sequence[Future]) -> List[Any]:
    """The results of ``futures`` in order, once every one has ended (none still runs when this
    returns or raises); the first error among them, in that order, is raised."""
    results, errors = [], []
    for f in futures:
        try:
            results.append(f.result())
        except BaseException as e:  # noqa: BLE001 - the first is re-raised below
            errors.append(e)
    if errors:
        raise errors[0]
    return results


def export_pool(workers: int) -> ThreadPoolExecutor:
    """The threads the units' exports of a save run on, ``workers`` of them (at most 8), kept
    between saves: a save no longer starts (and joins) a thread per unit, a fixed cost of every
    generation however little changed.  An export never waits for another task of this pool,
    so saves running at the same time share it without deadlock (their exports queue)."""
    workers = max(1, min(8, workers))
    with _POOL_LOCK:
        p = _EXPORT_POOLS.get(workers)
        if p is None:
            p = _EXPORT_POOLS[workers] = WorkPool(max_workers=workers,
                                                            thread_name_prefix="tqstore-ckpt-export")
        return p


def _forget_pool() -> None:
    """In a forked child: none of the parent's pools, nor its saves in flight (the child's
    exit must not wait for them: their threads are not in the child)."""
    global _POOL, _POOL_LOCK
    _POOL, _POOL_LOCK = None, threading.Lock()
    _EXPORT_POOLS.clear()
    _STATES.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def _start_thread(body: Callable[[], None]) -> None:
    background_pool().submit(body)


def start_in_background(state: Any, cut: Any, handle: Any, run: Callable[[], Any], what: str,
                        submit: Callable[[Callable[[], None]], Any]) -> Any:
    """Hand ``run`` (the write of ``cut``) to ``submit`` and return ``handle``, the store's one
    write in flight (``state.inflight``) until it finishes; ``run``'s result or error reaches
    the handle (an error is also logged, naming ``what``).  If ``submit`` itself fails, the
    cut is released and its error raised: nothing is in flight."""

    def body() -> None:
        try:
            out = run()
        except BaseException as e:  # noqa: BLE001 - handed to the caller through the handle
            log.error("%s failed: %s", what, e)
            handle._finish(None, e)
            return
        handle._finish(out, None)

    state.inflight = handle
    try:
        submit(body)
    except BaseException:
        state.inflight = None
        cut.snap.release()
        raise
    return handle
