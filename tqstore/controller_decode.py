"""Decoding the controller's LMDB index: every entry checked, in bulk, one function for the
store's open and for checkpoint verification (docs/FORMAT.md, "Controller index").

Version 2 row values are fixed-width binary (a head and a bitmap; a tag only on tagged
rows): the untagged ones are decoded together as one numpy structured array, their keys
from the ``keys`` database by the native ``place_keys`` straight into their rows' slots
(each checked: its partition's prefix, UTF-8 without NUL, one key per row), and the cross-entry rules
(a row's partition exists, a bit names a field of its schema, each key names one keyed row
of its partition and each keyed row has one key, an index below the allocator and never
both free and a row) are checked with array operations.  Version 1 (JSON rows) is decoded
row by row into the same mirror.

A malformed entry — wrong type or length, bad UTF-8, an index outside the allocator, a key
claimed twice, a schema of an unknown kind or dtype — raises
:class:`~tqstore.errors.CorruptionError` naming ``data.mdb`` and the entry, never a bare
``ValueError`` or ``KeyError``.
"""
from __future__ import annotations

import gc
from collections import defaultdict
from dataclasses import dataclass
from bisect import bisect_left
from itertools import compress, islice
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Set, Tuple

import numpy as np

from ._format import controller_records as R
from ._format.controller_records import CONTROLLER_DBS, CONTROLLER_FORMAT  # noqa: F401 - re-exported
from ._format.lmdb_pages import Packed, packed_chunks
from ._format.records import RecordError
from ._format.values import loads_each
from ._io.heap import trim_heap
from ._native import place_keys
from .controller_sampler_store import check as check_sampler_record
from .controller_mirror import GidxMap, Partition
from .errors import CorruptionError, FormatVersionError

_ROW2 = R.ROW2_DTYPE
_FAST = _ROW2.itemsize  # an untagged row of partitions with at most 64 fields
def _tagged_rows(vs: List[bytes]) -> Optional[Tuple[np.ndarray, List[Any]]]:
    """Heads and tags of tagged one-word rows, checked in bulk: the heads as one array, each tag
    parsed on its own (:func:`~tqstore._format.values.loads_each`).  None
    when any row is not of that shape or does not check: the caller then decodes each row with
    :func:`R.decode_row2`, which accepts what it accepts and raises the precise error."""
    m = len(vs)
    heads = b"".join([v[:_FAST] for v in vs])
    lens = np.fromiter(map(len, vs), dtype=np.int64, count=m) - _FAST
    if len(heads) != m * _FAST or not (lens > 0).all():
        return None
    a = np.frombuffer(heads, dtype=_ROW2)
    if ((a["flags"] & np.uint16(R.ROW2_KEYED)) | np.uint16(R.ROW2_TAGGED) != a["flags"]).any() \
            or (a["words"] != 1).any() or (a["seq"] >= R.SEQ_LIMIT).any():
        return None
    tags = loads_each([v[_FAST:] for v in vs])
    return None if tags is None else (a, tags)


@dataclass
class ControllerState:
    """Everything :func:`decode_controller` read from a controller index."""

    num_units: int
    next_gidx: int
    put_token: int  # last committed overwriting put (0 when none)
    free: List[int]
    parts: Dict[str, Partition]
    gmap: GidxMap
    consumed: Dict[Tuple[str, str], Set[int]]
    format: int = CONTROLLER_FORMAT

    @property
    def rows(self):
        from .controller_mirror import RowsView

        return RowsView(list(self.parts.values()))


class _Where:
    """The entry being decoded, for the error message."""

    def __init__(self) -> None:
        self.at: Any = "meta/format"


