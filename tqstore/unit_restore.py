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

Imports are read in windows of at most ``plan.batch_bytes`` of a source file (mapped
read-only), each frame checked by the frame-check kernel against the CRC32C the dump
recorded and its gidx, re-stamped when the store's gidx differs (CRC recomputed), appended
to the active segment with one vectored write and indexed in one transaction: the memory a
unit adds is one window.
"""
from __future__ import annotations

import mmap
import os
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Optional

import lmdb
import numpy as np

from ._format import unit_records as UR
from ._format.frame import check_run, first_fault, restamp_frames
from ._format.index import LOC_DTYPE, Loc
from ._io import files
from ._io.lmdbenv import lmdb_commit_point, wrap_errors
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
    out = []
    cur = txn.cursor(db)
    if cur.set_range(prefix):
        for k, v in cur:
            k = bytes(k)
            if not k.startswith(prefix):
                break
            out.append((k[len(prefix):], bytes(v)))
    return out


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


def _drop_staged(unit: "Unit", txn, db, tag: int, dead: Dict[int, int]) -> int:
    staged = _entries(txn, db, tag, UR.RESTORE_STAGED)
    for _ik, v in staged:
        loc = Loc.unpack(v)
        dead[loc.seg] += loc.length
    _drop_range(txn, db, UR.restore_prefix(tag, UR.RESTORE_STAGED))
    return len(staged)


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
    n = len(plan)
    if not n:
        return 0
    order = np.lexsort((np.asarray(plan.offset, np.int64), np.asarray(plan.file, np.int64)))
    fid = np.asarray(plan.file, np.int64)[order]
    off = np.asarray(plan.offset, np.int64)[order]
    ln = np.asarray(plan.length, np.int64)[order]
    crc = np.asarray(plan.crc, np.uint32)[order]
    sg = np.asarray(plan.src_gidx, np.uint64)[order]
    dg = np.asarray(plan.gidx, np.uint64)[order]
    fields = [plan.fields[i] for i in order.tolist()]
    cut = np.flatnonzero(fid[1:] != fid[:-1]) + 1
    bounds = [0, *cut.tolist(), n]
    read = 0
    batch = max(1 << 16, int(plan.batch_bytes))
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
            ends = off + ln
            past = np.flatnonzero((ends[lo:hi] > size) | (off[lo:hi] < 0))
            if len(past):
                raise CorruptionError("dump shard is truncated: a frame lies past its end", path=path,
                                      offset=int(off[lo + int(past[0])]))
            i = lo
            while i < hi:
                wstart = int(off[i]) & ~(mmap.ALLOCATIONGRANULARITY - 1)
                j = i + 1 + int(np.searchsorted(ends[i + 1:hi], wstart + batch, side="right"))
                _window(unit, tag, fd, path, wstart, int(ends[j - 1]), off[i:j], ln[i:j], crc[i:j], sg[i:j],
                        dg[i:j], fields[i:j])
                read += int(ln[i:j].sum())
                i = j
        finally:
            os.close(fd)
    return read


def _window(unit: "Unit", tag: int, fd: int, path: str, wstart: int, wend: int, off, ln, crc, sg, dg,
            fields: List[bytes]) -> None:
    """Frames ``off``/``ln`` of the source lie in ``[wstart, wend)``: check them where they lie,
    copy them into one buffer, re-stamp those whose gidx changes, append, stage."""
    try:
        mm = mmap.mmap(fd, wend - wstart, prot=mmap.PROT_READ, offset=wstart)
    except (ValueError, OSError) as e:
        raise CorruptionError(f"dump shard cannot be mapped (truncated?): {e}", path=path, offset=wstart) from e
    wmv = memoryview(mm)
    try:
        loc = np.zeros(len(off), LOC_DTYPE)
        loc["offset"], loc["length"], loc["crc"] = off, ln, crc
        res = check_run(wmv, loc, sg, base=wstart)
        got = first_fault(wmv, loc, res, sg, base=wstart)
        if got is not None:
            k, fault = got
            raise fault.error(path=path, offset=int(off[k]), prefix="dump shard: ")
        rel = off - wstart
        _check_names(np.frombuffer(wmv, np.uint8), rel, fields, path, off)
        lens = ln.tolist()
        buf = bytearray().join([wmv[r:r + n] for r, n in zip(rel.tolist(), lens)])
    finally:
        try:
            wmv.release()
            mm.close()
        except BufferError:  # a view still held by an exception's traceback: unmapped when collected
            pass
    crcs = np.array(crc, np.uint32)
    moved = np.flatnonzero(sg != dg)
    if len(moved):
        noff = np.cumsum(ln) - ln
        crcs[moved] = restamp_frames(buf, noff[moved], ln[moved], dg[moved])
    _append_staged(unit, tag, [buf], lens, crcs.tolist(), dg.tolist(), fields)


def _check_names(b8: np.ndarray, rel: np.ndarray, fields: List[bytes], path: str, off) -> None:
    """Each frame's header names its entry's field (byte 11 of the header: the name's length)."""
    names = np.array(fields, dtype=object)
    for name in set(fields):
        i = np.flatnonzero(names == name)
        r = rel[i]
        ok = b8[r + 35] == len(name)
        ok &= (b8[(r + 36)[:, None] + np.arange(len(name))] == np.frombuffer(name, np.uint8)).all(axis=1)
        if not ok.all():
            k = int(i[np.flatnonzero(~ok)[0]])
            raise CorruptionError(f"dump shard: frame holds another field than {name.decode(errors='replace')!r}",
                                  path=path, offset=int(off[k]))


def _append_staged(unit: "Unit", tag: int, bufs: List, lens: List[int], crcs: List[int], gidxs: List[int],
                   fields: List[bytes]) -> None:
    """Append the frames (``bufs``, back to back) to the active segment and stage them, in one
    transaction that first checks the tag was not settled meanwhile."""
    pre = UR.restore_prefix(tag, UR.RESTORE_STAGED)
    keys = [pre + g.to_bytes(8, "big") + f for g, f in zip(gidxs, fields)]
    with unit._lock, wrap_errors(f"unit {unit.unit_id} restore import", unit.path):
        db = restore_db(unit, create=True)
        txn = unit.env.begin(write=True)
        try:
            if _closed(txn, db, tag):
                raise InvalidInputError(f"unit {unit.unit_id}: restore tag {tag} was settled during the import; "
                                        f"nothing more is written")
            w = unit._active(txn)
            start = w.append(bufs)
            if unit.sync:
                w.fsync()
            total = sum(lens)
            vals = np.zeros(len(lens), LOC_DTYPE)
            vals["seg"] = w.seg_id
            vals["offset"] = start + np.cumsum(lens) - np.asarray(lens)
            vals["length"] = lens
            vals["crc"] = crcs
            vb = vals.tobytes()
            size = LOC_DTYPE.itemsize
            txn.cursor(db).putmulti(list(zip(keys, [vb[x:x + size] for x in range(0, len(vb), size)])))
            info = unit._get_seg(txn, w.seg_id)
            info.size += total
            info.live += total
            unit._put_seg(txn, w.seg_id, info)
            lmdb_commit_point("unit_commit")
            txn.commit()
        except BaseException:
            txn.abort()
            unit._after_failure()
            raise
    unit._after_change()


# ---------------------------------------------------------------------------- publish, settle
def publish_restore(unit: "Unit", tag: int) -> int:
    with unit._lock, wrap_errors(f"unit {unit.unit_id} restore publish", unit.path):
        db = restore_db(unit, create=False)
        if db is None:
            return 0
        with unit.env.begin(write=True) as txn:
            staged = _entries(txn, db, tag, UR.RESTORE_STAGED)
            if not staged:
                return 0
            cur = txn.cursor(unit.db_loc)
            olds = {bytes(k): bytes(v) for k, v in cur.getmulti([ik for ik, _ in staged])}  # what they replace
            pub = UR.restore_prefix(tag, UR.RESTORE_PUBLISHED)
            txn.cursor(db).putmulti([(pub + ik, olds.get(ik, b"")) for ik, _ in staged])
            cur.putmulti(staged)
            _drop_range(txn, db, UR.restore_prefix(tag, UR.RESTORE_STAGED))
            lmdb_commit_point("unit_commit")
        return len(staged)


def _unpublish(unit: "Unit", txn, db, tag: int, dead: Dict[int, int]) -> int:
    pub = _entries(txn, db, tag, UR.RESTORE_PUBLISHED)
    if not pub:
        return 0
    cur = txn.cursor(unit.db_loc)
    now = {bytes(k): bytes(v) for k, v in cur.getmulti([ik for ik, _ in pub])}  # (gone only after a power loss)
    staged = UR.restore_prefix(tag, UR.RESTORE_STAGED)
    txn.cursor(db).putmulti([(staged + ik, now[ik]) for ik, _ in pub if ik in now])
    cur.putmulti([(ik, old) for ik, old in pub if old])
    for ik, old in pub:
        if not old:
            txn.delete(ik, db=unit.db_loc)
    _drop_range(txn, db, UR.restore_prefix(tag, UR.RESTORE_PUBLISHED))
    return len(pub)


def unpublish_restore(unit: "Unit", tag: int) -> int:
    with unit._lock, wrap_errors(f"unit {unit.unit_id} restore unpublish", unit.path):
        db = restore_db(unit, create=False)
        if db is None:
            return 0
        with unit.env.begin(write=True) as txn:
            n = _unpublish(unit, txn, db, tag, defaultdict(int))
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
                for _ik, old in _entries(txn, db, tag, UR.RESTORE_PUBLISHED):
                    if old:
                        o = Loc.unpack(old)
                        dead[o.seg] += o.length
                    n += 1
                _drop_range(txn, db, UR.restore_prefix(tag, UR.RESTORE_PUBLISHED))
            else:
                _unpublish(unit, txn, db, tag, dead)
            n += _drop_staged(unit, txn, db, tag, dead)
            ck = UR.restore_entry_key(tag, _CLOSED)
            if close:
                txn.put(ck, b"", db=db)
            else:
                txn.delete(ck, db=db)
            unit._apply_dead(txn, dead)
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
                raise CorruptionError(f"unit index: malformed restore entry: {e}",
                                      path=str(unit.path / "index" / "data.mdb")) from e
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


def live_entries(unit: "Unit", txn) -> List[Loc]:
    """Locations the restore entries keep live: staged frames and what published ones replaced."""
    db = unit.db_restore
    if db is None:
        return []
    return [Loc.unpack(v) for v in txn.cursor(db).iternext(keys=False) if len(v) == LOC_DTYPE.itemsize]


def drop_staged_past(unit: "Unit", txn, short: Dict[int, int]) -> None:
    """Recovery: drop staged entries naming bytes past the end of a (power-loss shortened) segment."""
    db = unit.db_restore
    if db is None:
        return
    drop = [bytes(k) for k, v in txn.cursor(db) if bytes(k)[UR.TOKEN_BYTES] == UR.RESTORE_STAGED
            and Loc.unpack(v).seg in short and Loc.unpack(v).offset + Loc.unpack(v).length > short[Loc.unpack(v).seg]]
    for k in drop:
        txn.delete(k, db=db)


UNIT_RESTORE_CALLS = {"import_restore": import_restore, "publish_restore": publish_restore,
                      "unpublish_restore": unpublish_restore, "settle_restore": settle_restore,
                      "restore_tags": restore_tags}


def install_restore_calls(cls: type) -> None:
    """Give the unit class ``cls`` the UnitPort methods of selective restores."""
    for name, fn in UNIT_RESTORE_CALLS.items():
        setattr(cls, name, fn)


__all__ = ["RESTORE_DB", "restore_db", "has_entries", "live_entries", "install_restore_calls", "UNIT_RESTORE_CALLS"]
