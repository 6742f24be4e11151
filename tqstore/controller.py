"""Controller: the store's metadata in one LMDB environment, mirrored in memory.

Holds partitions, key → global index, rows (key, tag, produced fields, partition-local
sequence), per-task consumption, per-partition field schemas, the global index allocator
(unique across partitions; freed indexes are reused, smallest first) and sampler state.

Every mutating method is one LMDB transaction: when it returns, the change is committed
(and survives a process kill; with durability "commit" also a power loss).  The
in-memory mirror (:mod:`tqstore.controller_mirror`) is updated only after the commit
succeeds, so a failed call changes nothing.

The mirror is columnar (:mod:`tqstore.controller_mirror`): a few machine words per row,
built in bulk on open (:mod:`tqstore.controller_decode`), or read from the mirror file a
clean close wrote when the clean-close marker names it (:mod:`tqstore.controller_persist`);
a put encodes its rows' values together (:mod:`tqstore.controller_put`).  An index of format version 1 or 2 is
migrated to version 3 in one transaction when the controller opens it.

The controller implements :class:`~tqstore.ports.ControllerPort`: every port method takes
the controller's lock (it is thread-safe by itself) and answers values — copies, never the
mirror.  ``plan_put`` → unit writes → ``commit_put`` must still be serialised by the caller
(the store's write lock): a plan is valid only until the next commit.  The sampler lives
here too (:class:`~tqstore.controller_sampling.SamplerHost`), so that a fetch chooses rows
and marks them consumed in one transaction under one lock.

The port's snapshot and checkpoint calls are :class:`~tqstore.controller_snapshots.SnapshotCalls`,
its consumption and sampler-state calls :class:`~tqstore.controller_consumption.ConsumptionCalls`
(mixins: one lock, one environment, one mirror).
"""
from __future__ import annotations

import functools
import heapq
import logging
import os
import secrets
import threading
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

import lmdb
import numpy as np

from ._format.columns import Column
from ._format import controller_records as R
from ._format.controller_records import RecordError, decode_row  # noqa: F401 - decode_row re-exported (CLI)
from ._io import files
from ._io.lmdbenv import lmdb_commit_point, open_env, read_columns, warm_file, wrap_errors
from .controller_decode import (  # noqa: F401 - CONTROLLER_DBS, decode_controller re-exported for verify
    CONTROLLER_DBS, CONTROLLER_FORMAT, ControllerState, decode_controller,
)
from .controller_mirror import (
    GidxMap, Partition, PutPlan, RowsView, check_mirror, consumption_status, key_list, list_keys,
    partition_info, partition_order, production_status, row_batch, row_info, rows_of_slots,
)
from . import controller_persist, controller_put, controller_sampler_store as sampler_store
from .controller_restore import RestoreHost, install_restore_calls
from .controller_sampling import SamplerHost
from .controller_snapshots import SnapshotCalls
from .controller_consumption import ConsumptionCalls
from .errors import CorruptionError, FormatVersionError, InvalidInputError, KeyNotFoundError, PartitionNotFoundError  # noqa: F401
from ._format.names import check_key, check_name  # noqa: F401 - check_name re-exported
from .ports import PartitionInfo, RowBatch, RowInfo

log = logging.getLogger("tqstore")
_g = R.gidx_key
_pk = R.keys_key


def _sorted(a: np.ndarray) -> np.ndarray:
    """``a`` ascending (as it usually is already: rows in insertion order)."""
    return a if len(a) < 2 or bool((a[1:] >= a[:-1]).all()) else np.sort(a)


def _locked(method):
    """Run a controller method under the controller's lock."""
    @functools.wraps(method)
    def locked(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)
    return locked


