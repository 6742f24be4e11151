"""The data plane through ControllerPort: values in, values out, fetch atomic at the
controller, the sampler on the controller's side, the Store composing a DataPlane.
"""
from __future__ import annotations

import inspect
import pickle
import threading

import numpy as np
import pytest
import torch

import tqstore as tq
from tqstore import BaseSampler, GRPOGroupNSampler, KeyNotFoundError, PartitionNotFoundError, RankAwareSampler
from tqstore.kv import PUBLIC_CALLS, DataPlane
from tqstore.ports import ControllerPort, RowBatch, RowInfo
from tqstore.testing.proxy import PickledController

# the port's data-plane part (snapshot, release, export_snapshot and stage_import: see
# tests/test_checkpoint_ports.py)
DATA_PLANE_PORT = ("plan_put", "commit_put", "partitions", "partition_info", "resolve_keys", "row_infos",
                   "rows_by_key", "row_batch", "first_rows", "list_keys", "claims", "clear_rows", "drop_partition",
                   "set_sampler", "fetch", "production_status", "consumption_status", "reset_consumption", "close")


def _rows(ids):
    ids = list(ids)
    return {"x": torch.tensor(ids).reshape(-1, 1)}


def test_the_controller_implements_the_data_plane_part_of_the_port():
    from tqstore.controller import Controller
    for name in DATA_PLANE_PORT:
        want = inspect.signature(getattr(ControllerPort, name))
        have = inspect.signature(getattr(Controller, name))
        assert list(have.parameters) == list(want.parameters), name


def test_store_composes_a_data_plane_and_forwards_every_public_call(tmp_path):
    with tq.open(tmp_path / "s") as s:
        assert isinstance(s._data, DataPlane)
        assert s._data.controller is s.controller
        for name in PUBLIC_CALLS:
            assert inspect.signature(getattr(tq.Store, name)) == inspect.signature(getattr(DataPlane, name)), name
            assert getattr(tq.Store, name).__doc__ == getattr(DataPlane, name).__doc__
        assert "_kv_state" not in vars(s)


def test_the_data_plane_works_through_a_copying_port_alone(tmp_path):
    with tq.open(tmp_path / "s", num_units=2) as s:
        port = PickledController(s.controller)  # only port methods, through pickle
        s._data.rebind(port)
        # KV
        meta = s.kv_batch_put(["a", "b"], "kv", {"x": torch.tensor([[1], [2]])}, tags=[{"i": 1}, None])
        assert meta.fields == ["x"] and meta.tags == [{"i": 1}, {}]
        s.kv_put("a", "kv", tag={"j": 2})
        assert s.kv_list("kv") == {"kv": {"a": {"i": 1, "j": 2}, "b": {}}}
        assert s.kv_batch_get(["b", "a"], "kv")["x"].flatten().tolist() == [2, 1]
        with pytest.raises(KeyNotFoundError):
            s.kv_batch_get(["zz"], "kv")
        with pytest.raises(PartitionNotFoundError):
            s.kv_batch_get(["a"], "nope")
        s.kv_clear(["a", "zz"], "kv")
        assert s.kv_list() == {"kv": {"b": {}}}
        # streaming
        s.set_sampler(GRPOGroupNSampler(n_samples_per_prompt=2))
        put = s.put(_rows(range(4)), partition_id="p")
        assert put.global_indexes and put.is_ready
        got = s.get_meta(["x"], 2, "p", task_name="t")
        assert got.size == 2 and s.get_data(got)["x"].flatten().tolist() == [0, 1]
        ins = s.get_meta(["x", "y"], 2, "p", mode="insert")
        s.put({"x": torch.tensor([[7], [8]]), "y": torch.tensor([[0], [0]])}, metadata=ins)
        assert ins.is_ready and ins.field_names == ["x", "y"]
        forced = s.get_meta(None, None, "p", mode="force_fetch")
        assert forced.size == 6 and forced.field_names == ["x", "y"]
        g, consumed = s.get_consumption_status("t", "p")
        assert dict(zip(g.tolist(), consumed.tolist())) == {g0: int(g0 in got.global_indexes) for g0 in g.tolist()}
        _, produced = s.get_production_status(["x", "y"], "p")
        assert produced.shape == (6, 2) and int(produced.sum()) == 4 + 4
        assert s.reset_consumption("p", "t") and not s.reset_consumption("nope")
        s.clear_samples(got)
        assert s.get_meta(None, None, "p", mode="force_fetch").size == 4
        s.clear_partition("p")
        assert s.get_partition_list() == ["kv"]
        assert {"fetch", "row_batch", "rows_by_key", "first_rows", "key_list"} <= set(port.calls)


