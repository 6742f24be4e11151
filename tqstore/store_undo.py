"""A put's writes to the units, rolled back on the others when one fails, and the settling
of the undo records of overwriting puts (a mixin of :class:`~tqstore.store.Store`).

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
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ._format.columns import Column, approx_bytes as _approx_bytes
from .errors import StorageIOError, TqstoreError
from .reader import PARALLEL_MIN_BYTES  # (a put of at least this many bytes writes its units in parallel)

log = logging.getLogger("tqstore")



class UndoSettling:
    """Needs ``units``, ``num_units``, ``controller``, ``root`` and ``_pool`` of the Store."""

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

    def _write_units(self, plan: Any, cols: List[Column], token: Optional[int] = None) -> None:
        g_all = np.asarray(plan.gidxs, dtype=np.int64)
        owner = g_all % self.num_units
        per_unit: Dict[int, Tuple[List[int], List[int]]] = {}
        for u in (np.unique(owner).tolist() if self.num_units > 1 else [0] if len(g_all) else []):
            pos = np.flatnonzero(owner == u) if self.num_units > 1 else np.arange(len(g_all))
            per_unit[u] = (pos.tolist(), g_all[pos].tolist())
        fresh = not plan.overwrites

        def one(u: int):
            positions, gs = per_unit[u]
            return self.units[u].write([(c, positions, gs) for c in cols], fresh=fresh, token=token)

        errors = []
        if len(per_unit) > 1 and _approx_bytes(cols) >= PARALLEL_MIN_BYTES:
            futures = {}
            for u in per_unit:  # (a refused hand-over is that unit's error: the others' writes are undone below)
                try:
                    futures[u] = self._pool.submit(one, u)
                except BaseException as e:  # noqa: BLE001 - collected and re-raised below
                    errors.append((u, e))
            for u, fut in futures.items():
                try:
                    fut.result()
                except BaseException as e:  # noqa: BLE001 - collected and re-raised below
                    errors.append((u, e))
        else:  # a small put: handing it to the pool costs more than it saves
            for u in per_unit:
                try:
                    one(u)
                except BaseException as e:  # noqa: BLE001 - collected and re-raised below
                    errors.append((u, e))
        if errors:
            if token is not None:  # put back the entries the units that succeeded replaced
                self._settle_units(token, committed=False, units=[u for u in per_unit if u not in dict(errors)])
            # undo entries of rows that did not exist before on units that succeeded
            new = set(plan.new_gidxs)
            for u in per_unit:
                if u not in dict(errors) and new:
                    try:
                        self.units[u].delete([g for g in per_unit[u][1] if g in new])
                    except TqstoreError as e:  # (the put's own error is raised: this one is logged, no traceback)
                        log.error("could not undo a partial write on unit %d (reopen reconciles it): %s", u, e)
            u, e = errors[0]
            if isinstance(e, TqstoreError) or not isinstance(e, Exception):  # (KeyboardInterrupt stays one)
                raise e
            raise StorageIOError(f"write to unit {u} of {self.root} failed: {e}") from e


__all__ = ["UndoSettling"]