def decode_controller(txn, dbs: Mapping[str, Any], path: Path, cols: Optional[Mapping[bytes, Any]] = None
                      ) -> ControllerState:
    """Decode and check every entry of the controller index at ``path`` in read transaction
    ``txn`` (``dbs``: its named databases, see :data:`CONTROLLER_DBS`; ``restores`` is not
    read, nor ``keys`` in version 1).  The one decoder of the store's open and of checkpoint
    verification.  ``cols``: the ``rows`` and ``keys`` entries as ``txn`` sees them, read in
    bulk (:func:`tqstore._io.lmdbenv.read_columns`), used instead of walking them.

    Raises:
        FormatVersionError: ``meta/format`` names a version this code does not read.
        CorruptionError: any entry is malformed (names ``data.mdb`` and the entry).
    """
    file = str(Path(path) / "data.mdb")
    w = _Where()
    collect = gc.isenabled()
    gc.disable()  # millions of short-lived tuples: no full collection of the heap per 700 of them
    try:
        st = _decode(txn, dbs, file, w, cols or {})
        del txn
        trim_heap()  # the decode's temporaries (as large as the mirror) leave the process
        return st
    except (CorruptionError, FormatVersionError):
        raise
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError, RecursionError, IndexError) as e:
        where = w.at
        if isinstance(where, tuple):
            where = f"{where[0]} entry {bytes(where[1])[:40]!r}"
        raise CorruptionError(f"controller index: malformed {where}: {type(e).__name__}: {e} (damaged metadata: "
                              f"load the last good checkpoint into a new store)", path=file) from e
    finally:
        if collect:
            gc.enable()


def _decode(txn, dbs, file: str, w: _Where, cols: Mapping[bytes, Any]) -> ControllerState:
    meta = dbs["meta"]
    fmt = R.decode_decimal(txn.get(R.META_FORMAT, db=meta))
    if fmt not in R.CONTROLLER_FORMATS_READ:
        raise FormatVersionError(f"controller index format {fmt} is not supported (reads "
                                 f"{', '.join(map(str, R.CONTROLLER_FORMATS_READ))})", path=file)
    w.at = "meta/num_units"
    num_units = R.decode_decimal(txn.get(R.META_NUM_UNITS, db=meta), 1)
    w.at = "meta/next_gidx"
    next_gidx = R.decode_decimal(txn.get(R.META_NEXT_GIDX, db=meta))
    w.at = "meta/put_token"
    put_token = R.decode_optional_decimal(txn.get(R.META_PUT_TOKEN, db=meta))
    free: List[int] = []
    for k in txn.cursor(dbs["free"]).iternext(values=False):
        w.at = ("free", k)
        g = R.decode_gidx_key(k)
        if g >= next_gidx:
            raise RecordError(f"not a global index below next_gidx {next_gidx}")
        free.append(g)
    free.sort()
    gmap = GidxMap()
    parts: Dict[str, Partition] = {}
    by_num: Dict[int, Partition] = {}
    v1_parts = []
    for k, v in txn.cursor(dbs["parts"]):
        w.at = ("parts", k)
        pid = R.decode_parts_key(k)
        seq, pmeta, num = R.decode_partition2(v)
        if (num is None) != (fmt == 1):
            raise RecordError(f"partition number {num!r} in a version-{fmt} index")
        if num is None:
            v1_parts.append(pid)
            num = -1
        elif num in by_num:
            raise RecordError(f"partition number {num} is also {by_num[num].pid[:40]!r}'s")
        parts[pid] = p = Partition(pid, num, gmap, next_seq=seq, meta=pmeta)
        by_num[num] = p
    for i, pid in enumerate(sorted(v1_parts)):  # version 1: numbered in id order
        parts[pid].num = i
        by_num[i] = parts[pid]
    v1_fields: Dict[str, List[Tuple[str, int, int]]] = defaultdict(list)
    for k, v in txn.cursor(dbs["schema"]):
        w.at = ("schema", k)
        pid, f = R.decode_schema_key(k)
        kind, dt, bit = R.decode_schema2(v)
        if pid not in parts:
            raise RecordError(f"schema of partition {pid[:40]!r}, which has no parts entry")
        if (bit is None) != (fmt == 1):
            raise RecordError(f"schema bit {bit!r} in a version-{fmt} index")
        if bit is None:
            v1_fields[pid].append((f, kind, dt))
        else:
            if bit in parts[pid].bits.values():
                raise RecordError(f"bit {bit} is also another field's")
            parts[pid].add_field(f, kind, dt, bit)
    for pid, fs in v1_fields.items():  # version 1: bits in field name order
        for f, kind, dt in sorted(fs):
            parts[pid].add_field(f, kind, dt)
    w.at = "rows"
    # indexes below next_gidx are rows, free, or reserved by a pending restore (recorded in ``restores``,
    # a few bytes each): bounds how large a damaged next_gidx can make the mirror
    slack = 1 << 20
    if dbs.get("restores") is not None:
        st = txn.stat(dbs["restores"])
        slack = (st["leaf_pages"] + st["overflow_pages"] + st["branch_pages"]) * st["psize"]
    n_rows = _rows_v1(txn, dbs, parts, by_num, next_gidx, w, len(free) + slack) if fmt == 1 else \
        _rows_v2(txn, dbs, parts, by_num, next_gidx, w, len(free) + slack, cols)
    w.at = "free"
    if free and (_part_of(gmap, free) >= 0).any():
        raise RecordError("a global index is both free and a row")
    if len(free) + n_rows > next_gidx:
        raise RecordError("more rows and free indexes than next_gidx")
    consumed: Dict[Tuple[str, str], Set[int]] = defaultdict(set)
    for k in txn.cursor(dbs["cons"]).iternext(values=False):
        w.at = ("cons", k)
        task, pid, g = R.decode_cons_key(bytes(k))
        consumed[(pid, task)].add(g)
    for k, v in txn.cursor(dbs["sampler"]):
        w.at = ("sampler", k)
        check_sampler_record(k, v)
    return ControllerState(num_units, next_gidx, put_token, free, parts, gmap, consumed, fmt)


