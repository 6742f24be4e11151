"""The clean-close marker (docs/FORMAT.md, "Clean close"): a store closed cleanly reopens
without scanning its units; anything else (a kill, a failed write, a unit changed behind
the store's back, a damaged marker) still reconciles, and the reopened store holds exactly
what was acknowledged."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import lmdb
import numpy as np
import pytest

import tqstore
from tqstore import layout_dirs as L
from tqstore import store_open
from tqstore._format import controller_records as R
from tqstore._io import failpoints
from tqstore.errors import TqstoreError
from tqstore.unit import Unit


def _put(s, keys, value=1):
    s.kv_batch_put(keys, "p", {"x": np.full((len(keys), 3), value, np.int64)})


def _marker(root):
    env = lmdb.open(str(L.controller_dir(root / L.read_current(root))), max_dbs=12, readonly=True, lock=False)
    try:
        with env.begin() as txn:
            v = txn.get(R.META_CLEAN, db=env.open_db(b"meta", txn=txn, create=False))
            return None if v is None else bytes(v)
    finally:
        env.close()


def _held(root, unit, field="x"):
    u = Unit(L.unit_dir(root / L.read_current(root), unit), unit)
    try:
        return u.field_rows().get(field, np.zeros(0, np.int64)).tolist()
    finally:
        u.close()


def test_a_cleanly_closed_store_reopens_without_reconciling_and_keeps_everything(tmp_path, reconciles):
    root = tmp_path / "s"
    with tqstore.open(root, num_units=2, result_type="dict") as s:
        _put(s, [f"k{i}" for i in range(10)])
        s.kv_clear(["k3"], "p")
    assert reconciles == [root]  # a new store: nothing vouched for it
    assert _marker(root) is not None
    with tqstore.open(root, result_type="dict") as s:
        with s.controller.env.begin() as txn:  # removed as the store opens, before any write
            assert txn.get(R.META_CLEAN, db=s.controller.db["meta"]) is None
        assert reconciles == [root]
        assert sorted(s.kv_list("p")["p"]) == sorted(f"k{i}" for i in range(10) if i != 3)
        assert np.asarray(s.kv_batch_get(["k9"], "p")["x"]).tolist() == [[1, 1, 1]]
        _put(s, ["k10"], 2)
    with tqstore.open(root, result_type="dict") as s:
        assert reconciles == [root]
        assert np.asarray(s.kv_batch_get(["k10"], "p")["x"]).tolist() == [[2, 2, 2]]


def test_a_killed_store_reconciles_on_open(tmp_path, reconciles):
    root = tmp_path / "s"
    with tqstore.open(root, num_units=2) as s:
        _put(s, ["a", "b"])
    code = textwrap.dedent(f"""
        import os, numpy as np, tqstore
        s = tqstore.open({str(root)!r})
        s.kv_batch_put(["c"], "p", {{"x": np.zeros((1, 3), np.int64)}})
        os._exit(0)  # no close: as a kill -9
    """)
    subprocess.run([sys.executable, "-c", code], check=True)
    reconciles.clear()
    with tqstore.open(root, result_type="dict") as s:
        assert reconciles == [root]
        assert sorted(s.kv_list("p")["p"]) == ["a", "b", "c"]


def test_a_write_that_failed_at_the_controller_leaves_no_marker_and_is_dropped_on_open(tmp_path, reconciles):
    root = tmp_path / "s"
    with tqstore.open(root, num_units=1) as s:
        _put(s, ["a"])
        failpoints.arm("controller_commit", "eio", repeat=True)
        try:
            with pytest.raises(TqstoreError):
                _put(s, ["b", "c"])  # the unit wrote, the controller did not commit: orphans
        finally:
            failpoints.disarm("controller_commit")
    assert _marker(root) is None and len(_held(root, 0)) == 3
    reconciles.clear()
    with tqstore.open(root, result_type="dict") as s:
        assert reconciles == [root] and list(s.kv_list("p")["p"]) == ["a"]
    assert len(_held(root, 0)) == 1


def test_a_unit_changed_after_a_clean_close_is_reconciled(tmp_path, reconciles):
    root = tmp_path / "s"
    with tqstore.open(root, num_units=2, result_type="dict") as s:
        _put(s, ["a", "b", "c", "d"])
        g = s.controller.resolve_keys("p", ["a"])[0]
    u = Unit(L.unit_dir(root / L.read_current(root), g % 2), g % 2)
    u.delete([g])  # behind the store's back: the controller still says row a has x
    u.close()
    reconciles.clear()
    with tqstore.open(root, result_type="dict") as s:
        assert reconciles == [root]
        assert s.controller.row_infos("p", [g])[0].fields == frozenset()  # forgotten, not a broken read


@pytest.mark.parametrize("value", [b"12x", b"1" * 41, b""])
def test_a_damaged_marker_is_ignored_and_the_store_reconciles(tmp_path, reconciles, value):
    root = tmp_path / "s"
    with tqstore.open(root, num_units=1) as s:
        _put(s, ["a"])
    env = lmdb.open(str(L.controller_dir(root / L.read_current(root))), max_dbs=12)
    with env.begin(write=True) as txn:
        txn.put(R.META_CLEAN, value, db=env.open_db(b"meta", txn=txn))
    env.close()
    reconciles.clear()
    with tqstore.open(root, result_type="dict") as s:
        assert reconciles == [root] and list(s.kv_list("p")["p"]) == ["a"]
    assert _marker(root) is not None  # the clean close after it records a good one


def test_a_checkpoint_load_and_a_temporary_store_never_carry_a_marker(tmp_path, reconciles):
    root = tmp_path / "s"
    with tqstore.open(root, num_units=2) as s:
        _put(s, ["a", "b"])
        s.save_checkpoint(tmp_path / "ck")
    assert not list((tmp_path / "ck").rglob("lock.mdb"))
    env = lmdb.open(str(tmp_path / "ck" / "controller"), max_dbs=12, readonly=True, lock=False)
    with env.begin() as txn:
        assert txn.get(R.META_CLEAN, db=env.open_db(b"meta", txn=txn, create=False)) is None
    env.close()
    with tqstore.open(root, result_type="dict") as s:
        s.load_checkpoint(tmp_path / "ck")
        assert sorted(s.kv_list("p")["p"]) == ["a", "b"]
    with tqstore.open(root, result_type="dict") as s:
        assert sorted(s.kv_list("p")["p"]) == ["a", "b"]
    t = tqstore.open(None)
    tmp_root = t.root
    t.close()
    assert not tmp_root.exists()


def test_a_store_whose_open_failed_to_reconcile_records_no_marker(tmp_path, monkeypatch):
    root = tmp_path / "s"
    with tqstore.open(root, num_units=1) as s:
        _put(s, ["a"])
    boom = TqstoreError("reconcile failed")
    monkeypatch.setattr(store_open, "full_reconcile", lambda s: (_ for _ in ()).throw(boom))
    env = lmdb.open(str(L.controller_dir(root / L.read_current(root))), max_dbs=12)
    with env.begin(write=True) as txn:  # no marker: the open must reconcile, and that fails
        txn.delete(R.META_CLEAN, db=env.open_db(b"meta", txn=txn))
    env.close()
    with pytest.raises(TqstoreError):
        tqstore.open(root)
    assert _marker(root) is None


def test_a_kill_after_a_unit_write_before_the_controller_commit_of_a_clean_open_is_reconciled(tmp_path, reconciles):
    root = tmp_path / "s"
    with tqstore.open(root, num_units=2) as s:
        _put(s, ["a", "b"])
    assert _marker(root) is not None  # closed cleanly: the next open may skip the scans
    code = textwrap.dedent(f"""
        import numpy as np, tqstore
        s = tqstore.open({str(root)!r})
        s.kv_batch_put(["c", "d", "e"], "p", {{"x": np.zeros((3, 3), np.int64)}})  # killed at its controller commit
    """)
    env = dict(os.environ, TQSTORE_FAILPOINTS="controller_commit=kill@1")
    p = subprocess.run([sys.executable, "-c", code], env=env)
    assert p.returncode == failpoints.KILL_EXIT_CODE
    assert _marker(root) is None  # the clean open removed it before the unit writes
    assert len(_held(root, 0)) + len(_held(root, 1)) == 5  # the units wrote c, d, e: orphans
    reconciles.clear()
    with tqstore.open(root, result_type="dict") as s:
        assert reconciles == [root] and sorted(s.kv_list("p")["p"]) == ["a", "b"]
    assert len(_held(root, 0)) + len(_held(root, 1)) == 2


def test_a_close_whose_clean_marker_fails_still_closes_every_part_and_frees_the_store(tmp_path, monkeypatch):
    # a full disk at close (or a part gone): the error is raised, but every part is closed and
    # the lock released, so this process reopens the store, which reconciles and has every row
    from tqstore.errors import StorageIOError

    root = tmp_path / "s"
    s = tqstore.open(root, num_units=2, result_type="dict")
    _put(s, ["a", "b", "c"])
    closed = []
    for part in [*s.units, s.controller]:
        real = part.close
        monkeypatch.setattr(part, "close", lambda real=real, part=part: (closed.append(part), real())[1])

    def failing_mark(store):
        raise StorageIOError("injected: no space left for the clean-close marker")

    monkeypatch.setattr(store_open, "mark_clean", failing_mark)
    with pytest.raises(StorageIOError, match="injected"):
        s.close()
    assert len(closed) == 3
    monkeypatch.undo()
    with tqstore.open(root, result_type="dict") as s2:  # the same process: the lock was released
        assert sorted(s2.kv_list("p")["p"]) == ["a", "b", "c"]
