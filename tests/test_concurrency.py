"""Concurrency of the data plane and the incremental fetch structures.

* a consumer's ``get_meta`` (and status queries) complete while a put is held inside its
  unit writes — consumers take only the short metadata lock; a waiting fetch is woken
  by a put;
* puts, clears and fetches from many threads: no row is returned twice to one task, no
  row is returned before its fields are produced, and the data read is the row's own;
* a checkpoint taken during concurrent puts and fetches is a consistent cut;
* the controller's incremental structures (seq-ordered rows, per-task ready views) agree
  with a from-scratch computation after every kind of operation, including reopen and
  load_checkpoint, checked against a brute-force model of ``fetch``.
"""
from __future__ import annotations

import random
import threading
import time

import pytest
import torch

import tqstore as tq
from tqstore import KeyNotFoundError, PartitionNotFoundError

from sync_helpers import watch_fetch_waits


def _rows(ids, fields=("x", "y")):
    ids = torch.as_tensor(ids, dtype=torch.int64).reshape(-1, 1)
    out = {}
    if "x" in fields:
        out["x"] = ids.clone()
    if "y" in fields:
        out["y"] = ids * 2
    return out


def _record(errors, fn):
    try:
        fn()
    except BaseException as e:  # noqa: BLE001 - reported by the test
        errors.append(e)


# ------------------------------------------------------------------ consumers vs a blocked put

def test_fetch_completes_while_a_put_is_blocked_in_its_unit_writes(tmp_path):
    with tq.open(tmp_path / "s", num_units=2) as s:
        c = tq.get_client(s)
        c.put(_rows(range(8)), partition_id="p")
        started, release = threading.Event(), threading.Event()
        originals = [u.write for u in s.units]

        def slow(orig):
            def write(*a, **kw):
                started.set()
                assert release.wait(30)
                return orig(*a, **kw)
            return write

        for u, orig in zip(s.units, originals):
            u.write = slow(orig)
        errors = []

        def producer():
            try:
                c.put(_rows(range(100, 108)), partition_id="p")
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        def consumer():
            meta = c.get_meta(["x", "y"], 4, "p", task_name="t")
            assert meta.size == 4 and meta.is_ready
            assert c.get_data(meta)["x"].flatten().tolist() == [0, 1, 2, 3]
            assert c.get_meta(None, None, "p", mode="force_fetch").size == 8  # the in-flight put is not visible
            gidx, done = c.get_consumption_status("t", "p")
            assert done.tolist() == [1, 1, 1, 1, 0, 0, 0, 0]
            assert c.get_production_status(["x"], "p")[1].shape == (8, 1)
            assert c.get_partition_list() == ["p"]
            assert c.reset_consumption("p", "other")
            # nothing more is ready for this task yet: a fetch with a timeout waits, then returns empty
            assert c.get_meta(["x", "y"], 8, "p", task_name="t", timeout_s=0.2).size == 0
            finished.set()

        finished = threading.Event()
        cons = None
        th = threading.Thread(target=producer)
        th.start()
        try:
            assert started.wait(30), "the producer's unit write never started"
            cons = threading.Thread(target=lambda: _record(errors, consumer))
            cons.start()
            cons.join(30)
            assert not errors, errors[0]
            assert finished.is_set(), "the consumer waited for the producer's unit writes"
            assert th.is_alive() and not release.is_set()  # the producer is still held in its unit write
        finally:
            release.set()
            th.join(30)
            if cons is not None:
                cons.join(30)
        assert not errors, errors[0]
        for u, orig in zip(s.units, originals):
            u.write = orig
        meta = c.get_meta(["x", "y"], 8, "p", task_name="t")
        assert sorted(c.get_data(meta)["x"].flatten().tolist()) == [4, 5, 6, 7] + list(range(100, 104))
        s.controller.check_mirror()


def test_a_waiting_fetch_is_woken_by_a_put(tmp_path, monkeypatch):
    with tq.open(tmp_path / "s", num_units=2) as s:
        c = tq.get_client(s)
        # the fetch's waits end only on a notify (its poll interval is ignored)
        waiting, woken = watch_fetch_waits(s, monkeypatch, notify_only=True)
        got = []
        th = threading.Thread(target=lambda: got.append(c.get_meta(["x"], 2, "p", task_name="t", timeout_s=120)))
        th.start()
        assert waiting.wait(30), "the fetch never started to wait for a producer"
        c.put(_rows(range(2)), partition_id="p")
        th.join(60)
        assert not th.is_alive(), "the waiting fetch did not return"
        assert woken == [True], "the put did not wake the waiting fetch (its wait timed out)"
        assert got[0].size == 2 and got[0].is_ready


# ------------------------------------------------------------------ many threads

