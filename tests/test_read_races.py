"""A read racing a clear never returns a removed row's payload, nor a new row's payload
under the global index a cleared row gave up (tqstore.read_guard).

A read asks the controller, then reads the units without the write lock.  Each test makes
the race happen at the worst moment, deterministically: the store's unit read is wrapped so
that, once, a clear (and a put that reuses the freed global index) runs between the
controller's answer and the read of the payload.  A read racing a load by key never returns
a payload the load's commit point has not reached.  Real store, real LMDB and segment files.
"""
from __future__ import annotations

import threading

import pytest
import torch

import tqstore as tq
from tqstore import KeyNotFoundError, StorageIOError


def _race_once(store, action):
    """Run ``action()`` once, right before the first unit read after this call."""
    orig = store.read_rows
    state = {"done": False}

    def read_rows(*a, **kw):
        if not state["done"]:
            state["done"] = True
            action()
        return orig(*a, **kw)

    store.read_rows = read_rows
    return state


def _val(i):
    return {"x": torch.full((1, 4), i, dtype=torch.int64)}


def test_kv_get_racing_a_clear_and_a_reuse_of_the_index_raises_not_the_new_rows_payload(tmp_path):
    with tq.open(tmp_path / "s", num_units=2) as s:
        s.kv_batch_put(["a"], "p", fields=_val(1))
        g_a = s.controller.resolve_keys("p", ["a"])

        def clear_and_reuse():
            s.kv_clear(["a"], "p")
            s.kv_batch_put(["b"], "p", fields=_val(2))  # takes the freed global index

        state = _race_once(s, clear_and_reuse)
        with pytest.raises(KeyNotFoundError):
            s.kv_batch_get(["a"], "p")
        assert state["done"]
        assert s.kv_batch_get(["b"], "p")["x"].tolist() == [[2] * 4]
        assert s.controller.resolve_keys("p", ["b"]) == g_a  # the race reused the index


def test_get_data_racing_a_clear_and_a_reuse_raises_for_the_stale_meta(tmp_path):
    with tq.open(tmp_path / "s", num_units=2) as s:
        c = tq.get_client(s)
        c.put(_val(1), partition_id="p")
        meta = c.get_meta(["x"], 1, "p", task_name="t")
        assert meta.size == 1

        def clear_and_reuse():
            c.clear_samples(meta)
            c.put(_val(2), partition_id="p")  # a new row on the same global index

        _race_once(s, clear_and_reuse)
        with pytest.raises(KeyNotFoundError):
            c.get_data(meta)
        fresh = c.get_meta(["x"], 1, "p", task_name="t")
        assert fresh.global_indexes == meta.global_indexes
        assert c.get_data(fresh)["x"].tolist() == [[2] * 4]


def test_store_read_racing_a_clear_raises_key_not_found_not_an_inconsistent_store(tmp_path):
    with tq.open(tmp_path / "s", num_units=2) as s:
        g = s.write("p", _val(1), new_rows=True)
        _race_once(s, lambda: s.delete_rows("p", g))
        with pytest.raises(KeyNotFoundError):
            s.read("p", g)


def test_a_clear_of_other_rows_during_a_read_still_returns_the_rows_own_payload(tmp_path):
    with tq.open(tmp_path / "s", num_units=2) as s:
        for i in range(6):
            s.kv_batch_put([f"k{i}"], "p", fields=_val(i))
        state = _race_once(s, lambda: s.kv_clear(["k5"], "p"))
        got = s.kv_batch_get(["k0", "k1", "k2"], "p")["x"]
        assert state["done"]
        assert got.tolist() == [[0] * 4, [1] * 4, [2] * 4]
        with pytest.raises(KeyNotFoundError):
            s.kv_batch_get(["k5"], "p")