def _part_of(gmap: GidxMap, gidxs) -> np.ndarray:
    g = np.asarray(gidxs, dtype=np.int64)
    out = np.full(len(g), -1, dtype=np.int64)
    ok = g < len(gmap.part)
    out[ok] = gmap.part[g[ok]]
    return out


def _lens(x) -> np.ndarray:
    """Each entry's length (``x``: a list of bytes, or :class:`Packed`)."""
    return x.lens if isinstance(x, Packed) else np.fromiter(map(len, x), dtype=np.int64, count=len(x))


def _gidx_keys(ks, w: _Where, next_gidx: int, joined: Optional[bytes] = None) -> np.ndarray:
    joined = b"".join(ks) if joined is None else joined
    if len(ks) and (_lens(ks) != 8).any():
        for k in ks:
            w.at = ("rows", k)
            R.decode_gidx_key(k)
    g = np.frombuffer(joined, dtype=">u8").astype(np.int64)
    if len(g) and int(g.max()) >= next_gidx:  # (a damaged file need not keep its keys sorted)
        w.at = ("rows", ks[int(np.argmax(g >= next_gidx))])
        raise RecordError(f"not a global index below next_gidx {next_gidx}")
    return g


def _install(p: Partition, g: np.ndarray, seq: np.ndarray, fs: np.ndarray, keys: List[Any]) -> None:
    order = np.argsort(seq, kind="stable")  # Partition rows are kept in seq order
    if len(order) and not (order[1:] > order[:-1]).all():
        keys = [keys[i] for i in order.tolist()]
        g, seq, fs = g[order], seq[order], fs[order]
    p.append(g, seq, fs, keys)


_CHUNK = 1 << 16  # entries decoded together: bounds what an open holds besides the mirror


def _distinct(a: np.ndarray) -> List[int]:
    if not len(a):
        return []
    if (a == a[0]).all():
        return [int(a[0])]
    return np.unique(a).tolist()


def _chunks(txn, db, cols=None):
    """``(keys, values, joined keys, joined values)`` of the entries of ``db`` in chunks of
    :data:`_CHUNK`: from ``cols`` (its entries read in bulk: :class:`Packed` chunks), or two
    cursors walk the same database in the same order (a keys-only and a values-only walk
    make no per-entry tuple)."""
    if cols is not None:
        for ks, vs in packed_chunks(cols, _CHUNK):
            yield ks, vs, ks.buf, vs.buf
        return
    kit = txn.cursor(db).iternext(values=False)
    vit = txn.cursor(db).iternext(keys=False)
    while True:
        ks = list(islice(kit, _CHUNK))
        if not ks:
            return
        vs = list(islice(vit, len(ks)))
        if len(vs) != len(ks):  # (one read transaction: cannot happen)
            raise RecordError("entries changed during the walk")
        yield ks, vs, b"".join(ks), b"".join(vs)


