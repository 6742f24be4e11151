"""Replacing a store's whole live state transactionally (``Store.install_state``).

The new state is built in ``state-N+1/`` beside the live one, fsynced, opened (which
validates it), and switched in with one atomic rename of the ``CURRENT`` pointer.  Any
failure before the switch removes the new directory and leaves the live store exactly
as it was; a crash in between is settled on the next open (an abandoned ``state-N``
directory is removed).  The replaced state is removed in the background once the switch
is done (:func:`retire_state`): nothing refers to it any more.  Right before the switch
the new controller's sequence numbers are raised past the replaced one's
(``ControllerPort.raise_seq_floor``), so a BatchMeta of the replaced state names no row put
after the switch.
"""
from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

from . import layout_dirs as L
from ._io import files
from .ports import check_no_restore

if TYPE_CHECKING:  # pragma: no cover
    from .store import Store

log = logging.getLogger("tqstore")


class EarlyParts:
    """What ``install_state(..., early_open=True)`` hands its build: :meth:`open_controller`
    opens the new state's controller as soon as the build has staged it, so the open (every
    entry decoded and checked) runs beside the build's remaining work (the units' staging and
    CRC checks) instead of after it.  The controller opened here is the one switched in; on any
    failure before the switch it is closed with the new state."""

    def __init__(self, store: "Store", new_dir: Path) -> None:
        self._store = store
        self._dir = new_dir
        self._lock = threading.Lock()
        self.controller: Any = None

    def open_controller(self) -> None:
        """Open the controller of the new state (once; any thread).  Call it only when the
        build has finished writing the controller's directory.  Raises what the open raises
        (CorruptionError naming the staged file for a damaged index)."""
        with self._lock:
            if self.controller is None:
                self.controller = self._store._open_controller(self._dir)

    def close(self) -> None:
        """Close an opened controller (after a failure before the switch)."""
        with self._lock:
            c, self.controller = self.controller, None
        if c is not None:
            c.close()


def install_state(store: "Store", build: Callable[..., Any], *, reconcile: bool = True,
                  before_switch: Optional[Callable[[], Any]] = None, early_open: bool = False) -> Any:
    """See :meth:`Store.install_state` (its guarantees and arguments)."""
    store._check_open()
    with store._write_lock, store._meta_lock:
        store._check_open()
        check_no_restore(store.controller, None, "replacing the whole store (a checkpoint load)")
        cur = L.parse_state_name(store.state_dir.name)
        new_dir = store.root / L.state_name(cur + 1)
        if new_dir.exists():
            files.rmtree(new_dir)
        early = EarlyParts(store, new_dir) if early_open else None
        try:
            files.mkdir(new_dir)
            result = build(new_dir, early) if early is not None else build(new_dir)
            files.fsync_tree(new_dir)
            files.fsync_dir(store.root)
            old = (store.controller, store.units, store.state_dir)
            try:
                store._open_parts(new_dir, controller=early.controller if early is not None else None)
            except BaseException:
                store.controller, store.units, store.state_dir = old
                raise
            early = None  # the opened controller is part of ``new`` now
            new = (store.controller, store.units)
            store.controller, store.units = old[0], old[1]
            try:
                # past every sequence number of the replaced state: its BatchMetas (gidx, seq) match
                # no row put after the switch, though the loaded state gives their gidxs again
                new[0].raise_seq_floor(old[0].seq_high())
                if before_switch is not None:
                    before_switch()
                L.write_current(store.root, new_dir.name)
            except BaseException:
                for u in new[1]:
                    u.close()
                new[0].close()
                raise
        except BaseException:
            if early is not None:
                early.close()
            files.rmtree(new_dir, ignore_errors=True)
            raise
        with store.removals.removing():  # (a read racing the switch tries again: tqstore.read_guard)
            try:
                store._close_parts()
            except Exception as e:  # noqa: BLE001 - CURRENT names the new state: the switch stands
                log.warning("closing the parts of the replaced state %s failed (%s); the new state is in place",
                            old[2], e)
            store.controller, store.units, store.state_dir = new[0], new[1], new_dir
            store._data.rebind(store.controller)
        retire_state(store, old[2])
        if reconcile:
            store._reconcile()
        return result


def retire_state(store: "Store", old_dir: Path) -> None:
    """Remove ``old_dir``, a state the store no longer refers to (``CURRENT`` names another),
    in a background thread: freeing its files' blocks (copies of hundreds of MiB) is not the
    caller's wait.  ``Store.close`` joins these threads before it releases the store's lock;
    a directory a crash or an exit left behind is removed by the next open (it is not the
    ``CURRENT`` state).  Raises nothing (a failure is logged)."""
    def run() -> None:
        try:
            files.rmtree(old_dir)
        except OSError as e:
            log.warning("could not remove the replaced state %s (removed on next open): %s", old_dir, e)
        except BaseException as e:  # noqa: BLE001 - a simulated crash (tests) ends this thread quietly
            log.debug("removal of the replaced state %s stopped: %r", old_dir, e)

    t = threading.Thread(target=run, name="tqstore-retire", daemon=True)
    store._retiring = [r for r in store._retiring if r.is_alive()] + [t]
    t.start()


def join_retired(store: "Store") -> None:
    """Wait until every replaced state of ``store`` is removed (before its lock is released)."""
    for t in store._retiring:
        t.join()
    store._retiring = []
