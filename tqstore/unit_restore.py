"""A unit's side of a selective restore (UnitPort ``import_restore``, ``publish_restore``,
``unpublish_restore``, ``settle_restore``, ``restore_tags``): functions of
:class:`~tqstore.unit.Unit`, installed on it as methods.

Entries of a restore live in the unit index's ``restore`` database (created on first use),
keyed by the restore's tag (docs/FORMAT.md, "Unit index"):

* *staged* (kind 0): ``index key -> location`` of a frame the restore appended to the unit's
  active segment; reads, ``keys()`` and the store's reconcile never see it;
* *published* (kind 1): the restore's frame is in ``loc``; the value is what it replaced
  (empty: nothing), so that an unpublish (a crash before the controller's decision) or a
  cancel can put it back;
* *closed* (kind 255): the restore was settled; an import with its tag is refused, so a
  cancelled load that is still running can never write into an index reused meanwhile.

Frames named by staged and published entries count as live bytes of their segments (the
replaced ones too, until settled), so no segment they use is unlinked; compaction waits
while any restore entry exists.  Every step is one LMDB transaction under the unit's lock.

Imports are read in batches of at most ``plan.batch_bytes`` of a unit's frames (only
their byte ranges, one native ``pread`` per run of adjacent frames, into one reused buffer),
each frame checked by the frame-check kernel against the CRC32C the dump
recorded and its gidx, re-stamped when the store's gidx differs (CRC recomputed), appended
to the active segment with one write and indexed in one transaction: the memory a
unit adds is one batch.
"""
from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Tuple

import lmdb
import numpy as np

from . import _native
from ._format import unit_records as UR
from ._format.columns import describe_kind_dtype
from ._format.dtypes import SCHEMA_MIXED
from ._format.frame import DTYPE_AT, KIND_AT, NAME_AT, NAME_LEN_AT, check_run, first_fault
from ._format.index import LOC_DTYPE, Loc
from ._io.gilturn import bulk_index
from ._io import files
from ._io.lmdbenv import lmdb_commit_point, prefixed, wrap_errors
from .errors import CorruptionError, InvalidInputError
from .ports import RestoreImport

if TYPE_CHECKING:  # pragma: no cover
    from .unit import Unit

RESTORE_DB = b"restore"
_CLOSED = UR.RESTORE_CLOSED


def open_restore_db(env):
    """The ``restore`` database of the unit index ``env`` if it exists (opened when the unit
    opens, before recovery reads it), else None."""
    try:
        return env.open_db(RESTORE_DB, create=False)
    except lmdb.NotFoundError:
        return None


def restore_db(unit: "Unit", *, create: bool):
    """The unit's ``restore`` database handle (None when it does not exist and not ``create``)."""
    db = unit.db_restore
    if db is None:
        try:
            db = unit.env.open_db(RESTORE_DB, create=create)
        except lmdb.NotFoundError:
            return None
        unit.db_restore = db
    return db


def _entries(txn, db, tag: int, kind: int) -> List[tuple]:
    prefix = UR.restore_prefix(tag, kind)
    return [(k[len(prefix):], bytes(v)) for k, v in prefixed(txn, db, prefix)]


def _closed(txn, db, tag: int) -> bool:
    return txn.get(UR.restore_entry_key(tag, _CLOSED), db=db) is not None


def _drop_range(txn, db, prefix: bytes) -> None:
    """Delete every entry whose key starts with ``prefix`` (one cursor walk)."""
    cur = txn.cursor(db)
    if not cur.set_range(prefix):
        return
    while bytes(cur.key()).startswith(prefix):
        if not cur.delete():
            break


def _drop_kinds(txn, db, tag: int, *kinds: int) -> None:
    for kind in kinds:
        _drop_range(txn, db, UR.restore_prefix(tag, kind))


def _has_batches(txn, db) -> bool:
    """Whether ``restore`` holds a batch entry (kind 2 or 3) of any restore."""
    at = UR.TOKEN_BYTES
    return any(len(k) > at and k[at] in UR.RESTORE_BATCH_KINDS for k in txn.cursor(db).iternext(values=False))


