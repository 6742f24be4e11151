"""Settling the undo records of overwriting puts (a mixin of :class:`~tqstore.store.Store`).

An overwriting put keeps, on each unit it wrote, what it replaced in undo records until the
controller's commit decides it; then every unit *settles* (committed: the replaced frames
become dead; not committed: the replaced entries are put back).  A settle that fails (a full
disk, an I/O error) leaves its records; they are settled, by the controller's put token,
before the next put or clear of the store (:meth:`UndoSettling._settle_first`: that call
raises the settle's StorageIOError and does nothing else while it keeps failing), before
a load by key, and at open.  Meanwhile a unit whose put-back failed gives reads the
replaced entries (:mod:`tqstore.unit_held`), so no read returns a failed put's values.
"""
from __future__ import annotations

import logging
from typing import Optional, Sequence

from .errors import TqstoreError

log = logging.getLogger("tqstore")


class UndoSettling:
    """Needs ``units``, ``num_units`` and ``controller`` of the Store."""

    _unsettled = False  # a settle failed since the last one that settled everything

    def _settle_units(self, token: int, *, committed: bool, units: Optional[Sequence[int]] = None) -> None:
        """Settle an overwriting put on the units (a failure is logged, and settled before the
        next put or clear, and on open)."""
        for u in (range(self.num_units) if units is None else units):
            try:
                self.units[u].settle(token, committed=committed)
            except TqstoreError as e:  # (logged without a traceback: the put raises its own error)
                self._unsettled = True
                log.error("unit %d: could not settle put %d (settled before the next put or clear, or on reopen): %s",
                          u, token, e)

    def _settle_undo(self) -> None:
        """Settle undo records left by a crash or a failed settle: committed iff the controller
        recorded their token.  Raises StorageIOError when a settle fails (they stay)."""
        for u in self.units:
            for t in u.undo_tokens():
                u.settle(t, committed=t <= self.controller.put_token)
        self._unsettled = False

    def _settle_first(self) -> None:
        """Before a put or a clear: settle what a failed settle left (under the write lock)."""
        if self._unsettled:
            self._settle_undo()


__all__ = ["UndoSettling"]
