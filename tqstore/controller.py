"""Controller: the store's metadata in one LMDB environment, mirrored in memory.

Holds partitions, key → global index, rows (key, tag, produced fields, partition-local
sequence), per-task consumption, per-partition field schemas, the global index allocator
(unique across partitions; freed indexes are reused, smallest first) and sampler state.

Every mutating method is one LMDB transaction: when it returns, the change is committed
(and survives a process kill; with durability "commit" also a power loss).  The
in-memory mirror (:mod:`tqstore.controller_mirror`) is updated only after the commit
succeeds, so a failed call changes nothing.

The controller implements :class:`~tqstore.ports.ControllerPort`: every port method takes
the controller's lock (it is thread-safe by itself) and answers values — copies, never the
mirror.  ``plan_put`` → unit writes → ``commit_put`` must still be serialised by the caller
(the store's write lock): a plan is valid only until the next commit.  The sampler lives
here too (:class:`~tqstore.controller_sampling.SamplerHost`), so that a fetch chooses rows
and marks them consumed in one transaction under one lock.
"""
from __future__ import annotations

import contextlib
import functools
import heapq
import logging
import threading
from itertools import islice
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

import numpy as np

from ._format.columns import KIND_NAMES, Column
from ._format.dtypes import DTYPE_NAMES
from ._format import controller_records as R
from ._format.controller_records import RecordError, decode_row  # noqa: F401 - decode_row re-exported (CLI)
from ._format.values import check_value
from ._io import files
from ._io.lmdbenv import lmdb_commit_point, open_env, wrap_errors
from .controller_decode import (  # noqa: F401 - CONTROLLER_DBS, decode_controller re-exported for verify
    CONTROLLER_DBS, CONTROLLER_FORMAT, ControllerState, decode_controller,
)
from .controller_mirror import (
    Partition, PutPlan, Row, check_mirror, consumption_status, list_keys, partition_info,
    production_status, row_batch, row_info,
)
from .controller_restore import RestoreHost, install_restore_calls
from .controller_sampling import SamplerHost
from .errors import (
    CorruptionError, FormatVersionError, InvalidInputError, KeyNotFoundError, PartitionNotFoundError, SchemaError,
)
from ._format.names import check_key, check_name  # noqa: F401 - check_name re-exported
from .ports import PartitionInfo, RowBatch, RowInfo

log = logging.getLogger("tqstore")
_g = R.gidx_key
_pk = R.keys_key


def _locked(method):
    """Run a controller method under the controller's lock."""
    @functools.wraps(method)
    def locked(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)
    return locked


