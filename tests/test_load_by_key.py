"""load_data_by_key / recover_data_load: a dump's keys merged into a running store.

Only the dumped keys come back, bit for bit, with their tags (every field kind, rows with no
produced field); existing keys keep their global index; bystander keys, partitions, sampler
and consumption state are untouched; any source unit count onto any target count; a
damaged or foreign dump is rejected with nothing written; while a restore is unresolved its
partition's clears, puts of its keys, dumps and full checkpoints raise RestorePendingError.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import tqstore
from tqstore import CorruptionError, FormatVersionError, RestorePendingError, SchemaError, StorageIOError
from tqstore._io import failpoints as fp
from tqstore._format import dump_records as D
from tqstore.dump import verify_dump

from checkpoint_helpers import canon, fill, state
from restore_helpers import flip_byte, load_held_in_import, shard_paths, truncate, write_dump


def rows_of(store, pid, keys):
    """key -> (tag, produced fields, payload of each field bit for bit)."""
    rb = store.controller.rows_by_key(pid, list(keys))
    out = {}
    for k, g, t, fs in zip(rb.keys, rb.gidxs, rb.tags, rb.fields):
        out[k] = (canon(t), sorted(fs), {f: canon(store.read(pid, [g], [f])[f]) for f in sorted(fs)})
    return out


def gidx_of(store, pid, keys):
    return dict(zip(keys, store.controller.resolve_keys(pid, keys)))


@pytest.fixture
def source(tmp_path):
    with tqstore.open(tmp_path / "src", num_units=2) as s:
        keys = fill(s, "train", 12)
        s.kv_batch_put(["only-tag"], "train", tags=[{"note": "no fields"}])
        fill(s, "other", 4, prefix="o", seed=5)
        yield s, keys + ["only-tag"]


def test_load_brings_back_exactly_the_dumped_keys_with_every_field_kind(source, tmp_path):
    src, keys = source
    picked = keys[1:12:3] + ["only-tag"]
    dump = write_dump(src, tmp_path / "dump", picked, "train")
    want = rows_of(src, "train", picked)
    with tqstore.open(tmp_path / "dst", num_units=3) as dst:
        rep = dst.load_data_by_key(dump)
        assert rep["keys"] == rep["new_keys"] == len(picked) and rep["rows_with_data"] == len(picked) - 1
        phases = rep["phases_s"]  # where the time went, step by step, adding up to the whole
        assert list(phases) == ["check_s", "begin_s", "import_s", "commit_s"] and min(phases.values()) >= 0
        assert sum(phases.values()) == pytest.approx(rep["seconds"], abs=1e-3)
        assert set(dst.kv_list()) == {"train"} and list(dst.kv_list()["train"]) == picked
        assert rows_of(dst, "train", picked) == want
        assert dst.controller.restores() == [] and dst.verify() == []
        assert not Path(str(dump) + ".restore").exists()
    with tqstore.open(tmp_path / "dst") as dst:  # durable: the same after a reopen
        assert rows_of(dst, "train", picked) == want


def test_a_load_keeps_the_sources_insertion_order_so_grpo_groups_stay_whole(tmp_path):
    """New keys were numbered in the order the dump was given its keys: whole groups dumped in
    another order came back as groups mixing two prompts."""
    import random

    n = 4
    keys = [f"prompt-{g}/{j}" for g in range(4) for j in range(n)]
    with tqstore.open(tmp_path / "a", num_units=2) as s:
        s.kv_batch_put(keys, "train", {"x": torch.tensor([[g] for g in range(4) for _ in range(n)])})
        picked = keys[n:]  # groups 1, 2 and 3
        random.Random(0).shuffle(picked)
        s.dump_data_by_key(tmp_path / "dump", picked, "train")
    assert list(tqstore.read_row_index(tmp_path / "dump")["rows"]) == keys[n:]  # in the source's order
    with tqstore.open(tmp_path / "b", num_units=3) as s:
        s.set_sampler({"name": "grpo_group_n", "n_samples_per_prompt": n})
        s.load_data_by_key(tmp_path / "dump")
        got = []
        while True:
            m = s.get_meta(["x"], n, "train", task_name="t")
            if not m.size:
                break
            got.append(s.get_data(m)["x"].reshape(-1).tolist())
        assert got == [[1] * n, [2] * n, [3] * n]


def test_a_checkpoint_store_or_empty_directory_given_as_a_dump_and_back_is_not_found_and_leaves_nothing(tmp_path):
    """Wrong paths were reported as damaged data (CorruptionError: the CLI's exit 1) and left
    lock files beside them; they are not-found errors that say what the path is."""
    import os

    from tqstore import CheckpointNotFoundError

    with tqstore.open(tmp_path / "store", num_units=2) as s:
        fill(s, "train", 2)
        s.save_checkpoint(tmp_path / "ckpt")
        s.dump_data_by_key(tmp_path / "dump", list(s.kv_list("train")["train"]), "train")
        (tmp_path / "empty").mkdir()
        before = sorted(os.listdir(tmp_path))
        want = state(s)
        for path, kind in (("ckpt", "a tqstore checkpoint"), ("store", "store directory"), ("empty", "empty")):
            with pytest.raises(CheckpointNotFoundError, match=kind):
                s.load_data_by_key(tmp_path / path)
            with pytest.raises(CheckpointNotFoundError, match=kind):
                tqstore.read_row_index(tmp_path / path)
        for call in (s.load_checkpoint, tqstore.verify_checkpoint):
            with pytest.raises(CheckpointNotFoundError, match="is a dump.*load_data_by_key"):
                call(tmp_path / "dump")
        assert sorted(os.listdir(tmp_path)) == before and state(s) == want


def test_existing_keys_keep_their_index_and_nothing_else_changes(source, tmp_path):
    src, keys = source
    picked = keys[:6]
    dump = write_dump(src, tmp_path / "dump", picked, "train")
    want = rows_of(src, "train", picked)
    with tqstore.open(tmp_path / "dst", num_units=2, result_type="dict") as dst:
        fill(dst, "train", 8, prefix="k", start=3, seed=7)  # k3..k10: k3, k4, k5 exist
        fill(dst, "bystander", 5, prefix="b", seed=8)
        dst.set_sampler({"name": "random", "seed": 3})
        meta = dst.get_meta(["input_ids"], 3, "train", task_name="t")  # consumption and sampler state
        dst.get_meta(["input_ids"], 2, "bystander", task_name="t")
        before = state(dst)
        old = gidx_of(dst, "train", ["k3", "k4", "k5"])
        dst.load_data_by_key(dump)
        after = state(dst)
        assert gidx_of(dst, "train", ["k3", "k4", "k5"]) == old
        assert rows_of(dst, "train", picked) == want
        others = [f"k{i}" for i in range(6, 11)]
        assert {k: v for k, v in after["rows"].items() if k[1] in others or k[0] == "bystander"} == \
            {k: v for k, v in before["rows"].items() if k[1] in others or k[0] == "bystander"}
        assert after["consumed"] == before["consumed"] and after["sampler"] == before["sampler"]
        gidxs, flags = dst.get_consumption_status("t", "train")
        done = set(meta.global_indexes)
        assert {int(g): int(f) for g, f in zip(gidxs, flags)} == {int(g): int(int(g) in done) for g in gidxs}
        assert dst.verify() == []


@pytest.mark.parametrize("n_src,n_dst", [(4, 2), (2, 4), (1, 4), (3, 3)])
def test_load_onto_another_unit_count(tmp_path, n_src, n_dst):
    with tqstore.open(tmp_path / "src", num_units=n_src) as src:
        keys = fill(src, "train", 16)
        src.kv_clear(keys[:5], "train")  # holes: the dump's gidxs are not 0..n
        keys = keys[5:] + fill(src, "train", 6, prefix="n", seed=2)
        picked = keys[::2]
        dump = write_dump(src, tmp_path / "dump", picked, "train")
        want = rows_of(src, "train", picked)
    with tqstore.open(tmp_path / "dst", num_units=n_dst) as dst:
        fill(dst, "train", 3, prefix="x", seed=4)  # the dump's gidxs are taken: new keys are re-stamped
        dst.load_data_by_key(dump)
        assert rows_of(dst, "train", picked) == want
        for g in dst.controller.resolve_keys("train", picked):  # each row on unit gidx % M
            assert any(gg == g for gg, _ in dst.units[g % n_dst].keys())
        assert dst.verify() == []


# ------------------------------------------------------------------ rejected dumps: nothing written
def _damage_missing_shard(dump):
    next(iter(shard_paths(dump).values())).unlink()


def _damage_missing_index(dump):
    (dump / D.ROW_INDEX_NAME).unlink()


def _damage_truncated_shard(dump):
    truncate(next(iter(shard_paths(dump).values())), 64)


def _damage_flipped_payload_byte(dump):
    p = shard_paths(dump)[max(shard_paths(dump))]
    flip_byte(p, D.SHARD_HEADER_SIZE + 200)  # inside a frame: found by the unit that reads it


def _damage_unknown_version(dump):
    m = dump / D.MANIFEST_NAME
    d = json.loads(m.read_text())
    d["version"] = 2
    m.write_text(json.dumps(d))


def _rewrite_row_index(dump, change):
    """``change(row index object)``, then the row index written with its CRCs made consistent."""
    from tqstore import _native
    ri = json.loads((dump / D.ROW_INDEX_NAME).read_text())
    change(ri)
    raw = (json.dumps(ri) + "\n").encode()
    (dump / D.ROW_INDEX_NAME).write_bytes(raw)
    m = json.loads((dump / D.MANIFEST_NAME).read_text())
    m.pop("manifest_crc32c")
    m["row_index"].update(size=len(raw), crc32c=_native.crc32c(raw))
    m["manifest_crc32c"] = _native.crc32c(D._canonical(m))
    (dump / D.MANIFEST_NAME).write_text(json.dumps(m))


def _damage_schema_disagrees_with_frames(dump):
    """A row index declaring another dtype than the frames hold, its CRCs made consistent
    (only the frames' headers tell)."""
    def change(ri):
        assert ri["schemas"]["input_ids"] == {"kind": "tensor", "dtype": "int64"}
        ri["schemas"]["input_ids"]["dtype"] = "int32"
    _rewrite_row_index(dump, change)
    assert [p for p in verify_dump(dump) if "int32" in p]  # verify_dump finds it too


def _damage_key_tqstore_never_writes(dump):
    """A row index (CRCs consistent) whose key holds a NUL, which no put accepts: the dump is
    damaged, and the reader says so naming rows.json, as verify_dump does."""
    _rewrite_row_index(dump, lambda ri: ri["rows"][0].update(key="k\0x"))
    assert [p for p in verify_dump(dump) if "rows.json" in p and "NUL" in p]


@pytest.mark.parametrize("damage,error", [
    (_damage_missing_shard, CorruptionError), (_damage_missing_index, CorruptionError),
    (_damage_truncated_shard, CorruptionError), (_damage_flipped_payload_byte, CorruptionError),
    (_damage_unknown_version, FormatVersionError), (_damage_schema_disagrees_with_frames, CorruptionError),
    (_damage_key_tqstore_never_writes, CorruptionError)])
def test_damaged_dump_is_rejected_with_nothing_written(source, tmp_path, damage, error):
    src, keys = source
    dump = write_dump(src, tmp_path / "dump", keys, "train")
    damage(dump)
    with tqstore.open(tmp_path / "dst", num_units=3) as dst:
        fill(dst, "train", 4, prefix="k", start=2, seed=9)
        fill(dst, "train", 4, prefix="z", seed=1)
        before = state(dst)
        with pytest.raises(error):
            dst.load_data_by_key(dump)
        assert state(dst) == before
        assert dst.controller.restores() == [] and not Path(str(dump) + ".restore").exists()
        assert dst.verify() == []
        assert dst.load_data_by_key(write_dump(src, tmp_path / "good", keys, "train"))["keys"] == len(keys)


def test_dtype_conflict_is_rejected_before_anything_is_written(source, tmp_path):
    src, keys = source
    dump = write_dump(src, tmp_path / "dump", keys[:4], "train")
    with tqstore.open(tmp_path / "dst", num_units=2) as dst:
        dst.kv_batch_put(["a"], "train", fields={"input_ids": np.zeros((1, 16), np.int32)})  # int64 in the dump
        before = state(dst)
        with pytest.raises(SchemaError, match="input_ids"):
            dst.load_data_by_key(dump)
        assert state(dst) == before and dst.controller.restores() == []


def test_a_dtype_change_follows_strict_schema(source, tmp_path):
    """As a put: by default a dump of another dtype makes the field mixed (each row keeps its
    own dtype, bit for bit); with strict_schema=True it is rejected with nothing written."""
    src, keys = source
    dump = write_dump(src, tmp_path / "dump", keys[:4], "train")
    want = rows_of(src, "train", keys[:4])
    live = {"input_ids": torch.zeros((1, 16), dtype=torch.int32)}  # int64 in the dump
    with tqstore.open(tmp_path / "strict", num_units=2, strict_schema=True) as dst:
        dst.kv_batch_put(["a"], "train", fields=live)
        before = state(dst)
        with pytest.raises(SchemaError, match="input_ids"):
            dst.load_data_by_key(dump)
        assert state(dst) == before and dst.controller.restores() == []
    with tqstore.open(tmp_path / "mixed", num_units=3) as dst:
        dst.kv_batch_put(["a"], "train", fields=live)
        assert dst.load_data_by_key(dump)["keys"] == 4
        assert rows_of(dst, "train", keys[:4]) == want
        assert rows_of(dst, "train", ["a"])["a"][2]["input_ids"] == canon(live["input_ids"])
        mixed = dst.kv_batch_get(["a"] + keys[:2], "train", select_fields=["input_ids"])["input_ids"]
        assert [t.dtype for t in mixed] == [torch.int32, torch.int64, torch.int64]  # a list per row
    with tqstore.open(tmp_path / "mixed") as dst:
        assert dst.verify() == [] and rows_of(dst, "train", keys[:4]) == want


def test_a_field_of_several_dtypes_is_dumped_as_mixed_and_loads_by_strict_schema(tmp_path):
    """A partition whose field holds rows of several dtypes (strict_schema=False, the default)
    dumps (its schema "mixed" in the row index) and loads bit for bit, each row with its own
    dtype; a strict_schema store refuses the mixed field with nothing written."""
    with tqstore.open(tmp_path / "src", num_units=2) as src:
        src.kv_batch_put(["a", "b"], "p", fields={"x": torch.zeros((2, 3), dtype=torch.int32)}, tags=[{"i": 0}, None])
        src.kv_batch_put(["c"], "p", fields={"x": torch.ones((1, 3), dtype=torch.int64)})
        dump = write_dump(src, tmp_path / "dump", ["c", "a"], "p")
        want = rows_of(src, "p", ["c", "a"])
    ri = tqstore.read_row_index(dump)
    assert ri["schemas"] == {"x": {"kind": "tensor", "dtype": "mixed"}} and list(ri["rows"]) == ["a", "c"]
    with tqstore.open(tmp_path / "dst", num_units=3) as dst:
        assert dst.load_data_by_key(dump)["keys"] == 2
        assert rows_of(dst, "p", ["c", "a"]) == want
        got = dst.kv_batch_get(["c", "a"], "p")["x"]
        assert [t.dtype for t in got] == [torch.int64, torch.int32]
        dst.kv_batch_put(["e"], "p", fields={"x": torch.ones((1, 3), dtype=torch.float32)})  # still mixed
        assert dst.verify() == []
    with tqstore.open(tmp_path / "strict", num_units=2, strict_schema=True) as dst:
        dst.kv_batch_put(["z"], "q", fields={"y": torch.zeros((1, 2))})
        before = state(dst)
        with pytest.raises(SchemaError, match="several dtypes"):
            dst.load_data_by_key(dump)
        assert state(dst) == before and dst.controller.restores() == []
        assert not Path(str(dump) + ".restore").exists()


def test_undo_records_a_failed_put_left_do_not_later_revert_restored_rows(tmp_path):
    """An overwriting put whose controller commit and then settle failed leaves undo records
    (settled before the next overwriting put); a load settles them first, so the put's old
    entries never come back over the restored rows, then or after a reopen."""
    with tqstore.open(tmp_path / "src", num_units=1) as src:
        src.kv_batch_put(["k"], "train", fields={"x": torch.full((1, 2), 42.0)}, tags=[{"from": "dump"}])
        dump = write_dump(src, tmp_path / "dump", ["k"], "train")
    with tqstore.open(tmp_path / "dst", num_units=1) as dst:
        dst.kv_batch_put(["k", "other"], "train", fields={"x": torch.ones((2, 2))})
        fp.arm("controller_commit", "eio", 1)
        fp.arm("unit_commit", "eio", 2)  # the unit's write commits, then its settle fails
        try:
            with pytest.raises(StorageIOError):
                dst.kv_batch_put(["k"], "train", fields={"x": torch.full((1, 2), 7.0)})
        finally:
            fp.disarm()
        assert dst.units[0].undo_tokens()  # left by the failed settle
        dst.load_data_by_key(dump)
        dst.kv_batch_put(["other"], "train", fields={"x": torch.full((1, 2), 5.0)})  # settles leftovers
        assert dst.kv_batch_get(["k", "other"], "train")["x"].tolist() == [[42.0, 42.0], [5.0, 5.0]]
    with tqstore.open(tmp_path / "dst") as dst:
        assert dst.kv_batch_get(["k"], "train")["x"].tolist() == [[42.0, 42.0]] and dst.verify() == []


@pytest.mark.parametrize("step", ["publish", "finish"])
def test_a_failure_at_publish_or_finish_cancels_the_restore(source, tmp_path, monkeypatch, step):
    """A unit's publish or the controller's finish fails: the restore is cancelled before the
    error is raised (nothing left pending, the marker gone, the store as it was), and the
    same dump loads afterwards."""
    src, keys = source
    dump = write_dump(src, tmp_path / "dump", keys[:8], "train")
    want = rows_of(src, "train", keys[:8])
    with tqstore.open(tmp_path / "dst", num_units=2) as dst:
        fill(dst, "train", 3, prefix="k", start=6, seed=11)
        before = state(dst)

        def fail(*a, **k):
            raise StorageIOError("no space left on device (injected)")
        if step == "publish":
            monkeypatch.setattr(dst.units[1], "publish_restore", fail)
        else:
            monkeypatch.setattr(dst.controller, "finish_restore", fail)
        with pytest.raises(StorageIOError, match="injected"):
            dst.load_data_by_key(dump)
        monkeypatch.undo()
        assert dst.controller.restores() == [] and state(dst) == before
        assert not Path(str(dump) + ".restore").exists()
        dst.kv_clear(["k6"], "train")  # no restore pending
        assert dst.load_data_by_key(dump)["keys"] == 8 and rows_of(dst, "train", keys[:8]) == want


def test_an_error_after_the_finish_committed_keeps_the_restored_rows(source, tmp_path, monkeypatch):
    """The controller's finish commits, then fails (say, after its transaction): the restore is
    decided, so the units keep what they published and it is settled as committed; the error
    is raised, and the rows are the dump's, with every frame, also after a reopen."""
    src, keys = source
    dump = write_dump(src, tmp_path / "dump", keys[:8], "train")
    want = rows_of(src, "train", keys[:8])
    with tqstore.open(tmp_path / "dst", num_units=2) as dst:
        real = dst.controller.finish_restore

        def finish_then_fail(rid):
            real(rid)
            raise StorageIOError("failed after the commit (injected)")
        monkeypatch.setattr(dst.controller, "finish_restore", finish_then_fail)
        with pytest.raises(StorageIOError, match="after the commit"):
            dst.load_data_by_key(dump)
        monkeypatch.undo()
        assert dst.controller.restores() == [] and not Path(str(dump) + ".restore").exists()
        assert rows_of(dst, "train", keys[:8]) == want and dst.verify() == []
    with tqstore.open(tmp_path / "dst") as dst:
        assert rows_of(dst, "train", keys[:8]) == want and dst.verify() == []


# ------------------------------------------------------------------ an unresolved restore
@pytest.fixture
def pending(source, tmp_path, monkeypatch):
    """A store whose load from a dump stopped after its first unit completed (the error
    could not be undone: the restore stays pending, as after a crash); its partition
    ``train`` held k6..k8 before."""
    yield from _pending(source, tmp_path, monkeypatch, held=3)


@pytest.fixture
def pending_new(source, tmp_path, monkeypatch):
    """As ``pending``, into a store without the partition: the restore creates it."""
    yield from _pending(source, tmp_path, monkeypatch, held=0)


def _pending(source, tmp_path, monkeypatch, held: int):
    src, keys = source
    dump = write_dump(src, tmp_path / "dump", keys[:8], "train")
    want = rows_of(src, "train", keys[:8])
    dst = tqstore.open(tmp_path / "dst", num_units=2)
    if held:
        fill(dst, "train", held, prefix="k", start=6, seed=11)
    before = state(dst)
    from tqstore.dump import restore as R

    def boom(store, info):
        raise RuntimeError("cancel failed")
    calls = []
    real = dst.controller.complete_restore

    def complete(rid, u, attempt):
        real(rid, u, attempt)
        calls.append(u)
        if len(calls) == 1:
            raise OSError("disk gone")
    monkeypatch.setattr(dst.controller, "complete_restore", complete)
    monkeypatch.setattr(R, "_cancel", boom)
    with pytest.raises(OSError, match="disk gone") as err:  # the first error, not the cancel's
        dst.load_data_by_key(dump)
    assert any("recover_data_load" in n and "stays pending" in n for n in err.value.__notes__)
    monkeypatch.undo()
    yield dst, dump, want, before, keys
    dst.close()


def test_unresolved_restore_blocks_clears_puts_of_its_keys_and_checkpoints(pending, tmp_path):
    dst, dump, _want, _before, keys = pending
    (r,) = dst.controller.restores()
    assert r.state == "running"
    calls = [lambda: dst.kv_clear(["k6"], "train"), lambda: dst.clear_partition("train"),
             lambda: dst.kv_batch_put([keys[0]], "train", fields={"input_ids": torch.zeros((1, 16),
                                                                                            dtype=torch.int64)}),
             lambda: dst.save_checkpoint(tmp_path / "ck"), lambda: dst.load_data_by_key(dump)]
    for call in calls:
        with pytest.raises(RestorePendingError, match="recover_data_load") as e:
            call()
        assert "complete" in str(e.value) and str(Path(dump).resolve()) in str(e.value)
    assert Path(str(Path(dump).resolve()) + ".restore").exists()  # the pending restore's marker stays
    with pytest.raises(RestorePendingError):  # a dump does not replace a directory a load may read
        dst.dump_data_by_key(dump, ["k6"], "train")
    dst.kv_batch_put(["unrelated"], "train", fields={"input_ids": torch.zeros((1, 16), dtype=torch.int64)})  # fine
    dst.kv_batch_put(["x"], "elsewhere", fields={"v": np.zeros((1, 2))})


@pytest.mark.parametrize("which", ["pending_new", "pending"])
def test_clears_of_keys_and_a_partition_a_pending_restore_creates_are_refused_too(request, which):
    """A clear of keys that are not rows yet (or of a partition that is not one yet) would
    be undone by the recover that creates them: refused, as a clear of rows is."""
    dst, dump, want, _before, keys = request.getfixturevalue(which)
    assert keys[0] not in dst.kv_list("train").get("train", {})  # the restore creates it
    for call in (lambda: dst.kv_clear([keys[0]], "train"), lambda: dst.clear_partition("train"),
                 lambda: dst.clear_samples(tqstore.KVBatchMeta(keys=[keys[1]], tags=[{}], partition_id="train"))):
        with pytest.raises(RestorePendingError, match="recover_data_load"):
            call()
    dst.kv_clear([keys[0]], "elsewhere")  # another partition: fine
    assert dst.recover_data_load(dump) is True
    assert rows_of(dst, "train", keys[:8]) == want
    dst.kv_clear([keys[0]], "train")  # settled: clears work
    assert keys[0] not in dst.kv_list("train")["train"]


def test_another_stores_load_or_recover_leaves_the_marker_of_a_pending_restore(pending, source, tmp_path):
    """The marker lists every store whose load may still read the dump: another store's load
    of the same dump (or its recover, with nothing pending there) takes only itself off, so
    the dump is not replaced under the pending restore; its recover then removes the marker."""
    dst, dump, want, _before, keys = pending
    src, _keys = source
    marker = Path(str(Path(dump).resolve()) + ".restore")
    mine = str((tmp_path / "dst").resolve())
    assert json.loads(marker.read_text())["stores"] == [mine]
    with tqstore.open(tmp_path / "other", num_units=3) as other:
        assert other.load_data_by_key(dump)["keys"] == 8 and rows_of(other, "train", keys[:8]) == want
        assert other.recover_data_load(dump) is False
    assert json.loads(marker.read_text())["stores"] == [mine]
    with pytest.raises(RestorePendingError, match=mine):
        src.dump_data_by_key(dump, keys[:2], "train")
    marker.write_text(json.dumps({"store": mine}))  # the one-store form of earlier versions
    with tqstore.open(tmp_path / "other") as other:
        assert other.recover_data_load(dump) is False
    assert marker.exists()
    assert dst.recover_data_load(dump) is True and not marker.exists()
    assert rows_of(dst, "train", keys[:8]) == want and dst.verify() == []


def test_a_pending_restore_whose_dump_was_deleted_can_still_be_cancelled(pending, tmp_path):
    """The dump directory is gone (deleted by hand): completing the restore is impossible and
    says so, cancelling it works and leaves the store as it was before the load."""
    import shutil
    dst, dump, _want, before, _keys = pending
    shutil.rmtree(dump)
    with pytest.raises(tqstore.CheckpointNotFoundError):
        dst.recover_data_load(dump)
    assert [r.state for r in dst.controller.restores()] == ["running"]
    assert dst.recover_data_load(dump, cancel=True) is True
    assert dst.controller.restores() == [] and state(dst) == before and dst.verify() == []
    assert not Path(str(Path(dump).resolve()) + ".restore").exists()
    assert dst.recover_data_load(dump, cancel=True) is False


def test_a_marker_an_earlier_version_left_with_a_relative_store_path_is_taken_off(source, tmp_path, monkeypatch):
    """Earlier versions wrote ``{"store": path}`` with the path as the store was opened (maybe
    relative): that store's recover_data_load still recognises it and removes the marker,
    and the dump can be replaced again."""
    src, keys = source
    dump = write_dump(src, tmp_path / "dump", keys[:3], "train")
    monkeypatch.chdir(tmp_path)
    marker = Path(str(dump) + ".restore")
    with tqstore.open("dst", num_units=1) as dst:
        marker.write_text(json.dumps({"store": "dst"}))
        with pytest.raises(RestorePendingError, match="dst"):
            src.dump_data_by_key(dump, keys[:2], "train")
        assert dst.recover_data_load("dump") is False and not marker.exists()
    assert src.dump_data_by_key(dump, keys[:2], "train")["keys"] == 2


@pytest.mark.parametrize("damage", ["not json", "not a marker", "too big", "unreadable"])
def test_a_marker_that_cannot_be_read_is_neither_rewritten_nor_removed(source, tmp_path, monkeypatch, damage):
    """A restore marker that cannot be read may list other stores' pending loads: a load
    refuses before it writes anything (CheckpointError), a recover with nothing pending leaves
    the marker, and a dump into the directory is refused with a message saying so."""
    from tqstore._io import files
    src, keys = source
    dump = write_dump(src, tmp_path / "dump", keys[:3], "train")
    marker = Path(str(dump) + ".restore")
    body = {"not json": b"{\"stores\": [", "not a marker": b'{"stores": [1, 2]}\n',
            "too big": b" " * ((1 << 20) + 1), "unreadable": b'{"stores": ["/elsewhere/store"]}\n'}[damage]
    marker.write_bytes(body)
    if damage == "unreadable":
        real = files.read_regular

        def eio(path, **kw):
            if Path(path) == marker:
                raise OSError(5, "Input/output error", str(path))
            return real(path, **kw)
        monkeypatch.setattr(files, "read_regular", eio)
    with tqstore.open(tmp_path / "dst", num_units=2) as dst:
        before = state(dst)
        with pytest.raises(tqstore.CheckpointError, match="cannot be read") as e:
            dst.load_data_by_key(dump)
        assert str(marker) in str(e.value) and "recover_data_load" in str(e.value)
        assert state(dst) == before and dst.controller.restores() == []
        assert dst.recover_data_load(dump) is False
        assert marker.read_bytes() == body
    with pytest.raises(RestorePendingError, match="cannot be read"):
        src.dump_data_by_key(dump, keys[:2], "train")
    assert marker.read_bytes() == body and sorted(read_row_index_keys(dump)) == sorted(keys[:3])
    monkeypatch.undo()
    marker.unlink()  # removed by hand, as the message says: the dump is usable again
    with tqstore.open(tmp_path / "dst") as dst:
        assert dst.load_data_by_key(dump)["keys"] == 3 and not marker.exists()


def read_row_index_keys(dump):
    return list(tqstore.read_row_index(dump)["rows"])


def test_a_complete_unit_whose_staged_frames_were_lost_stops_recover_before_the_commit(pending, tmp_path):
    """A power loss took the tail of a unit's segment (its staged frames of the restore) after
    the controller had recorded the unit complete: completing would commit rows without their
    frames, so recover_data_load raises CorruptionError before the commit point (saying to
    cancel), the restore stays pending, and cancelling leaves the store as before the load."""
    dst, dump, _want, before, _keys = pending
    (r,) = dst.controller.restores()
    done = [u for u, st in enumerate(r.units) if st == "complete"]
    assert done
    unit_dir = Path(dst.units[done[0]].path)
    dst.close()
    seg = max(unit_dir.glob("seg-*"), key=lambda p: p.name)
    with open(seg, "r+b") as f:  # the last staged frame's bytes gone, as an unsynced append after a power loss
        f.truncate(seg.stat().st_size - 64)
    dst = tqstore.open(tmp_path / "dst")
    try:
        with pytest.raises(CorruptionError, match="cancel=True"):
            dst.recover_data_load(dump)
        assert [x.state for x in dst.controller.restores()] == ["running"]
        assert dst.recover_data_load(dump, cancel=True) is True
        assert dst.controller.restores() == [] and state(dst) == before and dst.verify() == []
    finally:
        dst.close()


@pytest.mark.parametrize("cancel", [False, True])
def test_recover_settles_a_pending_restore_after_reopen(pending, tmp_path, cancel):
    dst, dump, want, before, keys = pending
    dst.close()
    dst = tqstore.open(tmp_path / "dst")
    try:
        assert [r.state for r in dst.controller.restores()] == ["running"]
        assert dst.recover_data_load(dump, cancel=cancel) is True
        assert dst.recover_data_load(dump, cancel=cancel) is False  # a repeat after a lost reply
        assert dst.controller.restores() == [] and not Path(str(dump) + ".restore").exists()
        if cancel:
            assert state(dst) == before
        else:
            assert rows_of(dst, "train", keys[:8]) == want
        assert dst.verify() == []
        dst.kv_clear(["k6"], "train")  # unblocked
    finally:
        dst.close()


def test_every_field_name_and_tag_a_put_takes_comes_back_through_a_load(tmp_path):
    """What a put accepts a load accepts: a field name of 255 UTF-8 bytes (partition ids stop at
    250) and a tag nested 64 levels deep are dumped and loaded back as they were."""
    field = "f" * 253 + "é"  # 255 bytes
    tag: object = 0
    for _ in range(64):
        tag = [tag]
    with tqstore.open(tmp_path / "src", num_units=2) as s:
        s.kv_batch_put(["a", "b"], "p", fields={field: torch.arange(4).reshape(2, 2)}, tags=[tag, None])
        s.dump_data_by_key(tmp_path / "d", ["a", "b"], "p")
        want = rows_of(s, "p", ["a", "b"])
    with tqstore.open(tmp_path / "dst", num_units=3) as t:
        assert t.load_data_by_key(tmp_path / "d")["keys"] == 2
        assert rows_of(t, "p", ["a", "b"]) == want
        assert t.kv_list("p")["p"]["a"] == tag


def test_calls_a_running_load_blocks_wait_for_it_in_the_same_process(source, tmp_path, caplog):
    """While one thread's load runs, another thread's calls that its restore blocks (a save, a
    dump of the partition, a clear in it, a put of a restored key) wait for the load to end
    and then run, instead of raising RestorePendingError (each wait logged, naming the
    restore); reads do not wait."""
    import logging
    import threading
    from tqstore import CheckpointManager, verify_checkpoint
    from tqstore.meta import BatchMeta

    src, keys = source
    picked = keys[:6]
    dump = write_dump(src, tmp_path / "dump", picked, "train")
    want = rows_of(src, "train", picked)
    caplog.set_level(logging.INFO, logger="tqstore")
    with tqstore.open(tmp_path / "dst", num_units=2, result_type="dict") as dst:
        fill(dst, "train", 2, prefix="b", seed=4)  # bystanders b0, b1
        dst.put({"input_ids": torch.zeros(3, 16, dtype=torch.int64)}, partition_id="a")
        both = BatchMeta.concat([dst.get_meta(["input_ids"], 3, "a", task_name="c", mode="force_fetch"),
                                 dst.get_meta(["input_ids"], 1, "train", task_name="c", mode="force_fetch")])
        with load_held_in_import(dst, dump) as (release, loader):
            out, errors = {}, []

            def run(name, call):
                def body():
                    try:
                        out[name] = call()
                    except BaseException as e:  # noqa: BLE001 - reported by the assertion below
                        errors.append((name, e))
                t = threading.Thread(target=body)
                t.start()
                return t

            callers = [run("save", lambda: dst.save_checkpoint(tmp_path / "ck")),
                       run("dump", lambda: dst.dump_data_by_key(tmp_path / "again", picked, "train")),
                       run("clear", lambda: dst.kv_clear(["b0"], "train")),
                       run("put", lambda: dst.kv_batch_put([picked[0]], "train", tags=[{"after": "load"}])),
                       run("generation", lambda: CheckpointManager(tmp_path / "gens", store=dst).save(1)),
                       run("clear_samples", lambda: dst.clear_samples(both))]  # of "a" and "train"
            assert dst.kv_batch_get(["b1"], "train")  # a read of a bystander does not wait
            for t in callers:
                t.join(0.3)
            assert all(t.is_alive() for t in callers) and not out and not errors, (out, errors)  # waiting, not refused
            assert len(dst.controller.first_rows("a")) == 3  # a clear of two partitions removes nothing before it waits
            rid = dst.controller.restores()[0].rid

            def waits():
                return [r.getMessage() for r in caplog.records if "waits for the load by key" in r.getMessage()]
            deadline = time.monotonic() + 20  # (a slow machine's callers may still be on their way)
            while len(waits()) < len(callers) and time.monotonic() < deadline:
                time.sleep(0.02)
            assert len(waits()) == len(callers) and all(rid in m for m in waits()), waits()
            release.set()
            loader.join(30)
            for t in callers:
                t.join(30)
            assert not errors and set(out) == {"save", "dump", "clear", "put", "generation", "clear_samples"}
            assert len(dst.controller.first_rows("a")) == 0
        assert out["dump"]["keys"] == len(picked)  # the restored keys existed when it ran: after the load
        with tqstore.open(tmp_path / "from_ck") as ck:  # the save ran after the load: it holds the restored keys
            ck.load_checkpoint(tmp_path / "ck")
            assert set(picked) <= set(ck.kv_list("train")["train"])
        assert verify_checkpoint(tmp_path / "ck").problems == []
        assert "b0" not in dst.kv_list("train")["train"]
        assert dst.kv_list("train")["train"][picked[0]]["after"] == "load"  # the put ran after the load (tags merge)
        assert {k: v for k, v in rows_of(dst, "train", picked[1:]).items()} == \
            {k: v for k, v in want.items() if k != picked[0]}
        assert dst.controller.restores() == [] and dst.verify() == []


def test_a_call_meeting_a_restore_whose_load_ended_meanwhile_runs_again(source, tmp_path, monkeypatch):
    """The race a waiting call must not lose: the call meets the running load's restore, then
    the load ends before the call looks for it (forced here by delaying the look): the
    restore is gone, so the call runs again instead of raising for a restore that no
    longer exists."""
    import threading
    from tqstore import running_loads

    src, keys = source
    dump = write_dump(src, tmp_path / "dump", keys[:3], "train")
    with tqstore.open(tmp_path / "dst", num_units=2, result_type="dict") as dst, \
            load_held_in_import(dst, dump) as (release, loader):
        real_holds = running_loads._holds_store_locks

        def late_look(store):  # the caller is slow to look: the load ends first
            if threading.current_thread() is threading.main_thread() and loader.is_alive():
                release.set()
                loader.join(30)
            return real_holds(store)

        monkeypatch.setattr(running_loads, "_holds_store_locks", late_look)
        dst.kv_batch_put([keys[0]], "train", tags=[{"after": "load"}])
        assert not loader.is_alive() and dst.controller.restores() == []
        assert dst.kv_list("train")["train"][keys[0]]["after"] == "load"


def test_a_dump_to_a_directory_another_store_is_loading_from_waits_for_that_load(source, tmp_path):
    """A running load's marker goes when it ends: a dump to its directory (from another store)
    raised RestorePendingError at once, telling the user to settle a load that was healthy."""
    src, keys = source
    dump = write_dump(src, tmp_path / "dump", keys[:6], "train")
    want = rows_of(src, "train", keys[:6])
    with tqstore.open(tmp_path / "dst", num_units=3) as dst:
        with load_held_in_import(dst, dump) as (release, loader):
            handle = src.dump_data_by_key(dump, keys[6:9], "train", blocking=False)
            time.sleep(0.2)
            assert not handle.done()  # waiting for the load's lock
            release.set()
            loader.join(30)
            rep = handle.result(timeout=30)
        assert rep["keys"] == 3 and list(tqstore.read_row_index(dump)["rows"]) == keys[6:9]
        assert rows_of(dst, "train", keys[:6]) == want and dst.controller.restores() == []


def test_a_field_once_mixed_is_dumped_with_the_one_dtype_its_dumped_rows_hold(tmp_path):
    """The partition's schema stays "mixed" once any row held another dtype (a row cleared
    since too): a dump wrote "mixed", which a strict store refused ("holds tensor of several
    dtypes", untrue of the dumped rows) and a lenient one merged, making its own field mixed."""
    with tqstore.open(tmp_path / "src", num_units=2, strict_schema=False) as src:
        src.kv_batch_put(["old"], "train", fields={"x": torch.zeros(1, 3, dtype=torch.float64)})
        src.kv_batch_put(["a", "b", "c"], "train", fields={"x": torch.ones(3, 3)})
        src.kv_clear(["old"], "train")
        src.dump_data_by_key(tmp_path / "d32", ["a", "b", "c"], "train")
        src.kv_batch_put(["old"], "train", fields={"x": torch.zeros(1, 3, dtype=torch.float64)})
        src.dump_data_by_key(tmp_path / "dmix", ["a", "old"], "train")
    assert tqstore.read_row_index(tmp_path / "d32")["schemas"]["x"]["dtype"] == "float32"
    assert tqstore.read_row_index(tmp_path / "dmix")["schemas"]["x"]["dtype"] == "mixed"
    for strict in (True, False):
        with tqstore.open(tmp_path / f"dst{strict}", num_units=3, strict_schema=strict) as dst:
            dst.kv_batch_put(["live"], "train", fields={"x": torch.full((1, 3), 2.0)})
            dst.load_data_by_key(tmp_path / "d32")
            assert dst.kv_batch_get(["a", "live"], "train")["x"].dtype == torch.float32
            # the live field keeps one dtype (a mixed one reports none)
            assert dst.kv_retrieve_meta(["a", "live"], "train").field_schema["x"]["dtype"] == torch.float32
            if strict:
                with pytest.raises(SchemaError):
                    dst.load_data_by_key(tmp_path / "dmix")
            else:  # rows of two dtypes: the field is mixed now
                dst.load_data_by_key(tmp_path / "dmix")
                assert dst.kv_retrieve_meta(["a", "live"], "train").field_schema["x"]["dtype"] is None
                assert dst.kv_batch_get(["old"], "train")["x"].dtype == torch.float64


def test_a_dump_waiting_for_a_load_that_dies_refuses_and_leaves_the_dump_for_its_recover(tmp_path):
    """The dump waits for the lock of a running load; the load is killed: its restore stays
    pending, so the dump must not replace the directory its recover will read."""
    import os
    import signal
    import subprocess
    import sys

    child = ("import sys, time, tqstore\n"
             "s = tqstore.open(sys.argv[1], num_units=1)\n"
             "u = s.units[0]\n"
             "real = u.import_restore\n"
             "def held(*a, **k):\n"
             "    print('importing', flush=True)\n"
             "    time.sleep(120)\n"
             "u.import_restore = held\n"
             "s.load_data_by_key(sys.argv[2])\n")
    with tqstore.open(tmp_path / "s", num_units=2) as src:
        src.kv_batch_put(["a", "b"], "train", fields={"x": torch.ones(2, 3)})
        dump = src.dump_data_by_key(tmp_path / "d", ["a", "b"], "train")["path"]
        p = subprocess.Popen([sys.executable, "-c", child, str(tmp_path / "dst"), dump], stdout=subprocess.PIPE,
                             text=True, cwd=Path(__file__).resolve().parents[1])
        try:
            assert p.stdout.readline().strip() == "importing"
            h = src.dump_data_by_key(dump, ["a"], "train", blocking=False)
            time.sleep(0.3)
            assert not h.done()  # waiting for the load's lock
        finally:
            os.kill(p.pid, signal.SIGKILL)
            p.wait()
        with pytest.raises(RestorePendingError, match="recover_data_load"):
            h.result(timeout=30)
        assert list(tqstore.read_row_index(dump)["rows"]) == ["a", "b"]
    with tqstore.open(tmp_path / "dst") as dst:
        assert dst.recover_data_load(dump) is True
        assert sorted(dst.kv_list("train")["train"]) == ["a", "b"]
