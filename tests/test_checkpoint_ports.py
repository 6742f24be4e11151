"""The checkpoint writer and loader cross the units and the controller through the ports only.

Proxies stand in for a unit and for the controller across a process boundary (Ray actors):
they forward only the port's public methods and pickle every argument and result.  A
checkpoint saved through them is the one saved directly (same files, sizes and CRCs), and it
loads through them bit-identically, onto the same unit count and onto another.
"""
from __future__ import annotations

import inspect
import os
import pickle

import pytest

from tqstore import ports
from tqstore.checkpoint import read_manifest, verify_checkpoint
from tqstore.controller import Controller
from tqstore.store import Store
from tqstore.unit import Unit

from checkpoint_helpers import fill, state

pytestmark = pytest.mark.usefixtures("record_path")

CKPT_METHODS = ("snapshot", "release", "export_snapshot", "stage_import")


def _methods(proto):
    return {n for n, v in vars(proto).items() if callable(v) and not n.startswith("_")}


class Pickled:
    """A unit or controller reached through pickled calls: the port's public methods only."""

    def __init__(self, real, proto) -> None:
        self._real = real
        self._allowed = _methods(proto)
        self._attrs = set(getattr(proto, "__annotations__", {}))  # the port's attributes, read live
        self.calls = []

    def __getattr__(self, name):
        if name in self.__dict__.get("_attrs", ()):
            return pickle.loads(pickle.dumps(getattr(self._real, name)))
        if name not in self._allowed:
            raise AttributeError(f"{name!r} is not a port method")
        method = getattr(self._real, name)

        def call(*args, **kwargs):
            self.calls.append(name)
            args, kwargs = pickle.loads(pickle.dumps((args, kwargs)))
            return pickle.loads(pickle.dumps(method(*args, **kwargs)))

        return call


def _through_proxies(s: Store):
    """Swap the store's parts for proxies; returns (unit proxies, controller proxy, restore)."""
    units, ctrl = s.units, s.controller
    up = [Pickled(u, ports.UnitPort) for u in units]
    cp = Pickled(ctrl, ports.ControllerPort)
    s.units, s.controller = up, cp

    def restore():
        if s.units is up:  # (a load switched in new, real parts: nothing to restore)
            s.units, s.controller = units, ctrl

    return up, cp, restore


def _entries(ck):
    return sorted((e.path, e.role, e.size, e.crc32c, e.frames, e.live_bytes) for e in read_manifest(ck).files)


def test_unit_and_controller_implement_the_checkpoint_part_of_the_ports():
    for cls, proto, names in ((Unit, ports.UnitPort, CKPT_METHODS + ("verify_import",)),
                              (Controller, ports.ControllerPort, CKPT_METHODS)):
        for name in names:
            want = inspect.signature(getattr(proto, name))
            have = inspect.signature(getattr(cls, name))
            assert list(have.parameters) == list(want.parameters), (cls.__name__, name)


@pytest.mark.parametrize("copy_segments", [False, True])
def test_a_checkpoint_saved_through_pickling_proxies_is_the_one_saved_directly(tmp_path, copy_segments):
    with Store(tmp_path / "s", num_units=3, segment_bytes=1 << 16) as s:
        fill(s, "train", 40)
        fill(s, "eval", 7, prefix="e", seed=3)
        s.kv_clear(["k3", "k4"], "train")
        s.save_checkpoint(tmp_path / "direct", copy_segments=copy_segments)
        up, cp, restore = _through_proxies(s)
        try:
            info = s.save_checkpoint(tmp_path / "proxied", copy_segments=copy_segments)
        finally:
            restore()
        assert {"snapshot", "export_snapshot", "release"} <= set(cp.calls)
        assert all({"snapshot", "export_snapshot", "release"} <= set(p.calls) for p in up)
        assert not any(p._real._views for p in up) and not cp._real._snapshots  # every cut released
    assert _entries(tmp_path / "proxied") == _entries(tmp_path / "direct")
    assert (info.linked_bytes == 0) == copy_segments  # (copied_bytes counts the index copies too)
    assert verify_checkpoint(tmp_path / "proxied").ok


