"""TransferQueue-shaped API edge: init config mapping, metrics, client extras, seqlen balancing, streaming."""
from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

import tqstore as tq
from tqstore.config import translate
from tqstore.errors import ConfigError, StoreClosedError


def test_translate_maps_transfer_queue_config_and_logs_what_does_not_apply(caplog):
    caplog.set_level(logging.DEBUG, logger="tqstore")
    store, sampler, s = translate({"controller": {"sampler": "GRPOGroupNSampler", "polling_mode": True,
                                                  "zmq_info": None},
                                   "backend": {"storage_backend": "SimpleStorage",
                                               "SimpleStorage": {"num_data_storage_units": 3,
                                                                 "total_storage_size": 200, "zmq_info": None},
                                               "MooncakeStore": {"auto_init": True}},
                                   "metrics": {"enabled": True, "port": 0}})
    assert store == {"num_units": 3, "total_storage_size": 200} and sampler == "GRPOGroupNSampler"
    assert s.polling_mode is True and s.metrics_enabled
    assert "backend.MooncakeStore" in s.ignored and "controller.zmq_info" in s.ignored
    assert "backend.MooncakeStore" in caplog.text
    assert "tqstore starts no metrics exporter" in caplog.text  # (a TransferQueue user would scrape its port)


def test_translate_rejects_backends_tqstore_does_not_provide_and_unknown_keys():
    with pytest.raises(ConfigError, match="MooncakeStore"):
        translate({"backend": {"storage_backend": "MooncakeStore"}})
    for odd in (["SimpleStorage"], {"SimpleStorage": {}}):  # (a list or dict raised a bare TypeError: unhashable)
        with pytest.raises(ConfigError, match="storage_backend"):
            translate({"backend": {"storage_backend": odd}})
    with pytest.raises(ConfigError, match="unknown config keys"):
        translate({"bogus": 1})
    with pytest.raises(ConfigError, match=r"'mooncake' is not available; use 'embedded' or 'ray'"):
        translate({"backend": "mooncake"})
    # backend "ray" and its section (tests/test_ray_api.py runs it)
    store, _, s = translate({"backend": "ray", "ray": {"name": "buf", "nodes": ["n1"]}, "num_units": 2})
    assert store == {"num_units": 2} and (s.backend, s.ray_name, s.ray_nodes) == ("ray", "buf", ["n1"])
    assert translate({"backend": "ray"})[2].ray_name == "default"
    with pytest.raises(ConfigError, match="applies to backend 'ray' only"):
        translate({"ray": {"name": "x"}})
    with pytest.raises(ConfigError, match=r"unknown keys in the 'ray' section: \['bogus'\]"):
        translate({"backend": "ray", "ray": {"bogus": 1}})
    for bad in ({"name": ""}, {"name": "n" * 201}, {"nodes": "n1"}, {"nodes": []}, {"nodes": [1]}):
        with pytest.raises(ConfigError, match="ray.name|ray.nodes"):
            translate({"backend": "ray", "ray": bad})


def test_init_accepts_an_omegaconf_dictconfig_with_a_sampler_instance():
    omegaconf = pytest.importorskip("omegaconf")
    sampler = tq.GRPOGroupNSampler(n_samples_per_prompt=2)
    cfg = omegaconf.OmegaConf.create({"controller": {"sampler": sampler, "polling_mode": True},
                                      "backend": {"SimpleStorage": {"num_data_storage_units": 2}}},
                                     flags={"allow_objects": True})
    store = tq.init(cfg)
    try:
        assert store.num_units == 2 and store.sampler is sampler
    finally:
        tq.close()


def test_init_takes_transfer_queues_conf_keyword_but_not_both_names():
    store = tq.init(conf={"num_units": 2})
    try:
        assert store.num_units == 2
    finally:
        tq.close()
    with pytest.raises(ConfigError, match="both config and conf"):
        tq.init({"num_units": 2}, conf={"num_units": 3})
    with pytest.raises(StoreClosedError):  # nothing was opened
        tq.current_store()


def test_polling_mode_false_waits_then_raises_timeout_like_transfer_queue():
    tq.init({"controller": {"polling_mode": False}, "get_meta_timeout_s": 0.05})
    try:
        for caught_as in (TimeoutError, RuntimeError, tq.TqstoreError):  # (TransferQueue's client: RuntimeError)
            with pytest.raises(caught_as, match="sufficient data"):
                tq.get_meta(["x"], 2, "p", task_name="t")
        assert tq.get_meta(["x"], 2, "p", task_name="t", timeout_s=0).size == 0  # explicit timeout: tqstore's rule
    finally:
        tq.close()


def test_metrics_count_puts_and_gets_and_render_as_prometheus_text():
    from tqstore import metrics
    metrics.REGISTRY.reset()
    tq.init()
    try:
        tq.kv_batch_put(["a", "b"], "p", fields={"x": torch.zeros(2, 3)})
        tq.kv_batch_get(["a", "b"], "p")
        with pytest.raises(tq.KeyNotFoundError):
            tq.kv_batch_get(["zz"], "p")
        snap = metrics.snapshot()
        assert snap["operations"]["kv_batch_put"]["calls"] == 1 and snap["operations"]["kv_batch_put"]["rows"] == 2
        assert snap["families"]["get"]["calls"] == 2 and snap["families"]["get"]["errors"] == 1
        pytest.importorskip("prometheus_client")
        text = tq.get_metrics_endpoint()
        assert 'tqstore_calls_total{family="put",op="kv_batch_put"} 1.0' in text
        assert "tqstore_latency_seconds_bucket" in text
    finally:
        tq.close()