def sync_format(unit: "Unit", txn, db) -> None:
    """Record, in ``txn``, the unit index version its ``restore`` entries need (docs/FORMAT.md,
    "Unit index"): 2 while a batch entry is there, so that a reader of version 1, which knows
    only the per-frame kinds, rejects the index by name rather than miss the batches (and,
    say, cancel a restore without putting back what it replaced); 1 once none is left."""
    want = UR.UNIT_INDEX_FORMAT_BATCHES if db is not None and _has_batches(txn, db) else UR.UNIT_INDEX_FORMAT
    meta = unit.env.open_db(b"meta", txn=txn)
    raw = txn.get(UR.META_FORMAT, db=meta)
    have = UR.decode_format(raw)
    if have != want:
        txn.put(UR.META_FORMAT, UR.encode_format(want), db=meta)


def _bad_entry(unit: "Unit", e: Exception) -> CorruptionError:
    return CorruptionError(f"unit index: malformed restore entry: {e}", path=str(unit.path / "index" / "data.mdb"))


def _batches(unit: "Unit", txn, db, tag: int, kind: int) -> List[Tuple[int, List[bytes], np.ndarray, np.ndarray]]:
    """The batch entries of one kind of ``tag``: ``(batch number, keys, locs, present)``."""
    out = []
    try:
        for no, v in _entries(txn, db, tag, kind):
            out.append((int.from_bytes(no, "big"), *UR.decode_restore_batch(v)))
    except UR.RecordError as e:
        raise _bad_entry(unit, e) from e
    return out


def _loc_array(values: List[bytes]) -> np.ndarray:
    return np.frombuffer(b"".join(values), LOC_DTYPE).copy() if values else np.zeros(0, LOC_DTYPE)


def _staged(unit: "Unit", txn, db, tag: int) -> Tuple[List[bytes], np.ndarray]:
    """Every staged frame of ``tag``: its index key and location, from the batch entries
    (kind 2) and the per-frame ones (kind 0) a tqstore before batches wrote."""
    keys: List[bytes] = []
    locs: List[np.ndarray] = []
    legacy = _entries(txn, db, tag, UR.RESTORE_STAGED)
    if legacy:
        if any(len(v) != LOC_DTYPE.itemsize for _k, v in legacy):
            raise _bad_entry(unit, UR.RecordError("a staged entry is not a 20-byte location"))
        keys.extend(k for k, _v in legacy)
        locs.append(_loc_array([v for _k, v in legacy]))
    for _no, ks, ls, _pr in _batches(unit, txn, db, tag, UR.RESTORE_STAGED_BATCH):
        keys.extend(ks)
        locs.append(ls)
    return keys, (np.concatenate(locs) if locs else np.zeros(0, LOC_DTYPE))


def _published(unit: "Unit", txn, db, tag: int) -> Tuple[List[bytes], np.ndarray, np.ndarray]:
    """Every published entry of ``tag``: index key, the location it replaced and whether it
    replaced one (batches, kind 3, and the per-frame kind 1 entries of older writers)."""
    keys: List[bytes] = []
    olds: List[np.ndarray] = []
    present: List[np.ndarray] = []
    legacy = _entries(txn, db, tag, UR.RESTORE_PUBLISHED)
    if legacy:
        if any(len(v) not in (0, LOC_DTYPE.itemsize) for _k, v in legacy):
            raise _bad_entry(unit, UR.RecordError("a published entry is neither empty nor a 20-byte location"))
        keys.extend(k for k, _v in legacy)
        olds.append(_loc_array([v or bytes(LOC_DTYPE.itemsize) for _k, v in legacy]))
        present.append(np.array([bool(v) for _k, v in legacy], bool))
    for _no, ks, ls, pr in _batches(unit, txn, db, tag, UR.RESTORE_PUBLISHED_BATCH):
        keys.extend(ks)
        olds.append(ls)
        present.append(pr)
    if not keys:
        return keys, np.zeros(0, LOC_DTYPE), np.zeros(0, bool)
    return keys, np.concatenate(olds), np.concatenate(present)