@pytest.mark.parametrize("sampler", ["sequential", {"name": "grpo_group_n", "n_samples_per_prompt": 2}, "random"])
def test_concurrent_puts_clears_and_fetches_never_double_serve(tmp_path, sampler):
    with tq.open(tmp_path / "s", num_units=2) as s:
        s.set_sampler(sampler)
        c = tq.get_client(s)
        stop = threading.Event()
        errors = []
        served = {t: [] for t in ("a", "b")}  # (gidx, seq) pairs handed to each task
        next_id = iter(range(10 ** 9))
        id_lock = threading.Lock()

        def ids(n):
            with id_lock:
                return [next(next_id) for _ in range(n)]

        def guard(fn):
            def run():
                try:
                    fn()
                except BaseException as e:  # noqa: BLE001 - reported below
                    errors.append(e)
                    stop.set()
            return run

        def producer_full():
            while not stop.is_set():
                c.put(_rows(ids(4)), partition_id="p")

        def producer_two_step():  # rows reserved first, fields produced later (x then y)
            while not stop.is_set():
                meta = c.get_meta(["x", "y"], 4, "p", mode="insert")
                i = ids(4)
                try:
                    c.put({"x": _rows(i)["x"]}, metadata=meta)
                    time.sleep(0.001)
                    c.put({"y": _rows(i)["y"]}, metadata=meta)
                except KeyNotFoundError:
                    pass  # the clearer removed the reserved rows meanwhile

        def clearer():
            rng = random.Random(1)
            while not stop.is_set():
                try:
                    meta = c.get_meta(None, 16, "p", mode="force_fetch")
                except PartitionNotFoundError:
                    continue
                if meta.size:
                    pick = sorted(rng.sample(range(meta.size), min(2, meta.size)))
                    c.clear_samples(meta.select_samples(pick))
                time.sleep(0.002)

        def consumer(task):
            while not stop.is_set():
                meta = c.get_meta(["x", "y"], 4, "p", task_name=task, timeout_s=0.05)
                if not meta.size:
                    continue
                assert meta.is_ready, "a fetched row's fields are not all produced"
                served[task].extend(zip(meta.global_indexes, meta._seqs))
                try:
                    data = c.get_data(meta)
                except (KeyNotFoundError, PartitionNotFoundError):
                    continue  # cleared between the fetch and the read
                assert torch.equal(data["y"], data["x"] * 2), "fields of different rows were mixed"

        threads = [threading.Thread(target=guard(f)) for f in
                   (producer_full, producer_full, producer_two_step, producer_two_step, clearer)]
        threads += [threading.Thread(target=guard(lambda t=t: consumer(t))) for t in ("a", "a", "b")]
        for th in threads:
            th.start()
        time.sleep(1.0)
        stop.set()
        for th in threads:
            th.join(30)
        assert not errors, errors[0]
        for task, pairs in served.items():
            assert pairs, f"task {task} got nothing"
            assert len(pairs) == len(set(pairs)), f"task {task} got a row twice"
        s.controller.check_mirror()
        # whatever is still live and unconsumed is exactly what a fresh fetch returns
        for task in ("a", "b"):
            p = s.controller.parts["p"]
            done = s.controller.consumed.get(("p", task), set())
            want = [g for g, r in p.rows.items() if g not in done and {"x", "y"} <= r.fields]
            assert s.controller.ready("p", task, frozenset({"x", "y"})) == want


def test_a_checkpoint_during_concurrent_puts_and_fetches_is_a_consistent_cut(tmp_path):
    with tq.open(tmp_path / "s", num_units=2) as s:
        c = tq.get_client(s)
        stop = threading.Event()
        errors = []

        def producer(w):
            i = 0
            while not stop.is_set():
                keys = [f"w{w}-{i}-{j}" for j in range(8)]
                base = (w * 10 ** 6 + i * 8)
                s.kv_batch_put(keys, "kv", _rows(range(base, base + 8)), tags=[{"b": i}] * 8)
                c.put(_rows(range(base, base + 8)), partition_id="st")
                i += 1

        def consumer():
            while not stop.is_set():
                c.get_meta(["x", "y"], 8, "st", task_name="t", timeout_s=0.05)

        def run(fn, *a):
            try:
                fn(*a)
            except BaseException as e:  # noqa: BLE001
                errors.append(e)
                stop.set()

        threads = [threading.Thread(target=run, args=(producer, w)) for w in range(3)]
        threads.append(threading.Thread(target=run, args=(consumer,)))
        for th in threads:
            th.start()
        cks = []
        try:
            for k in range(3):
                time.sleep(0.2)
                d = tmp_path / f"ck{k}"
                s.save_checkpoint(d)
                cks.append(d)
        finally:
            stop.set()
            for th in threads:
                th.join(30)
        assert not errors, errors[0]
    for d in cks:
        with tq.open(tmp_path / f"load-{d.name}", num_units=3) as t:
            t.load_checkpoint(d)
            t.controller.check_mirror()
            keys = t.kv_list("kv").get("kv", {})
            assert len(keys) % 8 == 0  # whole batches only
            if keys:
                got = t.kv_batch_get(list(keys), "kv", ["x", "y"])
                assert torch.equal(got["y"], got["x"] * 2)
            p = t.controller.parts.get("st")
            if p is None:
                continue
            assert len(p.rows) % 8 == 0
            done = t.controller.consumed.get(("st", "t"), set())
            assert done <= set(p.rows)
            # the restored consumption continues exactly where the cut was taken
            ready = [g for g in p.rows if g not in done]
            meta = t.get_meta(["x", "y"], len(ready), "st", task_name="t") if ready else None
            if meta is not None:
                assert meta.global_indexes == ready
                data = t.get_data(meta)
                assert torch.equal(data["y"], data["x"] * 2)