@pytest.mark.parametrize("what", ["save", "dump"])
def test_metrics_record_a_background_writes_end_and_its_failure(tmp_path, what):
    """A ``blocking=False`` save or dump was timed as its cut alone, and its failure counted
    as a success (errors 0 while ``result()`` raised)."""
    from tqstore import metrics
    from tqstore._io import failpoints as fp

    metrics.REGISTRY.reset()
    tq.init()
    try:
        tq.kv_batch_put(["a", "b"], "p", fields={"x": torch.zeros(2, 3)})
        start = (lambda p: tq.save_checkpoint(p, blocking=False)) if what == "save" else \
            (lambda p: tq.dump_data_by_key(p, ["a", "b"], "p", blocking=False))
        op = "save_checkpoint_background" if what == "save" else "dump_data_by_key_background"
        start(tmp_path / "ok").result(timeout=60)
        fp.arm("fsync_dir", "eio", 1)
        try:
            h = start(tmp_path / "bad")
            with pytest.raises(tq.TqstoreError):
                h.result(timeout=60)
        finally:
            fp.disarm()
        st = metrics.snapshot()["operations"][op]
        assert st["calls"] == 2 and st["errors"] == 1 and st["seconds_total"] > 0
        assert metrics.snapshot()["operations"]["save_checkpoint" if what == "save" else "dump_data_by_key"][
            "errors"] == 0  # (the calls themselves returned: their cuts)
    finally:
        tq.close()


def test_metrics_count_the_rows_of_saves_loads_and_dumps(tmp_path):
    """``tqstore_rows_total`` ("rows moved by API calls") stayed 0 for them."""
    from tqstore import metrics

    metrics.REGISTRY.reset()
    tq.init()
    try:
        tq.kv_batch_put(["a", "b", "c"], "p", fields={"x": torch.zeros(3, 2)})
        tq.save_checkpoint(tmp_path / "ck")
        tq.load_checkpoint(tmp_path / "ck")
        tq.dump_data_by_key(tmp_path / "d", ["a", "b"], "p")
        tq.load_data_by_key(tmp_path / "d")
        tq.get_client().save_storage_checkpoint(str(tmp_path / "ck2"))
        ops = metrics.snapshot()["operations"]
        assert ops["save_checkpoint"]["rows"] == 6 and ops["load_checkpoint"]["rows"] == 3
        assert ops["dump_data_by_key"]["rows"] == 2 and ops["load_data_by_key"]["rows"] == 2
    finally:
        tq.close()


def test_metrics_count_a_checkpoint_managers_saves_and_restores(tmp_path):
    """``tq.CheckpointManager`` (the README's checkpoint path) was never counted: dashboards of
    checkpoint durations stayed empty."""
    from tqstore import metrics

    metrics.REGISTRY.reset()
    tq.init()
    try:
        tq.kv_batch_put(["a", "b"], "p", fields={"x": torch.zeros(2, 2)})
        m = tq.CheckpointManager(tmp_path / "gens", keep_last=2)
        m.save(1)
        m.save(2, blocking=False).result(timeout=60)
        assert m.restore() == 2
        ops = metrics.snapshot()["operations"]
        assert ops["save_checkpoint"]["calls"] == 2 and ops["save_checkpoint"]["rows"] == 2
        assert ops["save_checkpoint_background"]["calls"] == 1 and ops["load_checkpoint"]["calls"] == 1
        assert isinstance(m, tq.checkpoint.CheckpointManager)
    finally:
        tq.close()


def test_client_retrieve_meta_keys_custom_meta_and_close():
    tq.init()
    try:
        c = tq.get_client()
        meta = c.kv_retrieve_meta(["a", "b"], "p", create=True)
        assert meta.size == 2 and meta.keys == ["a", "b"]
        assert c.kv_retrieve_keys(meta.global_indexes, "p") == ["a", "b"]
        assert c.kv_retrieve_keys([meta.global_indexes[1], 999], "p") == ["b", None]  # as TransferQueue
        with pytest.raises(RuntimeError, match="no corresponding keys"):
            c.kv_retrieve_keys([0], "no-such-partition")
        assert c.kv_retrieve_meta(["a", "nope"], "p").keys == ["a"]
        assert c.kv_retrieve_meta("a", "no-such-partition").size == 0
        meta.update_custom_meta([{"score": 1}, {"score": 2}])
        c.set_custom_meta(meta)
        assert tq.kv_list("p")["p"] == {"a": {"score": 1}, "b": {"score": 2}}
        c.close()
        c.close()
        with pytest.raises(tq.StoreClosedError):
            c.kv_list()
    finally:
        tq.close()


def test_client_checkpoint_halves(tmp_path):
    tq.init()
    try:
        c = tq.get_client()
        tq.kv_put("a", "p", fields={"x": torch.ones(2)}, tag={"v": 1})
        c.save_storage_checkpoint(str(tmp_path / "full"))
        c.save_controller_checkpoint(str(tmp_path / "ctl"))
        tq.kv_clear("a", "p")
        c.load_storage_checkpoint(str(tmp_path / "full"))
        assert torch.equal(tq.kv_batch_get("a", "p")["x"], torch.ones(1, 2))
        c.load_controller_checkpoint(str(tmp_path / "ctl"))
        assert tq.kv_list("p")["p"] == {"a": {"v": 1}}
    finally:
        tq.close()


