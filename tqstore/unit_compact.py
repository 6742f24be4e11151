"""Compaction of a storage unit (:meth:`tqstore.unit.Unit.compact`): the live frames of chosen
sealed segments are copied byte for byte (each checked) into the active segment, their index
entries moved in one transaction, then the emptied segments unlinked.  The unit's location
cache (:mod:`tqstore.unit_locs`) is told the new locations.

Which segments (sealed, no snapshot pins them, holding frames):

* *mostly dead*: live bytes below ``live_ratio`` of their frame bytes (``Store.compact``);
* *small*: fewer live bytes than ``segment_bytes // SMALL_FRACTION``, merged when at least
  ``merge_small`` of them exist, the smallest first, at most ``budget`` live bytes in one
  go.  Every snapshot (checkpoint save, dump) seals the active segment, so a store that
  keeps its rows grows one segment per unit and save; when the last snapshot of a unit is
  released, the unit merges its small segments once it holds ``MERGE_AT`` of them
  (:func:`merge_after_release`), so that the number of segment files, and the time of a
  save that links them, follows the bytes stored, not the number of saves.

A failure leaves the index as it was: the transaction aborts and the active segment's
unindexed tail is dropped as after any failed write (``Unit._after_failure``).
"""
from __future__ import annotations

import logging
from typing import Dict, List, Optional, Tuple

import numpy as np

from ._format.frame import check_run, first_fault
from ._format.index import INDEX_KEY_HEAD, LOC_DTYPE
from ._format.lmdb_pages import Packed
from ._format.layout import SEGMENT_HEADER_SIZE
from ._format.segment import segment_name
from ._io.lmdbenv import read_columns, wrap_errors
from .unit_locs import write_sets
from .unit_restore import has_entries as _restore_entries

log = logging.getLogger("tqstore")

#: a sealed segment with fewer live bytes than ``segment_bytes // SMALL_FRACTION`` is small
SMALL_FRACTION = 16
#: the number of small segments at which the release of a unit's last snapshot merges them
MERGE_AT = 16
#: the most live bytes such a merge moves at once: ``segment_bytes // MERGE_BUDGET_FRACTION``
MERGE_BUDGET_FRACTION = 4


def compact(unit, live_ratio: float, *, merge_small: int = 2, budget: Optional[int] = None) -> int:
    """See :meth:`tqstore.unit.Unit.compact` (``unit`` is the Unit).  ``merge_small``: the
    number of small segments from which they are merged too (0: never); ``budget``: the most
    live bytes of small segments moved (None: no bound).  Returns the segments compacted."""
    with unit._lock, wrap_errors(f"unit {unit.unit_id} compact", unit.path):
        if unit.undo_tokens() or _restore_entries(unit):
            return 0  # an unsettled overwriting put or restore may still put frames back
        victims = _victims(unit, unit._load_segs(), live_ratio, merge_small, budget)
        if not victims:
            return 0
        moved = _move(unit, victims)
        unit._after_change()
        log.info("unit %d: compacted %d segments (%d frames moved)", unit.unit_id, len(victims), moved)
        return len(victims)


