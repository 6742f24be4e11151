"""The controller's bulk decode on open (tqstore/controller_decode.py): a reopened store's
mirror is exactly the one it closed with, whatever its keys look like, and a damaged
``keys`` entry is a CorruptionError naming the file, never a wrong mirror."""
from __future__ import annotations

import lmdb
import numpy as np
import pytest

import tqstore
from tqstore import layout_dirs as L
from tqstore._format import controller_records as R
from tqstore.errors import CorruptionError

KEYS = ["", "k", "train", "train\u00e9", "\u4e2d\u6587/\U0001F600", "a" * 200, "x y", "k\x01"]


def _state(s):
    c = s.controller
    c.check_mirror()
    out = {"keys": c.list_keys(), "parts": c.partitions()}
    for pid in out["parts"]:
        rb = c.first_rows(pid)
        out[pid] = (rb.gidxs, rb.keys, rb.tags, [sorted(f) for f in rb.fields], rb.seqs)
        out[pid, "resolve"] = c.resolve_keys(pid, [k for k in rb.keys if k is not None])
    return out


def _ids(n, v=0):
    return {"x": np.full((n, 2), v, np.int64)}


def test_a_reopened_mirror_equals_the_closed_one(tmp_path):
    root = tmp_path / "s"
    with tqstore.open(root, num_units=3, result_type="dict") as s:
        s.kv_batch_put(KEYS, "train", _ids(len(KEYS)), tags=[None, {"t": 1}] + [None] * (len(KEYS) - 2))
        s.kv_batch_put([f"k{i}" for i in range(70_000)], "train", _ids(70_000, 1))  # more than one chunk
        s.write("train", _ids(5, 2), new_rows=True)  # unkeyed rows among keyed ones
        s.kv_batch_put(["train", "t"], "train\u00e9", _ids(2, 3))  # a partition whose id extends another's
        s.kv_batch_put(["z"], "a", _ids(1))
        s.kv_clear(["k", "k5", "k69999"], "train")
        s.kv_batch_put(["k5", "new"], "train", _ids(2, 4))  # a cleared key comes back, later in seq order
        before = _state(s)
    with tqstore.open(root, result_type="dict") as s:
        assert _state(s) == before
        got = s.kv_batch_get(KEYS[2:] + ["k5"], "train")
        assert np.asarray(got["x"])[-1].tolist() == [4, 4]



def _damage_key(root, find, replace):
    env = lmdb.open(str(L.controller_dir(root / L.read_current(root))), max_dbs=12)
    db = env.open_db(b"keys")
    with env.begin(write=True) as txn:
        k = R.keys_key("p", find)
        v = txn.get(k, db=db)
        txn.delete(k, db=db)
        txn.put(replace, v, db=db)
    env.close()


@pytest.mark.parametrize("replace", [b"p\0k1\xff", b"p\0k1\0extra", b"p\0k2"])
def test_a_damaged_keys_entry_is_a_corruption_error_naming_the_file(tmp_path, replace):
    root = tmp_path / "s"
    with tqstore.open(root, num_units=1) as s:
        s.kv_batch_put([f"k{i}" for i in range(1, 50)], "p", _ids(49))
    _damage_key(root, "k1", replace)  # bad UTF-8, a NUL in the key, a key already taken
    with pytest.raises(CorruptionError) as e:
        tqstore.open(root)
    assert "data.mdb" in str(e.value)


TAGS = [{"reward": 0.5, "uid": "a"}, 3, -1.5, "s", [1, {"x": None}], True, float("inf"), 10 ** 30, {},
        {"\u00e9": "\u4e2d"}, 2 ** 70 * 10 ** 4400]  # non-ASCII and huge integers take the per-row path


@pytest.mark.parametrize("mixed", [False, True])
def test_tagged_rows_reopen_with_their_tags(tmp_path, mixed):
    root = tmp_path / "s"
    tags = TAGS if mixed else [{"reward": i / 7, "uid": f"u{i}", "v": i} for i in range(5000)]
    keys = [f"k{i}" for i in range(len(tags))]
    with tqstore.open(root, num_units=2, result_type="dict") as s:
        s.kv_batch_put(keys, "p", _ids(len(keys)), tags=tags)
        s.kv_batch_put(["plain"], "p", _ids(1))  # an untagged row among tagged ones
        before = _state(s)
    with tqstore.open(root, result_type="dict") as s:
        assert _state(s) == before
        assert [s.kv_list("p")["p"][k] for k in keys[:3]] == tags[:3]


@pytest.mark.parametrize("tag", [b"1,2", b"{\"a\":1", b" 1", b"null", b"1]", b"\xff"])
def test_a_damaged_tag_is_a_corruption_error(tmp_path, tag):
    root = tmp_path / "s"
    with tqstore.open(root, num_units=1) as s:
        s.kv_batch_put([f"k{i}" for i in range(20)], "p", _ids(20), tags=[{"r": i} for i in range(20)])
    env = lmdb.open(str(L.controller_dir(root / L.read_current(root))), max_dbs=12)
    keys_db, rows_db = env.open_db(b"keys"), env.open_db(b"rows")
    with env.begin(write=True) as txn:
        g = txn.get(R.keys_key("p", "k7"), db=keys_db)
        v = txn.get(g, db=rows_db)
        txn.put(g, v[:24] + tag, db=rows_db)
    env.close()
    if tag == b" 1":  # JSON with a leading space is still one value: accepted by the per-row decode
        with tqstore.open(root) as s:
            assert s.kv_list("p")["p"]["k7"] == 1
        return
    with pytest.raises(CorruptionError) as e:
        tqstore.open(root)
    assert "data.mdb" in str(e.value)
