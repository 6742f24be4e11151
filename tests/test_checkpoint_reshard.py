"""Loads onto another unit count, and the pure planners behind saves and loads.

A 2-unit checkpoint restores onto 1, 3 and 5 units: rows re-routed by global index, each
target reading only its own frames' bytes (checked on the plan, without a disk), frames
copied byte for byte (compressed frames stay compressed).
"""
from __future__ import annotations

import pickle

import pytest
import torch

import tqstore
from tqstore import CorruptionError
from tqstore._format.layout import INDEX_KEY_HEAD, INDEX_VALUE
from tqstore.checkpoint.planner import (
    COPY, LINK, REUSE, FrameRef, FrameTable, RangeFrame, Reusable, SegmentSource, plan_load_mode, plan_reshard, plan_segment_writes,
)

from checkpoint_helpers import fill, state


@pytest.fixture(scope="module")
def two_unit_checkpoint(tmp_path_factory):
    d = tmp_path_factory.mktemp("reshard")
    with tqstore.open(d / "src", num_units=2, segment_bytes=1 << 16) as s:  # several segments per unit
        fill(s, "train", 40)
        fill(s, "val", 9, prefix="v", seed=2)
        s.kv_clear(["k3", "k4", "k17"], "train")  # holes, dead frames, freed indexes
        fill(s, "train", 5, start=30, seed=5)  # overwrites: dead frames in old segments
        s.get_meta(["text"], 6, "train", task_name="t")
        want = state(s)
        s.save_checkpoint(d / "ckpt")
    return d / "ckpt", want


def _unit_rows(store):
    out = []
    for u in store.units:
        with u.env.begin() as txn:
            out.append({INDEX_KEY_HEAD.unpack(bytes(k[:8]))[0] for k in txn.cursor(u.db_loc).iternext(values=False)})
    return out


@pytest.mark.parametrize("target_units", [1, 3, 5])
def test_restore_onto_another_unit_count_routes_rows_by_global_index(two_unit_checkpoint, tmp_path, target_units):
    ckpt, want = two_unit_checkpoint
    with tqstore.open(tmp_path / "dst", num_units=target_units, segment_bytes=1 << 16) as s:
        fill(s, "junk", 3)
        li = s.load_checkpoint(ckpt)
        assert li.mode == "reshard" and li.source_units == 2 and li.num_units == target_units
        assert state(s) == want
        for u, gidxs in enumerate(_unit_rows(s)):
            assert all(g % target_units == u for g in gidxs)
        assert not s.verify()
        fill(s, "train", 4, start=500, seed=9)  # the store keeps working: new rows, new segments
        assert len(set(s.controller.rows)) == len(want["rows"]) + 4
    with tqstore.open(tmp_path / "dst") as s:
        assert s.num_units == target_units
        rows = state(s)["rows"]
        assert {k: v for k, v in rows.items() if k in want["rows"]} == want["rows"]


@pytest.mark.parametrize("direct", [True, False])
def test_a_reshard_load_gives_the_same_store_with_or_without_direct_io_and_frames_larger_than_a_batch(
        tmp_path, monkeypatch, direct):
    """Targets read their frames in small batches here (frames larger than a batch included)
    and write new segments with direct I/O or through the page cache: the same store."""
    from tqstore import unit_import
    from tqstore._io import segfile

    monkeypatch.setattr(segfile, "DIRECT_IO", direct)
    monkeypatch.setattr(unit_import, "BATCH_BYTES", 1 << 16)
    with tqstore.open(tmp_path / "src", num_units=2, segment_bytes=1 << 18) as s:
        fill(s, "train", 30)
        g = torch.Generator().manual_seed(3)
        s.kv_batch_put([f"big{i}" for i in range(5)], "train",
                       {"blob": [torch.randint(0, 1 << 30, (30_000 + 977 * i,), generator=g) for i in range(5)]})
        want = state(s)
        s.save_checkpoint(tmp_path / "ck")
    with tqstore.open(tmp_path / "dst", num_units=3, segment_bytes=1 << 18) as s:
        assert s.load_checkpoint(tmp_path / "ck").mode == "reshard"
        assert state(s) == want and not s.verify()
    with tqstore.open(tmp_path / "dst") as s:
        assert state(s) == want


