"""Writing a selective dump: the MVCC cut, the controller's rows at the cut, every owning
unit's shard in parallel, ``rows.json``, ``MANIFEST.json`` last, publication.

Orchestration only (plan as data, then execute through the ports; shared/DESIGN.md §5):

1. checks before anything is written: the partition id and the key list
   (:func:`check_key_list`), the target (:func:`publish.check_target`), the restore marker;
2. a blocking dump checks the keys before the cut, outside the store's write lock
   (:func:`precheck`: one membership test, :meth:`ControllerPort.check_keys`, a set lookup
   that answers no value per key; an unknown partition or key raises here, after
   :func:`check_keys` turned a key that is not a valid key into InvalidInputError; nothing
   was written: every key a partition holds is valid, so only a failed check looks at keys
   one by one), with the controller's removal epoch read before it; then the cut, under
   the store's write lock: :meth:`Store.snapshot` (each unit seals and pins, the
   controller opens a read transaction), the epoch compared (unchanged: no row was removed
   since the check, which still holds; else the keys are checked again, under the lock)
   and the controller's ``put_token`` read.  With ``blocking=False`` the cut checks only the
   partition and the caller is released (:class:`DumpHandle`; the stall is the cut); the
   job checks the keys in the snapshot (:meth:`DumpJob.rows`) before it takes any lock;
3. duplicate keys dropped (the first kept, :meth:`DumpCut.distinct`);
   :meth:`ControllerPort.snapshot_rows` gives the rows' key, gidx, tag and produced fields
   at the cut (the keys are resolved there, in the snapshot; a key the cut checked and the
   snapshot lacks is a bug and nothing is published); under the exclusive ``<dir>.lock``:
   the marker checked again, :func:`publish.repair`, ``<dir>.tmp`` made;
   :func:`plan` groups the rows with data by owning unit;
   each unit's :meth:`UnitPort.export_rows` writes its shard (owner-side, byte for byte,
   fsynced), in parallel, and ``rows.json`` is written and fsynced beside them (after them
   when a field is "mixed": :func:`narrowed_schema`); then
   ``MANIFEST.json`` is written and fsynced, the directory fsynced; :func:`publish.publish`.

A failure removes ``<dir>.tmp`` and leaves the previous dump at ``<dir>`` as it was.  The
background machinery is the checkpoint writer's (one save or dump in flight per store; an
error nobody retrieved surfaces on the next save, checkpoint load or dump).
"""
from __future__ import annotations

import logging
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .. import _native
from .._gcpause import paused
from .._format import dump_records as D
from .._format.dtypes import SCHEMA_MIXED
from .._format.names import check_flag, check_key, check_name
from .._io import files
from .._io.workpool import WorkPool
from ..checkpoint import writer as W
from ..errors import CheckpointError, InvalidInputError, KeyNotFoundError, StorageIOError, TqstoreError
from .. import ports as _ports
from ..ports import RowBatch, ShardInfo
from . import publish as P

log = logging.getLogger("tqstore")


def check_keys(keys: Any, partition_id: Any) -> List[str]:
    """The keys to dump: a list (or tuple) of str, each a valid key of ``partition_id``,
    duplicates dropped (the first kept).  Raises InvalidInputError."""
    keys = check_key_list(keys, partition_id)
    for k in keys:  # ASCII keys of up to 127 characters always fit; only the others are checked in full
        if type(k) is not str or len(k) > 127 or not k.isascii() or "\0" in k:
            check_key(partition_id, k)
    return list(dict.fromkeys(keys))


def check_key_list(keys: Any, partition_id: Any) -> List[Any]:
    """The cheap checks made before the cut: a valid partition id and a list (or tuple) of
    keys (the keys themselves are checked by resolving them: every key a partition holds is
    valid, so only the keys that do not resolve are checked one by one, by
    :func:`check_keys`).  Returns a new list: the caller's may change as soon as the call
    returns (``blocking=False`` reads its keys later, in the job).  Raises InvalidInputError."""
    check_name("partition id", partition_id)
    if isinstance(keys, (str, bytes)) or not isinstance(keys, (list, tuple)):
        raise InvalidInputError(f"keys must be a list of str, got {type(keys).__name__}")
    return list(keys)


def _in_insertion_order(rows: RowBatch) -> RowBatch:
    """``rows`` (every one a row) sorted by sequence number."""
    seqs = np.asarray(rows.seqs, np.int64)
    if len(seqs) < 2 or bool((seqs[1:] > seqs[:-1]).all()):
        return rows
    order = np.argsort(seqs, kind="stable").tolist()
    cols = [[c[i] for i in order] for c in (rows.gidxs, rows.keys, rows.tags, rows.fields, rows.seqs)]
    return RowBatch(rows.pid, rows.schema, *cols)


