"""A store across ``fork`` and interpreter exit, as trainers meet them: a forked child (a
DataLoader worker, a multiprocessing pool) may not use its parent's store and gets a clear
StoreClosedError (before, its puts and fetches went through the parent's LMDB environments:
rows lost, rows handed out twice, a damaged index); its ``close`` leaves the parent's store
alone (a temporary store was deleted under the parent); it holds no copy of the store's
lock (the parent's reopen was refused while any child lived); and a background save still
running when the script ends is published (it was dropped).  Real stores, real processes."""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import tqstore as tq

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="fork only")


def _put(s, keys, v=1):
    s.kv_batch_put(keys, "p", {"x": np.full((len(keys), 2), v, np.int64)})


def _in_child(fn) -> int:
    """Run ``fn()`` in a forked child; its exit status (0: it returned True)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            code = 0 if fn() else 3
        except BaseException:  # noqa: BLE001
            code = 2
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def test_a_forked_child_cannot_use_the_parents_store_and_the_parents_store_is_whole(tmp_path):
    s = tq.open(tmp_path / "s", num_units=2)
    try:
        _put(s, ["a", "b"])
        c = tq.get_client(s)
        put = c.put({"x": torch.arange(4).reshape(4, 1)}, partition_id="q")

        def child() -> bool:
            for call in (lambda: _put(s, ["c"]), lambda: c.get_meta(["x"], 2, "q", task_name="t"),
                         lambda: s.kv_batch_get(["a"], "p"), lambda: s.save_checkpoint(tmp_path / "ck")):
                try:
                    call()
                    return False
                except tq.StoreClosedError as e:
                    if "fork" not in str(e) or "num_workers=0" not in str(e):
                        return False
            s.close()  # (the child's copy only)
            return True

        assert _in_child(child) == 0
        assert sorted(s.kv_list("p")["p"]) == ["a", "b"]  # nothing of the child's
        assert sorted(c.get_meta(["x"], 4, "q", task_name="t").global_indexes) == sorted(put.global_indexes)
        assert not (tmp_path / "ck").exists()
        assert s.verify() == []
    finally:
        s.close()
    with tq.open(tmp_path / "s") as s:
        assert s.verify() == [] and sorted(s.kv_list("p")["p"]) == ["a", "b"]


def test_a_forked_childs_close_of_a_temporary_store_leaves_it_to_the_parent(tmp_path):
    s = tq.open(None)  # a temporary store (tq.init() without a path)
    try:
        _put(s, ["a"], 5)
        assert _in_child(lambda: s.close() is None) == 0
        assert s.root.exists()
        _put(s, ["b"], 6)
        assert s.kv_batch_get(["a", "b"], "p")["x"][:, 0].tolist() == [5, 6]
    finally:
        s.close()
    assert not s.root.exists()


@contextlib.contextmanager
def _living_child():
    """A forked child that idles (its fork hooks have run when this yields) until the block ends."""
    r, w = os.pipe()
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(w)
        os.write(ready_w, b"!")
        os.read(r, 1)
        os._exit(0)
    os.close(r)
    os.close(ready_w)
    try:
        assert os.read(ready_r, 1) == b"!"
        os.close(ready_r)
        yield pid
    finally:
        os.close(w)
        os.waitpid(pid, 0)


def test_a_living_forked_child_does_not_keep_the_closed_store_locked(tmp_path):
    s = tq.open(tmp_path / "s")
    _put(s, ["a"])
    with _living_child():
        s.close()
        with tq.open(tmp_path / "s") as s2:  # refused ("open in another process") while the child lived
            assert sorted(s2.kv_list("p")["p"]) == ["a"]


def test_a_dataloader_with_forked_workers_over_the_store_raises_instead_of_duplicating_rows():
    tq.init()
    try:
        tq.put({"x": torch.arange(32).reshape(32, 1)}, partition_id="train")
        ds = tq.StreamingDataset(None, batch_size=4, micro_batch_size=4, data_fields=["x"], partition_id="train",
                                 task_name="actor", dp_rank=0, should_check_consumption_status=True)
        loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2,
                                             multiprocessing_context="fork", collate_fn=lambda b: b)
        it = iter(loader)
        try:
            with pytest.raises(Exception, match="num_workers=0"):
                next(it)
        finally:
            # (left to the garbage collector, torch's iterator waits 5 s for each worker: its queues
            # are collected first)
            it._shutdown_workers()
        meta = tq.get_meta(["x"], 32, "train", task_name="actor")
        assert sorted(meta.global_indexes) == list(range(32))  # the workers consumed nothing
        assert tq.StreamingDataLoader(ds).get_buffer() is ds.buffer  # (TransferQueue's name)
    finally:
        tq.close()


@pytest.mark.parametrize("what", ["save", "dump"])
def test_a_background_save_or_dump_running_when_the_script_ends_is_published(tmp_path, what):
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        import numpy as np
        import tqstore as tq
        def run():
            s = tq.init({{"path": {str(tmp_path / "s")!r}, "num_units": 2}})
            keys = [f"k{{i}}" for i in range(64)]
            s.kv_batch_put(keys, "p", {{"x": np.ones((64, 1024), np.float32)}})
            if {what!r} == "save":
                s.save_checkpoint({str(tmp_path / "out")!r}, blocking=False)
            else:
                s.dump_data_by_key({str(tmp_path / "out")!r}, keys, "p", blocking=False)
        run()  # the handle is dropped; the script ends while the write runs
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert "cannot schedule" not in r.stderr and "failed" not in r.stderr, r.stderr
    assert (tmp_path / "out" / "MANIFEST.json").exists()
    v = subprocess.run([sys.executable, "-m", "tqstore", "verify", str(tmp_path / "out")], capture_output=True,
                       text=True, timeout=120, cwd=ROOT)
    assert v.returncode == 0, v.stdout + v.stderr


def test_pickling_a_store_raises_a_clear_error(tmp_path):
    """A spawned DataLoader worker or a process pool pickles what it is given: a store is
    this process's open files (it failed with "cannot pickle 'Environment' object")."""
    import pickle

    with tq.open(tmp_path / "s") as s:
        with pytest.raises(tq.UnsupportedTypeError, match="num_workers=0"):
            pickle.dumps(s)
        with pytest.raises(TypeError):  # (a TypeError, as pickle's own)
            pickle.dumps({"store": s})


