"""Every durable step of a dump by key and of a load by key, failed with EIO or ENOSPC in
turn (each occurrence of each failpoint of the I/O layer, until the call gets through):

* a dump raises a clear ``CheckpointError`` naming the path; the dump at the path is whole
  (the previous one, or the new one when the fault came after its publication) and the live
  store is unchanged;
* a load raises a clear ``TqstoreError``; the store is exactly as it was (the restore
  cancelled, nothing pending, nothing of the dump visible) and writable; the dump intact; the
  load that gets through gives the same store as a load that never failed, also after a
  reopen;
* a ``recover_data_load`` of a pending restore (completing or cancelling) raises a clear error
  and leaves the restore pending or settled, never half-applied; the one that gets through
  settles it.

(Kills and power losses at the same steps are the crash matrix's: ``make crash-test``.)
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from tqstore import CheckpointError, RestorePendingError, StorageIOError
from tqstore._io import failpoints as fp
from tqstore.dump import read_row_index, verify_dump
from tqstore.store import Store

from crash.model import store_state
from crash.scenarios import SEG, batch
from checkpoint_helpers import open_files_under
from failpoint_helpers import FAULT_NAMES, fail_each_occurrence, names_the_fault

@pytest.fixture(autouse=True)
def _clean_failpoints():
    fp.disarm()
    yield
    fp.disarm()


def _store(path: Path, num_units=2, durability: str = "checkpoint") -> Store:
    return Store(path, num_units=num_units, durability=durability, segment_bytes=SEG, max_workers=2)


def _fill(s: Store, prefix: str, n: int, salt: int) -> None:
    keys = [f"{prefix}{i}" for i in range(n)]
    s.write("p", batch(keys, salt=salt, big=True), keys=keys)


def _dump(s: Store, path: Path, keys, *, blocking: bool):
    """A dump; in the background, the caller waits for its handle (where its error is raised)."""
    out = s.dump_data_by_key(path, keys, "p", blocking=blocking)
    return out if blocking else out.result()


@pytest.mark.parametrize("action,blocking", [("eio", True), ("enospc", True), ("eio", False)])
def test_a_failed_dump_step_raises_clearly_and_keeps_a_whole_dump_and_the_store(tmp_path, action, blocking):
    dump = tmp_path / "dump"
    old_keys, new_keys = ["a0", "a1"], ["a1", "a2", "a3", "a5"]  # (in the partition's insertion order)
    total = 0
    in_place = []  # per failure: whether the new dump was in place when it was raised
    with _store(tmp_path / "s") as s:
        _fill(s, "a", 6, 1)
        live = store_state(s)
        for name in FAULT_NAMES:
            s.dump_data_by_key(dump, old_keys, "p")  # the dump a failed one must leave whole

            def check(e, n):
                assert isinstance(e, CheckpointError) and str(dump) in str(e), (name, n, repr(e))
                assert names_the_fault(e, action), (name, n, str(e))
                assert verify_dump(dump) == [], (name, n)
                # the previous dump, or the new one if the fault came after its publication, and
                # the message says which
                now = list(read_row_index(dump)["rows"])
                assert now in (old_keys, new_keys), (name, n)
                assert ("the new dump is in place" in str(e)) == (now == new_keys), (name, n, str(e))
                in_place.append(now == new_keys)
                assert store_state(s) == live, (name, n)

            total += fail_each_occurrence(name, action, lambda: _dump(s, dump, new_keys, blocking=blocking), check)
            assert list(read_row_index(dump)["rows"]) == new_keys and verify_dump(dump) == []
            assert not [p for p in os.listdir(tmp_path) if p.endswith((".tmp", ".old"))], name
    assert total >= 15 and any(in_place) and not all(in_place)


def _source_dump(tmp_path: Path) -> Path:
    dump = tmp_path / "dump"
    with _store(tmp_path / "src") as src:
        _fill(src, "a", 6, 1)
        src.dump_data_by_key(dump, ["a1", "a2", "a4"], "p")
    return dump


def _target(path: Path, durability: str = "checkpoint") -> Store:
    """A running store the dump loads into: a1 is there (overwritten), a2 and a4 are new."""
    s = _store(path, num_units=3, durability=durability)
    _fill(s, "a", 2, 3)
    _fill(s, "live", 2, 4)
    return s


@pytest.mark.parametrize("action,durability", [("eio", "checkpoint"), ("enospc", "checkpoint"), ("eio", "commit")])
def test_a_failed_load_by_key_step_raises_clearly_and_leaves_the_store_as_it_was(tmp_path, action, durability):
    dump = _source_dump(tmp_path)

    def target(path: Path) -> Store:
        return _target(path, durability)

    with target(tmp_path / "ref") as ref:
        ref.load_data_by_key(dump)
        want = store_state(ref)
    marker = Path(str(dump) + ".restore")
    total = 0
    for i, name in enumerate(FAULT_NAMES + ("segment_create",)):  # (+ the new segments the units' appends open)
        with target(tmp_path / f"s{i}") as s:
            before = store_state(s)

            def check(e, n):
                assert isinstance(e, (CheckpointError, StorageIOError)), (name, n, repr(e))
                assert names_the_fault(e, action), (name, n, str(e))
                assert s.controller.restores() == [], (name, n)  # cancelled, nothing pending
                assert store_state(s) == before, (name, n)
                _fill(s, "live", 2, 4)  # still writable (same keys and values: state unchanged)
                assert verify_dump(dump) == [], (name, n)

            total += fail_each_occurrence(name, action, lambda: s.load_data_by_key(dump), check)
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
    assert total >= 10


def _leave_pending(s: Store, dump: Path, monkeypatch) -> None:
    """Load ``dump`` into ``s`` so that it stops after its first unit completed and cannot be
    cancelled: the restore stays pending, as after a crash."""
    from tqstore.dump import restore as R

    real, calls = s.controller.complete_restore, []

    def complete(rid, u, attempt):
        real(rid, u, attempt)
        calls.append(u)
        if len(calls) == 1:
            raise StorageIOError("unit gone")

    def no_cancel(store, info):
        raise StorageIOError("cancel failed")
    with monkeypatch.context() as m:
        m.setattr(s.controller, "complete_restore", complete)
        m.setattr(R, "_cancel", no_cancel)
        with pytest.raises(StorageIOError, match="unit gone"):
            s.load_data_by_key(dump)
    assert [r.state for r in s.controller.restores()] == ["running"]


@pytest.mark.parametrize("cancel", [False, True])
def test_a_failed_recover_step_raises_clearly_and_leaves_the_restore_pending(tmp_path, monkeypatch, cancel):
    """Each durable step of ``recover_data_load`` (completing, or cancelling) failed in turn: a
    clear error, and the store either still pending (its rows the old ones) or settled; the
    recover that gets through settles it: the dump's rows, or the store as before the load."""
    dump = _source_dump(tmp_path)
    with _target(tmp_path / "ref") as ref:
        before = store_state(ref)
        ref.load_data_by_key(dump)
        loaded = store_state(ref)
    want = before if cancel else loaded
    total = 0
    for i, name in enumerate(FAULT_NAMES):
        with _target(tmp_path / f"s{i}") as s:
            _leave_pending(s, dump, monkeypatch)

            def check(e, n):
                assert isinstance(e, (CheckpointError, StorageIOError)), (name, n, repr(e))
                assert names_the_fault(e, action="eio"), (name, n, str(e))
                states = [r.state for r in s.controller.restores()]
                assert states in (["running"], ["committed"], ["cancelled"], []), (name, n, states)
                assert store_state(s) == (loaded if states in (["committed"], []) and not cancel else before), \
                    (name, n, states)

            total += fail_each_occurrence(name, "eio", lambda: s.recover_data_load(dump, cancel=cancel), check)
            if s.controller.restores():  # (settling failed after the decision: settled by one more recover)
                assert s.recover_data_load(dump) is True
            assert s.controller.restores() == [] and store_state(s) == want and s.verify() == []
            assert s.recover_data_load(dump, cancel=cancel) is False  # safe to repeat
        with Store(tmp_path / f"s{i}") as s:
            assert store_state(s) == want, name
    assert total >= 1


