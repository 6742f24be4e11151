"""Opening a unit: its index format marker, its segment records, and recovery — make disk
agree with the index after a crash or power loss (torn tails cut, stray segment files
removed, entries past a shortened segment dropped, live-byte counts recomputed).

Functions of :class:`~tqstore.unit.Unit` (its state stays in the unit's own fields);
the unit calls them while it opens.
"""
from __future__ import annotations

import logging
import os
import stat
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Sequence, Tuple

import lmdb

from ._format import unit_records as UR
from ._format.index import Loc
from ._format.layout import SEGMENT_HEADER_SIZE
from ._format.segment import decode_segment_header, parse_segment_name, segment_name
from ._format.unit_records import SegInfo
from ._io import files
from ._io.lmdbenv import open_env, sync_env, wrap_errors
from ._io.segfile import SegmentWriter
from .errors import CorruptionError, FormatVersionError
from .unit_restore import drop_staged_past, live_entries

if TYPE_CHECKING:  # pragma: no cover
    from .unit import Unit

log = logging.getLogger("tqstore")


def check_index_present(unit_dir: Path, unit_id: int) -> None:
    """Before a unit opens: its index file must exist when the unit holds segment files (a
    segment is only ever written after its index was created).  An index lost with them
    there (deleted by hand, a damaged disk) would open empty and its frames be removed as
    unnamed debris: CorruptionError instead, nothing removed."""
    index = unit_dir / "index" / "data.mdb"
    if os.path.lexists(index) or not os.path.isdir(unit_dir):
        return
    segs = sorted(n for n in files.listdir(unit_dir) if parse_segment_name(n) is not None)
    if segs:
        raise CorruptionError(f"unit {unit_id}: its index file index/data.mdb is missing but the unit holds "
                              f"{len(segs)} segment file(s) ({segs[0]}, ...); nothing was removed: load the "
                              f"store's last checkpoint into a new store", path=str(index))


def check_index_format(env: lmdb.Environment, path: Path, *, create: bool) -> None:
    """Check (or, when ``create`` and absent, record) the unit index format version.

    The version lives under key ``format`` of the ``meta`` database.  Raises
    FormatVersionError for any version not in :data:`UNIT_INDEX_FORMATS` (1, and 2 while a
    selective restore's batch entries are in the index).
    """
    with wrap_errors("open unit index", path):
        if create:
            with env.begin(write=True) as txn:
                db = env.open_db(b"meta", txn=txn)
                raw = txn.get(UR.META_FORMAT, db=db)
                if raw is None:
                    txn.put(UR.META_FORMAT, UR.encode_format(), db=db)
                    return
        else:
            with env.begin() as txn:
                try:
                    db = env.open_db(b"meta", txn=txn, create=False)
                except lmdb.NotFoundError:
                    return  # written before the marker existed: version 1
                raw = txn.get(UR.META_FORMAT, db=db)
                if raw is None:
                    return
    try:
        version = UR.decode_format(raw)
    except UR.RecordError:
        version = None
    if version not in UR.UNIT_INDEX_FORMATS:
        raise FormatVersionError(f"unit index format {bytes(raw)[:16]!r} is not supported (reads "
                                 f"{', '.join(map(str, UR.UNIT_INDEX_FORMATS))})", path=str(path))


def seg_info(raw, seg_id, path: Path) -> SegInfo:
    """The ``segs`` record of ``seg_id`` (``raw``: its value) of the unit index at ``path``;
    CorruptionError naming the index for a malformed (or missing) one."""
    try:
        return SegInfo.unpack(raw)
    except UR.RecordError as e:
        raise CorruptionError(f"unit index: malformed segs entry of segment {seg_id}: {e} (damaged metadata: "
                              f"load the last good checkpoint into a new store)",
                              path=str(Path(path) / "index" / "data.mdb")) from e


def recover(unit: "Unit") -> None:
    """Make disk agree with the index: cut torn tails, drop stray segment files and
    index entries that point past the end of a (power-loss shortened) segment."""
    segs = unit._load_segs()
    unit._maybe_dead.update(segs)  # the first change after opening looks at every segment
    on_disk = {parse_segment_name(n): n for n in files.listdir(unit.path)}
    on_disk.pop(None, None)
    for name in on_disk.values():  # (a segment's name on something else: nothing is removed or mapped)
        if not stat.S_ISREG(os.lstat(unit.path / name).st_mode):
            raise CorruptionError(f"unit {unit.unit_id}: segment {name} is not a regular file (a directory, a "
                                  f"symbolic link or a device); nothing was removed", path=str(unit.path / name))
    for seg_id, name in on_disk.items():
        if seg_id not in segs:
            log.info("unit %d: removing segment %s not named by the index", unit.unit_id, name)
            files.unlink(unit.path / name)
    short, missing = {}, []
    for seg_id, info in segs.items():
        p = unit.path / segment_name(seg_id)
        size = p.stat().st_size if p.exists() else -1
        if size < info.size:
            short[seg_id] = max(size, 0)
            if size < 0:
                missing.append(seg_id)
    if short:
        drop_entries_past(unit, short, missing=missing)
        segs = unit._load_segs()
    check_segment_headers(unit, segs)
    active = [s for s, i in segs.items() if not i.sealed]
    if active:
        sid = max(active)
        p = unit.path / segment_name(sid)
        if p.exists():
            unit._writer = SegmentWriter(unit.path, unit.unit_id, sid, create=False, size=segs[sid].size)
        for s in active:
            if s != sid:
                unit._set_seg(s, sealed=True)