@dataclass
class DumpCut:
    """A dump's cut: the snapshot and the keys (as given: duplicates are dropped by
    :meth:`distinct`, after the caller is released); ``distinct_keys`` their number when they
    were checked by the cut, None when the job checks them in the snapshot (``blocking=False``)."""

    snap: Any  # StoreSnapshot
    partition_id: str
    keys: List[Any]
    distinct_keys: Optional[int]
    put_token: int
    num_units: int
    store_root: Path
    stall_s: float

    def distinct(self) -> None:
        """Drop duplicate keys, the first kept."""
        if self.distinct_keys is None:
            self.keys = check_keys(self.keys, self.partition_id)  # (InvalidInputError for a key that is no key)
        elif len(self.keys) != self.distinct_keys:
            self.keys = list(dict.fromkeys(self.keys))


def precheck(store, partition_id: str, keys: List[Any]) -> Tuple[int, int]:
    """Check the keys before the cut, outside the store's write lock: ``(distinct keys,
    the controller's removal epoch read before the check)``.  At the cut an unchanged epoch
    means no key was removed since, so the check still holds and the cut need not repeat it.

    Raises PartitionNotFoundError / KeyNotFoundError, InvalidInputError (a key that is not a
    valid key; checked only when some key does not resolve)."""
    controller = store.controller
    epoch = controller.removal_epoch()
    return _check(controller, partition_id, keys), epoch


def _check(controller, partition_id: str, keys: List[Any]) -> int:
    try:
        n = controller.check_keys(partition_id, keys) if keys else 0
    except (KeyNotFoundError, TypeError):
        check_keys(keys, partition_id)  # an invalid key is bad input, not an unknown key
        raise
    if not keys:
        controller.partition_info(partition_id)  # an unknown partition raises, also for no keys
    return n


def take_cut(store, partition_id: str, keys: List[Any], t0: Optional[float] = None,
             checked: Optional[Tuple[int, int]] = None, *, defer: bool = False) -> DumpCut:
    """The cut, under the store's write lock (held for it only: one snapshot; the keys are
    checked again there only when rows were removed since ``checked``, the answer of
    :func:`precheck`, or when there is none).  ``defer``: only the partition is checked here;
    the keys are checked by the job, in the snapshot (:meth:`DumpJob.rows`).

    Raises PartitionNotFoundError / KeyNotFoundError, InvalidInputError for a key that is not a
    valid key (checked only when some key does not resolve); the cut is released."""
    t0 = time.perf_counter() if t0 is None else t0
    with store._write_lock:
        snap = store.snapshot()
        try:
            _ports.check_no_restore(snap.controller, partition_id, f"a dump of partition {partition_id!r}")
            n: Optional[int]
            if defer:
                n = None
                snap.controller.partition_info(partition_id)  # an unknown partition raises now
            elif checked is not None and snap.controller.removal_epoch() == checked[1]:
                n = checked[0]  # no row was removed since the check: every key is still a row
            else:
                n = _check(snap.controller, partition_id, keys)
            token = int(snap.controller.put_token)
        except BaseException:
            snap.release()
            raise
    return DumpCut(snap, partition_id, keys, n, token, store.num_units, Path(store.root),
                   time.perf_counter() - t0)


@dataclass(frozen=True)
class UnitWork:
    """One unit's part of a dump: its rows with data and their produced fields."""

    unit: int
    gidxs: List[int]
    fields: List[List[str]]


def plan(rows: RowBatch, num_units: int) -> List[UnitWork]:
    """Group the rows that have produced fields by owning unit (``gidx % num_units``), in
    dump order (pure)."""
    per: Dict[int, Tuple[List[int], List[List[str]]]] = defaultdict(lambda: ([], []))
    for g, fs in zip(rows.gidxs, rows.fields):
        if fs:
            gs, fl = per[g % num_units]
            gs.append(g)
            fl.append(sorted(fs))
    return [UnitWork(u, gs, fl) for u, (gs, fl) in sorted(per.items())]


def narrowed_schema(schema: Dict[str, Tuple[int, int]], shards: Sequence[ShardInfo]) -> Dict[str, Tuple[int, int]]:
    """``schema`` with each "mixed" field whose dumped frames all hold one dtype given that dtype
    (the partition's schema stays mixed once any row held another dtype, even a row since
    cleared; a load of the dump merges only what its frames hold).  Pure."""
    out = dict(schema)
    for f, (kind, dtype) in schema.items():
        if dtype == SCHEMA_MIXED:
            seen = {d for s in shards for d in s.dtypes.get(f, ())}
            if len(seen) == 1:
                out[f] = (kind, seen.pop())
    return out