@pytest.mark.parametrize("name", ["rename", "fsync_dir", "rmtree"])
def test_a_failed_repair_of_an_interrupted_publication_raises_clearly_and_is_repaired_next_time(tmp_path, name):
    """A replacement interrupted between its renames left ``<dir>.old`` (and no ``<dir>``) and
    a half-written ``<dir>.tmp``: the next access repairs both; when the repair's I/O fails,
    the call (a load, a read of the row index, a dump) raises a CheckpointError naming the
    dump, and the access after it repairs and works."""
    dump = _source_dump(tmp_path)
    with _target(tmp_path / "t") as t:
        before = store_state(t)
        for call in (lambda: t.load_data_by_key(dump), lambda: read_row_index(dump),
                     lambda: t.dump_data_by_key(dump, ["a0"], "p")):
            os.rename(dump, str(dump) + ".old")
            os.mkdir(str(dump) + ".tmp")  # (an empty one: what a dump that just began leaves)
            fp.arm(name, "eio", 1)
            try:
                with pytest.raises(CheckpointError, match="repairing the interrupted publication") as e:
                    call()
            finally:
                fp.disarm()
            assert str(dump) in str(e.value) and names_the_fault(e.value, "eio")
            assert store_state(t) == before and t.controller.restores() == []
            assert list(read_row_index(dump)["rows"]) == ["a1", "a2", "a4"] and verify_dump(dump) == []
            assert not os.path.lexists(str(dump) + ".old") and not os.path.lexists(str(dump) + ".tmp")


