"""Failpoints of the I/O layer, and what the engine does when they fire.

* the failpoint module: arming at the N-th occurrence, repeat, counting, the environment
  variable, each action (EIO, ENOSPC, short write, kill), the observer, no effect unset;
* every durable step of a put, a save and a load, failed with EIO or ENOSPC: a clear
  ``TqstoreError``, the previous checkpoint and the live store intact and usable;
* a failed fsync is never retried on the same data (PostgreSQL's fsync lesson): the file
  whose fsync failed is never fsynced again and trusted.
"""
from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tqstore import CheckpointError, StorageIOError, TqstoreError
from tqstore._io import failpoints as fp
from tqstore._io import files
from tqstore.checkpoint import verify_checkpoint
from tqstore.store import Store
from tqstore.testing import count_points, kill_points, run_forked

from crash.model import store_state
from crash.scenarios import SEG, batch
from failpoint_helpers import FAULT_NAMES, fail_each_occurrence, names_the_fault

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _clean_failpoints():
    fp.disarm()
    fp.set_observer(None)
    yield
    fp.disarm()
    fp.set_observer(None)
    if fp._counting:
        fp.stop_counting()


# ---------------------------------------------------------------------------- the module
def test_unarmed_failpoints_cost_nothing_and_change_nothing(tmp_path):
    assert not fp.active
    files.write_file_atomic(tmp_path / "f", b"x")
    assert (tmp_path / "f").read_bytes() == b"x"


def test_failpoint_fires_at_the_nth_occurrence_only(tmp_path):
    fp.arm("fsync_dir", "eio", 3)
    files.fsync_dir(tmp_path)
    files.fsync_dir(tmp_path)
    with pytest.raises(OSError) as ei:
        files.fsync_dir(tmp_path)
    assert ei.value.errno == errno.EIO and "fsync_dir" in str(ei.value)
    files.fsync_dir(tmp_path)  # not repeating


def test_repeating_failpoint_fires_from_n_on(tmp_path):
    fp.arm("mkdir", "enospc", 2, repeat=True)
    files.mkdir(tmp_path / "a")
    for name in ("b", "c"):
        with pytest.raises(OSError) as ei:
            files.mkdir(tmp_path / name)
        assert ei.value.errno == errno.ENOSPC
        assert not (tmp_path / name).exists()  # the step did not happen


def test_disarm_one_or_all():
    fp.arm("rename", "eio")
    fp.arm("link", "eio")
    fp.disarm("rename")
    assert fp.armed() == ["link"]
    fp.disarm()
    assert fp.armed() == [] and not fp.active


def test_unknown_action_is_refused():
    with pytest.raises(ValueError):
        fp.arm("write", "explode")


def test_short_write_writes_part_then_fails(tmp_path):
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    try:
        fp.arm("write", "short")
        with pytest.raises(OSError):
            files.pwrite_all(fd, [b"a" * 100], 0)
        assert 0 < os.fstat(fd).st_size < 100
    finally:
        os.close(fd)


def test_a_file_written_in_writeback_groups_fails_at_the_group_whose_write_fails(tmp_path):
    # write_buffers(writeback_bytes=N): groups of >= N bytes, each one write (a "write"
    # occurrence) whose writeback starts at once; a short third write leaves the first two
    # groups whole and part of the third, and raises
    bufs = [bytes([i]) * 300 for i in range(10)]  # groups of 4, 4 and 2 buffers
    fp.arm("write", "short", 3)
    with pytest.raises(OSError):
        files.write_buffers(tmp_path / "f", bufs, fsync=False, writeback_bytes=1000)
    data = (tmp_path / "f").read_bytes()
    assert 2400 <= len(data) < 3000 and data[:2400] == b"".join(bufs[:8])
    fp.disarm()
    counts = count_points(lambda: files.write_buffers(tmp_path / "g", bufs, writeback_bytes=1000))
    assert counts == {"create": 1, "write": 3, "fsync_file": 1}
    assert (tmp_path / "g").read_bytes() == b"".join(bufs)


def test_kill_action_exits_the_process_with_the_kill_code(tmp_path):
    res = run_forked(lambda: files.write_file(tmp_path / "f", b"data"), failpoints=[("fsync_file", "kill", 1)])
    assert res.killed and res.exitcode == fp.KILL_EXIT_CODE
    assert (tmp_path / "f").read_bytes() == b"data"  # written, killed before its fsync


