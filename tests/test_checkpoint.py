"""Full checkpoints: save_checkpoint / load_checkpoint round trips on real stores.

Every field kind, tags, partitions, consumption and sampler state come back bit for bit;
a load into a store holding other data equals the checkpoint; new rows after a load never
collide with loaded ones; replacing a checkpoint is atomic; nothing on disk is a pickle.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

import tqstore
from tqstore import CheckpointNotFoundError, FormatVersionError, InvalidInputError, StoreClosedError
from tqstore.checkpoint import CheckpointInfo, LoadInfo, read_manifest, verify_checkpoint

from checkpoint_helpers import fill, state


@pytest.fixture
def store(tmp_path):
    with tqstore.open(tmp_path / "store", num_units=2) as s:
        yield s


def test_round_trip_restores_every_field_kind_tag_and_partition(store, tmp_path):
    fill(store, "train", 12)
    fill(store, "val", 5, prefix="v", seed=3)
    store.kv_batch_put(["only-tag"], "val", tags=[{"note": "no fields"}])
    before = state(store)
    info = store.save_checkpoint(tmp_path / "ckpt")
    assert isinstance(info, CheckpointInfo)
    assert info.rows == 18 and info.partitions == 2 and info.num_units == 2
    store.kv_clear(list(store.kv_list()["train"]), "train")
    store.clear_partition("val")
    fill(store, "other", 7, seed=9)
    assert state(store) != before
    li = store.load_checkpoint(tmp_path / "ckpt")
    assert isinstance(li, LoadInfo) and li.mode == "same" and li.rows == 18
    assert state(store) == before


def test_round_trip_restores_consumption_and_sampler_state(tmp_path):
    with tqstore.open(tmp_path / "store", num_units=2) as s:
        s.set_sampler({"name": "random", "seed": 5})
        fill(s, "train", 16)
        first = s.get_meta(["input_ids"], 4, "train", task_name="actor")
        s.get_meta(["text"], 2, "train", task_name="critic")
        before = state(s)
        s.save_checkpoint(tmp_path / "ckpt")
        after_save = s.get_meta(["input_ids"], 4, "train", task_name="actor")  # the draw after the cut
        s.get_meta(["input_ids"], 4, "train", task_name="actor")
        s.reset_consumption("train", "critic")
        s.load_checkpoint(tmp_path / "ckpt")
        assert state(s) == before
        _, consumed = s.get_consumption_status("actor", "train")
        assert int(consumed.sum()) == 4
        again = s.get_meta(["input_ids"], 4, "train", task_name="actor")
        assert again.global_indexes == after_save.global_indexes  # the seeded sampler continues identically
        assert set(again.global_indexes).isdisjoint(first.global_indexes)


def test_load_into_a_store_holding_other_data_equals_the_checkpoint(tmp_path):
    with tqstore.open(tmp_path / "a", num_units=2) as a:
        fill(a, "train", 10)
        want = state(a)
        a.save_checkpoint(tmp_path / "ckpt")
    with tqstore.open(tmp_path / "b", num_units=2) as b:
        fill(b, "train", 30, prefix="other", seed=4)  # overlapping partition, other keys
        fill(b, "extra", 3)
        b.load_checkpoint(tmp_path / "ckpt")
        assert state(b) == want
    with tqstore.open(tmp_path / "b") as b:  # and it is what a reopened store sees
        assert state(b) == want


def test_new_rows_after_a_load_never_collide_with_loaded_ones(tmp_path):
    with tqstore.open(tmp_path / "a", num_units=2) as a:
        keys = fill(a, "train", 10)
        a.kv_clear(keys[2:5], "train")  # freed global indexes, to be reused later
        want = state(a)
        a.save_checkpoint(tmp_path / "ckpt")
    with tqstore.open(tmp_path / "b", num_units=2) as b:
        fill(b, "big", 40, prefix="big")  # this store's allocator is far ahead of the checkpoint's
        b.load_checkpoint(tmp_path / "ckpt")
        loaded = {g for g in b.controller.rows}
        fill(b, "train", 6, prefix="new", start=100, seed=7)
        fill(b, "p2", 6, prefix="new", start=200, seed=8)
        gidxs = [g for g in b.controller.rows]
        assert len(gidxs) == len(set(gidxs)) == len(loaded) + 12
        old_rows = {k: v for k, v in state(b)["rows"].items() if k in want["rows"]}
        assert old_rows == want["rows"]


def test_saved_checkpoint_is_unaffected_by_later_writes(store, tmp_path):
    keys = fill(store, "train", 8)
    before = state(store)
    store.save_checkpoint(tmp_path / "ckpt")
    fill(store, "train", 8, seed=11)  # overwrite every row
    store.kv_clear(keys[:3], "train")
    store.compact(live_ratio=1.0)
    verify_checkpoint(tmp_path / "ckpt")
    store.load_checkpoint(tmp_path / "ckpt")
    assert state(store) == before


def test_segments_are_hard_linked_on_one_file_system_and_copied_when_asked(store, tmp_path):
    fill(store, "train", 8)
    linked = store.save_checkpoint(tmp_path / "linked")
    copied = store.save_checkpoint(tmp_path / "copied", copy_segments=True)
    assert linked.linked_bytes > 0 and copied.linked_bytes == 0 and copied.copied_bytes > linked.copied_bytes
    store_inodes = {p.stat().st_ino for p in (store.state_dir).glob("unit-*/seg-*.tqs")}
    assert {p.stat().st_ino for p in (tmp_path / "linked").glob("unit-*/seg-*.tqs")} <= store_inodes
    assert not {p.stat().st_ino for p in (tmp_path / "copied").glob("unit-*/seg-*.tqs")} & store_inodes
    verify_checkpoint(tmp_path / "copied")


def test_metadata_is_kept_in_the_manifest_and_returned_by_load(store, tmp_path):
    fill(store, "train", 3)
    md = {"step": 7, "lr": 1e-5, "run": "é", "nested": {"a": [1, None, True]}}
    store.save_checkpoint(tmp_path / "ckpt", metadata=md)
    assert read_manifest(tmp_path / "ckpt").metadata == md
    assert store.load_checkpoint(tmp_path / "ckpt").metadata == md


@pytest.mark.parametrize("bad", [{"x": object()}, {"x": float("nan")}, {1: "int key"}, ["not", "a", "mapping"],
                                 {"t": torch.ones(1)}, {"a": "\ud800"}, {"\udc80": 1}, {"a": ["ok", "x\ud800"]}])
def test_metadata_that_is_not_json_is_rejected_before_anything_is_written(store, tmp_path, bad):
    with pytest.raises(InvalidInputError):
        store.save_checkpoint(tmp_path / "ckpt", metadata=bad)
    assert not (tmp_path / "ckpt").exists()
    assert not store.units[0].pinned()


def test_saving_over_an_existing_checkpoint_replaces_it_atomically(store, tmp_path):
    fill(store, "train", 4)
    store.save_checkpoint(tmp_path / "ckpt", metadata={"v": 1})
    fill(store, "train", 4, start=4)
    want = state(store)
    store.save_checkpoint(tmp_path / "ckpt", metadata={"v": 2})
    assert sorted(os.listdir(tmp_path)) == [".ckpt.lock", "ckpt", "store"]
    store.kv_clear(list(want["kv_list"]["train"]), "train")
    assert store.load_checkpoint(tmp_path / "ckpt").metadata == {"v": 2}
    assert state(store) == want


def test_include_storage_false_restores_metadata_but_no_payload(store, tmp_path):
    keys = fill(store, "train", 6)
    store.get_meta(["text"], 2, "train", task_name="t")
    info = store.save_checkpoint(tmp_path / "meta-only", include_storage=False)
    assert not info.include_storage and info.linked_bytes == 0
    assert not list((tmp_path / "meta-only").glob("unit-*"))
    before = store.kv_list()
    fill(store, "train", 6, seed=5)
    store.load_checkpoint(tmp_path / "meta-only")
    assert store.kv_list() == before  # keys and tags
    _, consumed = store.get_consumption_status("t", "train")
    assert int(consumed.sum()) == 2
    _, produced = store.get_production_status(["text"], "train")
    assert int(produced.sum()) == 0  # no payload was saved: nothing is produced
    store.kv_batch_put(keys, "train", {"text": ["again"] * 6})
    assert store.kv_batch_get(keys[:1], "train")["text"] == ["again"]


def test_checkpoint_files_hold_no_pickle(store, tmp_path):
    fill(store, "train", 6)
    store.save_checkpoint(tmp_path / "ckpt")
    man = json.loads((tmp_path / "ckpt" / "MANIFEST.json").read_text())
    assert man["format"] == "tqstore-checkpoint" and man["version"] == 1
    for p in (tmp_path / "ckpt").rglob("*"):
        if p.is_file():
            data = p.read_bytes()
            assert not data.startswith(b"\x80"), p  # a pickle stream starts with PROTO
            for proto in (b"\x80\x02", b"\x80\x03", b"\x80\x04\x95", b"\x80\x05\x95"):
                assert proto + b"c" not in data and b"ctorch" not in data, p
            assert b"torch._utils" not in data and b"collections\nOrderedDict" not in data, p


def test_missing_directory_or_manifest_raises_file_not_found(store, tmp_path):
    with pytest.raises(FileNotFoundError):
        store.load_checkpoint(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointNotFoundError):
        store.load_checkpoint(tmp_path / "empty")
    with pytest.raises(FileNotFoundError):
        verify_checkpoint(tmp_path / "empty")
    (tmp_path / "file").write_bytes(b"x")  # (was: "checkpoint directory ... does not exist")
    with pytest.raises(CheckpointNotFoundError, match="is not a directory"):
        store.load_checkpoint(tmp_path / "file")


def test_unknown_format_version_raises_format_version_error(store, tmp_path):
    fill(store, "train", 2)
    store.save_checkpoint(tmp_path / "ckpt")
    mp = tmp_path / "ckpt" / "MANIFEST.json"
    d = json.loads(mp.read_text())
    d["version"] = 99
    mp.write_text(json.dumps(d))
    with pytest.raises(FormatVersionError, match="99"):
        store.load_checkpoint(tmp_path / "ckpt")


def test_save_and_load_on_a_closed_store_raise(tmp_path):
    s = tqstore.open(tmp_path / "store")
    fill(s, "train", 2)
    s.save_checkpoint(tmp_path / "ckpt")
    s.close()
    with pytest.raises(StoreClosedError):
        s.save_checkpoint(tmp_path / "ckpt2")
    with pytest.raises(StoreClosedError):
        s.load_checkpoint(tmp_path / "ckpt")


def test_module_functions_need_init_and_forward_to_the_default_store(tmp_path):
    tqstore.close()
    with pytest.raises(RuntimeError):
        tqstore.save_checkpoint(tmp_path / "ckpt")
    with pytest.raises(RuntimeError):
        tqstore.load_checkpoint(tmp_path / "ckpt")
    with pytest.raises(RuntimeError):
        tqstore.CheckpointManager(tmp_path / "gens").save(1)
    tqstore.init({"path": str(tmp_path / "store"), "num_units": 2})
    try:
        tqstore.kv_batch_put(["a", "b"], "p", {"x": torch.tensor([[1], [2]])})
        tqstore.save_checkpoint(tmp_path / "ckpt", metadata={"m": 1})
        tqstore.kv_clear(["a"], "p")
        assert tqstore.load_checkpoint(tmp_path / "ckpt").metadata == {"m": 1}
        assert torch.equal(tqstore.kv_batch_get(["a", "b"], "p")["x"], torch.tensor([[1], [2]]))
        m = tqstore.CheckpointManager(tmp_path / "gens", keep_last=1)
        m.save(3)
        assert m.restore() == 3
        assert tqstore.verify_checkpoint(m.path(3)).ok
    finally:
        tqstore.close()


def test_load_returns_paths_and_accepts_str(store, tmp_path):
    fill(store, "train", 2)
    info = store.save_checkpoint(str(tmp_path / "ckpt"))
    assert isinstance(info.path, Path) and info.path == tmp_path / "ckpt"
    assert store.load_checkpoint(str(tmp_path / "ckpt")).path == tmp_path / "ckpt"


def test_round_trip_of_long_values_of_different_lengths(store, tmp_path):
    # non-tensor values above the bulk-framing size share a shape () but not a length
    texts = ["x" * 4637, "y" * 5126, "z" * 70_000, ""]
    store.kv_batch_put(["a", "b", "c", "d"], "p", {"text": texts, "obj": [{"k": "v" * n} for n in (9000, 5, 12000, 0)]})
    store.save_checkpoint(tmp_path / "ckpt")
    store.kv_clear(["a", "b", "c", "d"], "p")
    store.load_checkpoint(tmp_path / "ckpt")
    out = store.kv_batch_get(["a", "b", "c", "d"], "p")
    assert out["text"] == texts and [len(o["k"]) for o in out["obj"]] == [9000, 5, 12000, 0]


def test_a_save_whose_controller_snapshot_disagrees_with_the_cut_publishes_nothing(store, tmp_path, monkeypatch):
    """The units export beside the controller with the put token read at the cut; should the
    controller's snapshot hold another one, the save fails and the previous checkpoint stays."""
    from tqstore import CheckpointError

    fill(store, "train", 6)
    store.save_checkpoint(tmp_path / "ckpt", metadata={"v": 1})
    real = type(store.controller).export_snapshot

    def skewed(self, *a, **k):
        out = real(self, *a, **k)
        out.summary["put_token"] += 1
        return out

    monkeypatch.setattr(type(store.controller), "export_snapshot", skewed)
    fill(store, "train", 6, start=6)
    with pytest.raises(CheckpointError, match="put token"):
        store.save_checkpoint(tmp_path / "ckpt", metadata={"v": 2})
    assert sorted(os.listdir(tmp_path)) == [".ckpt.lock", "ckpt", "store"]
    assert read_manifest(tmp_path / "ckpt").metadata == {"v": 1}
    verify_checkpoint(tmp_path / "ckpt")
