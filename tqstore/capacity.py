"""Row capacity: TransferQueue's ``backend.SimpleStorage.total_storage_size``, enforced.

TransferQueue's meaning (its ``simple_storage_bootstrap`` and ``StorageUnitData.put_data``):
the store holds at most ``total_storage_size`` *rows with data*; each of the ``N`` storage
units holds at most ``ceil(total_storage_size / N)`` of them, and row ``g`` lives on unit
``g % N`` (tqstore's routing is the same).  A row counts from its first stored field until
it is cleared; adding fields to a row that already holds data, and rows reserved by
``get_meta(mode="insert")`` or keys created with a tag only (no data yet), do not count.
So, as with TransferQueue, a put can be refused while the store as a whole holds fewer
than ``total_storage_size`` rows, when its rows fall unevenly on the units.

A put that would take any unit past its share raises :class:`~tqstore.errors.CapacityError`
(``setting="total_storage_size"``) before anything is written; so does a load by key
(:meth:`room` is what its ``begin_restore`` checks against), and the rows with data a
running load will add are held in reserve (:meth:`reserving`) until it commits, so that
puts and other loads meanwhile cannot take their room.  A restore left pending (by an error
its load could not undo, or a crash) holds none: ``recover_data_load`` checks the room
again before completing it.  The per-unit counts are
values from the controller port (``claims``, counted once per controller and again after a
partition is dropped) kept up to date by the store's puts and clears, all under the
store's write lock.
"""
from __future__ import annotations

import contextlib
import logging
import math
from collections import Counter
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence

from ._format.names import as_int
from .errors import CapacityError, ConfigError
from .ports import ControllerPort, rows_gaining_data

log = logging.getLogger("tqstore")


