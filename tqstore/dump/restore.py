"""``load_data_by_key`` and ``recover_data_load``: a selective restore orchestrated over the
ports (docs/FORMAT.md, "Selective restores").

A load, under an exclusive ``flock`` of ``<dir>.lock`` (every dump, load and recover of one
path, across processes):

1. :func:`~tqstore.dump.load.read_dump` checks everything but the frames; nothing is written
   on failure;
2. the ``<dir>.restore`` marker is written (a dump refuses to replace a directory a load
   may still read), then, under the store's write lock, the controller begins the restore
   (``begin_restore``: schema clashes and bad keys raise here, before anything is written;
   existing keys keep their gidx, new keys get reserved ones);
3. every target unit, in parallel: ``claim_restore`` → ``import_restore`` (its frames'
   byte ranges, CRC-checked, re-stamped where the gidx changes, staged) → ``complete_restore``;
4. under the store's write lock: every unit publishes (its staged entries into the index,
   keeping what they replace), the controller finishes (rows, tags, produced fields and
   schema in one transaction: the commit point), the units settle, the record is forgotten,
   the marker removed.

A failure before the commit point (in 1–3, or a unit's publish or the controller's finish
in 4) cancels the restore (units drop what they wrote, then the reserved indexes are freed)
and re-raises: the store is as it was; if the cancel fails too, the restore stays pending
and the error raised carries a note naming ``recover_data_load``.  A crash leaves the record: on
the next open a decided restore is settled by itself and a running one is unpublished and
stays pending (its partition's clears and puts of its keys raise ``RestorePendingError``)
until ``recover_data_load(dir)`` completes it (re-importing the units not complete) or
``recover_data_load(dir, cancel=True)`` cancels it.
"""
from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence

from ..errors import CapacityError, CheckpointNotFoundError, CorruptionError, DistributedError, TqstoreError
from . import publish as P
from .. import running_loads
from ..ports import ControllerPort, RestoreInfo, UnitPort  # noqa: F401 - UnitPort: the units' type
from .load import Dump, mapping_of, plan_imports, prefetch, read_dump

log = logging.getLogger("tqstore")


def dump_path(dump_dir) -> Path:
    """The dump's path as restores record it (absolute, symlinks resolved; CheckpointError for
    a name tqstore uses beside dumps)."""
    return P.resolve(dump_dir)


@contextlib.contextmanager
def dump_lock(d: Path) -> Iterator[bool]:
    """Hold ``<dir>.lock`` exclusively (as every dump, load and read of the path does) and
    repair an interrupted publication first; yields True.  When nothing of a dump is at
    ``d`` it creates nothing (no lock file, no directory) and yields False.

    A dump in a location this process cannot write (a read-only file system, a directory
    it may not write: :func:`~tqstore.dump.publish.writable`) is locked only when its lock
    file is there (through a read-only descriptor) and not repaired; yields True all the
    same when it is present (no dump can be published there through this process)."""
    if P.writable(d):
        with P.locked_if_present(d) as held:
            if held:
                P.repair(d)
            yield held
        return
    present = P.present(d)
    with P.locked(d, read_only_ok=True) if present else contextlib.nullcontext(False):
        yield present


def _unmark(d: Path, store) -> None:
    """Take ``store`` off the dump's restore marker (:func:`publish.unmark`; a failure is
    logged: the marker then stays until ``recover_data_load`` takes the store off)."""
    try:
        P.unmark(d, store.root)
    except OSError:
        log.warning("could not take %s off the restore marker of %s", store.root, d, exc_info=True)


def _plans(store, info: RestoreInfo, dump: Dump) -> List[Any]:
    """What each unit imports (:func:`~tqstore.dump.load.plan_imports`)."""
    return plan_imports(dump, mapping_of(info, dump), store.num_units)


def _run_units(store, info: RestoreInfo, plans: Sequence[Any], todo: Sequence[int]) -> int:
    """Claim, import and complete units ``todo`` in parallel; returns bytes read."""
    c: ControllerPort = store.controller

    def one(u: int) -> int:
        attempt = c.claim_restore(info.rid, u)
        n = store.units[u].import_restore(info.tag, plans[u]) if len(plans[u]) else 0
        c.complete_restore(info.rid, u, attempt)
        return n

    futures = [store._pool.submit(one, u) for u in todo]
    errors: List[BaseException] = []
    total = 0
    for f in futures:
        try:
            total += f.result()
        except BaseException as e:  # noqa: BLE001 - every unit finishes first, the first error is raised
            errors.append(e)
    if errors:
        raise errors[0]
    return total