def test_seqlen_balanced_partitions_and_sampler_through_get_meta():
    parts = tq.get_seqlen_balanced_partitions([100, 100, 10, 10], 2, equal_size=True)
    assert sorted(sum(parts, [])) == [0, 1, 2, 3] and [sum([100, 100, 10, 10][i] for i in p) for p in parts] == [110, 110]
    tq.init({"controller": {"sampler": tq.SeqlenBalancedSampler(n_samples_per_prompt=1, dp_size=2),
                            "polling_mode": True}})
    try:
        tq.kv_batch_put([f"k{i}" for i in range(4)], "p", fields={"x": torch.zeros(4, 1)},
                        tags=[{"total_lengths": n} for n in (100, 100, 10, 10)])
        m0 = tq.get_meta(["x"], 2, "p", task_name="t", sampling_config={"dp_rank": 0, "batch_index": 0})
        m1 = tq.get_meta(["x"], 2, "p", task_name="t", sampling_config={"dp_rank": 1, "batch_index": 0})
        assert sorted(m0.global_indexes + m1.global_indexes) == [0, 1, 2, 3]
        lens = {0: 100, 1: 100, 2: 10, 3: 10}
        assert sum(lens[g] for g in m0.global_indexes) == sum(lens[g] for g in m1.global_indexes) == 110
    finally:
        tq.close()


def test_streaming_dataset_yields_micro_batches_until_consumed():
    tq.init({"sampler": "rank_aware"})
    try:
        tq.put({"x": torch.arange(12).view(6, 2), "text": [f"t{i}" for i in range(6)]}, partition_id="train")
        ds = tq.StreamingDataset(None, batch_size=3, micro_batch_size=2, data_fields=["x", "text"],
                                 partition_id="train", task_name="actor", dp_rank=0,
                                 should_check_consumption_status=True)
        out = list(tq.StreamingDataLoader(ds))
        assert [int(td.batch_size[0]) for td, _ in out] == [2, 1, 2, 1]
        assert torch.equal(torch.cat([td["x"] for td, _ in out]), torch.arange(12).view(6, 2))
        assert sum((m.global_indexes for _, m in out), []) == list(range(6))
        assert out[0][0]["text"] == ["t0", "t1"]
        with pytest.raises(ValueError, match="num_workers"):
            tq.StreamingDataLoader(ds, num_workers=2)
    finally:
        tq.close()


def test_set_custom_meta_on_rows_made_by_put_and_refuses_a_stale_meta():
    tq.init()
    try:
        c = tq.get_client()
        meta = c.put({"x": torch.zeros(3, 1)}, partition_id="p")
        meta.update_custom_meta([{"s": i} for i in range(3)])
        c.set_custom_meta(meta)
        assert c.get_meta(["x"], None, "p", mode="force_fetch").custom_meta == [{"s": 0}, {"s": 1}, {"s": 2}]
        tq.clear_samples(meta)
        c.put({"x": torch.zeros(3, 1)}, partition_id="p")  # global indexes reused by new rows
        with pytest.raises(tq.StorageKeyNotFoundError, match="stale"):
            c.set_custom_meta(meta)
        tq.clear_partition("p")
        with pytest.raises(tq.StorageKeyNotFoundError, match="stale") as e:  # (its whole partition)
            c.set_custom_meta(meta)
        assert isinstance(e.value, tq.PartitionNotFoundError)
    finally:
        tq.close()


def test_set_custom_meta_holds_clears_off_between_its_check_and_its_write(monkeypatch):
    """A clear (and a put reusing the cleared indexes) racing set_custom_meta waits for it:
    the stale meta's tags never land on the new rows."""
    import threading

    store = tq.init()
    try:
        c = tq.get_client()
        meta = c.put({"x": torch.zeros(2, 1)}, partition_id="p")
        meta.update_custom_meta([{"s": 0}, {"s": 1}])
        racers = []

        def clear_and_reuse():
            tq.clear_samples(meta)
            c.put({"x": torch.zeros(2, 1)}, partition_id="p")  # the freed global indexes again

        checked = store.controller.row_batch

        def row_batch(*args, **kwargs):  # set_custom_meta's check of the rows: the race runs right after it
            out = checked(*args, **kwargs)
            if not racers:
                t = threading.Thread(target=clear_and_reuse)
                racers.append(t)
                t.start()
                t.join(0.5)
            return out

        monkeypatch.setattr(store.controller, "row_batch", row_batch)
        c.set_custom_meta(meta)
        assert racers
        monkeypatch.undo()
        for t in racers:
            t.join(30)
        fresh = c.get_meta(["x"], None, "p", mode="force_fetch")
        assert sorted(fresh.global_indexes) == sorted(meta.global_indexes)  # reused
        assert not any(fresh.custom_meta), fresh.custom_meta
    finally:
        tq.close()


def test_seqlen_balanced_sampler_never_hands_a_row_twice_when_a_rank_runs_ahead(tmp_path):
    """Rank 0 fetches batches 0 and 1 before rank 1 fetches batch 0: the first call splits the
    global batch for both ranks, so rank 0's batch 1 must not take rank 1's share of batch 0.
    Every row is served once; rank 1 gets its share of batch 0, kept across a reopen."""
    with tq.open(tmp_path / "s", num_units=2) as s:
        s.set_sampler(tq.SeqlenBalancedSampler(n_samples_per_prompt=1, dp_size=2))
        s.kv_batch_put([f"k{i}" for i in range(8)], "train", {"x": torch.arange(8).view(8, 1)},
                       tags=[{"total_lengths": 10 + i} for i in range(8)])

        def fetch(st, rank, bi):
            return st.get_meta(["x"], 2, "train", task_name="actor",
                               sampling_config={"dp_rank": rank, "batch_index": bi}).global_indexes

        served = {(0, 0): fetch(s, 0, 0), (0, 1): fetch(s, 0, 1)}
    with tq.open(tmp_path / "s") as s:
        s.set_sampler(tq.SeqlenBalancedSampler(n_samples_per_prompt=1, dp_size=2))
        served[(1, 0)] = fetch(s, 1, 0)
        served[(1, 1)] = fetch(s, 1, 1)
    rows = sum(served.values(), [])
    assert sorted(rows) == list(range(8)), served
    assert all(len(v) == 2 for v in served.values())


