"""The conformance suite of the ports: one test class per port that every implementation
subclasses and must pass (as zarr's ``StoreTests``; DESIGN.md §1).

:class:`UnitPortTests` and :class:`ControllerPortTests` are plain pytest classes (not
collected themselves: their names do not start with ``Test``).  A subclass says how to
make an implementation::

    class TestLocalUnit(UnitPortTests):
        def make_unit(self, path, unit_id, num_units, *, compress=None):
            return Unit(path, unit_id, compress=compress)

    class TestLocalController(ControllerPortTests):
        def make_controller(self, path, num_units):
            return Controller(path, num_units=num_units)

and may override ``reopen(port)`` (default: close it, then make it again with the same
arguments: the durability tests) and ``failing(point)`` (a context manager under which the
implementation's commits at ``"unit_commit"`` / ``"controller_commit"`` fail; the default
arms the I/O layer's failpoints in this process; None skips those tests).  Every test uses
real LMDB environments and files under pytest's ``tmp_path`` and only the port's methods
and attributes, so an implementation across a process boundary passes the same tests:
``tests/test_conformance.py`` runs both classes against the local ``Unit`` / ``Controller``
and against them behind :class:`tqstore.testing.proxy.PickledUnit` /
:class:`~tqstore.testing.proxy.PickledController`; the Ray backend subclasses them with
factories that start actors.  A port method an implementation does not have yet
(``export_snapshot``, the controller's ``snapshot``) skips its tests with the reason.

What is asserted is what ``tqstore/ports.py`` promises: bit-identical payloads on every
read path, ``into`` filled in process or the values returned (:func:`~tqstore.ports.fill_or_copy`),
snapshot ids that hold their cut, undo tokens of overwriting puts, copies (never the
mirror) from the controller's queries, consumption marked atomically by ``fetch``,
committed state surviving a reopen, errors that are :class:`~tqstore.errors.TqstoreError`,
and failed calls that change nothing observable.

pytest is needed to run the suite, not to import this module.
"""
from __future__ import annotations

from ._conformance_base import inprocess_failpoint
from ._conformance_controller import ControllerPortTests
from ._conformance_unit import UnitPortTests

__all__ = ["UnitPortTests", "ControllerPortTests", "inprocess_failpoint"]