def test_counting_enumerates_every_occurrence(tmp_path):
    counts = count_points(lambda: files.write_file_atomic(tmp_path / "f", b"x"))
    # (the unlink: whatever a crash, or anyone, left at the temporary name goes first)
    assert counts == {"unlink": 1, "create": 1, "write": 1, "fsync_file": 1, "rename": 1, "fsync_dir": 1}
    assert kill_points(counts, ["rename", "fsync_dir"]) == [("fsync_dir", 1), ("rename", 1)]


def test_observer_sees_every_durable_step_with_its_target(tmp_path):
    seen = []
    fp.set_observer(lambda ev, *a: seen.append((ev, a)))
    files.mkdir(tmp_path / "d")
    files.write_file(tmp_path / "d" / "f", b"x")
    files.link(tmp_path / "d" / "f", tmp_path / "d" / "g")
    files.rename(tmp_path / "d" / "g", tmp_path / "d" / "h")
    files.unlink(tmp_path / "d" / "h")
    files.fsync_dir(tmp_path / "d")
    files.rmtree(tmp_path / "d")
    assert [e for e, _ in seen] == ["mkdir", "create", "write", "fsync_file", "link", "rename", "unlink",
                                    "fsync_dir", "rmtree"]
    assert seen[-1][1] == (str(tmp_path / "d"),)


def test_failpoints_from_the_environment_variable(tmp_path):
    code = ("from tqstore._io import failpoints as fp, files\n"
            f"files.fsync_dir({str(tmp_path)!r})\n"
            f"files.fsync_dir({str(tmp_path)!r})\n")
    env = dict(os.environ, TQSTORE_FAILPOINTS="fsync_dir=kill@2;rename=eio@1")
    r = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True)
    assert r.returncode == fp.KILL_EXIT_CODE, r.stderr.decode()[-500:]


# ---------------------------------------------------------------------------- engine under I/O faults
def _store(path: Path, durability: str = "checkpoint", num_units=2) -> Store:
    return Store(path, num_units=num_units, durability=durability, segment_bytes=SEG, max_workers=1)


def _fill(s: Store, prefix: str, n: int, salt: int) -> None:
    keys = [f"{prefix}{i}" for i in range(n)]
    s.write("p", batch(keys, salt=salt, big=True), keys=keys)


def _loaded_state(tmp: Path, ck: Path) -> dict:
    with _store(tmp / "_probe") as s:
        s.load_checkpoint(ck)
        st = store_state(s)
    files.rmtree(tmp / "_probe")
    return st


def _clear_error(e: BaseException, action: str, what: str) -> None:
    assert isinstance(e, (CheckpointError, StorageIOError)), repr(e)
    msg = str(e)
    assert what in msg, msg
    assert names_the_fault(e, action), msg


@pytest.mark.parametrize("action", ["eio", "enospc"])
def test_failed_save_step_raises_clearly_and_keeps_previous_checkpoint_and_store(tmp_path, action):
    """Every occurrence of every durable step of a save replacing a checkpoint, failed in
    turn: a CheckpointError naming the checkpoint, the previous checkpoint verifies and loads,
    the live store is unchanged, no temporary directory is left, the next save works.  The
    message says whether the new checkpoint was already in place (only its durability failed)."""
    total = 0
    in_place = []  # per failure: whether the new checkpoint was in place when it was raised
    for i, name in enumerate(FAULT_NAMES):
        d = tmp_path / f"n{i}"
        ck = d / "ck"
        with _store(d / "store") as s:
            _fill(s, "a", 4, 1)
            s.save_checkpoint(ck)
            prev = store_state(s)
            _fill(s, "b", 2, 2)
            live = store_state(s)

            def check(e, n):
                _clear_error(e, action, str(ck))
                assert verify_checkpoint(ck, raise_on_error=False).ok, (name, n)
                # the checkpoint at ck is whole: the previous one, or the new one if the fault
                # came after its publication
                now = _loaded_state(d, ck)
                assert now in (prev, live), (name, n)
                assert ("the new checkpoint is in place" in str(e)) == (now == live), (name, n, str(e))
                in_place.append(now == live)
                assert store_state(s) == live, (name, n)
                assert not [p for p in os.listdir(d) if ".tmp-" in p], (name, n)

            failures = fail_each_occurrence(name, action, lambda: s.save_checkpoint(ck), check)
            total += failures
            assert _loaded_state(d, ck) == live  # the save that got through
    assert total >= 15 and not all(in_place)  # (the last step's failure: see test_failpoints_dump.py)


