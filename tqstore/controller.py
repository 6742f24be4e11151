"""Controller: the store's metadata in one LMDB environment, mirrored in memory.

Holds partitions, key → global index, rows (key, tag, produced fields, partition-local
sequence), per-task consumption, per-partition field schemas, the global index allocator
(unique across partitions; freed indexes are reused, smallest first) and sampler state.

Every mutating method is one LMDB transaction: when it returns, the change is committed
(and survives a process kill; with durability "commit" also a power loss).  The
in-memory mirror is updated only after the commit succeeds, so a failed call changes
nothing.  Not thread-safe for writers: the store serialises them.

Incremental structures (derived from the mirror, kept in step by every mutating method):

* ``Partition.rows`` is in insertion order, i.e. ordered by ``seq`` (new rows always get
  the partition's next sequence number; :meth:`Controller._load` sorts once);
* ``Partition.ready[task][need]`` — for each ``(task, requested field set)`` a fetch has
  asked about — the rows whose ``need`` fields are produced and that ``task`` has not
  consumed, so that a fetch costs O(ready) rather than a scan and sort of the partition.
  Built on first use, updated by :meth:`commit_put`, :meth:`mark_consumed`,
  :meth:`clear_rows`, dropped by :meth:`reset_consumption` / :meth:`drop_fields`.
"""
from __future__ import annotations

import heapq
import json
import logging
import threading
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

from ._format.columns import KIND_NAMES, Column
from ._format.dtypes import DTYPE_NAMES
from ._format.values import check_value, dumps as _dumps_value, loads as _loads_value
from ._io.lmdbenv import lmdb_commit_point, open_env, wrap_errors
from .errors import (
    CorruptionError, FormatVersionError, InvalidInputError, KeyNotFoundError, PartitionNotFoundError, SchemaError,
)
from ._format.names import check_key, check_name

log = logging.getLogger("tqstore")

CONTROLLER_FORMAT = 1


def _g(gidx: int) -> bytes:
    return gidx.to_bytes(8, "big")


def _pk(pid: str, key: str) -> bytes:
    return pid.encode() + b"\0" + key.encode()


@dataclass
class Row:
    """One row's metadata. ``fields`` are the produced fields."""

    gidx: int
    pid: str
    key: Optional[str]
    tag: Any
    fields: Set[str]
    seq: int

    def pack(self) -> bytes:
        return _dumps_value({"p": self.pid, "k": self.key, "t": self.tag, "f": sorted(self.fields),
                             "s": self.seq}, ensure_ascii=True).encode()

    @classmethod
    def unpack(cls, gidx: int, raw: bytes) -> "Row":
        """Raises ValueError, KeyError, TypeError or UnicodeDecodeError on a malformed value."""
        d = _loads_value(raw)
        p, k, f, s = d["p"], d["k"], d["f"], d["s"]
        if type(p) is not str or not (k is None or type(k) is str) or type(f) is not list \
                or type(s) is not int or s < 0 or not all(type(x) is str for x in f):
            raise ValueError(f"members of the wrong type: p {type(p).__name__}, k {type(k).__name__}, "
                             f"f {type(f).__name__}, s {type(s).__name__}")
        return cls(gidx, p, k, d["t"], set(f), s)


class _Ready:
    """Rows of one partition ready for one ``(task, need)``: gidx -> seq, seq-ordered unless
    ``dirty`` (a row older than the newest one became ready; sorted on next use)."""

    __slots__ = ("rows", "last", "dirty")

    def __init__(self, rows: Dict[int, int]) -> None:
        self.rows = rows
        self.last = max(rows.values(), default=-1)
        self.dirty = False

    def add(self, gidx: int, seq: int) -> None:
        if gidx in self.rows:
            return
        self.rows[gidx] = seq
        if seq < self.last:
            self.dirty = True
        else:
            self.last = seq

    def ordered(self) -> List[int]:
        if self.dirty:
            self.rows = dict(sorted(self.rows.items(), key=lambda kv: kv[1]))
            self.dirty = False
        return list(self.rows)


