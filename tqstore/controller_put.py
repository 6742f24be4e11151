"""The controller's put, in bulk: validate and plan (nothing committed), then commit one LMDB
transaction with every row value encoded together, then update the columnar mirror.

Functions of :class:`~tqstore.controller.Controller` (its lock held by the caller): see
``Controller.plan_put`` / ``Controller.commit_put`` for the guarantees.  Per row, a put costs
a dict lookup of its key and a slice of one encoded buffer; no Python object per row.
"""
from __future__ import annotations

import heapq
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ._format import controller_records as R
from ._format.columns import Column, schema_changes
from ._format.names import check_key, check_name, max_key_bytes
from ._format.values import check_value
from ._io.lmdbenv import lmdb_commit_point, put_items
from .controller_mirror import Partition, PutPlan
from .errors import InvalidInputError, KeyNotFoundError, PartitionNotFoundError

_I64 = np.int64


def check_keys(pid: str, keys: Sequence[Any]) -> None:
    """Every key a str of ``pid`` (:func:`~tqstore._format.names.check_key`), checked together.

    Raises:
        InvalidInputError: the first bad key, as check_key says it.
    """
    if set(map(type, keys)) - {str}:  # (C speed for the usual batch of str keys)
        for k in keys:
            if not isinstance(k, str):
                raise InvalidInputError(f"keys must be str, got {type(k).__name__} {k!r}")
    joined = "\0".join(keys)
    limit = max_key_bytes(pid)
    if joined.count("\0") == len(keys) - 1 and joined.isascii() and max(map(len, keys), default=0) <= limit:
        return
    for k in keys:
        check_key(pid, k)


def plan_put(c, pid: str, columns: Sequence[Column], keys, gidxs, n_new: int, tags, create_keys: bool,
             strict_dtypes: bool = True) -> PutPlan:
    check_name("partition_id", pid)
    p: Optional[Partition] = c.parts.get(pid)
    if keys is not None:
        keys = list(keys)
        n = len(keys)
        try:
            dup = len(set(keys)) != n
        except TypeError:  # an unhashable key
            dup = False
        if dup:
            seen, dups = set(), []
            for k in keys:
                if k in seen:
                    dups.append(k)
                seen.add(k)
            raise InvalidInputError(f"duplicate keys in one call: {dups[:5]!r}")
        bad = [k for k in keys if not isinstance(k, str)] if set(map(type, keys)) - {str} else None
        if bad:
            bad = bad[0]
            raise InvalidInputError(f"keys must be str, got {type(bad).__name__} {bad!r}")
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
            tags = [check_value(t, tag=True) for t in tags]
        except InvalidInputError as e:  # UnsupportedTypeError included
            raise type(e)(f"tags: {e}") from None
    for col in columns:
        if len(col.payloads) != n:
            raise InvalidInputError(f"field {col.field!r} has {len(col.payloads)} rows, expected {n}")
    schema_new = schema_changes(pid, p.schema if p is not None else {}, columns, strict=strict_dtypes)
    fields = [col.field for col in columns]
    if len(set(fields)) != len(fields):
        raise InvalidInputError("a field appears twice in one batch")
    c._restores.check_put(pid, keys, gidxs, {col.field: (col.kind, col.dtype) for col in columns},
                          strict_dtypes=strict_dtypes)
    seq0 = p.next_seq if p is not None else c.seq_floor
    if seq0 + n > R.SEQ_LIMIT:  # (n: at most the new rows' count)
        raise R.seq_exhausted(f"a put of {n} rows into partition {pid!r}")
    existing: List[int] = []
    new_keys: List[Optional[str]] = []
    if keys is not None:
        found = list(map(p.keys.get, keys)) if p is not None and p.keys else [None] * n
        n_missing = found.count(None)
        new_pos = range(n) if n_missing == n else [i for i, g in enumerate(found) if g is None]
        if new_pos:
            if not create_keys:
                raise KeyNotFoundError(f"key {keys[new_pos[0]]!r} not in partition {pid!r}")
            check_keys(pid, keys if len(new_pos) == n else [keys[i] for i in new_pos])
        existing = [g for g in found if g is not None] if len(new_pos) != n else []
        new_g, from_free = _alloc(c, len(new_pos))
        if n_missing == n:
            found = list(new_g)
        else:
            for i, g in zip(new_pos, new_g):
                found[i] = g
        out = found
        new_keys = keys if len(new_pos) == n else [keys[i] for i in new_pos]
    elif gidxs is not None:
        if p is None:
            raise PartitionNotFoundError(f"partition {pid!r} does not exist")
        out = [int(g) for g in gidxs]
        sl = p.slots(out)
        if len(sl) and int(sl.min()) < 0:
            raise KeyNotFoundError(f"global index {out[int(np.argmax(sl < 0))]} is not a row of partition {pid!r}")
        existing = out
        new_g, from_free = [], 0
    else:
        new_g, from_free = _alloc(c, n)
        out = list(new_g)
        new_keys = [None] * n
    overwrites = False
    if existing and fields:
        f = frozenset(fields)
        overwrites = any(p.fsets[i] & f for i in np.unique(p.s_fs[p.slots(existing)]).tolist())
    return PutPlan(pid, out, new_g, new_keys, seq0, tags, fields, schema_new, overwrites, p is None, from_free)


