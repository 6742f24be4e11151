"""Small segments are merged: every snapshot (checkpoint save, dump) seals each unit's active
segment, so a store that keeps its rows would grow a segment file per unit and save, and
every link-mode save links them all.  On real LMDB and files; the C record path and the
pure-Python one (``record_path``: the index is read in bulk by the first, entry by entry by
the second)."""
from __future__ import annotations

import pytest
import torch

import tqstore
from tqstore import Store
from tqstore._io import failpoints as fp
from tqstore.errors import StorageIOError
from tqstore.unit_compact import MERGE_AT, SMALL_FRACTION

pytestmark = pytest.mark.usefixtures("record_path")

SEG = 1 << 20  # segment_bytes: a save's few rows are far below SEG // SMALL_FRACTION live bytes


def put_step(s, step: int, rows: int = 3):
    keys = [f"k{step}-{j}" for j in range(rows)]
    s.kv_batch_put(keys, "p", fields={"x": torch.full((rows, 200), float(step)),
                                      "ids": torch.arange(step, step + rows * 7).reshape(rows, 7)},
                   tags=[{"step": step}] * rows)
    return keys


def expect_rows(s, keys):
    got = s.kv_batch_get(keys, "p")
    steps = [int(k[1:].split("-")[0]) for k in keys]
    assert torch.equal(got["x"], torch.stack([torch.full((200,), float(t)) for t in steps]))
    assert [int(r[0]) for r in got["ids"]] == [t + 7 * int(k.split("-")[1]) for k, t in zip(keys, steps)]


def segment_files(s):
    return [sum(1 for p in u.path.iterdir() if p.name.endswith(".tqs")) for u in s.units]


def test_saves_of_a_store_that_keeps_its_rows_leave_a_bounded_number_of_segments(tmp_path):
    keys, early_keys = [], None
    with tqstore.open(tmp_path / "s", num_units=2, segment_bytes=SEG) as s:
        for step in range(3 * MERGE_AT):
            keys += put_step(s, step)
            s.save_checkpoint(tmp_path / f"ck{step % 2}")  # link mode: every segment file is linked
            if step == MERGE_AT - 1:  # the newest save before the first merge: it links the small files
                s.save_checkpoint(tmp_path / "early")
                early_keys = list(keys)
        assert max(segment_files(s)) <= MERGE_AT + 1, segment_files(s)
        assert max(len(u.segments()) for u in s.units) <= MERGE_AT + 1
        expect_rows(s, keys)
        assert s.verify() == []
    tqstore.verify_checkpoint(tmp_path / "early")  # (raises CorruptionError for a missing or changed file)
    # a checkpoint taken before the merges still holds the files it linked, and loads
    with tqstore.open(tmp_path / "t", num_units=2) as t:
        t.load_checkpoint(tmp_path / "early")
        expect_rows(t, early_keys)
        assert sorted(t.kv_list("p")["p"]) == sorted(early_keys)
    with tqstore.open(tmp_path / "u", num_units=3) as u:
        u.load_checkpoint(tmp_path / f"ck{(3 * MERGE_AT - 1) % 2}")
        expect_rows(u, keys)
    with tqstore.open(tmp_path / "s") as s:  # and the merged store reopens whole
        expect_rows(s, keys)
        assert s.verify() == []


def test_no_merge_while_a_snapshot_pins_the_segments_the_last_release_merges(tmp_path):
    keys = []
    with tqstore.open(tmp_path / "s", num_units=1, segment_bytes=SEG) as s:
        with s._write_lock:
            held = s.snapshot()
        for step in range(MERGE_AT + 4):
            keys += put_step(s, step)
            s.save_checkpoint(tmp_path / "ck")
        assert segment_files(s)[0] >= MERGE_AT + 4  # pinned by the held cut: nothing merged
        held.release()
        assert segment_files(s)[0] <= 2  # every small one moved into the active segment
        expect_rows(s, keys)
        assert s.verify() == []


def test_explicit_compact_merges_two_or_more_small_segments(tmp_path):
    keys = []
    with tqstore.open(tmp_path / "s", num_units=1, segment_bytes=SEG) as s:
        for step in range(4):  # below MERGE_AT: the releases leave them
            keys += put_step(s, step)
            with s._write_lock:
                snap = s.snapshot()
            snap.release()
        assert segment_files(s) == [4]
        assert s.compact() == 4
        assert segment_files(s) == [1]
        expect_rows(s, keys)
        keys += put_step(s, 99)
        expect_rows(s, keys)


@pytest.mark.parametrize("fault", ["write", "fsync_file", "fsync_dir"])
def test_a_compaction_that_fails_changes_nothing_and_later_writes_survive_reopen(tmp_path, fault):
    keys = []
    with Store(tmp_path / "s", num_units=1, segment_bytes=SEG, durability="commit") as s:
        for step in range(5):  # mostly dead segments (any compaction moves their rows)
            got = put_step(s, step, rows=6)
            s.kv_clear(got[2:], "p")
            keys += got[:2]
            with s._write_lock:
                snap = s.snapshot()
            snap.release()
        before = segment_files(s)
        fp.arm(fault, "eio", 1)
        try:
            with pytest.raises(StorageIOError):
                s.compact()
        finally:
            fp.disarm()
        expect_rows(s, keys)
        assert s.verify() == []
        for step in range(5, 8):  # appended after the failed compaction's unindexed bytes
            keys += put_step(s, step)
        expect_rows(s, keys)
        assert len(segment_files(s)) == len(before)
    with Store(tmp_path / "s") as s:
        expect_rows(s, keys)
        assert s.verify() == []
        assert s.compact() >= 2  # and the compaction runs once the fault is gone
        expect_rows(s, keys)


def test_small_means_little_live_data_whatever_the_file_size(tmp_path):
    """A big segment whose rows were mostly cleared is small too: the next merge moves its
    few live frames and its file goes."""
    with tqstore.open(tmp_path / "s", num_units=1, segment_bytes=SEG) as s:
        big = [f"b{j}" for j in range(40)]
        s.kv_batch_put(big, "p", fields={"x": torch.ones(40, 4000)})
        with s._write_lock:
            snap = s.snapshot()
        snap.release()
        s.kv_clear(big[1:], "p")
        (seg,) = [i for i in s.units[0].segments().values() if i.sealed]
        assert seg.size > SEG // SMALL_FRACTION > seg.live
        keys = []
        for step in range(MERGE_AT):
            keys += put_step(s, step)
            s.save_checkpoint(tmp_path / "ck")
        assert segment_files(s)[0] <= 2
        assert torch.equal(s.kv_batch_get(big[:1], "p")["x"], torch.ones(1, 4000))
        expect_rows(s, keys)
