"""Storage unit: segment files of frames plus an LMDB index, on real files.

Runs with the C record path and with the pure-Python one (``record_path`` fixture).
"""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from tqstore.torch_adapter import row_to_object, to_column
from tqstore._format.layout import SEGMENT_HEADER_SIZE
from tqstore._format.segment import segment_name
from tqstore._io import failpoints as fp
from tqstore.errors import CorruptionError, StorageIOError
from tqstore.unit import Unit

pytestmark = pytest.mark.usefixtures("record_path")

SEG = 1 << 16  # the smallest segment bound a store accepts: a few batches per segment


@pytest.fixture
def unit(tmp_path):
    u = Unit(tmp_path / "u", 0, segment_bytes=SEG)
    yield u
    u.close()


def put(u: Unit, gidxs, fields, *, fresh=True):
    """Write ``fields`` (name -> batched value) to rows ``gidxs`` in one unit call."""
    n = len(gidxs)
    cols = [to_column(f, v, n) for f, v in fields.items()]
    return u.write([(c, list(range(n)), list(gidxs)) for c in cols], fresh=fresh)


def get(u: Unit, g: int, field: str, snapshot=None):
    (loc,) = u.locate([g], field, snapshot=snapshot)
    assert loc is not None, (g, field)
    fr = u.read_frame(loc)
    return row_to_object(fr.kind, fr.dtype, fr.shape, u.decode_payload(fr))


def frame_bytes(u: Unit, g: int, field: str) -> bytes:
    (loc,) = u.locate([g], field)
    with open(u.path / segment_name(loc.seg), "rb") as f:
        f.seek(loc.offset)
        return f.read(loc.length)


def seg_files(u: Unit):
    return sorted(n for n in os.listdir(u.path) if n.endswith(".tqs"))


def rows(n, seed=0, width=16):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-2**62, 2**62, (n, width), dtype=torch.int64, generator=g)


# ---------------------------------------------------------------------------- writing

def test_batch_is_one_vectored_write_and_one_index_transaction(unit):
    put(unit, [0], {"x": rows(1)})  # creates the active segment (header write)
    fp.start_counting()
    try:
        put(unit, range(1, 201), {"x": rows(200, 1), "y": torch.randn(200, 3000), "z": [f"s{i}" for i in range(200)]})
    finally:
        counts = fp.stop_counting()
    assert counts.get("write") == 1
    assert counts.get("unit_commit") == 1


def test_written_rows_read_back_bit_identical_small_and_large(unit):
    x = rows(50)
    big = torch.randn(50, 20000)  # 80 KB rows: framed one by one, not in bulk
    vals = [{"i": i, "s": "é" * i} for i in range(50)]
    put(unit, range(100, 150), {"x": x, "big": big, "v": vals})
    for i in range(50):
        assert torch.equal(get(unit, 100 + i, "x"), x[i])
        assert get(unit, 100 + i, "big").numpy().tobytes() == big[i].numpy().tobytes()
        assert get(unit, 100 + i, "v") == vals[i]
    assert sorted(unit.keys()) == sorted((g, f) for g in range(100, 150) for f in ("big", "v", "x"))


def test_overwrite_replaces_entry_and_counts_old_bytes_dead(unit):
    put(unit, [1, 2], {"x": rows(2, 1)})
    live_before = sum(i.live for i in unit.segments().values())
    new = rows(2, 2)
    put(unit, [1, 2], {"x": new}, fresh=False)
    assert torch.equal(get(unit, 1, "x"), new[0]) and torch.equal(get(unit, 2, "x"), new[1])
    assert sum(i.live for i in unit.segments().values()) == live_before


def test_failed_commit_leaves_index_unchanged_and_next_write_works(unit):
    x = rows(4)
    put(unit, range(4), {"x": x})
    fp.arm("unit_commit", "eio")
    try:
        with pytest.raises(StorageIOError):
            put(unit, range(4, 8), {"x": rows(4, 9)})
    finally:
        fp.disarm()
    assert unit.locate(list(range(4, 8)), "x") == [None] * 4
    y = rows(4, 3)
    put(unit, range(4, 8), {"x": y})
    for i in range(4):
        assert torch.equal(get(unit, i, "x"), x[i]) and torch.equal(get(unit, 4 + i, "x"), y[i])


# ---------------------------------------------------------------------------- verified reads