def _alloc(c, m: int) -> Tuple[List[int], int]:
    """``m`` fresh global indexes: the smallest free ones first, then from ``next_gidx``."""
    k = min(m, len(c.free))
    taken = heapq.nsmallest(k, c.free) if k else []
    return taken + list(range(c.next_gidx, c.next_gidx + m - k)), k


def new_field_bits(p: Partition, schema: Dict[str, Tuple[int, int]]) -> Dict[str, int]:
    """Bits for the fields of ``schema`` (entries a transaction adds or changes) that ``p`` has
    none for yet: one above the largest bit of ``p`` on, in ``schema``'s order.  A field whose
    entry changes (a dtype turned mixed) keeps its bit."""
    nb = max(p.bits.values(), default=-1) + 1
    out: Dict[str, int] = {}
    for f in schema:
        if f not in p.bits:
            out[f] = nb
            nb += 1
    return out


def commit_put(c, plan: PutPlan, token: Optional[int]) -> None:
    m = c.db
    p = c.parts.get(plan.pid)
    if p is None:
        p = Partition(plan.pid, c.new_partition_number(), c.gmap, next_seq=c.seq_floor)
    F = frozenset(plan.fields)
    bits = dict(p.bits)
    new_bits = new_field_bits(p, plan.schema_new)
    bits.update(new_bits)

    def mask(fs) -> int:
        return sum(1 << bits[f] for f in fs)

    g_all = np.asarray(plan.gidxs, dtype=_I64)
    n = len(g_all)
    n_new = len(plan.new_gidxs)
    is_new = np.zeros(n, dtype=bool)
    if n_new:
        is_new = np.isin(g_all, np.asarray(plan.new_gidxs, dtype=_I64)) if n_new != n else np.ones(n, dtype=bool)
    old_pos = np.flatnonzero(~is_new)
    old_sl = p.slots(g_all[old_pos]) if len(old_pos) else np.zeros(0, dtype=_I64)
    old_fs = p.s_fs[old_sl] if len(old_sl) else np.zeros(0, dtype=np.int32)
    after = {i: p.fsets[i] | F for i in np.unique(old_fs).tolist()}  # old field set id -> new field set
    keyed = np.zeros(n, dtype=bool)
    seqs = np.zeros(n, dtype=_I64)
    new_pos = np.flatnonzero(is_new) if n_new != n else slice(None)
    mk_of = {i: mask(fs) for i, fs in after.items()}
    mk_new = mask(F)
    wide = max([mk_new, *mk_of.values()]) >= 1 << 64
    masks = np.zeros(n, dtype=object if wide else np.uint64)
    if n_new:
        masks[new_pos] = mk_new
        unkeyed = plan.new_keys.count(None)
        keyed[new_pos] = True if not unkeyed else False if unkeyed == n_new else [k is not None for k in plan.new_keys]
        seqs[new_pos] = np.arange(plan.seq0, plan.seq0 + n_new, dtype=_I64)
    if len(old_pos):
        lut = np.zeros(max(mk_of) + 1, dtype=object if wide else np.uint64)
        for i, m_ in mk_of.items():
            lut[i] = m_
        masks[old_pos] = lut[old_fs]
        keyed[old_pos] = [p.s_key[s] is not None for s in old_sl.tolist()]
        seqs[old_pos] = p.s_seq[old_sl]
    masks = masks.tolist() if wide else masks
    if plan.tags is not None:
        tag_json: Optional[List[Optional[bytes]]] = [R.encode_tag(t) for t in plan.tags]
    elif p.tags and len(old_pos):
        tags = p.tags
        tag_json = [R.encode_tag(tags.get(g)) for g in plan.gidxs]
        if not any(t is not None for t in tag_json):
            tag_json = None
    else:
        tag_json = None
    values = R.encode_rows2(p.num, keyed, seqs, masks, tag_json)
    next_after = max(c.next_gidx, max(plan.new_gidxs) + 1) if n_new else c.next_gidx
    next_seq = plan.seq0 + n_new if n_new else p.next_seq
    with c.env.begin(write=True) as txn:
        # a put of only new rows: fresh gidxs from next_gidx, ascending, appended at the table's end
        put_items(txn.cursor(m["rows"]), list(zip(R.gidx_keys(g_all), values)), ascending=n_new == n)
        if n_new:
            pre = R.keys_key(plan.pid, "")
            gks = R.gidx_keys(np.asarray(plan.new_gidxs, dtype=_I64))
            if None not in plan.new_keys:  # every new row keyed (a KV put): C-level maps
                keyed_new = list(zip(map(pre.__add__, map(str.encode, plan.new_keys)), gks))
            else:
                keyed_new = [(pre + k.encode(), gk) for k, gk in zip(plan.new_keys, gks) if k is not None]
            if keyed_new:
                txn.cursor(m["keys"]).putmulti(keyed_new)
        for g in plan.new_gidxs[:plan.from_free]:
            txn.delete(R.gidx_key(g), db=m["free"])
        txn.put(R.META_NEXT_GIDX, R.encode_decimal(next_after), db=m["meta"])
        if token is not None:
            txn.put(R.META_PUT_TOKEN, R.encode_decimal(token), db=m["meta"])
        for f, (kind, dt) in plan.schema_new.items():
            txn.put(R.schema_key(plan.pid, f), R.encode_schema(kind, dt, bits[f]), db=m["schema"])
        txn.put(R.parts_key(plan.pid), R.encode_partition(next_seq, p.meta, p.num), db=m["parts"])
        lmdb_commit_point("controller_commit")
    # committed: update the mirror
    _apply(c, p, plan, new_bits, F, is_new, old_pos, old_sl, old_fs, after, seqs, next_seq, next_after, token)