def test_a_target_plan_crosses_a_process_boundary_with_its_own_keys_only():
    """A target's keys are picked from all sources lazily; pickled (an actor call), the plan
    carries exactly its own keys."""
    refs = _refs(2, 40)
    plan = plan_reshard(refs, 3)
    for t in plan.targets:
        back = pickle.loads(pickle.dumps(t))
        mine = sorted(r.key for rs in refs.values() for r in rs if r.gidx % 3 == t.unit)
        assert sorted(back.keys) == sorted(t.keys) == mine
        assert isinstance(back.keys, list) and len(back.keys) == len(t.offset)
        assert [r.frames for r in back.ranges] == [r.frames for r in t.ranges]


def test_reshard_round_trip_back_to_the_original_count(two_unit_checkpoint, tmp_path):
    ckpt, want = two_unit_checkpoint
    with tqstore.open(tmp_path / "three", num_units=3) as s:
        s.load_checkpoint(ckpt)
        s.save_checkpoint(tmp_path / "ckpt3")
    with tqstore.open(tmp_path / "two", num_units=2) as s:
        s.load_checkpoint(tmp_path / "ckpt3")
        assert state(s) == want


def test_reshard_copies_compressed_frames_byte_for_byte(tmp_path):
    with tqstore.open(tmp_path / "src", num_units=2, compress="zstd") as s:
        fill(s, "train", 10)
        want = state(s)
        s.save_checkpoint(tmp_path / "ckpt")
    with tqstore.open(tmp_path / "dst", num_units=3) as s:  # this store would not compress
        s.load_checkpoint(tmp_path / "ckpt")
        assert state(s) == want
        src_bytes = sum(p.stat().st_size for p in (tmp_path / "ckpt").glob("unit-*/seg-*.tqs"))
        dst_bytes = sum(p.stat().st_size for p in s.state_dir.glob("unit-*/seg-*.tqs"))
        assert dst_bytes <= src_bytes + 3 * 64  # same frames (plus one header per unit), not re-encoded


def test_a_reshard_load_rejects_a_damaged_frame_and_keeps_the_store(two_unit_checkpoint, tmp_path):
    from checkpoint_helpers import first_segment, flip_byte, payload_offset_of_first_frame
    import shutil

    ckpt, _ = two_unit_checkpoint
    bad = tmp_path / "bad"
    shutil.copytree(ckpt, bad)
    seg = first_segment(bad)
    off = payload_offset_of_first_frame(seg)
    flip_byte(seg, off)
    with tqstore.open(tmp_path / "dst", num_units=3) as s:
        fill(s, "live", 5)
        before, state_dir = state(s), s.state_dir
        with pytest.raises(CorruptionError) as ei:
            s.load_checkpoint(bad)
        assert str(seg) in str(ei.value) and ei.value.offset is not None
        assert ei.value.offset <= off
        assert state(s) == before and s.state_dir == state_dir
        assert sorted(p.name for p in (tmp_path / "dst").glob("state-*")) == [state_dir.name]


# ------------------------------------------------------------------ planners (no disk)
def _refs(src_units: int, rows: int, fields=("a", "b"), length=128):
    """Index entries as a store writes them: per unit, per batch, field-major, appended."""
    out = {u: [] for u in range(src_units)}
    off = {u: 64 for u in range(src_units)}
    for f in fields:
        for g in range(rows):
            u = g % src_units
            key = INDEX_KEY_HEAD.pack(g) + f.encode()
            out[u].append(FrameRef(key, g, 1, off[u], length, (g * 31 + len(f)) & 0xFFFFFFFF))
            off[u] += length
    return out


@pytest.mark.parametrize("m", [1, 2, 3, 5])
def test_plan_reshard_sends_each_frame_once_to_gidx_mod_m(m):
    refs = _refs(2, 30)
    plan = plan_reshard(refs, m)
    assert plan.num_sources == 2 and plan.num_targets == m and len(plan.targets) == m
    seen = []
    for t in plan.targets:
        for r in t.ranges:
            for f in map(RangeFrame._make, r.frames):
                g = INDEX_KEY_HEAD.unpack(f.key[:8])[0]
                assert g % m == t.unit
                seen.append(f.key)
    assert sorted(seen) == sorted(x.key for v in refs.values() for x in v)


