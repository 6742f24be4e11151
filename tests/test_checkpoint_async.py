"""``save_checkpoint(blocking=False)``: the cut is the only stall; puts, overwrites, clears
and compaction running while the write goes on never reach or tear the checkpoint; one
save in flight; a background failure surfaces on the handle and on the next call.

The background writer is held at its first I/O event (through the I/O layer's observer) until
the test has done its concurrent work, so the overlap is certain, not timing-dependent.
"""
from __future__ import annotations

import threading

import pytest

import tqstore
from tqstore import CheckpointError
from tqstore._io import failpoints as fp
from tqstore.checkpoint import CheckpointInfo, SaveHandle, verify_checkpoint

from checkpoint_helpers import fill, state
from sync_helpers import watch_handle_waits


class Gate:
    """Blocks checkpoint-writer threads at their first I/O event until opened."""

    def __init__(self) -> None:
        self.open_ = threading.Event()
        self.reached = threading.Event()

    def __call__(self, event, *args) -> None:
        name = threading.current_thread().name
        if name.startswith(("tqstore-ckpt", "tqstore-checkpoint-save")):  # the export threads, the kept save pool
            self.reached.set()
            assert self.open_.wait(30), "gate never opened"

    def __enter__(self) -> "Gate":
        fp.set_observer(self)
        return self

    def __exit__(self, *exc) -> None:
        self.open_.set()
        fp.set_observer(None)


@pytest.fixture(autouse=True)
def _clean_failpoints():
    yield
    fp.disarm()
    fp.set_observer(None)


@pytest.fixture
def store(tmp_path):
    with tqstore.open(tmp_path / "store", num_units=2, segment_bytes=1 << 16) as s:
        yield s


def test_puts_overwrites_and_clears_during_an_async_save_never_reach_the_checkpoint(store, tmp_path):
    keys = fill(store, "train", 30)
    fill(store, "val", 4, prefix="v")
    want = state(store)
    with Gate() as gate:
        h = store.save_checkpoint(tmp_path / "ckpt", blocking=False)
        assert isinstance(h, SaveHandle)
        assert not h.done(), "save_checkpoint(blocking=False) returned only after the write"
        assert gate.reached.wait(30), "the background write never started"
        fill(store, "train", 10, start=30, seed=1)  # new rows
        fill(store, "train", 10, seed=2)  # overwrite rows the checkpoint holds
        store.kv_clear(keys[10:], "train")  # clear rows the checkpoint holds
        store.clear_partition("val")
        store.get_meta(["text"], 5, "train", task_name="late")
        store.compact(live_ratio=1.0)  # pinned segments must survive compaction
        during = state(store)
        gate.open_.set()
        info = h.result(timeout=60)
    assert isinstance(info, CheckpointInfo) and h.done() and info.rows == len(want["rows"])
    verify_checkpoint(tmp_path / "ckpt")
    assert state(store) == during  # the live store kept every concurrent change
    with tqstore.open(tmp_path / "other", num_units=3) as o:
        o.load_checkpoint(tmp_path / "ckpt")
        assert state(o) == want
    store.load_checkpoint(tmp_path / "ckpt")
    assert state(store) == want


def test_writes_racing_a_blocking_save_from_other_threads_never_tear_it(store, tmp_path):
    fill(store, "train", 20)
    stop = threading.Event()
    errors = []

    def writer():
        i = 0
        try:
            while not stop.is_set():
                fill(store, "train", 4, start=100 + 4 * (i % 5), seed=i)
                store.kv_clear([f"k{100 + 4 * ((i + 2) % 5)}"], "train")
                i += 1
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    t = threading.Thread(target=writer)
    t.start()
    try:
        for n in range(3):
            store.save_checkpoint(tmp_path / f"ckpt{n}", copy_segments=bool(n % 2))
    finally:
        stop.set()
        t.join()
    assert not errors
    for n in range(3):
        rep = verify_checkpoint(tmp_path / f"ckpt{n}")
        with tqstore.open(tmp_path / f"o{n}", num_units=1) as o:
            o.load_checkpoint(tmp_path / f"ckpt{n}")
            rows = state(o)["rows"]
            assert len(rows) == rep.rows
            assert all(len(v[3]) == 6 for v in rows.values())  # every row whole: all six fields


