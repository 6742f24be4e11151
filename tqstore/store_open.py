"""Opening and closing a store's parts consistently: the reconciliation on open and the
clean-close marker that lets an open skip its scans (docs/FORMAT.md, "Clean close").

Reconciliation (DESIGN.md §3) makes the units agree with the controller after anything a
crash can leave: unit entries no controller row claims (a put whose controller commit
never happened) are dropped, produced fields whose payload no unit holds any more (a power
loss with ``durability="checkpoint"``) are forgotten.  It reads every unit's index keys
and every row's produced fields: O(rows).

A store that closes cleanly records that no reconciliation is needed: after every unit
index is flushed to disk, the controller commits (and flushes) ``meta/clean``, a digest
of each unit's entry count and commit counter together with the controller's own commit
counter.  The next open removes the marker durably before anything is written, and skips
the scans only when

* the marker was there and no commit of the controller came after it,
* every unit's index answers the same entry count and commit counter (nothing changed a
  unit since, its recovery on open included: a segment a power loss shortened makes the
  unit drop entries, which is a commit), and
* every unit holds exactly as many entries as the controller claims on it (units hold a
  superset of the claims whenever no power loss intervened, so equal counts are equal
  sets: the failed writes of the last session left no orphan).

Otherwise (a crash, a power loss, a failed write, an index changed behind the store's
back) it reconciles as before.  Everything here goes through the ports.
"""
from __future__ import annotations

import atexit
import logging
import os
import weakref
from collections import defaultdict
from typing import TYPE_CHECKING, Dict, List, Set, Tuple

import numpy as np

from ._format.controller_records import units_digest
from ._io import files
from .dump.restore import settle_at_open
from .errors import TqstoreError
from .ports import UnitPort

if TYPE_CHECKING:  # pragma: no cover
    from .store import Store

log = logging.getLogger("tqstore")


def reconcile(store: "Store") -> bool:
    """Settle what a crash left (undo records, selective restores) and reconcile the units
    with the controller unless the clean-close marker vouches for them.  Returns True when
    the full reconciliation ran.  Raises what the ports raise (TqstoreError)."""
    mark = store.controller.take_clean()  # first: removed durably before anything is written
    states = [u.index_state() for u in store.units] if mark is not None else []
    store._settle_undo()
    settle_at_open(store.controller, store.units)  # selective restores a crash left (before the unit entries)
    if mark is not None and mark == units_digest(states) and \
            [e for e, _ in states] == store.controller.claim_counts():
        log.debug("store %s was closed cleanly: reconciliation skipped", store.root)
        return False
    if mark is not None:
        log.info("store %s: the clean-close marker does not match its indexes; reconciling", store.root)
    full_reconcile(store)
    return True


def full_reconcile(store: "Store") -> None:
    """Drop unit entries no controller row claims; forget claims no unit can serve."""
    missing: Dict[int, Set[str]] = defaultdict(set)

    def one(u: UnitPort) -> Tuple[int, Dict[int, Set[str]]]:  # per field, in sorted-array operations
        claims = store.controller.claim_rows(u.unit_id)  # field -> gidxs of this unit's rows that have it
        present = u.field_rows()  # field -> gidxs the unit holds
        n_orphan = 0
        for f, held in present.items():
            orphan = np.setdiff1d(held, claims.get(f, held[:0]), assume_unique=True)
            if len(orphan):
                n_orphan += len(orphan)
                u.delete(orphan.tolist(), [f])
        lost: Dict[int, Set[str]] = defaultdict(set)
        for f, want in claims.items():
            for g in np.setdiff1d(want, present.get(f, want[:0]), assume_unique=True).tolist():
                lost[g].add(f)
        return n_orphan, lost

    for n_orphan, lost in store._pool.map(one, store.units):
        if n_orphan:
            log.info("reconcile: dropped %d unit entries of unacknowledged writes", n_orphan)
        for g, fs in lost.items():
            missing[g] |= fs
    if missing:
        log.warning("reconcile: %d rows lost fields their units no longer hold (power loss without "
                    "durability='commit'?); those fields are marked not produced", len(missing),
                    extra={"tqstore_lost_data": True})
        store.controller.drop_fields(missing)


def mark_clean(store: "Store") -> bool:
    """At close, with no write in flight: flush every unit index, then record the clean-close
    marker in the controller.  Nothing is recorded (False) while an overwriting put or a
    selective restore is unsettled, or when a unit holds another number of entries than the
    controller claims (a failed write left orphans: the next open reconciles).  Errors are
    logged, never raised: without the marker the next open reconciles."""
    try:
        if store.controller.restores() or any(u.undo_tokens() for u in store.units):
            return False
        states: List[Tuple[int, int]] = [u.index_state(sync=True) for u in store.units]
        if [e for e, _ in states] != store.controller.claim_counts():
            log.info("store %s: units hold entries no row claims; the next open reconciles", store.root)
            return False
        store.controller.mark_clean(units_digest(states))
        return True
    except TqstoreError as e:
        log.warning("store %s: could not record a clean close (%s); the next open reconciles", store.root, e)
        return False


_TEMPORARY: "weakref.WeakSet[Store]" = weakref.WeakSet()


def remove_at_exit(store: "Store") -> None:
    """Close (and so remove) the temporary store ``store`` when Python exits, if it is still
    open then: a script that never called ``close`` left its store's files in the temporary
    directory, whatever their size, run after run.  (The exit hook is registered again here,
    so that it runs before those registered earlier: ``ray.shutdown``'s, which ended a Ray
    store's actors before its close; after Python waited for its threads.)"""
    _TEMPORARY.add(store)
    atexit.unregister(_remove_temporaries)
    atexit.register(_remove_temporaries)


def _remove_temporaries() -> None:
    for store in list(_TEMPORARY):
        try:
            store.close()
        except Exception as e:  # noqa: BLE001 - at exit: its files go all the same, the others are still removed
            log.debug("temporary store %s did not close at exit (%s); removing its files", store.root, e)
            files.rmtree(store.root, ignore_errors=True)
            if os.path.lexists(store.root):
                log.warning("could not remove temporary store %s at exit: %s", store.root, e)

__all__ = ["reconcile", "full_reconcile", "mark_clean", "remove_at_exit"]
