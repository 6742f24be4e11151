"""TransferQueue's ``total_storage_size``: at most ``ceil(total / num_units)`` rows with data per
unit (row g on unit g % num_units, as TransferQueue routes them); a put past it raises
CapacityError before anything is written; clears free the room; the counts hold across
reopen and checkpoint loads.
"""
from __future__ import annotations

import pytest
import torch

import tqstore as tq
from tqstore import CapacityError, ConfigError


def _rows(n, start=0):
    return {"x": torch.arange(start, start + n).reshape(n, 1)}


def _entries(s):
    return [sorted(u.keys()) for u in s.units]


def test_a_put_past_a_units_share_is_refused_before_anything_is_written(tmp_path):
    with tq.open(tmp_path / "s", num_units=2, total_storage_size=4) as s:  # 2 rows per unit
        s.kv_batch_put(["a", "b", "c", "d"], "p", _rows(4))
        before = (s.kv_list(), _entries(s))
        with pytest.raises(CapacityError, match="total_storage_size=4") as e:
            s.kv_batch_put(["e"], "p", _rows(1))
        assert e.value.setting == "total_storage_size" and isinstance(e.value, MemoryError)
        assert (s.kv_list(), _entries(s)) == before
        s.kv_batch_put(["a", "b"], "p", {"y": torch.zeros(2, 3)})  # more fields on rows with data: no new rows
        s.kv_batch_put(["a"], "p", _rows(1, 7))  # an overwrite: no new row
        assert s.kv_batch_get(["a"], "p")["x"].tolist() == [[7]]


def test_the_limit_is_per_unit_as_transferqueue_so_an_uneven_spread_is_refused_early(tmp_path):
    with tq.open(tmp_path / "s", num_units=2, total_storage_size=4) as s:
        s.kv_batch_put(list("abcd"), "p", _rows(4))  # gidx 0..3: two per unit
        s.kv_clear(["a", "c"], "p")  # gidx 0 and 2: both on unit 0
        s.kv_batch_put(["e", "f"], "p", _rows(2))  # reuse 0 and 2: unit 0 again, fits
        s.kv_clear(["b", "d"], "p")  # unit 1 empty, unit 0 full; 2 rows in the store
        s.kv_batch_put(["g"], "p", _rows(1))  # gidx 1: unit 1
        with pytest.raises(CapacityError, match="unit 0"):
            s.put(_rows(2), partition_id="q")  # gidx 3 (unit 1) and 4 (unit 0, full)


def test_rows_without_data_do_not_count_until_their_first_field(tmp_path):
    with tq.open(tmp_path / "s", num_units=1, total_storage_size=2) as s:
        ins = s.get_meta(["x"], 3, "p", mode="insert")  # reserved: no data yet
        s.kv_put("k", "p", tag={"only": "a tag"})
        s.put(_rows(2), ins[0:2])
        with pytest.raises(CapacityError):
            s.put(_rows(1), ins[2:3])
        with pytest.raises(CapacityError):
            s.kv_put("k", "p", {"x": torch.tensor([1])})
        s.clear_samples(ins[0:1])
        s.put(_rows(1), ins[2:3])


def test_counts_hold_across_reopen_clears_drops_and_checkpoint_loads(tmp_path):
    with tq.open(tmp_path / "s", num_units=2, total_storage_size=4) as s:
        s.put(_rows(4), partition_id="p")
        s.save_checkpoint(tmp_path / "ckpt")
    with tq.open(tmp_path / "s", total_storage_size=4) as s:
        with pytest.raises(CapacityError):
            s.put(_rows(1), partition_id="q")
        s.clear_partition("p")
        s.put(_rows(4), partition_id="q")
        s.clear_partition("q")
        s.load_checkpoint(tmp_path / "ckpt")  # 4 rows again
        with pytest.raises(CapacityError):
            s.put(_rows(1), partition_id="q")


