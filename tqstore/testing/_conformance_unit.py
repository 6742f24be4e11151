"""The unit half of the port conformance suite: :class:`UnitPortTests` (see
:mod:`tqstore.testing.conformance`)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, List, Optional

import numpy as np

from .._format.columns import to_column
from .._format.frame import head_template
from .._format.index import LOC_DTYPE, Loc
from .._format.layout import CODEC_MASK
from .._format.values import decode_value
from ..errors import CorruptionError, TqstoreError
from ..ports import fill_or_copy
from ._conformance_base import _PortTests, pytest
from ._conformance_restore import UnitRestoreTests


def _column(field: str, value: Any) -> Any:
    return to_column(field, value, len(value))


def _raw(row: Any) -> bytes:
    return np.ascontiguousarray(row).tobytes()


def _flip_byte(path: str, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x01]))


class UnitPortTests(UnitRestoreTests, _PortTests):
    """Conformance of a :class:`~tqstore.ports.UnitPort` implementation.

    Subclasses define :meth:`make_unit`; set ``supports_compression = False`` for an
    implementation that does not compress (those tests skip)."""

    UNIT_ID = 1
    NUM_UNITS = 2
    supports_compression = True

    def make_unit(self, path: Path, unit_id: int, num_units: int, *, compress: Optional[set] = None) -> Any:
        """A unit port holding rows ``g % num_units == unit_id`` in ``path`` (new or existing);
        ``compress``: field names whose payloads are compressed."""
        raise NotImplementedError

    # helpers ------------------------------------------------------------------
    def unit(self, tmp_path: Path, *, compress: Optional[set] = None) -> Any:
        if compress and not self.supports_compression:
            pytest.skip(f"{type(self).__name__} does not compress")
        args = ((tmp_path / "unit", self.UNIT_ID, self.NUM_UNITS), {"compress": compress})
        return self._track(self.make_unit(*args[0], **args[1]), self.make_unit, args)

    def g(self, *rows: int) -> List[int]:
        """Global indexes of the unit's rows number ``rows``."""
        return [r * self.NUM_UNITS + self.UNIT_ID for r in rows]

    @staticmethod
    def write(u: Any, field: str, value: Any, gidxs: List[int], **kw: Any) -> int:
        return u.write([(_column(field, value), list(range(len(gidxs))), gidxs)], **kw)

    @staticmethod
    def payloads(u: Any, gidxs: List[int], field: str, **kw: Any) -> List[bytes]:
        locs = u.locate(gidxs, field, **kw)
        assert None not in locs, f"rows without {field!r}: {[g for g, l in zip(gidxs, locs) if l is None]}"
        return [bytes(memoryview(p).cast("B")) for _h, p in u.read_frames(locs, gidxs)]

    # identity, keys, lookups ----------------------------------------------------
    def test_unit_id_names_the_unit(self, tmp_path):
        assert self.unit(tmp_path).unit_id == self.UNIT_ID

    def test_keys_list_every_row_and_field_written(self, tmp_path):
        u = self.unit(tmp_path)
        assert u.keys() == []
        g = self.g(0, 1, 2)
        assert self.write(u, "a", np.zeros((3, 2), np.float32), g) > 0
        self.write(u, "b", np.ones((2, 5), np.int64), g[:2])
        assert sorted(u.keys()) == sorted([(x, "a") for x in g] + [(x, "b") for x in g[:2]])

    def test_field_rows_list_by_field_what_keys_lists(self, tmp_path):
        u = self.unit(tmp_path)
        assert u.field_rows() == {}
        g = self.g(0, 1, 2, 3)
        self.write(u, "a", np.zeros((4, 2), np.float32), g)
        self.write(u, "b\u00e9", np.ones((2, 5), np.int64), g[2:])
        snap = u.snapshot()
        try:
            u.delete([g[0]])
            got = u.field_rows()
            assert all(v.dtype == np.int64 for v in got.values())
            assert {f: v.tolist() for f, v in got.items()} == {"a": sorted(g[1:]), "b\u00e9": sorted(g[2:])}
            assert u.field_rows(snapshot=snap)["a"].tolist() == sorted(g)
        finally:
            u.release(snap)

    def test_lookup_reads_every_field_and_says_none_for_a_field_some_row_lacks(self, tmp_path):
        u = self.unit(tmp_path)
        g = self.g(0, 1, 2)
        self.write(u, "a", np.zeros((3, 2), np.float32), g)
        self.write(u, "b", np.ones((2, 5), np.int64), g[:2])
        got = u.lookup(g, ["a", "b"])
        assert got["a"].dtype == LOC_DTYPE and len(got["a"]) == 3 and got["b"] is None
        assert [loc is None for loc in u.locate(g, "b")] == [False, False, True]
        assert u.lookup(g[:2], ["b"])["b"]["length"].tolist() == [loc.length for loc in u.locate(g[:2], "b")]
        assert len(u.lookup([], ["a"])["a"]) == 0
        assert u.locate(self.g(7), "a") == [None]

    def test_lookup_of_many_rows_agrees_with_locate_whatever_their_order_gaps_and_fields(self, tmp_path):
        u = self.unit(tmp_path)
        g = self.g(*range(100))
        self.write(u, "a", np.arange(200, dtype=np.int64).reshape(100, 2), g)
        self.write(u, "b", np.ones((50, 3), np.float32), g[:50])
        self.write(u, "c", np.zeros((20, 1), np.int8), g[40:60])  # rows 40..59 hold a third field
        rng = np.random.default_rng(5)
        asks = [(g, ["a"]), (g[:50], ["a", "b"]), (g[:50], ["b", "a"]), (g[30:70], ["a"]), (g[40:60], ["c", "a"]), (g[35:55], ["a"]),
                (g[:20] + g[60:80], ["a"]), (list(rng.permutation(g)) + g[:7], ["a"]), (g[45:50] * 9, ["b"]),
                (g[::-1], ["a"])]
        for rows, fields in asks:
            rows = [int(r) for r in rows]
            got = u.lookup(rows, fields)
            for f in fields:
                assert [Loc._make(r) for r in got[f].tolist()] == u.locate(rows, f), (rows[:3], f)
        assert u.lookup(g, ["a", "b"])["b"] is None
        assert u.lookup(g[30:70], ["c"])["c"] is None
        assert u.lookup(g[:50] + self.g(100), ["a"])["a"] is None

    # reads: bit-identical on every path -------------------------------------------
    def test_read_frames_returns_the_bytes_written_with_their_heads(self, tmp_path):
        u = self.unit(tmp_path)
        a = np.random.default_rng(1).standard_normal((4, 6)).astype(np.float32)
        g = self.g(0, 1, 2, 3)
        self.write(u, "x", a, g)
        order = g[::-1]
        got = u.read_frames(u.locate(order, "x"), order)
        assert {(h.field, h.shape, h.payload_len) for h, _p in got} == {("x", (6,), 24)}
        assert [h.gidx for h, _p in got] == order  # each row's own head
        assert [bytes(memoryview(p).cast("B")) for _h, p in got] == [_raw(a[i]) for i in (3, 2, 1, 0)]

    def test_read_head_parses_the_frame_up_to_its_payload(self, tmp_path):
        u = self.unit(tmp_path)
        self.write(u, "x", np.arange(12, dtype=np.int32).reshape(3, 4), self.g(0, 1, 2))
        loc = u.locate(self.g(1), "x")[0]
        h, raw = u.read_head(loc)
        assert (h.gidx, h.field, h.shape, h.payload_len) == (self.g(1)[0], "x", (4,), 16)
        assert len(raw) == h.payload_start
        assert u.read_heads([loc]) == [h]
        assert isinstance(u.describe(loc), str) and u.describe(loc)

    def _uniform(self, u: Any, a: np.ndarray, gidxs: List[int]) -> None:
        locs = u.lookup(gidxs, ["x"])["x"]
        h, raw = u.read_head(Loc._make(locs[0].tolist()))
        args = (locs, np.asarray(gidxs, np.uint64), head_template(raw), h.payload_start, h.payload_len)
        out = u.read_uniform(*args)
        assert out.shape == (len(gidxs), h.payload_len) and out.tobytes() == a.tobytes()
        into = np.zeros((len(gidxs) + 2, h.payload_len), np.uint8)
        rows = np.arange(len(gidxs), dtype=np.int64)[::-1] + 2
        assert fill_or_copy(u.read_uniform(*args, into=into, rows=rows), into, rows) is True
        assert into[rows].tobytes() == a.tobytes() and not into[:2].any()
        assert u.read_uniform(*args, verify=False).tobytes() == a.tobytes()

    def test_read_uniform_returns_or_fills_bit_identical_payloads_of_small_frames(self, tmp_path):
        u = self.unit(tmp_path)
        a = np.random.default_rng(2).standard_normal((5, 6)).astype(np.float32)
        self.write(u, "x", a, self.g(0, 1, 2, 3, 4))
        self._uniform(u, a, self.g(0, 1, 2, 3, 4))

    def test_read_uniform_returns_or_fills_bit_identical_payloads_of_large_frames(self, tmp_path):
        u = self.unit(tmp_path)
        a = np.random.default_rng(3).standard_normal((3, 6000)).astype(np.float32)  # 24 KB frames
        self.write(u, "x", a, self.g(0, 1, 2))
        self._uniform(u, a, self.g(0, 1, 2))

    def test_read_uniform_answers_none_or_false_when_a_head_differs_from_the_template(self, tmp_path):
        u = self.unit(tmp_path)
        g = self.g(0, 1)
        self.write(u, "x", [np.zeros(4, np.float32), np.ones((2, 2), np.float32)], g)  # one length, two shapes
        locs = u.lookup(g, ["x"])["x"]
        h, raw = u.read_head(Loc._make(locs[0].tolist()))
        args = (locs, np.asarray(g, np.uint64), head_template(raw), h.payload_start, h.payload_len)
        assert u.read_uniform(*args) is None
        into, rows = np.zeros((2, h.payload_len), np.uint8), np.arange(2, dtype=np.int64)
        assert fill_or_copy(u.read_uniform(*args, into=into, rows=rows), into, rows) is False

    def test_read_heads_and_read_into_give_the_payloads_of_jagged_large_frames(self, tmp_path):
        u = self.unit(tmp_path)
        rng = np.random.default_rng(4)
        rows = [rng.standard_normal(5000 + 7 * i).astype(np.float32) for i in range(3)]
        g = self.g(0, 1, 2)
        self.write(u, "j", rows, g)
        locs = u.locate(g, "j")
        heads = u.read_heads(locs)
        assert [h.shape for h in heads] == [r.shape for r in rows] and [h.gidx for h in heads] == g
        bufs = [bytearray(h.payload_len) for h in heads]
        got = u.read_into(locs, heads, bufs)
        filled = bufs if got is None else got  # in process: filled; across a boundary: returned
        assert [bytes(memoryview(b).cast("B")) for b in filled] == [_raw(r) for r in rows]
        assert [bytes(memoryview(b).cast("B")) for b in u.read_into(locs, heads)] == [_raw(r) for r in rows]
        assert self.payloads(u, g, "j") == [_raw(r) for r in rows]

    def test_values_round_trip(self, tmp_path):
        u = self.unit(tmp_path)
        values = [{"i": i, "s": "x" * i, "l": [i, None, True]} for i in range(3)] + ["plain", 7, None]
        g = self.g(*range(6))
        self.write(u, "v", values, g)
        assert [decode_value(p) for p in self.payloads(u, g, "v")] == values

    def test_compressed_payloads_read_back_decompressed_on_every_path(self, tmp_path):
        u = self.unit(tmp_path, compress={"z", "zj"})
        rng = np.random.default_rng(5)
        a = np.zeros((3, 400), np.float32)  # compresses well
        rows = [rng.integers(0, 4, 9000 + i).astype(np.int64) for i in range(3)]
        g = self.g(0, 1, 2)
        self.write(u, "z", a, g)
        self.write(u, "zj", rows, g)
        assert self.payloads(u, g, "z") == [_raw(r) for r in a]
        assert self.payloads(u, g, "zj") == [_raw(r) for r in rows]
        locs = u.locate(g, "zj")
        heads = u.read_heads(locs)
        assert all(h.flags & CODEC_MASK for h in heads) and [h.raw_len for h in heads] == [r.nbytes for r in rows]
        bufs = [bytearray(h.raw_len) for h in heads]
        got = u.read_into(locs, heads, bufs)
        assert [bytes(b) for b in (bufs if got is None else got)] == [_raw(r) for r in rows]

    # deletes, overwrites and their undo tokens --------------------------------------
    def test_delete_is_idempotent_and_can_drop_single_fields(self, tmp_path):
        u = self.unit(tmp_path)
        g = self.g(0, 1, 2)
        self.write(u, "a", np.zeros((3, 2), np.float32), g)
        self.write(u, "b", np.ones((3, 2), np.float32), g)
        assert u.delete(g[:1], ["a"]) == 1 and u.delete(g[:1], ["a"]) == 0
        assert u.delete(g[:2]) == 3 and u.delete(g[:2]) == 0
        assert u.delete(self.g(9)) == 0 and u.delete([]) == 0
        assert sorted(u.keys()) == [(g[2], "a"), (g[2], "b")]
        assert self.payloads(u, g[2:], "b") == [_raw(np.ones(2, np.float32))]

    def test_an_overwrite_settled_as_committed_keeps_the_new_payloads(self, tmp_path):
        u = self.unit(tmp_path)
        g = self.g(0, 1)
        self.write(u, "x", np.zeros((2, 3), np.int64), g)
        assert u.undo_tokens() == []
        self.write(u, "x", np.full((2, 3), 7, np.int64), g, token=5)
        assert u.undo_tokens() == [5]
        assert self.payloads(u, g, "x") == [_raw(np.full(3, 7, np.int64))] * 2  # visible before settling
        assert u.settle(5, committed=True) > 0
        assert u.undo_tokens() == [] and u.settle(5, committed=True) == 0
        assert self.payloads(u, g, "x") == [_raw(np.full(3, 7, np.int64))] * 2
        assert u.verify() == []

    def test_an_overwrite_settled_as_not_committed_puts_the_old_payloads_back(self, tmp_path):
        u = self.unit(tmp_path)
        g = self.g(0, 1)
        self.write(u, "x", np.zeros((2, 3), np.int64), g)
        self.write(u, "x", np.full((2, 3), 7, np.int64), g, token=6)
        self.write(u, "y", np.ones((1, 1), np.int8), g[:1], token=6)  # a new entry: nothing to put back
        assert u.settle(6, committed=False) > 0
        assert u.undo_tokens() == [] and u.settle(6, committed=False) == 0
        assert self.payloads(u, g, "x") == [_raw(np.zeros(3, np.int64))] * 2
        assert u.verify() == []

    def test_unsettled_tokens_survive_a_reopen(self, tmp_path):
        u = self.unit(tmp_path)
        g = self.g(0)
        self.write(u, "x", np.zeros((1, 3), np.int64), g)
        self.write(u, "x", np.ones((1, 3), np.int64), g, token=7)
        u = self.reopen(u)
        assert u.undo_tokens() == [7]
        u.settle(7, committed=False)
        assert self.payloads(u, g, "x") == [_raw(np.zeros(3, np.int64))]

    def test_written_rows_survive_a_reopen(self, tmp_path):
        u = self.unit(tmp_path)
        a = np.random.default_rng(6).standard_normal((3, 5)).astype(np.float32)
        g = self.g(0, 1, 2)
        self.write(u, "x", a, g)
        u.delete(g[1:2])
        u = self.reopen(u)
        assert sorted(u.keys()) == [(g[0], "x"), (g[2], "x")]
        assert self.payloads(u, [g[0], g[2]], "x") == [_raw(a[0]), _raw(a[2])]
        assert u.verify() == []

    # snapshots ------------------------------------------------------------------
    def test_a_snapshot_id_holds_its_cut_until_released(self, tmp_path):
        u = self.unit(tmp_path)
        g = self.g(0, 1, 2, 3)
        a = np.arange(8, dtype=np.int64).reshape(4, 2)
        self.write(u, "x", a, g)
        keys = sorted(u.keys())
        snap = u.snapshot()
        self.write(u, "x", np.full((1, 2), -1, np.int64), g[:1])  # overwrite
        self.write(u, "x", np.full((1, 2), -2, np.int64), self.g(4))  # new row
        u.delete(g[1:2])
        assert sorted(u.keys(snapshot=snap)) == keys
        assert self.payloads(u, g, "x", snapshot=snap) == [_raw(r) for r in a]
        locs = u.lookup(g, ["x"], snapshot=snap)["x"]
        assert [Loc._make(r) for r in locs.tolist()] == u.locate(g, "x", snapshot=snap)
        assert u.locate(self.g(4), "x", snapshot=snap) == [None]
        assert self.payloads(u, g[:1], "x") == [_raw(np.full(2, -1, np.int64))]
        other = u.snapshot()
        assert other != snap and (self.g(4)[0], "x") in u.keys(snapshot=other)
        u.release(snap)
        u.release(snap)  # idempotent
        u.release(other)
        for call in (lambda: u.keys(snapshot=snap), lambda: u.lookup(g, ["x"], snapshot=snap),
                     lambda: u.locate(g, "x", snapshot=snap)):
            with pytest.raises(TqstoreError):
                call()
        assert u.verify() == []

    def test_an_unknown_snapshot_id_is_a_tqstore_error(self, tmp_path):
        u = self.unit(tmp_path)
        with pytest.raises(TqstoreError):
            u.keys(snapshot=987654)

    def test_export_snapshot_writes_the_cut_under_the_directory(self, tmp_path):
        u = self.unit(tmp_path)
        self._needs(u, "export_snapshot")
        self.write(u, "x", np.arange(6, dtype=np.int64).reshape(3, 2), self.g(0, 1, 2))
        snap = u.snapshot()
        try:
            self.write(u, "x", np.zeros((2, 2), np.int64), self.g(3, 4))  # after the cut
            dest = tmp_path / "export"
            dest.mkdir()
            out = u.export_snapshot(snap, str(dest))
        finally:
            u.release(snap)
        assert out.files and out.frames in (0, 3)  # 0: the implementation does not count them
        for entry in out.files:
            p = dest / entry["path"]
            assert p.is_file(), entry
            if "size" in entry:
                assert p.stat().st_size == entry["size"], entry
        with pytest.raises(TqstoreError):
            u.export_snapshot(snap, str(tmp_path / "again"))  # released

    def test_export_rows_writes_the_cut_frames_byte_for_byte_into_a_shard(self, tmp_path):
        from .._format import dump_records as D
        from .._format.frame import decode_frame

        u = self.unit(tmp_path)
        self._needs(u, "export_rows")
        g = self.g(0, 1, 2)
        a = np.arange(12, dtype=np.int64).reshape(3, 4)
        self.write(u, "x", a, g)
        self.write(u, "y", np.ones((1, 64), np.float32), g[1:2])
        before = {(gg, f): self.payloads(u, [gg], f)[0] for gg, f in [(g[0], "x"), (g[1], "x"), (g[1], "y")]}
        snap = u.snapshot()
        try:
            self.write(u, "x", np.zeros((1, 4), np.int64), g[:1])  # after the cut: not in the shard
            u.delete(g[1:2])
            dest = tmp_path / "shard-001.tqd"
            info = u.export_rows(snap, [g[1], g[0]], [["x", "y"], ["x"]], str(dest), num_units=self.NUM_UNITS)
            with pytest.raises(TqstoreError):  # a row of another unit
                u.export_rows(snap, [g[0] + 1], [["x"]], str(tmp_path / "other"), num_units=self.NUM_UNITS)
            with pytest.raises(TqstoreError):  # a field the row does not have at the cut
                u.export_rows(snap, [g[2]], [["y"]], str(tmp_path / "lacking"), num_units=self.NUM_UNITS)
        finally:
            u.release(snap)
        raw = dest.read_bytes()
        assert (info.unit, info.size, info.frames, info.rows) == (self.UNIT_ID, len(raw), 3, 2)
        from .. import _native
        assert info.crc32c == _native.crc32c(raw)
        h = D.decode_shard_header(raw, file_size=len(raw))
        t = D.decode_shard_table(raw[h.table_offset:], h)
        assert info.payload_bytes == h.table_offset - D.SHARD_HEADER_SIZE
        got = {}
        for e, f in zip(t.entries, t.fields()):
            fr = decode_frame(raw, int(e["offset"]), int(e["length"]), expected_crc=int(e["crc"]))
            assert fr.gidx == int(e["gidx"])
            got[(int(e["gidx"]), f)] = bytes(memoryview(fr.payload).cast("B"))
        assert got == before
        with pytest.raises(TqstoreError):
            u.export_rows(snap, g[:1], [["x"]], str(tmp_path / "again"), num_units=self.NUM_UNITS)  # released

    # integrity and maintenance --------------------------------------------------------
    def test_verify_finds_a_flipped_byte_and_reads_refuse_the_frame(self, tmp_path):
        u = self.unit(tmp_path)
        g = self.g(0, 1)
        self.write(u, "x", np.arange(128, dtype=np.float32).reshape(2, 64), g)
        assert u.verify() == []
        loc = u.locate(g[1:], "x")[0]
        path = u.describe(loc)
        _flip_byte(path, loc.offset + loc.length // 2)
        problems = u.verify()
        assert len(problems) == 1 and path in problems[0]
        with pytest.raises(CorruptionError):
            u.read_frames([loc], g[1:])
        assert self.payloads(u, g[:1], "x") == [_raw(np.arange(64, dtype=np.float32))]

    def test_compact_keeps_every_live_payload(self, tmp_path):
        u = self.unit(tmp_path)
        rng = np.random.default_rng(7)
        a = rng.standard_normal((10, 32)).astype(np.float32)
        g = self.g(*range(10))
        self.write(u, "x", a, g)
        u.release(u.snapshot())  # seals the segment
        assert u.delete(g[:8]) == 8  # 20 % of it stays live
        keys = sorted(u.keys())
        assert u.compact(live_ratio=0.5) >= 1
        assert sorted(u.keys()) == keys and u.verify() == []
        assert self.payloads(u, g[8:], "x") == [_raw(a[8]), _raw(a[9])]
        u = self.reopen(u)
        assert self.payloads(u, g[8:], "x") == [_raw(a[8]), _raw(a[9])]

    # errors and failed calls ----------------------------------------------------------
    def test_reads_of_a_frame_that_is_not_there_raise_corruption_errors(self, tmp_path):
        u = self.unit(tmp_path)
        g = self.g(0, 1)
        self.write(u, "x", np.zeros((2, 4), np.float32), g)
        loc = u.locate(g[:1], "x")[0]
        bogus = Loc(loc.seg + 999, loc.offset, loc.length, loc.crc)
        for call in (lambda: u.read_frames([bogus], g[:1]), lambda: u.read_head(bogus),
                     lambda: u.read_frames([loc], g[1:])):  # the frame of another row
            with pytest.raises(CorruptionError):
                call()

    def test_a_failed_write_or_delete_changes_nothing(self, tmp_path):
        u = self.unit(tmp_path)
        g = self.g(0, 1)
        self.write(u, "x", np.zeros((2, 3), np.int64), g)
        before = (sorted(u.keys()), self.payloads(u, g, "x"))
        with self._failing("unit_commit"):
            with pytest.raises(TqstoreError):
                self.write(u, "x", np.ones((2, 3), np.int64), g, token=3)
            with pytest.raises(TqstoreError):
                self.write(u, "x", np.ones((1, 3), np.int64), self.g(5), fresh=True)
            with pytest.raises(TqstoreError):
                u.delete(g)
        assert (sorted(u.keys()), self.payloads(u, g, "x")) == before
        assert u.undo_tokens() == [] and u.verify() == []
        self.write(u, "x", np.ones((1, 3), np.int64), self.g(5), fresh=True)
        assert self.payloads(u, self.g(5), "x") == [_raw(np.ones(3, np.int64))]

    def test_a_failed_settle_writes_nothing_and_reads_give_the_decided_values(self, tmp_path):
        """A settle that cannot commit (a full disk) leaves its undo records; meanwhile reads
        give what was decided: a put rolled back is never read (unit_held), a committed one is."""
        u = self.unit(tmp_path)
        g = self.g(0)
        self.write(u, "x", np.zeros((1, 3), np.int64), g)
        self.write(u, "x", np.ones((1, 3), np.int64), g, token=4)
        with self._failing("unit_commit"):
            with pytest.raises(TqstoreError):
                u.settle(4, committed=False)
        assert u.undo_tokens() == [4] and self.payloads(u, g, "x") == [_raw(np.zeros(3, np.int64))]
        u.settle(4, committed=False)
        assert u.undo_tokens() == [] and self.payloads(u, g, "x") == [_raw(np.zeros(3, np.int64))]
        self.write(u, "x", np.full((1, 3), 2, np.int64), g, token=5)
        with self._failing("unit_commit"):
            with pytest.raises(TqstoreError):
                u.settle(5, committed=True)
        assert u.undo_tokens() == [5] and self.payloads(u, g, "x") == [_raw(np.full(3, 2, np.int64))]

    # the store's clean close ------------------------------------------------------
    def test_index_state_counts_entries_and_advances_only_on_a_change(self, tmp_path):
        u = self.unit(tmp_path)
        self._needs(u, "index_state")
        e0, c0 = u.index_state()
        g = self.g(0, 1, 2)
        self.write(u, "a", np.zeros((3, 2), np.float32), g)
        self.write(u, "b", np.ones((2, 5), np.int64), g[:2])
        e1, c1 = u.index_state(sync=True)
        assert (e0, e1) == (0, 5) and c1 > c0
        u.keys(), u.field_rows(), self.payloads(u, g, "a")  # reads commit nothing
        assert u.index_state() == (e1, c1)
        u = self.reopen(u)
        assert u.index_state() == (e1, c1)  # a reopen commits nothing either
        u.delete(g[:1])
        e2, c2 = u.index_state()
        assert e2 == 3 and c2 > c1


__all__ = ["UnitPortTests"]
