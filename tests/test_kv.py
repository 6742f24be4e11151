"""KV API by user key: kv_put / kv_batch_put / kv_batch_get(_by_meta) / kv_list / kv_clear.

Real stores on tmp_path (real LMDB, real segment files).  Error tests check both the
exception class and that nothing was written (keys, tags, schema, the global index
allocator and the stored payload stay as they were).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from tensordict import TensorDict

import tqstore
from tqstore import (
    FieldNotFoundError, InvalidInputError, KeyNotFoundError, KVBatchMeta, PartitionNotFoundError, SchemaError,
    TqstoreError, UnsupportedTypeError,
)


@pytest.fixture
def store(tmp_path):
    with tqstore.open(tmp_path / "store", num_units=2) as s:
        yield s


def _state(s):
    """Everything a rejected call must leave unchanged."""
    c = s.controller
    return (s.kv_list(), {p: dict(c.parts[p].schema) for p in c.parts}, c.next_gidx, sorted(c.free),
            {g: (r.pid, r.key, r.tag, sorted(r.fields), r.seq) for g, r in c.rows.items()})


# ---------------------------------------------------------------------------------- round trips

def test_kv_batch_put_then_get_returns_the_same_values(store):
    ids = torch.arange(12, dtype=torch.int64).reshape(3, 4)
    meta = store.kv_batch_put(["a", "b", "c"], "train", {"ids": ids, "text": ["x", "y", "z"]})
    assert isinstance(meta, KVBatchMeta)
    assert meta.keys == ["a", "b", "c"] and meta.partition_id == "train"
    assert meta.fields == ["ids", "text"]
    out = store.kv_batch_get(["c", "a"], "train")
    assert torch.equal(out["ids"], ids[[2, 0]])
    assert out["text"] == ["z", "x"]


def test_kv_batch_get_accepts_a_single_key_and_a_single_field_name(store):
    store.kv_batch_put(["a", "b"], "p", {"x": torch.tensor([[1.0], [2.0]]), "y": [1, 2]})
    out = store.kv_batch_get("b", "p", select_fields="x")
    assert list(out.keys()) == ["x"]
    assert torch.equal(out["x"], torch.tensor([[2.0]]))


def test_kv_put_adds_the_batch_dimension_to_one_row(store):
    meta = store.kv_put("k", "p", {"t": torch.tensor([1, 2, 3]), "n": np.arange(2.0), "v": {"a": [1, None]}},
                        tag={"score": 0.5})
    assert meta.keys == ["k"] and meta.tags == [{"score": 0.5}] and meta.fields == ["n", "t", "v"]
    out = store.kv_batch_get("k", "p")
    assert torch.equal(out["t"], torch.tensor([[1, 2, 3]]))
    assert np.array_equal(np.asarray(out["n"]), np.arange(2.0)[None])
    assert out["v"] == [{"a": [1, None]}]


def test_kv_put_rejects_a_nested_tensor_and_a_call_without_fields_or_tag(store):
    nt = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)], layout=torch.jagged)
    with pytest.raises(InvalidInputError):
        store.kv_put("k", "p", {"x": nt})
    with pytest.raises(InvalidInputError):
        store.kv_put("k", "p")
    with pytest.raises(InvalidInputError):
        store.kv_batch_put(["k"], "p")
    for empty in ({}, TensorDict({}, batch_size=[1])):  # (an empty mapping wrote rows with nothing in them)
        with pytest.raises(InvalidInputError, match="holds no field"):
            store.kv_batch_put(["k"], "p", fields=empty)
    with pytest.raises(InvalidInputError, match="holds no field"):
        store.kv_put("k", "p", fields={})
    assert store.kv_list() == {}
    store.kv_batch_put(["k"], "p", fields={}, tags=[{"waiting": True}])  # a tag alone still makes the key
    assert store.kv_list() == {"p": {"k": {"waiting": True}}}


def test_kv_batch_put_overwrites_a_field_with_new_values(store):
    store.kv_batch_put(["a", "b"], "p", {"x": torch.zeros(2, 3)})
    store.kv_batch_put(["b"], "p", {"x": torch.ones(1, 3)})
    out = store.kv_batch_get(["a", "b"], "p")
    assert torch.equal(out["x"], torch.tensor([[0.0] * 3, [1.0] * 3]))


# ---------------------------------------------------------------------------------- KVBatchMeta.fields

def test_kv_meta_fields_are_cumulative_across_puts(store):
    assert store.kv_batch_put(["a", "b"], "p", {"prompt": torch.ones(2, 2)}).fields == ["prompt"]
    meta = store.kv_batch_put(["a", "b"], "p", {"response": ["r1", "r2"]})
    assert meta.fields == ["prompt", "response"]
    meta = store.kv_batch_put(["a", "b"], "p", tags=[{"step": 1}, {"step": 1}])
    assert meta.fields == ["prompt", "response"]


def test_kv_meta_fields_are_the_fields_every_key_has(store):
    store.kv_batch_put(["a", "b"], "p", {"x": torch.ones(2, 1)})
    meta = store.kv_batch_put(["b", "c"], "p", {"y": [1, 2]})
    assert meta.fields == ["y"]  # "c" has no x
    assert store.kv_batch_put(["b"], "p", tags=[None]).fields == ["x", "y"]


def test_kv_batch_get_by_meta_reads_the_meta_fields_or_a_subset(store):
    store.kv_batch_put(["a", "b"], "p", {"x": torch.ones(2, 1)})
    meta = store.kv_batch_put(["a", "b"], "p", {"y": ["u", "v"]})
    assert set(store.kv_batch_get_by_meta(meta).keys()) == {"x", "y"}
    assert list(store.kv_batch_get_by_meta(meta, select_fields=["y"]).keys()) == ["y"]
    assert sorted(store.get_data(meta).keys()) == ["x", "y"]  # a KVBatchMeta is read by key


def test_an_empty_kv_batch_meta_reads_as_an_empty_result_like_an_empty_batch_meta(store):
    """get_data's docstring says an empty meta gives an empty result; a KVBatchMeta of no keys
    raised "keys is an empty list" (kv_batch_get's refusal of an empty key list)."""
    store.kv_batch_put(["a"], "p", {"x": torch.ones(1, 1)})
    empty = KVBatchMeta(keys=[], tags=[], partition_id="p")
    for got in (store.get_data(empty), store.kv_batch_get_by_meta(empty),
                store.kv_batch_get_by_meta(KVBatchMeta(keys=[], tags=[], partition_id="p", fields=["x"]), "x")):
        assert len(got) == 0 and list(got.keys()) == []
    with pytest.raises(InvalidInputError):  # (as before: an empty key list given to kv_batch_get itself)
        store.kv_batch_get([], "p")


def test_kv_batch_get_by_meta_rejects_a_field_outside_the_meta_and_a_meta_without_partition(store):
    meta = store.kv_batch_put(["a"], "p", {"x": torch.ones(1, 1)})
    store.kv_batch_put(["a"], "p", {"z": torch.ones(1, 1)})
    with pytest.raises(FieldNotFoundError):
        store.kv_batch_get_by_meta(meta, select_fields="z")
    with pytest.raises(InvalidInputError):
        store.kv_batch_get_by_meta(KVBatchMeta(keys=["a"], tags=[{}], fields=["x"]))


# ---------------------------------------------------------------------------------- tags and listing

def test_tags_merge_into_existing_dict_tags_and_kv_list_shows_them(store):
    store.kv_batch_put(["a", "b"], "p", {"x": torch.ones(2, 1)}, tags=[{"s": 1}, {"s": 2}])
    store.kv_batch_put(["a", "b"], "p", tags=[{"done": True}, None])
    assert store.kv_list("p") == {"p": {"a": {"s": 1, "done": True}, "b": {"s": 2}}}


def test_kv_put_with_only_a_tag_creates_the_key_without_fields(store):
    meta = store.kv_put("k", "p", tag={"state": "queued"})
    assert meta.fields == [] and meta.tags == [{"state": "queued"}]
    assert store.kv_list() == {"p": {"k": {"state": "queued"}}}
    with pytest.raises(FieldNotFoundError):
        store.kv_batch_get("k", "p")


def test_kv_list_lists_every_partition_in_insertion_order_and_nothing_for_an_unknown_one(store):
    store.kv_batch_put(["z", "a"], "p1", {"x": torch.ones(2, 1)})
    store.kv_put("m", "p2", tag={"t": 1})
    assert store.kv_list() == {"p1": {"z": {}, "a": {}}, "p2": {"m": {"t": 1}}}
    assert list(store.kv_list("p1")["p1"]) == ["z", "a"]
    assert store.kv_list("nope") == {}


def test_kv_list_skips_unkeyed_and_cleared_rows_and_its_empty_tags_are_the_callers_own(store):
    store.kv_batch_put(["a", "b", "c", "d"], "p", {"x": torch.ones(4, 1)}, tags=[None, {"t": [1]}, None, None])
    store.put({"x": torch.ones(2, 1)}, partition_id="p")  # streamed rows: no key
    store.kv_clear(["c"], "p")
    store.kv_batch_put(["e", "c"], "p", {"x": torch.ones(2, 1)})
    got = store.kv_list("p")["p"]
    assert list(got.items()) == [("a", {}), ("b", {"t": [1]}), ("d", {}), ("e", {}), ("c", {})]
    got["a"]["mine"] = 1
    got["b"]["t"].append(2)
    assert got["d"] == {} and store.kv_list() == {"p": {"a": {}, "b": {"t": [1]}, "d": {}, "e": {}, "c": {}}}


# ---------------------------------------------------------------------------------- bad input: nothing written

def test_batch_size_different_from_number_of_keys_is_rejected_before_any_write(store):
    store.kv_batch_put(["a"], "p", {"x": torch.ones(1, 2)})
    before = _state(store)
    with pytest.raises(InvalidInputError):
        store.kv_batch_put(["b", "c"], "p", {"x": torch.ones(3, 2)})
    with pytest.raises(InvalidInputError):
        store.kv_batch_put(["b", "c"], "p", {"x": torch.ones(2, 2), "y": ["only one"]})
    assert _state(store) == before


def test_number_of_tags_different_from_number_of_keys_is_rejected_before_any_write(store):
    before = _state(store)
    with pytest.raises(InvalidInputError):
        store.kv_batch_put(["a", "b"], "p", {"x": torch.ones(2, 2)}, tags=[{}])
    assert _state(store) == before


def test_duplicate_keys_in_one_call_are_rejected_before_any_write(store):
    before = _state(store)
    with pytest.raises(InvalidInputError, match="duplicate"):
        store.kv_batch_put(["a", "b", "a"], "p", {"x": torch.ones(3, 2)})
    assert _state(store) == before


def test_dtype_clash_with_the_field_schema_is_rejected_and_the_old_value_kept(store):
    store.strict_schema = True  # (the default lets a dtype change: tests/test_fields.py)
    store.kv_batch_put(["a"], "p", {"x": torch.ones(1, 2, dtype=torch.float32)})
    before = _state(store)
    with pytest.raises(SchemaError):
        store.kv_batch_put(["a", "b"], "p", {"ok": ["fine", "fine"], "x": torch.ones(2, 2, dtype=torch.float64)})
    store.strict_schema = False  # a kind clash is rejected in both modes
    with pytest.raises(SchemaError):
        store.kv_batch_put(["a"], "p", {"x": np.ones((1, 2), dtype=np.float32)})  # numpy vs tensor
    with pytest.raises(SchemaError):
        store.kv_batch_put(["a"], "p", {"x": ["text"]})
    assert _state(store) == before
    assert torch.equal(store.kv_batch_get("a", "p")["x"], torch.ones(1, 2))


def test_unsupported_value_types_are_rejected_before_any_write(store):
    before = _state(store)
    for bad in ([object()], [{1: "int key"}], [{"a": {1, 2}}], [[b"bytes in a list"]]):
        with pytest.raises(UnsupportedTypeError):
            store.kv_batch_put(["a"], "p", {"ok": torch.ones(1, 1), "bad": bad})
    with pytest.raises(UnsupportedTypeError):
        store.kv_put("a", "p", tag={"fn": print})
    with pytest.raises(InvalidInputError):
        store.kv_batch_put(["a"], "p", "not a mapping")
    assert _state(store) == before


def test_bad_keys_and_partition_ids_are_rejected(store):
    for keys in ([], [1], None, 5):
        with pytest.raises(InvalidInputError):
            store.kv_batch_put(keys, "p", {"x": torch.ones(1, 1)})
    for pid in ("", None, 3):
        with pytest.raises(InvalidInputError):
            store.kv_batch_put(["a"], pid, {"x": torch.ones(1, 1)})
    assert store.kv_list() == {}


def test_get_of_unknown_partition_key_or_field_raises_a_not_found_error(store):
    store.kv_batch_put(["a"], "p", {"x": torch.ones(1, 1)})
    with pytest.raises(PartitionNotFoundError):
        store.kv_batch_get(["a"], "nope")
    with pytest.raises(KeyNotFoundError) as e:
        store.kv_batch_get(["a", "missing"], "p")
    assert "missing" in str(e.value)
    with pytest.raises(FieldNotFoundError):
        store.kv_batch_get(["a"], "p", select_fields=["x", "never"])
    for exc in (PartitionNotFoundError, KeyNotFoundError, FieldNotFoundError):
        assert issubclass(exc, KeyError) and issubclass(exc, TqstoreError)


def test_get_without_select_fields_raises_when_keys_share_no_field(store):
    store.kv_batch_put(["a"], "p", {"x": torch.ones(1, 1)})
    store.kv_batch_put(["b"], "p", {"y": torch.ones(1, 1)})
    with pytest.raises(FieldNotFoundError):
        store.kv_batch_get(["a", "b"], "p")


# ---------------------------------------------------------------------------------- clears

def test_kv_clear_removes_keys_and_is_idempotent(store):
    store.kv_batch_put(["a", "b", "c"], "p", {"x": torch.arange(3).reshape(3, 1)})
    store.kv_clear(["a", "c"], "p")
    store.kv_clear(["a", "c", "never-existed"], "p")
    store.kv_clear("b", "p")
    store.kv_clear("b", "p")
    store.kv_clear(["a"], "no-such-partition")
    assert store.kv_list() == {"p": {}}
    with pytest.raises(KeyNotFoundError):
        store.kv_batch_get(["a"], "p")


def test_kv_clear_leaves_other_keys_readable(store):
    store.kv_batch_put(["a", "b", "c"], "p", {"x": torch.arange(3).reshape(3, 1)})
    store.kv_clear("b", "p")
    assert torch.equal(store.kv_batch_get(["a", "c"], "p")["x"], torch.tensor([[0], [2]]))


def test_a_freed_global_index_reused_by_another_partition_never_shows_up_in_the_old_one(store):
    old = store.kv_batch_put(["a"], "p1", {"x": torch.tensor([[1]])})
    stream_meta = store.get_meta(["x"], None, "p1", mode="force_fetch")
    g = store.controller.parts["p1"].keys["a"]
    store.kv_clear("a", "p1")
    store.kv_batch_put(["b"], "p2", {"x": torch.tensor([[2]])})
    assert store.controller.parts["p2"].keys["b"] == g  # the index really was reused
    assert store.kv_list("p1") == {"p1": {}}
    with pytest.raises(KeyNotFoundError):
        store.kv_batch_get_by_meta(old)
    with pytest.raises(KeyNotFoundError):
        store.get_data(stream_meta)
    assert store.get_meta(["x"], None, "p1", mode="force_fetch").size == 0
    store.clear_samples(stream_meta)  # stale meta: must not delete p2's row
    assert torch.equal(store.kv_batch_get("b", "p2")["x"], torch.tensor([[2]]))


def test_a_global_index_reused_in_the_same_partition_is_not_read_through_a_stale_meta(store):
    store.kv_batch_put(["a"], "p", {"x": torch.tensor([[1]])})
    stale = store.get_meta(["x"], None, "p", mode="force_fetch")
    store.kv_clear("a", "p")
    store.kv_batch_put(["b"], "p", {"x": torch.tensor([[2]])})
    assert store.controller.parts["p"].keys["b"] == stale.global_indexes[0]
    with pytest.raises(KeyNotFoundError):
        store.get_data(stale)
    store.clear_samples(stale)
    assert store.kv_list("p") == {"p": {"b": {}}}


@pytest.mark.parametrize("reopen", [False, True])
def test_a_stale_meta_of_a_partition_cleared_and_created_again_touches_none_of_its_new_rows(tmp_path, reopen):
    """A trainer clears "train" every step and puts the next step's rows into a new "train":
    the new rows get the same global indexes; a consumer still holding the last step's meta
    must not read, overwrite, tag or delete them (also after a reopen in between)."""
    path = tmp_path / "s"
    s = tqstore.open(path, num_units=2)
    try:
        s.put({"x": torch.tensor([1, 2])}, partition_id="train")
        old = s.get_meta(["x"], 2, "train", mode="force_fetch")
        s.clear_partition("train")
        if reopen:
            s.close()
            s = tqstore.open(path)
        s.put({"x": torch.tensor([100, 200])}, partition_id="train")
        fresh = s.get_meta(["x"], 2, "train", mode="force_fetch")
        assert fresh.global_indexes == old.global_indexes  # the indexes really were reused
        with pytest.raises(KeyNotFoundError):
            s.get_data(old)
        with pytest.raises(KeyNotFoundError):
            s.put({"x": torch.tensor([-1, -1])}, metadata=old)
        old.update_custom_meta([{"bad": 1}, {"bad": 2}])
        with pytest.raises(KeyNotFoundError):
            s.set_custom_meta(old)
        s.clear_samples(old)  # stale: nothing of the new partition's is deleted
        assert torch.equal(s.get_data(fresh)["x"], torch.tensor([100, 200]))
        assert s.get_meta(["x"], 2, "train", mode="force_fetch").custom_meta == [{}, {}]
    finally:
        s.close()


def test_a_partition_created_again_by_a_load_by_key_or_a_checkpoint_load_keeps_stale_metas_out(tmp_path):
    with tqstore.open(tmp_path / "src", num_units=2) as src:
        src.kv_batch_put(["a", "b"], "train", {"x": torch.tensor([[5], [6]])})
        src.dump_data_by_key(tmp_path / "dump", ["a", "b"], "train")
    with tqstore.open(tmp_path / "s", num_units=2) as s:
        s.kv_batch_put(["a", "b"], "train", {"x": torch.tensor([[1], [2]])})
        old = s.get_meta(["x"], 2, "train", mode="force_fetch")
        s.clear_partition("train")
        s.load_data_by_key(tmp_path / "dump")  # creates "train" again, on the same indexes
        assert sorted(s.kv_retrieve_meta(["a", "b"], "train").global_indexes) == sorted(old.global_indexes)
        with pytest.raises(KeyNotFoundError):
            s.get_data(old)
        s.save_checkpoint(tmp_path / "ck")
        s.clear_partition("train")
        s.load_checkpoint(tmp_path / "ck")
        s.clear_partition("train")
        s.kv_batch_put(["a", "b"], "train", {"x": torch.tensor([[7], [8]])})
        with pytest.raises(KeyNotFoundError):
            s.get_data(old)
        assert torch.equal(s.kv_batch_get(["a", "b"], "train")["x"], torch.tensor([[7], [8]]))


@pytest.mark.parametrize("include_storage", [True, False])
def test_a_stale_meta_taken_after_a_checkpoint_touches_no_row_after_a_rollback_to_it(tmp_path, include_storage):
    """A trainer rolls back to its last checkpoint (a diverged step) in the same process while a
    consumer still holds a meta of rows put after that checkpoint: the rows put after the
    rollback get the same global indexes; the stale meta must not read, overwrite, tag or
    delete them, before and after a reopen.  A meta of rows the checkpoint holds still names them."""
    path = tmp_path / "s"
    s = tqstore.open(path, num_units=2)
    try:
        s.put({"x": torch.tensor([1, 2])}, partition_id="train")
        kept = s.get_meta(["x"], 2, "train", mode="force_fetch")
        s.save_checkpoint(tmp_path / "ck", include_storage=include_storage)
        s.put({"x": torch.tensor([3, 4])}, partition_id="train")
        s.put({"x": torch.tensor([9])}, partition_id="other")
        s.get_meta(["x"], 2, "train", mode="fetch", task_name="t")
        old = s.get_meta(["x"], 2, "train", mode="fetch", task_name="t")  # (the rows put after the checkpoint)
        assert sorted(s.get_data(old)["x"].tolist()) == [3, 4]
        stale_other = s.get_meta(["x"], 1, "other", mode="force_fetch")
        s.load_checkpoint(tmp_path / "ck")
        if not include_storage:  # (no payload in the checkpoint: the kept rows are put again)
            s.put({"x": torch.tensor([1, 2])}, metadata=kept)
        s.put({"x": torch.tensor([30, 40])}, partition_id="train")
        s.put({"x": torch.tensor([90])}, partition_id="other")
        fresh = s.get_meta(["x"], 4, "train", mode="force_fetch")
        assert set(old.global_indexes) <= set(fresh.global_indexes)  # the indexes really were reused
        for reopen in (False, True):
            if reopen:
                s.close()
                s = tqstore.open(path)
            for stale in (old, stale_other):
                with pytest.raises(KeyNotFoundError):
                    s.get_data(stale)
                with pytest.raises(KeyNotFoundError):
                    s.put({"x": torch.tensor([-1] * stale.size)}, metadata=stale)
                stale.update_custom_meta([{"bad": 1}] * stale.size)
                with pytest.raises(KeyNotFoundError):
                    s.set_custom_meta(stale)
                s.clear_samples(stale)  # stale: nothing of the loaded or the new rows is deleted
            now = s.get_meta(["x"], 4, "train", mode="force_fetch")
            assert sorted(s.get_data(now)["x"].tolist()) == [1, 2, 30, 40]
            assert now.custom_meta == [{}, {}, {}, {}]
            assert s.get_data(s.get_meta(["x"], 1, "other", mode="force_fetch"))["x"].tolist() == [90]
            assert sorted(s.get_data(kept)["x"].tolist()) == [1, 2]
    finally:
        s.close()


# ---------------------------------------------------------------------------------- persistence

def test_keys_tags_and_values_survive_reopen(tmp_path):
    path = tmp_path / "store"
    with tqstore.open(path) as s:
        s.kv_batch_put(["a", "b"], "p", {"x": torch.arange(4.0).reshape(2, 2), "t": ["u", None]},
                       tags=[{"s": 1}, {"s": 2}])
        s.kv_clear("a", "p")
    with tqstore.open(path) as s:
        assert s.kv_list() == {"p": {"b": {"s": 2}}}
        out = s.kv_batch_get("b", "p")
        assert torch.equal(out["x"], torch.tensor([[2.0, 3.0]])) and out["t"] == [None]
        assert s.kv_batch_put(["b"], "p", tags=[{"more": 1}]).tags == [{"s": 2, "more": 1}]


def test_a_put_with_tags_into_a_partition_reopened_without_rows_creates_its_keys(tmp_path):
    with tqstore.open(tmp_path / "s") as s:
        s.kv_batch_put(["k0"], "p", {"x": torch.zeros(1, 1)})
        s.kv_clear(["k0"], "p")
    with tqstore.open(tmp_path / "s") as s:  # the partition is there, its columns are empty
        s.kv_batch_put(["k0"], "p", {"x": torch.ones(1, 1)}, tags=[{"s": 1}])
        assert s.kv_list("p") == {"p": {"k0": {"s": 1}}}
