"""Selective restores on the controller's side: the records of ``restores`` (docs/FORMAT.md,
"Controller index", "Selective restores"), their lifecycle and the guards they put on the
partition.

Lifecycle (every step one controller transaction, the mirror updated after the commit):

* ``begin``: the restore's id (random, 32 hex digits) and unit-side tag (``meta/restore_tag``
  + 1, never reused), its rows (key -> gidx: an existing key keeps its row's gidx, a new key
  gets an index reserved from the allocator: out of ``free``, or ``next_gidx`` raised), the
  fields it adds to the partition's schema, every unit "pending";
* per unit ``claim`` (attempt + 1, "claimed") and ``complete`` (quoting the attempt);
* ``finish`` (every unit complete): rows, tags, produced fields and schema committed with the
  state "committed" — or ``cancel``: "cancelled";
* ``forget`` once the units settled: the record goes; a cancelled restore's reserved indexes
  go back to ``free`` in that transaction (never earlier: a unit may still hold frames
  stamped with them).

While a record exists the partition's clears, puts that would create or overwrite its keys,
and puts of a field that clashes with its schema raise :class:`RestorePendingError` /
:class:`SchemaError`.  A second restore into the partition raises
:class:`RestorePendingError` until the first is resolved.
"""
from __future__ import annotations

import functools
import heapq
import time
import uuid
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ._format import controller_records as R
from ._format.columns import KIND_NAMES, describe_kind_dtype
from ._format.dtypes import DTYPE_NAMES, SCHEMA_MIXED
from ._format.names import check_field_name, check_key, check_name
from ._format.records import RecordError
from ._format.values import check_value
from ._io.lmdbenv import lmdb_commit_point, wrap_errors
from .controller_mirror import Partition, row_batch
from .controller_put import new_field_bits
from .errors import CapacityError, CorruptionError, InvalidInputError, SchemaError
from .ports import RestoreInfo, rows_gaining_data

if TYPE_CHECKING:  # pragma: no cover
    from .controller import Controller

_GIDX, _FIELDS, _TAG = attrgetter("gidx"), attrgetter("fields"), attrgetter("tag")

#: the ControllerPort methods of selective restores (Controller delegates them here, under its lock)
RESTORE_CALLS = ("begin_restore", "claim_restore", "complete_restore", "finish_restore", "cancel_restore",
                 "forget_restore", "restores", "restore")


def _schema_clash(pid: str, f: str, have: Tuple[int, int], want: Tuple[int, int], what: str) -> SchemaError:
    return SchemaError(f"field {f!r} of partition {pid!r} holds {describe_kind_dtype(have)}, "
                       f"{what} {describe_kind_dtype(want)}")


def _merged(have: Optional[Tuple[int, int]], want: Tuple[int, int], strict: bool) -> Optional[Tuple[int, int]]:
    """The schema entry of a field holding ``have`` after rows of ``want`` join it, or None on
    a clash: another kind always clashes; another dtype clashes when ``strict``, else the entry
    becomes ``(kind, SCHEMA_MIXED)`` (as :func:`~tqstore._format.columns.schema_changes`)."""
    if have is None or have == want:
        return want
    if have[0] != want[0] or strict:
        return None
    return (have[0], SCHEMA_MIXED)


_SCALARS = (type(None), bool, int, float)


def check_tags(tags: List[Any]) -> List[Any]:
    """:func:`~tqstore._format.values.check_value` of a list of tags, with a fast path for the
    common tag (None, a scalar, an ASCII string, or a flat dict of ASCII keys and such values:
    nothing to normalise or refuse there; a dict is copied); any other tag goes through
    ``check_value``.  Raises what ``check_value`` raises."""
    out = []
    scalars = _SCALARS
    for t in tags:
        ty = type(t)
        if ty in scalars or (ty is str and t.isascii()):
            out.append(t)
            continue
        if ty is dict:
            for k, v in t.items():
                if type(k) is not str or not k.isascii() or not (type(v) in scalars or
                                                                  (type(v) is str and v.isascii())):
                    break
            else:
                out.append(dict(t))
                continue
        out.append(check_value(t))
    return out


