"""A storage unit's snapshots (MVCC cuts; :class:`UnitSnapshots`, a mixin of
:class:`~tqstore.unit.Unit`): sealing the active segment, pinning the segments a snapshot's
read transaction names so that none is unlinked under it, and the release that unpins them
(the release of a unit's last snapshot merges its small segments:
:func:`tqstore.unit_compact.merge_after_release`).
"""
from __future__ import annotations

from typing import Dict, Iterable, Optional

from ._format.layout import SEGMENT_HEADER_SIZE
from ._io.lmdbenv import wrap_errors
from .errors import InvalidInputError
from .unit_compact import merge_after_release
from .unit_read import UnitView


class UnitSnapshots:
    """A mixin of :class:`~tqstore.unit.Unit` (needs ``_lock``, ``env``, ``db_segs``, ``locs``,
    ``_writer``, ``_pins``, ``_views``, ``_next_snapshot``, ``_maybe_dead``, ``_seal_writer``,
    ``_seg_id`` and ``_after_change``)."""

    def seal(self) -> Optional[int]:
        """Seal the active segment (if any holds frames). Returns its id or None."""
        with self._lock, wrap_errors(f"unit {self.unit_id} seal", self.path):
            w = self._writer
            if w is None:
                return None
            if w.size <= SEGMENT_HEADER_SIZE:
                return None
            with self.env.begin(write=True) as txn:
                self._seal_writer(txn)
                wid = txn.id()
            self.locs.committed(wid)  # (no location changed)
            return w.seg_id

    def snapshot(self) -> int:
        """Seal the active segment and open a read transaction pinned to its segments; returns
        the snapshot's id (for ``keys``, ``lookup``, ``locate`` and :meth:`release`).

        Call under the store's cut lock. Release the snapshot when done.
        """
        with self._lock:
            self.seal()
            txn = self.env.begin(buffers=False)
            try:
                seg_ids = [self._seg_id(k) for k in txn.cursor(self.db_segs).iternext(values=False)]
            except BaseException:  # a malformed key: the cut fails, nothing pinned
                txn.abort()
                raise
            for s in seg_ids:
                self._pins[s] += 1
            sid = self._next_snapshot
            self._next_snapshot += 1
            self._views[sid] = UnitView(self, txn, seg_ids)
            return sid

    def release(self, snapshot: int) -> None:
        """Unpin a snapshot (idempotent).  The release of the last one merges the unit's small
        segments once there are many (:func:`tqstore.unit_compact.merge_after_release`)."""
        with self._lock:
            view = self._views.pop(snapshot, None)
        if view is not None:
            view.release()
            merge_after_release(self)

    def _view(self, snapshot: int) -> UnitView:
        """The read transaction and segment records of a snapshot (never leaves the unit)."""
        with self._lock:
            v = self._views.get(snapshot)
        if v is None:
            raise InvalidInputError(f"unit {self.unit_id}: snapshot {snapshot!r} is unknown or released")
        return v

    def _snapshot_txn(self, snapshot: int):
        return self._view(snapshot).txn

    def _unpin(self, segs: Iterable[int]) -> None:
        with self._lock:
            for s in segs:
                self._pins[s] -= 1
                if self._pins[s] <= 0:
                    del self._pins[s]
                    self._maybe_dead.add(s)
        self._after_change()

    def pinned(self) -> Dict[int, int]:
        return dict(self._pins)
