"""Selective restores and dtype changes over controller index format 2 (issue 12 merged with
dump-restore and parity): a field whose schema entry turns mixed keeps its bit (puts and
restores), a restore pending in a version-1 index survives the migration to version 2 and
then finishes, a dump reads a format-2 snapshot, and an open rejects a restore whose
reserved global indexes are not what the allocator left them.
"""
from __future__ import annotations

import lmdb
import pytest
import torch

import tqstore
from tqstore import CorruptionError
from tqstore._format import controller_records as CR
from tqstore._format.dtypes import SCHEMA_MIXED

from checkpoint_helpers import fill
from restore_helpers import write_dump
from test_load_by_key import rows_of
from test_records import _raw, _to_version_1


def _bits(store, pid):
    return dict(store.controller.partition(pid).bits)


def test_a_dtype_change_keeps_the_fields_bit_and_a_new_field_gets_the_next_one(tmp_path):
    root = tmp_path / "s"
    with tqstore.open(root, num_units=2) as s:
        s.kv_batch_put(["a"], "p", {"m": torch.zeros(1, 2), "n": torch.zeros(1, 1)})
        before = _bits(s, "p")
        s.kv_batch_put(["b"], "p", {"m": torch.ones(1, 2, dtype=torch.int64), "o": torch.ones(1, 1)})
        assert s.controller.partition_info("p").schema["m"][1] == SCHEMA_MIXED
        bits = _bits(s, "p")
        assert {f: bits[f] for f in before} == before and bits["o"] == max(before.values()) + 1
        s.controller.check_mirror()
        ctrl = s.state_dir / "controller"
    assert CR.decode_schema2(_raw(ctrl, b"schema", b"p\0m"))[1:] == (SCHEMA_MIXED, before["m"])
    with tqstore.open(root) as s:  # every row's bitmap still names its fields
        assert _bits(s, "p") == bits
        assert sorted(s.controller.rows_by_key("p", ["a", "b"]).fields[1]) == ["m", "o"]
        assert [t.dtype for t in s.kv_batch_get(["a", "b"], "p", select_fields=["m"])["m"]] == \
            [torch.float32, torch.int64]


def test_a_restore_that_turns_a_field_mixed_keeps_its_bit(tmp_path):
    with tqstore.open(tmp_path / "src", num_units=2) as src:
        keys = fill(src, "train", 4)
        dump = write_dump(src, tmp_path / "dump", keys, "train")
        want = rows_of(src, "train", keys)
    with tqstore.open(tmp_path / "dst", num_units=3) as dst:
        dst.kv_batch_put(["a"], "train", {"input_ids": torch.zeros((1, 16), dtype=torch.int32)})  # int64 dumped
        before = _bits(dst, "train")
        assert dst.load_data_by_key(dump)["keys"] == 4
        bits = _bits(dst, "train")
        assert bits["input_ids"] == before["input_ids"] and len(set(bits.values())) == len(bits)
        assert dst.controller.partition_info("train").schema["input_ids"][1] == SCHEMA_MIXED
        dst.controller.check_mirror()
        assert rows_of(dst, "train", keys) == want
    with tqstore.open(tmp_path / "dst") as dst:
        assert _bits(dst, "train") == bits and rows_of(dst, "train", keys) == want and dst.verify() == []


def test_a_dump_reads_the_rows_of_a_format_2_snapshot(tmp_path):
    with tqstore.open(tmp_path / "src", num_units=2) as src:
        keys = fill(src, "train", 5)
        src.kv_batch_put(["untagged"], "train", {"input_ids": torch.zeros((1, 16), dtype=torch.int64)})
        dump = write_dump(src, tmp_path / "dump", keys + ["untagged"], "train")
        want = rows_of(src, "train", keys + ["untagged"])
    with tqstore.open(tmp_path / "dst", num_units=1) as dst:
        dst.load_data_by_key(dump)
        assert rows_of(dst, "train", keys + ["untagged"]) == want


