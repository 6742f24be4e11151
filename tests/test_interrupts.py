"""Ctrl-C (a real SIGINT, Python's default handler) in the middle of a put never leaves the
store's files and its in-memory state disagreeing (tqstore._interrupts): the interrupt is
held back until the put is whole, then raised.  Before, a SIGINT right after the
controller's commit made the next put reuse row indexes already given away (a damaged
controller index, a store that would not open), one right after a unit's commit left the
put's new values readable after it raised, and a KeyboardInterrupt inside a unit's write
came out as StorageIOError.  Real store, LMDB and files; the signal is sent from a hook at
the worst moment."""
from __future__ import annotations

import os
import signal
import threading

import numpy as np
import pytest

import tqstore
import tqstore.controller_put as controller_put
from tqstore import _interrupts


def _put(s, keys, v):
    return s.kv_batch_put(keys, "p", {"x": np.full((len(keys), 4), v, np.int32)}, tags=[{"v": v}] * len(keys))


def _values(s, keys):
    return s.kv_batch_get(keys, "p")["x"][:, 0].tolist()


def _sigint_once(obj, name):
    """Wrap ``obj.name`` so that its first call sends this process a real SIGINT first."""
    orig, once = getattr(obj, name), []

    def hooked(*a, **kw):
        if not once:
            once.append(1)
            os.kill(os.getpid(), signal.SIGINT)
        return orig(*a, **kw)

    return orig, hooked


def test_a_sigint_after_the_controllers_commit_of_a_put_arrives_after_the_put(tmp_path, monkeypatch):
    a, b, c = ([f"{p}{i}" for i in range(4)] for p in "abc")
    with tqstore.open(tmp_path / "s", num_units=2) as s:
        _put(s, a, 1)
        orig, hooked = _sigint_once(controller_put, "_apply")
        monkeypatch.setattr(controller_put, "_apply", hooked)
        with pytest.raises(KeyboardInterrupt):
            _put(s, b, 2)
        monkeypatch.setattr(controller_put, "_apply", orig)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # (the handler is back)
        _put(s, c, 3)  # the trainer catches it and goes on
        assert _values(s, a + b + c) == [1] * 4 + [2] * 4 + [3] * 4  # the interrupted put is whole
        assert len(set(s.kv_retrieve_meta(a + b + c, "p").global_indexes)) == 12  # no index given twice
        assert s.verify() == []
    with tqstore.open(tmp_path / "s") as s:
        assert s.verify() == [] and _values(s, a + b + c) == [1] * 4 + [2] * 4 + [3] * 4


def test_a_sigint_after_one_units_commit_of_an_overwriting_put_never_leaves_it_torn(tmp_path, monkeypatch):
    keys = [f"k{i}" for i in range(12)]
    with tqstore.open(tmp_path / "s", num_units=2) as s:
        _put(s, keys, 1)
        u = s.units[1]
        orig, hooked = _sigint_once(u.locs, "committed")
        monkeypatch.setattr(u.locs, "committed", hooked)
        with pytest.raises(KeyboardInterrupt):
            _put(s, keys, 2)
        monkeypatch.setattr(u.locs, "committed", orig)
        assert _values(s, keys) == [2] * 12  # the put completed on every unit, then the interrupt came
        assert [t["v"] for t in s.kv_list("p")["p"].values()] == [2] * 12
        assert s.verify() == []


def test_a_keyboard_interrupt_inside_a_units_write_stays_one_and_the_put_is_rolled_back(tmp_path, monkeypatch):
    keys = [f"k{i}" for i in range(12)]
    with tqstore.open(tmp_path / "s", num_units=2) as s:
        _put(s, keys, 1)

        def interrupted(*a, **kw):
            raise KeyboardInterrupt

        monkeypatch.setattr(s.units[1], "write", interrupted)
        with pytest.raises(KeyboardInterrupt):  # (was StorageIOError "write to unit 1 ... failed: ")
            _put(s, keys, 2)
        monkeypatch.undo()
        assert _values(s, keys) == [1] * 12  # rolled back on the unit that had written
        assert s.verify() == []


def test_deferral_holds_only_in_the_main_thread_and_runs_the_installed_handler_once():
    calls = []
    prev = signal.signal(signal.SIGINT, lambda signum, frame: calls.append(signum))
    try:
        with _interrupts.deferred():
            with _interrupts.deferred():  # nested: held back once
                os.kill(os.getpid(), signal.SIGINT)
                os.kill(os.getpid(), signal.SIGINT)
            assert calls == []
        assert calls == [signal.SIGINT]  # after the outermost block, once
        lock = _interrupts.DeferringRLock()
        with lock:  # (a lock held only to read holds nothing back)
            os.kill(os.getpid(), signal.SIGINT)
            assert len(calls) == 2
        with lock:
            with lock:
                lock.hold_until_released()  # (before a commit)
                os.kill(os.getpid(), signal.SIGINT)
            assert len(calls) == 2  # until the outermost release
        assert len(calls) == 3
        term = []
        prev_term = signal.signal(signal.SIGTERM, lambda signum, frame: term.append(signum))
        try:  # (a preemption's SIGTERM, whose handler may raise SystemExit)
            with _interrupts.deferred():
                os.kill(os.getpid(), signal.SIGTERM)
                assert term == []
            assert term == [signal.SIGTERM]
        finally:
            signal.signal(signal.SIGTERM, prev_term)
        seen = []
        t = threading.Thread(target=lambda: seen.append(_interrupts._hold()))
        t.start()
        t.join()
        assert seen == [False]  # another thread changes no handler
    finally:
        signal.signal(signal.SIGINT, prev)


def test_a_sigint_after_a_fetchs_consumption_commit_never_hands_its_rows_out_again(tmp_path):
    """The fetch's commit marked rows consumed; a SIGINT before the controller's mirror
    learnt it made the next fetch in the process hand the same rows out again."""
    with tqstore.open(tmp_path / "s", num_units=2) as s:
        c = tqstore.get_client(s)
        c.put({"x": np.arange(8).reshape(8, 1)}, partition_id="p")
        ctrl = s.controller
        inner = ctrl.consumed

        class Hooked(type(inner)):
            armed = True

            def __getitem__(self, k):
                if Hooked.armed:  # (right after the commit: the mirror's update starts here)
                    Hooked.armed = False
                    os.kill(os.getpid(), signal.SIGINT)
                return super().__getitem__(k)

        hooked = Hooked(inner.default_factory)
        hooked.update(inner)
        ctrl.consumed = hooked
        taken = []
        with pytest.raises(KeyboardInterrupt):
            taken.append(c.get_meta(["x"], 4, "p", task_name="t").global_indexes)
        assert not Hooked.armed
        second = c.get_meta(["x"], 4, "p", task_name="t").global_indexes
        third = c.get_meta(["x"], 4, "p", task_name="t").global_indexes
        assert len(second) == 4 and third == []  # the interrupted fetch's 4 rows are consumed: never again
        assert s.verify() == []