@pytest.mark.parametrize("units,action", [(2, "eio"), (2, "enospc"), (3, "eio"),
                                          pytest.param(3, "enospc", marks=pytest.mark.crash)])
def test_failed_load_step_raises_clearly_and_leaves_the_store_as_it_was(tmp_path, action, units):
    """Every occurrence of every durable step of a load (same unit count, and resharded onto
    3 units) failed in turn: a clear error, the store exactly as it was and writable, the
    checkpoint intact; the load that gets through gives the checkpoint's state, also after
    reopening."""
    with _store(tmp_path / "src") as src:
        _fill(src, "a", 5, 1)
        src.save_checkpoint(tmp_path / "ck")
        want = store_state(src)
    total = 0
    for i, name in enumerate(FAULT_NAMES):
        with _store(tmp_path / f"s{i}", num_units=units) as s:
            _fill(s, "live", 2, 3)
            before = store_state(s)

            def check(e, n):
                assert isinstance(e, (CheckpointError, StorageIOError)), (name, n, repr(e))
                assert store_state(s) == before, (name, n)
                _fill(s, "live", 2, 3)  # still writable (same keys and values: state unchanged)
                assert verify_checkpoint(tmp_path / "ck", raise_on_error=False).ok

            total += fail_each_occurrence(name, action, lambda: s.load_checkpoint(tmp_path / "ck"), check)
            assert store_state(s) == want
        with _store(tmp_path / f"s{i}", num_units=None) as s:
            assert store_state(s) == want
    assert total >= 8


@pytest.mark.parametrize("durability", ["checkpoint", "commit"])
def test_failed_put_step_raises_clearly_and_changes_nothing(tmp_path, durability):
    """Each occurrence of each durable step of a put (two rows overwritten, one added), failed
    in turn until the put gets through: a StorageIOError, and the store as before."""
    keys = ["a0", "a1", "n0"]
    failures = 0
    for i, name in enumerate(FAULT_NAMES):
        with _store(tmp_path / f"s{i}", durability) as s:
            _fill(s, "a", 4, 1)
            before = store_state(s)
            for n in range(1, 100):
                fp.arm(name, "eio", n)
                try:
                    s.write("p", batch(keys, salt=9), keys=keys)
                except StorageIOError as e:
                    assert "injected" in str(e) and str(s.root) in str(e), (name, n, e)
                    assert store_state(s) == before, (name, n)
                    failures += 1
                    continue
                finally:
                    fp.disarm()
                break  # occurrence n was not reached: the put went through
            after = store_state(s)
            assert after != before
        with _store(tmp_path / f"s{i}", durability, None) as s:
            assert store_state(s) == after, name
    assert failures >= (4 if durability == "commit" else 2)


@pytest.mark.parametrize("action", ["enospc", "eio"])
def test_a_failed_overwriting_put_whose_rollback_fails_too_is_never_read(tmp_path, action):
    """The disk fills during an overwriting put: a unit's index commit fails, and so does
    putting back what the put replaced on the unit that had written (that needs an index
    commit too).  Reads give the rows as before the put, never the failed put's values: while
    the disk stays full, once it has room again (nothing settled yet), after the next
    overwriting put settles it, and after a reopen."""
    keys = ["a0", "a1", "a2", "a3"]  # (rows on both units)
    with _store(tmp_path / "s") as s:
        _fill(s, "a", 4, 1)
        before = store_state(s)
        fp.arm("unit_commit", action, 2, repeat=True)  # the second unit's write, then every settle
        try:
            with pytest.raises(StorageIOError):
                s.write("p", batch(keys, salt=9), keys=keys)
            assert fp.armed() and store_state(s) == before  # (read with the disk still full)
            # nothing else is written while the rollback cannot be finished: a put of new rows or a
            # clear raises, so no row the held-back entries name is cleared or given again meanwhile
            with pytest.raises(StorageIOError):
                s.write("p", batch(["n0"], salt=3), keys=["n0"])
            with pytest.raises(StorageIOError):
                s.delete_rows("p", [0])
            assert store_state(s) == before
        finally:
            fp.disarm()
        assert store_state(s) == before
        s.write("p", batch(["a0"], salt=5), keys=["a0"])  # settles the failed one first
        after = store_state(s)
        assert after != before
    with _store(tmp_path / "s", num_units=None) as s:
        assert store_state(s) == after