def _pending(tmp_path, monkeypatch, mixed=False):
    """A store (closed) whose load of a dump with new keys stopped after one unit completed
    (``mixed``: the store's input_ids is int32, the dump's int64: the restore makes it mixed)."""
    with tqstore.open(tmp_path / "src", num_units=2) as src:
        keys = fill(src, "train", 8)
        dump = write_dump(src, tmp_path / "dump", keys, "train")
        want = rows_of(src, "train", keys)
    from tqstore.dump import restore as RS

    dst = tqstore.open(tmp_path / "dst", num_units=2)
    if mixed:
        dst.kv_batch_put(["k6", "k7"], "train", {"input_ids": torch.zeros((2, 16), dtype=torch.int32)})
    else:
        fill(dst, "train", 2, prefix="k", start=6, seed=3)
    real = dst.controller.complete_restore

    def complete(rid, u, attempt):
        real(rid, u, attempt)
        raise OSError("disk gone")

    def no_cancel(store, info):
        raise RuntimeError("cancel failed")
    monkeypatch.setattr(dst.controller, "complete_restore", complete)
    monkeypatch.setattr(RS, "_cancel", no_cancel)
    with pytest.raises((OSError, RuntimeError)):
        dst.load_data_by_key(dump)
    monkeypatch.undo()
    (r,) = dst.controller.restores()
    reserved = dst.controller._restores.active[r.rid].reserved
    ctrl = dst.state_dir / "controller"
    dst.close()
    return dump, keys, want, reserved, ctrl


@pytest.mark.parametrize("mixed", [False, True])
def test_a_restore_pending_in_a_version_1_index_survives_the_migration_and_finishes(tmp_path, monkeypatch, mixed):
    dump, keys, want, reserved, ctrl = _pending(tmp_path, monkeypatch, mixed)
    assert len(reserved) == 6  # k0..k5 are new keys: reserved, neither rows nor free
    _to_version_1(ctrl)
    assert _raw(ctrl, b"meta", b"format") == b"1"
    with tqstore.open(tmp_path / "dst") as dst:
        (rec,) = dst.controller._restores.active.values()
        assert (rec.schema.get("input_ids", (0, 0))[1] == SCHEMA_MIXED) == mixed
        assert [r.state for r in dst.controller.restores()] == ["running"]
        assert dst.recover_data_load(dump) is True
        assert rows_of(dst, "train", keys) == want and dst.verify() == []
        assert sorted(dst.controller.resolve_keys("train", keys[:6])) == sorted(reserved)
        dst.controller.check_mirror()
    assert _raw(ctrl, b"meta", b"format") == b"3"


@pytest.mark.parametrize("damage", ["above_next", "free", "row"])
def test_a_restore_reserving_an_index_the_allocator_did_not_leave_is_a_corruption_error(
        tmp_path, monkeypatch, damage):
    _dump, _keys, _want, reserved, ctrl = _pending(tmp_path, monkeypatch)
    env = lmdb.open(str(ctrl), max_dbs=16, subdir=True)
    try:
        with env.begin(write=True) as txn:
            db = {n: env.open_db(n.encode(), txn=txn) for n in CR.CONTROLLER_DBS}
            ((k, v),) = [(bytes(k), bytes(v)) for k, v in txn.cursor(db["restores"])
                         if CR.decode_restore_key(k)[1] is None]
            rec = CR.decode_restore(v)
            nxt = CR.decode_decimal(txn.get(CR.META_NEXT_GIDX, db=db["meta"]))
            if damage == "above_next":
                rec = rec._replace(reserved=rec.reserved + (nxt + 5,))
            elif damage == "free":
                txn.put(CR.gidx_key(reserved[0]), b"", db=db["free"])
            else:
                row = CR.decode_gidx_key(txn.get(CR.keys_key("train", "k6"), db=db["keys"]))
                rec = rec._replace(reserved=rec.reserved + (row,))
            txn.put(k, CR.encode_restore(rec), db=db["restores"])
    finally:
        env.close()
    with pytest.raises(CorruptionError, match="data.mdb"):
        tqstore.open(tmp_path / "dst")
