"""Replacing a store's whole live state transactionally (``Store.install_state``).

The new state is built in ``state-N+1/`` beside the live one, fsynced, opened (which
validates it), and switched in with one atomic rename of the ``CURRENT`` pointer.  Any
failure before the switch removes the new directory and leaves the live store exactly
as it was; a crash in between is settled on the next open (an abandoned ``state-N``
directory is removed).
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

from . import layout_dirs as L
from ._io import files
from .ports import check_no_restore

if TYPE_CHECKING:  # pragma: no cover
    from .store import Store

log = logging.getLogger("tqstore")


def install_state(store: "Store", build: Callable[[Path], Any], *, reconcile: bool = True,
                  before_switch: Optional[Callable[[], Any]] = None) -> Any:
    """See :meth:`Store.install_state` (its guarantees and arguments)."""
    store._check_open()
    with store._write_lock, store._meta_lock:
        store._check_open()
        check_no_restore(store.controller, None, "replacing the whole store (a checkpoint load)")
        cur = L.parse_state_name(store.state_dir.name)
        new_dir = store.root / L.state_name(cur + 1)
        if new_dir.exists():
            files.rmtree(new_dir)
        try:
            files.mkdir(new_dir)
            result = build(new_dir)
            files.fsync_tree(new_dir)
            files.fsync_dir(store.root)
            old = (store.controller, store.units, store.state_dir)
            try:
                store._open_parts(new_dir)
            except BaseException:
                store.controller, store.units, store.state_dir = old
                raise
            new = (store.controller, store.units)
            store.controller, store.units = old[0], old[1]
            try:
                if before_switch is not None:
                    before_switch()
                L.write_current(store.root, new_dir.name)
            except BaseException:
                for u in new[1]:
                    u.close()
                new[0].close()
                raise
        except BaseException:
            files.rmtree(new_dir, ignore_errors=True)
            raise
        store._close_parts()
        store.controller, store.units, store.state_dir = new[0], new[1], new_dir
        store._data.rebind(store.controller)
        try:
            files.rmtree(old[2])
        except OSError:
            log.warning("could not remove the replaced state %s (removed on next open)", old[2])
        if reconcile:
            store._reconcile()
        return result
