"""Streaming client: put / get_meta (fetch, force_fetch, insert) / get_data, per-task
consumption, production status, clears, the module-level API and get_client().

Real stores on tmp_path.  The sampler here is the default SequentialSampler; samplers
have their own tests.
"""
from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

import tqstore as tq
from tqstore import (
    BatchMeta, ConfigError, FieldNotFoundError, InvalidInputError, KeyNotFoundError, KVBatchMeta, PartitionNotFoundError, SchemaError,
    StoreClosedError,
)

from sync_helpers import watch_fetch_waits


@pytest.fixture
def store(tmp_path):
    with tq.open(tmp_path / "store", num_units=2) as s:
        yield s


@pytest.fixture
def client(store):
    return tq.get_client(store)


@pytest.fixture
def default_store(tmp_path):
    tq.close()
    s = tq.init({"path": str(tmp_path / "default"), "num_units": 2})
    yield s
    tq.close()


def _prompts(n, start=0):
    return {"prompt": torch.arange(start, start + n, dtype=torch.int64).reshape(n, 1)}


# ---------------------------------------------------------------------------------- put / fetch

def test_put_without_metadata_appends_ready_rows(client):
    meta = client.put(_prompts(4), partition_id="train")
    assert isinstance(meta, BatchMeta)
    assert meta.size == 4 and meta.is_ready and meta.field_names == ["prompt"]
    assert meta.partition_ids == ["train"] * 4
    assert torch.equal(client.get_data(meta)["prompt"], _prompts(4)["prompt"])
    assert client.get_partition_list() == ["train"]


def test_fetch_returns_ready_rows_oldest_first_and_marks_them_consumed(client):
    client.put(_prompts(3), partition_id="p")
    client.put(_prompts(3, start=3), partition_id="p")
    got = []
    for _ in range(3):
        meta = client.get_meta(["prompt"], 2, "p", task_name="rollout")
        assert meta.is_ready
        got += client.get_data(meta)["prompt"].reshape(-1).tolist()
    assert got == [0, 1, 2, 3, 4, 5]
    assert client.get_meta(["prompt"], 1, "p", task_name="rollout").size == 0


def test_consumption_is_per_task(client):
    client.put(_prompts(2), partition_id="p")
    a = client.get_meta(["prompt"], 2, "p", task_name="actor")
    b = client.get_meta(["prompt"], 2, "p", task_name="critic")
    assert a.global_indexes == b.global_indexes
    assert client.get_meta(["prompt"], 1, "p", task_name="actor").size == 0
    assert client.check_consumption_status("actor", "p") and client.check_consumption_status("critic", "p")
    assert not client.check_consumption_status("ref", "p")


def test_fetch_returns_nothing_and_consumes_nothing_when_too_few_rows_are_ready(client):
    client.put(_prompts(3), partition_id="p")
    assert client.get_meta(["prompt"], 4, "p", task_name="t").size == 0
    _, consumed = client.get_consumption_status("t", "p")
    assert consumed.tolist() == [0, 0, 0]
    assert client.get_meta(["prompt"], 3, "p", task_name="t").size == 3


def test_fetch_only_returns_rows_with_every_requested_field_produced(client):
    meta = client.put(_prompts(4), partition_id="p")
    client.put({"response": ["r0", "r1"]}, meta[:2])
    assert client.get_meta(["prompt", "response"], 3, "p", task_name="t").size == 0
    got = client.get_meta(["prompt", "response"], 2, "p", task_name="t")
    assert got.global_indexes == meta.global_indexes[:2]
    assert client.get_data(got)["response"] == ["r0", "r1"]
    assert client.get_meta(["reward"], 1, "p", task_name="t").size == 0  # field nobody produced


def test_fetch_of_an_unknown_partition_returns_an_empty_meta(client):
    meta = client.get_meta(["x"], 1, "not-yet", task_name="t")
    assert meta.size == 0 and not meta.is_ready and len(client.get_data(meta).keys()) == 0