def report_of(index_rows: int, shards: Sequence[ShardInfo], total: int, **extra: Any) -> Dict[str, Any]:
    """The report mapping of a dump."""
    out = {"keys": index_rows, "rows_with_data": sum(s.rows for s in shards), "shards": len(shards), "bytes": total,
           "frames": sum(s.frames for s in shards), "payload_bytes": sum(s.payload_bytes for s in shards)}
    out.update(extra)
    return out


class DumpHandle(W.SaveHandle):
    """The pending result of ``dump_data_by_key(..., blocking=False)``: the cut is taken when
    it is returned (``stall_s``); :meth:`result` waits and returns the report mapping or
    raises the dump's error (the previous dump at the path is intact, unless the message says
    the new one is in place and only making it durable failed)."""

    what = "dump"

    def __repr__(self) -> str:
        state = "running" if not self.done() else ("failed" if self._error else "done")
        return f"<DumpHandle {self.path} {state}>"


class DumpJob:
    """Writes one cut to ``final``; :meth:`run` always releases the cut."""

    def __init__(self, cut: DumpCut, final: Path, *, max_workers: int) -> None:
        self.cut = cut
        self.final = final
        self.max_workers = max_workers

    def run(self) -> Dict[str, Any]:
        with paused():  # (also in the background: the collector resumes when the dump ends)
            return self._run()

    def rows(self) -> RowBatch:
        """The dumped rows, read from the controller's snapshot: duplicates dropped, then every
        key resolved there, in the partition's insertion order (a load numbers new keys in
        the dump's order: GRPO groups dumped whole come back whole).  Raises KeyNotFoundError /
        InvalidInputError for keys the cut did not check (``blocking=False``: they are checked
        here, in the snapshot, so nothing after the cut counts)."""
        cut, snap = self.cut, self.cut.snap
        checked = cut.distinct_keys is not None
        cut.distinct()
        rows = snap.controller.snapshot_rows(snap.controller_snap, cut.partition_id, cut.keys)
        if rows is not None and len(rows) == len(cut.keys):
            miss = rows.missing()
            if not miss:
                return _in_insertion_order(rows)
            if not checked:
                missing = [cut.keys[i] for i in miss]
                raise KeyNotFoundError(f"{len(missing)} key(s) not found in partition {cut.partition_id!r} at the "
                                       f"dump's cut: {missing[:5]!r}")
        raise CheckpointError(f"the controller's snapshot lacks keys that were rows at the cut of "
                              f"partition {cut.partition_id!r} (a bug); nothing was published")

    def _run(self) -> Dict[str, Any]:
        t0 = time.perf_counter()
        try:
            rows = self.rows()  # before the lock: a bad key leaves nothing behind, not even the lock file
            rows_s = time.perf_counter() - t0
            with P.locked(self.final):
                ctrl = self.cut.snap.controller  # (a stale entry of this store's own, left by a kill, goes)
                P.take_off_stale(self.final, self.cut.store_root,
                                 ctrl is None or any(r.dump == str(self.final) for r in ctrl.restores()))
                P.refuse_if_restoring(self.final)
                P.check_target(self.final, live_store=self.cut.store_root)  # still ours to replace?
                P.repair(self.final, writer=True)
                tmp = P.fresh_tmp(self.final)
                try:
                    out = self._write(tmp, rows)
                    out["phases_s"]["rows_s"] = rows_s
                    t1 = time.perf_counter()
                    P.publish(tmp, self.final)
                    out["phases_s"]["publish_s"] = time.perf_counter() - t1
                except BaseException:
                    files.rmtree(tmp, ignore_errors=True)
                    raise
        except StorageIOError as e:  # (a unit's I/O error: the dump failed as any other write would)
            raise W.write_error(f"dumping to {self.final}", "dump", e) from e
        except TqstoreError:
            raise
        except OSError as e:
            raise W.write_error(f"dumping to {self.final}", "dump", e) from e
        finally:
            self.cut.snap.release_after(f"the dump to {self.final}")
        out.update(stall_s=self.cut.stall_s, write_s=time.perf_counter() - t0)
        log.info("dumped %d keys (%d with data, %d shards, %.1f MiB) of partition %r to %s in %.3f s", out["keys"],
                 out["rows_with_data"], out["shards"], out["bytes"] / 2**20, self.cut.partition_id, self.final,
                 out["write_s"])
        return out

    def _write(self, tmp: Path, rows: RowBatch) -> Dict[str, Any]:
        cut, snap = self.cut, self.cut.snap
        t = [time.perf_counter()]
        work = plan(rows, cut.num_units)
        shards: List[ShardInfo] = []

        mixed = any(d == SCHEMA_MIXED for _k, d in rows.schema.values())

        def write_index(schema=rows.schema) -> bytes:  # beside the shards: its fsync overlaps theirs
            data = D.encode_row_index(cut.partition_id, cut.num_units, schema,
                                      list(zip(rows.keys, rows.gidxs, rows.tags, rows.fields)))
            if len(data) > D.MAX_JSON_BYTES:  # (no reader would take it: nothing is published)
                raise InvalidInputError(
                    f"the dump's row index would hold {len(data)} bytes, more than the {D.MAX_JSON_BYTES} a reader "
                    f"accepts (its tags and keys, as JSON text, non-ASCII characters escaped); nothing was published: "
                    f"dump the keys in several dumps, or keep long text in a field rather than in tags")
            files.write_file(tmp / D.ROW_INDEX_NAME, data, fsync=True, new=True)
            return data

        with WorkPool(max_workers=max(1, min(self.max_workers, len(work)) + 1),
                                thread_name_prefix="tqstore-dump") as pool:
            futs = [pool.submit(snap.ports[w.unit].export_rows, snap.unit_snaps[w.unit], w.gidxs, w.fields,
                                str(tmp / D.shard_name(w.unit)), num_units=cut.num_units,
                                put_token=cut.put_token) for w in work]
            if mixed:  # (the shards tell the dtypes of a mixed field's dumped frames: the index after them)
                shards.extend(W.gather(futs))
                index = write_index(narrowed_schema(rows.schema, shards))
            else:
                *done, index = W.gather(futs + [pool.submit(write_index)])
                shards.extend(done)
        t.append(time.perf_counter())
        summary = report_of(len(rows), shards, 0)
        manifest = D.encode_manifest(
            created_unix=time.time(), partition_id=cut.partition_id, num_units=cut.num_units,
            summary={k: summary[k] for k in D.SUMMARY_KEYS},
            row_index={"size": len(index), "crc32c": _native.crc32c(index)},
            shards=[{"unit": s.unit, "size": s.size, "crc32c": s.crc32c, "frames": s.frames, "rows": s.rows,
                     "payload_bytes": s.payload_bytes} for s in shards])
        files.write_file(tmp / D.MANIFEST_NAME, manifest, fsync=True, new=True)
        files.fsync_dir(tmp)
        t.append(time.perf_counter())
        total = sum(s.size for s in shards) + len(index) + len(manifest)
        phases = {"shards_s": t[1] - t[0], "index_s": t[2] - t[1]}
        return report_of(len(rows), shards, total, path=str(self.final), partition_id=cut.partition_id,
                         phases_s=phases)