def _apply(c, p: Partition, plan: PutPlan, new_bits, F, is_new, old_pos, old_sl, old_fs, after, seqs, next_seq,
           next_after, token) -> None:
    """Update the mirror after the commit of ``plan`` (see :func:`commit_put`)."""
    if plan.pid not in c.parts:
        c.add_partition(p)
    for f, (kind, dt) in plan.schema_new.items():
        p.add_field(f, kind, dt, new_bits.get(f, p.bits.get(f)))
    views = [(c.consumed.get((plan.pid, t), ()), list(vs.items())) for t, vs in p.ready.items() if vs]
    old_ready = []
    if views and len(old_pos):
        old_ready = [(g, int(q), p.fsets[f]) for g, q, f in
                     zip(np.asarray(plan.gidxs, dtype=_I64)[old_pos].tolist(), p.s_seq[old_sl].tolist(),
                         old_fs.tolist())]
    if len(old_pos):
        lut = {i: p.fs_id(fs) for i, fs in after.items()}
        p.s_fs[old_sl] = np.asarray([lut[f] for f in old_fs.tolist()], dtype=np.int32)
    if plan.new_gidxs:
        fid = p.fs_id(F)
        ng = np.asarray(plan.new_gidxs, dtype=_I64)
        p.append(ng, np.arange(plan.seq0, plan.seq0 + len(ng), dtype=_I64), np.full(len(ng), fid, dtype=np.int32),
                 list(plan.new_keys))
        unkeyed = plan.new_keys.count(None)
        if not unkeyed:
            p.keys.update(zip(plan.new_keys, plan.new_gidxs))
        elif unkeyed != len(plan.new_keys):
            p.keys.update((k, g) for k, g in zip(plan.new_keys, plan.new_gidxs) if k is not None)
    if plan.tags is not None:
        for g, t in zip(plan.gidxs, plan.tags):
            if t is None:
                p.tags.pop(g, None)
            else:
                p.tags[g] = t
    if views:  # rows that became ready for a (task, need) view, in put order
        olds = {g: (q, fs) for g, q, fs in old_ready}
        for g, new in zip(plan.gidxs, is_new.tolist()):
            if new:
                q, before, now = None, None, F
            else:
                q, before = olds[g]
                now = before | F
                if len(now) == len(before):
                    continue
            if q is None:
                q = int(p.s_seq[int(p.gmap.slot[g])])
            for done, vs in views:
                if g in done:
                    continue
                for need, v in vs:
                    if need <= now and (before is None or not need <= before):
                        v.add(g, q)
    p.next_seq = next_seq
    for _ in range(plan.from_free):
        heapq.heappop(c.free)
    c.next_gidx = next_after
    if token is not None:
        c.put_token = token