def _next_batch(txn, db, tag: int, kind: int) -> int:
    """One more than the largest batch number of ``tag``'s entries of ``kind`` (0: none): the
    last key of the prefix (batch numbers are fixed-width big-endian, so the last key holds the
    largest), found with two cursor steps whatever the number of batches."""
    cur = txn.cursor(db)
    prefix = UR.restore_prefix(tag, kind)
    past = prefix + b"\xff" * (UR.BATCH_NO_BYTES + 1)  # after every key of the prefix
    found = cur.prev() if cur.set_range(past) else cur.last()
    if not found:
        return 0
    k = bytes(cur.key())
    if not k.startswith(prefix):
        return 0
    return int.from_bytes(k[len(prefix):], "big") + 1


#: entries of one batch value the unit writes at most
BATCH_ENTRIES = 8192


def _put_batches(txn, db, tag: int, kind: int, keys: List[bytes], locs: np.ndarray, present=None) -> None:
    """Write ``keys``/``locs`` (``present``) as batch entries of ``kind``, numbered after the existing ones."""
    no = _next_batch(txn, db, tag, kind)
    for i in range(0, len(keys), BATCH_ENTRIES):
        txn.put(UR.restore_batch_key(tag, kind, no), UR.encode_restore_batch(
            keys[i:i + BATCH_ENTRIES], locs[i:i + BATCH_ENTRIES], None if present is None else
            present[i:i + BATCH_ENTRIES]), db=db)
        no += 1


def _values(locs: np.ndarray) -> List[bytes]:
    """The packed 20-byte location values of a ``LOC_DTYPE`` array, one bytes object each."""
    return np.ascontiguousarray(locs, LOC_DTYPE).view(np.dtype((np.void, LOC_DTYPE.itemsize))).tolist()


def _add_dead(dead: Dict[int, int], locs: np.ndarray) -> None:
    seg, ln = locs["seg"], locs["length"].astype(np.int64)
    for s in np.unique(seg).tolist():
        dead[int(s)] += int(ln[seg == s].sum())


def _drop_staged(unit: "Unit", txn, db, tag: int, dead: Dict[int, int]) -> int:
    keys, locs = _staged(unit, txn, db, tag)
    _add_dead(dead, locs)
    _drop_kinds(txn, db, tag, UR.RESTORE_STAGED, UR.RESTORE_STAGED_BATCH)
    return len(keys)