# ---------------------------------------------------------------------------- no fsync retry
class FsyncLog:
    """Records the inode of every fsync attempt and of every failed one.

    An fd on each file whose fsync failed stays open (until :meth:`close`), so its inode
    cannot be freed and reused by a new file: a later fsync of that inode really is a
    retry on the same file."""

    def __init__(self, monkeypatch):
        self.attempts = []
        self.failed = []  # (dev, ino, label)
        self._held = []
        real_fd, real_file = files.fsync_fd, files.fsync_file

        def fsync_fd(fd, label=""):
            return self._call(fd, label, lambda: real_fd(fd, label))

        def fsync_file(path):
            fd = os.open(path, os.O_RDONLY)
            try:
                return self._call(fd, str(path), lambda: real_file(path))
            finally:
                os.close(fd)

        monkeypatch.setattr(files, "fsync_fd", fsync_fd)
        monkeypatch.setattr(files, "fsync_file", fsync_file)

    def _call(self, fd: int, label: str, fn):
        st = os.fstat(fd)
        key = (st.st_dev, st.st_ino, label)
        self.attempts.append(key)
        try:
            return fn()
        except OSError:
            self.failed.append(key)
            self._held.append(os.dup(fd))
            raise

    def close(self) -> None:
        for fd in self._held:
            os.close(fd)
        self._held = []

    def retried(self, start: int) -> list:
        """Failed files fsynced again by attempts from index ``start`` on."""
        later = {(d, i) for d, i, _ in self.attempts[start:]}
        return [f for f in self.failed if (f[0], f[1]) in later]


@pytest.mark.parametrize("copy_segments", [False, True])
def test_a_failed_fsync_is_never_retried_on_the_same_data_by_later_saves(tmp_path, monkeypatch, copy_segments):
    """Each fsync of a save fails in turn; the next saves never fsync that file again (they
    write the data anew), and the checkpoint they publish verifies."""
    s = _store(tmp_path / "store")
    log = FsyncLog(monkeypatch)
    try:
        _fill(s, "a", 4, 1)
        fp.start_counting()
        s.save_checkpoint(tmp_path / "probe", copy_segments=copy_segments)
        n_fsync = fp.stop_counting()["fsync_file"]
        for n in range(1, n_fsync + 1):
            fp.arm("fsync_file", "eio", n)
            with pytest.raises(TqstoreError):
                s.save_checkpoint(tmp_path / "ck", copy_segments=copy_segments)
            fp.disarm()
            assert log.failed, n
            after = len(log.attempts)
            s.save_checkpoint(tmp_path / "ck", copy_segments=copy_segments)
            _fill(s, f"x{n}_", 1, n)
            s.save_checkpoint(tmp_path / "ck", copy_segments=copy_segments)
            again = log.retried(after)
            assert not again, f"fsync #{n} failed on {again[0][2]} and a later save fsynced the same file again"
            assert verify_checkpoint(tmp_path / "ck", raise_on_error=False).ok
    finally:
        log.close()
        s.close()


def test_a_failed_segment_fsync_under_commit_durability_is_not_retried(tmp_path, monkeypatch):
    s = _store(tmp_path / "store", "commit")
    log = FsyncLog(monkeypatch)
    try:
        _fill(s, "a", 2, 1)
        before = store_state(s)
        for n in (1, 2):
            fp.arm("fsync_file", "eio", n)
            with pytest.raises(StorageIOError):
                _fill(s, "b", 2, 2)
            fp.disarm()
            assert store_state(s) == before
        after = len(log.attempts)
        _fill(s, "b", 2, 2)
        _fill(s, "c", 2, 3)
        s.save_checkpoint(tmp_path / "ck")
        again = log.retried(after)
        assert not again, f"{again[0][2]} was fsynced again after its fsync failed"
    finally:
        log.close()
        s.close()