def test_read_of_flipped_payload_byte_raises_corruption_naming_file_and_offset(unit):
    put(unit, range(3), {"x": rows(3)})
    (loc,) = unit.locate([1], "x")
    path = unit.path / segment_name(loc.seg)
    with open(path, "r+b") as f:
        f.seek(loc.offset + 64 + 5)  # inside the payload
        b = f.read(1)
        f.seek(loc.offset + 64 + 5)
        f.write(bytes([b[0] ^ 0x04]))
    unit.maps.clear()
    with pytest.raises(CorruptionError) as ei:
        unit.read_frame(loc)
    assert ei.value.path == str(path) and ei.value.offset == loc.offset
    heads = unit.read_heads([loc])
    dest = bytearray(heads[0].payload_len)
    with pytest.raises(CorruptionError):
        unit.read_into([loc], heads, [dest])
    problems = unit.verify()
    assert len(problems) == 1 and str(loc.offset) in problems[0]
    assert torch.equal(get(unit, 0, "x"), rows(3)[0])  # neighbours still read


def test_read_of_truncated_segment_raises_corruption(unit):
    put(unit, range(3), {"x": rows(3)})
    (loc,) = unit.locate([2], "x")
    os.truncate(unit.path / segment_name(loc.seg), loc.offset + loc.length - 1)
    unit.maps.clear()
    with pytest.raises(CorruptionError):
        unit.read_frame(loc)


def test_read_into_fills_destinations_and_checks_crc(unit):
    x = torch.randn(5, 30000)
    put(unit, range(5), {"x": x})
    locs = unit.locate(list(range(5)), "x")
    heads = unit.read_heads(locs)
    out = torch.empty(5, 30000)
    views = [out[i].view(torch.uint8).numpy() for i in range(5)]
    unit.read_into(locs, heads, views)
    assert torch.equal(out, x)


# ---------------------------------------------------------------------------- deletes

def test_delete_drops_entries_and_live_bytes(unit):
    put(unit, range(10), {"x": rows(10), "y": rows(10, 1)})
    live = sum(i.live for i in unit.segments().values())
    assert unit.delete([3, 4], ["y"]) == 2
    assert unit.locate([3, 4], "y") == [None, None]
    assert unit.locate([3], "x")[0] is not None
    assert unit.delete([5, 6]) == 4
    assert unit.locate([5, 6], "x") == [None, None] and unit.locate([5, 6], "y") == [None, None]
    assert unit.delete([5, 6, 999]) == 0  # idempotent
    assert (5, "x") not in unit.keys()
    assert sum(i.live for i in unit.segments().values()) < live


def fill_segments(u: Unit, n_segments: int, rows_per_batch=20):
    """Write batches until ``n_segments`` sealed segments exist; returns {gidx: row tensor}."""
    data = {}
    g = 0
    while sum(i.sealed for i in u.segments().values()) < n_segments:
        x = rows(rows_per_batch, g, width=128)  # ~1 KB rows, ~20 KB batches
        put(u, range(g, g + rows_per_batch), {"x": x})
        data.update({g + i: x[i] for i in range(rows_per_batch)})
        g += rows_per_batch
    return data


def rows_in(u: Unit, seg: int):
    return [g for g, f in u.keys() if u.locate([g], f)[0].seg == seg]


def test_sealed_segment_without_live_bytes_is_unlinked(unit):
    data = fill_segments(unit, 2)
    segs = unit.segments()
    first = min(segs)
    assert segs[first].sealed
    assert (unit.path / segment_name(first)).exists()
    victims = rows_in(unit, first)
    unit.delete(victims[:-1])
    assert (unit.path / segment_name(first)).exists()  # one live row keeps it
    unit.delete(victims[-1:])
    assert not (unit.path / segment_name(first)).exists()
    assert first not in unit.segments()
    for g, x in data.items():
        if g not in victims:
            assert torch.equal(get(unit, g, "x"), x)


def test_active_segment_is_not_unlinked_when_emptied(unit):
    put(unit, range(3), {"x": rows(3)})
    (seg,) = unit.segments()
    unit.delete(range(3))
    assert (unit.path / segment_name(seg)).exists()
    put(unit, range(3, 5), {"x": rows(2)})
    assert torch.equal(get(unit, 4, "x"), rows(2)[1])