# ---------------------------------------------------------------------------- import
def import_restore(unit: "Unit", tag: int, plan: RestoreImport) -> int:
    src = Path(plan.src_dir)
    with unit._lock, wrap_errors(f"unit {unit.unit_id} restore import", unit.path):
        db = restore_db(unit, create=True)
        with unit.env.begin(write=True) as txn:
            if _closed(txn, db, tag):
                raise InvalidInputError(f"unit {unit.unit_id}: restore tag {tag} is settled; refusing to write")
            dead: Dict[int, int] = defaultdict(int)
            _drop_staged(unit, txn, db, tag, dead)  # a retried claim starts over
            unit._apply_dead(txn, dead)
            sync_format(unit, txn, db)
    n = len(plan)
    if not n:
        return 0
    # file after file, front to back, each unit starting at another file (parallel streams)
    files_ = np.asarray(plan.file, np.int64)
    ids = np.unique(files_)
    turn = (np.searchsorted(ids, files_) - unit.unit_id) % max(1, len(ids))
    order = np.lexsort((np.asarray(plan.offset, np.int64), turn))
    fid = np.asarray(plan.file, np.int64)[order]
    off = np.asarray(plan.offset, np.int64)[order]
    ln = np.asarray(plan.length, np.int64)[order]
    crc = np.asarray(plan.crc, np.uint32)[order]
    sg = np.asarray(plan.src_gidx, np.uint64)[order]
    dg = np.asarray(plan.gidx, np.uint64)[order]
    fields = list(map(plan.fields.__getitem__, order.tolist()))
    names = list(dict.fromkeys(fields))  # the distinct field names, and each frame's code among them
    codes = np.fromiter(map({f: i for i, f in enumerate(names)}.__getitem__, fields), np.int64, n)
    cut = np.flatnonzero(fid[1:] != fid[:-1]) + 1
    bounds = [0, *cut.tolist(), n]
    batch = max(1 << 16, int(plan.batch_bytes))
    buf = bytearray(max(min(batch, int(ln.sum())), int(ln.max())))  # the one copy buffer of the import
    ends = off + ln
    cum = np.cumsum(ln)  # this unit's frame bytes up to the end of each frame
    before = cum - ln
    read = 0
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        f = int(fid[lo])
        rel = plan.files.get(f)
        if rel is None:
            raise InvalidInputError(f"restore plan names file {f}, which it does not list")
        path = str(src / rel)
        try:
            fd = files.open_regular(path, under=src)
        except FileNotFoundError as e:
            raise CorruptionError("dump shard is missing", path=path) from e
        except files.NotRegularFile as e:
            raise CorruptionError(f"dump shard: {e.strerror}", path=str(e.filename or path)) from e
        try:
            size = os.fstat(fd).st_size
            want = plan.file_sizes.get(f)
            if want is not None and size != want:
                raise CorruptionError(f"dump shard holds {size} bytes, its manifest says {want}", path=path,
                                      offset=min(size, want))
            past = np.flatnonzero((ends[lo:hi] > size) | (off[lo:hi] < 0))
            if len(past):
                raise CorruptionError("dump shard is truncated: a frame lies past its end", path=path,
                                      offset=int(off[lo + int(past[0])]))
            i = lo
            while i < hi:  # a batch: this unit's next frames of at most `batch` bytes (at least one frame)
                j = max(i + 1, i + int(np.searchsorted(cum[i:hi], before[i] + batch, side="right")))
                _import_batch(unit, tag, fd, path, buf, off[i:j], ln[i:j], crc[i:j], sg[i:j], dg[i:j], fields[i:j],
                              (names, codes[i:j]), plan.schemas)
                read += int(cum[j - 1] - before[i])
                i = j
        finally:
            os.close(fd)
    return read


def _import_batch(unit: "Unit", tag: int, fd: int, path: str, buf: bytearray, off, ln, crc, sg, dg,
                  fields: List[bytes], coded: Tuple[List[bytes], np.ndarray],
                  schemas: Dict[bytes, Tuple[int, int]]) -> None:
    """Frames ``off``/``ln`` of the source file ``fd``: read back to back into ``buf`` (one
    ``pread`` per run of adjacent frames, without the GIL: nothing between them is read),
    check them with the frame-check kernel (against the CRC32C the dump recorded and the
    source gidx), their field names and kinds and dtypes (as the dump's ``schemas`` declare
    them), re-stamp those whose gidx changes (the CRC32C updated
    for the 8 changed bytes), append, stage."""
    total = int(ln.sum())
    view = memoryview(buf)[:total]
    noff = np.cumsum(ln) - ln  # where each frame lies in buf
    runs = np.flatnonzero(np.r_[True, off[1:] != off[:-1] + ln[:-1]])
    got = files.read_ranges(fd, off[runs], np.add.reduceat(ln, runs), view)
    if got != total:
        k = int(np.searchsorted(noff + ln, got, side="right"))
        raise CorruptionError("dump shard is truncated: a frame lies past its end", path=path, offset=int(off[k]))
    loc = np.zeros(len(off), LOC_DTYPE)
    loc["offset"], loc["length"], loc["crc"] = noff, ln, crc
    res = check_run(view, loc, sg)
    bad = first_fault(view, loc, res, sg)
    if bad is not None:
        k, fault = bad
        raise fault.error(path=path, offset=int(off[k]), prefix="dump shard: ")
    _check_names(np.frombuffer(view, np.uint8), noff, coded, path, off, schemas)
    crcs = np.array(crc, np.uint32)
    moved = np.flatnonzero(sg != dg)
    if len(moved):
        crcs[moved] = np.frombuffer(_native.restamp_frames(view, noff[moved], ln[moved],
                                                           dg[moved].astype(np.int64)), "<u4")
    _append_staged(unit, tag, [view], ln, crcs, dg, fields)