# ------------------------------------------------------------------ incremental structures vs a model

def _brute_ready(s, pid, task, need):
    p = s.controller.parts.get(pid)
    if p is None:
        return []
    done = s.controller.consumed.get((pid, task), set())
    rows = sorted(p.rows.values(), key=lambda r: r.seq)
    return [r.gidx for r in rows if r.gidx not in done and set(need) <= r.fields]


def _mirror(s):
    c = s.controller
    return ({pid: [(g, r.key, r.seq, sorted(r.fields)) for g, r in p.rows.items()] for pid, p in c.parts.items()},
            {k: sorted(v) for k, v in c.consumed.items() if v})


def test_ready_views_follow_every_operation(tmp_path):
    rng = random.Random(7)
    path = tmp_path / "s"
    s = tq.open(path, num_units=2)
    c = tq.get_client(s)
    pids, tasks = ["p", "q"], ["t1", "t2"]
    needs = [["x"], ["y"], ["x", "y"], None]
    ck = None
    n = 0
    try:
        for step in range(400):
            op = rng.choice(["put", "put", "insert", "finish", "kv", "kvclear", "clear", "fetch", "fetch", "fetch",
                             "force", "reset", "drop", "reopen", "save", "load"])
            pid, task = rng.choice(pids), rng.choice(tasks)
            if op == "put":
                k = rng.randint(1, 4)
                c.put(_rows(range(n, n + k), rng.choice([("x",), ("y",), ("x", "y")])), partition_id=pid)
                n += k
            elif op == "insert":
                c.get_meta(["x", "y"], rng.randint(1, 3), pid, mode="insert")
            elif op == "finish":  # produce a field on some existing rows (old rows become ready late)
                p = s.controller.parts.get(pid)
                if p and p.rows:
                    gs = rng.sample(list(p.rows), min(len(p.rows), rng.randint(1, 3)))
                    f = rng.choice(["x", "y"])
                    s.write(pid, {f: _rows(range(len(gs)))[f]}, gidxs=gs)
            elif op == "kv":
                keys = [f"k{rng.randint(0, 12)}" for _ in range(3)]
                keys = list(dict.fromkeys(keys))
                s.kv_batch_put(keys, pid, _rows(range(len(keys)), rng.choice([("x",), ("x", "y")])))
            elif op == "kvclear":
                s.kv_clear([f"k{rng.randint(0, 12)}" for _ in range(2)], pid)
            elif op == "clear":
                p = s.controller.parts.get(pid)
                if p and p.rows:
                    meta = c.get_meta(None, None, pid, mode="force_fetch")
                    c.clear_samples(meta.select_samples(sorted(rng.sample(range(meta.size), min(meta.size, 2)))))
            elif op == "fetch":
                need = rng.choice(needs)
                p = s.controller.parts.get(pid)
                use = (sorted(p.schema) if p else []) if need is None else need
                want = _brute_ready(s, pid, task, use)
                size = rng.randint(1, 4)
                meta = c.get_meta(need, size, pid, task_name=task)
                if p is None or not set(use) <= set(p.schema):
                    assert meta.size == 0
                else:
                    assert meta.global_indexes == (want[:size] if len(want) >= size else [])
            elif op == "force":
                if pid in s.controller.parts:
                    meta = c.get_meta(None, rng.choice([None, 3]), pid, mode="force_fetch")
                    order = [r.gidx for r in sorted(s.controller.parts[pid].rows.values(), key=lambda r: r.seq)]
                    assert meta.global_indexes == order[:len(meta.global_indexes)]
            elif op == "reset":
                c.reset_consumption(pid, rng.choice([None, task]))
            elif op == "drop":
                if rng.random() < 0.3:
                    c.clear_partition(pid)
            elif op == "reopen":
                before = _mirror(s)
                s.close()
                s = tq.open(path, num_units=2)
                c = tq.get_client(s)
                assert _mirror(s) == before
            elif op == "save":
                ck = tmp_path / f"ck{step}"
                s.save_checkpoint(ck)
                ck_state = _mirror(s)
            elif op == "load" and ck is not None:
                s.load_checkpoint(ck)
                assert _mirror(s) == ck_state
            s.controller.check_mirror()
    finally:
        s.close()


def test_ready_views_per_task_are_bounded(tmp_path):
    with tq.open(tmp_path / "s", num_units=1) as s:
        c = tq.get_client(s)
        names = [f"f{i}" for i in range(12)]
        c.put({f: torch.zeros(12, 1) for f in names}, partition_id="p")
        for i in range(12):
            assert c.get_meta(names[:i + 1], 1, "p", task_name="t").size == 1
        assert len(s.controller.parts["p"].ready["t"]) <= 8
        s.controller.check_mirror()