class RowCapacity:
    """The row limit of one store (module docstring).

    Args:
        total_rows: ``total_storage_size``: rows with data the whole store may hold (>= 1).
        num_units: the store's unit count (see :meth:`for_units`).

    Raises:
        ConfigError: ``total_rows`` is not a positive int.
    """

    def __init__(self, total_rows: int, num_units: int = 1) -> None:
        rows = as_int(total_rows)  # (a numpy integer too, as num_units takes)
        if rows is None or rows < 1:
            raise ConfigError(f"total_storage_size must be a positive int (rows) or None, got {total_rows!r}")
        self.total_rows = rows
        self.for_units(num_units)

    def for_units(self, num_units: int) -> "RowCapacity":
        """Apply to a store of ``num_units`` units (known once it is open); returns self."""
        self.num_units = num_units
        self.per_unit = math.ceil(self.total_rows / num_units)
        self._held: Optional[List[int]] = None  # rows with data per unit; None: count again
        self._of: Optional[ControllerPort] = None  # the controller the counts are of
        self._reserved: Dict[str, Dict[int, int]] = {}  # running load's restore id -> rows with data it adds per unit
        return self

    def held(self, controller: ControllerPort) -> List[int]:
        """Rows with data per unit (counted through the port when not known for ``controller``)."""
        if self._held is None or self._of is not controller:
            self._held = [sum(1 for fs in controller.claims(u).values() if fs) for u in range(self.num_units)]
            self._of = controller
        return self._held

    def check(self, controller: ControllerPort, pid: str, plan: Any) -> Dict[int, int]:
        """The rows a planned put adds per unit; raises CapacityError when a unit would pass
        its share.  Nothing is changed (see :meth:`commit`)."""
        new = {r.gidx for r in plan.new_rows}
        old = [g for g in plan.gidxs if g not in new]
        empty: List[int] = []
        if old:
            rows = controller.row_batch(pid, old)
            empty = [g for g, fs in zip(old, rows.fields if rows is not None else []) if not fs]
        grow = Counter(g % self.num_units for g in list(new) + empty)
        self.check_grow(controller, grow)
        return dict(grow)

    def _taken(self, controller: ControllerPort) -> List[int]:
        """Per unit, rows with data held plus those running loads hold in reserve."""
        taken = list(self.held(controller))
        for grow in self._reserved.values():
            for u, n in grow.items():
                taken[u] += n
        return taken

    def room(self, controller: ControllerPort) -> List[int]:
        """Per unit, how many more rows with data it may hold (a load by key checks against it;
        negative when a unit is past its share, say after a reopen with a smaller limit)."""
        return [self.per_unit - t for t in self._taken(controller)]

    def restore_growth(self, controller: ControllerPort, pid: str, gidxs: Sequence[int],
                       fields: Sequence[Sequence[str]]) -> Dict[int, int]:
        """Per unit, the rows with data a restore adds to ``pid`` once committed: its rows
        ``gidxs`` with produced ``fields`` that are not rows of ``pid`` yet, or rows without data."""
        with_data = [int(g) for g, fs in zip(gidxs, fields) if fs]
        return rows_gaining_data(with_data, controller.row_batch(pid, with_data) if with_data else None,
                                 self.num_units)

    @contextlib.contextmanager
    def reserving(self, rid: str, grow: Mapping[int, int]) -> Iterator[None]:
        """Hold ``grow`` (unit -> rows with data) for the running load of restore ``rid`` until
        :meth:`release` or the end of the ``with`` body: puts and other loads meanwhile count
        it (under the store's write lock, as every check)."""
        self._reserved[rid] = dict(grow)
        try:
            yield
        finally:
            self.release(rid)

    def release(self, rid: str) -> None:
        """The load of restore ``rid`` committed (its rows are counted as held now) or ended."""
        self._reserved.pop(rid, None)

    def check_grow(self, controller: ControllerPort, grow: Mapping[int, int]) -> None:
        """Raise CapacityError when adding ``grow`` (unit -> rows with data) takes a unit past its
        share (rows running loads hold in reserve count as held)."""
        held = self._taken(controller)
        for u, n in sorted(grow.items()):
            if held[u] + n > self.per_unit:
                raise CapacityError(
                    f"Storage capacity exceeded: unit {u} holds {held[u]} rows with data, the put adds {n}, its "
                    f"share is {self.per_unit} (total_storage_size={self.total_rows} over {self.num_units} units; "
                    f"clear rows or raise total_storage_size)", setting="total_storage_size")

    def check_sum(self, controller: ControllerPort, grows: Sequence[Dict[int, int]]) -> None:
        """Raise CapacityError when the planned puts ``grows`` (each :meth:`check`'s answer)
        together would take a unit past its share.  Nothing is changed."""
        total: Counter = Counter()
        for g in grows:
            total.update(g)
        self.check_grow(controller, total)

    def commit(self, grow: Dict[int, int]) -> None:
        """A put planned by :meth:`check` was committed."""
        if self._held is not None:
            for u, n in grow.items():
                self._held[u] += n

    def holding(self, controller: ControllerPort, pid: str, gidxs: Sequence[int]) -> List[int]:
        """Which of ``gidxs`` (rows of ``pid``) hold data now (asked before they are cleared)."""
        rows = controller.row_batch(pid, list(gidxs))
        if rows is None:
            return []
        return [g for g, fs in zip(rows.gidxs, rows.fields) if fs]

    def cleared(self, holding: Sequence[int], gone: Sequence[int]) -> None:
        """Rows were cleared: ``gone`` (the ones removed) of ``holding`` (those that held data)."""
        if self._held is None:
            return
        gone_set = set(gone)
        for g in holding:
            if g in gone_set:
                self._held[g % self.num_units] -= 1

    def forget(self) -> None:
        """Count again at the next put (a partition was dropped, or a write failed midway)."""
        self._held = None

    def __repr__(self) -> str:
        return f"RowCapacity(total_rows={self.total_rows}, num_units={self.num_units})"


__all__ = ["RowCapacity"]