def test_fetch_waits_for_a_producer_up_to_timeout(store, client, monkeypatch):
    waiting, woken = watch_fetch_waits(store, monkeypatch)
    assert client.get_meta(["prompt"], 2, "p", task_name="t").size == 0
    assert not woken, "a fetch without timeout_s waited"
    # nobody produces: the fetch waits (only timeouts end its waits), then returns empty
    assert client.get_meta(["prompt"], 2, "p", task_name="t", timeout_s=0.15).size == 0
    assert woken and not any(woken), "a fetch with timeout_s returned without waiting"
    waiting.clear()
    got = []
    consumer = threading.Thread(
        target=lambda: got.append(client.get_meta(["prompt"], 2, "p", task_name="t", timeout_s=60)))
    consumer.start()
    assert waiting.wait(30), "the fetch never started to wait for a producer"
    client.put(_prompts(2), partition_id="p")  # committed while the fetch waits
    consumer.join(30)
    assert not consumer.is_alive(), "the waiting fetch did not return the producer's rows"
    assert got[0].size == 2 and got[0].is_ready


def test_concurrent_consumers_of_one_task_never_get_the_same_row(client):
    client.put(_prompts(200), partition_id="p")
    seen, lock = [], threading.Lock()

    def consume():
        while True:
            meta = client.get_meta(["prompt"], 5, "p", task_name="t")
            if meta.size == 0:
                return
            with lock:
                seen.extend(meta.global_indexes)

    threads = [threading.Thread(target=consume) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert sorted(seen) == sorted(set(seen)) and len(seen) == 200


def test_get_meta_rejects_bad_arguments(client):
    client.put(_prompts(2), partition_id="p")
    with pytest.raises(InvalidInputError):
        client.get_meta(["prompt"], 1, "p", mode="peek", task_name="t")
    with pytest.raises(InvalidInputError):
        client.get_meta(["prompt"], 1, "p")  # fetch without task_name
    for bad in (-1, 1.5, None, True):  # (0: an empty answer, as TransferQueue)
        with pytest.raises(InvalidInputError):
            client.get_meta(["prompt"], bad, "p", task_name="t")
    with pytest.raises(InvalidInputError):
        client.get_meta(["prompt", "prompt"], 1, "p", task_name="t")
    with pytest.raises(InvalidInputError):
        client.get_meta(None, 1, "p", mode="insert")
    _, consumed = client.get_consumption_status("t", "p")
    assert consumed.tolist() == [0, 0]


# ---------------------------------------------------------------------------------- force_fetch / insert

def test_force_fetch_returns_all_rows_produced_or_not_without_consuming(client):
    client.put(_prompts(2), partition_id="p")
    client.get_meta(["prompt"], 1, "p", task_name="t")
    ins = client.get_meta(["prompt"], 2, "p", mode="insert")
    meta = client.get_meta(["prompt"], None, "p", mode="force_fetch", task_name="t")
    assert meta.size == 4 and meta.production_status.tolist() == [1, 1, 0, 0] and not meta.is_ready
    assert meta.global_indexes[2:] == ins.global_indexes
    assert client.get_meta(["prompt"], 3, "p", mode="force_fetch").size == 3
    _, consumed = client.get_consumption_status("t", "p")
    assert consumed.tolist() == [1, 0, 0, 0]


def test_force_fetch_of_a_field_no_row_has_produced_yet_lists_it_and_no_row_is_ready(client):
    """The field was dropped from the meta, whose rows then all said ready (and get_data of it
    read the other fields only), while get_production_status said 0 for that field."""
    client.put(_prompts(3), partition_id="p")
    meta = client.get_meta(["prompt", "response"], None, "p", mode="force_fetch")
    assert meta.field_names == ["prompt", "response"] and not meta.is_ready
    assert meta.production_status.tolist() == [0, 0, 0]
    with pytest.raises(FieldNotFoundError, match="response"):
        client.get_data(meta)
    done = client.get_meta(["prompt"], 1, "p", mode="force_fetch")
    client.put({"response": torch.ones(1, 2)}, done)
    meta = client.get_meta(["prompt", "response"], None, "p", mode="force_fetch")
    assert meta.production_status.tolist() == [1, 0, 0]
    assert meta.production_status.tolist() == client.get_production_status(["prompt", "response"], "p")[1].all(
        axis=1).int().tolist()


def test_force_fetch_of_an_unknown_partition_raises(client):
    with pytest.raises(PartitionNotFoundError):
        client.get_meta(["x"], None, "nope", mode="force_fetch")


def test_insert_reserves_rows_that_put_then_fills(client):
    ins = client.get_meta(["prompt", "tag"], 3, "p", mode="insert")
    assert ins.size == 3 and not ins.is_ready and ins.field_names == ["prompt", "tag"]
    assert client.get_meta(["prompt"], 1, "p", task_name="t").size == 0
    ins.update_custom_meta([{"uid": i} for i in range(3)])
    out = client.put({"prompt": torch.ones(3, 2), "tag": ["a", "b", "c"]}, ins)
    assert out is ins and ins.is_ready and ins.field_schema["prompt"]["dtype"] == torch.float32
    got = client.get_meta(["prompt", "tag"], 3, "p", task_name="t")
    assert got.global_indexes == ins.global_indexes
    assert got.custom_meta == [{"uid": 0}, {"uid": 1}, {"uid": 2}]  # custom_meta is stored as the tag
    assert client.get_data(got)["tag"] == ["a", "b", "c"]


def test_put_with_metadata_updates_production_status_for_the_meta_fields(client):
    ins = client.get_meta(["a", "b"], 2, "p", mode="insert")
    client.put({"a": torch.zeros(2)}, ins)
    assert ins.production_status.tolist() == [0, 0]
    client.put({"b": torch.zeros(2)}, ins)
    assert ins.production_status.tolist() == [1, 1]
    gidx, status = client.get_production_status(["a", "b"], "p")
    assert gidx.tolist() == sorted(ins.global_indexes) and status.tolist() == [[1, 1], [1, 1]]


# ---------------------------------------------------------------------------------- put errors

def test_put_rejects_missing_partition_empty_meta_and_size_mismatch_without_writing(client):
    with pytest.raises(InvalidInputError):
        client.put(_prompts(2))
    with pytest.raises(InvalidInputError):
        client.put(_prompts(2), BatchMeta.empty())
    with pytest.raises(InvalidInputError):
        client.put({}, partition_id="p")
    ins = client.get_meta(["x"], 2, "p", mode="insert")
    with pytest.raises(InvalidInputError):
        client.put({"x": torch.ones(3)}, ins)
    assert not client.check_production_status(["x"], "p")


def test_put_with_metadata_and_another_partition_id_is_refused_without_writing(client):
    """A partition_id beside metadata names where the caller thinks the rows go: one that is
    not every row's partition is a mistake (TransferQueue would write the meta's rows)."""
    ins = client.get_meta(["x"], 2, "train", mode="insert")
    with pytest.raises(InvalidInputError, match="contradicts the metadata"):
        client.put({"x": torch.ones(2)}, ins, partition_id="val")
    assert not client.check_production_status(["x"], "train")
    with pytest.raises(InvalidInputError, match="contradicts"):  # a meta over two partitions: neither fits
        client.put({"x": torch.ones(3)}, BatchMeta.concat([ins, client.get_meta(["x"], 1, "val", mode="insert")]),
                   partition_id="val")
    client.put({"x": torch.ones(2)}, ins, partition_id="train")  # the meta's own partition: fine
    assert client.check_production_status(["x"], "train")


def test_put_spanning_two_partitions_validates_both_before_writing_either(client):
    client.put({"x": torch.ones(1)}, partition_id="p2")  # p2.x is float32
    m1 = client.get_meta(["x"], 1, "p1", mode="insert")
    m2 = client.get_meta(["x"], 1, "p2", mode="insert")
    both = BatchMeta.concat([m1, m2])
    with pytest.raises(SchemaError):  # p2.x holds tensors: a numpy batch is a kind clash there
        client.put({"x": np.ones(2, dtype=np.float32)}, both)
    assert not client.check_production_status(["x"], "p1")
    client.put({"x": torch.tensor([1.0, 2.0])}, both)
    assert client.get_data(both)["x"].tolist() == [1.0, 2.0]


def test_put_spanning_two_partitions_takes_the_dtype_change_the_store_allows(tmp_path):
    """With ``strict_schema=False`` (the default) a put over rows of two partitions may change a
    field's dtype, as a put over one partition may; with True it is refused for both."""
    for strict in (False, True):
        with tq.open(tmp_path / f"s{strict}", num_units=2, strict_schema=strict) as s:
            mp = s.put({"x": torch.tensor([[1], [2]])}, partition_id="p")
            mq = s.put({"x": torch.tensor([[3], [4]])}, partition_id="q")
            both = BatchMeta.concat([mp.select_fields(["x"]), mq.select_fields(["x"])], validate=False)
            new = torch.tensor([[1.5], [2.5], [3.5], [4.5]])
            if strict:
                with pytest.raises(SchemaError):
                    s.put({"x": new}, metadata=both)
                assert s.get_data(both)["x"].tolist() == [[1], [2], [3], [4]]
            else:
                s.put({"x": new}, metadata=both)
                assert s.get_data(both)["x"].tolist() == new.tolist()


def test_put_spanning_two_partitions_past_the_capacity_writes_neither(tmp_path):
    """``total_storage_size`` is checked for the rows of every partition together, before any
    is written: a put that fits partition by partition but not as a whole writes nothing."""
    with tq.open(tmp_path / "s", num_units=1, total_storage_size=3) as s:
        both = BatchMeta.concat([s.get_meta(["x"], 2, "p", mode="insert"), s.get_meta(["x"], 2, "q", mode="insert")])
        with pytest.raises(tq.CapacityError):
            s.put({"x": torch.arange(4).view(4, 1)}, metadata=both)
        assert s.get_production_status(["x"], "p")[1].tolist() == [[0], [0]]
        assert s.get_production_status(["x"], "q")[1].tolist() == [[0], [0]]
        s.put({"x": torch.arange(3).view(3, 1)}, metadata=both[:3])  # three fit
        assert s.get_data(both[:3])["x"].tolist() == [[0], [1], [2]]


def test_set_custom_meta_over_two_partitions_checks_every_tag_before_writing_any(client):
    mp = client.put({"x": torch.tensor([[1], [2]])}, partition_id="p")
    mq = client.put({"x": torch.tensor([[3], [4]])}, partition_id="q")
    both = BatchMeta.concat([mp, mq])
    both.update_custom_meta([{"score": 1}, {"score": 2}, {"score": 3}, {"score": {1, 2}}])  # a set: no tag
    with pytest.raises(tq.UnsupportedTypeError):
        client.set_custom_meta(both)
    assert client.get_meta(["x"], None, "p", mode="force_fetch").custom_meta == [{}, {}]
    assert client.get_meta(["x"], None, "q", mode="force_fetch").custom_meta == [{}, {}]


def test_a_numpy_integer_batch_size_is_taken_as_an_int(client):
    client.put({"x": torch.arange(6).view(6, 1)}, partition_id="p")
    m = client.get_meta(["x"], np.int64(4), "p", task_name="t")
    assert m.size == 4 and client.get_meta(["x"], np.int32(2), "p", mode="force_fetch").size == 2
    with pytest.raises(InvalidInputError):
        client.get_meta(["x"], np.bool_(True), "p", task_name="t")


def test_put_with_stale_metadata_is_rejected(client):
    meta = client.put(_prompts(2), partition_id="p")
    client.clear_samples(meta)
    with pytest.raises(KeyNotFoundError):
        client.put(_prompts(2), meta)
    client.clear_partition("p")
    with pytest.raises(PartitionNotFoundError):
        client.put(_prompts(2), meta)


# ---------------------------------------------------------------------------------- get_data

def test_get_data_of_a_meta_spanning_partitions_keeps_the_meta_order(client):
    m1 = client.put({"x": torch.tensor([[1], [2]]), "s": ["a", "b"]}, partition_id="p1")
    m2 = client.put({"x": torch.tensor([[3]]), "s": ["c"]}, partition_id="p2")
    both = BatchMeta.concat([m2, m1])
    both.reorder([1, 0, 2])
    out = client.get_data(both)
    assert out["x"].tolist() == [[1], [3], [2]] and out["s"] == ["a", "c", "b"]


def test_get_data_reads_only_the_selected_fields(client):
    meta = client.put({"x": torch.ones(2), "y": torch.zeros(2)}, partition_id="p")
    assert list(client.get_data(meta.select_fields(["y"])).keys()) == ["y"]


def test_get_data_of_stale_metadata_raises_what_transfer_queue_users_catch(client):
    """A meta whose rows (or partition) were cleared since: StorageKeyNotFoundError, the name
    TransferQueue code catches to skip such a batch (a KeyNotFoundError too; for a cleared
    partition also a PartitionNotFoundError)."""
    meta = client.put(_prompts(2), partition_id="p")
    client.clear_samples(meta[:1])
    with pytest.raises(tq.StorageKeyNotFoundError) as e:
        client.get_data(meta)
    assert isinstance(e.value, KeyNotFoundError) and isinstance(e.value, KeyError)
    assert client.get_data(meta[1:])["prompt"].tolist() == [[1]]
    client.clear_partition("p")
    with pytest.raises(tq.StorageKeyNotFoundError) as e:
        client.get_data(meta[1:])
    assert isinstance(e.value, tq.PartitionNotFoundError)


# ---------------------------------------------------------------------------------- clears and status

def test_clear_samples_and_clear_partition_are_idempotent(client):
    meta = client.put(_prompts(3), partition_id="p")
    client.clear_samples(meta[:2])
    client.clear_samples(meta[:2])
    assert client.get_meta(["prompt"], None, "p", mode="force_fetch").size == 1
    client.clear_partition("p")
    client.clear_partition("p")
    client.clear_partition("never")
    assert client.get_partition_list() == []
    client.clear_samples(meta)


def test_clear_samples_accepts_a_kv_batch_meta(client):
    kv = client.kv_batch_put(["a", "b"], "p", {"x": torch.ones(2)})
    client.clear_samples(kv.select_keys(["a"]))
    assert client.kv_list() == {"p": {"b": {}}}


def test_clear_partition_drops_its_consumption(client):
    client.put(_prompts(2), partition_id="p")
    client.get_meta(["prompt"], 2, "p", task_name="t")
    client.clear_partition("p")
    client.put(_prompts(2), partition_id="p")
    assert client.get_meta(["prompt"], 2, "p", task_name="t").size == 2


def test_status_queries_report_per_row_and_none_for_an_unknown_partition(client):
    meta = client.put(_prompts(3), partition_id="p")
    client.put({"reward": [0.5]}, meta[1:2])
    client.get_meta(["prompt"], 2, "p", task_name="t")
    gidx, consumed = client.get_consumption_status("t", "p")
    assert gidx.dtype == torch.long and consumed.dtype == torch.int8
    assert gidx.tolist() == sorted(meta.global_indexes) and consumed.tolist() == [1, 1, 0]
    gidx, produced = client.get_production_status(["prompt", "reward"], "p")
    assert produced.shape == (3, 2) and produced[:, 1].tolist() == [0, 1, 0]
    assert client.check_production_status("prompt", "p") and not client.check_production_status(["reward"], "p")
    assert client.get_consumption_status("t", "nope") == (None, None)
    assert client.get_production_status(["x"], "nope") == (None, None)
    assert not client.check_consumption_status("t", "nope") and not client.check_production_status("x", "nope")


def test_reset_consumption_for_one_task_or_all(client):
    client.put(_prompts(2), partition_id="p")
    for task in ("a", "b"):
        client.get_meta(["prompt"], 2, "p", task_name=task)
    assert client.reset_consumption("p", "a") is True
    assert client.get_meta(["prompt"], 2, "p", task_name="a").size == 2
    assert client.get_meta(["prompt"], 2, "p", task_name="b").size == 0
    client.reset_consumption("p")
    assert client.get_meta(["prompt"], 2, "p", task_name="b").size == 2
    assert client.reset_consumption("nope") is False


def test_consumption_survives_reopen(tmp_path):
    path = tmp_path / "s"
    with tq.open(path) as s:
        s.put(_prompts(4), partition_id="p")
        first = s.get_meta(["prompt"], 2, "p", task_name="t")
    with tq.open(path) as s:
        second = s.get_meta(["prompt"], 2, "p", task_name="t")
        assert set(second.global_indexes).isdisjoint(first.global_indexes)
        assert s.get_meta(["prompt"], 1, "p", task_name="t").size == 0


# ---------------------------------------------------------------------------------- metadata objects

def test_batch_meta_select_chunk_concat_union_and_reorder():
    m = BatchMeta([10, 11, 12, 13], ["p"] * 4, {"x": {"dtype": torch.int64}}, [1, 1, 0, 1],
                  custom_meta=[{"i": i} for i in range(4)], keys=["a", "b", "c", "d"])
    assert [c.size for c in m.chunk(3)] == [2, 1, 1]
    assert BatchMeta.concat(m.chunk(3)).global_indexes == m.global_indexes
    assert m[1:3].global_indexes == [11, 12] and m[-1].keys == ["d"]
    assert m.union_rows(m[2:]).size == 4 and m[:2].union_rows(m[1:]).global_indexes == [10, 11, 12, 13]
    u = m.union(m.select_fields([]))  # TransferQueue's union: same rows, fields merged
    assert u.global_indexes == m.global_indexes and u.field_names == ["x"] and u is not m
    assert not m.is_ready and m.select_samples([0, 1, 3]).is_ready
    r = m.select_samples(range(4))
    r.reorder([3, 2, 1, 0])
    assert r.global_indexes == [13, 12, 11, 10] and r.custom_meta[0] == {"i": 3}
    assert r.production_status.tolist() == [1, 0, 1, 1]
    assert m.select_fields(["x", "nope"]).field_names == ["x"]
    with pytest.raises(InvalidInputError):
        BatchMeta.concat([m, m.select_fields([])])
    with pytest.raises(InvalidInputError):
        r.reorder([0, 0, 1, 2])
    with pytest.raises(InvalidInputError):
        BatchMeta([1, 2], ["p"])


def test_kv_batch_meta_validates_and_splits():
    with pytest.raises(InvalidInputError):
        KVBatchMeta(keys=["a", "a"], tags=[{}, {}])
    with pytest.raises(InvalidInputError):
        KVBatchMeta(keys=["a"], tags=[])
    m = KVBatchMeta(["a", "b", "c"], [{"i": 0}, {"i": 1}, {"i": 2}], "p", ["x"])
    assert [c.keys for c in m.chunk(2)] == [["a", "b"], ["c"]]
    assert KVBatchMeta.concat(m.chunk(2)).keys == ["a", "b", "c"]
    assert m.select_keys(["c", "a"]).tags == [{"i": 2}, {"i": 0}]
    with pytest.raises(KeyNotFoundError):
        m.select_keys(["zz"])
    with pytest.raises(InvalidInputError):
        KVBatchMeta.concat([m, KVBatchMeta(["q"], [{}], "other", ["x"])])


# ---------------------------------------------------------------------------------- module API and get_client

def test_module_api_acts_on_the_default_store(default_store):
    meta = tq.kv_batch_put(["a", "b"], "kv", {"x": torch.ones(2, 2)}, tags=[{"s": 1}, {"s": 2}])
    assert tq.kv_list() == {"kv": {"a": {"s": 1}, "b": {"s": 2}}}
    assert torch.equal(tq.kv_batch_get_by_meta(meta)["x"], torch.ones(2, 2))
    tq.kv_put("c", "kv", {"x": torch.zeros(2)})
    assert tq.kv_batch_get("c", "kv")["x"].tolist() == [[0.0, 0.0]]
    tq.kv_clear(["a", "c"], "kv")
    tq.put(_prompts(2), partition_id="s")
    got = tq.get_meta(["prompt"], 2, "s", task_name="t")
    assert tq.get_data(got)["prompt"].tolist() == [[0], [1]]
    assert tq.check_consumption_status("t", "s") and tq.get_partition_list() == ["kv", "s"]
    tq.reset_consumption("s")
    tq.clear_samples(got)
    tq.clear_partition("kv")
    assert tq.get_partition_list() == ["s"]
    assert tq.get_consumption_status("t", "s")[1].numel() == 0
    assert tq.get_production_status(["prompt"], "s")[1].shape == (0, 1)


def test_get_client_follows_the_default_store_across_close_and_init(tmp_path):
    tq.close()
    c = tq.get_client()
    with pytest.raises(StoreClosedError):
        c.get_partition_list()
    try:
        tq.init({"path": str(tmp_path / "one")})
        c.put(_prompts(1), partition_id="p")
        tq.close()
        tq.init({"path": str(tmp_path / "two")})
        assert c.get_partition_list() == []
        tq.close()
        tq.init({"path": str(tmp_path / "one")})
        assert c.get_partition_list() == ["p"]
    finally:
        tq.close()


def test_init_rejects_a_second_init_and_unknown_config(default_store, tmp_path):
    with pytest.raises(ConfigError):
        tq.init({"path": str(tmp_path / "x")})
    tq.close()
    with pytest.raises(ConfigError):
        tq.init({"path": str(tmp_path / "x"), "colour": "blue"})
    with pytest.raises(StoreClosedError):
        tq.current_store()


def test_a_second_init_without_a_config_or_with_the_same_one_returns_the_open_store(tmp_path):
    # TransferQueue's init attaches to the running system: a Ray worker reused for another task
    # runs that task's tq.init() again in the same process
    tq.close()
    conf = {"path": str(tmp_path / "s"), "num_units": 2, "sampler": {"name": "grpo_group_n", "n_samples_per_prompt": 2}}
    try:
        store = tq.init(conf)
        tq.put(_prompts(2), partition_id="p")
        assert tq.init() is store
        assert tq.init(dict(conf)) is store and tq.init(conf=conf) is store
        with pytest.raises(ConfigError, match=r"another config \(it differs in num_units\); call tqstore.close"):
            tq.init({**conf, "num_units": 3})
        assert tq.init({**conf, "path": tmp_path / "s"}) is store  # the same directory, however spelled
        assert tq.init({**conf, "path": str(tmp_path / "x" / ".." / "s") + "/"}) is store
        with pytest.raises(ConfigError, match=r"differs in sampler \(SequentialSampler\(\); the open store's: "
                                              r"GRPOGroupNSampler\(n_samples_per_prompt=2\)\)"):
            tq.init({**conf, "sampler": "sequential"})
        with pytest.raises(ConfigError, match=r"differs in sampler \(GRPOGroupNSampler\(n_samples_per_prompt=4\)"):
            tq.init({**conf, "sampler": {"name": "grpo_group_n", "n_samples_per_prompt": 4}})
        with pytest.raises(ConfigError, match=r"differs in polling_mode\)"):
            tq.init({**conf, "controller": {"polling_mode": False}})
        assert tq.current_store() is store and not store.closed
        assert tq.get_partition_list() == ["p"]  # the refused calls changed nothing
    finally:
        tq.close()


def test_checkpoint_functions_forward_to_the_default_store(default_store, monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(default_store, "save_checkpoint", lambda d, **kw: calls.append(("save", d, kw)) or "h",
                        raising=False)
    monkeypatch.setattr(default_store, "load_checkpoint", lambda d: calls.append(("load", d)) or "r",
                        raising=False)
    assert tq.save_checkpoint(tmp_path / "ck", metadata={"step": 3}, blocking=False) == "h"
    assert tq.load_checkpoint(tmp_path / "ck") == "r"
    assert calls == [("save", tmp_path / "ck", {"include_storage": True, "metadata": {"step": 3},
                                                 "blocking": False}),
                     ("load", tmp_path / "ck")]


def test_module_functions_before_init_raise_store_closed():
    tq.close()
    with pytest.raises(StoreClosedError):
        tq.kv_list()
    with pytest.raises(StoreClosedError):
        tq.get_meta(["x"], 1, "p", task_name="t")


def test_calls_on_a_closed_store_raise_store_closed(tmp_path):
    s = tq.open(tmp_path / "s")
    s.close()
    with pytest.raises(StoreClosedError):
        s.kv_batch_put(["a"], "p", {"x": np.ones((1, 1))})
    with pytest.raises(StoreClosedError):
        s.get_meta(["x"], 1, "p", task_name="t")


def test_a_batch_meta_of_another_store_or_of_a_state_another_stores_checkpoint_replaced_names_no_row(tmp_path):
    """Two stores gave out the same (global index, sequence number) pairs, so a meta of store A
    read, overwrote and consumed-marked store B's rows; a new store's sequence numbers start
    at a random offset (FORMAT.md, meta/seq_floor), so it names none of them."""
    from tqstore import StorageKeyNotFoundError

    with tq.open(tmp_path / "a") as a, tq.open(tmp_path / "b") as b, tq.open(tmp_path / "c") as c:
        a.put({"x": torch.tensor([[10], [11]])}, partition_id="p")
        b.put({"x": torch.tensor([[90], [91]])}, partition_id="p")
        c.put({"x": torch.tensor([[40], [41]])}, partition_id="p")
        meta_a = a.get_meta(["x"], 2, "p", task_name="t")
        meta_c = c.get_meta(["x"], 2, "p", task_name="t")
        assert meta_a.global_indexes == meta_c.global_indexes == [0, 1]
        with pytest.raises(StorageKeyNotFoundError):
            b.get_data(meta_a)
        with pytest.raises(StorageKeyNotFoundError):
            b.put({"adv": torch.tensor([[1.0], [2.0]])}, metadata=meta_a)
        assert b.get_data(b.get_meta(["x"], 2, "p", mode="force_fetch"))["x"].tolist() == [[90], [91]]
        a.save_checkpoint(tmp_path / "ck")
        c.load_checkpoint(tmp_path / "ck")  # (C now holds A's rows at the same global indexes)
        with pytest.raises(StorageKeyNotFoundError):
            c.get_data(meta_c)
        assert c.get_data(meta_a)["x"].tolist() == [[10], [11]]  # (A's own meta: the rows it names)


def test_a_client_made_with_transfer_queues_client_id_first_says_so():
    """TransferQueue's clients take the client id first: here the first argument is the store,
    so a str is refused at once, naming client_id (every call raised AttributeError before)."""
    for cls in (tq.TransferQueueClient, tq.AsyncTransferQueueClient):
        with pytest.raises(tq.InvalidInputError, match="client_id="):
            cls("trainer-0")
        with pytest.raises(tq.InvalidInputError, match="must be a tqstore store"):
            cls(42)
    assert tq.AsyncTransferQueueClient(client_id="trainer-0").client_id == "trainer-0"