def _each_unit(store, call) -> List[Any]:
    """``call(unit)`` on every unit in parallel (the store's pool); every one finishes, then the
    first error is raised.  Returns the results in unit order."""
    errors: List[BaseException] = []
    out: List[Any] = []
    for f in [store._pool.submit(call, u) for u in store.units]:
        try:
            out.append(f.result())
        except BaseException as e:  # noqa: BLE001 - collected, the first one raised
            errors.append(e)
    if errors:
        raise errors[0]
    return out


def _rows_changed(store, rid: Optional[str] = None) -> None:
    """A committed restore added rows with data: ``total_storage_size``'s count (kept by the
    store, updated by its own puts and clears) is taken again at the next put, and the rows
    the load of restore ``rid`` held in reserve there are let go (they are counted now)."""
    capacity = getattr(store, "_capacity", None)
    if capacity:
        capacity.forget()
        if rid is not None:
            capacity.release(rid)


def _settle(store, info: RestoreInfo, *, committed: bool) -> None:
    """Settle a decided restore on every unit, then forget it (the reserved gidxs of a
    cancelled one are freed only now)."""
    if committed:
        _rows_changed(store, info.rid)
    _each_unit(store, lambda u: u.settle_restore(info.tag, committed=committed))
    store.controller.forget_restore(info.rid)


def _reserve_room(store, info: RestoreInfo, dump: Dump, reserved: contextlib.ExitStack) -> None:
    """Completing a pending restore (it held no room while pending: puts may have taken it):
    CapacityError when its rows with data no longer fit ``total_storage_size`` (nothing is
    written; it stays pending: clear rows, or cancel it); else they are held in reserve in
    ``reserved`` until it commits.  Under the store's write lock."""
    capacity = getattr(store, "_capacity", None)
    if not capacity:
        return
    grow = capacity.restore_growth(store.controller, info.pid, info.gidxs, dump.rows.fields)
    room = capacity.room(store.controller)
    short = [u for u, n in sorted(grow.items()) if n > room[u]]
    if short:
        u = short[0]
        raise CapacityError(
            f"Storage capacity exceeded: completing restore {info.rid} from dump {info.dump!r} gives unit {u} "
            f"{grow[u]} more rows with data, its share under total_storage_size has room for {max(0, room[u])}; "
            f"nothing was written and it stays pending (clear rows, or cancel it with "
            f"recover_data_load({info.dump!r}, cancel=True))", setting="total_storage_size")
    reserved.enter_context(capacity.reserving(info.rid, grow))


def _cancel(store, info: RestoreInfo) -> None:
    with store._write_lock:
        store.controller.cancel_restore(info.rid)
        _settle(store, info, committed=False)


def _commit(store, info: RestoreInfo, plans: Sequence[Any], d: Path) -> None:
    """Publish on every unit, check each published every frame its plan gives it, then the
    controller's commit point, then settle; a read racing this returns the rows as they were
    before it or as committed, never a published payload the commit point has not reached.  A
    unit short of frames (its staged frames were lost, say by a power loss after the
    controller recorded it complete) raises CorruptionError before the commit point: the
    restore cannot complete, only be cancelled."""
    with store._write_lock:
        _publish_and_finish(store, info, plans, d)
        try:
            _settle(store, info, committed=True)
        except TqstoreError:
            log.exception("restore %s committed; settling its units failed (settled on the next open)", info.rid)


def _publish_and_finish(store, info: RestoreInfo, plans: Sequence[Any], d: Path) -> None:
    """Publish on every unit, then the controller's commit point; before it is reached, a
    failure unpublishes (the live rows are the old ones again) and is raised.  Readers racing
    this window try again and then wait for the write lock (tqstore.read_guard): a read never
    returns a restored payload before the commit point, nor one undone after it.  (The settle
    after it is no removal for readers: a segment it deletes under a read is tried again.)"""
    c: ControllerPort = store.controller
    with store.removals.removing():
        try:
            got = _each_unit(store, lambda u: u.publish_restore(info.tag))
            short = [u for u, (n, p) in enumerate(zip(got, plans)) if n != len(p)]
            if short:
                raise CorruptionError(
                    f"restore {info.rid} from dump {str(d)!r}: units {short} hold "
                    f"{[got[u] for u in short]} of their {[len(plans[u]) for u in short]} frames (lost since they "
                    f"completed, as by a power loss); it cannot complete: cancel it with "
                    f"recover_data_load({str(d)!r}, cancel=True)")
            c.finish_restore(info.rid)
            _rows_changed(store, info.rid)
        except BaseException:
            decided: Optional[bool]
            try:
                decided = getattr(c.restore(info.rid), "state", None) == "committed"
            except DistributedError:  # the controller does not answer: the outcome is unknown; the
                decided = None  # units keep what they published, settled by its record later
            except TqstoreError:
                decided = False
            if decided is False:  # (decided: the finish committed, then failed: the units keep what they published)
                for u in store.units:  # not decided: the live rows are the old ones again
                    with contextlib.suppress(TqstoreError):
                        u.unpublish_restore(info.tag)
            raise


