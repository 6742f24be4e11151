"""A dump on read-only storage (a read-only file system, a directory this process may not
write) loads: the resume path of a trainer whose dump sits with its model checkpoint on a
read-only mount.  Nothing is created beside it (no lock file, no restore marker); an
existing lock file is still held; a load killed midway is settled by ``recover_data_load``.

The location is made read-only for real: a tmpfs mounted there and remounted read-only
(as root), or its mode bits (as any other user); the tests are skipped where neither is
possible.
"""
from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Iterator, List

import pytest

import tqstore

from checkpoint_helpers import fill, state
from restore_helpers import write_dump
from test_load_by_key import rows_of
from test_load_kill import CHILD, ROOT


class ReadOnlyDir:
    """A directory that :meth:`seal` makes read-only (see the module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.mounted = False
        path.mkdir()
        if os.geteuid() == 0:  # root writes through mode bits: a tmpfs remounted read-only
            if subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(path)], capture_output=True).returncode:
                pytest.skip("cannot mount a tmpfs here (no privilege): no read-only location to test with")
            self.mounted = True

    def seal(self) -> None:
        if self.mounted:
            subprocess.run(["mount", "-o", "remount,ro", str(self.path)], check=True, capture_output=True)
        else:
            os.chmod(self.path, 0o555)
        with pytest.raises(OSError):
            (self.path / "probe").write_bytes(b"")

    def close(self) -> None:
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.path)], capture_output=True)
        else:
            os.chmod(self.path, 0o755)


@pytest.fixture
def ro_dir(tmp_path) -> Iterator[ReadOnlyDir]:
    d = ReadOnlyDir(tmp_path / "ro")
    try:
        yield d
    finally:
        d.close()


def _names(d: Path) -> List[str]:
    return sorted(str(p.relative_to(d)) for p in d.rglob("*"))


def _dump_onto(src_store, keys, ro: ReadOnlyDir, tmp_path: Path, *, with_lock_file: bool) -> Path:
    """A dump of ``keys`` copied onto ``ro`` (as onto read-only media), then sealed."""
    made = write_dump(src_store, tmp_path / "made" / "dump", keys, "train")
    dump = ro.path / "dump"
    shutil.copytree(made, dump)
    if with_lock_file:
        (ro.path / "dump.lock").write_bytes(b"")
    ro.seal()
    return dump


@pytest.fixture
def source(tmp_path):
    with tqstore.open(tmp_path / "src", num_units=3) as s:
        keys = fill(s, "train", 10)
        yield s, keys


def test_a_dump_on_read_only_storage_loads_and_nothing_is_written_beside_it(source, ro_dir, tmp_path):
    src, keys = source
    want = rows_of(src, "train", keys[:6])
    dump = _dump_onto(src, keys[:6], ro_dir, tmp_path, with_lock_file=False)
    before = _names(ro_dir.path)
    assert tqstore.read_row_index(dump)["rows"].keys() == set(keys[:6])
    with tqstore.open(tmp_path / "target", num_units=2) as s:
        fill(s, "train", 3, prefix="other")
        bystanders = rows_of(s, "train", ["other0", "other1", "other2"])
        report = s.load_data_by_key(dump)
        assert report["keys"] == 6 and report["new_keys"] == 6
        assert rows_of(s, "train", keys[:6]) == want
        assert rows_of(s, "train", ["other0", "other1", "other2"]) == bystanders
        assert s.controller.restores() == [] and s.verify() == []
        assert s.recover_data_load(dump) is False
        again = s.load_data_by_key(dump)  # existing keys keep their rows' indexes
        assert again["existing_keys"] == 6 and rows_of(s, "train", keys[:6]) == want
    assert _names(ro_dir.path) == before  # no lock file, no marker


def test_a_read_only_dump_whose_lock_file_is_there_is_loaded_under_its_lock(source, ro_dir, tmp_path):
    src, keys = source
    want = rows_of(src, "train", keys[:4])
    dump = _dump_onto(src, keys[:4], ro_dir, tmp_path, with_lock_file=True)
    fd = os.open(ro_dir.path / "dump.lock", os.O_RDONLY)  # another process's load of the dump holds it
    fcntl.flock(fd, fcntl.LOCK_EX)
    with tqstore.open(tmp_path / "target", num_units=2) as s:
        out: list = []
        t = threading.Thread(target=lambda: out.append(s.load_data_by_key(dump)), daemon=True)
        t.start()
        t.join(1.0)
        assert t.is_alive() and s.controller.restores() == []  # waiting for the lock, nothing begun
        os.close(fd)
        t.join(60)
        assert out and out[0]["keys"] == 4
        assert rows_of(s, "train", keys[:4]) == want


@pytest.mark.parametrize("cancel", [False, True])
def test_a_load_of_a_read_only_dump_killed_midway_is_settled_by_recover(source, ro_dir, tmp_path, cancel):
    src, keys = source
    want = rows_of(src, "train", keys[:7])
    dump = _dump_onto(src, keys[:7], ro_dir, tmp_path, with_lock_file=False)
    path = tmp_path / "target"
    with tqstore.open(path, num_units=2) as s:
        fill(s, "train", 4, prefix="k", start=5, seed=3)  # k5, k6 exist: overwritten by the load
        before = state(s)
    proc = subprocess.run([sys.executable, "-c", CHILD, str(path), str(dump), "import"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == -9, (proc.returncode, proc.stdout, proc.stderr[-2000:])
    with tqstore.open(path) as s:
        (r,) = s.controller.restores()
        assert r.state == "running"
        with pytest.raises(tqstore.RestorePendingError, match="recover_data_load"):
            s.kv_clear(["k8"], "train")
        assert s.recover_data_load(dump, cancel=cancel) is True
        assert s.recover_data_load(dump, cancel=cancel) is False
        if cancel:
            assert state(s) == before
        else:
            assert rows_of(s, "train", keys[:7]) == want
        assert s.controller.restores() == [] and s.verify() == []
    assert _names(ro_dir.path) == ["dump"] + [f"dump/{n}" for n in sorted(os.listdir(dump))]
