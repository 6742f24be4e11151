"""``tq.init({"backend": "ray"})``: one store served by a named Ray actor, started by the
first process that asks for it and attached to by every other process of the cluster (a
task, an actor): what one writes the others read, consumption and checkpoints are the
store's, errors reach each caller as themselves, and the owner's close ends it.  Skipped
when ray is not installed."""
from __future__ import annotations

import pytest
import torch

ray = pytest.importorskip("ray")

import tqstore as tq  # noqa: E402
from tqstore.errors import (  # noqa: E402
    ConfigError, DistributedError, KeyNotFoundError, StorageIOError, StoreClosedError,
)
from tqstore.checkpoint import CheckpointFallbackWarning  # noqa: E402
from tqstore.ray.remote_store import RemoteHandle, RemoteStore  # noqa: E402
from tqstore.ray.store_host import STORE_CALLS, find_store_host  # noqa: E402

pytestmark = [pytest.mark.ray]
#: each a new store host and its part actors (10-15 s here): in ``make test-ray``, not ``make test``
slow = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def ray_cluster():
    import sys

    ray.init(address="local", num_cpus=8, include_dashboard=False, log_to_driver=False, configure_logging=False)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # its tasks travel by value: workers cannot import it
    yield
    ray.shutdown()


@pytest.fixture
def closed_after():
    yield
    tq.close()


def _rows(lo, hi):
    return [f"k{i}" for i in range(lo, hi)], {
        "ids": [torch.arange(i % 5 + 1) + i for i in range(lo, hi)],
        "reward": torch.arange(lo, hi, dtype=torch.float32)[:, None],
    }


def _attached_worker(name, lo, hi, driver_keys):
    """In another process: attach by name, put rows, read the driver's, consume two rows."""
    import tqstore as tq
    import torch

    store = tq.init({"backend": "ray", "ray": {"name": name}})
    try:
        keys = [f"k{i}" for i in range(lo, hi)]
        fields = {"ids": [torch.arange(i % 5 + 1) + i for i in range(lo, hi)],
                  "reward": torch.arange(lo, hi, dtype=torch.float32)[:, None]}
        tq.kv_batch_put(keys, "train", fields, tags=[{"w": 1}] * len(keys))
        seen = tq.kv_batch_get(driver_keys, "train")
        meta = tq.get_meta(["ids"], 2, "train", task_name="actor")
        got = tq.get_data(meta)
        return (store.owner, [r.tolist() for r in seen["ids"].unbind()], seen["reward"][:, 0].tolist(),
                sorted(meta.global_indexes), [r.tolist() for r in got["ids"].unbind()])
    finally:
        tq.close()


def _with_the_given_store(store, key):
    """In another process: the owner's store object, received as an argument, used and closed."""
    import torch

    with store:
        store.kv_batch_put([key], "train", {"ids": [torch.arange(2)], "reward": torch.zeros(1, 1)})
    return store.owner, store.closed