def test_answers_are_copies_editing_them_changes_nothing(tmp_path):
    with tq.open(tmp_path / "s") as s:
        s.kv_put("a", "p", {"x": torch.tensor([1])}, tag={"n": [1, 2]})
        s.kv_list("p")["p"]["a"]["n"].append(3)
        s.controller.row_batch("p", s.controller.resolve_keys("p", ["a"])).tags[0]["n"].append(4)
        meta = s.get_meta(["x"], None, "p", mode="force_fetch")
        meta.custom_meta[0]["n"].append(5)  # in place, without put: the stored tag stays
        assert s.kv_list("p") == {"p": {"a": {"n": [1, 2]}}}
        s.put({"x": torch.tensor([[9]])}, metadata=meta)  # ... and a put stores the edited one
        assert s.kv_list("p") == {"p": {"a": {"n": [1, 2, 5]}}}


def test_port_queries_answer_values_for_missing_rows_and_partitions(tmp_path):
    with tq.open(tmp_path / "s", num_units=2) as s:
        c = s.controller
        g = s.put(_rows(range(3)), partition_id="p").global_indexes
        s.kv_put("k", "p", tag={"t": 1})
        assert c.partitions() == ["p"] and c.partition_info("p").rows == 4
        with pytest.raises(PartitionNotFoundError):
            c.partition_info("q")
        b = c.row_batch("p", [g[1], 999, g[0]])
        assert isinstance(b, RowBatch) and b.missing() == [1] and b.gidxs == [g[1], 999, g[0]]
        assert b.fields[0] == frozenset({"x"}) and b.schema.keys() == {"x"}
        assert b.row(1) is None and isinstance(b.row(0), RowInfo) and b.row(0).seq == b.row(2).seq + 1
        assert c.row_batch("q", [0]) is None and c.rows_by_key("q", ["k"]) is None
        k = c.rows_by_key("p", ["nope", "k"])
        assert k.missing() == [0] and k.gidxs[0] is None and k.tags[1] == {"t": 1} and k.keys[1] == "k"
        assert [r and r.gidx for r in c.row_infos("p", [g[2], 999])] == [g[2], None]
        assert c.first_rows("p", 2).gidxs == g[:2] and len(c.first_rows("p")) == 4
        assert c.first_rows("q") is None and c.production_status("q", ["x"]) is None
        assert c.consumption_status("q", "t") is None and c.drop_partition("q") == []
        claims = {**c.claims(0), **c.claims(1)}
        assert all(gg % 2 == u for u in (0, 1) for gg in c.claims(u))
        assert claims == {gg: frozenset({"x"}) for gg in g} | {c.resolve_keys("p", ["k"])[0]: frozenset()}


def test_fetch_at_the_port_never_gives_a_row_to_two_consumers_of_one_task(tmp_path):
    """Consumers call ControllerPort.fetch directly (no data-plane lock) while producers put."""
    with tq.open(tmp_path / "s", num_units=2) as s:
        c = s.controller
        produced, served, errors = [], {"a": [], "b": []}, []
        stop = threading.Event()

        def producer(base):
            for i in range(40):
                produced.extend(s.put(_rows(range(base + 4 * i, base + 4 * i + 4)), partition_id="p").global_indexes)

        def consumer(task):
            try:
                while not stop.is_set():
                    b = c.fetch("p", task, ["x"], 3)
                    if b is not None:
                        served[task].extend(zip(b.gidxs, b.seqs))
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        consumers = [threading.Thread(target=consumer, args=(t,)) for t in ("a", "a", "a", "b", "b")]
        producers = [threading.Thread(target=producer, args=(k * 1000,)) for k in range(2)]
        for th in consumers + producers:
            th.start()
        for th in producers:
            th.join(60)
        while len(served["a"]) < 318 or len(served["b"]) < 318:  # all but the last incomplete batch
            if errors or not any(th.is_alive() for th in consumers):
                break
            threading.Event().wait(0.01)
        stop.set()
        for th in consumers:
            th.join(30)
        assert not errors, errors[0]
        for task, pairs in served.items():
            assert len(pairs) == len(set(pairs)), f"task {task} got a row twice"
            assert {g for g, _ in pairs} <= set(produced)
            assert len(pairs) >= 318
        s.controller.check_mirror()


