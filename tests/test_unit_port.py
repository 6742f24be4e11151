"""The store's read, write and snapshot paths cross the unit through :class:`UnitPort` only.

A proxy (tqstore.testing.proxy.PickledUnit) stands in for a unit across a process boundary
(a Ray actor): it forwards only the port's public methods, pickles every argument and
result, ignores ``into`` destinations (the unit returns its values instead) and turns
buffers that cannot leave a process (views of a mapped segment) into bytes, as an actor
layer must.  A store read through such proxies
returns bit-identical results on every read plan.
"""
from __future__ import annotations

import ast
import inspect
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from tqstore import ports, reader
from tqstore.torch_adapter import to_column
from tqstore._format.index import LOC_DTYPE
from tqstore._format.layout import KIND_TENSOR
from tqstore.errors import CorruptionError, FieldNotFoundError
from tqstore.store import Store
from tqstore.testing.proxy import PickledUnit, port_methods
from tqstore.unit import Unit

from test_store import same

pytestmark = pytest.mark.usefixtures("record_path")

_PORT_METHODS = port_methods(ports.UnitPort)


def _batch(n: int):
    g = torch.Generator().manual_seed(7)
    return {
        "u": torch.randn(n, 6, generator=g),  # uniform, small frames: the mapped uniform plan
        "big": torch.randn(n, 8192, generator=g),  # uniform, 32 KiB frames: the preadv uniform plan
        "bf": torch.randn(n, 3, generator=g).to(torch.bfloat16),
        "j": [torch.randn(2 + 3 * i, generator=g) for i in range(n)],  # jagged, small frames
        "jbig": [torch.randn(5000 + 7 * i, generator=g) for i in range(n)],  # jagged, large frames
        "z": torch.randn(n, 40, generator=g),  # compressed (the store compresses "z" and "zj")
        "zj": [torch.randn(9000 + i, generator=g) for i in range(n)],  # compressed, large
        "np": np.arange(n * 4, dtype=np.int32).reshape(n, 4),
        "v": [{"i": i, "s": "x" * i, "l": [i, None, True]} for i in range(n)],  # values
    }


@pytest.mark.parametrize("num_units", [1, 3])
def test_store_read_through_a_pickling_proxy_is_bit_identical(tmp_path, num_units):
    n = 7
    batch = _batch(n)
    with Store(tmp_path / "s", num_units=num_units, compress=["z", "zj"]) as s:
        gidxs = s.write("p", batch, keys=[f"k{i}" for i in range(n)])
        local = s.read("p", gidxs)
        units = s.units
        proxies = [PickledUnit(u) for u in units]
        s.units = proxies
        try:
            remote = s.read("p", gidxs)
            remote_rev = s.read("p", gidxs[::-1])
        finally:
            s.units = units
        assert set(remote) == set(batch) == set(local)
        for f in batch:
            assert same(remote[f], local[f]), f
            if isinstance(local[f], list):
                assert same(remote_rev[f], local[f][::-1]), f
        assert same(remote["u"], batch["u"]) and same(remote["big"], batch["big"])
        assert same(remote["v"], batch["v"]) and same(remote["np"], batch["np"])
        assert [x.tolist() for x in remote["jbig"].unbind()] == [x.tolist() for x in batch["jbig"]]
        used = {c for p in proxies for c in p.calls}
        assert {"lookup", "read_head", "read_uniform", "read_frames", "read_heads", "read_into"} <= used


class _MeetingUnit(PickledUnit):
    """A proxy whose ``method`` calls wait for ``barrier``: sequential calls never meet."""

    def __init__(self, unit, barrier: threading.Barrier, method: str) -> None:
        super().__init__(unit)
        self._barrier, self._meet_at = barrier, method

    def _send(self, name, args, kwargs):
        if name == self._meet_at:
            self._barrier.wait()
        return super()._send(name, args, kwargs)


def test_a_read_over_remote_units_calls_them_and_reads_its_fields_at_once(tmp_path):
    """Units in other processes (``remote=True``, as the Ray parts): the units' lookups run at
    once, and so do the reads of different fields, small ones included; the result is the
    same, bit for bit, as the local read's."""
    n = 7
    batch = _batch(n)
    fields = sorted(batch)
    with Store(tmp_path / "s", num_units=3, compress=["z", "zj"]) as s:
        gidxs = s.write("p", batch, keys=[f"k{i}" for i in range(n)])
        kinds = [(f, s.controller.row_batch("p", gidxs).schema[f][0]) for f in fields]
        local = reader.read_fields(s.units, s._pool, gidxs, kinds, alloc=s.edge.alloc)
        # the three units' lookups meet: a read that called them one after the other would break the barrier
        meet = threading.Barrier(3, timeout=10)
        proxies = [_MeetingUnit(u, meet, "lookup") for u in s.units]
        remote = reader.read_fields(proxies, s._pool, gidxs, kinds, alloc=s.edge.alloc, remote=True)
        assert not meet.broken
        for f in fields:
            assert same(remote[f], local[f]), f
        # two small fields read from one unit: their first calls meet
        one = [g for g in gidxs if g % 3 == 0][:2]
        meet2 = threading.Barrier(2, timeout=10)
        proxies = [_MeetingUnit(u, meet2, "read_uniform") for u in s.units]
        two = [("u", KIND_TENSOR), ("bf", KIND_TENSOR)]
        got = reader.read_fields(proxies, s._pool, one, two, alloc=s.edge.alloc, remote=True)
        assert same(got["u"], batch["u"][[gidxs.index(g) for g in one]])
        with pytest.raises(FieldNotFoundError, match="has no stored payload"):
            reader.read_fields([PickledUnit(u) for u in s.units], s._pool, gidxs, [("nope", KIND_TENSOR)],
                               alloc=s.edge.alloc, remote=True)