def test_a_store_started_by_init_is_shared_by_another_process_and_ended_by_its_owner(tmp_path, closed_after):
    store = tq.init({"backend": "ray", "path": str(tmp_path / "s"), "num_units": 2, "ray": {"name": "shared"}})
    assert isinstance(store, RemoteStore) and store.owner and store.num_units == 2
    assert find_store_host("shared") is not None
    keys, fields = _rows(0, 6)
    tq.kv_batch_put(keys, "train", fields)
    first = tq.get_meta(["ids"], 2, "train", task_name="actor")  # the driver consumes two rows

    task = ray.remote(_attached_worker)
    owner, seen_ids, seen_reward, gidxs, got = ray.get(task.remote("shared", 100, 104, keys))
    assert owner is False  # attached: its close only detached
    assert seen_ids == [t.tolist() for t in fields["ids"]] and seen_reward == fields["reward"][:, 0].tolist()
    assert not set(gidxs) & set(first.global_indexes)  # consumption is the store's, not the process's
    # the worker's rows, tags and puts are the store's
    back = tq.kv_batch_get([f"k{i}" for i in range(100, 104)], "train")
    assert [r.tolist() for r in back["ids"].unbind()] == [t.tolist() for t in _rows(100, 104)[1]["ids"]]
    assert tq.kv_list("train")["train"]["k101"] == {"w": 1}
    assert got == [t.tolist() for t in fields["ids"][2:4]]  # the driver took rows 0-1: the worker got 2-3
    # the owner's store object sent to a task is attached there: its close (a with block) only detaches
    assert ray.get(ray.remote(_with_the_given_store).remote(store, "given")) == (False, True)
    assert find_store_host("shared") is not None and "given" in tq.kv_list("train")["train"]

    # consumers waiting for producers wait in their own process: more of them than the host runs calls
    # at once still leave room for the put that wakes them (each gets one of its rows)
    from concurrent.futures import ThreadPoolExecutor

    from tqstore.ray.store_host import STORE_HOST_CONCURRENCY

    waiters = STORE_HOST_CONCURRENCY + 8
    with ThreadPoolExecutor(waiters) as pool:
        waiting = [pool.submit(tq.get_meta, ["ids"], 1, "later", task_name="w", timeout_s=60) for _ in range(waiters)]
        wkeys, wfields = _rows(200, 200 + waiters)
        tq.kv_batch_put(wkeys, "later", wfields)
        got = [f.result(timeout=120) for f in waiting]
    assert [len(m) for m in got] == [1] * waiters  # none came back empty after its wait
    assert len({g for m in got for g in m.global_indexes}) == waiters  # each its own row of the put
    assert bool(tq.get_consumption_status("w", "later")[1].all())  # every row of the put consumed

    with pytest.raises(KeyNotFoundError) as e:  # an error raised in the host is raised here as itself
        tq.kv_batch_get(["nope"], "train")
    assert isinstance(e.value, ValueError)
    with pytest.raises(ConfigError, match="already initialized"):
        tq.init({"backend": "ray", "ray": {"name": "shared"}})

    tq.close()
    assert store.closed and find_store_host("shared") is None  # the owner's close ended the host
    with pytest.raises(StoreClosedError):
        store.kv_list()


def _init_in_worker(config, key):
    """In a Ray task: ``tq.init(config)``, put one row under ``key``; what happened, as values."""
    import tqstore as tq
    import torch

    from tqstore.errors import ConfigError

    try:
        store = tq.init(config)
    except ConfigError as e:
        return "ConfigError", str(e)
    try:
        tq.kv_batch_put([key], "train", {"x": torch.full((1, 2), 7.0)})
        return type(store).__name__, getattr(store, "owner", None)
    finally:
        tq.close()


class _ReusedWorker:
    """A worker process that runs task after task (as Ray reuses workers): each calls
    TransferQueue's ``tq.init(config)`` first, and never ``tq.close()``."""

    def task(self, config, key):
        import torch

        import tqstore as tq
        from tqstore.errors import ConfigError

        try:
            store = tq.init(config)
        except ConfigError as e:
            return "ConfigError", str(e)
        tq.kv_batch_put([key], "train", {"x": torch.full((1, 2), 7.0)})
        return id(store), store.owner


def test_a_served_store_says_how_many_rows_a_fetch_of_its_sampler_needs(closed_after):
    # (what a StreamingDataset waiting for rows warns about: the seqlen-balanced sampler forms
    # every rank's batch at once)
    store = tq.init({"backend": "ray", "sampler": {"name": "seqlen_balanced", "dp_size": 2, "n_samples_per_prompt": 2}})
    assert store.rows_per_fetch(4) == 8


def test_a_reused_worker_runs_init_again_and_gets_the_served_store(closed_after):
    tq_config = {"controller": {"polling_mode": True}, "backend": {"SimpleStorage": {"num_data_storage_units": 2}}}
    tq.init({"backend": "ray", "num_units": 2})
    worker = ray.remote(_ReusedWorker).remote()
    first, owner = ray.get(worker.task.remote(tq_config, "t1"))
    assert owner is False
    assert ray.get(worker.task.remote(tq_config, "t2")) == (first, False)  # the same config: the same store
    assert ray.get(worker.task.remote(None, "t3")) == (first, False)
    kind, msg = ray.get(worker.task.remote({"backend": {"SimpleStorage": {"num_data_storage_units": 3}}}, "t4"))
    assert kind == "ConfigError" and "num_units" in msg
    assert sorted(tq.kv_list("train")["train"]) == ["t1", "t2", "t3"]
    tq.close()  # the driver ends the store and serves a new one of the same name
    tq.init({"backend": "ray", "num_units": 2})
    again, owner = ray.get(worker.task.remote(tq_config, "t5"))  # its stale handle is dropped: attached anew
    assert again != first and owner is False
    assert sorted(tq.kv_list("train")["train"]) == ["t5"]
    ray.kill(worker)


