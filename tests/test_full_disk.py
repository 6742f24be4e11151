"""A full file system, for real: a small tmpfs mounted for the test (root only; skipped where
mounting is not allowed).  Creating a store or loading a checkpoint on it raises a tqstore
error (LMDB's lock file, sized with ftruncate and written through a shared mapping, ended
the process with SIGBUS); a put that fails for want of space gives its space back and leaves
no segment file behind (each retry left one more, and the tail it wrote stayed until a
reopen); every acknowledged row reads back."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import numpy as np
import pytest

import tqstore

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def small_fs(tmp_path):
    mnt = tmp_path / "fs"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small file system needs root")
    got = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mnt)], capture_output=True)
    if got.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {got.stderr.decode(errors='replace').strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _fill(mnt: Path, leave: int) -> Path:
    """Fill ``mnt`` until ``leave`` bytes are free; the filler file's path."""
    filler = mnt / f"filler-{uuid.uuid4().hex}"
    st = os.statvfs(mnt)
    left = st.f_bavail * st.f_frsize - leave
    with open(filler, "wb") as f:
        try:
            while left > 0:
                left -= f.write(b"\0" * min(left, 1 << 20))
                f.flush()
        except OSError:
            pass
    return filler


def _free(mnt: Path) -> int:
    st = os.statvfs(mnt)
    return st.f_bavail * st.f_frsize


_CREATE = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, {root!r})
    import tqstore
    try:
        tqstore.open({path!r}, num_units=2).close()
        print("opened")
    except tqstore.TqstoreError as e:
        print("refused", type(e).__name__)
""")


@pytest.mark.parametrize("leave", [8192, 20480, 28672, 49152])
def test_creating_a_store_on_a_full_file_system_raises_and_never_ends_the_process(small_fs, leave):
    filler = _fill(small_fs, leave)
    code = _CREATE.format(root=str(ROOT), path=str(small_fs / "store"))
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert got.returncode == 0, f"the process ended with {got.returncode}: {got.stderr[-2000:]}"
    assert got.stdout.split() in (["opened"], ["refused", "StorageIOError"]), got.stdout + got.stderr[-2000:]
    os.unlink(filler)
    with tqstore.open(small_fs / "store", num_units=2) as s:  # what was left behind opens once there is room
        s.kv_batch_put(["a"], "p", fields={"x": np.arange(4)[None]})


def test_a_put_that_runs_out_of_space_gives_its_space_back_and_leaves_no_file(small_fs):
    with tqstore.open(small_fs / "store", num_units=1) as s:
        s.kv_batch_put(["a"], "p", fields={"x": np.arange(1000, dtype=np.int32)[None]})
        unit = next(small_fs.glob("store/state-*/unit-000"))
        filler = _fill(small_fs, 8 << 20)
        before = _free(small_fs)
        for i in range(6):  # a trainer retrying a batch too large for what is left
            with pytest.raises(tqstore.StorageIOError, match="No space left"):
                s.kv_batch_put([f"big{i}"], "p", fields={"x": np.zeros((1, 3 << 20), np.int32)})
            assert _free(small_fs) >= before - (256 << 10), "the failed put kept the space it had written"
        segs = sorted(p.name for p in unit.glob("seg-*.tqs"))
        assert len(segs) <= 2, f"failed puts left segment files behind: {segs}"
        s.kv_batch_put(["b"], "p", fields={"x": np.ones((1, 1 << 20), np.int32)})  # fits in what was given back
        os.unlink(filler)
        assert s.kv_batch_get(["a", "b"], "p")["x"][1].sum() == 1 << 20
    with tqstore.open(small_fs / "store") as s:
        assert sorted(s.kv_list()["p"]) == ["a", "b"]