def merge_after_release(unit) -> int:
    """The merge of small segments when a unit's last snapshot is released (see the module's
    docstring); a failure is logged, not raised (the index is unchanged).  Returns the
    segments merged."""
    with unit._lock:
        if unit._views:  # (another snapshot still pins segments; its release merges)
            return 0
        try:
            return compact(unit, 0.0, merge_small=MERGE_AT,
                           budget=max(1, unit.segment_bytes // MERGE_BUDGET_FRACTION))
        except Exception as e:  # noqa: BLE001 - the release itself succeeded; the next one tries again
            log.warning("unit %d: merging small segments failed (nothing changed): %s", unit.unit_id, e)
            return 0


def _victims(unit, segs, live_ratio: float, merge_small: int, budget: Optional[int]) -> List[int]:
    free = {s: i for s, i in segs.items() if i.sealed and not unit._pins.get(s) and i.size > SEGMENT_HEADER_SIZE}
    out = [s for s, i in free.items() if i.live < live_ratio * (i.size - SEGMENT_HEADER_SIZE)]
    limit = max(1, unit.segment_bytes // SMALL_FRACTION)
    taken = set(out)
    small = sorted((i.live, s) for s, i in free.items() if s not in taken and 0 < i.live < limit)
    if merge_small and len(small) >= merge_small:
        left = budget
        for live, s in small:
            if left is not None:
                if live > left:
                    break
                left -= live
            out.append(s)
    return sorted(out)


def _entries(unit, victims: List[int]) -> Tuple[List[bytes], np.ndarray]:
    """The index keys and ``LOC_DTYPE`` locations of every frame in ``victims``, read in bulk
    from the index's pages when they read that way, else entry by entry.  Call under the
    unit's lock (no commit can come between this read and the caller's write)."""
    want = np.asarray(victims, np.uint32)
    with unit.env.begin(buffers=False) as txn:
        cols = read_columns(unit.env, txn, [b"loc"])
        if cols is not None:
            c = cols.get(b"loc")
            if c is None or not len(c):
                return [], np.zeros(0, LOC_DTYPE)
            locs = np.frombuffer(c.values, LOC_DTYPE)
            pick = np.flatnonzero(np.isin(locs["seg"], want))
            return Packed(c.keys, c.key_lens).take(pick), locs[pick].copy()
        keys, vals = [], []
        vset = set(victims)
        for k, v in txn.cursor(unit.db_loc):
            loc = np.frombuffer(v, LOC_DTYPE)
            if int(loc["seg"][0]) in vset:
                keys.append(bytes(k))
                vals.append(bytes(v))
        return keys, np.frombuffer(b"".join(vals), LOC_DTYPE).copy() if vals else np.zeros(0, LOC_DTYPE)


def _checked_views(unit, keys: List[bytes], locs: np.ndarray) -> List[memoryview]:
    """Each frame's bytes in its (mapped) segment, every frame checked first (structure,
    CRC32C against the index, the row its key names).  Raises CorruptionError."""
    gidx = np.array([INDEX_KEY_HEAD.unpack_from(k)[0] for k in keys], np.uint64)
    views: List[Optional[memoryview]] = [None] * len(keys)
    for s in np.unique(locs["seg"]).tolist():
        i = np.flatnonzero(locs["seg"] == s)
        sub = locs[i]
        m = unit.maps.get(s, int((sub["offset"] + sub["length"]).max()))
        res = check_run(m, sub, gidx[i])
        bad = first_fault(m, sub, res, gidx[i])
        if bad is not None:
            k, fault = bad
            raise fault.error(path=str(unit.path / segment_name(s)), offset=int(sub["offset"][k]))
        mv = memoryview(m)
        for j, off, ln in zip(i.tolist(), sub["offset"].tolist(), sub["length"].tolist()):
            views[j] = mv[off:off + ln]
    return views  # type: ignore[return-value]


def _move(unit, victims: List[int]) -> int:
    keys, locs = _entries(unit, victims)
    bufs = _checked_views(unit, keys, locs) if keys else []
    try:
        with unit._appending() as txn:
            w = unit._active(txn)
            start = w.size
            if bufs:
                w.append(bufs)
                if unit.sync:
                    w.fsync()
            new = locs.copy()
            new["seg"] = w.seg_id
            new["offset"] = start + np.cumsum(locs["length"].astype(np.int64)) - locs["length"]
            items = list(zip(keys, new.view(np.dtype((np.void, LOC_DTYPE.itemsize))).tolist()))
            if items:
                txn.cursor(unit.db_loc).putmulti(items)
            unit._grown(txn, w.seg_id, int(locs["length"].sum()))
            for s in victims:
                i = unit._get_seg(txn, s)
                i.live = 0
                unit._put_seg(txn, s, i)
            wid = txn.id()
    finally:
        del bufs  # (the segments' mappings may be closed once the emptied segments go)
    unit.locs.committed(wid, lambda: write_sets([], items))
    return len(items)