def test_reads_of_live_rows_never_fail_while_clears_overwrites_and_compaction_remove_segments(tmp_path):
    """Segments whose frames all died (clears, overwrites) are deleted at once, and compaction
    moves live frames and deletes their old segments; none of it takes the readers' side.  A
    read that resolved a location just before must not report damage: it is tried again under
    the write lock and returns the rows' payload (old or new for an overwritten row)."""
    import threading
    import time

    import numpy as np

    s = tq.open(tmp_path / "s", num_units=1, segment_bytes=1 << 16, result_type="dict")
    stop = time.monotonic() + 2.5
    errors, reads, wrong = [], [0], [0]

    def churn():
        i = 0
        while time.monotonic() < stop:
            junk = [f"junk{i}_{j}" for j in range(6)]
            s.kv_batch_put([f"keep{i}"] + junk, "p", fields={"x": np.full((7, 2000), i, np.int64)})
            s.kv_batch_put(["over"], "p", fields={"x": np.full((1, 2000), i, np.int64)})  # an overwrite
            s.kv_clear(junk, "p")
            s.compact()
            i += 1

    def reader():
        while time.monotonic() < stop:
            keys = [k for k in s.kv_list().get("p", {}) if k.startswith("keep") or k == "over"]
            if not keys:
                continue
            try:
                x = s.kv_batch_get(keys, "p")["x"]
            except Exception as e:  # noqa: BLE001 - every error is a failure of this test
                errors.append(repr(e)[:200])
                continue
            reads[0] += 1
            for k, row in zip(keys, x):
                if len(np.unique(row)) != 1 or (k != "over" and int(row[0]) != int(k[4:])):
                    wrong[0] += 1

    threads = [threading.Thread(target=churn)] + [threading.Thread(target=reader) for _ in range(2)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        s.close()
    assert reads[0] > 0 and wrong[0] == 0 and errors == [], (reads[0], wrong[0], sorted(set(errors))[:3])


# ------------------------------------------------------------------ a read racing a load by key
def _load_with_a_read_in_its_commit(tmp_path, monkeypatch, *, finish_fails: bool):
    """Dump k0..k2 of one store into another that holds k0..k2 with other values; while the
    load's units have published and the controller's finish has not run, another thread
    reads k0.  Returns (the value the reader got, whether it got it before the finish
    ran, k0's value in the dump, k0's value before the load)."""
    from checkpoint_helpers import canon, fill
    from restore_helpers import write_dump

    with tq.open(tmp_path / "src", num_units=2, result_type="dict") as src:
        keys = fill(src, "train", 3, seed=1)
        dump = write_dump(src, tmp_path / "dump", keys, "train")
        dumped = canon(src.kv_batch_get(keys[:1], "train"))
    with tq.open(tmp_path / "dst", num_units=2, result_type="dict") as dst:
        fill(dst, "train", 3, seed=2)
        before = canon(dst.kv_batch_get(keys[:1], "train"))
        real = dst.controller.finish_restore
        seen = {}

        def read():
            seen["got"] = canon(dst.kv_batch_get(keys[:1], "train"))

        def finish(rid):
            reader = threading.Thread(target=read)
            reader.start()
            reader.join(0.5)  # a read that waits for the load's end does not end here
            seen["before_finish"] = "got" in seen
            seen["reader"] = reader
            if finish_fails:
                raise StorageIOError("the controller's disk is full (injected)")
            return real(rid)

        monkeypatch.setattr(dst.controller, "finish_restore", finish)
        if finish_fails:
            with pytest.raises(StorageIOError, match="injected"):
                dst.load_data_by_key(dump)
        else:
            dst.load_data_by_key(dump)
        seen["reader"].join(10)
        assert not seen["reader"].is_alive()
        after = canon(dst.kv_batch_get(keys[:1], "train"))
    assert dumped != before
    return seen["got"], seen["before_finish"], dumped, before, after


def test_a_read_racing_a_load_that_fails_at_its_commit_never_sees_the_dumps_payload(tmp_path, monkeypatch):
    """The units have published the dump's frames, then the controller's finish (the commit
    point) fails and the load is undone: a read in between returns the old value (it waits
    for the load to end), never the dump's, which no committed state ever held."""
    got, early, dumped, before, after = _load_with_a_read_in_its_commit(tmp_path, monkeypatch, finish_fails=True)
    assert after == before
    assert got == before and not early


def test_a_read_racing_a_committing_load_returns_the_committed_rows(tmp_path, monkeypatch):
    """A read between the units' publish and the controller's finish waits for the commit and
    returns the dump's rows (as the controller then lists them)."""
    got, early, dumped, before, after = _load_with_a_read_in_its_commit(tmp_path, monkeypatch, finish_fails=False)
    assert after == dumped
    assert got == dumped and not early


def test_verify_beside_overwrites_and_clears_reports_nothing_for_a_clean_store(tmp_path):
    """A unit's verify reads one view of its index; an overwrite and a clear that run while it
    reads make that view's segments dead, but they stay until the verify ends (pinned), so
    nothing is reported missing; then they go."""
    with tq.open(tmp_path / "s", num_units=1, segment_bytes=1 << 16) as s:
        keys = [f"k{i}" for i in range(64)]
        s.kv_batch_put(keys, "p", fields={"x": torch.zeros(64, 256)})  # 64 KiB of payload: several segments
        unit = s.units[0]
        old_segs = set(unit.segments())
        orig = unit.read_frame
        fired = []

        def read_frame(*a, **kw):
            if not fired:
                fired.append(True)
                s.kv_batch_put(keys, "p", fields={"x": torch.ones(64, 256)})  # every frame of the view dies
                s.kv_clear(keys[:16], "p")
            return orig(*a, **kw)

        unit.read_frame = read_frame
        assert unit.verify() == [] and fired
        del unit.read_frame
        assert not old_segs & set(unit.segments())  # unlinked once the verify let them go
        assert not any((unit.path / f"seg-{i:08d}.tqs").exists() for i in old_segs)
        assert s.verify() == []
        assert s.kv_batch_get(keys[16:17], "p")["x"].tolist() == [[1.0] * 256]


def test_row_shapes_racing_a_load_that_fails_at_its_commit_are_the_old_ones(tmp_path, monkeypatch):
    """The shapes a BatchMeta reports are read from the frames' heads as the payload is: a
    read between a load's publish and its failed commit gives the rows' old shapes."""
    from restore_helpers import write_dump

    with tq.open(tmp_path / "src", num_units=2) as src:
        src.kv_batch_put(["a", "b"], "p", fields={"x": torch.zeros(2, 3)})
        dump = write_dump(src, tmp_path / "dump", ["a", "b"], "p")
    with tq.open(tmp_path / "dst", num_units=2) as dst:
        dst.kv_batch_put(["a", "b"], "p", fields={"x": torch.zeros(2, 5)})
        gidxs = dst.controller.resolve_keys("p", ["a", "b"])
        seen = {}

        def finish(rid):
            reader = threading.Thread(target=lambda: seen.update(shapes=dst.row_shapes("p", gidxs, ["x"])))
            reader.start()
            reader.join(0.5)
            seen["reader"] = reader
            raise StorageIOError("injected")

        monkeypatch.setattr(dst.controller, "finish_restore", finish)
        with pytest.raises(StorageIOError, match="injected"):
            dst.load_data_by_key(dump)
        seen["reader"].join(10)
        assert seen["shapes"] == {"x": [(5,), (5,)]}


# ------------------------------------------------------------------ a checkpoint load (the whole state switched)
def _two_checkpoints(s, tmp_path):
    """Checkpoints A (keys a0..a7, values 1000+i) and B (b0..b7, 2000+i) whose rows share
    their global indexes; the store holds A's state afterwards."""
    a, b = [f"a{i}" for i in range(8)], [f"b{i}" for i in range(8)]
    s.kv_batch_put(a, "p", fields={"x": torch.arange(8).reshape(8, 1) + 1000})
    s.save_checkpoint(tmp_path / "A")
    g = s.controller.resolve_keys("p", ["a5"])
    s.kv_clear(a, "p")
    s.kv_batch_put(b, "p", fields={"x": torch.arange(8).reshape(8, 1) + 2000})
    assert s.controller.resolve_keys("p", ["b5"]) == g  # (the rows share their global indexes)
    s.save_checkpoint(tmp_path / "B")
    s.load_checkpoint(tmp_path / "A")
    return a, b


def test_kv_get_racing_a_checkpoint_load_never_returns_the_loaded_rows_payload(tmp_path):
    """The controller answered from the replaced state (a5 at global index 5); the load
    switches to B, whose b5 lies at index 5: the read tries again and finds a5 gone."""
    with tq.open(tmp_path / "s", num_units=2) as s:
        _two_checkpoints(s, tmp_path)
        assert s.kv_batch_get(["a5"], "p")["x"].tolist() == [[1005]]
        state = _race_once(s, lambda: s.load_checkpoint(tmp_path / "B"))
        with pytest.raises(KeyNotFoundError):
            s.kv_batch_get(["a5"], "p")
        assert state["done"]
        assert s.kv_batch_get(["b5"], "p")["x"].tolist() == [[2005]]


def _pause_in_unit_reads(store):
    """Pause the next unit read (inside the unit's read, its index lookup begun) of ``store``'s
    current units until ``go`` is set; ``inside`` is set once a read is paused there."""
    inside, go, once = threading.Event(), threading.Event(), []
    for u in store.units:
        orig = u.locs.get

        def get(*a, _orig=orig, **kw):
            if not once:
                once.append(1)
                inside.set()
                assert go.wait(30)
            return _orig(*a, **kw)

        u.locs.get = get
    return inside, go


def test_a_checkpoint_load_waits_for_a_unit_read_it_would_close_and_the_read_tries_again(tmp_path):
    """Closing a unit's index under a read of another thread crashed the process or raised
    lmdb.Error: the switch now waits for the read, which then tries again (never B's value)."""
    with tq.open(tmp_path / "s", num_units=2) as s:
        _two_checkpoints(s, tmp_path)
        inside, go = _pause_in_unit_reads(s)
        got = []

        def read():
            try:
                got.append(s.kv_batch_get(["a5"], "p")["x"].tolist())
            except BaseException as e:  # noqa: BLE001 - asserted below
                got.append(e)

        reader = threading.Thread(target=read)
        reader.start()
        assert inside.wait(30)
        loader = threading.Thread(target=s.load_checkpoint, args=(tmp_path / "B",))
        loader.start()
        loader.join(0.5)
        assert loader.is_alive()  # the switch waits for the read on the unit it closes
        go.set()
        loader.join(60)
        reader.join(60)
        assert not loader.is_alive() and not reader.is_alive()
        assert len(got) == 1 and isinstance(got[0], KeyNotFoundError), got
        assert s.kv_batch_get(["b5"], "p")["x"].tolist() == [[2005]]
        assert s.verify() == []


def test_a_read_of_a_closed_unit_raises_store_closed_not_an_lmdb_error(tmp_path):
    s = tq.open(tmp_path / "s", num_units=2)
    s.kv_batch_put(["a"], "p", fields=_val(1))
    u = s.units[0]
    s.close()
    with pytest.raises(tq.StoreClosedError):
        u.lookup([0], ["x"])
    with pytest.raises(tq.StoreClosedError):
        u.keys()