def _rows_v2(txn, dbs, parts, by_num, next_gidx: int, w: _Where, n_free: int, cols_of: Mapping[bytes, Any]) -> int:
    cols: List[List[np.ndarray]] = [[], [], [], [], []]  # gidx, part, flags, seq, mask (0 for slow rows)
    slow: List[Tuple[int, Any]] = []  # (row position, Row2) of rows not decoded as the array
    tagged: List[Tuple[np.ndarray, List[Any]]] = []  # (row positions, tags) of tagged rows decoded in bulk
    base = 0
    for ks, vs, kb, vb in _chunks(txn, dbs["rows"], cols_of.get(b"rows")):
        g = _gidx_keys(ks, w, next_gidx, kb)
        m = len(vs)
        fast = _lens(vs) == _FAST
        allf = bool(fast.all())
        part, flags = np.zeros(m, dtype=np.int64), np.zeros(m, dtype=np.int64)
        seq, mask = np.zeros(m, dtype=np.int64), np.zeros(m, dtype=np.uint64)
        if fast.any():
            a = np.frombuffer(vb if allf else b"".join(compress(vs, fast.tolist())), dtype=_ROW2)
            bad = ((a["flags"] & np.uint16(0xFFFF ^ R.ROW2_KEYED)) != 0) | (a["words"] != 1) | (a["seq"] >= R.SEQ_LIMIT)
            if bad.any():
                i = int(np.flatnonzero(fast)[int(np.argmax(bad))])
                w.at = ("rows", ks[i])
                R.decode_row2(vs[i])
                raise RecordError("row value: a 24-byte value must be one untagged bitmap word below seq 2**63")
            sel = slice(None) if allf else fast
            part[sel], flags[sel], seq[sel], mask[sel] = a["part"], a["flags"], a["seq"], a["mask"]
        others = np.flatnonzero(~fast)
        bulk = _tagged_rows(vs.take(others) if isinstance(vs, Packed) else [vs[i] for i in others.tolist()]) \
            if len(others) else None
        if bulk is not None:  # tagged rows (the usual ones of RL buffers), checked in bulk
            a, tg = bulk
            part[others], flags[others], seq[others], mask[others] = a["part"], a["flags"], a["seq"], a["mask"]
            tagged.append((base + others, tg))
            others = others[:0]
        for i in others.tolist():
            w.at = ("rows", ks[i])
            r = R.decode_row2(vs[i])
            if r.seq >= R.SEQ_LIMIT:
                raise RecordError(f"row seq {r.seq} out of range")
            part[i], flags[i], seq[i] = r.part, r.flags, r.seq
            slow.append((base + i, r))
        for c, x in zip(cols, (g, part, flags, seq, mask)):
            c.append(x)
        base += m
    g, part, flags, seq, mask = (np.concatenate(c) if c else np.zeros(0, dtype=np.int64) for c in cols)
    n = len(g)
    if n + n_free < next_gidx:  # checked before any array is sized by a global index
        w.at = "meta/next_gidx"
        raise RecordError(f"next_gidx {next_gidx} is past the rows, free and reserved indexes ({n} rows)")
    fsid = np.zeros(n, dtype=np.int64)
    nums = _distinct(part)
    for num in nums:
        p = by_num.get(num)
        if p is None:
            w.at = ("rows", R.gidx_key(int(g[int(np.argmax(part == num))])))
            raise RecordError(f"row of partition number {num}, which has no parts entry")
    slow_at = np.zeros(n, dtype=bool)
    slow_at[[i for i, _ in slow]] = True
    for num in nums:
        p = by_num[num]
        idx = np.flatnonzero((part == num) & ~slow_at)
        ms = mask[idx]
        if not len(ms):
            continue
        if (ms == ms[0]).all():
            uniq, inv = [int(ms[0])], np.zeros(len(ms), dtype=np.int64)
        else:
            u, inv = np.unique(ms, return_inverse=True)
            uniq, inv = u.tolist(), inv.reshape(-1)
        ids = []
        for k, mk in enumerate(uniq):
            f = p.fs_of_mask(int(mk))
            if f is None:
                w.at = ("rows", R.gidx_key(int(g[idx][int(np.argmax(inv == k))])))
                raise RecordError(f"produced-field bit of no field of partition {p.pid[:40]!r}")
            ids.append(f)
        fsid[idx] = np.asarray(ids, dtype=np.int64)[inv]
    tags: List[Tuple[int, int, Any]] = []
    for i, r in slow:
        w.at = ("rows", R.gidx_key(int(g[i])))
        p = by_num[r.part]
        f = p.fs_of_mask(r.mask)
        if f is None:
            raise RecordError(f"produced-field bit of no field of partition {p.pid[:40]!r}")
        fsid[i] = f
        if r.tag is not None:
            tags.append((r.part, int(g[i]), r.tag))
    n_keys = 0
    for num, p in by_num.items():
        sel = (part == num) if len(nums) > 1 or nums != [num] else slice(None)
        w.at = "rows"
        pg = g[sel]
        _install(p, pg, seq[sel], fsid[sel], [None] * len(pg))
        keyed = p.slots(pg[(flags[sel] & R.ROW2_KEYED) != 0])
        n_keys += _keys_v2(txn, dbs["keys"], p, keyed, w, cols_of.get(b"keys"))
    for num, gg, tag in tags:
        by_num[num].tags[gg] = tag
    for pos, tg in tagged:
        for num, gg, tag in zip(part[pos].tolist(), g[pos].tolist(), tg):
            by_num[num].tags[gg] = tag
    w.at = "keys"
    if n_keys != txn.stat(dbs["keys"])["entries"]:
        raise RecordError(f"{txn.stat(dbs['keys'])['entries'] - n_keys} keys entries of no partition")
    return n