def recovery_losses(unit_dir: Path, unit_id: int) -> List[str]:
    """What :func:`recover` (and the store's reconciliation after it) would drop as lost when
    the unit at ``unit_dir`` opens, found without changing anything: the directory missing
    (an open recreates it empty), a segment file its index records that is missing or
    shorter than recorded.  Reads the index read-only (after it was walked: it is mapped
    here).  Raises nothing for damage: an index that cannot be read is left to the open."""
    if not unit_dir.is_dir():
        return [f"unit {unit_id}: its directory {unit_dir} is missing (an open recreates it empty: every field its "
                f"rows held is lost)"]
    if not (unit_dir / "index" / "data.mdb").is_file():
        return []  # (the open refuses a unit with segments and no index; an empty one lost nothing)
    try:
        env = open_env(unit_dir / "index", max_dbs=8, readonly=True, create=False)
    except Exception:  # noqa: BLE001 - the open reports it
        return []
    out: List[str] = []
    try:
        with env.begin() as txn:
            try:
                db = env.open_db(b"segs", txn=txn, create=False)
            except lmdb.NotFoundError:
                return []
            for k, v in txn.cursor(db):
                seg, size = UR.decode_seg_key(k), UR.SegInfo.unpack(v).size
                p = unit_dir / segment_name(seg)
                try:
                    st = os.lstat(p)
                except FileNotFoundError:
                    out.append(f"unit {unit_id}: segment file {p.name} is missing (its index records {size} bytes)")
                    continue
                if stat.S_ISREG(st.st_mode) and st.st_size < size:  # (anything else: the open names it)
                    out.append(f"unit {unit_id}: segment file {p.name} holds {st.st_size} bytes, its index records "
                               f"{size} (truncated)")
    except (lmdb.Error, UR.RecordError, OSError):
        return out  # (the open reports what is wrong with the index)
    finally:
        env.close()
    return out


def index_state(unit: "Unit", *, sync: bool = False) -> Tuple[int, int]:
    """``(entries, commit)``: the number of ``loc`` entries of the unit's index and its
    commit counter (LMDB's last transaction id: every committed change advances it, an
    empty transaction does not); with ``sync``, the index is flushed to disk (fsync) first,
    so that the answer describes a durable state (the store's clean close)."""
    if sync:
        sync_env(unit.env)
    with unit.env.begin() as txn:
        entries = txn.stat(unit.db_loc)["entries"]
    return int(entries), int(unit.env.info()["last_txnid"])


def check_segment_headers(unit: "Unit", segs: Dict[int, SegInfo]) -> None:
    """Reject segments of an unknown format version by name (FormatVersionError).

    A damaged header is only logged: its frames are checked on every read anyway."""
    for seg_id in segs:
        p = unit.path / segment_name(seg_id)
        try:
            with open(p, "rb") as f:
                decode_segment_header(f.read(SEGMENT_HEADER_SIZE), path=str(p))
        except FormatVersionError:
            raise
        except (OSError, CorruptionError) as e:
            log.warning("unit %d: segment header of %s does not check: %s", unit.unit_id, p.name, e)

def drop_entries_past(unit: "Unit", short: Dict[int, int], *, missing: Sequence[int] = ()) -> None:
    """Drop the index entries past the end of each segment of ``short`` (segment -> its size
    on disk; ``missing``: those of them whose file is gone)."""
    gone = sorted(missing)
    torn = sorted(s for s in short if s not in set(gone))
    what = "; ".join(x for x in (f"segments {torn} are shorter than recorded" if torn else "",
                                 f"segment files {gone} are missing" if gone else "") if x)
    log.warning("unit %d: %s (power loss?); dropping the rows past their end", unit.unit_id, what,
                extra={"tqstore_lost_data": True})
    with unit.env.begin(write=True) as txn:
        cur = txn.cursor(unit.db_loc)
        drop = [k for k, v in cur if Loc.unpack(v).seg in short
                and Loc.unpack(v).offset + Loc.unpack(v).length > short[Loc.unpack(v).seg]]
        for k in drop:
            txn.delete(k, db=unit.db_loc)
        drop_staged_past(unit, txn, short)
        for seg_id, size in short.items():
            info = unit._get_seg(txn, seg_id)
            if size < SEGMENT_HEADER_SIZE:
                txn.delete(UR.seg_key(seg_id), db=unit.db_segs)
                files.unlink(unit.path / segment_name(seg_id))
            else:
                info.size = size
                info.sealed = True
                unit._put_seg(txn, seg_id, info)
    recompute_live(unit)

def recompute_live(unit: "Unit") -> None:
    with unit.env.begin(write=True) as txn:
        live: Dict[int, int] = defaultdict(int)
        for _k, v in txn.cursor(unit.db_loc):
            loc = Loc.unpack(v)
            live[loc.seg] += loc.length
        for _k, v in txn.cursor(unit.db_undo):  # frames an unsettled put may put back
            loc = Loc.unpack(v)
            live[loc.seg] += loc.length
        for loc in live_entries(unit, txn):  # frames of selective restores not yet settled
            live[loc.seg] += loc.length
        for k, v in list(txn.cursor(unit.db_segs)):
            seg_id = UR.decode_seg_key(k)  # checked by _load_segs on open
            info = seg_info(v, seg_id, unit.path)
            info.live = live.get(seg_id, 0)
            unit._put_seg(txn, seg_id, info)
