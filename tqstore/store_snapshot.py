"""An MVCC cut of a whole store: :class:`StoreSnapshot` (the parts' snapshot ids) and
:func:`take_cut`, which takes one on every unit and the controller.

The caller holds the store's write and metadata locks while :func:`take_cut` runs, so no
put or clear lands between the parts' snapshots; after that the cut holds segment pins
until it is released, and later puts and clears do not change what it names.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

from .errors import TqstoreError
from .ports import ControllerPort, SnapshotId, UnitPort

log = logging.getLogger("tqstore")


@dataclass
class StoreSnapshot:
    """An MVCC cut of a whole store, by ids: ``controller_snap`` resolved by ``controller``
    and ``unit_snaps[i]`` by unit ``i`` of ``ports`` (the ports the cut was taken on).

    Holds segment pins until :meth:`release` (idempotent); later puts and clears do not change it.
    """

    controller_snap: SnapshotId
    unit_snaps: List[SnapshotId]
    num_units: int
    state_dir: Path
    ports: List[UnitPort] = field(repr=False, default_factory=list)
    controller: Optional[ControllerPort] = field(repr=False, default=None)

    def release(self) -> None:
        """Release every part's snapshot, all of them even when one fails (a part gone: its
        snapshot ended with it); the first error is raised after."""
        first: Optional[BaseException] = None
        parts = ([(self.controller, self.controller_snap)] if self.controller is not None else []) + \
            list(zip(self.ports, self.unit_snaps))
        for part, sid in parts:
            try:
                part.release(sid)
            except Exception as e:  # noqa: BLE001 - raised below, once every part was released
                first = first or e
        if first is not None:
            raise first

    def release_after(self, what: str) -> None:
        """:meth:`release` at the end of ``what`` (a save, a dump), whose own outcome stands: a
        part that cannot release (it is gone, its snapshot with it) is logged, not raised."""
        try:
            self.release()
        except TqstoreError as e:
            log.warning("releasing the cut of %s failed: %s", what, e)

    def __enter__(self) -> "StoreSnapshot":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def take_cut(units: List[UnitPort], controller: ControllerPort, state_dir: Path) -> StoreSnapshot:
    """Every unit seals its active segment and pins a snapshot, then the controller opens
    its side; each is named by an id its port resolves.  Call it under the store's write and
    metadata locks.  A part failing releases the snapshots already taken (a part that cannot
    release them is logged) and raises its error."""
    snap = StoreSnapshot(None, [], len(units), state_dir, units, None)
    try:
        for u in units:
            snap.unit_snaps.append(u.snapshot())
        snap.controller_snap = controller.snapshot()
        snap.controller = controller
    except BaseException:
        snap.release_after("a cut that failed")
        raise
    return snap


__all__ = ["StoreSnapshot", "take_cut"]
