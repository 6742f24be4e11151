"""Issue #8, "never destroy what is not ours": what a save, a generation root, a prune and a
store open may touch, symlinked targets, and readers during a replacement.

* a save replaces only a tqstore checkpoint or fills an empty directory; a file, a user's
  directory, another store, the live store are refused before anything is touched and
  stay intact byte for byte;
* nothing tqstore owns is written inside a store, a checkpoint or a generation root, and
  no store opens inside one (symlinks resolved);
* a save through a symlinked path publishes at the link's target, the link stays;
* a load or verify of a path another process re-saves in a loop always sees a complete
  checkpoint (the old or the new), and a generation root's restore never falls back
  because a generation was being replaced or pruned.
"""
from __future__ import annotations

import errno
import hashlib
import os
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from pathlib import Path
from typing import Dict

import pytest
import torch

import tqstore
from tqstore import CheckpointError, ConfigError
from tqstore._io import failpoints as fp
from tqstore._io import locks
from tqstore.checkpoint import CheckpointFallbackWarning, CheckpointManager, verify_checkpoint
from tqstore.checkpoint import target as T

from checkpoint_helpers import fill, state


@pytest.fixture(autouse=True)
def _clean_failpoints():
    yield
    fp.disarm()


@pytest.fixture
def store(tmp_path):
    with tqstore.open(tmp_path / "store", num_units=2, segment_bytes=1 << 16) as s:
        fill(s)
        yield s


def tree(root: Path) -> Dict[str, str]:
    """Every entry under ``root`` (``root`` itself included): kind and, for files, a hash of
    the bytes; symlinks by their target."""
    out: Dict[str, str] = {}
    root = Path(root)

    def one(p: Path, rel: str) -> None:
        if p.is_symlink():
            out[rel] = "link:" + os.readlink(p)
        elif p.is_dir():
            out[rel] = "dir"
            for n in sorted(os.listdir(p)):
                one(p / n, f"{rel}/{n}")
        else:
            out[rel] = "file:" + hashlib.sha256(p.read_bytes()).hexdigest()

    one(root, ".")
    return out


def user_dir(p: Path) -> Path:
    (p / "sub").mkdir(parents=True)
    (p / "notes.txt").write_text("mine\n")
    (p / "sub" / "weights.bin").write_bytes(os.urandom(4096))
    return p


# ---------------------------------------------------------------------------- 1. what a save replaces
@pytest.mark.parametrize("bad", [None, 7, b"/tmp/bytes-path", "/tmp/a\0b", ""])
def test_a_path_that_is_no_path_is_invalid_input_before_anything_is_touched(store, tmp_path, bad):
    """Checkpoint and dump calls given None, a number, bytes, an empty string or a NUL raise
    InvalidInputError (a TqstoreError), not a bare TypeError or ValueError; nothing is written."""
    before = state(store)
    calls = [lambda: store.save_checkpoint(bad), lambda: store.load_checkpoint(bad),
             lambda: store.dump_data_by_key(bad, [], "train"), lambda: store.load_data_by_key(bad),
             lambda: store.recover_data_load(bad), lambda: tqstore.read_row_index(bad),
             lambda: verify_checkpoint(bad)]
    for call in calls:
        with pytest.raises(tqstore.InvalidInputError, match="path"):
            call()
    assert state(store) == before and sorted(os.listdir(tmp_path)) == ["store"]


def test_save_refuses_a_regular_file_and_leaves_it_byte_for_byte(store, tmp_path):
    f = tmp_path / "ckpt"
    f.write_bytes(b"my results\n" * 100)
    before = tree(tmp_path / "ckpt")
    with pytest.raises(CheckpointError, match=r"ckpt.*regular file of 1100 bytes"):
        store.save_checkpoint(f)
    assert tree(f) == before
    assert sorted(os.listdir(tmp_path)) == ["ckpt", "store"]  # no lock file, no temporary directory


def test_save_refuses_a_users_directory_and_keeps_its_files(store, tmp_path):
    d = user_dir(tmp_path / "results")
    before = tree(d)
    with pytest.raises(CheckpointError, match=r"results.*a directory holding 2 entries \(notes.txt, sub\).*may "
                                              r"replace only a tqstore checkpoint or fill an empty directory"):
        store.save_checkpoint(d)
    with pytest.raises(CheckpointError, match="results"):
        store.save_checkpoint(d, blocking=False)  # refused before the cut, not on the handle
    assert tree(d) == before