def test_failed_background_save_reports_on_its_handle_and_on_the_next_call(tmp_path):
    ck = tmp_path / "ck"
    with _store(tmp_path / "store") as s:
        _fill(s, "a", 4, 1)
        s.save_checkpoint(ck)
        prev = store_state(s)
        _fill(s, "b", 2, 2)
        live = store_state(s)
        fp.arm("fsync_file", "eio", 2)
        h = s.save_checkpoint(ck, blocking=False)
        with pytest.raises(CheckpointError, match="ck"):
            h.result()
        fp.disarm()
        assert verify_checkpoint(ck, raise_on_error=False).ok
        fp.arm("fsync_file", "enospc", 2)
        h = s.save_checkpoint(ck, blocking=False)
        h.wait()
        fp.disarm()
        with pytest.raises(CheckpointError):  # nobody looked at the handle: the next call says it
            s.save_checkpoint(ck)
        assert _loaded_state(tmp_path, ck) == prev
        assert store_state(s) == live
        s.save_checkpoint(ck)
        assert _loaded_state(tmp_path, ck) == live


def test_where_hard_links_fail_saves_generations_and_loads_copy_instead(tmp_path):
    """Two bind mounts of one file system share ``st_dev`` but refuse hard links (EXDEV), as
    in a container whose store and checkpoints are separate volumes of one disk: a save, a
    generation reusing its predecessor's segments and a load then copy the segments, and
    every result verifies (injected: every ``link`` raises EXDEV)."""
    import torch

    from tqstore import CheckpointManager

    with Store(tmp_path / "s", num_units=2) as s:
        s.kv_batch_put([f"k{i}" for i in range(40)], "p", {"x": torch.arange(40 * 300).reshape(40, 300)})
        want = s.kv_batch_get([f"k{i}" for i in range(40)], "p")["x"]
        fp.arm("link", "exdev", repeat=True)
        s.save_checkpoint(tmp_path / "ck")
        gens = CheckpointManager(tmp_path / "g", store=s, keep_last=2)
        gens.save(1)
        s.kv_batch_put(["z"], "p", {"x": torch.zeros(1, 300, dtype=torch.int64)})
        gens.save(2)
        s.load_checkpoint(tmp_path / "ck")
        assert torch.equal(s.kv_batch_get([f"k{i}" for i in range(40)], "p")["x"], want)
        assert gens.restore() == 2 and "z" in s.kv_list("p")["p"]
        assert s.verify() == []
        fp.disarm()
    for ck in (tmp_path / "ck", gens.path(1), gens.path(2)):
        assert verify_checkpoint(ck).ok
        assert all(p.stat().st_nlink == 1 for p in ck.rglob("*.tqs"))  # copies, never links
    assert not list(tmp_path.rglob(".tqstore-link-probe-*"))


@pytest.mark.parametrize("blocking", [True, False])
def test_a_save_whose_index_copy_runs_out_of_space_raises_checkpoint_error(tmp_path, blocking):
    """The disk fills while a save copies a unit's or the controller's index: CheckpointError
    (what a save's failure is documented to raise), saying the previous checkpoint is intact."""
    with _store(tmp_path / "s") as s:
        _fill(s, "a", 4, 1)
        s.save_checkpoint(tmp_path / "ck")
        _fill(s, "b", 2, 2)
        fp.arm("copy", "enospc", 1)
        try:
            with pytest.raises(CheckpointError, match="previous checkpoint there is intact"):
                out = s.save_checkpoint(tmp_path / "ck", blocking=blocking)
                if not blocking:
                    out.result()
        finally:
            fp.disarm()
        assert verify_checkpoint(tmp_path / "ck", raise_on_error=False).ok
        s.save_checkpoint(tmp_path / "ck")


@pytest.mark.parametrize("action", ["enospc", "short"])
def test_an_atomic_replacement_that_fails_leaves_no_temporary_file(tmp_path, action):
    """A replacement whose write fails (a full disk: the store's mirror at close, a marker,
    CURRENT) removes its ``.tmp``: left there it would hold the space the failure lacked, and
    come back at every close.  The file it was to replace is as it was."""
    target = tmp_path / "f"
    target.write_bytes(b"old")
    for replace in (lambda: files.write_buffers_atomic(target, [b"new" * 1000]),
                    lambda: files.write_file_atomic(target, b"new" * 1000)):
        fp.arm("write", action, 1)
        try:
            with pytest.raises(OSError):
                replace()
        finally:
            fp.disarm()
        assert sorted(p.name for p in tmp_path.iterdir()) == ["f"] and target.read_bytes() == b"old"
    with _store(tmp_path / "s") as s:  # the mirror a clean close writes
        _fill(s, "a", 4, 1)
        fp.arm("write", action, 1, repeat=True)
        try:
            s.close()
        finally:
            fp.disarm()
    assert not list((tmp_path / "s").rglob("*.tmp"))
