"""Selective dump by key (issue 10, the dump half): what a dump holds, what it refuses, and
how it is published (docs/FORMAT.md, "Dump directory")."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

import tqstore
from tqstore import (CheckpointError, InvalidInputError, KeyNotFoundError, NotFoundError, PartitionNotFoundError,
                     RestorePendingError)
from tqstore._io import failpoints as fp
from tqstore._io import locks
from tqstore.dump import describe_dump, lock_path, read_row_index, verify_dump

from checkpoint_helpers import canon, fill
from dump_helpers import dump_frames, dump_picture, store_frames


@pytest.fixture
def store(tmp_path):
    s = tqstore.open(tmp_path / "store", num_units=3, segment_bytes=1 << 16)
    yield s
    s.close()


def _siblings(d: Path):
    return sorted(n for n in os.listdir(d.parent) if n.startswith(d.name))


def test_dump_holds_only_the_selected_keys_with_tags_fields_and_their_frames_byte_for_byte(store, tmp_path):
    keys = fill(store, "train", 12)
    fill(store, "other", 3, prefix="o")
    store.kv_put("bare", "train", fields=None, tag={"waiting": True})  # a row with no produced field
    pick = [keys[7], keys[1], "bare", keys[7], keys[10]]  # a duplicate: dropped, the first kept
    rep = store.dump_data_by_key(tmp_path / "d", pick, "train")
    gidx = store.controller.parts["train"].keys
    assert rep["keys"] == 4 and rep["rows_with_data"] == 3
    assert rep["shards"] == len({gidx[k] % 3 for k in (keys[7], keys[1], keys[10])})
    assert rep["bytes"] == sum(p.stat().st_size for p in (tmp_path / "d").iterdir())
    ri = read_row_index(tmp_path / "d")
    assert ri["partition_id"] == "train" and ri["format_version"] == 1
    assert list(ri["rows"]) == [keys[1], keys[7], keys[10], "bare"]  # in the partition's insertion order
    tags = store.kv_list("train")["train"]
    for k in (keys[7], keys[1], keys[10]):
        r = ri["rows"][k]
        assert r["tag"] == tags[k] and r["gidx"] == store.controller.parts["train"].keys[k]
        assert r["fields"] == sorted(["input_ids", "bf16", "logprobs", "np", "text", "info"])
    assert ri["rows"]["bare"]["fields"] == [] and ri["rows"]["bare"]["tag"] == {"waiting": True}
    assert ri["schemas"]["logprobs"] == {"kind": "tensor", "dtype": "float32"}
    assert ri["schemas"]["np"] == {"kind": "ndarray", "dtype": "float64"}
    assert ri["schemas"]["text"]["kind"] == "value"
    assert dump_frames(tmp_path / "d") == store_frames(store, "train", [keys[7], keys[1], keys[10]])
    assert verify_dump(tmp_path / "d") == []
    desc = describe_dump(tmp_path / "d")
    assert (desc["kind"], desc["rows"], desc["rows_with_data"], desc["frames"]) == ("dump", 4, 3, 18)
    assert _siblings(tmp_path / "d") == ["d", "d.lock"]


def test_module_api_and_client_dump_the_default_store(tmp_path):
    tqstore.init({"path": str(tmp_path / "s"), "num_units": 2})
    try:
        tqstore.kv_batch_put(["a", "b"], "p", fields={"x": torch.arange(4).view(2, 2)})
        assert tqstore.dump_data_by_key(str(tmp_path / "d1"), ["b"], "p")["rows_with_data"] == 1
        assert tqstore.get_client().dump_data_by_key(str(tmp_path / "d2"), ["a", "b"], "p")["keys"] == 2
        assert list(tqstore.read_row_index(tmp_path / "d2")["rows"]) == ["a", "b"]
    finally:
        tqstore.close()


def test_an_empty_key_list_gives_a_valid_empty_dump(store, tmp_path):
    fill(store, "train", 2)
    rep = store.dump_data_by_key(tmp_path / "d", [], "train")
    assert (rep["keys"], rep["rows_with_data"], rep["shards"]) == (0, 0, 0)
    ri = read_row_index(tmp_path / "d")
    assert ri["rows"] == {} and "input_ids" in ri["schemas"]
    assert verify_dump(tmp_path / "d") == []
    assert sorted(os.listdir(tmp_path / "d")) == ["MANIFEST.json", "rows.json"]


@pytest.mark.parametrize("keys,pid,err", [
    (["k0", "nope"], "train", KeyNotFoundError),
    (["k0"], "no-such-partition", PartitionNotFoundError),
    ([], "no-such-partition", PartitionNotFoundError),
    ("k0", "train", InvalidInputError),
    (["k0", 5], "train", InvalidInputError),
    (["k0", "x" * 600], "train", InvalidInputError),
])
def test_bad_keys_or_partitions_raise_before_anything_is_written(store, tmp_path, keys, pid, err):
    fill(store, "train", 2)
    with pytest.raises(err) as ei:
        store.dump_data_by_key(tmp_path / "d", keys, pid)
    if err is not InvalidInputError:
        assert isinstance(ei.value, NotFoundError) and isinstance(ei.value, ValueError)
    assert not any(n.startswith("d") for n in os.listdir(tmp_path)), os.listdir(tmp_path)
    with pytest.raises(err):  # blocking=False: a bad partition or key list now, a bad key from the handle
        h = store.dump_data_by_key(tmp_path / "d", keys, pid, blocking=False)
        assert err is not PartitionNotFoundError and keys != "k0", "raised by the call itself"
        h.result()
    assert not any(n.startswith("d") for n in os.listdir(tmp_path))
    store.save_checkpoint(tmp_path / "ck")  # the failure was retrieved from the handle: not raised again
    assert store.dump_data_by_key(tmp_path / "ok", ["k1"], "train")["keys"] == 1  # the store is fine


def test_a_dump_never_replaces_what_is_not_a_dump(store, tmp_path):
    keys = fill(store, "train", 2)
    (tmp_path / "file").write_text("mine")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    store.save_checkpoint(tmp_path / "ck")
    for target in ("file", "mine", "ck", "store", "ck/inner", "store/x", "x.old", "x.lock"):
        with pytest.raises(CheckpointError):
            store.dump_data_by_key(tmp_path / target, keys, "train")
    assert (tmp_path / "file").read_text() == "mine" and (tmp_path / "mine" / "notes.txt").read_text() == "mine"
    store.dump_data_by_key(tmp_path / "d", keys, "train")
    with pytest.raises(CheckpointError):
        store.dump_data_by_key(tmp_path / "d" / "nested", keys, "train")
    with pytest.raises(CheckpointError):
        store.save_checkpoint(tmp_path / "d")  # a checkpoint never replaces a dump either
    assert verify_dump(tmp_path / "d") == []


def test_a_restore_marker_stops_a_dump_and_names_recover_data_load(store, tmp_path):
    keys = fill(store, "train", 2)
    store.dump_data_by_key(tmp_path / "d", keys[:1], "train")
    (tmp_path / "d.restore").write_text("{}")
    for blocking in (True, False):
        with pytest.raises(RestorePendingError, match="recover_data_load"):
            store.dump_data_by_key(tmp_path / "d", keys, "train", blocking=blocking)
    assert list(read_row_index(tmp_path / "d")["rows"]) == keys[:1]


def test_a_marker_left_by_the_stores_own_ended_load_is_named_so_and_its_recover_takes_it_off(store, tmp_path):
    """A load whose part or process died after its restore was settled leaves the store on
    the dump's marker: a dump from that store still refuses (a store elsewhere at the same
    path could have a pending restore), says that this store has no restore of it left,
    and its recover_data_load (False: nothing pending) takes it off."""
    import json
    import os

    keys = fill(store, "train", 2)
    store.dump_data_by_key(tmp_path / "d", keys[:1], "train")
    marker = tmp_path / "d.restore"
    marker.write_text(json.dumps({"stores": [os.path.realpath(store.root)]}))
    with pytest.raises(RestorePendingError, match="this store.*has no restore of it left.*returns False"):
        store.dump_data_by_key(tmp_path / "d", keys, "train")
    assert marker.exists() and list(read_row_index(tmp_path / "d")["rows"]) == keys[:1]
    assert store.recover_data_load(tmp_path / "d") is False and not marker.exists()
    store.dump_data_by_key(tmp_path / "d", keys, "train")
    assert list(read_row_index(tmp_path / "d")["rows"]) == keys


def test_a_marker_entry_of_a_store_deleted_since_does_not_block_a_dump(tmp_path):
    """A load into store A was killed (A stays on the dump's marker), then A was deleted and
    the run resumed into store B: A's pending restore went with it, so B's dumps to that path
    take the entry off (written on this host, no STORE.json there); an entry written on
    another machine is not this host's to judge."""
    import json
    import shutil

    from tqstore.dump import publish as P

    d = tmp_path / "dump"
    with tqstore.open(tmp_path / "b", num_units=2) as b:
        keys = fill(b, "train", 4)
        b.dump_data_by_key(d, keys[:2], "train")
        a = tmp_path / "a"
        tqstore.open(a, num_units=1).close()
        P.mark(d, a)  # (what A's killed load left)
        with pytest.raises(RestorePendingError, match=str(a.resolve())):
            b.dump_data_by_key(d, keys, "train")  # A is still there: its restore may be pending
        shutil.rmtree(a)
        for blocking in (True, False):
            P.mark(d, a)
            out = b.dump_data_by_key(d, keys[:3 if blocking else 4], "train", blocking=blocking)
            assert (out if blocking else out.result())["keys"] == (3 if blocking else 4)
            assert not P.marker_path(d).exists()
        far = str(tmp_path / "gone-elsewhere")
        P._write_marker(d, {far}, {far: "another-machine"})
        with pytest.raises(RestorePendingError, match="remove .* by hand"):
            b.dump_data_by_key(d, keys, "train")
        assert json.loads(P.marker_path(d).read_text())["stores"] == [far]


def test_a_re_dump_replaces_the_previous_one_whole(store, tmp_path):
    keys = fill(store, "train", 6)
    store.dump_data_by_key(tmp_path / "d", keys[:4], "train")
    store.dump_data_by_key(tmp_path / "d", keys[4:], "train")
    assert list(read_row_index(tmp_path / "d")["rows"]) == keys[4:]
    assert dump_frames(tmp_path / "d") == store_frames(store, "train", keys[4:])
    assert _siblings(tmp_path / "d") == ["d", "d.lock"]


@pytest.mark.parametrize("point,at", [("mkdir", 1), ("create", 1), ("write", 2), ("fsync_file", 3), ("create", 4),
                                      ("fsync_dir", 1), ("rename", 1), ("fsync_dir", 2), ("rename", 2)])
def test_a_failure_at_any_step_leaves_the_previous_dump(store, tmp_path, point, at):
    keys = fill(store, "train", 6)
    store.dump_data_by_key(tmp_path / "d", keys[:2], "train")
    before = dump_picture(tmp_path / "d")
    fp.arm(point, "eio", at)
    try:
        with pytest.raises((CheckpointError, OSError)):
            store.dump_data_by_key(tmp_path / "d", keys[2:], "train")
    finally:
        fp.disarm()
    assert dump_picture(tmp_path / "d") == before
    assert _siblings(tmp_path / "d") == ["d", "d.lock"]
    store.dump_data_by_key(tmp_path / "d", keys[2:], "train")
    assert list(read_row_index(tmp_path / "d")["rows"]) == keys[2:]


def test_an_interrupted_publication_is_repaired_on_the_next_access(store, tmp_path):
    keys = fill(store, "train", 4)
    d = tmp_path / "d"
    store.dump_data_by_key(d, keys[:2], "train")
    old = dump_picture(d)
    # crashed between the two renames: the previous dump at d.old, d missing, a complete d.tmp
    store.dump_data_by_key(tmp_path / "new", keys[2:], "train")
    os.rename(d, tmp_path / "d.old")
    os.rename(tmp_path / "new", tmp_path / "d.tmp")
    assert dump_picture(d) == old  # read_row_index repaired it: the old one back, the unfinished one gone
    assert _siblings(d) == ["d", "d.lock"]
    # crashed after the second rename: a stale d.old beside d; and a torn d.tmp
    store.dump_data_by_key(tmp_path / "x", keys[2:], "train")
    os.rename(tmp_path / "x", tmp_path / "d.old")
    (tmp_path / "d.tmp").mkdir()
    (tmp_path / "d.tmp" / "shard-000.tqd").write_bytes(b"torn")
    store.dump_data_by_key(d, keys[3:], "train")
    assert list(read_row_index(d)["rows"]) == keys[3:]
    assert _siblings(d) == ["d", "d.lock"]


def test_a_foreign_tmp_directory_is_never_removed(store, tmp_path):
    keys = fill(store, "train", 2)
    (tmp_path / "d.tmp").mkdir()
    (tmp_path / "d.tmp" / "thesis.tex").write_text("mine")
    with pytest.raises(CheckpointError, match="in the way"):
        store.dump_data_by_key(tmp_path / "d", keys, "train")
    assert (tmp_path / "d.tmp" / "thesis.tex").read_text() == "mine"


def test_directories_of_the_sibling_names_that_no_dump_left_are_never_touched(store, tmp_path):
    """A user's ``<dir>.old`` (a lone one, or beside a dump) and ``<dir>.tmp``: reading,
    loading and recovering leave them as they are (a lone ``.old`` is not taken for the
    previous dump, and nothing is created beside a path with no dump); a dump, which needs
    those names, refuses with CheckpointError before writing anything."""
    CheckpointNotFoundError = tqstore.CheckpointNotFoundError
    keys = fill(store, "train", 2)
    (tmp_path / "results.old").mkdir()
    (tmp_path / "results.old" / "notes.txt").write_text("mine")
    (tmp_path / "other.tmp").mkdir()
    (tmp_path / "other.tmp" / "notes.txt").write_text("mine as well")
    store.dump_data_by_key(tmp_path / "d", keys, "train")
    (tmp_path / "d.old").mkdir()
    (tmp_path / "d.old" / "notes.txt").write_text("mine too")
    before = sorted(p.name for p in tmp_path.iterdir())
    for path in (tmp_path / "results", tmp_path / "other"):
        with pytest.raises(CheckpointNotFoundError):
            read_row_index(path)
        with pytest.raises(CheckpointNotFoundError):
            store.load_data_by_key(path)
        assert store.recover_data_load(path) is False
    assert list(read_row_index(tmp_path / "d")["rows"]) == keys
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    for path, sibling in ((tmp_path / "results", "results.old"), (tmp_path / "d", "d.old"),
                          (tmp_path / "other", "other.tmp")):
        with pytest.raises(CheckpointError, match=f"{sibling}.*move it away"):
            store.dump_data_by_key(path, keys[:1], "train")
        assert os.path.isdir(tmp_path / sibling)
    assert (tmp_path / "results.old" / "notes.txt").read_text() == "mine"
    assert (tmp_path / "d.old" / "notes.txt").read_text() == "mine too"
    assert list(read_row_index(tmp_path / "d")["rows"]) == keys and verify_dump(tmp_path / "d") == []
    assert (tmp_path / "other.tmp" / "notes.txt").read_text() == "mine as well"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(before + ["other.lock"])  # (the dump's lock)


@pytest.mark.parametrize("race", ["clear", "clear_and_put_again", "drop_partition"])
def test_a_key_removed_between_the_key_check_and_the_cut_fails_the_dump(store, tmp_path, race, monkeypatch):
    """The keys are checked before the cut, outside the write lock; a removal in between is
    caught at the cut (nothing written), also when the key is put again with a new index."""
    from tqstore.dump import writer

    keys = fill(store, "train", 6)
    real = writer.precheck

    def precheck_then_race(st, pid, ks):
        got = real(st, pid, ks)
        if race == "drop_partition":
            st.clear_partition("train")
        else:
            st.kv_clear([keys[2]], "train")
            if race == "clear_and_put_again":
                st.kv_put(keys[2], "train", fields={"input_ids": torch.ones(16, dtype=torch.int64)})
        return got

    monkeypatch.setattr(writer, "precheck", precheck_then_race)
    d = tmp_path / "d"
    if race == "clear_and_put_again":  # the key is a row again at the cut: the dump holds its new state
        rep = store.dump_data_by_key(d, keys, "train")
        assert rep["keys"] == 6 and verify_dump(d) == []
        assert dump_frames(d) == store_frames(store, "train", keys)
        return
    with pytest.raises(PartitionNotFoundError if race == "drop_partition" else KeyNotFoundError):
        store.dump_data_by_key(d, keys, "train")
    assert _siblings(d) == [n for n in _siblings(d) if n.endswith(".lock")]


def test_a_background_dump_checks_its_keys_at_the_cut_not_after(store, tmp_path):
    """blocking=False waits for the cut alone; its keys are checked in the cut's snapshot: a
    key put after the cut is unknown to the dump (the handle raises, nothing is written), a
    key cleared after the cut is dumped as it was."""
    keys = fill(store, "train", 4)
    d = tmp_path / "d"
    with locks.flocked(lock_path(d)):
        h = store.dump_data_by_key(d, keys + ["later"], "train", blocking=False)
        store.kv_put("later", "train", fields={"input_ids": torch.ones(16, dtype=torch.int64)})
    with pytest.raises(KeyNotFoundError, match="later"):
        h.result()
    assert not d.exists() and not (tmp_path / "d.tmp").exists()
    expect = store_frames(store, "train", keys)
    with locks.flocked(lock_path(d)):
        h = store.dump_data_by_key(d, keys, "train", blocking=False)
        store.kv_clear(keys[:2], "train")
    assert h.result()["keys"] == 4 and dump_frames(d) == expect


def test_a_dump_is_the_same_from_the_location_cache_and_from_the_index(tmp_path, monkeypatch):
    from tqstore import unit_dump

    answers = []
    real = unit_dump._from_cache
    monkeypatch.setattr(unit_dump, "_from_cache", lambda *a: answers.append(real(*a)) or answers[-1])
    path = tmp_path / "store"
    s = tqstore.open(path, num_units=2, segment_bytes=1 << 16)
    keys = fill(s, "train", 12)
    pick = [keys[9], keys[2], keys[5], keys[11]]
    s.dump_data_by_key(tmp_path / "a", pick, "train")  # the puts filled the cache
    assert answers and all(a is not None for a in answers)
    s.close()
    s = tqstore.open(path)
    try:
        answers.clear()
        s.dump_data_by_key(tmp_path / "b", pick, "train")  # reopened: the index, which fills the cache
        assert answers and all(a is None for a in answers)
        answers.clear()
        s.dump_data_by_key(tmp_path / "c", pick, "train")
        assert answers and all(a is not None for a in answers)
    finally:
        s.close()
    files_of = [{n: (tmp_path / d / n).read_bytes() for n in os.listdir(tmp_path / d) if n != "MANIFEST.json"}
                for d in "abc"]
    assert files_of[0] == files_of[1] == files_of[2]
    assert dump_frames(tmp_path / "a") == dump_frames(tmp_path / "c") and verify_dump(tmp_path / "c") == []


def _batch_picture(batch):
    return {f: canon(batch[f]) for f in sorted(batch.keys())}


def test_shards_written_in_writeback_groups_hold_the_same_bytes(tmp_path, monkeypatch):
    # a shard larger than a group is written group by group (each group's writeback started
    # at once): the files are the bytes of a dump written in one go, and they load back
    from tqstore import unit_dump

    s = tqstore.open(tmp_path / "store", num_units=2)
    try:
        keys = fill(s, "train", 12)
        pick = [keys[9], keys[2], keys[5], keys[11], keys[0]]
        monkeypatch.setattr(unit_dump, "WRITEBACK_BYTES", 0)
        s.dump_data_by_key(tmp_path / "once", pick, "train")
        groups = []  # (offset, bytes) of each writeback started from Python: the header and table groups
        ranged = []  # (writeback, bytes) of each run of frames written by the native call
        real = unit_dump.files.start_writeback
        monkeypatch.setattr(unit_dump.files, "start_writeback", lambda fd, at, n: groups.append((at, n)) or
                            real(fd, at, n))
        real_ranges = unit_dump.files._native.pwrite_ranges

        def pwrite_ranges(fd, src, offs, lens, pos, writeback):
            n = real_ranges(fd, src, offs, lens, pos, writeback)
            ranged.append((writeback, n))
            return n

        monkeypatch.setattr(unit_dump.files._native, "pwrite_ranges", pwrite_ranges)
        monkeypatch.setattr(unit_dump, "WRITEBACK_BYTES", 1000)
        s.dump_data_by_key(tmp_path / "grouped", pick, "train")
        expect = _batch_picture(s.kv_batch_get(pick, "train"))
    finally:
        s.close()
    shards = sorted(n for n in os.listdir(tmp_path / "grouped") if n.startswith("shard-"))
    sizes = {n: (tmp_path / "grouped" / n).stat().st_size for n in shards}
    assert {wb for wb, _n in ranged} == {1000}  # the frames' writeback started every 1000 bytes
    assert sum(n for _wb, n in ranged) > 2 * 1000 * len(shards)  # several groups a shard
    assert sum(n for _at, n in groups) + sum(n for _wb, n in ranged) == sum(sizes.values())
    once = {n: (tmp_path / "once" / n).read_bytes() for n in os.listdir(tmp_path / "once") if n != "MANIFEST.json"}
    grouped = {n: (tmp_path / "grouped" / n).read_bytes() for n in os.listdir(tmp_path / "grouped")
               if n != "MANIFEST.json"}
    assert grouped == once and verify_dump(tmp_path / "grouped") == []
    groups.clear()
    ranged.clear()
    monkeypatch.setattr(unit_dump, "WRITEBACK_MAX_SHARD", min(sizes.values()) - 1)  # every shard larger
    s = tqstore.open(tmp_path / "store")
    try:
        s.dump_data_by_key(tmp_path / "whole", pick, "train")
    finally:
        s.close()
    assert groups == [] and ranged and {wb for wb, _n in ranged} == {0}  # written whole, then fsynced
    assert {n: (tmp_path / "whole" / n).read_bytes() for n in once} == once
    t = tqstore.open(tmp_path / "target", num_units=3)
    try:
        t.load_data_by_key(tmp_path / "grouped")
        assert _batch_picture(t.kv_batch_get(pick, "train")) == expect
    finally:
        t.close()


def test_a_failed_write_of_a_later_group_leaves_no_dump(store, tmp_path, monkeypatch):
    from tqstore import unit_dump

    monkeypatch.setattr(unit_dump, "WRITEBACK_BYTES", 1000)
    keys = fill(store, "train", 8)
    fp.arm("write", "short", 3, repeat=True)  # every write from the third on: later groups of the shards
    try:
        with pytest.raises((CheckpointError, OSError)):
            store.dump_data_by_key(tmp_path / "d", keys, "train")
    finally:
        fp.disarm()
    assert _siblings(tmp_path / "d") == ["d.lock"]
    store.dump_data_by_key(tmp_path / "d", keys, "train")
    assert dump_frames(tmp_path / "d") == store_frames(store, "train", keys) and verify_dump(tmp_path / "d") == []


def test_a_background_dump_holds_exactly_the_cut(store, tmp_path):
    keys = fill(store, "train", 9)
    store.kv_put("bare", "train", tag={"b": 0})
    pick = keys[:6] + ["bare"]
    expect_frames = store_frames(store, "train", keys[:6])
    expect_tags = store.kv_list("train")["train"]
    d = tmp_path / "d"
    d.parent.mkdir(exist_ok=True)
    with locks.flocked(lock_path(d)):  # the background write waits for the lock: everything below is after the cut
        h = store.dump_data_by_key(d, pick, "train", blocking=False)
        assert h.stall_s >= 0 and not h.done()
        store.kv_batch_put(keys[:2], "train", fields={"input_ids": torch.zeros(2, 16, dtype=torch.int64)},
                           tags=[{"new": 1}, {"new": 2}])  # overwrites
        store.kv_clear(keys[2:4], "train")  # clears
        store.kv_batch_put(["late"], "train", fields={"input_ids": torch.ones(1, 16, dtype=torch.int64)})  # a put
        store.kv_put("bare", "train", fields={"text": "now produced"})
        store.compact(live_ratio=1.0)
    rep = h.result()
    assert rep["keys"] == 7 and rep["rows_with_data"] == 6
    ri = read_row_index(d)
    assert list(ri["rows"]) == pick and ri["rows"]["bare"]["fields"] == []
    assert {k: ri["rows"][k]["tag"] for k in keys[:6]} == {k: expect_tags[k] for k in keys[:6]}
    assert dump_frames(d) == expect_frames
    assert verify_dump(d) == []


def test_a_background_dump_holds_the_cut_when_rows_gain_fields_after_it(store, tmp_path):
    # no key is cleared, but every unit's rows gain a field after the cut: the dump holds the
    # cut's fields and frames, not the rows as they are when its write runs
    keys = fill(store, "train", 9)
    store.kv_put("bare", "train", tag={"b": 0})
    pick = keys[:6] + ["bare"]
    expect_frames = store_frames(store, "train", keys[:6])
    expect_fields = {k: r["fields"] for k, r in _row_fields(store, pick).items()}
    d = tmp_path / "d"
    d.parent.mkdir(exist_ok=True)
    with locks.flocked(lock_path(d)):
        h = store.dump_data_by_key(d, pick, "train", blocking=False)
        store.kv_batch_put(keys[:6], "train", fields={"extra": torch.ones(6, 4)})  # every unit's rows change
        store.kv_put("bare", "train", fields={"text": "now produced"})
    rep = h.result()
    assert rep["keys"] == 7 and rep["rows_with_data"] == 6
    ri = read_row_index(d)
    assert {k: ri["rows"][k]["fields"] for k in pick} == expect_fields and ri["rows"]["bare"]["fields"] == []
    assert dump_frames(d) == expect_frames
    assert verify_dump(d) == []
    after = tmp_path / "after"  # a dump now holds the new fields
    store.dump_data_by_key(after, pick, "train")
    assert read_row_index(after)["rows"]["bare"]["fields"] == ["text"]


def _row_fields(store, keys):
    rows = store.controller.rows_by_key("train", keys)
    return {k: {"fields": sorted(f)} for k, f in zip(rows.keys, rows.fields)}


def test_a_failed_background_dump_surfaces_on_the_handle_and_once_on_the_next_call(store, tmp_path):
    keys = fill(store, "train", 2)
    fp.arm("rename", "eio", 1)
    try:
        h = store.dump_data_by_key(tmp_path / "d", keys, "train", blocking=False)
        h.wait()
    finally:
        fp.disarm()
    with pytest.raises(CheckpointError, match="background dump"):
        store.dump_data_by_key(tmp_path / "d", keys, "train")
    assert store.dump_data_by_key(tmp_path / "d", keys, "train")["keys"] == 2


_HOLDER = textwrap.dedent("""
    import fcntl, os, sys, time
    fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    open(sys.argv[2], "w").close()           # holding the lock
    while not os.path.exists(sys.argv[3]):   # until the parent says so
        time.sleep(0.01)
    # the dump has been started in the parent: while we hold the lock it publishes nothing
    print("published" if os.path.exists(sys.argv[4]) else "waiting", flush=True)
""")


def test_the_lock_file_serialises_dumps_across_processes(store, tmp_path):
    keys = fill(store, "train", 3)
    d = tmp_path / "d"
    held, go = tmp_path / "held", tmp_path / "go"
    child = subprocess.Popen([sys.executable, "-c", _HOLDER, str(lock_path(d)), str(held), str(go), str(d)],
                             stdout=subprocess.PIPE, text=True)
    try:
        while not held.exists():
            assert child.poll() is None
        h = store.dump_data_by_key(d, keys, "train", blocking=False)
        h.wait(0.5)  # (long enough for an unlocked dump of three rows to have published)
        go.touch()
        out, _ = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
    assert out.strip() == "waiting"
    assert h.result(timeout=60)["keys"] == 3 and verify_dump(d) == []


def test_dump_verify_finds_flipped_truncated_missing_and_unlisted_files(store, tmp_path):
    keys = fill(store, "train", 6)
    d = tmp_path / "d"
    store.dump_data_by_key(d, keys, "train")
    assert verify_dump(d) == []
    shard = sorted(d.glob("shard-*.tqd"))[0]
    raw = bytearray(shard.read_bytes())
    raw[200] ^= 0x40
    shard.write_bytes(bytes(raw))
    probs = verify_dump(d)
    assert probs and any(str(shard) in p for p in probs)
    assert verify_dump(d, deep=False)  # the whole-file CRC catches it too
    shard.write_bytes(bytes(raw[:-10]))
    assert any("bytes" in p for p in verify_dump(d))
    shard.unlink()
    assert any("missing" in p for p in verify_dump(d))
    (d / "extra").write_text("x")
    assert any("not listed" in p for p in verify_dump(d))
    m = json.loads((d / "MANIFEST.json").read_text())
    m["version"] = 2
    (d / "MANIFEST.json").write_text(json.dumps(m))
    with pytest.raises(tqstore.FormatVersionError, match="version 2"):
        read_row_index(d)
    with pytest.raises(tqstore.CheckpointNotFoundError):
        read_row_index(tmp_path / "nothing")


def test_a_dump_onto_numpy_and_string_only_fields_and_one_unit(tmp_path):
    with tqstore.open(tmp_path / "s", num_units=1, result_type="dict") as s:
        s.kv_batch_put(["a", "b", "c"], "p", fields={"n": np.arange(6, dtype=np.int16).reshape(3, 2),
                                                     "s": ["x", "yy", "zzz"]})
        rep = s.dump_data_by_key(tmp_path / "d", ["c", "a"], "p")
        assert (rep["shards"], rep["frames"]) == (1, 4)
        assert dump_frames(tmp_path / "d") == store_frames(s, "p", ["c", "a"])


def test_cli_inspect_and_verify_understand_a_dump(store, tmp_path):
    import io

    from tqstore.cli import main

    keys = fill(store, "train", 4)
    d = tmp_path / "d"
    store.dump_data_by_key(d, keys[:3], "train")
    out, err = io.StringIO(), io.StringIO()
    assert main(["inspect", str(d)], out=out, err=err) == 0
    assert "dump" in out.getvalue() and "3 rows" in out.getvalue()
    out = io.StringIO()
    assert main(["verify", "--json", str(d)], out=out, err=err) == 0
    assert json.loads(out.getvalue())["ok"] is True
    shard = sorted(d.glob("shard-*.tqd"))[0]
    raw = bytearray(shard.read_bytes())
    raw[100] ^= 1
    shard.write_bytes(bytes(raw))
    out = io.StringIO()
    assert main(["verify", str(d)], out=out, err=err) == 1
    assert "BAD" in out.getvalue() and str(shard) in out.getvalue()


def test_dump_row_index_keeps_every_kind_of_tag_and_a_restore_brings_them_back(store, tmp_path):
    """The controller's rows at the cut are read in bulk (all tags in one JSON parse): tags of
    every kind, untagged rows ({} as kv_list gives them) and huge integers come back as they were put."""
    big = 7 ** 6000  # past the default int_max_str_digits
    tags = [None, {"r": 0.5, "uid": 3}, "plain", [1, [2, {"deep": None}]], {"b": True, "x": [1.5, "é"]}, big,
            {"n": -big}, 0, ""]
    keys = [f"t{i}" for i in range(len(tags))]
    store.kv_batch_put(keys, "train", {"v": torch.arange(len(tags))}, tags=tags)
    pick = list(reversed(keys))
    store.dump_data_by_key(tmp_path / "d", pick, "train")
    ri = read_row_index(tmp_path / "d")
    assert list(ri["rows"]) == keys  # in the partition's insertion order
    got = {k: r["tag"] for k, r in ri["rows"].items()}
    assert got == {k: {} if t is None else t for k, t in zip(keys, tags)}
    assert got == store.kv_list("train")["train"]  # the tags kv_list gives (an untagged row: {}, not None)
    with tqstore.open(tmp_path / "other", num_units=2) as t:
        t.load_data_by_key(tmp_path / "d")
        assert t.kv_list("train")["train"] == store.kv_list("train")["train"]  # (an untagged row lists as {})


def test_reading_loading_or_recovering_a_path_without_a_dump_leaves_nothing_behind(store, tmp_path):
    """read_row_index, load_data_by_key and recover_data_load of a path that holds no dump (a
    typo in a missing directory, a user's regular file) raise CheckpointNotFoundError (recover
    answers False) and create nothing: no directory, no lock file, no marker."""
    CheckpointNotFoundError = tqstore.CheckpointNotFoundError
    (tmp_path / "afile").write_text("user data")
    before = sorted(p.name for p in tmp_path.iterdir())
    for path in (tmp_path / "typo" / "deep" / "d", tmp_path / "afile", tmp_path / "absent"):
        with pytest.raises(CheckpointNotFoundError):
            read_row_index(path)
        with pytest.raises(CheckpointNotFoundError):
            store.load_data_by_key(path)
        assert store.recover_data_load(path) is False
        with pytest.raises(CheckpointNotFoundError):
            describe_dump(path)
        assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert (tmp_path / "afile").read_text() == "user data"


def test_a_background_dump_holds_the_keys_given_at_the_call_whatever_the_caller_does_with_its_list(store,
                                                                                                  tmp_path):
    """The keys of ``blocking=False`` are fixed when the call returns: a caller that reuses its
    list right after (cleared, refilled) still gets the dump of the keys it passed."""
    keys = fill(store, "train", 6)
    batch = keys[:4]
    d = tmp_path / "d"
    with locks.flocked(lock_path(d)):  # (the job waits for the lock: the list changes before it reads it)
        h = store.dump_data_by_key(d, batch, "train", blocking=False)
        batch.clear()
        batch.extend(keys[4:])
    assert h.result()["keys"] == 4
    assert list(read_row_index(d)["rows"]) == keys[:4]
    assert dump_frames(d) == store_frames(store, "train", keys[:4])


def test_a_dump_name_with_no_room_for_the_loads_marker_is_refused_before_anything_is_written(store, tmp_path):
    """A dump's name leaves room for every sibling a dump or load writes (the longest is the
    load's ``<dir>.restore.tmp``): 243 bytes are dumped and loaded back; 244 are refused by the
    dump (nothing written, not even a lock file) and by a load of a dump an earlier version
    wrote under such a name (nothing loaded), which still reads."""
    keys = fill(store, "train", 2)
    ok = tmp_path / ("é" * 121 + "d")  # 243 bytes
    store.dump_data_by_key(ok, keys, "train")
    with tqstore.open(tmp_path / "other", num_units=2) as t:
        assert t.load_data_by_key(ok)["keys"] == 2
    long = tmp_path / ("d" * 244)
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(CheckpointError, match="at most 243 bytes"):
        store.dump_data_by_key(long, keys, "train")
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    os.rename(ok, long)  # (as an earlier version let a dump be written)
    assert list(read_row_index(long)["rows"]) == keys
    os.unlink(str(long) + ".lock")  # (the read took it)
    with tqstore.open(tmp_path / "third", num_units=2) as t:
        before = sorted(p.name for p in tmp_path.iterdir())
        with pytest.raises(CheckpointError, match="at most 243 bytes"):
            t.load_data_by_key(long)
        assert t.kv_list() == {} and t.controller.restores() == []
        assert sorted(p.name for p in tmp_path.iterdir()) == before  # not even the lock file


@pytest.mark.parametrize("bad", [None, 0, 1, "no"])
def test_switches_that_are_not_bools_are_refused_before_anything_is_written(store, tmp_path, bad):
    """``blocking`` (dumps, saves) and ``cancel`` (recover) are True or False: a truthy or
    falsy stand-in (None, 0, "no") is refused with InvalidInputError, nothing written; a
    numpy bool counts as a bool."""
    keys = fill(store, "train", 2)
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(InvalidInputError, match="blocking must be True or False"):
        store.dump_data_by_key(tmp_path / "d", keys, "train", blocking=bad)
    with pytest.raises(InvalidInputError, match="blocking must be True or False"):
        store.save_checkpoint(tmp_path / "ck", blocking=bad)
    with pytest.raises(InvalidInputError, match="cancel must be True or False"):
        store.recover_data_load(tmp_path / "d", cancel=bad)
    assert sorted(os.listdir(tmp_path)) == before
    assert store.dump_data_by_key(tmp_path / "d", keys, "train", blocking=np.bool_(True))["keys"] == 2


def test_a_users_dot_old_beside_the_target_is_refused_naming_the_target_and_the_leftover(store, tmp_path):
    """A user's ``<dir>.old`` would be removed by the publication: the dump is refused, the
    message names the dump's path (what was asked for) and the ``.old`` in its way, in a
    dump's words; the user's files stay."""
    keys = fill(store, "train", 2)
    old = tmp_path / "h.old"
    old.mkdir()
    (old / "MANIFEST.json").write_text("{}")
    with pytest.raises(CheckpointError) as e:
        store.dump_data_by_key(tmp_path / "h", keys, "train")
    msg = str(e.value)
    assert msg.startswith(f"refusing to write a tqstore dump at {tmp_path / 'h'}: ")
    assert f"{old} is a directory holding a MANIFEST.json that is not a tqstore checkpoint's or dump's" in msg
    assert "a dump may replace only a tqstore dump" in msg
    assert (old / "MANIFEST.json").read_text() == "{}" and not (tmp_path / "h").exists()
    with pytest.raises(CheckpointError, match="the store being dumped lives at"):
        store.dump_data_by_key(tmp_path, keys, "train")


@pytest.mark.parametrize("blocking", [True, False])
def test_a_restore_marker_entry_a_killed_load_left_does_not_block_the_stores_next_dump(tmp_path, blocking):
    """A load killed right after it listed the store on ``<dir>.restore`` (before its restore
    began), or after its restore was settled (before it took the store off): the reopened store
    has no restore of the dump, so its entry is stale; the store's next dump to that path takes
    it off and publishes (a trainer re-dumping a fixed path must not fail on every restart).  An
    entry of another store is not ours to judge: the dump is still refused."""
    from tqstore.dump import publish as P

    d = tmp_path / "dump"
    with tqstore.open(tmp_path / "s", num_units=2) as s:
        fill(s, "train", 6)
        keys = list(s.kv_list("train")["train"])
        s.dump_data_by_key(d, keys[:3], "train")
        P.mark(d, s.root)  # (what the killed load left)
        out = s.dump_data_by_key(d, keys[:4], "train", blocking=blocking)
        out = out if blocking else out.result()
        assert out["keys"] == 4 and not os.path.lexists(P.marker_path(d))
        P.mark(d, s.root)
        tqstore.open(tmp_path / "other-store", num_units=1).close()
        P.mark(d, tmp_path / "other-store")  # another store's load of the same dump may be pending
        with pytest.raises(RestorePendingError, match="other-store"):
            s.dump_data_by_key(d, keys[:2], "train")
        me = os.path.realpath(s.root)  # this path's entry written on another machine (a shared file system)
        P._write_marker(d, {me}, {me: "another-machine"})
        with pytest.raises(RestorePendingError, match="has no restore of it left"):
            s.dump_data_by_key(d, keys[:2], "train")
        assert read_row_index(d)["rows"].keys() == set(keys[:4])


@pytest.mark.parametrize("blocking", [True, False])
def test_a_row_index_past_the_readers_limit_is_never_published(store, tmp_path, monkeypatch, blocking):
    """Readers refuse a rows.json past 1 GiB (tags of long non-ASCII text, escaped, get there):
    such a dump was published, then could never be read or loaded."""
    from tqstore._format import dump_records as D

    store.kv_batch_put(["a", "b"], "train", tags=[{"prompt": "\u65e5" * 300}, {"prompt": "x"}])
    d = tmp_path / "d"
    store.dump_data_by_key(d, ["a", "b"], "train")
    big = (d / "rows.json").stat().st_size
    store.dump_data_by_key(d, ["b"], "train")
    before = dump_picture(d)
    monkeypatch.setattr(D, "MAX_JSON_BYTES", big - 1)  # (a small limit stands for the 1 GiB one)
    with pytest.raises(InvalidInputError, match="row index would hold"):
        h = store.dump_data_by_key(d, ["a", "b"], "train", blocking=blocking)
        if not blocking:
            h.result()
    assert dump_picture(d) == before and sorted(os.listdir(tmp_path)) == ["d", "d.lock", "store"]
    assert list(read_row_index(d)["rows"]) == ["b"]
