"""The selective-restore operations of the port conformance suite (mixed into
:class:`~tqstore.testing.conformance.ControllerPortTests` and
:class:`~tqstore.testing.conformance.UnitPortTests`; they use those classes' helpers).

Controller: a restore is a persisted reservation (it survives a reopen), existing keys keep
their gidx and new keys get indexes no put can take, the partition's clears and puts of its
keys raise RestorePendingError naming the units and what to call, claims are fenced by their
attempt, finish commits rows, tags, fields and schema together, a cancelled restore frees its
indexes only when forgotten.  Unit: a staged import is invisible until published, re-stamped
frames read back under their new gidx, unpublish/settle put back what was replaced, and a
settled tag refuses later imports.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from .._format.columns import to_column
from .._format.segment import segment_name
from ..errors import CapacityError, InvalidInputError, RestorePendingError, SchemaError, TqstoreError
from ..ports import RestoreImport, RestoreInfo
from ._conformance_base import pytest

_X = (1, 6)  # ndarray int64: the schema of field "x" the helpers put


class ControllerRestoreTests:
    """Selective restores on a ControllerPort (see the module docstring)."""

    def _begin(self, c: Any, rows=(("a", 10, {"t": 1}, ["x"]), ("new", 11, None, ["x"]), ("bare", 12, "tag", [])),
               pid: str = "p") -> RestoreInfo:
        return c.begin_restore(pid, "/dumps/d1", [list(r) for r in rows], {"x": _X, "y": (1, 9)})

    def test_begin_restore_maps_existing_keys_to_their_gidx_and_reserves_new_ones(self, tmp_path):
        c = self.controller(tmp_path)
        g = self.put(c, "p", keys=["a", "b"])
        info = self._begin(c)
        assert isinstance(info, RestoreInfo) and info.state == "running" and info.pid == "p"
        assert info.keys == ("a", "new", "bare") and info.srcs == (10, 11, 12) and info.gidxs[0] == g[0]
        assert len(set(info.gidxs)) == 3 and not set(info.gidxs[1:]) & set(g)
        assert info.new_keys == 2 and c.restores()[0].new_keys == 2  # "new" and "bare" create rows
        assert info.units == ("pending",) * self.NUM_UNITS and info.dump == "/dumps/d1"
        assert self.put(c, "p", keys=["c"])[0] not in info.gidxs  # reserved: no put takes them
        assert c.list_keys("p") == {"p": {"a": None, "b": None, "c": None}}  # nothing visible yet

    def test_an_unresolved_restore_blocks_clears_and_puts_of_its_keys_and_survives_reopen(self, tmp_path):
        c = self.controller(tmp_path)
        self.put(c, "p", keys=["a", "b"])
        info = self._begin(c)
        c = self.reopen(c)
        (r,) = c.restores("p")
        assert (r.rid, r.tag, r.state) == (info.rid, info.tag, "running") and c.restores("q") == []
        for call in (lambda: c.clear_rows("p", [0]), lambda: c.drop_partition("p"),
                     lambda: self.put(c, "p", keys=["new"]), lambda: self.put(c, "p", keys=["a"]),
                     lambda: self._begin(c)):
            with pytest.raises(RestorePendingError, match="recover_data_load") as e:
                call()
            assert "pending [" in str(e.value) and info.rid in str(e.value)
            assert e.value.rid == info.rid  # (also across a process boundary: the error pickles with it)
        with pytest.raises(SchemaError):  # a field the restore writes, with another dtype
            c.plan_put("p", [to_column("x", np.zeros((1, 1), np.float32), 1)], keys=["zz"])
        self.put(c, "p", keys=["b"])  # other keys of the partition: fine
        self.put(c, "q", keys=["a"])  # other partitions: fine
        full = c.restore(info.rid)
        assert full.keys == info.keys and full.gidxs == info.gidxs and c.restore("f" * 32) is None

    def test_begin_restore_rejects_a_schema_clash_before_writing_anything(self, tmp_path):
        c = self.controller(tmp_path)
        self.put(c, "p", keys=["a"])
        before = self.state(c)
        with pytest.raises(SchemaError, match="'x'"):
            c.begin_restore("p", "/d", [["a", 0, None, ["x"]]], {"x": (1, 9)})
        with pytest.raises(InvalidInputError):
            c.begin_restore("p", "/d", [["a", 0, None, ["x"]], ["a", 1, None, []]], {"x": _X})
        with pytest.raises(InvalidInputError):
            c.begin_restore("p", "/d", [["a", 0, None, ["y"]]], {"x": _X})
        assert self.state(c) == before and c.restores() == []

    def test_begin_restore_past_a_units_room_raises_capacity_error_before_writing_anything(self, tmp_path):
        c = self.controller(tmp_path)
        self.put(c, "p", keys=["a"])  # "a" holds data: the restore's rows of it add none
        before = self.state(c)
        with pytest.raises(CapacityError, match="nothing was written") as e:  # "new" adds one row with data
            c.begin_restore("p", "/d", [["a", 0, None, ["x"]], ["new", 1, None, ["x"]], ["bare", 2, None, []]],
                            {"x": _X}, unit_room=[0] * self.NUM_UNITS)
        assert e.value.setting == "total_storage_size"
        assert self.state(c) == before and c.restores() == []
        info = c.begin_restore("p", "/d", [["a", 0, None, ["x"]], ["new", 1, None, ["x"]], ["bare", 2, None, []]],
                               {"x": _X}, unit_room=[1] * self.NUM_UNITS)
        assert info.new_keys == 2

    def test_claims_are_fenced_by_their_attempt_and_finish_commits_rows_tags_fields_schema(self, tmp_path):
        c = self.controller(tmp_path)
        g = self.put(c, "p", keys=["a", "b"], tags=[{"old": 1}, None])
        info = self._begin(c, rows=(("a", 10, {"t": 1}, ["x", "y"]), ("new", 11, None, ["y"]),
                                    ("bare", 12, "tag", [])))
        with pytest.raises(InvalidInputError):
            c.finish_restore(info.rid)  # units not complete
        first = c.claim_restore(info.rid, 0)
        second = c.claim_restore(info.rid, 0)  # a retried claim
        assert second == first + 1
        with pytest.raises(InvalidInputError):
            c.complete_restore(info.rid, 0, first)  # the stale attempt
        c.complete_restore(info.rid, 0, second)
        for u in range(1, self.NUM_UNITS):
            c.complete_restore(info.rid, u, c.claim_restore(info.rid, u))
        assert c.restores()[0].units == ("complete",) * self.NUM_UNITS
        c.finish_restore(info.rid)
        c.finish_restore(info.rid)  # idempotent
        assert c.restores()[0].state == "committed"
        c.forget_restore(info.rid)
        c.forget_restore(info.rid)  # idempotent
        assert c.restores() == []
        assert c.list_keys("p") == {"p": {"a": {"t": 1}, "b": None, "new": None, "bare": "tag"}}
        rb = c.rows_by_key("p", ["a", "new", "bare"])
        assert rb.gidxs[0] == g[0] and list(rb.gidxs) == list(info.gidxs)
        assert [sorted(f) for f in rb.fields] == [["x", "y"], ["y"], []] and rb.schema["y"] == (1, 9)
        c = self.reopen(c)
        assert c.list_keys("p")["p"]["bare"] == "tag" and c.restores() == []

    def test_cancel_keeps_the_reservation_until_forget_then_the_allocator_is_as_before(self, tmp_path):
        c = self.controller(tmp_path)
        self.put(c, "p", keys=["a", "b", "c"])
        c.clear_rows("p", c.resolve_keys("p", ["b"]))
        before = self.state(c)
        info = self._begin(c)
        c.claim_restore(info.rid, 0)
        c.cancel_restore(info.rid)
        c.cancel_restore(info.rid)
        assert c.restores()[0].state == "cancelled"
        with pytest.raises(InvalidInputError):
            c.finish_restore(info.rid)
        with pytest.raises(RestorePendingError):  # still unresolved: units may hold its frames
            c.clear_rows("p", [0])
        assert self.put(c, "q", n=1)[0] not in info.gidxs
        c = self.reopen(c)
        c.forget_restore(info.rid)
        assert c.restores() == []
        c.clear_rows("q", c.first_rows("q").gidxs)
        c.drop_partition("q")
        assert self.state(c) == before
        assert sorted(self.put(c, "p", keys=["n1", "n2"])) == sorted(info.gidxs[1:])


class UnitRestoreTests:
    """Selective restores on a UnitPort (see the module docstring)."""

    def _source(self, tmp_path: Path, n: int = 4) -> Any:
        """A dump-like file of ``n`` frames (field "x", int64 rows of 10) copied from a unit
        of another store, and the frames' ``(offset, length, crc, gidx)``."""
        from ..unit import Unit  # the frames' bytes only: written by the reference implementation

        src = Unit(tmp_path / "src-unit", 0)
        try:
            gidxs = list(range(100, 100 + n))
            src.write([(to_column("x", np.arange(n * 10, dtype=np.int64).reshape(n, 10), n), list(range(n)), gidxs)])
            locs = src.lookup(gidxs, ["x"])["x"]
            d = tmp_path / "dump"
            d.mkdir()
            data = (src.path / segment_name(int(locs["seg"][0]))).read_bytes()
        finally:
            src.close()
        (d / "shard").write_bytes(data)
        return d, locs, gidxs

    def _plan(self, d: Path, locs, src, dst) -> RestoreImport:
        n = len(src)
        return RestoreImport(str(d), {0: "shard"}, {0: os.path.getsize(d / "shard")}, np.zeros(n, np.int64),
                             locs["offset"].astype(np.int64), locs["length"].astype(np.int64),
                             locs["crc"].astype(np.uint32), np.asarray(src, np.uint64), np.asarray(dst, np.uint64),
                             [b"x"] * n)

    def test_a_staged_import_is_invisible_until_published_and_reads_under_the_new_gidx(self, tmp_path):
        u = self.unit(tmp_path)
        d, locs, src = self._source(tmp_path)
        dst = self.g(0, 1, 2, 3)
        self.write(u, "x", np.full((1, 10), -1, np.int64), dst[:1])  # an existing row: replaced by the restore
        assert u.import_restore(7, self._plan(d, locs, src, dst)) == int(locs["length"].sum())
        assert sorted(u.keys()) == [(dst[0], "x")] and u.restore_tags() == [7]
        assert self.payloads(u, dst[:1], "x") == [np.full(10, -1, np.int64).tobytes()]
        assert u.publish_restore(7) == 4 and u.publish_restore(7) == 0
        want = [np.arange(i * 10, i * 10 + 10, dtype=np.int64).tobytes() for i in range(4)]
        assert self.payloads(u, dst, "x") == want  # re-stamped frames verify under their new gidx
        assert u.unpublish_restore(7) == 4
        assert self.payloads(u, dst[:1], "x") == [np.full(10, -1, np.int64).tobytes()]
        assert sorted(u.keys()) == [(dst[0], "x")]
        u = self.reopen(u)
        assert u.restore_tags() == [7] and u.publish_restore(7) == 4
        assert u.settle_restore(7, committed=True) == 4
        assert self.payloads(u, dst, "x") == want and u.verify() == []
        with pytest.raises(InvalidInputError):  # a settled tag refuses later writes
            u.import_restore(7, self._plan(d, locs, src, dst))
        assert self.payloads(u, dst, "x") == want
        u.settle_restore(7, committed=True, close=False)
        assert u.restore_tags() == []

    def test_settling_a_cancelled_import_drops_it_and_puts_back_what_it_replaced(self, tmp_path):
        u = self.unit(tmp_path)
        d, locs, src = self._source(tmp_path)
        dst = self.g(0, 1, 2, 3)
        self.write(u, "x", np.full((1, 10), -1, np.int64), dst[:1])
        u.import_restore(3, self._plan(d, locs, src, dst))
        u.publish_restore(3)
        u.settle_restore(3, committed=False)
        assert sorted(u.keys()) == [(dst[0], "x")] and u.restore_tags() == [3]
        assert self.payloads(u, dst[:1], "x") == [np.full(10, -1, np.int64).tobytes()] and u.verify() == []

    def test_an_import_checks_every_frame_against_the_recorded_crc(self, tmp_path):
        u = self.unit(tmp_path)
        d, locs, src = self._source(tmp_path)
        with open(d / "shard", "r+b") as f:
            f.seek(int(locs["offset"][2]) + 150)
            b = f.read(1)
            f.seek(int(locs["offset"][2]) + 150)
            f.write(bytes([b[0] ^ 1]))
        with pytest.raises(TqstoreError, match="shard"):
            u.import_restore(5, self._plan(d, locs, src, self.g(0, 1, 2, 3)))
        u.settle_restore(5, committed=False)
        assert u.keys() == [] and u.verify() == []