def _check_names(b8: np.ndarray, rel: np.ndarray, coded: Tuple[List[bytes], np.ndarray], path: str, off,
                 schemas: Dict[bytes, Tuple[int, int]]) -> None:
    """Each frame's header names its entry's field (byte 11 of the header: the name's length)
    and holds the kind and dtype (bytes 8 and 9) the dump's schema declares for it (any dtype
    of the kind when it is "mixed"); ``coded``: the distinct names and each frame's index
    among them.  Raises CorruptionError naming the first frame that does not."""
    names, codes = coded
    for c in np.unique(codes).tolist():
        name = names[c]
        i = np.flatnonzero(codes == c)
        r = rel[i]
        ok = b8[r + NAME_LEN_AT] == len(name)
        ok &= (b8[(r + NAME_AT)[:, None] + np.arange(len(name))] == np.frombuffer(name, np.uint8)).all(axis=1)
        if not ok.all():
            k = int(i[np.flatnonzero(~ok)[0]])
            raise CorruptionError(f"dump shard: frame holds another field than {name.decode(errors='replace')!r}",
                                  path=path, offset=int(off[k]))
        want = schemas.get(name)
        if want is not None:
            ok = b8[r + KIND_AT] == want[0]
            if want[1] != SCHEMA_MIXED:
                ok &= b8[r + DTYPE_AT] == want[1]
            if not ok.all():
                k = int(np.flatnonzero(~ok)[0])
                got = (int(b8[r[k] + KIND_AT]), int(b8[r[k] + DTYPE_AT]))
                raise CorruptionError(f"dump shard: frame of field {name.decode(errors='replace')!r} holds "
                                      f"{describe_kind_dtype(got)}, the dump's row index declares "
                                      f"{describe_kind_dtype(want)}",
                                      path=path, offset=int(off[i[k]]))



def _append_staged(unit: "Unit", tag: int, bufs: List, lens, crcs, gidxs, fields: List[bytes]) -> None:
    """Append the frames (``bufs``, back to back; ``lens``, ``crcs``, ``gidxs`` arrays) to the
    active segment and stage them as one batch entry, in one transaction that first checks the
    tag was not settled meanwhile."""
    lens = np.asarray(lens, np.int64)
    gb = np.asarray(gidxs, ">u8").tobytes()
    keys = [gb[x:x + 8] + f for x, f in zip(range(0, len(gb), 8), fields)]
    with unit._lock, wrap_errors(f"unit {unit.unit_id} restore import", unit.path):
        db = restore_db(unit, create=True)
        with unit._appending() as txn:
            if _closed(txn, db, tag):
                raise InvalidInputError(f"unit {unit.unit_id}: restore tag {tag} was settled during the import; "
                                        f"nothing more is written")
            w = unit._active(txn)
            start = w.append(bufs)
            if unit.sync:
                w.fsync()
            vals = np.zeros(len(lens), LOC_DTYPE)
            vals["seg"] = w.seg_id
            vals["offset"] = start + np.cumsum(lens) - lens
            vals["length"] = lens
            vals["crc"] = crcs
            _put_batches(txn, db, tag, UR.RESTORE_STAGED_BATCH, keys, vals)
            sync_format(unit, txn, db)
            unit._grown(txn, w.seg_id, int(lens.sum()))
    unit._after_change()