@pytest.mark.parametrize("m", [1, 3, 5])
def test_each_target_reads_only_its_own_frames_bytes(m):
    refs = _refs(2, 40)
    plan = plan_reshard(refs, m)
    by_key = {x.key: x for v in refs.values() for x in v}
    total = sum(x.length for x in by_key.values())
    assert plan.nbytes == total  # nothing between frames is read
    for t in plan.targets:
        own = sum(x.length for x in by_key.values() if x.gidx % m == t.unit)
        assert t.nbytes == own
        for r in t.ranges:
            assert sum(f[2] for f in r.frames) == r.length  # a range is exactly its frames
            for f in map(RangeFrame._make, r.frames):
                src = by_key[f.key]
                assert (r.seg, r.offset + f.rel_offset, f.length, f.crc) == (src.seg, src.offset, src.length, src.crc)


def test_plan_reshard_coalesces_adjacent_frames_and_caps_range_size():
    refs = {0: [FrameRef(INDEX_KEY_HEAD.pack(g) + b"x", g, 1, 64 + 100 * g, 100, g) for g in range(10)]}
    one = plan_reshard(refs, 1)
    assert [(r.offset, r.length, len(r.frames)) for r in one.targets[0].ranges] == [(64, 1000, 10)]
    capped = plan_reshard(refs, 1, max_range_bytes=300)
    assert [r.length for r in capped.targets[0].ranges] == [300, 300, 300, 100]
    split = plan_reshard(refs, 2)  # alternate frames: no two adjacent, nothing in between read
    assert all(len(r.frames) == 1 for t in split.targets for r in t.ranges)
    ordered = [(r.src_unit, r.seg, r.offset) for r in split.targets[1].ranges]
    assert ordered == sorted(ordered)


def test_plan_reshard_rejects_overlapping_entries_even_when_routed_apart():
    refs = {0: [FrameRef(b"\0" * 8 + b"a", 0, 1, 64, 128, 1), FrameRef(b"\0" * 8 + b"b", 0, 1, 128, 128, 2)]}
    with pytest.raises(CorruptionError):
        plan_reshard(refs, 1)
    apart = {0: [FrameRef(INDEX_KEY_HEAD.pack(0) + b"a", 0, 1, 64, 128, 1),
                 FrameRef(INDEX_KEY_HEAD.pack(1) + b"a", 1, 1, 128, 128, 2)]}
    with pytest.raises(CorruptionError):
        plan_reshard(apart, 2)


def test_frame_tables_from_refs_and_from_index_agree():
    refs = _refs(1, 9)[0]
    a = FrameTable.from_refs(refs)
    values = b"".join(INDEX_VALUE.pack(r.seg, r.offset, r.length, r.crc) for r in refs)
    b = FrameTable.from_index([r.key for r in refs], values)
    for col in ("gidx", "seg", "offset", "length", "crc"):
        assert getattr(a, col).tolist() == getattr(b, col).tolist()
    assert plan_reshard({0: a}, 2).nbytes == plan_reshard({0: b}, 2).nbytes == sum(r.length for r in refs)


def test_plan_load_mode():
    assert plan_load_mode(2, 2, True) == "same"
    assert plan_load_mode(2, 3, True) == "reshard"
    assert plan_load_mode(2, 3, False) == "metadata"


def _src(seg, *, sealed=True, size=1000, file_size=None, ident=None):
    return SegmentSource(0, seg, f"/s/seg-{seg}", size, sealed, size if file_size is None else file_size,
                         ident or f"id{seg}", 3, 900)


def test_plan_segment_writes_links_sealed_segments_and_copies_the_rest():
    srcs = [_src(1), _src(2, sealed=False), _src(3, file_size=1064), _src(4)]
    plan = plan_segment_writes(srcs, link=True, known_crc={"id4": 77})
    assert [w.method for w in plan] == [LINK, COPY, COPY, LINK]
    assert plan[0].crc32c is None and plan[3].crc32c == 77
    assert [w.method for w in plan_segment_writes(srcs, link=False)] == [COPY] * 4


def test_plan_segment_writes_reuses_identical_files_of_earlier_generations():
    srcs = [_src(1), _src(2)]
    reuse = {"id1": Reusable("/gen/1/seg", 1000, 5), "id2": Reusable("/gen/1/seg2", 999, 6)}
    plan = plan_segment_writes(srcs, link=False, reuse=reuse)
    assert [w.method for w in plan] == [REUSE, COPY]  # a size mismatch is never reused
    assert plan[0].link_from == "/gen/1/seg" and plan[0].crc32c == 5
