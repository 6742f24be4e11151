"""The port conformance suite (tqstore.testing.conformance) against the embedded
implementations: the local Unit and Controller, and the same objects behind a pickling
proxy (tqstore.testing.proxy: only port methods, arguments and results through pickle,
``into`` ignored), as a Ray actor would be reached."""
from __future__ import annotations

import subprocess
import sys

from tqstore.controller import Controller
from tqstore.testing.conformance import ControllerPortTests, UnitPortTests
from tqstore.testing.proxy import PickledController, PickledUnit
from tqstore.unit import Unit


class TestLocalUnit(UnitPortTests):
    def make_unit(self, path, unit_id, num_units, *, compress=None):
        return Unit(path, unit_id, compress=compress)


class TestPickledUnit(UnitPortTests):
    def make_unit(self, path, unit_id, num_units, *, compress=None):
        return PickledUnit(Unit(path, unit_id, compress=compress))


class TestLocalController(ControllerPortTests):
    def make_controller(self, path, num_units):
        return Controller(path, num_units=num_units)


class TestPickledController(ControllerPortTests):
    def make_controller(self, path, num_units):
        return PickledController(Controller(path, num_units=num_units))


def test_the_suite_imports_without_pytest():
    code = ("import sys; sys.modules['pytest'] = None; import tqstore.testing.conformance, "
            "tqstore.testing.proxy; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "ok", out.stderr