def test_transferqueues_config_key_sets_it_and_bad_values_raise_before_opening(tmp_path):
    tq.init({"path": str(tmp_path / "s"),
             "backend": {"SimpleStorage": {"num_data_storage_units": 2, "total_storage_size": 3}}})
    try:
        tq.kv_batch_put(list("abcd"), "p", _rows(4))  # ceil(3/2) = 2 per unit, as TransferQueue
        with pytest.raises(CapacityError):
            tq.kv_batch_put(["e"], "p", _rows(1))
    finally:
        tq.close()
    for bad in (0, -1, 2.5, "10", True):
        with pytest.raises(ConfigError):
            tq.open(tmp_path / "s", total_storage_size=bad)
    with tq.open(tmp_path / "s") as s:  # not locked by the refused opens; no limit without the setting
        s.kv_batch_put(["e", "f"], "p", _rows(2))


def test_rows_a_load_by_key_brings_count_against_the_limit(tmp_path):
    """A selective load adds rows with data outside the store's own puts: the count of rows
    held is taken again, so a put past ``total_storage_size`` after it is refused."""
    with tq.open(tmp_path / "s", num_units=1, total_storage_size=4) as s:
        s.kv_batch_put(["a", "b"], "p", fields={"x": torch.zeros(2, 3)})
        s.dump_data_by_key(tmp_path / "dump", ["a", "b"], "p")
        s.kv_clear(["a", "b"], "p")
        s.kv_batch_put(["c", "d"], "p", fields={"x": torch.zeros(2, 3)})  # (the count is kept: 2 rows)
        s.load_data_by_key(tmp_path / "dump")
        assert sorted(s.kv_list("p")["p"]) == ["a", "b", "c", "d"]
        with pytest.raises(CapacityError):
            s.kv_batch_put(["e"], "p", fields={"x": torch.zeros(1, 3)})
        s.kv_clear(["c"], "p")
        s.kv_batch_put(["e"], "p", fields={"x": torch.zeros(1, 3)})  # room for exactly one


def test_a_load_by_key_past_the_limit_is_refused_before_anything_is_written(tmp_path):
    """A load counts as the puts do: rows of new keys with data, and existing rows without
    data that get some, on each unit; past a unit's share it raises CapacityError and the
    store is as before (no restore, no marker); with room, the same dump loads."""
    with tq.open(tmp_path / "src", num_units=2) as src:
        src.kv_batch_put([f"k{i}" for i in range(6)], "p", fields={"x": torch.arange(18).view(6, 3)})
        src.kv_batch_put(["tag-only"], "p", tags=[{"t": 1}])
        src.dump_data_by_key(tmp_path / "dump", [f"k{i}" for i in range(6)] + ["tag-only"], "p")
    with tq.open(tmp_path / "s", num_units=2, total_storage_size=4) as s:  # 2 rows per unit
        s.kv_batch_put(["k0"], "p", tags=[{"empty": True}])  # exists, no data: gets some from the dump
        before = s.kv_list()
        with pytest.raises(CapacityError, match="nothing was written") as e:
            s.load_data_by_key(tmp_path / "dump")
        assert e.value.setting == "total_storage_size"
        assert s.kv_list() == before and s.controller.restores() == []
        assert not (tmp_path / "dump.restore").exists()
        s.kv_batch_put(["z"], "p", fields={"x": torch.zeros(1, 3)})  # the count is still right
    with tq.open(tmp_path / "t", num_units=2, total_storage_size=12) as t:  # room for 6 per unit
        t.kv_batch_put(["k0"], "p", tags=[{"empty": True}])
        assert t.load_data_by_key(tmp_path / "dump")["keys"] == 7
        assert t.kv_batch_get(["k5"], "p")["x"].tolist() == [[15, 16, 17]]


def test_rows_a_running_load_adds_are_held_in_reserve_against_puts(tmp_path):
    """While a load runs (its units importing), the rows with data it will add count against
    the limit: a put into another partition that would take the unit past its share with
    them is refused; once the load committed, they count as held."""
    from restore_helpers import load_held_in_import

    with tq.open(tmp_path / "src", num_units=1) as src:
        src.kv_batch_put([f"k{i}" for i in range(6)], "p", fields={"x": torch.zeros(6, 3)})
        src.dump_data_by_key(tmp_path / "dump", [f"k{i}" for i in range(6)], "p")
    with tq.open(tmp_path / "s", num_units=1, total_storage_size=8) as s:
        with load_held_in_import(s, tmp_path / "dump"):
            with pytest.raises(CapacityError, match="holds 6 rows with data, the put adds 3"):
                s.kv_batch_put(["q0", "q1", "q2"], "q", fields={"x": torch.zeros(3, 3)})
            s.kv_batch_put(["q0", "q1"], "q", fields={"x": torch.zeros(2, 3)})  # exactly the room left
        assert len(s.kv_list("p")["p"]) == 6
        with pytest.raises(CapacityError):
            s.kv_batch_put(["q3"], "q", fields={"x": torch.zeros(1, 3)})


