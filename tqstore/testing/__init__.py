"""Test support shipped with tqstore: a power-loss simulator, crash-point helpers and the
ports' conformance suite.

* :class:`PowerLoss` records, through the I/O layer's observer, what was written since
  each file's and directory's last fsync and materialises the disk a power cut would
  leave (seeded keep/drop/garble choices);
* :func:`count_points` / :func:`kill_points` enumerate the failpoint occurrences of an
  operation, :func:`run_forked` runs a function in a forked child (e.g. one killed at a
  failpoint) and reports how it ended;
* :mod:`tqstore.testing.conformance` (import it by name): ``UnitPortTests`` and
  ``ControllerPortTests``, the suite every implementation of a port subclasses and passes;
  :mod:`tqstore.testing.proxy`: ``PickledUnit`` / ``PickledController``, a port reached
  through pickled calls, as across a process boundary.

Nothing here is imported by the engine; it costs nothing unless a test uses it.
"""
from __future__ import annotations

from .crashpoints import ChildResult, count_points, kill_points, run_forked
from .powerloss import DROP_ALL, KEEP_ALL, Event, PowerLoss, SimulatedCrash, default_policy, lmdb_policy

__all__ = [
    "PowerLoss", "SimulatedCrash", "Event", "default_policy", "lmdb_policy", "DROP_ALL", "KEEP_ALL",
    "ChildResult", "count_points", "kill_points", "run_forked",
]