# ---------------------------------------------------------------------------- publish, settle
def publish_restore(unit: "Unit", tag: int) -> int:
    with unit._lock, wrap_errors(f"unit {unit.unit_id} restore publish", unit.path):
        db = restore_db(unit, create=False)
        if db is None:
            return 0
        with unit.env.begin(write=True) as txn:
            with bulk_index:  # (one unit of the process at a time; the commit after it overlaps)
                keys, locs = _staged(unit, txn, db, tag)
                if not keys:
                    return 0
                cur = txn.cursor(unit.db_loc)
                olds = np.zeros(len(keys), LOC_DTYPE)  # what they replace
                present = np.zeros(len(keys), bool)
                found = cur.getmulti(keys)
                if found:
                    pos = {k: i for i, k in enumerate(keys)}
                    for k, v in found:
                        i = pos[bytes(k)]
                        olds[i] = np.frombuffer(bytes(v), LOC_DTYPE)[0]
                        present[i] = True
                _put_batches(txn, db, tag, UR.RESTORE_PUBLISHED_BATCH, keys, olds, present)
                cur.putmulti(list(zip(keys, _values(locs))))
                _drop_kinds(txn, db, tag, UR.RESTORE_STAGED, UR.RESTORE_STAGED_BATCH)
                sync_format(unit, txn, db)
            lmdb_commit_point("unit_commit")
        return len(keys)


def _unpublish(unit: "Unit", txn, db, tag: int) -> int:
    """Put back what the published entries of ``tag`` replaced; the restore's frames still in
    ``loc`` are staged again (one gone after a power loss is not).  The caller holds
    :data:`~tqstore._io.gilturn.bulk_index` (one unit of the process at a time)."""
    keys, olds, present = _published(unit, txn, db, tag)
    if not keys:
        return 0
    cur = txn.cursor(unit.db_loc)
    now = {bytes(k): bytes(v) for k, v in cur.getmulti(keys)}
    again = [k for k in keys if k in now]
    _put_batches(txn, db, tag, UR.RESTORE_STAGED_BATCH, again, _loc_array([now[k] for k in again]))
    back = np.flatnonzero(present)
    cur.putmulti(list(zip([keys[i] for i in back.tolist()], _values(olds[back]))))
    for i in np.flatnonzero(~present).tolist():
        txn.delete(keys[i], db=unit.db_loc)
    _drop_kinds(txn, db, tag, UR.RESTORE_PUBLISHED, UR.RESTORE_PUBLISHED_BATCH)
    return len(keys)


def unpublish_restore(unit: "Unit", tag: int) -> int:
    with unit._lock, wrap_errors(f"unit {unit.unit_id} restore unpublish", unit.path):
        db = restore_db(unit, create=False)
        if db is None:
            return 0
        with unit.env.begin(write=True) as txn:
            with bulk_index:
                n = _unpublish(unit, txn, db, tag)
            sync_format(unit, txn, db)
            lmdb_commit_point("unit_commit")
        return n


def settle_restore(unit: "Unit", tag: int, *, committed: bool, close: bool = True) -> int:
    with unit._lock, wrap_errors(f"unit {unit.unit_id} restore settle", unit.path):
        db = restore_db(unit, create=close)
        if db is None:
            return 0
        dead: Dict[int, int] = defaultdict(int)
        with unit.env.begin(write=True) as txn:
            n = 0
            if committed:
                keys, olds, present = _published(unit, txn, db, tag)
                _add_dead(dead, olds[present])
                n += len(keys)
                _drop_kinds(txn, db, tag, UR.RESTORE_PUBLISHED, UR.RESTORE_PUBLISHED_BATCH)
            else:
                with bulk_index:
                    _unpublish(unit, txn, db, tag)
            n += _drop_staged(unit, txn, db, tag, dead)
            ck = UR.restore_entry_key(tag, _CLOSED)
            if close:
                txn.put(ck, b"", db=db)
            else:
                txn.delete(ck, db=db)
            unit._apply_dead(txn, dead)
            sync_format(unit, txn, db)
            lmdb_commit_point("unit_commit")
        unit._after_change()
        return n