def test_one_save_in_flight_a_second_call_waits_for_the_first(store, tmp_path):
    fill(store, "train", 6)
    done2 = threading.Event()
    first_done_at_second_return = []
    with Gate() as gate:
        h1 = store.save_checkpoint(tmp_path / "a", blocking=False)
        assert gate.reached.wait(30), "the background write never started"
        waited_on = watch_handle_waits(h1)

        def second():
            store.save_checkpoint(tmp_path / "b")
            first_done_at_second_return.append(h1.done())
            done2.set()

        t = threading.Thread(target=second)
        t.start()
        assert waited_on.wait(30), "the second save did not wait for the one in flight"
        assert not done2.is_set() and not h1.done()
        gate.open_.set()
        t.join(60)
    assert done2.is_set(), "the second save did not finish after the first"
    assert first_done_at_second_return == [True]
    assert h1.result().path == tmp_path / "a"
    verify_checkpoint(tmp_path / "a")
    verify_checkpoint(tmp_path / "b")


def test_a_background_failure_is_raised_by_the_handle(store, tmp_path):
    fill(store, "train", 4)
    fp.arm("fsync_dir", "eio", 1)
    h = store.save_checkpoint(tmp_path / "ckpt", blocking=False)
    with pytest.raises(CheckpointError, match="intact"):
        h.result(timeout=60)
    assert isinstance(h.exception(), CheckpointError)
    fp.disarm()
    store.save_checkpoint(tmp_path / "ckpt")  # seen through the handle: not raised again
    verify_checkpoint(tmp_path / "ckpt")


def test_an_unseen_background_failure_is_raised_by_the_next_checkpoint_call(store, tmp_path):
    fill(store, "train", 4)
    fp.arm("fsync_dir", "eio", 1)
    store.save_checkpoint(tmp_path / "first", blocking=False)
    with pytest.raises(CheckpointError, match="first"):
        store.save_checkpoint(tmp_path / "second")
    fp.disarm()
    assert not (tmp_path / "first").exists() and not (tmp_path / "second").exists()
    store.save_checkpoint(tmp_path / "second")  # raised once only
    verify_checkpoint(tmp_path / "second")


def test_close_waits_for_the_background_save(tmp_path):
    s = tqstore.open(tmp_path / "store", num_units=2)
    fill(s, "train", 6)
    want = state(s)
    with Gate() as gate:
        h = s.save_checkpoint(tmp_path / "ckpt", blocking=False)
        assert gate.reached.wait(30), "the background write never started"
        waited_on = watch_handle_waits(h)
        closer = threading.Thread(target=s.close)
        closer.start()
        assert waited_on.wait(30), "close did not wait for the save in flight"
        assert closer.is_alive() and not h.done()
        gate.open_.set()
        closer.join(60)
    assert not closer.is_alive() and h.done() and h.exception() is None and s.closed
    with tqstore.open(tmp_path / "other", num_units=2) as o:
        o.load_checkpoint(tmp_path / "ckpt")
        assert state(o) == want


def test_handle_result_times_out_while_the_save_runs(store, tmp_path):
    fill(store, "train", 2)
    with Gate() as gate:
        h = store.save_checkpoint(tmp_path / "ckpt", blocking=False)
        assert gate.reached.wait(30), "the background write never started"
        with pytest.raises(tqstore.WaitTimeoutError, match="still running") as e:
            h.result(timeout=0.05)
        assert isinstance(e.value, TimeoutError)
        assert "running" in repr(h)
        gate.open_.set()
        assert h.result(timeout=60).rows == 2


@pytest.mark.parametrize("kind", ["save", "dump"])
def test_a_failure_whose_handle_was_asked_for_is_not_raised_by_another_threads_save(store, tmp_path, kind):
    """A trainer's dump thread waits in its handle's result() while its checkpoint thread
    saves: a failure of the dump was raised twice, by the handle and by the unrelated save
    (which then never happened)."""
    keys = fill(store, "train", 4)
    with Gate() as gate:
        if kind == "save":
            fp.arm("fsync_dir", "eio", 1)
            h = store.save_checkpoint(tmp_path / "first", blocking=False)
        else:
            h = store.dump_data_by_key(tmp_path / "dump", keys + ["gone"], "train", blocking=False)
        with pytest.raises((tqstore.WaitTimeoutError, tqstore.KeyNotFoundError)):  # (a dump's keys: at once)
            h.result(timeout=0.01)  # the owner asks (and will again): the error is its own
        waiting = threading.Thread(target=lambda: pytest.raises(Exception, h.result, timeout=60))
        waiting.start()
    store.save_checkpoint(tmp_path / "second")  # another thread's save: not failed by the first
    fp.disarm()
    waiting.join(60)
    assert not waiting.is_alive() and h.exception() is not None
    verify_checkpoint(tmp_path / "second")