def test_init_without_a_backend_in_a_ray_worker_attaches_to_the_served_store_and_never_goes_private(closed_after):
    """TransferQueue's workers call ``tq.init()`` and expect the driver's store: a worker's
    init that names no backend attaches to the cluster's store; with none served it raises
    rather than open a private store whose rows nothing else would see."""
    task = ray.remote(_init_in_worker)
    kind, msg = ray.get(task.remote(None, "lost"))
    assert kind == "ConfigError" and "{'backend': 'embedded'}" in msg and "driver" in msg
    assert ray.get(task.remote({"backend": "embedded"}, "private")) == ("Store", None)  # named: as asked

    store = tq.init({"backend": "ray", "num_units": 2})  # the driver serves "default"
    assert ray.get(task.remote(None, "w1")) == ("RemoteStore", False)  # attached, not the owner
    tq_config = {"controller": {"polling_mode": True}, "backend": {"SimpleStorage": {"num_data_storage_units": 2}}}
    assert ray.get(task.remote(tq_config, "w2")) == ("RemoteStore", False)  # TransferQueue's config too
    assert sorted(tq.kv_list("train")["train"]) == ["w1", "w2"]  # the workers' rows are the store's
    assert tq.kv_batch_get(["w2"], "train")["x"].tolist() == [[7.0, 7.0]]
    kind, msg = ray.get(task.remote({"backend": {"SimpleStorage": {"num_data_storage_units": 3}}}, "w3"))
    assert kind == "ConfigError" and "num_units=3" in msg  # other settings: refused, nothing written
    assert "w3" not in tq.kv_list("train")["train"]
    tq.close()
    assert store.closed and find_store_host("default") is None
    again = tq.init({"backend": "ray"})  # the name is free at once: a new store, not the one that ended
    assert again.owner and tq.kv_list() == {}
    tq.close()


@slow
def test_attaching_with_other_settings_is_refused_and_a_detached_client_leaves_the_store(tmp_path, closed_after):
    from tqstore.ray.remote_store import connect

    owner = tq.init({"backend": "ray", "path": str(tmp_path / "s"), "num_units": 2, "result_type": "dict",
                     "ray": {"name": "strict"}})
    with pytest.raises(ConfigError, match=r"num_units=3 \(the store's: 2\)"):
        connect("strict", options={"num_units": 3})
    with pytest.raises(ConfigError, match="path"):
        connect("strict", path=str(tmp_path / "other"))
    with pytest.raises(ConfigError, match=r"sampler GRPOGroupNSampler\(n_samples_per_prompt=4\)"):
        connect("strict", sampler=tq.GRPOGroupNSampler(4))
    defaults = connect("strict", options={"durability": "checkpoint", "verify_reads": True},
                       sampler=tq.SequentialSampler())  # the store's own defaults, named: accepted
    defaults.close()
    same = connect("strict", path=str(tmp_path / "s"), options={"num_units": 2, "result_type": "dict"})
    assert not same.owner and same.root == owner.root
    same.kv_batch_put(["a"], "p", {"x": torch.ones(1, 3)})
    same.close()  # detaches only
    assert owner.kv_batch_get(["a"], "p")["x"].tolist() == [[1.0, 1.0, 1.0]]
    with pytest.raises(StoreClosedError):
        same.kv_list()
    with pytest.raises(AttributeError):
        same.snapshot  # not a call a Ray store answers
    assert set(tq.client.FORWARDED) <= STORE_CALLS  # every call the module API and clients forward


def test_arguments_ray_cannot_send_and_unknown_nodes_are_tqstore_errors(tmp_path, closed_after):
    """What cannot travel to the store's actor (a generator, a lock in a tag) is an
    UnsupportedTypeError naming the argument, as short as the embedded store's, and nothing is
    written; ``ray.nodes`` naming no alive node is a ConfigError before any actor starts."""
    import threading

    from tqstore.errors import InvalidInputError, UnsupportedTypeError
    from tqstore.ray.store_host import find_store_host

    with pytest.raises(ConfigError, match="ray.nodes.*'0123abcd'"):
        tq.init({"backend": "ray", "path": str(tmp_path / "n"), "ray": {"name": "nodes", "nodes": ["0123abcd"]}})
    assert find_store_host("nodes") is None and not (tmp_path / "n").exists()
    tq.init({"backend": "ray", "path": str(tmp_path / "s"), "result_type": "dict", "ray": {"name": "unsendable"}})
    with pytest.raises(InvalidInputError, match="argument 1 \\(generator\\)") as e:
        tq.kv_batch_put((k for k in ["a"]), "p", fields={"x": torch.ones(1, 2)})
    assert len(str(e.value)) < 300
    with pytest.raises(UnsupportedTypeError, match="argument tags="):
        tq.kv_batch_put(["a"], "p", fields={"x": torch.ones(1, 2)}, tags=[{"l": threading.Lock()}])
    assert tq.kv_list() == {}
    # a value of a class only the caller can import (a module on the driver's node alone): it pickles
    # here, the store's actor cannot read it
    import sys

    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "driver_only.py").write_text("import enum\n\n\nclass Status(enum.Enum):\n    DONE = 1\n")
    sys.path.insert(0, str(tmp_path / "mods"))
    try:
        import driver_only

        with pytest.raises(UnsupportedTypeError, match="cannot be read there.*driver_only"):
            tq.kv_batch_put(["a"], "p", fields={"x": torch.ones(1, 2)}, tags=[{"s": driver_only.Status.DONE}])
    finally:
        sys.path.remove(str(tmp_path / "mods"))
        sys.modules.pop("driver_only", None)
    assert tq.kv_list() == {}