def _key_chunks(txn, db, prefix: bytes, n: int, cols=None):
    """``(keys, values)`` chunks of at most :data:`_CHUNK` of up to ``n`` entries of ``db``
    from the first key at or after ``prefix``: from ``cols`` (its entries read in bulk), or
    two cursors."""
    if cols is not None:
        lo = bisect_left(Packed(cols.keys, cols.key_lens), prefix)
        yield from packed_chunks(cols, _CHUNK, lo, lo + n)
        return
    kc, vc = txn.cursor(db), txn.cursor(db)
    if not kc.set_range(prefix) or not vc.set_range(prefix):
        return
    kit, vit = kc.iternext(values=False), vc.iternext(keys=False)
    while n:
        ks = list(islice(kit, min(n, _CHUNK)))
        if not ks:
            return
        n -= len(ks)
        yield ks, list(islice(vit, len(ks)))


def _keys_v2(txn, db, p: Partition, keyed: np.ndarray, w: _Where, cols=None) -> int:
    """Read the ``keys`` entries of ``p`` (contiguous: keys sort by partition id first, and no
    id is a prefix of another's ``id NUL``), check they name its keyed rows (slots ``keyed``)
    one to one, and install them: ``s_key`` (each key decoded straight into its slot by the
    native ``place_keys``) and ``keys`` (built on first use)."""
    n_keyed = len(keyed)
    is_keyed = np.zeros(p.n, dtype=bool)
    is_keyed[keyed] = True
    prefix = R.keys_key(p.pid, "")
    w.at = ("keys", prefix)
    if not n_keyed:
        return 0
    left = n_keyed
    for ks, vs in _key_chunks(txn, db, prefix, n_keyed, cols):
        if not ks[0].startswith(prefix) or not ks[-1].startswith(prefix):  # sorted: then all between do
            break
        left -= len(ks)
        if (_lens(vs) != 8).any():
            w.at = ("keys", next(k for k, v in zip(ks, vs) if len(v) != 8))
            raise RecordError("a keys value is not a gidx key (8 bytes)")
        gs = np.frombuffer(vs.buf if isinstance(vs, Packed) else b"".join(vs), dtype=">u8").astype(np.int64)
        sl = p.slots(gs)
        if (sl < 0).any() or not is_keyed[np.maximum(sl, 0)].all():
            w.at = ("keys", ks[int(np.argmax((sl < 0) | ~is_keyed[np.maximum(sl, 0)]))])
            raise RecordError(f"key of partition {p.pid[:40]!r} names no keyed row of it")
        status, i = place_keys(ks.buf if isinstance(ks, Packed) else b"".join(ks), _lens(ks), prefix, sl, p.s_key)
        if status:
            w.at = ("keys", ks[i])
            if status == 1:  # (a damaged file need not keep its keys sorted)
                raise RecordError(f"keys of partition {p.pid[:40]!r} are not contiguous")
            if status == 2:
                raise RecordError("a keys key holds a NUL past its partition id")
            if status == 3:
                raise RecordError(f"a row of partition {p.pid[:40]!r} is claimed by two keys")
            R.decode_keys_key(ks[i])  # status 4: raises the record's own UTF-8 error
            raise RecordError("a keys key is not UTF-8")
        del ks, vs
    if left:
        raise RecordError(f"{n_keyed - left} keys entries for {n_keyed} keyed rows of partition {p.pid[:40]!r}")
    p.keys = None  # the key -> gidx index: built from s_key on first use (controller_mirror.Partition.keys)
    return n_keyed