def test_samplers_get_ready_seqs_as_values_not_the_partition(tmp_path):
    seen = {}

    class Spy(BaseSampler):
        name = "spy"

        def sample(self, ready_indexes, batch_size, **kwargs):
            seen.update(kwargs)
            seen["ready"] = list(ready_indexes)
            return list(ready_indexes[:batch_size]), list(ready_indexes[:batch_size])

    with tq.open(tmp_path / "s", num_units=2) as s:
        s.set_sampler(Spy())
        other = s.put(_rows(range(4)), partition_id="o")
        s.put(_rows(range(2)), partition_id="p")
        s.clear_samples(other)
        s.put(_rows(range(2)), partition_id="p")  # reuses lower global indexes
        s.get_meta(["x"], 1, "p", task_name="t")
        assert "partition" not in seen
        s0 = seen["ready_seqs"][0]  # (a new store's first sequence number is random)
        assert seen["ready_seqs"] == [s0, s0 + 1, s0 + 2, s0 + 3] and isinstance(seen["ready_seqs"], list)
        assert seen["ready"] == s.get_meta(["x"], None, "p", mode="force_fetch").global_indexes


def test_engine_level_deletes_also_drop_cached_sampler_results_in_the_same_transaction(tmp_path):
    path = tmp_path / "s"
    cfg = {"dp_rank": 0, "batch_index": 0}
    with tq.open(path, num_units=2) as s:
        s.set_sampler(RankAwareSampler())
        m = s.put(_rows(range(2)), partition_id="p")
        s.get_meta(["x"], 2, "p", task_name="t", sampling_config=cfg)
        assert s.controller.sampler_state("p")["state"]["t"]["cache"]
        s.delete_rows("p", m.global_indexes)  # Store's engine call, not the data plane's
        assert not s.controller.sampler_state("p")["state"]["t"].get("cache")
        s.put(_rows([10, 11]), partition_id="p")  # reuses the freed global indexes
    with tq.open(path, num_units=2) as s:
        s.set_sampler(RankAwareSampler())
        again = s.get_meta(["x"], 2, "p", task_name="t", sampling_config=cfg)
        assert s.get_data(again)["x"].flatten().tolist() == [10, 11]


def test_a_failed_clear_keeps_the_sampler_state_it_had(tmp_path, monkeypatch):
    cfg = {"dp_rank": 0, "batch_index": 0}
    with tq.open(tmp_path / "s", num_units=2) as s:
        s.set_sampler(RankAwareSampler())
        m = s.put(_rows(range(2)), partition_id="p")
        s.get_meta(["x"], 2, "p", task_name="t", sampling_config=cfg)
        before = pickle.loads(pickle.dumps(s.sampler.state_dict("p")))
        import tqstore.controller as C

        def boom(name):
            raise OSError("injected")
        monkeypatch.setattr(C, "lmdb_commit_point", boom)
        with pytest.raises(Exception):
            s.controller.clear_rows("p", m.global_indexes)
        monkeypatch.undo()
        assert s.sampler.state_dict("p") == before == s.controller.sampler_state("p")
        again = s.get_meta(["x"], 2, "p", task_name="t", sampling_config=cfg)
        assert again.global_indexes == m.global_indexes  # still the cached result


def test_load_checkpoint_rebinds_the_data_plane_to_the_new_controller(tmp_path):
    with tq.open(tmp_path / "s", num_units=2) as s:
        s.set_sampler(GRPOGroupNSampler(n_samples_per_prompt=2))
        s.put(_rows(range(4)), partition_id="p")
        s.save_checkpoint(tmp_path / "ck")
        assert s.get_meta(["x"], 2, "p", task_name="t").size == 2
        old = s.controller
        s.load_checkpoint(tmp_path / "ck")
        assert s.controller is not old and s._data.controller is s.controller
        assert s.controller.sampler is s.sampler and isinstance(s.sampler, GRPOGroupNSampler)
        got = s.get_meta(["x"], 4, "p", task_name="t")  # consumption as in the checkpoint: none
        assert s.get_data(got)["x"].flatten().tolist() == [0, 1, 2, 3]
        assert np.array_equal(s.get_consumption_status("t", "p")[1].numpy(), np.ones(4, dtype=np.int8))


def test_a_remote_ports_call_log_is_bounded():
    """A store's ports live as long as the store: the log of the methods called through one
    keeps the last ``CALLS_KEPT`` names, never more."""
    from tqstore.port_calls import CALLS_KEPT, RemotePort
    from tqstore.ports import UnitPort

    class Echo(RemotePort):
        def _has(self, name):
            return True

        def _send(self, name, args, kwargs):
            return name

    port = Echo(UnitPort)
    for _ in range(CALLS_KEPT + 50):
        assert port.restore_tags() == "restore_tags"
    assert len(port.calls) == CALLS_KEPT and set(port.calls) == {"restore_tags"}