class Controller(SnapshotCalls, ConsumptionCalls):
    """Metadata of a store. See the module docstring for guarantees."""

    def __init__(self, path: Path, *, num_units: int, sync: bool = False, map_bytes: Optional[int] = None) -> None:
        self.path = Path(path)
        kw = {"map_bytes": map_bytes} if map_bytes else {}
        self.created = not os.path.lexists(self.path / "data.mdb")  # (ControllerPort.created)
        self.env = open_env(self.path, max_dbs=12, sync=sync, **kw)
        try:  # (creating a database writes: on a full disk a bare lmdb error before)
            with wrap_errors("open controller", self.path):
                self.db = {name: self.env.open_db(name.encode()) for name in CONTROLLER_DBS}
        except BaseException:
            self.env.close()
            raise
        self._lock = threading.RLock()
        self._sampling = SamplerHost(self)
        self._restores = RestoreHost(self)  # selective restores: records, lifecycle, guards
        self._snapshots: Dict[int, Any] = {}  # snapshot id -> read transaction (the controller's side of a cut)
        self._next_snapshot = 1
        # changes with every removal of rows or partitions (removal_epoch); a random start, so
        # that two controller instances (a store reopened, a checkpoint loaded) never agree
        self._removals = int.from_bytes(os.urandom(8), "big") >> 2
        self.mirror_binding: Optional[Tuple[int, int]] = None  # (marker digest, units' digest): controller_persist
        try:
            with wrap_errors("open controller", self.path):
                self._init_meta(num_units)
                self._load()
        except BaseException:
            self.env.close()  # a damaged index must not stay open (it could not be reopened once repaired)
            raise

    # ------------------------------------------------------------------ open
    def _init_meta(self, num_units: int) -> None:
        with self.env.begin(write=True) as txn:
            fmt = txn.get(R.META_FORMAT, db=self.db["meta"])
            if fmt is None:
                txn.put(R.META_FORMAT, R.encode_decimal(CONTROLLER_FORMAT), db=self.db["meta"])
                txn.put(R.META_NEXT_GIDX, R.encode_decimal(0), db=self.db["meta"])
                txn.put(R.META_NUM_UNITS, R.encode_decimal(num_units), db=self.db["meta"])
                # a new store's sequence numbers start at a random multiple of SEQ_ALIGN below 2**62,
                # so that a BatchMeta of another store (or of its checkpoint) names no row of this one
                start = secrets.randbelow((1 << 62) // R.SEQ_ALIGN) * R.SEQ_ALIGN
                if start:
                    txn.put(R.META_SEQ_FLOOR, R.encode_decimal(start), db=self.db["meta"])
            # an existing format is checked by decode_controller

    def _load(self) -> None:
        st = controller_persist.load(self)  # the mirror file, when the clean-close marker names it
        if st is None:
            warm_file(self.path / "data.mdb")  # one sequential read, not one random read per page walked
            with self.env.begin() as txn:  # rows and keys read in bulk from the pages when the file allows
                st = decode_controller(txn, self.db, self.path, read_columns(self.env, txn, [b"rows", b"keys"]))
        self.num_units, self.next_gidx, self.put_token = st.num_units, st.next_gidx, st.put_token
        self.parts, self.gmap, self.consumed, self.free = st.parts, st.gmap, st.consumed, st.free
        self._by_num = {p.num: p for p in self.parts.values()}
        heapq.heapify(self.free)
        self.seq_floor = self._read_seq_floor()
        if st.format != CONTROLLER_FORMAT:
            self._migrate(st.format)  # (the ``restores`` records are format-independent: kept as they are)
        self._restores.load()

    def _read_seq_floor(self) -> int:
        """``meta/seq_floor`` (0 when absent: an index that never dropped a partition, or one
        written before it existed).  Raises CorruptionError for a malformed value."""
        with self.env.begin() as txn:
            raw = txn.get(R.META_SEQ_FLOOR, db=self.db["meta"])
        try:  # (an index written before floors were aligned: new partitions start aligned anyway)
            return R.seq_aligned(R.decode_optional_decimal(raw))
        except RecordError as e:
            raise CorruptionError(f"controller index: meta/seq_floor: {e}", path=str(self.path / "data.mdb")) from e

    def _migrate(self, fmt: int) -> None:
        """Rewrite a version-``fmt`` index as version 3, in one transaction (a crash leaves it at ``fmt``).

        Version 1 has its rows, keys, partitions and schema rewritten; version 2 reads as 3 (a
        partition's cached sampler results inside its ``sampler`` record are read from there
        and moved to records of their own by the next write of its sampler state)."""
        m = self.db
        with self.env.begin(write=True) as txn:
            if fmt < 2:
                self._rewrite_v1(txn)
            txn.put(R.META_FORMAT, R.encode_decimal(CONTROLLER_FORMAT), db=m["meta"])
        log.info("controller index %s: format %d migrated to %d", self.path, fmt, CONTROLLER_FORMAT)

    def _rewrite_v1(self, txn: Any) -> None:
        """Version 1 → 3: rows, keys, partitions and schema entries rewritten (in ``txn``)."""
        m = self.db
        txn.drop(m["keys"], delete=False)
        for p in self.parts.values():
            sl = p.live_slots()
            g = p.s_gidx[sl]
            keyed = np.asarray([p.s_key[s] is not None for s in sl.tolist()], dtype=bool)
            tj = [R.encode_tag(p.tags.get(x)) for x in g.tolist()] if p.tags else None
            vals = R.encode_rows2(p.num, keyed, p.s_seq[sl], [p.fs_masks[f] for f in p.s_fs[sl].tolist()], tj)
            txn.cursor(m["rows"]).putmulti(list(zip(R.gidx_keys(g), vals)))
            txn.cursor(m["keys"]).putmulti([(R.keys_key(p.pid, k), R.gidx_key(x)) for k, x in p.keys.items()])
            txn.put(R.parts_key(p.pid), R.encode_partition(p.next_seq, p.meta, p.num), db=m["parts"])
            for f, (kind, dt) in p.schema.items():
                txn.put(R.schema_key(p.pid, f), R.encode_schema(kind, dt, p.bits[f]), db=m["schema"])

    # ------------------------------------------------------------------ mirror bookkeeping
    @property
    def rows(self) -> RowsView:
        """Every row as a read-only mapping gidx -> Row (made on demand; tests, tools)."""
        return RowsView(list(self.parts.values()))

    def new_partition_number(self) -> int:
        """The number a new partition gets in row values (one above the largest in use)."""
        return max(self._by_num, default=-1) + 1

    def add_partition(self, p: Partition) -> None:
        self.parts[p.pid] = p
        self._by_num[p.num] = p

    # ------------------------------------------------------------------ queries
    def partition(self, pid: str) -> Partition:
        p = self.parts.get(pid)
        if p is None:
            raise PartitionNotFoundError(f"partition {pid!r} not found: it does not exist (known: {sorted(self.parts)[:10]})")
        return p

    def gidxs_for_keys(self, pid: str, keys: Sequence[str]) -> List[int]:
        """Global indexes of ``keys``. Raises PartitionNotFoundError / KeyNotFoundError."""
        p = self.partition(pid)
        out = list(map(p.keys.get, keys))
        if None in out:
            missing = [k for k, g in zip(keys, out) if g is None]
            raise KeyNotFoundError(f"{len(missing)} key(s) not found in partition {pid!r}: {missing[:5]!r}")
        return out

    def ready(self, pid: str, task: str, need: frozenset) -> List[int]:
        """Rows of ``pid`` whose ``need`` fields are all produced and that ``task`` has not
        consumed, in insertion order. O(ready) once the view exists (first call: O(rows))."""
        with self._lock:
            p = self.parts.get(pid)
            if p is None:
                return []
            return p.ready_view(task, need, self.consumed.get((pid, task), ())).ordered()

    def verify_index(self) -> List[str]:
        """See ControllerPort.  The read transaction and the served counts are taken together
        under the lock; the decode runs outside it (puts go on meanwhile)."""
        def counts(num_units: int, next_gidx: int, parts: Mapping[str, Partition]) -> Tuple[Any, ...]:
            return num_units, next_gidx, {pid: (p.live, p.key_count()) for pid, p in parts.items()}

        with self._lock:
            txn = self.env.begin()
            served = counts(self.num_units, self.next_gidx, self.parts)
        try:
            st = decode_controller(txn, self.db, self.path)
        except (CorruptionError, FormatVersionError) as e:
            return [f"controller: {e}"]
        except lmdb.Error as e:
            return [f"controller: its index cannot be read ({self.path / 'data.mdb'}): {e}"]
        finally:
            txn.abort()
        found = counts(st.num_units, st.next_gidx, st.parts)
        if found == served:
            return []
        return [f"controller: its index ({self.path / 'data.mdb'}) holds {found[0]} units, next global index "
                f"{found[1]} and (rows, keys) per partition {dict(sorted(found[2].items()))!r:.300}, but the store "
                f"serves {served[0]}, {served[1]} and {dict(sorted(served[2].items()))!r:.300} (its mirror file was "
                f"read at open): the index is damaged; load the last good checkpoint into a new store"]

    def check_mirror(self) -> None:
        """Assert the incremental structures agree with the rows and consumption (tests)."""
        with self._lock:
            check_mirror(self.parts, self.gmap, self.consumed)

    # ------------------------------------------------------------------ port: queries (values)
    @_locked
    def partitions(self) -> List[str]:
        """Partition ids, oldest first (creation order, also after a reopen)."""
        return partition_order(self.parts)

    @_locked
    def partition_info(self, pid: str) -> PartitionInfo:
        """Schema and row count; raises PartitionNotFoundError."""
        return partition_info(self.partition(pid))

    @_locked
    def resolve_keys(self, pid: str, keys: Sequence[str]) -> List[int]:
        """Global indexes of ``keys``. Raises PartitionNotFoundError / KeyNotFoundError."""
        return self.gidxs_for_keys(pid, keys)

    @_locked
    def check_keys(self, pid: str, keys: Sequence[str]) -> int:
        """See ControllerPort.  The keys are looked up as a set (in hash order: the key index
        is walked nearly in order, not at random)."""
        p, ks = self.partition(pid), set(keys)
        if p.keys.keys() >= ks:
            return len(ks)
        missing = [k for k in keys if k not in p.keys]
        raise KeyNotFoundError(f"{len(missing)} key(s) not found in partition {pid!r}: {missing[:5]!r}")

    @_locked
    def removal_epoch(self) -> int:
        """See ControllerPort (bumped by :meth:`clear_rows`, which every removal goes through)."""
        return self._removals

    @_locked
    def row_infos(self, pid: str, gidxs: Sequence[int]) -> List[Optional[RowInfo]]:
        """Row metadata (None for a gidx that is not a row of ``pid``)."""
        p = self.parts.get(pid)
        return [None if p is None or not p.has(int(g)) else row_info(p.row(int(g))) for g in gidxs]

    @_locked
    def rows_by_key(self, pid: str, keys: Sequence[str]) -> Optional[RowBatch]:
        """Schema and row metadata of ``keys`` (missing: ``seqs[i] is None``); None for an
        unknown partition."""
        p = self.parts.get(pid)
        if p is None:
            return None
        return row_batch(p, list(map(p.keys.get, keys)))

    @_locked
    def row_batch(self, pid: str, gidxs: Sequence[int]) -> Optional[RowBatch]:
        """Schema and row metadata of ``gidxs`` in one answer; None for an unknown partition."""
        p = self.parts.get(pid)
        return None if p is None else row_batch(p, list(gidxs))

    @_locked
    def first_rows(self, pid: str, limit: Optional[int] = None) -> Optional[RowBatch]:
        """The first ``limit`` rows (all when None) in insertion order with the schema; None
        for an unknown partition."""
        p = self.parts.get(pid)
        if p is None:
            return None
        return rows_of_slots(p, p.live_slots(limit))  # (the scan stops at limit)

    @_locked
    def list_keys(self, pid: Optional[str] = None) -> Dict[str, Dict[str, Any]]:
        """``{partition: {key: tag}}`` (keys in insertion order, tags as stored) for one
        partition (empty when unknown) or all."""
        return list_keys(self.parts, pid)

    @_locked
    def key_list(self, pid: str) -> Optional[Tuple[List[Optional[str]], Dict[str, Any]]]:
        """See ControllerPort (:func:`tqstore.controller_mirror.key_list`)."""
        return key_list(self.parts.get(pid))

    @_locked
    def claims(self, unit_id: int) -> Dict[int, frozenset]:
        """Rows on unit ``unit_id`` with their produced fields (for the store's reconcile)."""
        n = self.num_units
        out: Dict[int, frozenset] = {}
        for p in self.parts.values():
            sl = p.live_slots()
            g = p.s_gidx[sl]
            mine = g % n == unit_id
            fsets = p.fsets
            out.update(zip(g[mine].tolist(), [fsets[f] for f in p.s_fs[sl][mine].tolist()]))
        return out  # frozensets

    @_locked
    def claim_rows(self, unit_id: int) -> Dict[str, np.ndarray]:
        """field -> sorted gidxs of the rows on unit ``unit_id`` that have it produced."""
        parts: Dict[str, List[np.ndarray]] = {}
        for p in self.parts.values():
            sl = p.live_slots()
            g = p.s_gidx[sl]
            mine = g % self.num_units == unit_id
            g, fs = g[mine], p.s_fs[sl][mine]
            for i, fset in enumerate(p.fsets):
                if fset:
                    hit = g[fs == i]
                    if len(hit):
                        for f in fset:
                            parts.setdefault(f, []).append(hit)
        return {f: _sorted(np.concatenate(v)) for f, v in parts.items()}

    @_locked
    def claim_counts(self) -> List[int]:
        """Per unit, the number of (row, produced field) pairs the controller says it holds."""
        n = self.num_units
        out = np.zeros(n, dtype=np.int64)
        for p in self.parts.values():
            sl = p.live_slots()
            width = np.fromiter(map(len, p.fsets), dtype=np.int64, count=len(p.fsets))
            if len(sl) and len(width):
                out += np.bincount(p.s_gidx[sl] % n, weights=width[p.s_fs[sl]], minlength=n).astype(np.int64)
        return out.tolist()

    # ------------------------------------------------------------------ port: the clean-close marker
    @_locked
    def mark_clean(self, digest: int) -> None:
        """Record the clean-close marker ``meta/clean`` (``digest``: the units' digest,
        :func:`~tqstore._format.controller_records.units_digest`) and flush the index to disk
        (docs/FORMAT.md, "Clean close"), after writing the mirror file the marker then names
        (:mod:`tqstore.controller_persist`).  Raises StorageIOError, InvalidInputError (digest)."""
        controller_persist.mark_clean(self, digest)

    @_locked
    def take_clean(self) -> Optional[int]:
        """Remove the clean-close marker, durably (the index is flushed before this returns),
        and return the units' digest it records if the index is unchanged since (no commit but
        the marker's own); None when there is none or it is stale or malformed.  Raises
        StorageIOError."""
        return controller_persist.take_clean(self)

    @_locked
    def production_status(self, pid: str, fields: Sequence[str]) -> Optional[Tuple[np.ndarray, np.ndarray]]:
        """``(sorted gidxs, int8 matrix rows x fields)``; None for an unknown partition."""
        p = self.parts.get(pid)
        return None if p is None else production_status(p, fields)

    @_locked
    def consumption_status(self, pid: str, task: str) -> Optional[Tuple[np.ndarray, np.ndarray]]:
        """``(sorted gidxs, int8 flags: 1 consumed by task)``; None for an unknown partition."""
        p = self.parts.get(pid)
        return None if p is None else consumption_status(p, self.consumed.get((pid, task), ()))

    # ------------------------------------------------------------------ port: sampling
    @_locked
    def set_sampler(self, sampler: Any) -> None:
        """Sample fetches with ``sampler`` (a BaseSampler or a make_sampler spec) from now on."""
        self._sampling.set(sampler)

    @property
    def sampler(self):
        """The sampler instance fetches use (in-process only)."""
        return self._sampling.sampler

    @_locked
    def first_batch_index(self, pid: str, task: str, dp_rank: Any) -> int:
        """See ControllerPort.first_batch_index."""
        check_name("partition_id", pid)
        check_name("task_name", task)
        return self._sampling.first_batch_index(pid, task, dp_rank)

    @_locked
    def fetch(self, pid: str, task: str, fields: Optional[Sequence[str]], batch_size: int,
              sampling_config: Optional[Mapping[str, Any]] = None) -> Optional[RowBatch]:
        """Choose ready rows with the sampler and mark them consumed, with the sampler's state,
        in one transaction; see ControllerPort.fetch."""
        check_name("task_name", task)
        return self._sampling.fetch(pid, task, fields, batch_size, dict(sampling_config or {}))

    # ------------------------------------------------------------------ puts
    @_locked
    def plan_put(self, pid: str, columns: Sequence[Column], *, keys: Optional[Sequence[str]] = None,
                 gidxs: Optional[Sequence[int]] = None, n_new: int = 0, tags: Optional[Sequence[Any]] = None,
                 create_keys: bool = True, strict_dtypes: bool = True) -> PutPlan:
        """Validate a put and reserve global indexes for new rows (nothing is committed).

        Exactly one of ``keys`` (KV rows, created if missing), ``gidxs`` (existing rows of
        ``pid``) or ``n_new`` (new unkeyed rows) addresses the rows.  With
        ``strict_dtypes=False`` a field's dtype may differ from its earlier puts: the plan's
        schema then marks it mixed (``SCHEMA_MIXED``; see ``schema_changes``).

        Raises:
            InvalidInputError: duplicate keys, sizes that disagree, bad tags.
            SchemaError: a field's kind (or, with ``strict_dtypes``, dtype) clashes with the
                partition's schema.
            KeyNotFoundError: ``gidxs`` names rows not in the partition.
        """
        return controller_put.plan_put(self, pid, columns, keys, gidxs, n_new, tags, create_keys,
                                      strict_dtypes)

    def commit_put(self, plan: PutPlan, *, token: Optional[int] = None) -> None:
        """Commit a planned put: new rows and keys, tags, produced fields, schema, allocator.

        ``token`` (an overwriting put's undo token, see ``Unit.settle``) is recorded in the
        same transaction: after a crash, tokens up to :attr:`put_token` were committed."""
        with self._lock, wrap_errors("commit put", self.path):
            controller_put.commit_put(self, plan, token)

    # ------------------------------------------------------------------ clears
    def clear_rows(self, pid: str, gidxs: Iterable[int], *, drop_partition: bool = False) -> List[int]:
        """Delete rows (keys, consumption marks) and free their global indexes.

        Idempotent: rows already gone are skipped. Returns the gidxs actually removed.  The
        sampler forgets cached results that mention them, in the same transaction.
        """
        with self._lock, wrap_errors("clear", self.path):
            self._restores.check_clear(pid)  # (also for a partition the restore creates: its rows would come back)
            p = self.parts.get(pid)
            if p is None:
                return []
            gone = sorted({int(g) for g in gidxs if p.has(int(g))})
            gone_keys = [p.s_key[s] for s in p.slots(gone).tolist()]
            m = self.db
            tasks = [t for (pp, t) in self.consumed if pp == pid]
            forget = None if drop_partition or not gone else (lambda s: s.forget_rows(pid, gone))
            with self._sampling.change(pid, forget) as sw, self.env.begin(write=True) as txn:
                if sw is not None:
                    sampler_store.write(txn, m["sampler"], pid, sw)
                for g, key in zip(gone, gone_keys):
                    txn.delete(_g(g), db=m["rows"])
                    if key is not None:
                        txn.delete(_pk(pid, key), db=m["keys"])
                    txn.put(_g(g), b"", db=m["free"])
                    for t in tasks:
                        if g in self.consumed[(pid, t)]:
                            txn.delete(self._cons_key(t, pid, g), db=m["cons"])
                if drop_partition:
                    txn.delete(R.parts_key(pid), db=m["parts"])
                    floor = R.seq_aligned(max(self.seq_floor, p.next_seq))  # (one created again starts past it)
                    txn.put(R.META_SEQ_FLOOR, R.encode_decimal(floor), db=m["meta"])
                    for f in p.schema:
                        txn.delete(R.schema_key(pid, f), db=m["schema"])
                    for t in tasks:
                        for g in self.consumed[(pid, t)]:
                            txn.delete(self._cons_key(t, pid, g), db=m["cons"])
                    sampler_store.drop(txn, m["sampler"], pid)
                lmdb_commit_point("controller_commit")
            all_views = [v for vs in p.ready.values() for v in vs.values()]
            if gone or drop_partition:
                self._removals += 1  # (before the mirror changes: an epoch read after this call sees it)
            p.remove(gone)
            for v in all_views:
                v.remove(gone)
            for g in gone:
                heapq.heappush(self.free, g)
                for t in tasks:
                    self.consumed[(pid, t)].discard(g)
            if drop_partition:
                self.seq_floor = floor
                del self.parts[pid]
                self._by_num.pop(p.num, None)
                for t in tasks:
                    self.consumed.pop((pid, t), None)
                self._sampling.drop(pid)
            return gone

    @_locked
    def drop_partition(self, pid: str) -> List[int]:
        """Remove a partition with its rows, consumption and sampler state (idempotent).
        Raises RestorePendingError while a restore of ``pid`` is unresolved."""
        p = self.parts.get(pid)
        return self.clear_rows(pid, [] if p is None else p.gidxs(), drop_partition=True)

    def drop_fields(self, missing: Dict[int, Set[str]]) -> None:
        """Forget produced fields whose payload no unit holds (after a power loss)."""
        with self._lock, wrap_errors("reconcile", self.path):
            changed = []  # (partition, slot, new field-set id)
            for g, fs in missing.items():
                q = int(self.gmap.part[g]) if 0 <= g < len(self.gmap.part) else -1
                p = self._by_num.get(q)
                if p is None:
                    continue
                s = int(self.gmap.slot[g])
                before = p.fsets[int(p.s_fs[s])]
                if before & fs:
                    changed.append((p, g, s, p.fs_id(before - frozenset(fs))))
            if not changed:
                return
            with self.env.begin(write=True) as txn:
                for p, g, s, f in changed:
                    txn.put(_g(g), R.encode_row2(p.num, p.s_key[s] is not None, int(p.s_seq[s]), p.fs_masks[f],
                                                 R.encode_tag(p.tags.get(g))), db=self.db["rows"])
            for p, g, s, f in changed:
                p.s_fs[s] = f
            for p in self.parts.values():  # rebuilt on the next fetch
                p.ready.clear()

    def close(self) -> None:
        with self._lock:
            for sid in list(self._snapshots):
                self.release(sid)
        self.env.close()

    def close_created(self) -> None:
        self.close()
        if self.created:
            files.unlink(self.path / "data.mdb")


install_restore_calls(Controller, _locked)  # ControllerPort's selective restores, under the controller's lock
