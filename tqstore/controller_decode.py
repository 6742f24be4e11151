"""Decoding the controller's LMDB index: every entry checked, one function for the store's
open and for checkpoint verification (docs/FORMAT.md, "Controller index").

A malformed entry — wrong type, bad UTF-8, an index outside the allocator, a key claimed
twice, a schema of an unknown kind or dtype — raises :class:`~tqstore.errors.CorruptionError`
naming ``data.mdb`` and the entry, never a bare ``ValueError`` or ``KeyError``.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Set, Tuple

from ._format import controller_records as R
from ._format.controller_records import CONTROLLER_DBS, CONTROLLER_FORMAT  # noqa: F401 - re-exported
from ._format.records import RecordError
from .controller_mirror import Partition, Row
from .errors import CorruptionError, FormatVersionError


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
        fmt = R.decode_decimal(txn.get(R.META_FORMAT, db=meta))
        if fmt != CONTROLLER_FORMAT:
            raise FormatVersionError(f"controller index format {fmt} is not supported (reads {CONTROLLER_FORMAT})",
                                     path=file)
        where = "meta/num_units"
        num_units = R.decode_decimal(txn.get(R.META_NUM_UNITS, db=meta), 1)
        where = "meta/next_gidx"
        next_gidx = R.decode_decimal(txn.get(R.META_NEXT_GIDX, db=meta))
        where = "meta/put_token"
        put_token = R.decode_optional_decimal(txn.get(R.META_PUT_TOKEN, db=meta))
        free: List[int] = []
        for k in txn.cursor(dbs["free"]).iternext(values=False):
            where = ("free", bytes(k))
            g = R.decode_gidx_key(k)
            if g >= next_gidx:
                raise RecordError(f"not a global index below next_gidx {next_gidx}")
            free.append(g)
        free.sort()
        parts: Dict[str, Partition] = {}
        for k, v in txn.cursor(dbs["parts"]):
            where = ("parts", bytes(k))
            pid = R.decode_parts_key(k)
            seq, pmeta = R.decode_partition(v)
            parts[pid] = Partition(pid, next_seq=seq, meta=pmeta)
        loaded = []
        for k, v in txn.cursor(dbs["rows"]):
            where = ("rows", bytes(k))
            g = R.decode_gidx_key(k)
            if g >= next_gidx:
                raise RecordError(f"not a global index below next_gidx {next_gidx}")
            r = Row.unpack(g, v)
            if r.pid not in parts:
                raise RecordError(f"row of partition {r.pid[:40]!r}, which has no parts entry")
            loaded.append(r)
        loaded.sort(key=lambda r: r.seq)  # Partition.rows is kept in seq order
        rows: Dict[int, Row] = {}
        for r in loaded:
            where = ("rows", R.gidx_key(r.gidx))
            rows[r.gidx] = r
            p = parts[r.pid]
            p.rows[r.gidx] = r
            if r.key is not None:
                if r.key in p.keys:
                    raise RecordError(f"key {r.key[:40]!r} of partition {r.pid[:40]!r} is claimed by two rows")
                p.keys[r.key] = r.gidx
        if len(free) + len(rows) > next_gidx or not rows.keys().isdisjoint(free):
            where = "free"
            raise RecordError("a global index is both free and a row")
        for k, v in txn.cursor(dbs["schema"]):
            where = ("schema", bytes(k))
            pid, f = R.decode_schema_key(k)
            kind, dt = R.decode_schema(v)
            if pid not in parts:
                raise RecordError(f"schema of partition {pid[:40]!r}, which has no parts entry")
            parts[pid].schema[f] = (kind, dt)
        consumed: Dict[Tuple[str, str], Set[int]] = defaultdict(set)
        for k in txn.cursor(dbs["cons"]).iternext(values=False):
            k = bytes(k)
            where = ("cons", k)
            task, pid, g = R.decode_cons_key(k)
            consumed[(pid, task)].add(g)
        for k, v in txn.cursor(dbs["sampler"]):
            where = ("sampler", bytes(k))
            R.decode_parts_key(k)
            R.decode_sampler(v)
    except CorruptionError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError, RecursionError) as e:
        if isinstance(where, tuple):
            where = f"{where[0]} entry {where[1][:40]!r}"
        raise CorruptionError(f"controller index: malformed {where}: {type(e).__name__}: {e} (damaged metadata: "
                              f"load the last good checkpoint into a new store)", path=file) from e
    return ControllerState(num_units, next_gidx, put_token, free, parts, rows, consumed)
