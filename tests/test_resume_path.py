"""The resume path of partial rollout: a dump of unfinished samples loaded into a store that
runs (producers keep putting, a consumer keeps fetching batches), and restored samples
finished by the resumed rollout.

What a trainer relies on: every dumped key comes back bit for bit, every produced sample is
kept, a restored row becomes fetchable once (after the load's commit, when its fields are
produced) like any other, and no row is served twice or lost, whatever the interleaving of
the load with the puts and fetches.
"""
from __future__ import annotations

import threading

import pytest
import torch

import tqstore

from checkpoint_helpers import canon, fill

BATCH = 6


def _rows(store, pid, keys):
    rb = store.controller.rows_by_key(pid, list(keys))
    return {k: (canon(t), sorted(fs), {f: canon(store.read(pid, [g], [f])[f]) for f in sorted(fs)})
            for k, g, t, fs in zip(rb.keys, rb.gidxs, rb.tags, rb.fields)}


@pytest.mark.parametrize("units", [1, 3])
def test_a_load_merges_while_producers_put_and_a_consumer_fetches(tmp_path, units):
    with tqstore.open(tmp_path / "src", num_units=2) as src:
        dumped = fill(src, "train", 48, prefix="d")
        src.dump_data_by_key(tmp_path / "dump", dumped, "train")
        want = _rows(src, "train", dumped)
    with tqstore.open(tmp_path / "dst", num_units=units) as dst:
        client = tqstore.get_client(dst)
        early = fill(dst, "train", 12, prefix="e", seed=3)  # samples put before the resume
        first = client.get_meta(["input_ids"], BATCH, "train", task_name="t")  # consumed before the load
        served = [k for k in first.keys]
        produced = {0: [], 1: []}
        started = threading.Barrier(3, timeout=30)
        loaded, stop = threading.Event(), threading.Event()
        errors = []

        def produce(t: int) -> None:  # puts before, during and after the load
            try:
                i = after = 0
                while after < 2:
                    produced[t].extend(fill(dst, "train", 3, start=1000 * t + 3 * i, seed=t + i, prefix=f"p{t}-"))
                    if i == 0:
                        started.wait()
                    i += 1
                    after += loaded.is_set()
            except BaseException as e:  # noqa: BLE001 - reported by the test
                errors.append(e)
                started.abort()

        def consume() -> None:
            try:
                while not stop.is_set():
                    m = client.get_meta(["input_ids"], BATCH, "train", task_name="t", timeout_s=0.05)
                    served.extend(m.keys)
            except BaseException as e:  # noqa: BLE001 - reported by the test
                errors.append(e)

        threads = [threading.Thread(target=produce, args=(t,)) for t in range(2)]
        threads.append(threading.Thread(target=consume))
        for th in threads:
            th.start()
        try:
            started.wait()  # both producers have put a batch and go on
            report = dst.load_data_by_key(tmp_path / "dump")
            loaded.set()
        finally:
            loaded.set()
            for th in threads[:2]:
                th.join()
            stop.set()
            threads[2].join()
        assert not errors, errors
        assert report["keys"] == len(dumped) and report["new_keys"] == len(dumped)
        while True:  # what the consumer had not fetched yet (one by one: a fetch takes whole batches)
            m = client.get_meta(["input_ids"], 1, "train", task_name="t")
            if not m.size:
                break
            served.extend(m.keys)
        everyone = early + dumped + [k for ks in produced.values() for k in ks]
        assert len(served) == len(set(served)), "a row was served twice"
        assert sorted(served) == sorted(everyone), "a row was never served"
        assert _rows(dst, "train", dumped) == want
        for t, ks in produced.items():  # the producers' samples are theirs, untouched by the load
            assert len(ks) >= 9 and dst.kv_batch_get(ks, "train", "input_ids")["input_ids"].shape == (len(ks), 16)
        assert not dst.controller.restores()
        assert dst.verify() == []


def test_a_resumed_rollout_finishes_restored_samples_and_serves_each_once(tmp_path):
    """Partial rollout across a restart: samples at every stage (reserved with a tag only,
    prompt only, prompt and half a response) are dumped, the run dies, a new store of another
    unit count loads them, the rollout puts what each still lacks, and the trainer fetches
    every finished sample once, with its prompt, its response and its tag as they were."""
    prompts = {f"s{i}": torch.arange(i, i + 4 + i % 3) for i in range(9)}
    with tqstore.open(tmp_path / "run1", num_units=2) as s:
        client = tqstore.get_client(s)
        keys = list(prompts)
        s.kv_batch_put(keys[:3], "rollout", tags=[{"stage": "queued", "n": i} for i in range(3)])
        s.kv_batch_put(keys[3:], "rollout", {"prompt": [prompts[k] for k in keys[3:]]},
                       tags=[{"stage": "prompted", "n": i} for i in range(3, 9)])
        s.kv_batch_put(keys[6:], "rollout", {"response": [torch.full((2,), i) for i in range(6, 9)]})
        done = client.get_meta(["prompt", "response"], 3, "rollout", task_name="train")  # consumed before the crash
        assert sorted(done.keys) == keys[6:]
        s.dump_data_by_key(tmp_path / "pending", keys[:6], "rollout")
    with tqstore.open(tmp_path / "run2", num_units=3) as s:
        client = tqstore.get_client(s)
        report = s.load_data_by_key(tmp_path / "pending")
        assert report["keys"] == 6 and report["rows_with_data"] == 3
        assert client.get_meta(["prompt", "response"], 1, "rollout", task_name="train").size == 0  # none finished
        s.kv_batch_put(keys[:3], "rollout", {"prompt": [prompts[k] for k in keys[:3]]})
        s.kv_batch_put(keys[:6], "rollout", {"response": [torch.full((2,), 100 + i) for i in range(6)]})
        got = client.get_meta(["prompt", "response"], 6, "rollout", task_name="train")
        assert sorted(got.keys) == keys[:6]
        data = s.kv_batch_get(keys[:6], "rollout", ["prompt", "response"])
        for i, k in enumerate(keys[:6]):
            assert torch.equal(data["prompt"][i], prompts[k]) and torch.equal(data["response"][i],
                                                                               torch.full((2,), 100 + i))
        tags = s.kv_list("rollout")["rollout"]
        assert [tags[k] for k in keys[:6]] == [{"stage": "queued", "n": i} for i in range(3)] + \
            [{"stage": "prompted", "n": i} for i in range(3, 6)]
        assert client.get_meta(["prompt", "response"], 1, "rollout", task_name="train").size == 0  # each once