def _report(info: RestoreInfo, dump: Dump, nbytes: int, marks: Sequence[float], new_keys: int) -> Dict[str, Any]:
    """The load's report; ``marks``: perf_counter at its start, after the checks of the dump,
    after the begin, after the units' imports and at its end."""
    n = len(dump.rows)
    spans = [b - a for a, b in zip(marks[:-1], marks[1:])]
    return {"keys": n, "new_keys": new_keys, "existing_keys": n - new_keys,
            "rows_with_data": sum(map(bool, dump.rows.fields)), "frames": dump.frames,
            "bytes": nbytes, "partition_id": dump.partition_id, "restore_id": info.rid,
            "seconds": marks[-1] - marks[0], "phases_s": dict(zip(("check_s", "begin_s", "import_s", "commit_s"),
                                                                 spans))}


def _abandon(store, info: RestoreInfo, d: Path, err: BaseException) -> None:
    """After ``err`` stopped a load: a restore not yet decided is cancelled (units drop what
    they wrote, the reserved indexes are freed), one the controller committed is settled as
    committed; then the marker goes.  If that fails too, the restore stays pending (as after
    a crash) and ``err`` gets a note saying what to call."""
    try:
        now = store.controller.restore(info.rid)
        if now is not None and now.state == "committed":
            with store._write_lock:
                _settle(store, now, committed=True)
        elif now is not None:
            _cancel(store, now)
    except Exception:  # noqa: BLE001 - err is the one raised; this one is logged
        try:
            now = store.controller.restore(info.rid)  # (what was decided before this failed)
        except Exception:  # noqa: BLE001
            now = None
        if now is not None and now.state != "running":  # decided: recover can only finish what was decided
            how = ("its keys were loaded" if now.state == "committed" else
                   "it was cancelled: none of its keys were loaded; load the dump again after")
            note = (f"restore {info.rid} of partition {info.pid!r} stays pending: call recover_data_load({str(d)!r}) "
                    f"to finish settling it ({how})")
        else:
            note = (f"restore {info.rid} of partition {info.pid!r} stays pending: call "
                    f"recover_data_load({str(d)!r}) to settle it (completed, or cancelled with cancel=True)")
        if isinstance(err, DistributedError):  # (recover_data_load would meet the same unreachable part)
            note += "; a part of the store is unreachable: close the store and open it again first"
        log.exception("restore %s could not be cancelled or settled after %r; %s", info.rid, err, note)
        if hasattr(err, "add_note"):  # (Python 3.11+)
            err.add_note(note)
        return
    _unmark(d, store)


def load(store, dump_dir) -> Dict[str, Any]:
    """See :meth:`DumpMixin.load_data_by_key`."""
    t0 = time.perf_counter()
    d = dump_path(dump_dir)
    if P.present(d):  # (its marker's name must fit; a dump of an earlier version may not): before the lock file
        P.check_name_fits(d)
    with dump_lock(d) as held:
        if not held:  # nothing of a dump at d when the call began (one published since is not read unlocked)
            why = f"it is {P.other_kind(d)}" if os.path.isdir(d) and P.other_kind(d) else "it holds no dump" \
                if os.path.isdir(d) else \
                "it is not a directory" if os.path.lexists(d) else "nothing is there"
            raise CheckpointNotFoundError(f"no dump at {d}: {why}")
        P.check_name_fits(d)
        mine = [r for r in store.controller.restores() if r.dump == str(d)]
        if mine:  # its marker is the pending restore's: left alone
            raise mine[0].pending_error(f"a new load of dump {str(d)!r}")
        # the marker's fsyncs run beside the checks of the dump (whose small reads go first),
        # then the frames' reads start (a hint) beside the controller's begin; a dump this
        # process cannot write beside gets no marker (nothing replaces it through this
        # process; a replacement by another writer fails the units' checks of every frame)
        marked = store._pool.submit(P.mark, d, store.root) if P.writable(d) else None
        if marked is None:
            log.info("dump %s is in a location this process cannot write: loading it without its restore marker", d)
        try:
            dump = read_dump(d)
        except BaseException:
            if marked is not None:
                with contextlib.suppress(BaseException):  # the dump's error is the one to raise
                    marked.result()
                _unmark(d, store)
            raise
        threading.Thread(target=prefetch, args=(d,), daemon=True, name="tqstore-prefetch").start()
        try:
            if marked is not None:
                marked.result()
        except BaseException:
            _unmark(d, store)  # (a marker written before its fsync failed lists the store)
            raise
        marks = [t0, time.perf_counter()]
        running = contextlib.ExitStack()  # (this thread runs the restore: calls it blocks wait for its end)
        info: Optional[RestoreInfo] = None
        try:
            with store._write_lock, running_loads.of(store).beginning():
                store._check_open()
                # undo records a failed put left must not put their old entries back over the
                # restore's later (settled as an overwriting put would first)
                store._settle_undo()
                capacity = getattr(store, "_capacity", None)  # (total_storage_size: CapacityError before writing)
                info = store.controller.begin_restore(dump.partition_id, str(d), dump.restore_rows(), dump.schema(),
                                                      strict_dtypes=store.strict_schema,
                                                      unit_room=capacity.room(store.controller) if capacity else None)
                running.enter_context(running_loads.of(store).running(info.rid))
                if capacity:  # its rows with data are held in reserve until it commits or ends
                    running.enter_context(capacity.reserving(
                        info.rid, capacity.restore_growth(store.controller, info.pid, info.gidxs, dump.rows.fields)))
        except BaseException as err:
            if info is not None:  # begun: undone as a later failure would be (then it is no longer running)
                with running:
                    _abandon(store, info, d, err)
                raise
            if not any(r.dump == str(d) for r in store.controller.restores()):
                _unmark(d, store)
            raise
        with running:
            marks.append(time.perf_counter())
            try:
                plans = _plans(store, info, dump)
                nbytes = _run_units(store, info, plans, range(store.num_units))
                marks.append(time.perf_counter())
                _commit(store, info, plans, d)
            except BaseException as err:
                _abandon(store, info, d, err)
                raise
            _unmark(d, store)
    marks.append(time.perf_counter())
    new = info.new_keys
    log.info("loaded %d keys (%d new) of partition %r from dump %s: %d bytes in %.3f s", len(dump.rows), new,
             dump.partition_id, d, nbytes, marks[-1] - t0)
    return _report(info, dump, nbytes, marks, new)