_MAX_VIEWS_PER_TASK = 8


@dataclass
class Partition:
    pid: str
    keys: Dict[str, int] = field(default_factory=dict)
    rows: Dict[int, Row] = field(default_factory=dict)
    schema: Dict[str, Tuple[int, int]] = field(default_factory=dict)  # field -> (kind, dtype)
    next_seq: int = 0
    meta: Dict[str, Any] = field(default_factory=dict)
    # task -> frozenset(requested fields) -> rows ready and unconsumed (see the module docstring)
    ready: Dict[str, Dict[frozenset, _Ready]] = field(default_factory=dict, repr=False, compare=False)

    def pack(self) -> bytes:
        return json.dumps({"next_seq": self.next_seq, "meta": self.meta}).encode()


@dataclass
class PutPlan:
    """A validated put, with global indexes reserved in memory but nothing committed."""

    pid: str
    gidxs: List[int]
    new_rows: List[Row]
    tags: Optional[List[Any]]
    fields: List[str]
    schema_new: Dict[str, Tuple[int, int]]
    overwrites: bool  # some (gidx, field) already produced
    new_partition: bool


CONTROLLER_DBS = ("meta", "free", "parts", "keys", "rows", "cons", "schema", "sampler", "restores")


@dataclass
class ControllerState:
    """Everything :func:`decode_controller` read from a controller index."""

    num_units: int
    next_gidx: int
    put_token: int  # last committed overwriting put (0 when none)
    free: List[int]
    parts: Dict[str, Partition]
    rows: Dict[int, Row]
    consumed: Dict[Tuple[str, str], Set[int]]


def _decimal(raw: Any, least: int = 0) -> int:
    """An ASCII decimal value of the ``meta`` database (ValueError otherwise)."""
    if raw is None:
        raise ValueError("missing")
    b = bytes(raw)
    if not b.isdigit() or len(b) > 20 or int(b) < least:
        raise ValueError(f"{b[:40]!r} is not an ASCII decimal integer >= {least}")
    return int(b)


def _json_obj(raw: Any) -> Dict[str, Any]:
    d = _loads_value(raw)
    if not isinstance(d, dict):
        raise ValueError(f"a JSON {type(d).__name__}, not an object")
    return d


