"""The controller's side of a selective dump: the dumped rows' metadata at a snapshot
(:meth:`Controller.snapshot_rows`), read from the snapshot's read transaction, never from
the in-memory mirror (which has moved on since the cut).  Values out: a
:class:`~tqstore.ports.RowBatch`.

Bulk path: the keys' entries and then the rows' values are fetched with one
``getmulti`` each; version-2 row values are decoded column-wise (their tags with one JSON
parse of all of them, a bitmap's field set computed once per distinct bitmap).  Every check
of :func:`~tqstore._format.controller_records.decode_row2` and
:func:`~tqstore.controller_decode.read_row` is made; a row the bulk path cannot take (a
version-1 value, or anything that does not check) goes through :func:`read_row`, which
decodes it on its own or raises the precise error.
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ._format import controller_records as R
from ._format.records import RecordError
from ._format.values import loads_each
from .controller_decode import read_row, schema_entries
from .errors import CorruptionError
from .ports import RowBatch

_HEAD = R.ROW2_HEAD
_HEAD_SIZE = R.ROW2_HEAD.size


def rows_at(txn, dbs: Mapping[str, Any], pid: str, keys: Sequence[str], *, path: str) -> Optional[RowBatch]:
    """Schema and rows of ``keys`` of ``pid`` in read transaction ``txn`` (a key that is not
    a row there: ``seqs[i] is None``); None when the partition does not exist there.

    Raises CorruptionError (a malformed entry; names ``path``)."""
    try:
        praw = txn.get(R.parts_key(pid), db=dbs["parts"])
        if praw is None:
            return None
        entries = schema_entries(txn, dbs, pid)
        schema: Dict[str, Tuple[int, int]] = {f: R.decode_schema(v) for f, v in entries}
        pre = pid.encode() + b"\0"
        kk = [pre + k.encode() for k in keys]
        graw = _get_each(txn.cursor(db=dbs["keys"]), kk)
        gkeys = [bytes(g) for g in graw if g is not None]
        vals = _get_each(txn.cursor(db=dbs["rows"]), gkeys)
        cache: Dict[str, Any] = {}
        cols = _bulk(txn, dbs, pid, keys, graw, vals, praw, entries, cache)
    except (RecordError, UnicodeDecodeError) as e:
        raise CorruptionError(f"controller index: malformed entry read for a dump: {e}", path=path) from e
    return RowBatch(pid, schema, *cols)


def _get_each(cur, keys: List[bytes]) -> List[Optional[bytes]]:
    """The value of each of ``keys`` (distinct), None where missing: one ``getmulti``."""
    if not keys:
        return []
    got = cur.getmulti(keys)  # (key, value) of every key found, in the order asked
    if len(got) == len(keys):
        return [v for _k, v in got]
    found = dict(got)
    return [found.get(k) for k in keys]


def _bulk(txn, dbs, pid: str, keys: Sequence[str], graw: List[Optional[bytes]], vals: List[Optional[bytes]],
          praw: bytes, entries: List[Tuple[str, bytes]], cache: Dict[str, Any]) -> List[List[Any]]:
    """The five RowBatch columns (gidx, key, tag, fields, seq) of ``keys`` (``graw``: each
    key's entry, None for none; ``vals``: the row value of each entry, in order): the
    version-2 values' heads parsed as one array, the rest (a version-1 value, anything that
    does not check) by :func:`read_row`."""
    n = len(keys)
    tags: List[Any] = [None] * n
    fields: List[Optional[frozenset]] = [None] * n
    seqs: List[Optional[int]] = [None] * n
    pos = [i for i, gr in enumerate(graw) if gr is not None]
    grs = [graw[i] for i in pos]
    gidxs: List[Optional[int]] = [None] * n
    for gr in grs:
        if len(gr) != R.GIDX_BYTES:
            R.decode_gidx_key(gr)  # raises the RecordError
    if not pos:
        return [gidxs, list(keys), tags, fields, seqs]
    gl = np.frombuffer(b"".join(grs), ">u8").tolist()
    for i, g in zip(pos, gl):
        gidxs[i] = g
    vs = vals
    if None in vs:
        j = vs.index(None)
        raise RecordError(f"key {keys[pos[j]][:40]!r} names global index {gl[j]}, which is no row")
    m = len(vs)
    lens = np.fromiter(map(len, vs), dtype=np.int64, count=m)
    blob = np.frombuffer(b"".join(vs), dtype=np.uint8)
    starts = np.cumsum(lens) - lens
    head = np.zeros(m, dtype=R.ROW2_DTYPE)  # (zeros: a row too short for a head stays flags 0, slow)
    long = np.flatnonzero(lens >= _HEAD_SIZE + 8)
    if len(long):
        grab = blob[starts[long, None] + np.arange(R.ROW2_DTYPE.itemsize)]
        head[long] = np.ascontiguousarray(grab).view(R.ROW2_DTYPE).reshape(-1)
    flags = head["flags"].astype(np.int64)
    tagged = (flags & R.ROW2_TAGGED) != 0
    fast = ((lens >= _HEAD_SIZE + 8) & ((flags & ~R.ROW2_FLAGS) == 0) & ((flags & R.ROW2_KEYED) != 0)
            & (head["words"] == 1) & (tagged | (lens == R.ROW2_DTYPE.itemsize)))
    if len(long):
        fast[long] &= blob[starts[long]] != ord("{")  # a version-1 value (JSON): read_row decodes it
    slow = [pos[j] for j in np.flatnonzero(~fast).tolist()]
    f_idx = np.flatnonzero(fast)
    if len(f_idx):
        num = R.decode_partition2(praw)[2]
        names = {R.decode_schema2(sv)[2]: f for f, sv in entries}
        other = f_idx[head["part"][f_idx] != num]
        if len(other):
            raise RecordError(f"key {keys[pos[int(other[0])]][:40]!r} names a row of another key or partition")
        masks, first, inverse = np.unique(head["mask"][f_idx], return_index=True, return_inverse=True)
        sets = [_fields_of(mk, names, gl[int(f_idx[j])]) for mk, j in zip(masks.tolist(), first.tolist())]
        for j, q, k in zip(f_idx.tolist(), head["seq"][f_idx].tolist(), inverse.reshape(-1).tolist()):
            i = pos[j]
            fields[i] = sets[k]
            seqs[i] = q
        t_idx = f_idx[tagged[f_idx]].tolist()
        if t_idx:
            cut = R.ROW2_DTYPE.itemsize
            decoded = loads_each([vs[j][cut:] for j in t_idx])
            if decoded is None:  # one of them does not parse alone: the slow path names it
                slow.extend(pos[j] for j in t_idx)
            else:
                for j, t in zip(t_idx, decoded):
                    tags[pos[j]] = t
    for i in sorted(set(slow)):
        key, g = keys[i], gidxs[i]
        row = read_row(txn, dbs, pid, g, key, cache=cache)  # either format
        if row is None:
            raise RecordError(f"key {key[:40]!r} names global index {g}, which is no row")
        if row.pid != pid or row.key != key:
            raise RecordError(f"key {key[:40]!r} names a row of another key or partition")
        tags[i], fields[i], seqs[i] = row.tag, row.fields, row.seq
    return [gidxs, list(keys), tags, fields, seqs]


def _fields_of(mask: int, names: Dict[int, str], g: int) -> frozenset:
    out = []
    for b in range(mask.bit_length()):
        if mask >> b & 1:
            if b not in names:
                raise RecordError(f"row {g}: produced-field bit {b} of no field")
            out.append(names[b])
    return frozenset(out)


