"""The controller's rows at a dump's cut (``Controller.snapshot_rows``, tqstore/controller_dump.py):
the bulk path over real LMDB entries answers what the row-by-row decoder answers, takes the
older row format and a mix of tagged and untagged rows, and refuses damaged entries by name."""
from __future__ import annotations

import numpy as np
import pytest

import tqstore
from tqstore import CorruptionError
from tqstore._format import controller_records as R


@pytest.fixture
def store(tmp_path):
    s = tqstore.open(tmp_path / "store", num_units=2, result_type="dict")
    s.kv_batch_put([f"k{i}" for i in range(6)], "p", fields={"x": np.arange(6).reshape(6, 1)},
                   tags=[{"i": i} if i % 2 else None for i in range(6)])
    s.kv_batch_put(["k1", "k4"], "p", fields={"y": np.ones((2, 2), np.float32)})
    s.kv_batch_put(["q0"], "q", fields={"x": np.zeros((1, 1), np.int64)})
    yield s
    s.close()


def _rows(store, keys, pid="p"):
    c = store.controller
    snap = c.snapshot()
    try:
        return c.snapshot_rows(snap, pid, keys)
    finally:
        c.release(snap)


def _edit(store, gidx, value: bytes) -> None:
    c = store.controller
    with c.env.begin(write=True) as txn:
        txn.put(R.gidx_key(gidx), value, db=c.db["rows"])


def test_rows_at_the_cut_match_the_live_rows_tagged_untagged_and_with_several_field_sets(store):
    keys = ["k5", "k0", "k1", "nope", "k4", "k2"]
    rb = _rows(store, keys)
    assert rb.missing() == [3] and rb.keys == keys
    live = store.controller.rows_by_key("p", keys)
    assert rb.gidxs == live.gidxs and rb.tags == live.tags and rb.seqs == live.seqs
    assert rb.fields == live.fields
    assert rb.fields[2] == frozenset({"x", "y"}) and rb.tags[1] is None and rb.tags[0] == {"i": 5}


def test_a_row_of_the_older_json_format_is_read_among_the_others(store):
    g = store.controller.resolve_keys("p", ["k3"])[0]
    _edit(store, g, R.encode_row("p", "k3", {"old": True}, ["x"], 3))
    rb = _rows(store, ["k2", "k3", "k4"])
    assert rb.tags == [None, {"old": True}, None] and rb.fields[1] == frozenset({"x"}) and rb.seqs[1] == 3


@pytest.mark.parametrize("damage,match", [
    ("other_partition", "another"),
    ("unknown_bit", "bit"),
    ("short", "row value"),
    ("bad_tag", "tag"),
    ("tail_without_tag_flag", "row value|bitmap|bytes"),
    ("unknown_flag", "flags"),
])
def test_a_damaged_row_value_is_corruption_naming_the_controller_index(store, damage, match):
    c = store.controller
    g = c.resolve_keys("p", ["k2"])[0]
    with c.env.begin() as txn:
        v = bytes(txn.get(R.gidx_key(g), db=c.db["rows"]))
    part, flags, words, seq = R.ROW2_HEAD.unpack_from(v)
    mask = v[R.ROW2_HEAD.size:R.ROW2_HEAD.size + 8]
    bad = {
        "other_partition": R.ROW2_HEAD.pack(part + 1, flags, words, seq) + mask,
        "unknown_bit": R.ROW2_HEAD.pack(part, flags, words, seq) + (1 << 40).to_bytes(8, "little"),
        "short": v[:R.ROW2_HEAD.size + 3],
        "bad_tag": R.ROW2_HEAD.pack(part, flags | R.ROW2_TAGGED, words, seq) + mask + b"{nope",
        "tail_without_tag_flag": R.ROW2_HEAD.pack(part, flags & ~R.ROW2_TAGGED, words, seq) + mask + b"{}",
        "unknown_flag": R.ROW2_HEAD.pack(part, flags | 0x80, words, seq) + mask,
    }[damage]
    _edit(store, g, bad)
    with pytest.raises(CorruptionError, match=match) as ei:
        _rows(store, ["k0", "k2", "k4"])
    assert "data.mdb" in str(ei.value)
    assert _rows(store, ["k0", "k4"]).missing() == []  # only the damaged row is refused