def test_relative_paths_are_the_callers_not_the_ray_workers(tmp_path, monkeypatch, closed_after):
    """A relative store, checkpoint or dump path names a directory under the caller's working
    directory, as on the embedded backend (the host actor's directory is the Ray worker's), and
    a client elsewhere that names the store by a relative path meaning another directory is refused."""
    from tqstore.ray.remote_store import connect

    (tmp_path / "job").mkdir()
    monkeypatch.chdir(tmp_path / "job")
    owner = tq.init({"backend": "ray", "path": "run/buffer", "num_units": 2, "result_type": "dict",
                     "ray": {"name": "relative"}})
    assert owner.root == tmp_path / "job" / "run" / "buffer" and (owner.root / "STORE.json").is_file()
    tq.kv_batch_put(["a", "b"], "p", {"x": torch.ones(2, 3)})
    tq.save_checkpoint("run/ck")
    assert tq.verify_checkpoint(tmp_path / "job" / "run" / "ck").ok
    tq.save_checkpoint(checkpoint_dir="run/ck2", blocking=False).result(timeout=120)
    assert tq.verify_checkpoint("run/ck2").ok
    assert tq.dump_data_by_key("run/d", ["a"], "p")["keys"] == 1
    assert set(tq.read_row_index(tmp_path / "job" / "run" / "d")["rows"]) == {"a"}
    tq.kv_clear(["a"], "p")
    assert tq.load_data_by_key("run/d")["keys"] == 1 and not tq.recover_data_load("run/d")
    tq.load_checkpoint("run/ck")
    assert sorted(tq.kv_list("p")["p"]) == ["a", "b"]
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="path"):  # tmp_path/run/buffer: not the store
        connect("relative", path="run/buffer")
    connect("relative", path="job/run/buffer").close()  # the same directory: attached


@slow
def test_checkpoints_through_the_ray_store_load_into_it_and_into_an_embedded_store(tmp_path, closed_after):
    tq.init({"backend": "ray", "path": str(tmp_path / "s"), "num_units": 2, "result_type": "dict",
             "ray": {"name": "ck"}})
    keys, fields = _rows(0, 8)
    tq.kv_batch_put(keys, "train", fields)
    handle = tq.save_checkpoint(tmp_path / "ck1", blocking=False)
    assert isinstance(handle, RemoteHandle) and handle.stall_s >= 0
    tq.kv_batch_put(["late"], "train", {"ids": [torch.arange(2)], "reward": torch.zeros(1, 1)})  # after the cut
    info = handle.result(timeout=120)
    assert handle.done() and handle.exception() is None and info.rows == 8
    tq.load_checkpoint(tmp_path / "ck1")
    assert sorted(tq.kv_list("train")["train"]) == sorted(keys)  # "late" is not in the checkpoint
    assert tq.verify_checkpoint(tmp_path / "ck1").ok
    # generations of the served store: saved, waited for and restored by its host
    mgr = tq.CheckpointManager(tmp_path / "gens", keep_last=2)
    assert mgr.save(1).rows == 8
    tq.kv_batch_put(["g2"], "train", {"ids": [torch.arange(3)], "reward": torch.ones(1, 1)})
    h = mgr.save(2, blocking=False)
    assert isinstance(h, RemoteHandle) and h.result(timeout=120).rows == 9
    mgr.wait_until_finished()
    tq.kv_batch_put(["g3"], "train", {"ids": [torch.arange(4)], "reward": torch.ones(1, 1)})
    mgr.save(3)
    assert mgr.steps() == [2, 3]  # keep_last=2, applied by the host's save
    tq.kv_clear(["g2", "g3"], "train")
    assert mgr.restore(2) == 2 and "g2" in tq.kv_list("train")["train"] and "g3" not in tq.kv_list("train")["train"]
    assert mgr.restore() == 3 and "g3" in tq.kv_list("train")["train"]
    (mgr.path(3) / "MANIFEST.json").write_text("torn")  # a fallback: its warning reaches this process
    with pytest.warns(CheckpointFallbackWarning, match="step-0000000003"):
        assert mgr.restore() == 2
    tq.close()
    with tq.open(tmp_path / "emb", num_units=3, result_type="dict") as emb:  # the embedded format
        emb.load_checkpoint(tmp_path / "ck1")
        got = emb.kv_batch_get(keys, "train")
        assert [r.tolist() for r in got["ids"]] == [t.tolist() for t in fields["ids"]]