def test_segments_seal_at_their_size_bound(unit):
    fill_segments(unit, 3)
    segs = unit.segments()
    sealed = [s for s, i in segs.items() if i.sealed]
    assert len(sealed) >= 3
    for s in sealed:
        assert segs[s].size == os.path.getsize(unit.path / segment_name(s))
        assert segs[s].size >= SEG


# ---------------------------------------------------------------------------- compaction

def test_compaction_keeps_live_rows_bit_identical_and_removes_old_segment(unit):
    data = fill_segments(unit, 2)
    first = min(unit.segments())
    victims = rows_in(unit, first)
    keep = victims[::4]
    unit.delete([g for g in victims if g not in keep])
    before = {g: frame_bytes(unit, g, "x") for g in keep}
    assert unit.compact() >= 1
    assert not (unit.path / segment_name(first)).exists()
    assert first not in unit.segments()
    for g in keep:
        assert unit.locate([g], "x")[0].seg != first
        assert frame_bytes(unit, g, "x") == before[g]  # frames are moved byte for byte
    for g, x in data.items():
        if g in keep or g not in victims:
            assert torch.equal(get(unit, g, "x"), x)
    assert unit.verify() == []
    assert unit.compact() == 0  # nothing left to do


def test_compaction_skips_mostly_live_segments(unit):
    fill_segments(unit, 2)
    first = min(unit.segments())
    victims = rows_in(unit, first)
    unit.delete(victims[:2])
    assert unit.compact() == 0
    assert (unit.path / segment_name(first)).exists()


# ---------------------------------------------------------------------------- pins

def test_pinned_segment_survives_deletes_and_compaction_until_released(unit):
    data = fill_segments(unit, 1)
    sid = unit.snapshot()  # seals the active segment too
    pinned = set(unit.pinned())
    assert pinned and all(unit.segments()[s].sealed for s in pinned)
    unit.delete(list(data))
    assert unit.compact(live_ratio=1.0) == 0
    for s in pinned:
        assert (unit.path / segment_name(s)).exists()
    assert unit.keys() == []
    # the view still sees and reads every row, bit-identical
    for g, x in data.items():
        assert torch.equal(get(unit, g, "x", snapshot=sid), x)
    # writes continue into a new segment meanwhile
    put(unit, [10_000], {"x": rows(1, 5)})
    assert not pinned & {s for s, i in unit.segments().items() if not i.sealed}
    unit.release(sid)
    unit.release(sid)  # idempotent
    for s in pinned:
        assert not (unit.path / segment_name(s)).exists()
    assert torch.equal(get(unit, 10_000, "x"), rows(1, 5)[0])


def test_two_pins_keep_a_segment_until_both_release(unit):
    data = fill_segments(unit, 1)
    a, b = unit.snapshot(), unit.snapshot()
    segs = set(unit.pinned())
    unit.delete(list(data))
    unit.release(a)
    assert all((unit.path / segment_name(s)).exists() for s in segs)
    unit.release(b)
    assert not any((unit.path / segment_name(s)).exists() for s in segs)


# ---------------------------------------------------------------------------- reopen

def test_reopen_after_clean_close_reads_everything(tmp_path):
    u = Unit(tmp_path / "u", 3, segment_bytes=SEG)
    data = fill_segments(u, 2)
    u.close()
    u = Unit(tmp_path / "u", 3, segment_bytes=SEG)
    try:
        for g, x in data.items():
            assert torch.equal(get(u, g, "x"), x)
        assert u.verify() == []
    finally:
        u.close()


def test_torn_tail_of_active_segment_is_ignored_on_reopen(tmp_path):
    u = Unit(tmp_path / "u", 0, segment_bytes=1 << 30)
    x = rows(8)
    put(u, range(8), {"x": x})
    (seg,) = u.segments()
    size = u.segments()[seg].size
    u.close()
    path = tmp_path / "u" / segment_name(seg)
    # an unacknowledged batch torn half way: a valid-looking frame start, then garbage
    torn = bytearray(open(path, "rb").read()[SEGMENT_HEADER_SIZE:SEGMENT_HEADER_SIZE + 300])
    with open(path, "ab") as f:
        f.write(torn + os.urandom(77))
    u = Unit(tmp_path / "u", 0, segment_bytes=1 << 30)
    try:
        assert os.path.getsize(path) == size
        for i in range(8):
            assert torch.equal(get(u, i, "x"), x[i])
        y = rows(3, 1)
        put(u, range(8, 11), {"x": y})  # appends right after the last committed frame
        assert u.locate([8], "x")[0].offset == size
        for i in range(3):
            assert torch.equal(get(u, 8 + i, "x"), y[i])
        assert u.verify() == []
    finally:
        u.close()


