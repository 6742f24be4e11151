"""The controller's side of a selective dump: the dumped rows' metadata at a snapshot
(:meth:`Controller.snapshot_rows`), read from the snapshot's read transaction, never from
the in-memory mirror (which has moved on since the cut).  Values out: a
:class:`~tqstore.ports.RowBatch`.
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ._format import controller_records as R
from ._format.records import RecordError
from .controller_decode import read_row, schema_entries
from .errors import CorruptionError
from .ports import RowBatch


def rows_at(txn, dbs: Mapping[str, Any], pid: str, keys: Sequence[str], *, path: str) -> Optional[RowBatch]:
    """Schema and rows of ``keys`` of ``pid`` in read transaction ``txn`` (a key that is not
    a row there: ``seqs[i] is None``); None when the partition does not exist there.

    Raises CorruptionError (a malformed entry; names ``path``)."""
    try:
        if txn.get(R.parts_key(pid), db=dbs["parts"]) is None:
            return None
        schema: Dict[str, Tuple[int, int]] = {f: R.decode_schema(v) for f, v in schema_entries(txn, dbs, pid)}
        cols: List[List[Any]] = [[], [], [], [], []]
        cache: Dict[str, Any] = {}  # the partition's number and bits, read once (read_row)
        for key in keys:
            raw = txn.get(R.keys_key(pid, key), db=dbs["keys"])
            row = None
            if raw is not None:
                g = R.decode_gidx_key(raw)
                row = read_row(txn, dbs, pid, g, key, cache=cache)  # either format
                if row is None:
                    raise RecordError(f"key {key[:40]!r} names global index {g}, which is no row")
                if row.pid != pid or row.key != key:
                    raise RecordError(f"key {key[:40]!r} names a row of another key or partition")
            for col, val in zip(cols, (None, key, None, None, None) if row is None else
                                (row.gidx, row.key, row.tag, row.fields, row.seq)):
                col.append(val)
    except (RecordError, UnicodeDecodeError) as e:
        raise CorruptionError(f"controller index: malformed entry read for a dump: {e}", path=path) from e
    return RowBatch(pid, schema, *cols)

