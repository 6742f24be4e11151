"""Compaction of a storage unit (:meth:`tqstore.unit.Unit.compact`): the live frames of mostly
dead sealed segments are copied byte for byte (each checked) into the active segment, their
index entries moved in one transaction, then the emptied segments unlinked.  The unit's
location cache (:mod:`tqstore.unit_locs`) is dropped with the move: the frames' locations changed.
"""
from __future__ import annotations

import logging

from ._format.frame import decode_frame
from ._format.index import INDEX_VALUE, Loc
from ._format.layout import SEGMENT_HEADER_SIZE
from ._format.segment import segment_name
from ._io.lmdbenv import lmdb_commit_point, wrap_errors
from .unit_restore import has_entries as _restore_entries

log = logging.getLogger("tqstore")


def compact(unit, live_ratio: float) -> int:
    """See :meth:`tqstore.unit.Unit.compact` (``unit`` is the Unit)."""
    with unit._lock, wrap_errors(f"unit {unit.unit_id} compact", unit.path):
        if unit.undo_tokens() or _restore_entries(unit):
            return 0  # an unsettled overwriting put or restore may still put frames back
        segs = unit._load_segs()
        victims = [s for s, i in segs.items() if i.sealed and not unit._pins.get(s) and i.size > SEGMENT_HEADER_SIZE
                   and i.live < live_ratio * (i.size - SEGMENT_HEADER_SIZE)]
        if not victims:
            return 0
        vset = set(victims)
        with unit.env.begin(write=True) as txn:
            moving = [(bytes(k), Loc.unpack(v)) for k, v in txn.cursor(unit.db_loc) if Loc.unpack(v).seg in vset]
            w = unit._active(txn)
            start = w.size
            off = start
            bufs, items = [], []
            for k, loc in moving:
                m = unit.maps.get(loc.seg, loc.offset + loc.length)
                fr = decode_frame(m, loc.offset, loc.length, path=str(unit.path / segment_name(loc.seg)),
                                  expected_crc=loc.crc)
                bufs.append(memoryview(m)[loc.offset:loc.offset + loc.length])
                items.append((k, INDEX_VALUE.pack(w.seg_id, off, loc.length, fr.crc)))
                off += loc.length
            w.append(bufs)
            if unit.sync:
                w.fsync()
            txn.cursor(unit.db_loc).putmulti(items)
            info = unit._get_seg(txn, w.seg_id)
            info.size += off - start
            info.live += off - start
            unit._put_seg(txn, w.seg_id, info)
            for s in victims:
                i = unit._get_seg(txn, s)
                i.live = 0
                unit._put_seg(txn, s, i)
            lmdb_commit_point("unit_commit")
        unit.locs.clear()  # (it would be turned off by the commit anyway: see tqstore.unit_locs)
        del bufs
        unit._after_change()
        log.info("unit %d: compacted %d segments (%d frames moved)", unit.unit_id, len(victims), len(items))
        return len(victims)