def _rows_v1(txn, dbs, parts, by_num, next_gidx: int, w: _Where, n_free: int) -> int:
    cols: Dict[str, Tuple[list, list, list, list]] = {pid: ([], [], [], []) for pid in parts}
    n = 0
    for k, v in txn.cursor(dbs["rows"]):
        w.at = ("rows", k)
        g = R.decode_gidx_key(k)
        if g >= next_gidx:
            raise RecordError(f"not a global index below next_gidx {next_gidx}")
        pid, key, tag, fields, seq = R.decode_row(v)
        if pid not in parts:
            raise RecordError(f"row of partition {pid[:40]!r}, which has no parts entry")
        p = parts[pid]
        missing = [f for f in fields if f not in p.bits]
        if missing:
            raise RecordError(f"produced field {missing[0][:40]!r} has no schema entry")
        c = cols[pid]
        c[0].append(g)
        c[1].append(seq)
        c[2].append(p.fs_id(frozenset(fields)))
        c[3].append(key)
        if tag is not None:
            p.tags[g] = tag
        n += 1
    if n + n_free < next_gidx:
        w.at = "meta/next_gidx"
        raise RecordError(f"next_gidx {next_gidx} is past the rows, free and reserved indexes ({n} rows)")
    for pid, (gs, seqs, fs, keys) in cols.items():
        p = parts[pid]
        w.at = "rows"
        _install(p, np.asarray(gs, dtype=np.int64), np.asarray(seqs, dtype=np.int64),
                 np.asarray(fs, dtype=np.int64), keys)
        index: Dict[str, int] = {}
        for s, key in enumerate(p.s_key):
            if key is not None:
                if key in index:
                    raise RecordError(f"key {key[:40]!r} of partition {pid[:40]!r} is claimed by two rows")
                index[key] = int(p.s_gidx[s])
        p.keys = index
    return n


def schema_entries(txn, dbs: Mapping[str, Any], pid: str) -> List[Tuple[str, bytes]]:
    """``(field, raw schema value)`` of partition ``pid`` in read transaction ``txn`` (one
    prefix scan of the schema database).  Raises RecordError for a malformed key."""
    out: List[Tuple[str, bytes]] = []
    head = (pid + "\0").encode()
    cur = txn.cursor(db=dbs["schema"])
    if cur.set_range(head):
        for k, v in cur:
            k = bytes(k)
            if not k.startswith(head):
                break
            out.append((R.decode_schema_key(k)[1], bytes(v)))
    return out


def read_row(txn, dbs: Mapping[str, Any], pid: str, gidx: int, key: Optional[str] = None, *,
             cache: Optional[Dict[str, Any]] = None):
    """The :class:`~tqstore.controller_mirror.Row` ``gidx`` of partition ``pid`` as read
    transaction ``txn`` holds it (either format; a snapshot's view, not the mirror); None when
    it is no row there.  ``key``: the key it was found by (version 2 rows do not repeat it).
    ``cache``: a dict the caller passes again for more rows of ``pid`` in the same ``txn``
    (the partition's number and field bits are read once).

    Raises:
        RecordError: the entry is malformed or a row of another partition.
    """
    from .controller_mirror import Row

    v = txn.get(R.gidx_key(gidx), db=dbs["rows"])
    if v is None:
        return None
    v = bytes(v)
    if v[:1] == b"{":  # version 1
        p, k, t, f, s = R.decode_row(v)
        if p != pid or (key is not None and k != key):
            raise RecordError(f"global index {gidx} is a row of another key or partition")
        return Row(gidx, p, k, t, frozenset(f), s)
    r = R.decode_row2(v)
    cache = {} if cache is None else cache
    if "num" not in cache:
        cache["num"] = R.decode_partition2(txn.get(R.parts_key(pid), db=dbs["parts"]))[2]
        cache["names"] = {R.decode_schema2(sv)[2]: f for f, sv in schema_entries(txn, dbs, pid)}
    if r.part != cache["num"]:
        raise RecordError(f"global index {gidx} is a row of another partition")
    names = cache["names"]
    fields = []
    for b in range(r.mask.bit_length()):
        if r.mask >> b & 1:
            if b not in names:
                raise RecordError(f"row {gidx}: produced-field bit {b} of no field")
            fields.append(names[b])
    if key is None and r.flags & R.ROW2_KEYED:
        raise RecordError(f"row {gidx} is keyed: pass the key it was found by")
    return Row(gidx, pid, key if r.flags & R.ROW2_KEYED else None, r.tag, frozenset(fields), r.seq)