def _check_room(p: Optional[Partition], recs: Sequence[R.RestoreRow], num_units: int,
                room: Sequence[int]) -> None:
    """Raise CapacityError when the restore gives a unit more rows with data than ``room[u]``
    (rows of a new key with produced fields, and existing rows without data that get some;
    unit ``gidx % num_units``), before anything is written."""
    with_data = [r.gidx for r in recs if r.fields]  # (a new key's reserved gidx is no row yet)
    grow = rows_gaining_data(with_data, row_batch(p, with_data) if p is not None else None, num_units)
    for u, n in sorted(grow.items()):  # (a unit the load adds nothing to may be over its share already)
        free = room[u]
        if n > free:
            raise CapacityError(
                f"Storage capacity exceeded: the load gives unit {u} {n} more rows with data, its share under "
                f"total_storage_size has room for {max(0, free)}; nothing was written (clear rows or raise "
                f"total_storage_size)", setting="total_storage_size")


class RestoreHost:
    """The restore records of one :class:`~tqstore.controller.Controller` and their mirror;
    methods run under the controller's lock."""

    def __init__(self, controller: "Controller") -> None:
        self._c = controller
        self.active: Dict[str, R.RestoreRecord] = {}
        self._keys: Dict[str, Dict[str, str]] = {}  # pid -> key -> rid
        self._gidxs: Dict[int, str] = {}  # store gidx -> rid
        self.rows: Dict[str, List[R.RestoreRow]] = {}  # rid -> its rows in dump order (running restores)
        self.tag_texts: Dict[str, List[str]] = {}  # rid -> its rows' tags as JSON text (begun by this process)
        self.last_tag = 0

    @property
    def _file(self) -> str:
        return str(self._c.path / "data.mdb")

    # ------------------------------------------------------------------ open
    def load(self) -> None:
        """Read every restore record (checked; CorruptionError naming the entry)."""
        c = self._c
        where: Any = "meta/restore_tag"
        chunks: Dict[str, Dict[int, List[R.RestoreRow]]] = {}
        try:
            with c.env.begin() as txn:
                self.last_tag = R.decode_optional_decimal(txn.get(R.META_RESTORE_TAG, db=c.db["meta"]))
                for k, v in txn.cursor(c.db["restores"]):
                    where = ("restores", bytes(k))
                    rid, chunk = R.decode_restore_key(k)
                    if chunk is None:
                        self.active[rid] = R.decode_restore(v)
                    else:
                        chunks.setdefault(rid, {})[chunk] = R.decode_restore_rows(v)
            for rid, cs in chunks.items():
                where = ("restores", R.restore_key(rid))
                if rid not in self.active or sorted(cs) != list(range(len(cs))):
                    raise RecordError("row chunks of a restore without a header, or not numbered 0..n-1")
            free = set(c.free) if self.active else set()
            part = c.gmap.part
            for rid, rec in self.active.items():  # reserved: below next_gidx; neither row nor free until committed
                where = ("restores", R.restore_key(rid))
                bad = [g for g in rec.reserved if g >= c.next_gidx or g in free or
                       (rec.state != "committed" and g < len(part) and part[g] >= 0)]
                if bad:
                    raise RecordError(f"reserved global index {bad[0]} is at or above next_gidx {c.next_gidx}, "
                                      f"free, or a row")
        except RecordError as e:
            if isinstance(where, tuple):
                where = f"{where[0]} entry {where[1][:48]!r}"
            raise CorruptionError(f"controller index: malformed {where}: {e}", path=self._file) from e
        for rid, rec in self.active.items():
            cs = chunks.get(rid, {})
            self._index(rid, rec, [r for i in sorted(cs) for r in cs[i]])

    def _index(self, rid: str, rec: R.RestoreRecord, rows: List[R.RestoreRow]) -> None:
        self.rows[rid] = rows
        keys = self._keys.setdefault(rec.pid, {})
        for r in rows:
            keys[r.key] = rid
            self._gidxs[r.gidx] = rid

    def _unindex(self, rid: str) -> None:
        rec = self.active.pop(rid)
        self.rows.pop(rid, None)
        self.tag_texts.pop(rid, None)
        keys = self._keys.get(rec.pid, {})
        for k in [k for k, r in keys.items() if r == rid]:
            del keys[k]
        if not keys:
            self._keys.pop(rec.pid, None)
        for g in [g for g, r in self._gidxs.items() if r == rid]:
            del self._gidxs[g]

    # ------------------------------------------------------------------ guards
    def of_partition(self, pid: str) -> Optional[str]:
        for rid, rec in self.active.items():
            if rec.pid == pid:
                return rid
        return None

    def check_clear(self, pid: str) -> None:
        """Raise RestorePendingError if ``pid`` has an unresolved restore."""
        rid = self.of_partition(pid)
        if rid is not None:
            raise self.info(rid).pending_error(f"clearing rows of partition {pid!r}")

    def check_put(self, pid: str, keys: Optional[Sequence[str]], gidxs: Optional[Sequence[int]],
                  schema: Mapping[str, Tuple[int, int]], *, strict_dtypes: bool = True) -> None:
        """Raise RestorePendingError for a put creating or overwriting a restore's rows,
        SchemaError for a field clashing with a pending restore's schema (a dtype change is a
        clash only with ``strict_dtypes``)."""
        if not self.active:
            return
        ours = self._keys.get(pid, {})
        hit = next((k for k in keys if k in ours), None) if keys is not None and ours else None
        if hit is not None:
            raise self.info(ours[hit]).pending_error(f"a put of key {hit!r}")
        if gidxs is not None:
            hit = next((g for g in gidxs if g in self._gidxs), None)
            if hit is not None:
                raise self.info(self._gidxs[hit]).pending_error(f"a put of global index {hit}")
        rid = self.of_partition(pid)
        if rid is not None:
            for f, want in schema.items():
                have = self.active[rid].schema.get(f)
                if _merged(have, want, strict_dtypes) is None:
                    raise _schema_clash(pid, f, have, want, "as a pending restore writes it; got")

    # ------------------------------------------------------------------ values
    def info(self, rid: str, *, rows: bool = False) -> RestoreInfo:
        rec = self.active[rid]
        keys = gidxs = srcs = None
        if rows:
            rs = self.rows.get(rid, [])
            keys = tuple(r.key for r in rs)
            gidxs = tuple(r.gidx for r in rs)
            srcs = tuple(r.src for r in rs)
        return RestoreInfo(rid, rec.tag, rec.pid, rec.dump, rec.state, rec.units, rec.attempts, rec.rows,
                           keys, gidxs, srcs, len(rec.reserved))

    def _chunk_keys(self, rid: str) -> List[bytes]:
        n = len(self.rows.get(rid, ()))
        return [R.restore_chunk_key(rid, i) for i in range((n + R.RESTORE_CHUNK_ROWS - 1) // R.RESTORE_CHUNK_ROWS)]

    def _get(self, rid: str, *states: str) -> R.RestoreRecord:
        rec = self.active.get(rid)
        if rec is None:
            raise InvalidInputError(f"restore {rid!r} is unknown (settled already, or never begun)")
        if states and rec.state not in states:
            raise InvalidInputError(f"restore {rid} of partition {rec.pid!r} is {rec.state}, not {' or '.join(states)}")
        return rec

    def _put_header(self, rid: str, rec: R.RestoreRecord, what: str) -> None:
        with wrap_errors(what, self._c.path), self._c.env.begin(write=True) as txn:
            txn.put(R.restore_key(rid), R.encode_restore(rec), db=self._c.db["restores"])
            lmdb_commit_point("controller_commit")
        self.active[rid] = rec

    # ------------------------------------------------------------------ port methods
    def begin_restore(self, pid: str, dump_dir: str, entries: Sequence[Tuple[str, int, Any, Sequence[str]]],
                      schema: Mapping[str, Tuple[int, int]], *, strict_dtypes: bool = True,
                      unit_room: Optional[Sequence[int]] = None) -> RestoreInfo:
        c = self._c
        check_name("partition_id", pid)
        rid0 = self.of_partition(pid)
        if rid0 is not None:
            raise self.info(rid0).pending_error(f"a new restore into partition {pid!r}")
        p = c.parts.get(pid)
        sch: Dict[str, Tuple[int, int]] = {}
        for f, kd in dict(schema).items():
            check_field_name(f)
            want = (int(kd[0]), int(kd[1]))
            if want[0] not in KIND_NAMES or (want[1] not in DTYPE_NAMES and want[1] != SCHEMA_MIXED):
                raise InvalidInputError(f"field {f!r}: unknown kind or dtype code {want}")
            have = p.schema.get(f) if p else None
            if strict_dtypes and want[1] == SCHEMA_MIXED and have != want:
                raise SchemaError(f"field {f!r} of the dump of partition {pid!r} holds {describe_kind_dtype(want)}; "
                                  f"this store has strict_schema=True (one dtype per field)")
            merged = _merged(have, want, strict_dtypes)
            if merged is None:
                raise _schema_clash(pid, f, have, want, "the dump holds")
            sch[f] = merged
        if len({r[0] for r in entries}) != len(entries):
            raise InvalidInputError("a key appears twice in the restore")
        try:
            tags = check_tags([r[2] for r in entries])
        except InvalidInputError as e:
            raise type(e)(f"restore tags: {e}") from None
        recs: List[R.RestoreRow] = []
        free = list(c.free)  # a heap
        next_g = c.next_gidx
        reserved: List[int] = []
        keys = p.keys if p else {}
        by_fields: Dict[Any, Tuple[str, ...]] = {}  # a row's field list -> its checked, sorted tuple
        row = R.RestoreRow
        for (key, src, _tag, fields), tag in zip(entries, tags):
            if type(key) is not str:
                if not isinstance(key, str):
                    raise InvalidInputError(f"restore keys must be str, got {type(key).__name__}")
            fk = tuple(fields)
            fs = by_fields.get(fk)
            if fs is None:
                fs = tuple(sorted(set(fk)))
                bad = [f for f in fs if f not in sch]
                if bad:
                    raise InvalidInputError(f"key {key!r}: fields {bad[:5]} are not in the restore's schema")
                by_fields[fk] = fs
            g = keys.get(key)
            is_new = g is None
            if is_new:
                if len(key) > 127 or not key.isascii() or "\0" in key:  # shorter ASCII keys always fit
                    check_key(pid, key)
                if free:
                    g = heapq.heappop(free)
                else:
                    g, next_g = next_g, next_g + 1
                reserved.append(g)
            recs.append(row(key, src if type(src) is int else int(src), g, tag, fs, is_new))
        if unit_room is not None:
            _check_room(p, recs, c.num_units, unit_room)
        if (p.next_seq if p else c.seq_floor) + len(reserved) > R.SEQ_LIMIT:
            raise R.seq_exhausted(f"a load of {len(reserved)} new keys into partition {pid!r}")
        texts = R.restore_tag_texts(tags)  # (the rows chunks' and, at finish, the rows' tag values)
        rid = uuid.uuid4().hex
        tag_no = self.last_tag + 1
        n = c.num_units
        rec = R.RestoreRecord(tag_no, pid, str(dump_dir), "running", ("pending",) * n, (0,) * n, tuple(reserved),
                              {f: k for f, k in sch.items() if not (p and p.schema.get(f) == k)}, len(recs), time.time(),
                              (c.next_gidx, max(next_g, c.next_gidx)))
        m = c.db
        with wrap_errors("begin restore", c.path), c.env.begin(write=True) as txn:
            txn.put(R.META_RESTORE_TAG, R.encode_decimal(tag_no), db=m["meta"])
            for g in reserved:
                if g < c.next_gidx:
                    txn.delete(R.gidx_key(g), db=m["free"])
            txn.put(R.META_NEXT_GIDX, R.encode_decimal(max(next_g, c.next_gidx)), db=m["meta"])
            txn.put(R.restore_key(rid), R.encode_restore(rec), db=m["restores"])
            step = R.RESTORE_CHUNK_ROWS
            for i in range(0, len(recs), step):
                txn.put(R.restore_chunk_key(rid, i // step),
                        R.encode_restore_rows(recs[i:i + step], texts[i:i + step]), db=m["restores"])
            lmdb_commit_point("controller_commit")
        self.last_tag = tag_no
        taken = set(reserved)
        c.free = [g for g in c.free if g not in taken]
        heapq.heapify(c.free)
        c.next_gidx = max(next_g, c.next_gidx)
        self.active[rid] = rec
        self._index(rid, rec, recs)
        self.tag_texts[rid] = texts
        return self.info(rid, rows=True)

    def claim_restore(self, rid: str, unit: int) -> int:
        rec = self._get(rid, "running")
        u = self._unit(rec, unit)
        if rec.units[u] == "complete":
            raise InvalidInputError(f"restore {rid}: unit {u} is complete already")
        units, attempts = list(rec.units), list(rec.attempts)
        units[u], attempts[u] = "claimed", attempts[u] + 1
        self._put_header(rid, rec._replace(units=tuple(units), attempts=tuple(attempts)), "claim restore")
        return attempts[u]

    def complete_restore(self, rid: str, unit: int, attempt: int) -> None:
        rec = self._get(rid, "running")
        u = self._unit(rec, unit)
        if rec.units[u] != "claimed" or rec.attempts[u] != attempt:
            raise InvalidInputError(f"restore {rid}: unit {u} is {rec.units[u]} (attempt {rec.attempts[u]}), "
                                    f"not claimed by attempt {attempt}")
        units = list(rec.units)
        units[u] = "complete"
        self._put_header(rid, rec._replace(units=tuple(units)), "complete restore")

    @staticmethod
    def _unit(rec: R.RestoreRecord, unit: int) -> int:
        if not isinstance(unit, int) or not 0 <= unit < len(rec.units):
            raise InvalidInputError(f"unit {unit!r} is not a unit of this store (0..{len(rec.units) - 1})")
        return unit

    def finish_restore(self, rid: str) -> None:
        c = self._c
        rec = self._get(rid, "running", "committed")
        if rec.state == "committed":
            return
        waiting = [u for u, s in enumerate(rec.units) if s != "complete"]
        if waiting:
            raise InvalidInputError(f"restore {rid}: units {waiting} are not complete")
        m = c.db
        p = c.parts.get(rec.pid) or Partition(rec.pid, c.new_partition_number(), c.gmap, next_seq=c.seq_floor)
        schema = {f: _merged(p.schema.get(f), kd, False) or kd for f, kd in rec.schema.items()}
        changed = {f: kd for f, kd in schema.items() if p.schema.get(f) != kd}
        new_bits = new_field_bits(p, changed)  # a field already in the partition keeps its bit
        rows = self.rows.get(rid, ())
        n = len(rows)
        g = np.fromiter(map(_GIDX, rows), np.int64, n)
        sl = p.slots(g) if n else np.zeros(0, np.int64)
        new = sl < 0
        old = np.flatnonzero(~new)
        old_fs = np.full(n, -1, np.int64)
        if len(old):
            old_fs[old] = p.s_fs[sl[old]]
        per_row = list(zip(old_fs.tolist(), map(_FIELDS, rows)))  # (old field set id or -1, restored fields)
        ids = {k: i for i, k in enumerate(dict.fromkeys(per_row))}
        aid = np.fromiter(map(ids.__getitem__, per_row), np.int64, n)
        after = [frozenset(f) | (p.fsets[o] if o >= 0 else frozenset()) for o, f in ids]
        bits = {**p.bits, **new_bits}
        mk = [sum(1 << bits[f] for f in fs) for fs in after]
        wide = max(mk, default=0) >= 1 << 64
        masks = np.asarray(mk, dtype=object if wide else np.uint64)[aid]
        seq0 = p.next_seq
        n_new = int(new.sum())
        seqs = np.zeros(n, np.int64)
        seqs[new] = np.arange(seq0, seq0 + n_new, dtype=np.int64)  # new rows in dump order
        keyed = np.ones(n, bool)
        if len(old):
            seqs[old] = p.s_seq[sl[old]]
            keyed[old] = [p.s_key[x] is not None for x in sl[old].tolist()]
        tags = list(map(_TAG, rows))
        texts = self.tag_texts.get(rid)  # (begun in this process: the tags as its rows chunks hold them)
        tag_values = R.tag_values(texts) if texts is not None and len(texts) == n else R.encode_tags(tags)
        values = R.encode_rows2(p.num, keyed, seqs, masks.tolist() if wide else masks, tag_values)
        new_pos = np.flatnonzero(new).tolist()
        new_keys = [rows[i].key for i in new_pos]
        g_new = g[new]
        with wrap_errors("finish restore", c.path), c.env.begin(write=True) as txn:
            txn.cursor(m["rows"]).putmulti(list(zip(R.gidx_keys(g), values)))
            if new_keys:
                pre = R.keys_key(rec.pid, "")
                txn.cursor(m["keys"]).putmulti(list(zip(map(pre.__add__, map(str.encode, new_keys)),
                                                        R.gidx_keys(g_new))))
            for f, (kind, dt) in changed.items():
                txn.put(R.schema_key(rec.pid, f), R.encode_schema(kind, dt, new_bits.get(f, p.bits.get(f))),
                        db=m["schema"])
            txn.put(R.parts_key(rec.pid), R.encode_partition(seq0 + n_new, p.meta, p.num), db=m["parts"])
            for k in self._chunk_keys(rid):
                txn.delete(k, db=m["restores"])
            done = rec._replace(state="committed")
            txn.put(R.restore_key(rid), R.encode_restore(done), db=m["restores"])
            lmdb_commit_point("controller_commit")
        # committed: the mirror (schema first: every produced field needs its bit)
        if p.pid not in c.parts:
            c.add_partition(p)
        for f, (kind, dt) in changed.items():
            p.add_field(f, kind, dt, new_bits.get(f, p.bits.get(f)))
        fid = np.asarray([p.fs_id(fs) for fs in after], np.int32)[aid] if n else np.zeros(0, np.int32)
        if len(old):
            p.s_fs[sl[old]] = fid[old]
        for gi, t in zip(g.tolist(), tags):
            if t is None:
                p.tags.pop(gi, None)
            else:
                p.tags[gi] = t
        if new_keys:
            p.append(g_new, seqs[new], fid[new], new_keys)
            p.keys.update(zip(new_keys, g_new.tolist()))
        p.next_seq = seq0 + n_new
        p.ready.clear()  # (rebuilt on the next fetch)
        self.active[rid] = done
        self.rows[rid] = []
        self.tag_texts.pop(rid, None)

    def cancel_restore(self, rid: str) -> None:
        rec = self._get(rid, "running", "cancelled")
        if rec.state == "running":
            self._put_header(rid, rec._replace(state="cancelled"), "cancel restore")

    def forget_restore(self, rid: str) -> None:
        c = self._c
        rec = self.active.get(rid)
        if rec is None:
            return
        if rec.state == "running":
            raise InvalidInputError(f"restore {rid} is running: finish or cancel it first")
        part = c.gmap.part  # gidx -> partition number, -1: no row
        freed = [g for g in rec.reserved if not (g < len(part) and part[g] >= 0)] if rec.state == "cancelled" else []
        before, after = rec.next_gidx
        lower = freed and c.next_gidx == after and before < after  # nothing allocated past them since
        if lower:  # the allocator exactly as before the restore
            freed = [g for g in freed if g < before]
        with wrap_errors("forget restore", c.path), c.env.begin(write=True) as txn:
            for k in self._chunk_keys(rid):
                txn.delete(k, db=c.db["restores"])
            txn.delete(R.restore_key(rid), db=c.db["restores"])
            for g in freed:
                txn.put(R.gidx_key(g), b"", db=c.db["free"])
            if lower:
                txn.put(R.META_NEXT_GIDX, R.encode_decimal(before), db=c.db["meta"])
            lmdb_commit_point("controller_commit")
        self._unindex(rid)
        for g in freed:
            heapq.heappush(c.free, g)
        if lower:
            c.next_gidx = before

    def restores(self, pid: Optional[str] = None) -> List[RestoreInfo]:
        return [self.info(rid) for rid, rec in sorted(self.active.items(), key=lambda kv: kv[1].tag)
                if pid is None or rec.pid == pid]

    def restore(self, rid: str) -> Optional[RestoreInfo]:
        return self.info(rid, rows=True) if rid in self.active else None


def install_restore_calls(cls: type, locked) -> None:
    """Give the controller class ``cls`` the port methods of :data:`RESTORE_CALLS`, each
    delegating to its RestoreHost (``self._restores``) under ``locked`` (its lock)."""
    def make(name: str):
        return locked(functools.wraps(getattr(RestoreHost, name))(
            lambda self, *a, **k: getattr(self._restores, name)(*a, **k)))

    for name in RESTORE_CALLS:
        setattr(cls, name, make(name))


__all__ = ["RestoreHost", "RESTORE_CALLS", "install_restore_calls"]