def dump(store, dump_dir: Any, keys: Any, partition_id: str, *, blocking: bool = True):
    """``Store.dump_data_by_key`` (see :class:`tqstore.dump.DumpMixin`)."""
    t0 = time.perf_counter()
    store._check_open()
    blocking = check_flag("blocking", blocking)
    keys = check_key_list(keys, partition_id)
    final = P.check_target(dump_dir, live_store=store.root, unlocked=True)
    if not P.load_running(final):  # (a running load's marker goes when it ends: the job waits for its lock)
        P.refuse_if_restoring(final, store_root=store.root,
                              store_has_restore=any(r.dump == str(final) for r in store.controller.restores()))
    # an unresolved restore of the partition first (its keys may not be rows yet; checked again at the cut)
    _ports.check_no_restore(store.controller, partition_id, f"a dump of partition {partition_id!r}")
    # blocking: the keys checked now, outside the write lock (the cut compares epochs); else by
    # the job, in the snapshot, so that the caller waits for the cut alone
    checked = precheck(store, partition_id, keys) if blocking else None
    state = W.state_of(store)
    with state.lock:
        W.settle(state)
        cut = take_cut(store, partition_id, keys, t0, checked, defer=not blocking)
        job = DumpJob(cut, final, max_workers=max(1, min(8, store.num_units)))
        if blocking:
            return job.run()
        return W.start_in_background(state, cut, DumpHandle(final, cut.stall_s), job.run,
                                     f"background dump to {final}", lambda body: W.background_pool().submit(body))