def decode_controller(txn, dbs: Mapping[str, Any], path: Path) -> ControllerState:
    """Decode and check every entry of the controller index at ``path`` in read transaction
    ``txn`` (``dbs``: its named databases, see :data:`CONTROLLER_DBS`; ``keys`` and
    ``restores`` are not read).  The one decoder of the store's open and of checkpoint
    verification.

    Raises:
        FormatVersionError: ``meta/format`` names another version.
        CorruptionError: any entry is malformed (names ``data.mdb`` and the entry).
    """
    file = str(Path(path) / "data.mdb")
    where: Any = "meta/format"
    try:
        meta = dbs["meta"]
        fmt = _decimal(txn.get(b"format", db=meta))
        if fmt != CONTROLLER_FORMAT:
            raise FormatVersionError(f"controller index format {fmt} is not supported (reads {CONTROLLER_FORMAT})",
                                     path=file)
        where = "meta/num_units"
        num_units = _decimal(txn.get(b"num_units", db=meta), 1)
        where = "meta/next_gidx"
        next_gidx = _decimal(txn.get(b"next_gidx", db=meta))
        where = "meta/put_token"
        raw_token = txn.get(b"put_token", db=meta)
        put_token = _decimal(raw_token) if raw_token is not None else 0
        free: List[int] = []
        for k in txn.cursor(dbs["free"]).iternext(values=False):
            where = ("free", bytes(k))
            g = int.from_bytes(k, "big")
            if len(k) != 8 or g >= next_gidx:
                raise ValueError(f"not a global index below next_gidx {next_gidx}")
            free.append(g)
        free.sort()
        parts: Dict[str, Partition] = {}
        for k, v in txn.cursor(dbs["parts"]):
            where = ("parts", bytes(k))
            pid = bytes(k).decode("utf-8")
            d = _json_obj(v)
            seq, pmeta = d["next_seq"], d.get("meta", {})
            if type(seq) is not int or seq < 0 or not isinstance(pmeta, dict):
                raise ValueError("next_seq must be an int >= 0 and meta an object")
            parts[pid] = Partition(pid, next_seq=seq, meta=pmeta)
        loaded = []
        for k, v in txn.cursor(dbs["rows"]):
            where = ("rows", bytes(k))
            g = int.from_bytes(k, "big")
            if len(k) != 8 or g >= next_gidx:
                raise ValueError(f"not a global index below next_gidx {next_gidx}")
            r = Row.unpack(g, v)
            if r.pid not in parts:
                raise ValueError(f"row of partition {r.pid[:40]!r}, which has no parts entry")
            loaded.append(r)
        loaded.sort(key=lambda r: r.seq)  # Partition.rows is kept in seq order
        rows: Dict[int, Row] = {}
        for r in loaded:
            where = ("rows", _g(r.gidx))
            rows[r.gidx] = r
            p = parts[r.pid]
            p.rows[r.gidx] = r
            if r.key is not None:
                if r.key in p.keys:
                    raise ValueError(f"key {r.key[:40]!r} of partition {r.pid[:40]!r} is claimed by two rows")
                p.keys[r.key] = r.gidx
        if len(free) + len(rows) > next_gidx or not rows.keys().isdisjoint(free):
            where = "free"
            raise ValueError("a global index is both free and a row")
        for k, v in txn.cursor(dbs["schema"]):
            where = ("schema", bytes(k))
            pid, sep, f = bytes(k).decode("utf-8").partition("\0")
            d = _json_obj(v)
            kind, dt = d["kind"], d["dtype"]
            if not sep or not f or pid not in parts or type(kind) is not int or kind not in KIND_NAMES \
                    or type(dt) is not int or dt not in DTYPE_NAMES:
                raise ValueError("not a known partition, field, kind and dtype")
            parts[pid].schema[f] = (kind, dt)
        consumed: Dict[Tuple[str, str], Set[int]] = defaultdict(set)
        for k in txn.cursor(dbs["cons"]).iternext(values=False):
            k = bytes(k)
            where = ("cons", k)
            task, sep, pid = k[:-9].decode("utf-8").partition("\0")
            if len(k) < 11 or k[-9] != 0 or not sep or not task or not pid:
                raise ValueError("not task NUL partition NUL global index")
            consumed[(pid, task)].add(int.from_bytes(k[-8:], "big"))
        for k, v in txn.cursor(dbs["sampler"]):
            where = ("sampler", bytes(k))
            bytes(k).decode("utf-8")
            _json_obj(v)
    except CorruptionError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError, RecursionError) as e:
        if isinstance(where, tuple):
            where = f"{where[0]} entry {where[1][:40]!r}"
        raise CorruptionError(f"controller index: malformed {where}: {type(e).__name__}: {e} (damaged metadata: "
                              f"load the last good checkpoint into a new store)", path=file) from e
    return ControllerState(num_units, next_gidx, put_token, free, parts, rows, consumed)


