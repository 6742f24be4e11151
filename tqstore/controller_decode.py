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

from ._format.columns import KIND_NAMES
from ._format.dtypes import DTYPE_NAMES
from ._format.values import loads as _loads_value
from .controller_mirror import Partition, Row
from .errors import CorruptionError, FormatVersionError

CONTROLLER_FORMAT = 1


def _g(gidx: int) -> bytes:
    return gidx.to_bytes(8, "big")


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
