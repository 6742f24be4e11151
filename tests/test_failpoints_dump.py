"""Every durable step of a dump by key and of a load by key, failed with EIO or ENOSPC in
turn (each occurrence of each failpoint of the I/O layer, until the call gets through):

* a dump raises a clear ``CheckpointError`` naming the path; the dump at the path is whole
  (the previous one, or the new one when the fault came after its publication) and the live
  store is unchanged;
* a load raises a clear ``TqstoreError``; the store is exactly as it was (the restore
  cancelled, nothing pending, nothing of the dump visible) and writable; the dump intact; the
  load that gets through gives the same store as a load that never failed, also after a
  reopen.

(Kills and power losses at the same steps are the crash matrix's: ``make crash-test``.)
"""
from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from tqstore import CheckpointError, RestorePendingError, StorageIOError, TqstoreError
from tqstore._io import failpoints as fp
from tqstore.dump import read_row_index, verify_dump
from tqstore.store import Store

from crash.model import store_state
from crash.scenarios import SEG, batch

FAULT_NAMES = ("fsync_file", "fsync_dir", "write", "create", "copy", "link", "rename", "mkdir", "rmtree", "unlink")


@pytest.fixture(autouse=True)
def _clean_failpoints():
    fp.disarm()
    yield
    fp.disarm()


def _store(path: Path, num_units=2) -> Store:
    return Store(path, num_units=num_units, segment_bytes=SEG, max_workers=2)


def _fill(s: Store, prefix: str, n: int, salt: int) -> None:
    keys = [f"{prefix}{i}" for i in range(n)]
    s.write("p", batch(keys, salt=salt, big=True), keys=keys)


def _fail_each_occurrence(name: str, action: str, call, check) -> int:
    """Fail occurrence 1, 2, ... of failpoint ``name`` in ``call()`` until one is not reached
    (the call then succeeds); ``check(exc, n)`` runs after each failure.  Returns failures.
    Anything but a TqstoreError fails the test."""
    for n in range(1, 1000):
        fp.arm(name, action, n)
        try:
            call()
        except TqstoreError as e:
            fp.disarm()
            check(e, n)
            continue
        finally:
            fp.disarm()
        return n - 1
    raise AssertionError("never got through")


def _names_the_fault(e: BaseException, action: str) -> bool:
    msg = str(e)
    return "injected" in msg or os.strerror(errno.EIO if action == "eio" else errno.ENOSPC) in msg


@pytest.mark.parametrize("action", ["eio", "enospc"])
def test_a_failed_dump_step_raises_clearly_and_keeps_a_whole_dump_and_the_store(tmp_path, action):
    dump = tmp_path / "dump"
    old_keys, new_keys = ["a0", "a1"], ["a2", "a3", "a5", "a1"]
    total = 0
    with _store(tmp_path / "s") as s:
        _fill(s, "a", 6, 1)
        live = store_state(s)
        for name in FAULT_NAMES:
            s.dump_data_by_key(dump, old_keys, "p")  # the dump a failed one must leave whole

            def check(e, n):
                assert isinstance(e, CheckpointError) and str(dump) in str(e), (name, n, repr(e))
                assert _names_the_fault(e, action), (name, n, str(e))
                assert verify_dump(dump) == [], (name, n)
                # the previous dump, or the new one if the fault came after its publication
                assert list(read_row_index(dump)["rows"]) in (old_keys, new_keys), (name, n)
                assert store_state(s) == live, (name, n)

            total += _fail_each_occurrence(name, action, lambda: s.dump_data_by_key(dump, new_keys, "p"), check)
            assert list(read_row_index(dump)["rows"]) == new_keys and verify_dump(dump) == []
            assert not [p for p in os.listdir(tmp_path) if p.endswith((".tmp", ".old"))], name
    assert total >= 15


@pytest.mark.parametrize("action", ["eio", "enospc"])
def test_a_failed_load_by_key_step_raises_clearly_and_leaves_the_store_as_it_was(tmp_path, action):
    dump = tmp_path / "dump"
    with _store(tmp_path / "src") as src:
        _fill(src, "a", 6, 1)
        src.dump_data_by_key(dump, ["a1", "a2", "a4"], "p")

    def target(path: Path) -> Store:  # a1 is there (overwritten by the load), a2 and a4 are new
        s = _store(path, num_units=3)
        _fill(s, "a", 2, 3)
        _fill(s, "live", 2, 4)
        return s

    with target(tmp_path / "ref") as ref:
        ref.load_data_by_key(dump)
        want = store_state(ref)
    marker = Path(str(dump) + ".restore")
    total = 0
    for i, name in enumerate(FAULT_NAMES):
        with target(tmp_path / f"s{i}") as s:
            before = store_state(s)

            def check(e, n):
                assert isinstance(e, (CheckpointError, StorageIOError)), (name, n, repr(e))
                assert _names_the_fault(e, action), (name, n, str(e))
                assert s.controller.restores() == [], (name, n)  # cancelled, nothing pending
                assert store_state(s) == before, (name, n)
                _fill(s, "live", 2, 4)  # still writable (same keys and values: state unchanged)
                assert verify_dump(dump) == [], (name, n)

            total += _fail_each_occurrence(name, action, lambda: s.load_data_by_key(dump), check)
            assert store_state(s) == want
            if s.controller.restores():  # settling a unit failed after the commit point: the load
                # returned (it is complete); the restore stays recorded until recover_data_load
                (r,) = s.controller.restores()
                assert r.state == "committed", name
                with pytest.raises(RestorePendingError, match="committed .*recover_data_load") as e:
                    s.kv_clear(["a2"], "p")
                assert "cancel" not in str(e.value)  # (a committed restore cannot be cancelled)
                assert s.recover_data_load(dump) is True
            assert s.controller.restores() == [] and s.verify() == [] and store_state(s) == want
        assert not marker.exists(), name  # the last load took its store off and removed it
        with Store(tmp_path / f"s{i}") as s:
            assert store_state(s) == want, name
    assert total >= 8