@pytest.mark.parametrize("what", ["dump", "checkpoint"])
def test_a_publication_whose_last_fsync_fails_says_the_new_one_is_in_place(tmp_path, what):
    """The fsync that makes the replacing rename durable fails (the last durable step of a
    dump or a checkpoint save): the new one is at the path already, and the error says so
    (not that the previous one is intact); the next access cleans up and it verifies."""
    from tqstore.checkpoint import verify_checkpoint
    target = tmp_path / what
    with _store(tmp_path / "s") as s:
        _fill(s, "a", 4, 1)

        def save(keys):
            if what == "dump":
                s.dump_data_by_key(target, keys, "p")
            else:
                s.save_checkpoint(target)
        save(["a0"])
        save(["a0"])  # a replacement, counted: its last fsync_dir is the publication's
        fp.start_counting()
        save(["a0"])
        last = fp.stop_counting()["fsync_dir"]
        fp.arm("fsync_dir", "eio", last)
        with pytest.raises(CheckpointError, match=f"the new {what} is in place, but making it durable failed"):
            save(["a1", "a2"])
        fp.disarm()
        if what == "dump":
            assert list(read_row_index(target)["rows"]) == ["a1", "a2"] and verify_dump(target) == []
        else:
            assert verify_checkpoint(target, raise_on_error=False).ok
        save(["a3"])
    assert not os.path.lexists(str(target) + ".old")


def test_a_load_that_cannot_undo_its_writes_stays_cancelled_and_recover_says_so(tmp_path, caplog):
    """The disk fills during a load by key: a unit's import fails, the load cancels the restore
    in the controller, and the units cannot drop what they wrote.  The error's note says the
    restore was cancelled (not that it may be completed); recover_data_load() then finishes the
    cancel with a warning (none of its keys were loaded) and the dump loads again."""
    with _store(tmp_path / "src") as src:
        _fill(src, "k", 6, 1)
        src.dump_data_by_key(tmp_path / "dump", [f"k{i}" for i in range(6)], "p")
    with _store(tmp_path / "s") as s:
        _fill(s, "a", 2, 2)
        before = store_state(s)
        fp.arm("unit_commit", "enospc", 1, repeat=True)  # the first import's commit, then every settle
        try:
            with pytest.raises(StorageIOError) as e:
                s.load_data_by_key(tmp_path / "dump")
        finally:
            fp.disarm()
        note = " ".join(getattr(e.value, "__notes__", []))
        assert "it was cancelled" in note and "load the dump again" in note, note
        assert [r.state for r in s.controller.restores()] == ["cancelled"]
        assert store_state(s) == before
        with caplog.at_level("WARNING", logger="tqstore"):
            assert s.recover_data_load(tmp_path / "dump") is True
        assert "finishing the cancel instead of completing it" in caplog.text
        assert store_state(s) == before and not s.controller.restores()
        assert s.load_data_by_key(tmp_path / "dump")["keys"] == 6


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_a_failed_dump_leaves_no_segment_open_or_mapped_after_close(tmp_path):
    """A dump whose shard write fails (a full disk): the error (kept by the caller, with its
    traceback) must not keep the store's segment files open and mapped after the store
    closes, or their space is not returned when they are deleted."""
    s = _store(tmp_path / "s")
    _fill(s, "a", 8, 1)
    fp.arm("write", "enospc", 1, repeat=True)
    try:
        with pytest.raises(CheckpointError) as e:
            s.dump_data_by_key(tmp_path / "dump", [f"a{i}" for i in range(8)], "p")
    finally:
        fp.disarm()
    s.close()
    assert e.value.__traceback__ is not None  # (the error is still held)
    assert open_files_under(tmp_path / "s", mapped=True) == []