def test_put_updates_the_callers_meta_and_only_fetch_waits_as_in_the_embedded_store(tmp_path, closed_after):
    """Through the served store as in process: ``put(data, metadata=meta)`` updates the
    caller's ``meta`` (fields, production status, tags), so ``get_data(meta)`` reads every
    field; ``force_fetch`` of an empty partition answers at once whatever ``timeout_s``."""
    import time

    tq.init({"backend": "ray", "path": str(tmp_path / "s"), "num_units": 2, "ray": {"name": "meta"}})
    meta = tq.put({"prompt": torch.arange(4).view(2, 2)}, partition_id="p")
    meta.update_custom_meta([{"r": 1}, {"r": 2}])
    back = tq.put({"response": torch.ones(2, 3)}, metadata=meta)
    assert back is meta and meta.field_names == ["prompt", "response"]
    assert meta.production_status.tolist() == [1, 1]
    got = tq.get_data(meta)
    assert sorted(got.keys()) == ["prompt", "response"] and got["response"].tolist() == [[1.0] * 3] * 2
    assert tq.get_meta(None, None, "p", mode="force_fetch").custom_meta == [{"r": 1}, {"r": 2}]
    # set_custom_meta is one call of the host (its check and write under the store's write lock)
    meta.update_custom_meta([{"s": 1}, {"s": 2}])
    tq.current_store().set_custom_meta(meta)  # (a served store answers it, as an embedded one does)
    assert tq.get_meta(None, None, "p", mode="force_fetch").custom_meta == [{"r": 1, "s": 1}, {"r": 2, "s": 2}]
    tq.clear_samples(meta)
    tq.put({"prompt": torch.zeros(2, 2)}, partition_id="p")  # the cleared indexes again
    with pytest.raises(tq.StorageKeyNotFoundError):
        tq.get_client().set_custom_meta(meta)
    assert not any(tq.get_meta(None, None, "p", mode="force_fetch").custom_meta)
    tq.kv_put("k", "p", tag={"t": 1})
    got = tq.get_client().kv_retrieve_meta(["k", "missing"], "p")  # (one call of the host each)
    assert got.keys == ["k"] and got.custom_meta == [{"t": 1}]
    assert tq.get_client().kv_retrieve_keys(got.global_indexes + [10 ** 6], "p") == ["k", None]
    tq.put({"x": torch.zeros(1, 1)}, partition_id="empty")
    tq.clear_partition("empty")
    t0 = time.monotonic()
    try:
        assert tq.get_meta(["x"], None, "empty", mode="force_fetch", timeout_s=5.0).size == 0
    except tq.PartitionNotFoundError:
        pass  # (a cleared partition may be gone: either way, at once)
    assert time.monotonic() - t0 < 2.0


def test_a_store_that_cannot_open_raises_its_own_error_and_leaves_no_host(tmp_path, closed_after):
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(StorageIOError, match="cannot create store directory"):
        tq.init({"backend": "ray", "path": str(tmp_path / "file"), "ray": {"name": "broken"}})
    assert find_store_host("broken") is None
    with pytest.raises(StoreClosedError):
        tq.current_store()


@slow
def test_a_dead_host_is_a_distributed_error(tmp_path, closed_after):
    store = tq.init({"backend": "ray", "path": str(tmp_path / "s"), "ray": {"name": "dies"}})
    ray.kill(find_store_host("dies"))
    with pytest.raises(DistributedError, match="Ray store 'dies'") as e:
        tq.kv_list()
    assert e.value.outcomes == {"Ray store 'dies'": "unreachable: ActorDiedError"}
    tq.close()  # nothing left to close: logged, not raised
    assert store.closed
