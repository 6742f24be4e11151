"""Walking a store's LMDB index files out of process before this process maps them.

LMDB follows the page numbers it finds in its file: a damaged page makes the reading
*process* die of SIGBUS, which no ``try`` catches.  The command line's read commands
(verify, compact, inspect, ls) take stores from anywhere, so before they map one's indexes,
:func:`index_walk_problems` has a child process walk them (:mod:`tqstore._io.lmdbwalk`: every
entry of every database, checked against the file's schema); a crash of the child is a
problem of the file it walked.  A store open in another process is not walked: its indexes
are live, and the walk takes no reader slot.  :func:`data_problems` then reads (only) what
an open's crash recovery would drop: a unit directory or segment file that is missing, a
segment shorter than its unit index records.
"""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional, Tuple

from . import embedded
from . import layout_dirs as L
from . import store_lock
from ._io import locks
from ._io.lmdbwalk import LmdbWalk
from .errors import StorageIOError


def _lock_for_check(root: Path) -> Optional[int]:
    """The store's ``LOCK`` taken as a tqstore command's, waiting while another command holds
    it (as an open waits: :func:`tqstore.store_lock.waiting_for_commands`; skipping the check
    then let the command's open go on unchecked once the other ended: a truncated segment
    was dropped for good); None when the store is open in another process (its open is
    refused) or its LOCK cannot be taken."""
    try:
        return store_lock.waiting_for_commands(root, lambda: locks.lock_for_check_nowait(root / "LOCK"))
    except (OSError, StorageIOError):
        return None


def index_walk_problems(root: Path, *, units: bool) -> List[Tuple[str, str]]:
    """``(file, problem)`` of the store at ``root``'s controller index (and with ``units``
    every unit index) walked in a child process; empty when they read clean, when the store
    is open elsewhere (its ``LOCK`` held) or has no state yet (its open or decoder says what
    is wrong).  Raises nothing for a damaged file."""
    d, cur = L.read_store_file(root), L.read_current(root)
    if d is None or cur is None or not (root / cur).is_dir():
        return []
    fd = _lock_for_check(root)
    if fd is None:
        return []
    try:
        state = root / cur
        targets = [(L.controller_dir(state), "controller")]
        if units:
            targets += [(L.unit_dir(state, i) / "index", "unit_index") for i in range(int(d.get("num_units") or 0))]
        targets = [(str(t), schema) for t, schema in targets if (t / "data.mdb").is_file()]
        return [(p.path, p.message) for p in LmdbWalk(targets).result()] if targets else []
    finally:
        locks.unlock(fd)


def data_problems(root: Path) -> List[str]:
    """What opening the store at ``root`` would drop as lost, found without changing
    anything: a unit directory that is missing, a segment file its unit index records that
    is missing or shorter than recorded (an open's crash recovery takes these for a power
    loss's torn writes and forgets the rows' fields those bytes held, for good).  Empty when
    there is none, when the store is open elsewhere (its ``LOCK`` held) or has no state yet.
    Call after :func:`index_walk_problems` found the unit indexes sound (they are mapped
    here).  Raises nothing for damage; a unit index that cannot be read is left to the open."""
    d, cur = L.read_store_file(root), L.read_current(root)
    if d is None or cur is None or not (root / cur).is_dir():
        return []
    fd = _lock_for_check(root)
    if fd is None:
        return []
    try:
        out: List[str] = []
        for i in range(int(d.get("num_units") or 0)):
            out += embedded.recovery_losses(L.unit_dir(root / cur, i), i)
        return out
    finally:
        locks.unlock(fd)


__all__ = ["index_walk_problems", "data_problems"]