def test_a_load_that_adds_no_rows_with_data_passes_a_unit_already_past_its_share(tmp_path):
    """Reopened with a smaller limit, a unit may hold more than its share: a load that only
    overwrites rows holding data adds none, so it is not refused (as such a put is not)."""
    with tq.open(tmp_path / "s", num_units=1) as s:
        s.kv_batch_put(["a", "b", "c"], "p", fields={"x": torch.ones(3, 3)})
        s.dump_data_by_key(tmp_path / "dump", ["a", "b"], "p")
    with tq.open(tmp_path / "s", total_storage_size=2) as s:
        s.kv_batch_put(["a"], "p", fields={"x": torch.zeros(1, 3)})  # an overwrite adds no row
        assert s.load_data_by_key(tmp_path / "dump")["keys"] == 2
        assert s.kv_batch_get(["a"], "p")["x"].tolist() == [[1.0, 1.0, 1.0]]


def _dump_of_four(tmp_path):
    with tq.open(tmp_path / "src", num_units=1) as src:
        src.kv_batch_put([f"k{i}" for i in range(4)], "p", fields={"x": torch.ones(4, 3)})
        src.dump_data_by_key(tmp_path / "dump", [f"k{i}" for i in range(4)], "p")
    return tmp_path / "dump"


def test_completing_a_pending_load_checks_the_room_again(tmp_path, monkeypatch):
    """A load left pending (its error could not be undone) holds no room: puts may take it.
    recover_data_load then refuses to complete it past total_storage_size (CapacityError,
    nothing written, still pending) until rows are cleared; it completes within the limit."""
    from tqstore.dump import restore as R

    dump = _dump_of_four(tmp_path)
    with tq.open(tmp_path / "s", num_units=1, total_storage_size=6) as s:
        def no_disk(*a, **kw):
            raise OSError("disk gone (injected)")

        def no_cancel(store, info):
            raise RuntimeError("cancel failed (injected)")
        monkeypatch.setattr(s.units[0], "import_restore", no_disk)
        monkeypatch.setattr(R, "_cancel", no_cancel)
        with pytest.raises(OSError, match="disk gone"):
            s.load_data_by_key(dump)
        monkeypatch.undo()
        assert [r.state for r in s.controller.restores()] == ["running"]
        s.kv_batch_put([f"q{i}" for i in range(4)], "q", fields={"x": torch.zeros(4, 3)})  # the room is free
        with pytest.raises(CapacityError, match="stays pending") as e:
            s.recover_data_load(dump)
        assert e.value.setting == "total_storage_size"
        assert [r.state for r in s.controller.restores()] == ["running"] and "p" not in s.kv_list()
        s.kv_clear(["q0", "q1", "q2"], "q")
        assert s.recover_data_load(dump) is True
        assert len(s.kv_list("p")["p"]) == 4 and s.controller.restores() == []
        with pytest.raises(CapacityError):
            s.kv_batch_put(["q9", "q8"], "q", fields={"x": torch.zeros(2, 3)})


def test_a_failure_right_after_the_begin_undoes_the_load_and_lets_calls_go_on(tmp_path, monkeypatch):
    """An error between the controller's begin and the units' import (here counting the rows
    to hold in reserve) is undone as any later failure: the restore cancelled, its marker
    gone, and no call waits for a load that is no longer running."""
    dump = _dump_of_four(tmp_path)
    with tq.open(tmp_path / "s", num_units=1, total_storage_size=6) as s:
        def fails(*a, **kw):
            raise MemoryError("injected")
        monkeypatch.setattr(s._capacity, "restore_growth", fails)
        with pytest.raises(MemoryError, match="injected"):
            s.load_data_by_key(dump)
        monkeypatch.undo()
        assert s.controller.restores() == [] and not (tmp_path / "dump.restore").exists()
        s.kv_batch_put(["k0"], "p", fields={"x": torch.zeros(1, 3)})  # no restore left to wait for
        assert s.load_data_by_key(dump)["keys"] == 4