def recover(store, dump_dir, *, cancel: bool = False) -> bool:
    """See :meth:`DumpMixin.recover_data_load`."""
    d = dump_path(dump_dir)
    if not P.present(d) and not any(r.dump == str(d) for r in store.controller.restores()):
        return False  # nothing to settle, nothing on disk (and nothing created: no lock file)
    writable = P.writable(d)
    with P.locked(d, read_only_ok=not writable) if os.path.isdir(d.parent) else contextlib.nullcontext(False) as held:
        if held and writable:
            P.repair(d)
        pending = [r for r in store.controller.restores() if r.dump == str(d)]
        if not pending:
            _unmark(d, store)  # a marker left by a crash after the record went
            return False
        info = pending[0]
        with running_loads.of(store).running(info.rid):  # (calls it blocks wait while this thread settles it)
            if info.state == "committed" or (info.state == "running" and not cancel):
                if info.state == "running":
                    dump = read_dump(d)
                    with contextlib.ExitStack() as reserved:
                        with store._write_lock:
                            store._settle_undo()  # (as a load does before it begins)
                            full = store.controller.restore(info.rid)
                            _reserve_room(store, full, dump, reserved)
                        plans = _plans(store, full, dump)
                        _run_units(store, full, plans, [u for u, s in enumerate(full.units) if s != "complete"])
                        _commit(store, full, plans, d)
                else:
                    if cancel:
                        log.warning("restore %s from %s was committed before the crash: completing it instead of "
                                    "cancelling", info.rid, d)
                    with store._write_lock:
                        _settle(store, info, committed=True)
            else:
                if not cancel:  # (a failed load decided it before it stopped: it cannot complete now)
                    log.warning("restore %s from %s was cancelled before it stopped: finishing the cancel instead of "
                                "completing it; none of its keys were loaded (load the dump again)", info.rid, d)
                _cancel(store, info)
        _unmark(d, store)
        return True


def settle_at_open(controller: ControllerPort, units: Sequence[UnitPort]) -> None:
    """On open, before the store's reconcile: settle decided restores on every unit and
    forget them; unpublish running ones (they stay pending for ``recover_data_load``); drop
    unit entries of tags no restore record names."""
    for r in controller.restores():
        if r.state == "running":
            for u in units:
                u.unpublish_restore(r.tag)
            log.warning("store has an unresolved restore %s of partition %r from %s: call recover_data_load(%r) "
                        "(or cancel=True)", r.rid, r.pid, r.dump, r.dump)
            continue
        for u in units:
            u.settle_restore(r.tag, committed=r.state == "committed")
        controller.forget_restore(r.rid)
        log.info("settled restore %s (%s) left by a crash", r.rid, r.state)
    known = {r.tag for r in controller.restores()}
    for u in units:
        for t in u.restore_tags():
            if t not in known:
                u.settle_restore(t, committed=False, close=False)


__all__ = ["load", "recover", "settle_at_open", "dump_path", "dump_lock"]