def test_a_child_forked_during_a_background_save_exits_and_the_save_publishes(tmp_path):
    """The child inherited the parent's save in flight and waited for it at its exit, forever
    (its thread is not in the child)."""
    import multiprocessing
    import threading

    s = tq.open(tmp_path / "s", num_units=2)
    try:
        _put(s, [f"k{i}" for i in range(16)])
        go, orig = threading.Event(), s.units[1].export_snapshot

        def paused(*a, **kw):
            assert go.wait(60)
            return orig(*a, **kw)

        s.units[1].export_snapshot = paused
        h = s.save_checkpoint(tmp_path / "ck", blocking=False)
        child = multiprocessing.get_context("fork").Process(target=_child_opens_its_own_store,
                                                             args=(str(tmp_path / "own"),))
        child.start()
        child.join(30)
        alive = child.is_alive()
        if alive:
            child.kill()
        go.set()
        assert not alive and child.exitcode == 0
        assert h.result(timeout=60).path.exists()
    finally:
        s.close()


def _child_opens_its_own_store(path: str) -> None:
    with tq.open(path) as own:
        _put(own, ["c"])


def test_a_forked_child_keeps_no_lock_another_thread_of_the_parent_held(tmp_path):
    """A flock held by another thread at the fork (a save publishing) stayed held by the
    child's copy of the descriptor until the child ended."""
    import fcntl
    import threading

    from tqstore._io import locks

    lock = tmp_path / "x.lock"
    held, release, done = threading.Event(), threading.Event(), threading.Event()

    def holder():
        with locks.flocked(lock):
            held.set()
            release.wait(30)
        done.set()

    t = threading.Thread(target=holder)
    t.start()
    assert held.wait(30)
    try:
        with _living_child():
            release.set()
            assert done.wait(30)
            fd = os.open(lock, os.O_RDWR)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # (BlockingIOError while the child kept it)
            finally:
                os.close(fd)
    finally:
        release.set()
        t.join()


def test_a_put_and_a_read_of_a_thread_still_running_when_the_main_thread_ends_complete(tmp_path):
    """Python tells the thread pools to refuse new work before it waits for the threads still
    running: a producer thread's large put failed half-way with a builtin RuntimeError ("cannot
    schedule new futures after shutdown"), its rows lost; a read failed the same way."""
    script = textwrap.dedent(f"""
        import sys, threading, time
        sys.path.insert(0, {str(ROOT)!r})
        import numpy as np
        import tqstore as tq
        s = tq.init({{"path": {str(tmp_path / "s")!r}, "num_units": 2}})
        big = np.arange(16 * 65536, dtype=np.int64).reshape(16, -1)  # 8 MiB: the unit pool writes it
        def producer(i):
            threading.main_thread().join()  # the main thread ended, and then
            import concurrent.futures.thread as cft
            while not cft._shutdown:  # Python told the pools to refuse new work
                time.sleep(0.01)
            keys = [f"t{{i}}_{{j}}" for j in range(16)]
            tq.kv_batch_put(keys, "p", {{"x": big}})
            got = tq.kv_batch_get(keys, "p")["x"]
            print("ok" if np.array_equal(np.asarray(got), big) else "wrong", flush=True)
        for i in range(2):
            threading.Thread(target=producer, args=(i,)).start()  # not daemons: Python waits for them
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0 and r.stdout.count("ok") == 2 and "wrong" not in r.stdout, r.stdout + r.stderr
    with tq.open(tmp_path / "s") as s:
        assert len(s.kv_list("p")["p"]) == 32


def test_a_temporary_store_left_open_is_removed_when_the_script_ends(tmp_path):
    """``tq.init()`` without a path, no ``close``: its files stayed in the temporary directory,
    run after run, whatever their size."""
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        import numpy as np
        import tqstore as tq
        s = tq.init()
        tq.kv_batch_put(["a"], "p", {{"x": np.ones((1, 4))}})
        print(s.root, flush=True)
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT,
                       env={**os.environ, "TMPDIR": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    root = Path(r.stdout.split()[-1])
    assert root.parent == tmp_path and not root.exists()