def restore_tags(unit: "Unit") -> List[int]:
    with unit._lock:
        db = restore_db(unit, create=False)
        if db is None:
            return []
        out = set()
        with unit.env.begin() as txn:
            try:
                for k in txn.cursor(db).iternext(values=False):
                    out.add(UR.decode_restore_entry_key(k)[0])
            except UR.RecordError as e:
                raise _bad_entry(unit, e) from e
        return sorted(out)


def has_entries(unit: "Unit", txn=None) -> bool:
    """Whether any staged or published entry exists (compaction waits while one does)."""
    db = unit.db_restore
    if db is None:
        return False
    own = txn is None
    txn = txn or unit.env.begin()
    try:
        return any(bytes(k)[UR.TOKEN_BYTES] != _CLOSED for k in txn.cursor(db).iternext(values=False))
    finally:
        if own:
            txn.abort()


def _decoded(unit: "Unit", k, v) -> Tuple[int, np.ndarray]:
    """``(kind, the locations it keeps live)`` of a ``restore`` entry: staged frames, and what
    published ones replaced."""
    try:
        _tag, kind, _rest = UR.decode_restore_entry_key(k)
        if kind in UR.RESTORE_BATCH_KINDS:
            _keys, locs, present = UR.decode_restore_batch(v)
            return kind, (locs if kind == UR.RESTORE_STAGED_BATCH else locs[present])
    except UR.RecordError as e:
        raise _bad_entry(unit, e) from e
    v = bytes(v)
    return kind, (_loc_array([v]) if len(v) == LOC_DTYPE.itemsize and kind != _CLOSED else np.zeros(0, LOC_DTYPE))


def live_entries(unit: "Unit", txn) -> List[Loc]:
    """Locations the restore entries keep live: staged frames and what published ones replaced."""
    db = unit.db_restore
    if db is None:
        return []
    out: List[Loc] = []
    for k, v in txn.cursor(db):
        out.extend(Loc._make(x) for x in _decoded(unit, k, v)[1].tolist())
    return out


def drop_staged_past(unit: "Unit", txn, short: Dict[int, int]) -> None:
    """Recovery: drop staged frames naming bytes past the end of a (power-loss shortened) segment."""
    db = unit.db_restore
    if db is None:
        return
    drop, rewrite = [], []
    for k, v in txn.cursor(db):
        k = bytes(k)
        kind, locs = _decoded(unit, k, v)
        if kind not in (UR.RESTORE_STAGED, UR.RESTORE_STAGED_BATCH) or not len(locs):
            continue
        end = np.array([short.get(int(s), -1) for s in locs["seg"].tolist()], np.int64)
        past = (end >= 0) & (locs["offset"].astype(np.int64) + locs["length"] > end)
        if not past.any():
            continue
        if kind == UR.RESTORE_STAGED or past.all():
            drop.append(k)
        else:
            keys, _l, _p = UR.decode_restore_batch(v)
            keep = np.flatnonzero(~past)
            rewrite.append((k, UR.encode_restore_batch([keys[i] for i in keep.tolist()], locs[keep])))
    for k in drop:
        txn.delete(k, db=db)
    for k, v in rewrite:
        txn.put(k, v, db=db)
    if drop:
        sync_format(unit, txn, db)


UNIT_RESTORE_CALLS = {"import_restore": import_restore, "publish_restore": publish_restore,
                      "unpublish_restore": unpublish_restore, "settle_restore": settle_restore,
                      "restore_tags": restore_tags}


def install_restore_calls(cls: type) -> None:
    """Give the unit class ``cls`` the UnitPort methods of selective restores."""
    for name, fn in UNIT_RESTORE_CALLS.items():
        setattr(cls, name, fn)


__all__ = ["RESTORE_DB", "restore_db", "has_entries", "live_entries", "install_restore_calls", "UNIT_RESTORE_CALLS"]
