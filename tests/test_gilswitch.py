"""A data-plane call hands the GIL back quickly while other Python threads run
(tqstore._gilswitch), and leaves the interpreter's switch interval as it found it."""
from __future__ import annotations

import sys
import threading

import numpy as np
import pytest

import tqstore
from tqstore import _gilswitch as G


@pytest.fixture
def other_thread():
    """A second Python thread of the process, alive (idle) for the test."""
    stop = threading.Event()
    t = threading.Thread(target=stop.wait, daemon=True)
    t.start()
    yield t
    stop.set()
    t.join()


@pytest.fixture
def default_interval():
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.005)
    yield
    sys.setswitchinterval(before)


def test_a_put_and_a_get_run_with_the_quick_interval_beside_another_thread_and_restore_it(
        tmp_path, other_thread, default_interval):
    seen = {}
    with tqstore.open(tmp_path / "s", num_units=2, result_type="dict") as s:
        write, read_rows = s.write, s.read_rows

        def spy_write(*a, **k):
            seen["put"] = sys.getswitchinterval()
            return write(*a, **k)

        def spy_read(*a, **k):
            seen["get"] = sys.getswitchinterval()
            return read_rows(*a, **k)

        s.write, s.read_rows = spy_write, spy_read  # (the data plane's payload side is the store)
        s.kv_batch_put(["a", "b"], "p", {"x": np.arange(6).reshape(2, 3)})
        assert sys.getswitchinterval() == pytest.approx(0.005)
        got = s.kv_batch_get(["b"], "p")
        assert got["x"].tolist() == [[3, 4, 5]]
    assert seen == {"put": pytest.approx(G.INTERVAL_S), "get": pytest.approx(G.INTERVAL_S)}
    assert sys.getswitchinterval() == pytest.approx(0.005)


def test_an_interval_the_interpreter_rounds_is_still_put_back(default_interval, monkeypatch):
    monkeypatch.setattr(G, "INTERVAL_S", 0.0000125)  # kept as 12 us
    with G.quick_handoff():
        assert sys.getswitchinterval() == pytest.approx(1.2e-5)
    assert sys.getswitchinterval() == pytest.approx(0.005)


def test_nested_and_concurrent_calls_restore_once_the_last_one_ends(other_thread, default_interval):
    entered, release = threading.Event(), threading.Event()

    def long_call():
        with G.quick_handoff():
            entered.set()
            release.wait()

    t = threading.Thread(target=long_call)
    t.start()
    entered.wait()
    with G.quick_handoff():
        with G.quick_handoff():
            assert sys.getswitchinterval() == pytest.approx(G.INTERVAL_S)
    assert sys.getswitchinterval() == pytest.approx(G.INTERVAL_S)  # the other call still runs
    release.set()
    t.join()
    assert sys.getswitchinterval() == pytest.approx(0.005)


def test_an_interval_set_by_someone_else_meanwhile_is_kept(other_thread, default_interval):
    with G.quick_handoff():
        sys.setswitchinterval(0.002)
    assert sys.getswitchinterval() == pytest.approx(0.002)


def test_a_quicker_interval_already_set_is_left_as_it_is(other_thread):
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        with G.quick_handoff():
            assert sys.getswitchinterval() == pytest.approx(1e-5)
        assert sys.getswitchinterval() == pytest.approx(1e-5)
    finally:
        sys.setswitchinterval(before)


@pytest.mark.parametrize("raw, want", [(None, G.DEFAULT_INTERVAL_S), ("", G.DEFAULT_INTERVAL_S), ("off", None),
                                       ("0", None), ("0.0001", 1e-4), ("fast", G.DEFAULT_INTERVAL_S),
                                       ("5", G.DEFAULT_INTERVAL_S), ("1e-7", G.DEFAULT_INTERVAL_S)])
def test_the_environment_variable_sets_or_disables_the_interval(raw, want, caplog):
    assert G._interval_from_env(raw) == want
    if raw in ("fast", "5", "1e-7"):
        assert "TQSTORE_SWITCH_INTERVAL" in caplog.text


def test_disabled_it_changes_nothing(other_thread, default_interval, monkeypatch):
    monkeypatch.setattr(G, "INTERVAL_S", None)
    with G.quick_handoff():
        assert sys.getswitchinterval() == pytest.approx(0.005)


def test_a_process_forked_during_a_call_gets_its_interval_and_collector_back(default_interval):
    """A child forked while a call runs (a DataLoader worker started by another thread, say)
    runs no call: its switch interval and garbage collector are as before the call."""
    import gc
    import os

    from tqstore import _gcpause

    assert gc.isenabled()
    with _gcpause.paused(), G.quick_handoff():
        assert sys.getswitchinterval() == pytest.approx(G.INTERVAL_S) and not gc.isenabled()
        pid = os.fork()
        if pid == 0:  # the child: report through its exit code, never return into pytest
            ok = sys.getswitchinterval() == pytest.approx(0.005) and gc.isenabled()
            with G.quick_handoff():  # and its own calls still work (a fresh lock and counter)
                ok = ok and sys.getswitchinterval() == pytest.approx(G.INTERVAL_S)
            ok = ok and sys.getswitchinterval() == pytest.approx(0.005)
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert sys.getswitchinterval() == pytest.approx(0.005) and gc.isenabled()  # the parent's own restore
