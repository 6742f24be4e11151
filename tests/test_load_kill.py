"""kill -9 during load_data_by_key: after the reopen the restore is settled or pending, never half.

A child process (forked from tests/forkrun.py's server) loads a dump into a store and kills itself with SIGKILL at one step of the
load: after its first unit completed its import, after every unit published (before the
controller's commit), or after the controller's commit (before the units settled).  The
parent reopens the store: a committed restore was settled by the open (the rows are there);
an uncommitted one is pending (the live rows are the old ones, RestorePendingError guards
the partition) and ``recover_data_load`` completes it or cancels it, in both cases leaving
a store that verifies, and answers False when asked again.
"""
from __future__ import annotations

import shutil
import sys
import textwrap
from pathlib import Path

import pytest

import tqstore
from tqstore import RestorePendingError

from checkpoint_helpers import fill, state
from restore_helpers import write_dump
from test_load_by_key import rows_of

ROOT = Path(__file__).resolve().parents[1]

CHILD = textwrap.dedent(r"""
    import os, signal, sys
    import tqstore
    from tqstore.dump import restore as R
    store_path, dump, point = sys.argv[1], sys.argv[2], sys.argv[3]
    s = tqstore.open(store_path)
    die = lambda: os.kill(os.getpid(), signal.SIGKILL)
    c = s.controller
    if point == "import":
        real = c.complete_restore
        def complete(rid, u, attempt):
            real(rid, u, attempt)
            die()
        c.complete_restore = complete
    elif point == "publish":
        real = c.finish_restore
        c.finish_restore = lambda rid: die()
    elif point == "finish":
        real = c.finish_restore
        def finish(rid):
            real(rid)
            die()
        c.finish_restore = finish
    s.load_data_by_key(dump)
    print("finished without dying", flush=True)
""")


@pytest.fixture(scope="module")
def killed(tmp_path_factory, forkrun):
    """For each kill point: the store directory as the killed child left it, the dump, the
    rows the dump holds and the store's state before the load."""
    base = tmp_path_factory.mktemp("load-kill")
    with tqstore.open(base / "src", num_units=3) as src:
        keys = fill(src, "train", 10)
        dump = write_dump(src, base / "dump", keys[:7], "train")
        want = rows_of(src, "train", keys[:7])
    out = {}
    for point in ("import", "publish", "finish"):
        path = base / f"store-{point}"
        with tqstore.open(path, num_units=2) as s:
            fill(s, "train", 4, prefix="k", start=5, seed=3)  # k5, k6 exist: overwritten by the load
            before = state(s)
        proc = forkrun.run("code", CHILD, [path, dump, point], cwd=ROOT, timeout=300)
        assert proc.returncode == -9, (proc.returncode, proc.stdout, proc.stderr[-2000:])
        out[point] = (path, before)
    return out, dump, want, keys[:7]


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    (dst / "LOCK").unlink(missing_ok=True)
    return dst


@pytest.mark.parametrize("point", ["import", "publish"])
@pytest.mark.parametrize("cancel", [False, True])
def test_a_load_killed_before_its_commit_is_pending_and_recover_settles_it(killed, tmp_path, point, cancel):
    runs, dump, want, keys = killed
    path, before = runs[point]
    with tqstore.open(_copy(path, tmp_path / "store")) as s:
        (r,) = s.controller.restores()
        assert r.state == "running"
        live = {k: v for k, v in state(s).items() if k not in ("next_gidx", "free")}  # (reserved: pending)
        assert live == {k: v for k, v in before.items() if k not in ("next_gidx", "free")}  # the old rows
        with pytest.raises(RestorePendingError, match="recover_data_load"):
            s.kv_clear(["k8"], "train")
        with pytest.raises(RestorePendingError):
            s.save_checkpoint(tmp_path / "ckpt")
        assert s.recover_data_load(dump, cancel=cancel) is True
        assert s.recover_data_load(dump, cancel=cancel) is False
        if cancel:
            assert state(s) == before
        else:
            assert rows_of(s, "train", keys) == want
        assert s.controller.restores() == [] and s.verify() == []
        s.kv_clear(["k8"], "train")
    with tqstore.open(tmp_path / "store") as s:  # and after another reopen
        assert s.controller.restores() == [] and s.verify() == []
        if not cancel:
            assert rows_of(s, "train", keys) == want


def test_a_load_killed_after_its_commit_is_settled_by_the_open(killed, tmp_path):
    runs, dump, want, keys = killed
    path, _before = runs["finish"]
    with tqstore.open(_copy(path, tmp_path / "store")) as s:
        assert s.controller.restores() == []
        assert rows_of(s, "train", keys) == want and s.verify() == []
        assert s.recover_data_load(dump) is False
        s.kv_clear(["k8"], "train")