# ---------------------------------------------------------------------------- rows written whole
def write_rows(txn, c, p: Partition, rows: Sequence[Any], bits: Optional[Dict[str, int]] = None) -> None:
    """Put the version-2 values of ``rows`` (:class:`~tqstore.controller_mirror.Row` objects of
    ``p``: gidx, key, tag, fields, seq) into write transaction ``txn``, with the ``keys``
    entries of those not yet rows of ``p``.  ``bits``: field -> bit, for fields whose schema
    entry this transaction adds (default: ``p.bits``).  The mirror is not touched: call
    :func:`mirror_rows` after the commit."""
    b = p.bits if bits is None else {**p.bits, **bits}
    vals = [R.encode_row2(p.num, r.key is not None, r.seq, sum(1 << b[f] for f in r.fields), R.encode_tag(r.tag))
            for r in rows]
    txn.cursor(c.db["rows"]).putmulti([(R.gidx_key(r.gidx), v) for r, v in zip(rows, vals)])
    new = [(R.keys_key(p.pid, r.key), R.gidx_key(r.gidx)) for r in rows if r.key is not None and not p.has(r.gidx)]
    if new:
        txn.cursor(c.db["keys"]).putmulti(new)


def mirror_rows(c, p: Partition, rows: Sequence[Any]) -> None:
    """Install committed ``rows`` into the mirror: an existing row of ``p`` takes the row's
    fields and tag (its key and seq stay), a new one is appended (new rows in seq order, after
    every existing one).  Ready views are dropped (rebuilt on the next fetch)."""
    if p.pid not in c.parts:
        c.add_partition(p)
    new = [r for r in rows if not p.has(r.gidx)]
    for r in rows:
        if p.has(r.gidx):
            p.s_fs[int(p.gmap.slot[r.gidx])] = p.fs_id(frozenset(r.fields))
        if r.tag is None:
            p.tags.pop(r.gidx, None)
        else:
            p.tags[r.gidx] = r.tag
    if new:
        p.append(np.asarray([r.gidx for r in new], dtype=_I64), np.asarray([r.seq for r in new], dtype=_I64),
                 np.asarray([p.fs_id(frozenset(r.fields)) for r in new], dtype=np.int32), [r.key for r in new])
        p.keys.update((r.key, r.gidx) for r in new if r.key is not None)
        p.next_seq = max(p.next_seq, max(r.seq for r in new) + 1)
    p.ready.clear()