def test_each_micro_batch_comes_with_the_meta_of_its_own_rows():
    """A batch of 10 rows cut into micro-batches of 4: the data is cut 4, 4, 2, and each part's
    BatchMeta names exactly the rows of its data (a trainer acknowledges or tags rows through it)."""
    from tensordict import TensorDict

    from tqstore import BatchMeta
    from tqstore.dataloader import chunk_batch_fn

    td = TensorDict({"g": torch.arange(10)}, batch_size=[10])
    meta = BatchMeta(list(range(100, 110)), ["p"] * 10, custom_meta=[{"i": i} for i in range(10)])
    parts = chunk_batch_fn(td, meta, micro_batch_size=4)
    assert [int(d.batch_size[0]) for d, _ in parts] == [4, 4, 2]
    for d, m in parts:
        assert m.global_indexes == [100 + int(i) for i in d["g"]]
        assert [c["i"] for c in m.custom_meta] == d["g"].tolist()


@pytest.mark.parametrize("config,key", [
    ({"get_meta_timeout_s": "1s"}, "get_meta_timeout_s"),
    ({"metrics": {"port": "http"}}, "metrics.port"),
    ({"controller": {"polling_mode": "maybe"}}, "controller.polling_mode"),
    ({"polling_mode": None}, "polling_mode"),
])
def test_a_bad_config_value_is_a_config_error_naming_its_key(config, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        tq.init(config)
    with pytest.raises(tq.StoreClosedError):
        tq.current_store()


def test_polling_mode_given_as_text_is_read_as_such(monkeypatch):
    monkeypatch.setenv("TQ_CONTROLLER_GET_METADATA_TIMEOUT", "nope")
    with pytest.raises(ConfigError, match="TQ_CONTROLLER_GET_METADATA_TIMEOUT"):
        tq.init({})
    monkeypatch.delenv("TQ_CONTROLLER_GET_METADATA_TIMEOUT")
    tq.init({"controller": {"polling_mode": "false"}, "get_meta_timeout_s": 0.05})
    try:
        with pytest.raises(TimeoutError):  # "false" is False: TransferQueue's waiting mode
            tq.get_meta(["x"], 2, "p", task_name="t")
        assert tq.get_meta(["x"], 2, "p", task_name="t", timeout_s=None).size == 0  # (None: no wait)
        with pytest.raises(tq.InvalidInputError):
            tq.get_meta(["x"], 2, "p", task_name="t", timeout_s="soon")
    finally:
        tq.close()


def _finite_dataset(**kw):
    args = dict(batch_size=3, micro_batch_size=3, data_fields=["x"], partition_id="train", task_name="actor",
                dp_rank=0, should_check_consumption_status=True)
    args.update(kw)
    return tq.StreamingDataset(None, **args)


def test_a_replica_of_a_dp_group_gets_its_share_after_the_first_replica_consumed_everything():
    """Two replicas (tensor-parallel peers) of dp_rank 0: the first consumes every row; the second
    must still get the same batches (cached for it), not stop at once because all rows are consumed."""
    tq.init({"sampler": "rank_aware"})
    try:
        tq.put({"x": torch.arange(12).view(6, 2)}, partition_id="train")
        first = [m.global_indexes for _, m in tq.StreamingDataLoader(_finite_dataset())]
        second = [m.global_indexes for _, m in tq.StreamingDataLoader(_finite_dataset())]
        assert first == second == [[0, 1, 2], [3, 4, 5]]
    finally:
        tq.close()


def test_a_finite_dataset_ends_under_polling_mode_false_and_raises_only_while_rows_are_missing():
    """A TransferQueue config (a ``controller`` section: polling_mode False, so an empty fetch
    raises after ``get_meta_timeout_s``): a finite dataset over a full partition ends cleanly
    after its last batch (it raised WaitTimeoutError out of the loop); while rows are still
    missing the timeout is raised, as TransferQueue's loop raises it."""
    tq.init({"controller": {"polling_mode": False}, "get_meta_timeout_s": 0.2})
    try:
        tq.put({"x": torch.arange(12).view(6, 2)}, partition_id="train")
        got = [m.global_indexes for _, m in tq.StreamingDataLoader(_finite_dataset())]
        assert got == [[0, 1, 2], [3, 4, 5]]
        tq.put({"x": torch.arange(4).view(2, 2)}, partition_id="train")  # 2 rows: fewer than a batch
        with pytest.raises(tq.WaitTimeoutError, match="sufficient data"):
            list(tq.StreamingDataLoader(_finite_dataset()))
    finally:
        tq.close()


def test_a_finite_dataset_warns_that_tq_pre_alloc_sample_num_reserves_nothing(monkeypatch, caplog):
    """TransferQueue's advice for streamed production (TQ_PRE_ALLOC_SAMPLE_NUM) does nothing
    here: a finite dataset says so (else it ends early, silently, when the consumer catches up)."""
    monkeypatch.setenv("TQ_PRE_ALLOC_SAMPLE_NUM", "32")
    with caplog.at_level("WARNING", logger="tqstore"):
        _finite_dataset()
        assert "TQ_PRE_ALLOC_SAMPLE_NUM" in caplog.text
        caplog.clear()
        _finite_dataset(should_check_consumption_status=False)  # (it never ends on its own: no matter)
        assert "TQ_PRE_ALLOC_SAMPLE_NUM" not in caplog.text


def test_streaming_dataset_refuses_a_micro_batch_larger_than_its_batch_before_consuming_rows():
    tq.init()
    try:
        tq.put({"x": torch.arange(12).view(6, 2)}, partition_id="train")
        with pytest.raises(tq.InvalidInputError, match="exceeds batch_size"):
            _finite_dataset(micro_batch_size=4)
        with pytest.raises(tq.InvalidInputError, match="batch_size must be a positive int"):
            _finite_dataset(batch_size=0)
        assert tq.get_consumption_status("actor", "train")[1].tolist() == [0] * 6
        whole = _finite_dataset(micro_batch_size=4, process_batch_fn=lambda td, m, micro_batch_size: [(td, m)])
        assert [m.size for _, m in tq.StreamingDataLoader(whole)] == [3, 3], "a custom process_batch_fn decides"
    finally:
        tq.close()


def test_streaming_dataset_says_why_it_waits_when_the_seqlen_sampler_lacks_a_global_batch(caplog, monkeypatch):
    # the seqlen-balanced sampler forms every rank's batch at once: batch_size * dp_size rows
    from tqstore import dataloader
    monkeypatch.setattr(dataloader, "EMPTY_BATCH_SLEEP_S", 0.01)
    tq.init({"sampler": {"name": "seqlen_balanced", "dp_size": 2, "n_samples_per_prompt": 2}})
    try:
        tq.put({"x": torch.arange(12).view(6, 2)}, partition_id="train")  # 6 rows: more than 4, fewer than 8
        it = iter(tq.StreamingDataLoader(_finite_dataset(batch_size=4, micro_batch_size=4)))
        import threading
        with caplog.at_level("WARNING", logger="tqstore"):
            threading.Timer(0.3, lambda: tq.put({"x": torch.arange(4).view(2, 2)}, partition_id="train")).start()
            assert len(next(it)[1].global_indexes) == 4
        said = [r.getMessage() for r in caplog.records if "fewer than a fetch of batch_size" in r.getMessage()]
        assert len(said) == 1 and "6 rows of partition 'train'" in said[0]
    finally:
        tq.close()


def test_streaming_dataset_says_why_it_waits_when_fewer_rows_than_a_batch_are_left(caplog, monkeypatch):
    from tqstore import dataloader
    monkeypatch.setattr(dataloader, "EMPTY_BATCH_SLEEP_S", 0.01)
    tq.init()
    try:
        tq.put({"x": torch.arange(10).view(5, 2)}, partition_id="train")
        it = iter(tq.StreamingDataLoader(_finite_dataset()))
        assert next(it)[1].global_indexes == [0, 1, 2]
        with caplog.at_level("WARNING", logger="tqstore"):
            tq.put({"x": torch.arange(2).view(1, 2)}, partition_id="train")  # 3 rows left: a whole batch
            assert next(it)[1].global_indexes == [3, 4, 5]
            assert not [r for r in caplog.records if "fewer than a fetch of batch_size" in r.getMessage()]
            tq.put({"x": torch.arange(2).view(1, 2)}, partition_id="train")  # 1 row left: it waits

            import threading
            threading.Timer(0.3, lambda: tq.put({"x": torch.arange(4).view(2, 2)}, partition_id="train")).start()
            assert next(it)[1].global_indexes == [6, 7, 8]
        said = [r.getMessage() for r in caplog.records if "fewer than a fetch of batch_size" in r.getMessage()]
        assert len(said) == 1 and "1 rows of partition 'train'" in said[0]
        assert list(it) == [], "every row consumed: the iteration ends"
    finally:
        tq.close()


def test_kv_retrieve_meta_and_keys_look_up_only_the_rows_asked_for(monkeypatch):
    """TransferQueue's key <-> row lookups answer in key order (missing keys left out, a
    repeated key repeated) from the rows asked for: they never list the whole partition (a
    million-row partition made each call cost a second).  ``create`` with a missing key given
    twice creates it once; an index no row can have is None, not an OverflowError."""
    store = tq.init()
    try:
        c = tq.get_client()
        tq.kv_batch_put(["a", "b", "c"], "p", {"x": torch.arange(3)[:, None]}, tags=[{"t": 1}, None, {"t": 3}])

        def whole_partition(*args, **kwargs):
            raise AssertionError("the whole partition was listed")

        monkeypatch.setattr(store.controller, "first_rows", whole_partition)
        monkeypatch.setattr(store.controller, "key_list", whole_partition)
        m = c.kv_retrieve_meta(["c", "zz", "a", "c"], "p")
        assert (m.keys, m.global_indexes, m.custom_meta) == (["c", "a", "c"], [2, 0, 2], [{"t": 3}, {"t": 1}, {"t": 3}])
        assert m.field_names == ["x"] and m.production_status.tolist() == [1, 1, 1]
        m = store.kv_retrieve_meta(["n1", "a", "n1"], "p", create=True)  # (a store method too)
        assert m.keys == ["n1", "a", "n1"] and m.field_names == []  # (fields every row has: TransferQueue's)
        assert m.global_indexes[0] == m.global_indexes[2] == 3
        assert c.kv_retrieve_keys([0, 2, -1, 2 ** 70, 3, 99], "p") == ["a", "c", None, None, "n1", None]
        assert c.kv_retrieve_meta("a", "nope").size == 0
        with pytest.raises(RuntimeError, match="no corresponding keys"):
            c.kv_retrieve_keys(0, "nope")
        with pytest.raises(TypeError):
            c.kv_retrieve_meta([1], "p")
    finally:
        tq.close()


def test_streaming_dataset_left_early_resumes_with_the_rest_of_its_batch_and_takes_one_field_as_a_str():
    """A ``break`` after the first micro-batch of a batch: the next iteration yields the
    batch's other micro-batches, then the next batches (each row once; they were lost).  A
    str ``data_fields`` is that one field (it became its characters and waited forever)."""
    tq.init()
    try:
        tq.put({"score": torch.arange(12).view(12, 1)}, partition_id="train")
        ds = tq.StreamingDataset(None, batch_size=4, micro_batch_size=2, data_fields="score",
                                 partition_id="train", task_name="actor", dp_rank=0,
                                 should_check_consumption_status=True)
        assert ds.data_fields == ["score"]
        seen = []
        for td, meta in ds:
            seen += meta.global_indexes
            break
        for td, meta in ds:
            seen += meta.global_indexes
            assert td["score"][:, 0].tolist() == meta.global_indexes
        assert seen == list(range(12))
        ds.reset()
        assert sum((m.global_indexes for _, m in ds), []) == list(range(12))  # reset replays the buffer
        assert tq.StreamingDataset(None, batch_size=4, micro_batch_size=2, data_fields=["score"], partition_id="train",
                                   task_name="actor", dp_rank=torch.tensor(1).numpy()[()]).dp_rank == 1  # (numpy int)
        gen = tq.StreamingDataset(None, batch_size=4, micro_batch_size=2, data_fields=(f for f in ["score", "x"]),
                                  partition_id="train", task_name="actor", dp_rank=0)
        assert gen.data_fields == ["score", "x"]  # (a generator raised a bare TypeError from len())
        for bad in ([], [1], iter([3])):
            with pytest.raises(tq.InvalidInputError, match="data_fields must be a list"):
                tq.StreamingDataset(None, batch_size=4, micro_batch_size=2, data_fields=bad, partition_id="train",
                                    task_name="actor", dp_rank=0)
        for bad in ({"dp_rank": None}, {"dp_rank": True}, {"dp_rank": 1.0}, {"partition_id": 5}, {"task_name": None},
                    {"data_fields": [1]}):
            kw = dict(batch_size=4, micro_batch_size=2, data_fields=["score"], partition_id="train",
                      task_name="actor", dp_rank=0)
            kw.update(bad)
            with pytest.raises(tq.InvalidInputError):
                tq.StreamingDataset(None, **kw)
    finally:
        tq.close()


def _two_partition_meta(s):
    s.put({"x": torch.tensor([1, 2])}, partition_id="a")
    s.put({"x": torch.tensor([3, 4])}, partition_id="b")
    return tq.BatchMeta.concat([s.get_meta(["x"], 1, "a", mode="force_fetch"),
                                s.get_meta(["x"], 1, "b", mode="force_fetch")], validate=False)


def _picture(s):
    return {p: (s.get_meta(None, None, p, mode="force_fetch").field_names,
                s.get_meta(None, None, p, mode="force_fetch").custom_meta) for p in ("a", "b")}


@pytest.mark.parametrize("data", [{"y": torch.tensor([10, 20, 30])}, {"z": ["u", "v", "w", "x"]},
                                  {"w": torch.tensor([5])}])
def test_a_put_through_a_meta_of_two_partitions_refuses_a_batch_of_another_length(tmp_path, data):
    with tq.open(tmp_path / "s", num_units=2) as s:
        m = _two_partition_meta(s)
        before = _picture(s)
        with pytest.raises(tq.InvalidInputError, match="rows, the BatchMeta 2"):
            s.put(data, metadata=m)  # (it wrote the first rows and dropped the rest)
        assert _picture(s) == before
        s.put({"v": torch.tensor([7, 8])}, metadata=m)
        assert s.get_data(m)["v"].tolist() == [7, 8]


@pytest.mark.parametrize("bad", ["xy", {"a": 1}, [{}]])
def test_a_custom_meta_that_is_not_one_entry_per_row_is_refused_before_anything_is_written(tmp_path, bad):
    with tq.open(tmp_path / "s", num_units=2) as s:
        s.put({"x": torch.tensor([1, 2])}, partition_id="a")
        s.put({"x": torch.tensor([3, 4])}, partition_id="b")
        before = _picture(s)
        m = s.get_meta(["x"], 2, "a", mode="force_fetch")
        m.custom_meta = bad
        with pytest.raises(tq.InvalidInputError, match="custom_meta must be a list of 2"):
            s.put({"y": torch.tensor([7, 8])}, metadata=m)
        with pytest.raises(tq.InvalidInputError, match="custom_meta must be a list of 2"):
            s.set_custom_meta(m)
        assert _picture(s) == before


def test_a_tuple_or_none_custom_meta_is_taken_and_the_put_completes(tmp_path):
    with tq.open(tmp_path / "s", num_units=2) as s:
        s.put({"x": torch.tensor([1, 2])}, partition_id="a")
        m = s.get_meta(["x"], 2, "a", mode="force_fetch")
        m.custom_meta = ({"r": 1}, {"r": 2})  # (the put wrote, then failed to fill the tuple in)
        s.put({"y": torch.tensor([7, 8])}, metadata=m)
        assert m.custom_meta == [{"r": 1}, {"r": 2}] and m.is_ready
        assert s.get_meta(["y"], 2, "a", mode="force_fetch").custom_meta == [{"r": 1}, {"r": 2}]
        m.custom_meta = None  # no metadata for any row
        s.set_custom_meta(m)
        assert s.get_meta(["y"], 2, "a", mode="force_fetch").custom_meta == [{}, {}]


@pytest.mark.parametrize("bad", [np.array([0.1, 0.2]), torch.tensor([0.1, 0.2])])
def test_a_put_through_a_meta_checks_its_tags_before_comparing_them(tmp_path, bad):
    """An array in custom_meta over a stored tag of the same key raised a bare ValueError /
    RuntimeError (the put compared the tags with != first); UnsupportedTypeError now, as
    set_custom_meta, nothing written."""
    with tq.open(tmp_path / "s", num_units=1) as s:
        s.kv_batch_put(["a", "b"], "P", fields={"x": torch.arange(2)}, tags=[{"r": 5}, {"r": 6}])
        m = s.kv_retrieve_meta(["a", "b"], "P")
        m.custom_meta[0]["r"] = bad
        with pytest.raises(tq.UnsupportedTypeError):
            s.put({"y": torch.arange(2)}, metadata=m)
        assert s.get_production_status(["y"], "P")[1].view(-1).tolist() == [0, 0]
        assert s.kv_list()["P"] == {"a": {"r": 5}, "b": {"r": 6}}


def test_a_put_through_a_meta_stores_a_tag_value_equal_to_the_stored_one_but_of_another_type(tmp_path):
    """done=True over a stored done=1, or 6.0 over 6, compared equal and was not written
    (kept after reopen)."""
    with tq.open(tmp_path / "s", num_units=1) as s:
        s.kv_batch_put(["a", "b"], "P", fields={"x": torch.arange(2)}, tags=[{"done": 1}, {"r": 6}])
        m = s.kv_retrieve_meta(["a", "b"], "P")
        m.custom_meta[0]["done"] = True
        m.custom_meta[1]["r"] = 6.0
        s.put({"y": torch.arange(2)}, metadata=m)
        assert m.custom_meta == [{"done": True}, {"r": 6.0}]
    with tq.open(tmp_path / "s") as s:
        tags = s.kv_list()["P"]
        assert tags["a"]["done"] is True and type(tags["b"]["r"]) is float


def test_an_empty_batch_put_writes_nothing_and_fixes_no_schema(tmp_path):
    with tq.open(tmp_path / "s", num_units=2) as s:
        for empty in ({"reward": []}, {"reward": torch.zeros(0)}, {"a": [], "b": torch.zeros(0, 3)}):
            assert s.put(empty, partition_id="new").size == 0
        assert s.kv_list() == {}  # no partition was made
        s.put({"reward": torch.tensor([0.5, 1.0])}, partition_id="new")  # (it raised SchemaError: "value none")
        assert s.get_data(s.get_meta(["reward"], 2, "new", mode="force_fetch"))["reward"].tolist() == [0.5, 1.0]
        with pytest.raises(tq.InvalidInputError, match="2 values given, expected 0"):
            s.put({"a": [], "b": [1, 2]}, partition_id="new")


@pytest.mark.parametrize("bad", ["resp\x00", "", "f" * 300])
def test_an_insert_for_a_field_no_put_can_write_reserves_nothing(tmp_path, bad):
    with tq.open(tmp_path / "s", num_units=2) as s:
        with pytest.raises(tq.InvalidInputError):
            s.get_meta([bad], 2, "p", mode="insert")
        assert s.kv_list() == {}


def test_a_batch_size_past_two_to_the_forty_is_an_invalid_input(tmp_path):
    with tq.open(tmp_path / "s", num_units=2) as s:
        s.put({"x": torch.tensor([1, 2])}, partition_id="a")
        for mode in ("fetch", "force_fetch", "insert"):
            with pytest.raises(tq.InvalidInputError, match="batch_size"):
                s.get_meta(["x"], 2 ** 63, "a", mode=mode, task_name="t")


@pytest.mark.parametrize("bad", [["a"], None, 5, ""])
def test_a_partition_id_that_is_not_a_str_is_refused_by_every_call_that_takes_one(tmp_path, bad):
    """A list raised a bare TypeError (unhashable); None, an int or '' were taken silently:
    clear_partition(None) did nothing, get_consumption_status(None, ...) answered zeros."""
    with tq.open(tmp_path / "s", num_units=2) as s:
        s.kv_batch_put(["k"], "a", {"x": torch.ones(1, 1)})
        calls = [lambda p: s.kv_batch_get("k", p), lambda p: s.kv_clear("k", p), lambda p: s.clear_partition(p),
                 lambda p: s.get_consumption_status("t", p), lambda p: s.check_consumption_status("t", p),
                 lambda p: s.get_production_status(["x"], p), lambda p: s.check_production_status(["x"], p),
                 lambda p: s.reset_consumption(p)] + ([] if bad is None else [lambda p: s.kv_list(p)])
        for call in calls:
            with pytest.raises(tq.InvalidInputError, match="partition_id"):
                call(bad)
        for call in (lambda: s.get_consumption_status(bad, "a"), lambda: s.reset_consumption("a", bad or 5)):
            with pytest.raises(tq.InvalidInputError, match="task_name"):
                call()
        assert s.kv_list() == {"a": {"k": {}}}


def test_a_meta_made_by_hand_for_rows_that_do_not_exist_is_refused_by_name(tmp_path):
    """Such a meta has no sequence numbers: it took the one-partition fast path ([None] ==
    [None]) and failed deep inside (TypeError), or overflowed (2**64)."""
    with tq.open(tmp_path / "s", num_units=2) as s:
        s.put({"x": torch.tensor([1, 2])}, partition_id="a")
        for g in (999, -1, 2 ** 64):
            m = tq.BatchMeta([g], ["a"], field_schema={"x": {}})
            with pytest.raises(tq.KeyNotFoundError, match=f"row {g} "):
                s.get_data(m)
            with pytest.raises(tq.KeyNotFoundError):
                s.put({"x": torch.tensor([5])}, metadata=m)
            with pytest.raises(tq.KeyNotFoundError):
                s.set_custom_meta(m)
            s.clear_samples(m)  # (idempotent: nothing to clear)
        ok = tq.BatchMeta([0, 1], ["a", "a"], field_schema={"x": {}})  # by hand, rows that exist: read
        assert s.get_data(ok)["x"].tolist() == [1, 2]
        for bad in (["x"], [3.7]):
            with pytest.raises(tq.InvalidInputError, match="global indexes must be ints"):
                tq.BatchMeta(bad, ["a"])
        assert tq.BatchMeta([np.int64(1), torch.tensor(0)], ["a", "a"]).global_indexes == [1, 0]
        # partition ids: a str was split into characters ("pp": partitions p and p), a list id
        # failed deep inside (TypeError: unhashable)
        with pytest.raises(tq.InvalidInputError, match="partition_ids must be a list of str"):
            tq.BatchMeta([0, 1], "aa")
        with pytest.raises(tq.InvalidInputError, match="partition ids must be str"):
            tq.BatchMeta([0], [["a"]])
        with pytest.raises(tq.InvalidInputError, match="keys must be a list of str"):
            tq.KVBatchMeta(keys=None, partition_id="a")
        with pytest.raises(tq.InvalidInputError, match="create must be True or False"):
            s.kv_retrieve_meta(["new"], "a", create="no")  # (created the row)
        assert s.kv_retrieve_meta(["new"], "a").size == 0 and s.get_data(ok)["x"].tolist() == [1, 2]


def test_paths_and_switches_that_are_not_usable_are_refused_before_anything_is_written(tmp_path):
    with pytest.raises(tq.ConfigError, match="path must be a str"):
        tq.open(5)
    with tq.open(tmp_path / "s", num_units=2) as s:
        s.put({"x": torch.tensor([1, 2])}, partition_id="a")
        for bad in ("/", str(tmp_path / ("n" * 300)), str(tmp_path / "ck\udcff")):
            with pytest.raises(tq.InvalidInputError):
                s.save_checkpoint(bad)
            with pytest.raises(tq.InvalidInputError):
                s.load_checkpoint(bad)
        with pytest.raises(tq.InvalidInputError, match="include_storage"):
            s.save_checkpoint(tmp_path / "ck", include_storage="no")  # (it saved, reporting include_storage='no')
        assert sorted(p.name for p in tmp_path.iterdir()) == ["s"]


def test_kv_retrieve_errors_are_transfer_queues_and_tqstores_at_once(tmp_path):
    with tq.open(tmp_path / "s") as s:
        s.kv_batch_put(["a", "b"], "p", {"x": torch.ones(2, 1)})
        assert s.kv_retrieve_keys(np.int64(0), "p") == ["a"] and s.kv_retrieve_keys([np.int64(1), 0], "p") == ["b", "a"]
        for call in (lambda: s.kv_retrieve_keys(True, "p"), lambda: s.kv_retrieve_keys([0, "1"], "p"),
                     lambda: s.kv_retrieve_meta(None, "p"), lambda: s.kv_retrieve_meta(("a",), "p")):
            with pytest.raises(tq.UnsupportedTypeError) as e:  # (a TypeError, as TransferQueue raises)
                call()
            assert isinstance(e.value, TypeError)
        with pytest.raises(tq.PartitionNotFoundError) as e:
            s.kv_retrieve_keys([0], "nope")
        assert isinstance(e.value, RuntimeError) and "no corresponding keys" in str(e.value)


def test_kv_retrieve_meta_lists_the_fields_every_row_has_so_get_data_reads_it():
    """TransferQueue's kv_retrieve_meta gives the fields all the keys' rows produced; listing
    the partition's every field made ``get_data`` of the meta raise FieldNotFoundError."""
    tq.init()
    try:
        tq.kv_put("a", "p", fields={"x": torch.tensor([1])})
        tq.kv_put("b", "p", fields={"x": torch.tensor([2]), "y": torch.tensor([3])})
        c = tq.get_client()
        m = c.kv_retrieve_meta(["a", "b"], "p")
        assert m.field_names == ["x"]
        assert c.get_data(m)["x"].reshape(-1).tolist() == [1, 2]
        assert c.kv_retrieve_meta(["b"], "p").field_names == ["x", "y"]
    finally:
        tq.close()


def test_get_production_status_of_no_field_or_repeated_fields_is_transferqueues():
    tq.init()
    try:
        tq.put({"x": torch.ones(2, 1), "y": torch.ones(2, 1)}, partition_id="p")
        c = tq.get_client()
        assert c.get_production_status(["x", "nope"], "p")[1].tolist() == [[1, 0], [1, 0]]
        assert c.get_production_status([], "p") == (None, None)
        g, st = c.get_production_status(["y", "x", "y"], "p")
        assert g.tolist() == [0, 1] and st.tolist() == [[1, 1], [1, 1]]
        assert c.check_production_status(["x", "nope"], "p") is False
    finally:
        tq.close()


def test_an_object_array_or_non_tensor_stack_of_per_row_arrays_is_stored_as_those_arrays():
    """TransferQueue stores per-row numpy arrays given as an object array or a NonTensorStack;
    tqstore refused them (UnsupportedTypeError): they are a numpy field of jagged rows."""
    from tensordict import NonTensorStack

    tq.init()
    try:
        o = np.empty(2, dtype=object)
        o[0], o[1] = np.array([1, 2], np.int32), np.array([3, 4, 5], np.int32)
        tq.kv_batch_put(["a", "b"], "p", fields={"o": o})
        tq.kv_batch_put(["c", "d"], "p", fields={"o": NonTensorStack(np.array([6], np.int32),
                                                                       np.array([7, 8], np.int32))})
        got = tq.kv_batch_get(["a", "b", "c", "d"], "p")["o"]
        assert [np.asarray(r).tolist() for r in got] == [[1, 2], [3, 4, 5], [6], [7, 8]]
        mixed = np.empty(2, dtype=object)
        mixed[0], mixed[1] = np.array([1]), None
        with pytest.raises(tq.UnsupportedTypeError):  # an array beside a row that is none: refused, nothing written
            tq.kv_batch_put(["e", "f"], "q", fields={"o": mixed})
        assert "q" not in tq.kv_list()
    finally:
        tq.close()