def test_snapshot_ids_cross_the_port_and_keep_the_cut(tmp_path):
    with Store(tmp_path / "s", num_units=2) as s:
        g = s.write("p", {"x": torch.arange(8.0).reshape(4, 2)}, keys=list("abcd"))
        snap = s.snapshot()
        try:
            assert all(isinstance(i, int) for i in snap.unit_snaps)
            s.write("p", {"x": torch.full((4, 2), -1.0)}, keys=list("abcd"))
            proxies = [PickledUnit(u) for u in s.units]
            kinds = [("x", KIND_TENSOR)]
            then = reader.read_fields(proxies, None, g, kinds, snapshots=snap.unit_snaps, alloc=s.edge.alloc)
            now = reader.read_fields(proxies, None, g, kinds, alloc=s.edge.alloc)
            assert same(then["x"], torch.arange(8.0).reshape(4, 2))
            assert same(now["x"], torch.full((4, 2), -1.0))
            held = sorted(k for p, sid in zip(proxies, snap.unit_snaps) for k in p.keys(snapshot=sid))
            assert held == sorted((gi, "x") for gi in g)
        finally:
            snap.release()
        snap.release()  # idempotent
        with pytest.raises(ValueError):
            s.units[0].keys(snapshot=snap.unit_snaps[0])  # released: unknown


def test_lookup_reads_every_field_in_one_call_and_says_none_for_a_missing_field(tmp_path):
    u = Unit(tmp_path / "u", 0)
    try:
        cols = [to_column("a", torch.zeros(3, 2), 3), to_column("b", torch.ones(3, 5), 3)]
        u.write([(cols[0], [0, 1, 2], [0, 1, 2]), (cols[1], [0, 1], [0, 1])], fresh=True)
        got = u.lookup([0, 1, 2], ["a", "b"])
        assert got["a"].dtype == LOC_DTYPE and len(got["a"]) == 3 and got["b"] is None
        assert [loc is None for loc in u.locate([0, 1, 2], "b")] == [False, False, True]
        assert u.lookup([0, 1], ["b"])["b"]["length"].tolist() == [loc.length for loc in u.locate([0, 1], "b")]
        assert u.lookup([], ["a"])["a"].shape == (0,)
        with pytest.raises(FieldNotFoundError, match=r"rows \[2\]"):
            reader.read_fields([PickledUnit(u)], None, [0, 1, 2], [("b", KIND_TENSOR)])
    finally:
        u.close()


def test_a_corrupt_frame_read_through_the_proxy_names_its_file(tmp_path):
    with Store(tmp_path / "s") as s:
        g = s.write("p", {"x": torch.randn(3, 9000), "y": torch.randn(3, 4)}, keys=list("abc"))
        (loc,) = s.units[0].locate([g[1]], "x")
        path = s.units[0].describe(loc)
    with open(path, "r+b") as f:
        f.seek(loc.offset + loc.length // 2)
        b = f.read(1)
        f.seek(loc.offset + loc.length // 2)
        f.write(bytes([b[0] ^ 1]))
    with Store(tmp_path / "s") as s:
        units = s.units
        s.units = [PickledUnit(u) for u in units]
        try:
            with pytest.raises(CorruptionError) as e:
                s.read("p", g)
            with pytest.raises(CorruptionError) as e2:  # the fields of a remote read at once: the same error
                reader.read_fields(s.units, s._pool, g, [("y", KIND_TENSOR), ("x", KIND_TENSOR)],
                                   alloc=s.edge.alloc, remote=True)
        finally:
            s.units = units
        assert path in str(e.value) and path in str(e2.value)


def test_unit_has_every_port_method_and_reader_imports_no_unit():
    missing = {m for m in _PORT_METHODS if not callable(getattr(Unit, m, None))}
    assert not missing
    tree = ast.parse(Path(inspect.getsourcefile(reader)).read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not {m for m in imported if m and m.lstrip(".").startswith("unit")}