def test_write_whose_index_commit_failed_is_gone_after_reopen(tmp_path):
    u = Unit(tmp_path / "u", 0)
    x = rows(4)
    put(u, range(4), {"x": x})
    fp.arm("unit_commit", "eio")
    try:
        with pytest.raises(StorageIOError):
            put(u, range(4, 8), {"x": rows(4, 1)})
    finally:
        fp.disarm()
    u.close()
    u = Unit(tmp_path / "u", 0)
    try:
        assert sorted(g for g, _ in u.keys()) == [0, 1, 2, 3]
        for i in range(4):
            assert torch.equal(get(u, i, "x"), x[i])
    finally:
        u.close()


def test_segment_shortened_by_power_loss_drops_rows_past_its_end(tmp_path):
    u = Unit(tmp_path / "u", 0)
    x = rows(6)
    put(u, range(6), {"x": x})
    locs = u.locate(list(range(6)), "x")
    u.close()
    os.truncate(tmp_path / "u" / segment_name(locs[0].seg), locs[3].offset + 10)  # rows 3.. lost
    u = Unit(tmp_path / "u", 0)
    try:
        assert sorted(g for g, _ in u.keys()) == [0, 1, 2]
        for i in range(3):
            assert torch.equal(get(u, i, "x"), x[i])
        assert u.verify() == []
        put(u, [7], {"x": rows(1, 2)})
        assert torch.equal(get(u, 7, "x"), rows(1, 2)[0])
    finally:
        u.close()


def test_segment_file_unknown_to_the_index_is_removed_on_open(tmp_path):
    u = Unit(tmp_path / "u", 0)
    put(u, [0], {"x": rows(1)})
    u.close()
    stray = tmp_path / "u" / segment_name(999)
    stray.write_bytes(b"\0" * 128)
    u = Unit(tmp_path / "u", 0)
    try:
        assert not stray.exists()
        assert torch.equal(get(u, 0, "x"), rows(1)[0])
    finally:
        u.close()


def test_compressed_unit_round_trips_and_stores_fewer_bytes(tmp_path):
    u = Unit(tmp_path / "u", 0, compress="zstd")
    tok = torch.from_numpy(np.random.default_rng(0).integers(0, 50, (32, 4096))).to(torch.int64)
    try:
        n = put(u, range(32), {"tok": tok, "v": ["abc" * 50] * 32})
        assert n < tok.nbytes / 2
        for i in range(32):
            assert torch.equal(get(u, i, "tok"), tok[i])
            assert get(u, i, "v") == "abc" * 50
    finally:
        u.close()


# ---------------------------------------------------------------------------- a snapshot's export
def test_an_export_reads_the_snapshots_locations_in_bulk_or_by_cursor_alike(unit):
    """A checkpoint's unit export reads every location value of its snapshot: in bulk from the
    index file's pages while the snapshot's meta page is in the file, through a cursor once
    later commits overwrote it; both give the snapshot's values, never later ones."""
    from tqstore._io.lmdbenv import read_columns
    from tqstore._native import IMPLEMENTATION
    from tqstore.unit_export import _loc_values

    put(unit, range(0, 300), {"a": rows(300), "b": rows(300, seed=1, width=3)})
    sid = unit.snapshot()
    try:
        txn = unit._snapshot_txn(sid)
        want = b"".join(txn.cursor(db=unit.db_loc).iternext(keys=False, values=True))
        assert len(want) == 600 * 20
        assert (read_columns(unit.env, txn, [b"loc"]) is not None) == (IMPLEMENTATION == "native")
        assert bytes(_loc_values(unit, txn)) == want
        for i in range(3):  # later commits: overwrites and new rows; the meta page of the snapshot is reused
            put(unit, range(i * 50, i * 50 + 80), {"a": rows(80, seed=10 + i)}, fresh=False)
        assert read_columns(unit.env, txn, [b"loc"]) is None
        assert bytes(_loc_values(unit, txn)) == want
    finally:
        unit.release(sid)
