"""The resume path while the store runs: a dump of unfinished samples is loaded into a store
whose producers keep putting and whose consumer keeps fetching batches.

What a trainer relies on: every dumped key comes back bit for bit, every produced sample is
kept, a restored row becomes fetchable once (after the load's commit) like any other, and no
row is served twice or lost, whatever the interleaving of the load with the puts and fetches.
"""
from __future__ import annotations

import threading

import pytest

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
