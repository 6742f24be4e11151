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
        found = dict(txn.cursor(db=dbs["keys"]).getmulti(kk)) if kk else {}
        graw = [found.get(k) for k in kk]
        gkeys = [g for g in graw if g is not None]
        vals = dict(txn.cursor(db=dbs["rows"]).getmulti(gkeys)) if gkeys else {}
        cache: Dict[str, Any] = {}
        cols = _bulk(txn, dbs, pid, keys, graw, vals, praw, entries, cache)
    except (RecordError, UnicodeDecodeError) as e:
        raise CorruptionError(f"controller index: malformed entry read for a dump: {e}", path=path) from e
    return RowBatch(pid, schema, *cols)


def _bulk(txn, dbs, pid: str, keys: Sequence[str], graw: List[Optional[bytes]], vals: Dict[bytes, bytes],
          praw: bytes, entries: List[Tuple[str, bytes]], cache: Dict[str, Any]) -> List[List[Any]]:
    """The five RowBatch columns (gidx, key, tag, fields, seq) of ``keys``."""
    n = len(keys)
    gidxs: List[Optional[int]] = [None] * n
    out_keys: List[Optional[str]] = list(keys)
    tags: List[Any] = [None] * n
    fields: List[Optional[frozenset]] = [None] * n
    seqs: List[Optional[int]] = [None] * n
    num: Optional[int] = None
    names: Optional[Dict[int, str]] = None
    by_mask: Dict[int, frozenset] = {}
    tagged: List[int] = []
    tag_raw: List[bytes] = []
    slow: List[int] = []
    from_bytes = int.from_bytes
    unpack = _HEAD.unpack_from
    for i, (key, gr) in enumerate(zip(keys, graw)):
        if gr is None:
            continue
        if len(gr) != R.GIDX_BYTES:
            R.decode_gidx_key(gr)  # raises the RecordError
        g = from_bytes(gr, "big")
        gidxs[i] = g
        v = vals.get(bytes(gr))
        if v is None:
            raise RecordError(f"key {key[:40]!r} names global index {g}, which is no row")
        if v[:1] == b"{" or len(v) < _HEAD_SIZE + 8:
            slow.append(i)
            continue
        part, flags, words, seq = unpack(v)
        end = _HEAD_SIZE + 8 * words
        if flags & ~R.ROW2_FLAGS or not flags & R.ROW2_KEYED or words != 1 or len(v) < end \
                or (not flags & R.ROW2_TAGGED and len(v) != end):
            slow.append(i)  # read_row decodes it or raises the precise error
            continue
        if num is None:
            num = R.decode_partition2(praw)[2]
            names = {R.decode_schema2(sv)[2]: f for f, sv in entries}
        if part != num:
            raise RecordError(f"key {key[:40]!r} names a row of another key or partition")
        mask = from_bytes(v[_HEAD_SIZE:end], "little")
        fs = by_mask.get(mask)
        if fs is None:
            fs = by_mask[mask] = _fields_of(mask, names, g)
        fields[i] = fs
        seqs[i] = seq
        if flags & R.ROW2_TAGGED:
            tagged.append(i)
            tag_raw.append(bytes(v[end:]))
    if tagged:
        decoded = loads_each(tag_raw)
        if decoded is None:  # one of them does not parse alone: the slow path names it
            slow.extend(tagged)
        else:
            for i, t in zip(tagged, decoded):
                tags[i] = t
    for i in sorted(set(slow)):
        key, g = keys[i], gidxs[i]
        row = read_row(txn, dbs, pid, g, key, cache=cache)  # either format
        if row is None:
            raise RecordError(f"key {key[:40]!r} names global index {g}, which is no row")
        if row.pid != pid or row.key != key:
            raise RecordError(f"key {key[:40]!r} names a row of another key or partition")
        tags[i], fields[i], seqs[i] = row.tag, row.fields, row.seq
    return [gidxs, out_keys, tags, fields, seqs]


def _fields_of(mask: int, names: Dict[int, str], g: int) -> frozenset:
    out = []
    for b in range(mask.bit_length()):
        if mask >> b & 1:
            if b not in names:
                raise RecordError(f"row {g}: produced-field bit {b} of no field")
            out.append(names[b])
    return frozenset(out)