@pytest.mark.parametrize("load_units", [3, 2, 5])
def test_a_checkpoint_loads_through_pickling_proxies_bit_identically(tmp_path, load_units):
    with Store(tmp_path / "src", num_units=3, segment_bytes=1 << 16) as s:
        fill(s, "train", 40)
        fill(s, "eval", 9, prefix="e", seed=5)
        s.kv_clear(["k1"], "train")
        up, cp, restore = _through_proxies(s)
        try:
            s.save_checkpoint(tmp_path / "ck")
        finally:
            restore()
        want = state(s)
    with Store(tmp_path / "dst", num_units=load_units) as d:
        fill(d, "other", 5, seed=9)  # replaced by the load
        up, cp, restore = _through_proxies(d)
        try:
            info = d.load_checkpoint(tmp_path / "ck")
        finally:
            restore()
        assert info.mode == ("same" if load_units == 3 else "reshard")
        assert "stage_import" in cp.calls and all("stage_import" in p.calls for p in up)
        if load_units == 3:
            assert all("verify_import" in p.calls for p in up)
        assert d.units[0] is not up[0]._real and isinstance(d.units[0], Unit)  # new parts switched in
        assert state(d) == want
    with Store(tmp_path / "dst") as d:  # and after a reopen
        assert state(d) == want


def test_a_metadata_only_checkpoint_loads_through_the_controller_port(tmp_path):
    with Store(tmp_path / "src", num_units=2) as s:
        keys = fill(s, "train", 6)
        s.save_checkpoint(tmp_path / "ck", include_storage=False)
    with Store(tmp_path / "dst", num_units=3) as d:
        up, cp, restore = _through_proxies(d)
        try:
            assert d.load_checkpoint(tmp_path / "ck").mode == "metadata"
        finally:
            restore()
        assert cp.calls.count("stage_import") == 1 and all(p.calls == ["close"] for p in up)  # (the switch closes them)
        assert list(d.kv_list("train")["train"]) == keys
        assert all(not fs for fs in d.controller.claims(0).values())  # no field produced


def test_a_damaged_segment_staged_through_the_port_leaves_the_store_unchanged(tmp_path):
    from tqstore.errors import CorruptionError

    with Store(tmp_path / "src", num_units=2) as s:
        fill(s, "train", 20)
        s.save_checkpoint(tmp_path / "ck", copy_segments=True)
    seg = next(p for p in sorted((tmp_path / "ck" / "unit-001").iterdir()) if p.suffix == ".tqs")
    data = bytearray(seg.read_bytes())
    data[len(data) // 2] ^= 0xFF
    os.unlink(seg)
    seg.write_bytes(bytes(data))
    with Store(tmp_path / "dst", num_units=2) as d:
        fill(d, "mine", 4)
        before = state(d)
        _, _, restore = _through_proxies(d)
        try:
            with pytest.raises(CorruptionError) as e:
                d.load_checkpoint(tmp_path / "ck")
        finally:
            restore()
        assert str(seg) in str(e.value)
        assert state(d) == before


def test_snapshot_ids_of_the_controller_are_released_idempotently(tmp_path):
    c = Controller(tmp_path / "c", num_units=1)
    try:
        a, b = c.snapshot(), c.snapshot()
        assert a != b and isinstance(a, int)
        c.release(a)
        c.release(a)
        with pytest.raises(ValueError):
            c.export_snapshot(a, str(tmp_path / "x"))
        out = c.export_snapshot(b, str(tmp_path / "y"))
        assert isinstance(out, ports.ControllerExport) and out.files[0]["path"] == "data.mdb"
        assert out.summary["rows"] == 0 and out.summary["put_token"] == 0
    finally:
        c.close()  # releases b