class Controller:
    """Metadata of a store. See the module docstring for guarantees."""

    def __init__(self, path: Path, *, num_units: int, sync: bool = False, map_bytes: Optional[int] = None) -> None:
        self.path = Path(path)
        kw = {"map_bytes": map_bytes} if map_bytes else {}
        self.env = open_env(self.path, max_dbs=12, sync=sync, **kw)
        self.db = {name: self.env.open_db(name.encode()) for name in CONTROLLER_DBS}
        self._lock = threading.RLock()
        self._sampling = SamplerHost(self)
        self._restores = RestoreHost(self)  # selective restores: records, lifecycle, guards
        self._snapshots: Dict[int, Any] = {}  # snapshot id -> read transaction (the controller's side of a cut)
        self._next_snapshot = 1
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
            # an existing format is checked by decode_controller

    def _load(self) -> None:
        with self.env.begin() as txn:
            st = decode_controller(txn, self.db, self.path)
        self.num_units, self.next_gidx, self.put_token = st.num_units, st.next_gidx, st.put_token
        self.parts, self.rows, self.consumed, self.free = st.parts, st.rows, st.consumed, st.free
        heapq.heapify(self.free)
        self._restores.load()

    # ------------------------------------------------------------------ queries
    def partition(self, pid: str) -> Partition:
        p = self.parts.get(pid)
        if p is None:
            raise PartitionNotFoundError(f"partition {pid!r} not found: it does not exist (known: {sorted(self.parts)[:10]})")
        return p

    def gidxs_for_keys(self, pid: str, keys: Sequence[str]) -> List[int]:
        """Global indexes of ``keys``. Raises PartitionNotFoundError / KeyNotFoundError."""
        p = self.partition(pid)
        out = [p.keys.get(k) for k in keys]
        missing = [k for k, g in zip(keys, out) if g is None]
        if missing:
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

    def check_mirror(self) -> None:
        """Assert the incremental structures agree with the rows and consumption (tests)."""
        with self._lock:
            check_mirror(self.parts, self.rows, self.consumed)

    # ------------------------------------------------------------------ port: queries (values)
    @_locked
    def partitions(self) -> List[str]:
        """Partition ids, sorted."""
        return sorted(self.parts)

    @_locked
    def partition_info(self, pid: str) -> PartitionInfo:
        """Schema and row count; raises PartitionNotFoundError."""
        return partition_info(self.partition(pid))

    @_locked
    def resolve_keys(self, pid: str, keys: Sequence[str]) -> List[int]:
        """Global indexes of ``keys``. Raises PartitionNotFoundError / KeyNotFoundError."""
        return self.gidxs_for_keys(pid, keys)

    @_locked
    def row_infos(self, pid: str, gidxs: Sequence[int]) -> List[Optional[RowInfo]]:
        """Row metadata (None for a gidx that is not a row of ``pid``)."""
        p = self.parts.get(pid)
        rows = p.rows if p is not None else {}
        return [None if r is None else row_info(r) for r in map(rows.get, gidxs)]

    @_locked
    def rows_by_key(self, pid: str, keys: Sequence[str]) -> Optional[RowBatch]:
        """Schema and row metadata of ``keys`` (missing: ``seqs[i] is None``); None for an
        unknown partition."""
        p = self.parts.get(pid)
        return None if p is None else row_batch(p, [None if g is None else p.rows[g] for g in map(p.keys.get, keys)])

    @_locked
    def row_batch(self, pid: str, gidxs: Sequence[int]) -> Optional[RowBatch]:
        """Schema and row metadata of ``gidxs`` in one answer; None for an unknown partition."""
        p = self.parts.get(pid)
        return None if p is None else row_batch(p, list(map(p.rows.get, gidxs)), gidxs)

    @_locked
    def first_rows(self, pid: str, limit: Optional[int] = None) -> Optional[RowBatch]:
        """The first ``limit`` rows (all when None) in insertion order with the schema; None
        for an unknown partition."""
        p = self.parts.get(pid)
        return None if p is None else row_batch(p, list(islice(p.rows.values(), limit)))

    @_locked
    def list_keys(self, pid: Optional[str] = None) -> Dict[str, Dict[str, Any]]:
        """``{partition: {key: tag}}`` (keys in insertion order, tags as stored) for one
        partition (empty when unknown) or all."""
        return list_keys(self.parts, pid)

    @_locked
    def claims(self, unit_id: int) -> Dict[int, frozenset]:
        """Rows on unit ``unit_id`` with their produced fields (for the store's reconcile)."""
        n = self.num_units
        return {g: r.fields for g, r in self.rows.items() if g % n == unit_id}  # frozensets

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
                 create_keys: bool = True) -> PutPlan:
        """Validate a put and reserve global indexes for new rows (nothing is committed).

        Exactly one of ``keys`` (KV rows, created if missing), ``gidxs`` (existing rows of
        ``pid``) or ``n_new`` (new unkeyed rows) addresses the rows.

        Raises:
            InvalidInputError: duplicate keys, sizes that disagree, bad tags.
            SchemaError: a field's kind or dtype clashes with the partition's schema.
            KeyNotFoundError: ``gidxs`` names rows not in the partition.
        """
        check_name("partition_id", pid)
        p = self.parts.get(pid)
        new_rows: List[Row] = []
        out: List[int] = []
        if keys is not None:
            n = len(keys)
            if len(set(keys)) != n:
                seen, dups = set(), []
                for k in keys:
                    if k in seen:
                        dups.append(k)
                    seen.add(k)
                raise InvalidInputError(f"duplicate keys in one call: {dups[:5]!r}")
            for k in keys:
                if not isinstance(k, str):
                    raise InvalidInputError(f"keys must be str, got {type(k).__name__} {k!r}")
        elif gidxs is not None:
            n = len(gidxs)
            if len(set(gidxs)) != n:
                raise InvalidInputError("duplicate global indexes in one call")
        else:
            n = n_new
        if tags is not None:
            if len(tags) != n:
                raise InvalidInputError(f"{len(tags)} tags for {n} rows")
            try:
                tags = [check_value(t) for t in tags]
            except InvalidInputError as e:  # UnsupportedTypeError included
                raise type(e)(f"tags: {e}") from None
        for col in columns:
            if len(col.payloads) != n:
                raise InvalidInputError(f"field {col.field!r} has {len(col.payloads)} rows, expected {n}")
        schema_new: Dict[str, Tuple[int, int]] = {}
        for col in columns:
            want = (col.kind, col.dtype)
            have = p.schema.get(col.field) if p else None
            if have is not None and have != want:
                raise SchemaError(
                    f"field {col.field!r} of partition {pid!r} holds {KIND_NAMES[have[0]]} "
                    f"{DTYPE_NAMES[have[1]]}, got {KIND_NAMES[want[0]]} {DTYPE_NAMES[want[1]]}")
            if have is None:
                schema_new[col.field] = want
        fields = [c.field for c in columns]
        if len(set(fields)) != len(fields):
            raise InvalidInputError("a field appears twice in one batch")
        self._restores.check_put(pid, keys, gidxs, {c.field: (c.kind, c.dtype) for c in columns})
        overwrites = False
        reserved: List[int] = []
        seq = p.next_seq if p else 0
        free_copy = None
        next_g = self.next_gidx

        def alloc() -> int:
            nonlocal free_copy, next_g
            if free_copy is None:
                free_copy = list(self.free)
            if free_copy:
                return heapq.heappop(free_copy)
            next_g += 1
            return next_g - 1

        if keys is not None:
            for k in keys:
                g = p.keys.get(k) if p else None
                if g is None:
                    if not create_keys:
                        raise KeyNotFoundError(f"key {k!r} not in partition {pid!r}")
                    check_key(pid, k)
                    g = alloc()
                    new_rows.append(Row(g, pid, k, None, set(), seq))
                    seq += 1
                    reserved.append(g)
                elif not overwrites and any(f in p.rows[g].fields for f in fields):
                    overwrites = True
                out.append(g)
        elif gidxs is not None:
            if p is None:
                raise PartitionNotFoundError(f"partition {pid!r} does not exist")
            for g in gidxs:
                r = p.rows.get(g)
                if r is None:
                    raise KeyNotFoundError(f"global index {g} is not a row of partition {pid!r}")
                if not overwrites and any(f in r.fields for f in fields):
                    overwrites = True
                out.append(int(g))
        else:
            for _ in range(n):
                g = alloc()
                new_rows.append(Row(g, pid, None, None, set(), seq))
                seq += 1
                out.append(g)
        return PutPlan(pid, out, new_rows, tags, fields, schema_new, overwrites, p is None)

    def commit_put(self, plan: PutPlan, *, token: Optional[int] = None) -> None:
        """Commit a planned put: new rows and keys, tags, produced fields, schema, allocator.

        ``token`` (an overwriting put's undo token, see ``Unit.settle``) is recorded in the
        same transaction: after a crash, tokens up to :attr:`put_token` were committed."""
        with self._lock, wrap_errors("commit put", self.path):
            m = self.db
            p = self.parts.get(plan.pid) or Partition(plan.pid)
            new_by_g = {r.gidx: r for r in plan.new_rows}
            # compute the resulting rows without touching the mirror yet
            result: List[Row] = []
            for i, g in enumerate(plan.gidxs):
                base = new_by_g.get(g) or p.rows[g]
                r = Row(g, base.pid, base.key, base.tag, frozenset(base.fields).union(plan.fields), base.seq)
                if plan.tags is not None:
                    r.tag = plan.tags[i]
                result.append(r)
            used_new = set(new_by_g)
            free_after = [f for f in self.free if f not in used_new]
            next_after = max([self.next_gidx] + [g + 1 for g in used_new])
            next_seq = max([p.next_seq] + [r.seq + 1 for r in plan.new_rows])
            with self.env.begin(write=True) as txn:
                txn.cursor(m["rows"]).putmulti([(_g(r.gidx), r.pack()) for r in result])
                keyed = [(_pk(plan.pid, r.key), _g(r.gidx)) for r in plan.new_rows if r.key is not None]
                if keyed:
                    txn.cursor(m["keys"]).putmulti(keyed)
                for g in used_new:
                    if g < self.next_gidx:
                        txn.delete(_g(g), db=m["free"])
                txn.put(R.META_NEXT_GIDX, R.encode_decimal(next_after), db=m["meta"])
                if token is not None:
                    txn.put(R.META_PUT_TOKEN, R.encode_decimal(token), db=m["meta"])
                for f, (kind, dt) in plan.schema_new.items():
                    txn.put(R.schema_key(plan.pid, f), R.encode_schema(kind, dt), db=m["schema"])
                old_seq = p.next_seq
                p.next_seq = next_seq
                txn.put(R.parts_key(plan.pid), p.pack(), db=m["parts"])
                p.next_seq = old_seq
                lmdb_commit_point("controller_commit")
            # committed: update the mirror
            p.next_seq = next_seq
            self.parts[plan.pid] = p
            views = [(self.consumed.get((plan.pid, t), ()), list(vs.items())) for t, vs in p.ready.items() if vs]
            for r in result:
                if views:
                    if r.gidx in new_by_g:
                        old: Optional[Set[str]] = None
                    else:
                        old = p.rows[r.gidx].fields
                    if old is None or len(r.fields) != len(old):
                        for done, vs in views:
                            if r.gidx in done:
                                continue
                            for need, v in vs:
                                if need <= r.fields and (old is None or not need <= old):
                                    v.add(r.gidx, r.seq)
                p.rows[r.gidx] = r
                self.rows[r.gidx] = r
                if r.key is not None:
                    p.keys[r.key] = r.gidx
            p.schema.update(plan.schema_new)
            self.free = free_after
            heapq.heapify(self.free)
            self.next_gidx = next_after
            if token is not None:
                self.put_token = token

    # ------------------------------------------------------------------ clears
    def clear_rows(self, pid: str, gidxs: Iterable[int], *, drop_partition: bool = False) -> List[int]:
        """Delete rows (keys, consumption marks) and free their global indexes.

        Idempotent: rows already gone are skipped. Returns the gidxs actually removed.  The
        sampler forgets cached results that mention them, in the same transaction.
        """
        with self._lock, wrap_errors("clear", self.path):
            p = self.parts.get(pid)
            if p is None:
                return []
            self._restores.check_clear(pid)
            gone = sorted({int(g) for g in gidxs if int(g) in p.rows})
            m = self.db
            tasks = [t for (pp, t) in self.consumed if pp == pid]
            forget = None if drop_partition or not gone else (lambda s: s.forget_rows(pid, gone))
            with self._sampling.change(pid, forget) as state, self.env.begin(write=True) as txn:
                if state is not None:
                    txn.put(R.sampler_key(pid), R.encode_sampler(state), db=m["sampler"])
                for g in gone:
                    r = p.rows[g]
                    txn.delete(_g(g), db=m["rows"])
                    if r.key is not None:
                        txn.delete(_pk(pid, r.key), db=m["keys"])
                    txn.put(_g(g), b"", db=m["free"])
                    for t in tasks:
                        if g in self.consumed[(pid, t)]:
                            txn.delete(self._cons_key(t, pid, g), db=m["cons"])
                if drop_partition:
                    txn.delete(R.parts_key(pid), db=m["parts"])
                    for f in p.schema:
                        txn.delete(R.schema_key(pid, f), db=m["schema"])
                    for t in tasks:
                        for g in self.consumed[(pid, t)]:
                            txn.delete(self._cons_key(t, pid, g), db=m["cons"])
                    txn.delete(R.sampler_key(pid), db=m["sampler"])
                lmdb_commit_point("controller_commit")
            all_views = [v for vs in p.ready.values() for v in vs.values()]
            for g in gone:
                r = p.rows.pop(g)
                for v in all_views:
                    v.rows.pop(g, None)
                self.rows.pop(g, None)
                if r.key is not None:
                    p.keys.pop(r.key, None)
                heapq.heappush(self.free, g)
                for t in tasks:
                    self.consumed[(pid, t)].discard(g)
            if drop_partition:
                del self.parts[pid]
                for t in tasks:
                    self.consumed.pop((pid, t), None)
                self._sampling.drop(pid)
            return gone

    @_locked
    def drop_partition(self, pid: str) -> List[int]:
        """Remove a partition with its rows, consumption and sampler state (idempotent)."""
        p = self.parts.get(pid)
        return [] if p is None else self.clear_rows(pid, list(p.rows), drop_partition=True)

    # ------------------------------------------------------------------ consumption
    _cons_key = staticmethod(R.cons_key)

    def mark_consumed(self, pid: str, task: str, gidxs: Sequence[int], *, sampler_state=None,
                      sampler_key: Optional[str] = None) -> None:
        """Mark rows consumed by ``task`` (and save sampler state) in one transaction."""
        check_name("task_name", task)
        with self._lock, wrap_errors("mark consumed", self.path):
            with self.env.begin(write=True) as txn:
                if gidxs:
                    prefix = R.cons_prefix(task, pid)  # as R.cons_key
                    txn.cursor(self.db["cons"]).putmulti([(prefix + _g(g), b"") for g in gidxs])
                if sampler_state is not None:
                    txn.put(R.sampler_key(sampler_key or pid), R.encode_sampler(sampler_state), db=self.db["sampler"])
                lmdb_commit_point("controller_commit")
            self.consumed[(pid, task)].update(gidxs)
            p = self.parts.get(pid)
            if p is not None and gidxs:
                for v in p.ready.get(task, {}).values():
                    for g in gidxs:
                        v.rows.pop(g, None)

    def reset_consumption(self, pid: str, task: Optional[str] = None) -> bool:
        """Forget consumption of ``pid`` by ``task`` (all tasks when None) and the sampler's
        cache of it, in one transaction.  False (nothing done) for an unknown partition."""
        with self._lock, wrap_errors("reset consumption", self.path):
            if pid not in self.parts:
                return False
            tasks = [t for (pp, t) in list(self.consumed) if pp == pid and (task is None or t == task)]
            with self._sampling.change(pid, lambda s: s.clear_cache(pid, task)) as state, \
                    self.env.begin(write=True) as txn:
                if state is not None:
                    txn.put(R.sampler_key(pid), R.encode_sampler(state), db=self.db["sampler"])
                for t in tasks:
                    for g in self.consumed[(pid, t)]:
                        txn.delete(self._cons_key(t, pid, g), db=self.db["cons"])
                lmdb_commit_point("controller_commit")
            for t in tasks:
                self.consumed.pop((pid, t), None)
            p = self.parts.get(pid)
            if p is not None:  # rebuilt on the next fetch
                if task is None:
                    p.ready.clear()
                else:
                    p.ready.pop(task, None)
            return True

    # ------------------------------------------------------------------ sampler state
    def sampler_state(self, key: str) -> Optional[Any]:
        with self.env.begin() as txn:
            raw = txn.get(R.sampler_key(key), db=self.db["sampler"])
        if raw is None:
            return None
        try:
            return R.decode_sampler(raw)
        except RecordError as e:
            raise CorruptionError(f"controller index: malformed sampler entry {key[:40]!r}: {e}",
                                  path=str(self.path / "data.mdb")) from e

    def set_sampler_state(self, key: str, state: Any) -> None:
        with self._lock, wrap_errors("save sampler state", self.path):
            with self.env.begin(write=True) as txn:
                txn.put(R.sampler_key(key), R.encode_sampler(state), db=self.db["sampler"])

    def drop_fields(self, missing: Dict[int, Set[str]]) -> None:
        """Forget produced fields whose payload no unit holds (after a power loss)."""
        with self._lock, wrap_errors("reconcile", self.path):
            changed = []
            for g, fs in missing.items():
                r = self.rows.get(g)
                if r is None:
                    continue
                changed.append(Row(r.gidx, r.pid, r.key, r.tag, r.fields - fs, r.seq))
            if not changed:
                return
            with self.env.begin(write=True) as txn:
                for r in changed:
                    txn.put(_g(r.gidx), r.pack(), db=self.db["rows"])
            for r in changed:
                self.rows[r.gidx].fields = r.fields
            for p in self.parts.values():  # rebuilt on the next fetch
                p.ready.clear()

    # ------------------------------------------------------------------ snapshots, checkpoints (see ControllerPort)
    @_locked
    def snapshot(self) -> int:
        """Open the controller's side of an MVCC cut (a read transaction); returns its id."""
        sid, self._next_snapshot = self._next_snapshot, self._next_snapshot + 1
        self._snapshots[sid] = self.env.begin(buffers=False)
        return sid

    def release(self, snapshot: int) -> None:
        """Close a snapshot (idempotent)."""
        with self._lock:
            txn = self._snapshots.pop(snapshot, None)
        if txn is not None:
            with contextlib.suppress(Exception):  # (an env already closed)
                txn.abort()

    def _txn_of(self, snapshot: int):
        txn = self._snapshots.get(snapshot)
        if txn is None:
            raise InvalidInputError(f"controller: snapshot {snapshot!r} is unknown or released")
        return txn

    def export_snapshot(self, snapshot: int, dest_dir, *, index_block_bytes: int = 1 << 20):
        from .controller_export import export_controller

        with self._lock:
            txn = self._txn_of(snapshot)
        return export_controller(self.env, txn, self.db, Path(dest_dir), index_block_bytes=index_block_bytes)

    @_locked
    def snapshot_rows(self, snapshot: int, pid: str, keys: Sequence[str]) -> Optional[RowBatch]:
        from .controller_dump import rows_at  # (see ControllerPort)

        return rows_at(self._txn_of(snapshot), self.db, pid, list(keys), path=str(self.path / "data.mdb"))

    def stage_import(self, target_dir, src_dir, *, num_units: Optional[int] = None,
                     clear_produced: bool = False) -> None:
        from .controller_export import stage_controller

        stage_controller(Path(target_dir), Path(src_dir), num_units=num_units)
        if clear_produced:  # a checkpoint saved without storage: its rows keep no produced field
            c = Controller(Path(target_dir), num_units=num_units or 1)  # (an existing index keeps its count)
            try:
                with wrap_errors("clear produced fields", target_dir):
                    c.drop_fields({g: set(r.fields) for g, r in c.rows.items() if r.fields})
                    c.env.sync(True)
                    files.fsync_tree(target_dir)
            finally:
                c.close()

    def close(self) -> None:
        with self._lock:
            for sid in list(self._snapshots):
                self.release(sid)
        self.env.close()


install_restore_calls(Controller, _locked)  # ControllerPort's selective restores, under the controller's lock
