"""The controller's side of a selective dump: the dumped rows' metadata at a snapshot
(:meth:`Controller.snapshot_rows`), read from the snapshot's read transaction, never from
the in-memory mirror (which has moved on since the cut).  Values out: a
:class:`~tqstore.ports.RowBatch`.
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ._format import controller_records as R
from ._format.records import RecordError, is_uint
from ._format.values import loads as _loads
from .controller_mirror import Row
from .errors import CorruptionError
from .ports import RowBatch


def rows_at(txn, dbs: Mapping[str, Any], pid: str, keys: Sequence[str], *, path: str) -> Optional[RowBatch]:
    """Schema and rows of ``keys`` of ``pid`` in read transaction ``txn`` (a key that is not
    a row there: ``seqs[i] is None``); None when the partition does not exist there.

    Raises CorruptionError (a malformed entry; names ``path``)."""
    try:
        if txn.get(R.parts_key(pid), db=dbs["parts"]) is None:
            return None
        schema: Dict[str, Tuple[int, int]] = {}
        head = (pid + "\0").encode()
        cur = txn.cursor(db=dbs["schema"])
        if cur.set_range(head):
            for k, v in cur:
                k = bytes(k)
                if not k.startswith(head):
                    break
                schema[R.decode_schema_key(k)[1]] = R.decode_schema(v)
        found: List[Tuple[int, bytes]] = []
        for key in keys:
            raw = txn.get(R.keys_key(pid, key), db=dbs["keys"])
            if raw is None:
                found.append((-1, b""))
                continue
            g = R.decode_gidx_key(raw)
            v = txn.get(R.gidx_key(g), db=dbs["rows"])
            if v is None:
                raise RecordError(f"key {key[:40]!r} names global index {g}, which is no row")
            found.append((g, bytes(v)))
        rows = _decode_rows([v for g, v in found if g >= 0])
        cols: List[List[Any]] = [[], [], [], [], []]
        it = iter(rows)
        for key, (g, _v) in zip(keys, found):
            row = None if g < 0 else Row(g, *next(it))
            if row is not None and (row.pid != pid or row.key != key):
                raise RecordError(f"key {key[:40]!r} names a row of another key or partition")
            for col, val in zip(cols, (None, key, None, None, None) if row is None else
                                (row.gidx, row.key, row.tag, row.fields, row.seq)):
                col.append(val)
    except (RecordError, UnicodeDecodeError) as e:
        raise CorruptionError(f"controller index: malformed entry read for a dump: {e}", path=path) from e
    return RowBatch(pid, schema, *cols)


def _decode_rows(raws: List[bytes]) -> List[Tuple[str, Any, Any, frozenset, int]]:
    """``(pid, key, tag, fields, seq)`` of each ``rows`` value: one JSON parse of them all (a
    dump reads thousands), each checked as :func:`controller_records.decode_row` checks one;
    a parse that fails is redone row by row, so the bad one is named.  Raises RecordError."""
    try:
        docs = _loads(b"[" + b",".join(raws) + b"]") if raws else []
    except (ValueError, UnicodeDecodeError, RecursionError):
        return [_one(R.decode_row(v)) for v in raws]
    out = []
    for d in docs:
        if not isinstance(d, dict) or not {"p", "k", "t", "f", "s"} <= d.keys():
            raise RecordError("row: not an object with members p, k, t, f, s")
        p, k, f, q = d["p"], d["k"], d["f"], d["s"]
        if type(p) is not str or not (k is None or type(k) is str) or type(f) is not list \
                or not is_uint(q) or not all(type(x) is str for x in f):
            raise RecordError("row members of the wrong type")
        out.append((p, k, d["t"], frozenset(f), q))
    return out


def _one(r: R.RowRecord) -> Tuple[str, Any, Any, frozenset, int]:
    return r.pid, r.key, r.tag, frozenset(r.fields), r.seq