class Controller:
    """Metadata of a store. See the module docstring for guarantees."""

    def __init__(self, path: Path, *, num_units: int, sync: bool = False, map_bytes: Optional[int] = None) -> None:
        self.path = Path(path)
        kw = {"map_bytes": map_bytes} if map_bytes else {}
        self.env = open_env(self.path, max_dbs=12, sync=sync, **kw)
        self.db = {name: self.env.open_db(name.encode()) for name in CONTROLLER_DBS}
        self._lock = threading.RLock()
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
            fmt = txn.get(b"format", db=self.db["meta"])
            if fmt is None:
                txn.put(b"format", str(CONTROLLER_FORMAT).encode(), db=self.db["meta"])
                txn.put(b"next_gidx", b"0", db=self.db["meta"])
                txn.put(b"num_units", str(num_units).encode(), db=self.db["meta"])
            # an existing format is checked by decode_controller

    def _load(self) -> None:
        with self.env.begin() as txn:
            st = decode_controller(txn, self.db, self.path)
        self.num_units, self.next_gidx, self.put_token = st.num_units, st.next_gidx, st.put_token
        self.parts, self.rows, self.consumed, self.free = st.parts, st.rows, st.consumed, st.free
        heapq.heapify(self.free)

    # ------------------------------------------------------------------ queries
    def partition(self, pid: str) -> Partition:
        p = self.parts.get(pid)
        if p is None:
            raise PartitionNotFoundError(f"partition {pid!r} does not exist (known: {sorted(self.parts)[:10]})")
        return p

    def gidxs_for_keys(self, pid: str, keys: Sequence[str]) -> List[int]:
        """Global indexes of ``keys``. Raises PartitionNotFoundError / KeyNotFoundError."""
        p = self.partition(pid)
        out = []
        missing = []
        for k in keys:
            g = p.keys.get(k)
            if g is None:
                missing.append(k)
            out.append(g)
        if missing:
            raise KeyNotFoundError(f"{len(missing)} key(s) not in partition {pid!r}: {missing[:5]!r}")
        return out

    def ready(self, pid: str, task: str, need: frozenset) -> List[int]:
        """Rows of ``pid`` whose ``need`` fields are all produced and that ``task`` has not
        consumed, in insertion order. O(ready) once the view exists (first call: O(rows))."""
        with self._lock:
            p = self.parts.get(pid)
            if p is None:
                return []
            views = p.ready.setdefault(task, {})
            v = views.pop(need, None)
            if v is None:
                done = self.consumed.get((pid, task), ())
                v = _Ready({g: r.seq for g, r in p.rows.items() if g not in done and need <= r.fields})
                while len(views) >= _MAX_VIEWS_PER_TASK:
                    del views[next(iter(views))]  # least recently used
            views[need] = v  # most recently used last
            return v.ordered()

    def check_mirror(self) -> None:
        """Assert the incremental structures agree with the rows and consumption (tests)."""
        with self._lock:
            for pid, p in self.parts.items():
                seqs = [r.seq for r in p.rows.values()]
                assert seqs == sorted(seqs), f"rows of {pid!r} are not in seq order"
                assert len(set(seqs)) == len(seqs), f"duplicate seq in {pid!r}"
                assert all(self.rows.get(g) is r for g, r in p.rows.items()), f"rows of {pid!r} differ from the index"
                assert {k: g for k, g in p.keys.items()} == {r.key: g for g, r in p.rows.items()
                                                              if r.key is not None}, f"keys of {pid!r}"
                for task, views in p.ready.items():
                    done = self.consumed.get((pid, task), set())
                    for need, v in views.items():
                        want = [g for g, r in p.rows.items() if g not in done and need <= r.fields]
                        assert v.ordered() == want, (pid, task, sorted(need), v.ordered(), want)
            assert sum(len(p.rows) for p in self.parts.values()) == len(self.rows)

    # ------------------------------------------------------------------ puts
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
                r = Row(g, base.pid, base.key, base.tag, set(base.fields) | set(plan.fields), base.seq)
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
                txn.put(b"next_gidx", str(next_after).encode(), db=m["meta"])
                if token is not None:
                    txn.put(b"put_token", str(token).encode(), db=m["meta"])
                for f, (kind, dt) in plan.schema_new.items():
                    txn.put((plan.pid + "\0" + f).encode(), json.dumps({"kind": kind, "dtype": dt}).encode(),
                            db=m["schema"])
                old_seq = p.next_seq
                p.next_seq = next_seq
                txn.put(plan.pid.encode(), p.pack(), db=m["parts"])
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

        Idempotent: rows already gone are skipped. Returns the gidxs actually removed.
        """
        with self._lock, wrap_errors("clear", self.path):
            p = self.parts.get(pid)
            if p is None:
                return []
            gone = sorted({int(g) for g in gidxs if int(g) in p.rows})
            m = self.db
            tasks = [t for (pp, t) in self.consumed if pp == pid]
            with self.env.begin(write=True) as txn:
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
                    txn.delete(pid.encode(), db=m["parts"])
                    for f in p.schema:
                        txn.delete((pid + "\0" + f).encode(), db=m["schema"])
                    for t in tasks:
                        for g in self.consumed[(pid, t)]:
                            txn.delete(self._cons_key(t, pid, g), db=m["cons"])
                    txn.delete(pid.encode(), db=m["sampler"])
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
            return gone

    # ------------------------------------------------------------------ consumption
    @staticmethod
    def _cons_key(task: str, pid: str, gidx: int) -> bytes:
        return task.encode() + b"\0" + pid.encode() + b"\0" + _g(gidx)

    def mark_consumed(self, pid: str, task: str, gidxs: Sequence[int], *, sampler_state=None,
                      sampler_key: Optional[str] = None) -> None:
        """Mark rows consumed by ``task`` (and save sampler state) in one transaction."""
        check_name("task_name", task)
        with self._lock, wrap_errors("mark consumed", self.path):
            with self.env.begin(write=True) as txn:
                if gidxs:
                    prefix = task.encode() + b"\0" + pid.encode() + b"\0"  # as _cons_key
                    txn.cursor(self.db["cons"]).putmulti([(prefix + g.to_bytes(8, "big"), b"") for g in gidxs])
                if sampler_state is not None:
                    txn.put((sampler_key or pid).encode(), json.dumps(sampler_state).encode(), db=self.db["sampler"])
                lmdb_commit_point("controller_commit")
            self.consumed[(pid, task)].update(gidxs)
            p = self.parts.get(pid)
            if p is not None and gidxs:
                for v in p.ready.get(task, {}).values():
                    for g in gidxs:
                        v.rows.pop(g, None)

    def reset_consumption(self, pid: str, task: Optional[str] = None) -> None:
        """Forget consumption of ``pid`` by ``task`` (all tasks when None)."""
        with self._lock, wrap_errors("reset consumption", self.path):
            tasks = [t for (pp, t) in list(self.consumed) if pp == pid and (task is None or t == task)]
            with self.env.begin(write=True) as txn:
                for t in tasks:
                    for g in self.consumed[(pid, t)]:
                        txn.delete(self._cons_key(t, pid, g), db=self.db["cons"])
            for t in tasks:
                self.consumed.pop((pid, t), None)
            p = self.parts.get(pid)
            if p is not None:  # rebuilt on the next fetch
                if task is None:
                    p.ready.clear()
                else:
                    p.ready.pop(task, None)

    # ------------------------------------------------------------------ sampler state
    def sampler_state(self, key: str) -> Optional[Any]:
        with self.env.begin() as txn:
            raw = txn.get(key.encode(), db=self.db["sampler"])
        if raw is None:
            return None
        try:
            return _json_obj(raw)
        except (ValueError, UnicodeDecodeError, RecursionError) as e:
            raise CorruptionError(f"controller index: malformed sampler entry {key[:40]!r}: {e}",
                                  path=str(self.path / "data.mdb")) from e

    def set_sampler_state(self, key: str, state: Any) -> None:
        with self._lock, wrap_errors("save sampler state", self.path):
            with self.env.begin(write=True) as txn:
                txn.put(key.encode(), json.dumps(state).encode(), db=self.db["sampler"])

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

    # ------------------------------------------------------------------ misc
    def snapshot_txn(self):
        """A read transaction: the controller's side of an MVCC cut."""
        return self.env.begin(buffers=False)

    def close(self) -> None:
        self.env.close()