def test_save_refuses_another_stores_directory_which_still_opens_with_its_rows(store, tmp_path):
    other = tmp_path / "other"
    with tqstore.open(other) as o:
        keys = fill(o, n=5, prefix="o")
        want = state(o)
    before = tree(other)
    with pytest.raises(CheckpointError, match=r"other.*tqstore store directory"):
        store.save_checkpoint(other)
    assert tree(other) == before
    with tqstore.open(other) as o:
        assert state(o) == want
        assert sorted(o.kv_list("train")["train"]) == sorted(keys)


def test_save_onto_the_live_store_root_is_refused_and_the_store_keeps_working(store, tmp_path):
    want = state(store)
    with pytest.raises(CheckpointError, match="store"):
        store.save_checkpoint(store.root)
    with pytest.raises(CheckpointError, match="store being saved"):
        store.save_checkpoint(tmp_path)  # a directory holding the live store
    assert state(store) == want
    fill(store, n=2, start=100)  # still writable
    store.close()
    with tqstore.open(tmp_path / "store") as s:
        assert len(s.kv_list("train")["train"]) == 14


def test_save_fills_an_empty_directory_and_replaces_only_a_checkpoint(store, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    store.save_checkpoint(empty)
    verify_checkpoint(empty)
    fill(store, n=3, start=50)
    store.save_checkpoint(empty)  # a checkpoint now: replaced
    assert verify_checkpoint(empty).rows == 15


def test_save_refuses_when_a_foreign_dot_old_sibling_would_be_removed(store, tmp_path):
    store.save_checkpoint(tmp_path / "ckpt")
    old = user_dir(tmp_path / "ckpt.old")
    before, ck_before = tree(old), tree(tmp_path / "ckpt")
    with pytest.raises(CheckpointError, match=r"ckpt\.old"):
        store.save_checkpoint(tmp_path / "ckpt")
    assert tree(old) == before and tree(tmp_path / "ckpt") == ck_before


def test_a_half_removed_dot_old_of_an_earlier_replacement_does_not_block_the_next_save(store, tmp_path):
    """A crash (or an error) while a replaced checkpoint's ``.old`` was being removed leaves it
    without its manifest: garbage of tqstore's own, which the next save removes."""
    ck = tmp_path / "ckpt"
    store.save_checkpoint(ck)
    store.save_checkpoint(tmp_path / "other")
    old = tmp_path / "ckpt.old"
    os.rename(tmp_path / "other", old)
    (old / "MANIFEST.json").unlink()  # what an interrupted rmtree of ckpt.old leaves
    fill(store, n=2, start=70)
    store.save_checkpoint(ck)
    assert verify_checkpoint(ck).rows == 14 and not old.exists()
    (old / "unit-000").mkdir(parents=True)
    (old / "notes.txt").write_text("mine")  # not only what a checkpoint holds: refused
    with pytest.raises(CheckpointError, match=r"ckpt\.old"):
        store.save_checkpoint(ck)
    assert (old / "notes.txt").read_text() == "mine"


def test_save_refuses_a_directory_holding_a_foreign_manifest(store, tmp_path):
    d = tmp_path / "webapp"
    d.mkdir()
    (d / "MANIFEST.json").write_text('{"name": "my app"}')
    with pytest.raises(CheckpointError, match="not a tqstore checkpoint's or dump's manifest"):
        store.save_checkpoint(d)
    assert (d / "MANIFEST.json").read_text() == '{"name": "my app"}'


def test_a_target_that_turns_foreign_during_a_background_save_is_not_replaced(store, tmp_path):
    ck = tmp_path / "ckpt"
    store.save_checkpoint(ck)
    gate = threading.Event()
    real_write = __import__("tqstore.checkpoint.writer", fromlist=["SaveJob"]).SaveJob._write

    def slow_write(self, tmp, t0):
        gate.wait(10)
        return real_write(self, tmp, t0)

    import tqstore.checkpoint.writer as W
    W.SaveJob._write = slow_write
    try:
        h = store.save_checkpoint(ck, blocking=False)
        # meanwhile the user moves the checkpoint away and puts their own directory there
        os.rename(ck, tmp_path / "moved")
        user_dir(ck)
        before = tree(ck)
        gate.set()
        with pytest.raises(CheckpointError, match="a directory holding 2 entries"):
            h.result(30)
    finally:
        W.SaveJob._write = real_write
    assert tree(ck) == before
    assert not [n for n in os.listdir(tmp_path) if ".tmp-" in n]


def test_manager_refuses_a_root_that_is_not_a_generation_root(store, tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    d = user_dir(tmp_path / "mine")
    store.save_checkpoint(tmp_path / "ckpt")
    snap = {p: tree(p) for p in (f, d, tmp_path / "ckpt", tmp_path / "store")}
    for root, what in ((f, "regular file"), (d, "directory holding 2 entries"), (tmp_path / "ckpt", "checkpoint"),
                       (tmp_path / "store", "store")):
        with pytest.raises(CheckpointError, match=what):
            CheckpointManager(root, store=store)
    assert {p: tree(p) for p in snap} == snap


def test_manager_accepts_a_missing_an_empty_and_its_own_root(store, tmp_path):
    (tmp_path / "empty").mkdir()
    for name in ("missing", "empty"):
        m = CheckpointManager(tmp_path / name, keep_last=2, store=store)
        for s in range(3):
            m.save(s)
        assert m.steps() == [1, 2]
        m2 = CheckpointManager(tmp_path / name, keep_last=2, store=store)  # its own root: accepted
        assert m2.restore() == 2
        assert sorted(os.listdir(tmp_path / name)) == [T.ROOT_LOCK_NAME, "step-0000000001", "step-0000000002"]


def test_prune_deletes_nothing_once_the_root_holds_something_foreign(store, tmp_path):
    m = CheckpointManager(tmp_path / "gens", keep_last=1, store=store)
    m.save(1)
    (tmp_path / "gens" / "README.txt").write_text("do not delete my generations\n")
    before = tree(tmp_path / "gens")
    with pytest.raises(CheckpointError, match=r"also holds 1 entry no CheckpointManager puts there \(README.txt\)"):
        m.prune()
    assert tree(tmp_path / "gens") == before
    with pytest.raises(CheckpointError, match=r"README.txt"):  # refused before its cut: nothing published
        m.save(2)
    assert m.steps() == [1] and tree(tmp_path / "gens") == before


def test_prune_leaves_a_step_directory_that_is_not_a_checkpoint(store, tmp_path):
    m = CheckpointManager(tmp_path / "gens", keep_last=1, store=store)
    m.save(1)
    bogus = tmp_path / "gens" / "step-0000000000"
    bogus.mkdir()
    (bogus / "MANIFEST.json").write_text('{"format": "something else"}')
    before = tree(bogus)
    m.save(2)
    assert tree(bogus) == before
    assert not (tmp_path / "gens" / "step-0000000001").exists()


def test_check_target_takes_a_kind_with_its_own_manifest_for_the_coming_dump(tmp_path):
    def is_dump(d: Path) -> bool:
        return (d / "DUMP.json").is_file()

    dump = T.TargetKind("dump", "a tqstore dump", is_dump)
    d = tmp_path / "dump"
    d.mkdir()
    (d / "DUMP.json").write_text("{}")
    assert T.check_target(d, dump) == d  # its own kind: may be replaced
    with pytest.raises(CheckpointError, match="may replace only a tqstore dump"):
        T.check_target(user_dir(tmp_path / "mine"), dump)
    with tqstore.open(tmp_path / "s"):
        pass
    with pytest.raises(CheckpointError, match="inside the store"):
        T.check_target(tmp_path / "s" / "dump", dump)


# ---------------------------------------------------------------------------- 2. nesting
def test_checkpoint_inside_a_store_directory_is_refused(store, tmp_path):
    with tqstore.open(tmp_path / "closed") as o:
        fill(o, n=2)
    want = state(store)
    before = tree(tmp_path / "closed")
    for p in (store.root / "ckpt", store.state_dir / "ckpt", store.root / "state-00000099",
              tmp_path / "closed" / "ckpt"):
        with pytest.raises(CheckpointError, match="inside the store"):
            store.save_checkpoint(p)
        with pytest.raises(CheckpointError, match="inside the store"):
            CheckpointManager(p, store=store)
    assert tree(tmp_path / "closed") == before
    store.close()
    with tqstore.open(tmp_path / "store") as s:
        assert state(s) == want


def test_checkpoint_inside_a_checkpoint_or_a_generation_root_is_refused(store, tmp_path):
    store.save_checkpoint(tmp_path / "ckpt")
    m = CheckpointManager(tmp_path / "gens", store=store)
    m.save(1)
    for p in (tmp_path / "ckpt" / "inner", tmp_path / "gens" / "mine", tmp_path / "gens" / "step-0000000001" / "x"):
        with pytest.raises(CheckpointError, match="inside the (checkpoint|checkpoint generation root)"):
            store.save_checkpoint(p)
    verify_checkpoint(tmp_path / "ckpt")
    assert sorted(os.listdir(tmp_path / "gens")) == [T.ROOT_LOCK_NAME, "step-0000000001"]


def test_store_is_not_opened_inside_a_checkpoint_a_generation_root_or_a_store(store, tmp_path):
    store.save_checkpoint(tmp_path / "ckpt")
    CheckpointManager(tmp_path / "gens", store=store).save(3)
    for p in (tmp_path / "ckpt" / "s", tmp_path / "gens" / "s", tmp_path / "gens" / "step-0000000004",
              tmp_path / "store" / "inner", tmp_path / "ckpt" / "unit-000" / "s"):
        with pytest.raises(ConfigError, match="refusing to open a store"):
            tqstore.open(p)
        assert not os.path.lexists(p)
    verify_checkpoint(tmp_path / "ckpt")
    verify_checkpoint(tmp_path / "gens" / "step-0000000003")


def test_nesting_is_seen_through_symlinks(store, tmp_path):
    (tmp_path / "into-store").symlink_to(store.root)
    with pytest.raises(CheckpointError, match="inside the store"):
        store.save_checkpoint(tmp_path / "into-store" / "ckpt")
    store.save_checkpoint(tmp_path / "ckpt")
    (tmp_path / "into-ckpt").symlink_to(tmp_path / "ckpt")
    with pytest.raises(ConfigError, match="inside the checkpoint"):
        tqstore.open(tmp_path / "into-ckpt" / "s")
    (tmp_path / "ckpt-link").symlink_to(store.root / "sub")  # dangling, pointing into the store
    with pytest.raises(CheckpointError, match="inside the store"):
        store.save_checkpoint(tmp_path / "ckpt-link")
    verify_checkpoint(tmp_path / "ckpt")
    assert not (store.root / "sub").exists()


# ---------------------------------------------------------------------------- 3. symlinked targets
def test_save_through_a_symlink_publishes_at_its_target_and_keeps_the_link(store, tmp_path):
    real = tmp_path / "disk2" / "ckpt"
    real.parent.mkdir()
    link = tmp_path / "ckpt"
    link.symlink_to(real)  # dangling: the first save creates the target
    info = store.save_checkpoint(link)
    assert info.path == real
    fill(store, n=4, start=200)
    want = state(store)
    store.save_checkpoint(link)  # replaces the checkpoint at the target
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert verify_checkpoint(real).rows == 16
    assert sorted(os.listdir(real.parent)) == [".ckpt.lock", "ckpt"]
    with tqstore.open(tmp_path / "s2", num_units=2) as s2:
        s2.load_checkpoint(link)
        assert state(s2) == want


def test_manager_root_through_a_symlink(store, tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "gens").symlink_to(tmp_path / "real")
    m = CheckpointManager(tmp_path / "gens", keep_last=1, store=store)
    m.save(1)
    m.save(2)
    assert (tmp_path / "gens").is_symlink()
    assert sorted(os.listdir(tmp_path / "real")) == [T.ROOT_LOCK_NAME, "step-0000000002"]
    assert m.restore() == 2


# ---------------------------------------------------------------------------- 4. readers during replacement
_WRITER = textwrap.dedent("""
    import sys, torch, tqstore
    from tqstore.checkpoint import CheckpointManager
    store_dir, target, mode, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    with tqstore.open(store_dir, num_units=2, segment_bytes=1 << 16) as s:
        m = CheckpointManager(target, keep_last=1, store=s) if mode == "root" else None
        keys = [f"k{i}" for i in range(16)]
        for i in range(rounds):
            s.kv_batch_put(keys, "p", {"x": torch.full((16, 64), i, dtype=torch.int64)}, tags=[{"i": i}] * 16)
            if m is None:
                s.save_checkpoint(target, metadata={"i": i})
            else:
                m.save(i, metadata={"i": i})
            print(i, flush=True)
""")


def _start_writer(tmp_path: Path, target: Path, mode: str, rounds: int) -> subprocess.Popen:
    script = tmp_path / "writer.py"
    script.write_text(_WRITER)
    env = dict(os.environ, PYTHONPATH=str(Path(tqstore.__file__).parent.parent))
    return subprocess.Popen([sys.executable, str(script), str(tmp_path / "wstore"), str(target), mode, str(rounds)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _assert_complete(s, i: int) -> None:
    """The store holds exactly the checkpoint of round ``i``: every row's payload says ``i``."""
    got = s.kv_batch_get([f"k{j}" for j in range(16)], "p")
    assert torch.equal(got["x"], torch.full((16, 64), i, dtype=torch.int64)), f"a torn mix of rounds (want {i})"


def _wait_first(proc: subprocess.Popen) -> None:
    line = proc.stdout.readline()
    assert line.strip() == "0", proc.stderr.read()


def test_loads_of_a_path_another_process_resaves_always_see_a_complete_checkpoint(tmp_path):
    ck = tmp_path / "ckpt"
    proc = _start_writer(tmp_path, ck, "path", 12)
    loads = 0
    try:
        _wait_first(proc)
        with tqstore.open(tmp_path / "reader", num_units=2) as r:
            while proc.poll() is None or loads < 5:
                info = r.load_checkpoint(ck)  # raises CorruptionError on a torn read
                _assert_complete(r, info.metadata["i"])
                assert verify_checkpoint(ck).ok
                loads += 1
    finally:
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert loads >= 5, loads


def test_restore_of_a_root_another_process_saves_and_prunes_never_falls_back(tmp_path):
    root = tmp_path / "gens"
    proc = _start_writer(tmp_path, root, "root", 10)
    restores = 0
    try:
        _wait_first(proc)
        with tqstore.open(tmp_path / "reader", num_units=2) as r:
            m = CheckpointManager(root, store=r)
            with warnings.catch_warnings():
                warnings.simplefilter("error", CheckpointFallbackWarning)
                while proc.poll() is None or restores < 5:
                    step = m.restore()
                    _assert_complete(r, step)
                    assert m.verify().ok
                    restores += 1
    finally:
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert restores >= 5, restores


def test_own_background_save_then_load_or_restore_does_not_deadlock(store, tmp_path):
    ck = tmp_path / "ckpt"
    store.save_checkpoint(ck)
    m = CheckpointManager(tmp_path / "gens", store=store)
    m.save(1)
    done = []

    def body():
        store.save_checkpoint(ck, blocking=False)
        store.load_checkpoint(ck)
        m.save(2, blocking=False)
        done.append(m.restore())

    t = threading.Thread(target=body, daemon=True)
    t.start()
    t.join(60)
    assert done == [2], "a load or restore waited for its own store's background save forever"


def test_a_cleaner_leaves_the_temporary_directory_of_a_running_save(store, tmp_path):
    tmp = tmp_path / "ckpt.tmp-0123abcd"
    (tmp / "unit-000").mkdir(parents=True)
    (tmp / "unit-000" / "partial").write_bytes(b"x")
    mark = locks.hold_dir(tmp)
    try:
        store.save_checkpoint(tmp_path / "ckpt")
        assert (tmp / "unit-000" / "partial").exists()  # another save is still writing it
    finally:
        locks.release_dir(mark)
    store.save_checkpoint(tmp_path / "ckpt")  # its writer is gone: debris, removed
    assert not tmp.exists()


def test_load_in_a_read_only_directory_goes_on_without_the_lock(store, tmp_path, monkeypatch):
    ck = tmp_path / "ro" / "ckpt"
    store.save_checkpoint(ck)
    (tmp_path / "ro" / ".ckpt.lock").unlink()
    want = state(store)
    real_open = os.open

    def ro_open(path, flags, *a, **kw):  # the directory is read-only: no file can be created in it
        if str(path).startswith(str(tmp_path / "ro")) and flags & os.O_CREAT:
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_open(path, flags, *a, **kw)

    with tqstore.open(tmp_path / "s2", num_units=2) as s2:
        monkeypatch.setattr(os, "open", ro_open)
        s2.load_checkpoint(ck)
        assert verify_checkpoint(ck).ok
        monkeypatch.setattr(os, "open", real_open)
        assert state(s2) == want
    assert not (tmp_path / "ro" / ".ckpt.lock").exists()


def test_a_failing_lock_open_fails_the_save_or_load_and_changes_nothing(store, tmp_path):
    ck = tmp_path / "ckpt"
    store.save_checkpoint(ck)
    before = tree(ck)
    fill(store, n=2, start=300)
    fp.arm(locks.LOCK_OPEN, "eio")
    with pytest.raises(CheckpointError, match="injected EIO"):
        store.save_checkpoint(ck)
    assert tree(ck) == before
    assert not [n for n in os.listdir(tmp_path) if ".tmp-" in n]
    want = state(store)
    fp.arm(locks.LOCK_OPEN, "eio")
    with pytest.raises(CheckpointError, match="read lock"):
        store.load_checkpoint(ck)
    assert state(store) == want


def test_loading_a_missing_checkpoint_leaves_no_lock_file_behind(store, tmp_path):
    with pytest.raises(tqstore.CheckpointNotFoundError):
        store.load_checkpoint(tmp_path / "nothing")
    with pytest.raises(tqstore.CheckpointNotFoundError):
        verify_checkpoint(tmp_path / "nothing")
    assert sorted(os.listdir(tmp_path)) == ["store"]


# ---------------------------------------------------------------------------- 5. names beside a checkpoint
def test_a_save_removes_only_the_temporary_directories_of_its_own_interrupted_saves(tmp_path):
    """The cleanup of interrupted saves to ``<name>`` takes only ``<name>.tmp-XXXXXXXX``
    directories (8 hex digits) holding nothing but what a save writes: the live store named
    like one, a user's directory or file of a similar name, and a symbolic link stay, and
    the save goes on."""
    d = tmp_path / "d"
    d.mkdir()
    with tqstore.open(d / "ckpt.tmp-live", num_units=2, segment_bytes=1 << 16) as s:
        fill(s)
        want = state(s)
        user_dir(d / "ckpt.tmp-mine")
        user_dir(d / "ckpt.tmp-0badcafe")
        (d / "ckpt.tmp-notes.txt").write_text("mine")
        (d / "ckpt.tmp-1234abcd").symlink_to(d / "ckpt.tmp-mine")
        left = d / "ckpt.tmp-0123abcd"  # what a killed save leaves
        (left / "controller").mkdir(parents=True)
        (left / "unit-000").mkdir()
        before = {n: tree(d / n) for n in os.listdir(d) if n != left.name and not n.startswith("ckpt.tmp-live")}
        s.save_checkpoint(d / "ckpt")
        assert not left.exists()
        assert {n: tree(d / n) for n in before} == before
        assert state(s) == want
    with tqstore.open(d / "ckpt.tmp-live") as s:
        assert state(s) == want
    assert verify_checkpoint(d / "ckpt").ok


def test_save_load_and_verify_resolve_a_path_alike(store, tmp_path):
    """``link/../ckpt``, with ``link`` a symbolic link to a directory elsewhere, names the same
    checkpoint for a save, a verify and a load (symlinks resolved first, then ``..``), not
    another one that sits at the path read without resolving the link."""
    (tmp_path / "runs" / "r1").mkdir(parents=True)
    (tmp_path / "cur").symlink_to(tmp_path / "runs" / "r1")
    store.save_checkpoint(tmp_path / "ckpt", metadata={"which": "decoy"})
    p = f"{tmp_path}/cur/../ckpt"
    info = store.save_checkpoint(p, metadata={"which": "saved"})
    assert Path(info.path) == tmp_path / "runs" / "ckpt"
    assert verify_checkpoint(p).path == info.path
    assert store.load_checkpoint(p).metadata == {"which": "saved"}
    m = CheckpointManager(f"{tmp_path}/cur/../gens", keep_last=1)
    assert m.root == tmp_path / "runs" / "gens" and (tmp_path / "runs" / "gens").is_dir()
    assert not (tmp_path / "gens").exists()


def test_a_checkpoint_named_like_a_generation_roots_lock_leaves_its_parent_an_ordinary_directory(store, tmp_path):
    """A checkpoint named ``tqstore-checkpoints`` takes a lock file that is not the mark of a
    generation root: saved, verified and loaded, it leaves its parent as it was, and the
    store beside it reopens."""
    d = tmp_path / "d"
    with tqstore.open(d / "store", num_units=2, segment_bytes=1 << 16) as s:
        fill(s)
        want = state(s)
        s.save_checkpoint(d / "tqstore-checkpoints")
        assert verify_checkpoint(d / "tqstore-checkpoints").ok
        s.load_checkpoint(d / "tqstore-checkpoints")
        s.save_checkpoint(d / "again")
        assert state(s) == want
    assert not (d / T.ROOT_LOCK_NAME).exists() and not T.is_generation_root(d)
    with tqstore.open(d / "store") as s:
        assert state(s) == want


def test_a_symbolic_link_in_a_generation_root_is_never_renamed_or_pruned(store, tmp_path):
    """A user's symbolic link named like a generation makes the root foreign: a prune deletes
    nothing and renames nothing (the link and what it points to stay), and says why."""
    store.save_checkpoint(tmp_path / "imported")
    m = CheckpointManager(tmp_path / "root", keep_last=1, store=store)
    m.save(1)
    (tmp_path / "root" / "step-0000000000").symlink_to(tmp_path / "imported")
    before = tree(tmp_path / "root")
    with pytest.raises(CheckpointError, match="step-0000000000"):
        m.prune()
    assert tree(tmp_path / "root") == before
    assert verify_checkpoint(tmp_path / "imported").ok


@pytest.mark.parametrize("make", [
    lambda root: CheckpointManager(root, keep_last=0),
    lambda root: CheckpointManager(root, keep_last=1.5),
    lambda root: CheckpointManager(None),
    lambda root: CheckpointManager(root, policy=tqstore.checkpoint.KeepEvery(0)),
])
def test_bad_manager_arguments_are_invalid_input_and_create_nothing(tmp_path, make):
    with pytest.raises(tqstore.InvalidInputError):
        make(tmp_path / "root")
    assert not (tmp_path / "root").exists()


def test_metadata_json_cannot_carry_is_refused_before_the_cut(store, tmp_path):
    """An integer of more digits than JSON readers take (4300) in the metadata: InvalidInputError
    before anything is cut or written (no directory, no lock file)."""
    before = sorted(os.listdir(tmp_path))
    for blocking in (True, False):
        with pytest.raises(tqstore.InvalidInputError, match="metadata"):
            store.save_checkpoint(tmp_path / "ck", metadata={"big": [10 ** 4300]}, blocking=blocking)
        assert sorted(os.listdir(tmp_path)) == before
    store.save_checkpoint(tmp_path / "ck", metadata={"big": 10 ** 4299})
    assert tqstore.checkpoint.read_manifest(tmp_path / "ck").metadata == {"big": 10 ** 4299}


@pytest.mark.parametrize("what", ["save", "dump"])
def test_a_save_or_dump_racing_another_process_publishing_there_waits_instead_of_refusing(store, tmp_path,
                                                                                         monkeypatch, what):
    """Two processes saving (or dumping) to one path: the target check before the cut ran
    outside the path's lock and met the other's publication half-way (the path renamed to
    ``.old`` between its ``lstat`` and ``listdir``): "cannot be listed ... move it away",
    1 to 3 saves in 500.  A refusal is checked again under the lock, once that publication ended."""
    from tqstore.dump import publish as P

    ck = tmp_path / "ck"
    rows = fill(store, n=4)
    publish = (lambda p: store.save_checkpoint(p)) if what == "save" else \
        (lambda p: store.dump_data_by_key(p, rows, "train"))
    publish(ck)
    publish(tmp_path / "next")
    lock = T.lock_path_for(ck) if what == "save" else P.lock_path(ck)
    held = locks.lock_exclusive_nowait(lock)  # the other process, publishing "next" at ck
    real_listdir, raced = os.listdir, []

    def listdir(p="."):
        if not raced and os.fspath(p) == str(ck):  # its rename lands between our lstat and listdir
            raced.append(1)
            os.rename(ck, tmp_path / "ck.old")
        return real_listdir(p)

    def finish():
        time.sleep(0.3)
        os.rename(tmp_path / "next", ck)
        tqstore._io.files.rmtree(tmp_path / "ck.old")
        locks.unlock(held)

    monkeypatch.setattr(os, "listdir", listdir)
    t = threading.Thread(target=finish)
    t.start()
    try:
        publish(ck)
    finally:
        t.join()
    assert raced and not (tmp_path / "ck.old").exists()
    if what == "save":
        assert verify_checkpoint(ck).ok
    else:
        assert sorted(tqstore.read_row_index(ck)["rows"]) == sorted(rows)
