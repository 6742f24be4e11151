"""Issue #8: bad input gets a clear TqstoreError before anything is written, and nothing
acknowledged is lost; valid but unusual input (huge ints, conjugate views) round-trips;
damaged metadata is a CorruptionError naming the file, on open and in verify."""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import lmdb
import numpy as np
import pytest
import torch

import tqstore
import tqstore as tq
from tqstore import layout_dirs as L
from tqstore._format.names import LMDB_MAX_KEY_BYTES, MAX_FIELD_BYTES, MAX_NAME_BYTES, MIN_KEY_BYTES
from tqstore._native import crc32c
from tqstore.checkpoint import CheckpointManager
from tqstore.checkpoint import manifest as M
from tqstore.cli import EXIT_DAMAGED, EXIT_OK, main
from tqstore.errors import (
    CheckpointError, CorruptionError, InvalidInputError, StorageIOError, TqstoreError, UnsupportedTypeError,
)
from tqstore.streaming import MAX_INSERT_ROWS

ROOT = Path(__file__).resolve().parents[1]


def _seed(s) -> None:
    s.kv_batch_put(["a", "b"], "p", fields={"x": torch.arange(4.0).view(2, 2), "t": ["one", "two"]},
                   tags=[{"step": 1}, {"step": 2}])
    s.put({"x": torch.ones(1, 2)}, partition_id="stream")


def _plain_rows(out):
    return {k: (out[k].tolist() if isinstance(out[k], torch.Tensor) else list(out[k])) for k in out.keys()}


def _state(s):
    return {"kv": s.kv_list(), "parts": s.get_partition_list(),
            "a_b": _plain_rows(s.kv_batch_get(["a", "b"], "p")),
            "stream": s.get_meta(["x"], None, "stream", mode="force_fetch").global_indexes,
            "unit_entries": sorted(e for u in s.units for e in u.keys())}


def _sparse_csr():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "Sparse CSR tensor support is in beta state"
        return torch.eye(2).to_sparse_csr()


# (name, call, expected error classes): every input a caller can get wrong
BAD_INPUTS = [
    ("key over the LMDB key limit", lambda s: s.kv_put("k" * 600, "p", fields={"x": torch.zeros(2)}),
     (InvalidInputError, ValueError)),
    ("key one byte over the limit", lambda s: s.kv_batch_put(["k" * (LMDB_MAX_KEY_BYTES - 1)], "p",
                                                             fields={"x": torch.zeros(1, 2)}),
     (InvalidInputError,)),
    ("partition id over the limit", lambda s: s.kv_put("k", "p" * (MAX_NAME_BYTES + 1), fields={"x": torch.zeros(2)}),
     (InvalidInputError,)),
    ("partition id over the limit, streaming put", lambda s: s.put({"x": torch.zeros(1, 2)},
                                                                  partition_id="q" * 600), (InvalidInputError,)),
    ("task name over the limit", lambda s: s.get_meta(["x"], 1, "p", task_name="t" * 600), (InvalidInputError,)),
    ("field name over the limit", lambda s: s.kv_put("k", "p", fields={"f" * 256: torch.zeros(2)}),
     (InvalidInputError,)),
    ("key with a lone surrogate", lambda s: s.kv_put("\ud800", "p", fields={"x": torch.zeros(2)}),
     (InvalidInputError, ValueError)),
    ("partition id with a lone surrogate", lambda s: s.kv_batch_put(["k"], "p\udfff", fields={"x": torch.zeros(1, 2)}),
     (InvalidInputError,)),
    ("partition id with a lone surrogate, insert", lambda s: s.get_meta(["x"], 2, "\ud800", mode="insert"),
     (InvalidInputError,)),
    ("task name with a lone surrogate", lambda s: s.get_meta(["x"], 1, "p", task_name="\ud800"),
     (InvalidInputError,)),
    ("field name with a lone surrogate", lambda s: s.kv_put("k", "p", fields={"\ud800": torch.zeros(2)}),
     (InvalidInputError,)),
    ("string value with a lone surrogate", lambda s: s.kv_batch_put(["k"], "p", fields={"t": ["ok\ud800"]}),
     (InvalidInputError,)),
    ("nested string value with a lone surrogate", lambda s: s.kv_put("k", "p", fields={"v": {"a": ["\ud800"]}}),
     (InvalidInputError,)),
    ("tag with a lone surrogate", lambda s: s.kv_put("k", "p", tag={"a": "\ud800"}), (InvalidInputError,)),
    ("tag key with a lone surrogate", lambda s: s.kv_put("a", "p", tag={"\ud800": 1}), (InvalidInputError,)),
    ("sparse COO tensor", lambda s: s.kv_batch_put(["k", "l"], "p", fields={"y": torch.eye(2).to_sparse()}),
     (UnsupportedTypeError, TypeError)),
    ("sparse CSR tensor", lambda s: s.kv_batch_put(["k", "l"], "p", fields={"y": _sparse_csr()}),
     (UnsupportedTypeError,)),
    ("sparse tensor, one row", lambda s: s.kv_put("k", "p", fields={"y": torch.eye(2).to_sparse()}),
     (UnsupportedTypeError,)),
    ("sparse rows in a list", lambda s: s.kv_batch_put(["k"], "p", fields={"y": [torch.eye(2).to_sparse()]}),
     (UnsupportedTypeError,)),
    ("meta-device tensor", lambda s: s.kv_batch_put(["k"], "p", fields={"y": torch.zeros(1, 3, device="meta")}),
     (UnsupportedTypeError,)),
    ("insert of 10**12 rows", lambda s: s.get_meta(["x"], 10 ** 12, "p", mode="insert"), (InvalidInputError,)),
    ("insert one row over the limit", lambda s: s.get_meta(["x"], MAX_INSERT_ROWS + 1, "p", mode="insert"),
     (InvalidInputError,)),
    ("structured numpy dtype", lambda s: s.kv_batch_put(["k"], "p", fields={
        "st": np.zeros(1, dtype=[("a", "i4"), ("b", "f4")])}), (UnsupportedTypeError,)),
    ("structured numpy scalar value", lambda s: s.kv_batch_put(["k"], "p", fields={
        "st": [np.zeros(1, dtype=[("a", "i4")])[0]]}), (UnsupportedTypeError,)),
    ("numpy masked array (its mask would be lost)", lambda s: s.kv_batch_put(["k", "l"], "p", fields={
        "m": np.ma.masked_array(np.zeros((2, 3)), mask=np.eye(2, 3))}), (UnsupportedTypeError,)),
    ("numpy masked array rows", lambda s: s.kv_batch_put(["k"], "p", fields={
        "m": [np.ma.masked_array([1.0, 2.0], mask=[0, 1])]}), (UnsupportedTypeError,)),
    ("numpy masked array, streaming put", lambda s: s.put({"m": np.ma.masked_array(np.zeros((2, 1)))},
                                                          partition_id="p"), (UnsupportedTypeError,)),
    ("rows of 33 dimensions (a frame records 32)", lambda s: s.kv_batch_put(["k"], "p", fields={
        "d": torch.zeros((1,) + (1,) * 33)}), (InvalidInputError,)),
    ("one jagged row of 33 dimensions", lambda s: s.kv_batch_put(["k", "l"], "p", fields={
        "d": [np.zeros((2,) * 3), np.zeros((1,) * 33)]}), (InvalidInputError,)),
    *[(f"compact(live_ratio={v!r})", lambda s, v=v: s.compact(live_ratio=v), (InvalidInputError,))
      for v in ("0.5", np.str_("0.5"), None, float("nan"), 0, -1, 2, True, 0.5 + 1j, np.complex128(0.5))],
    *[(f"force_fetch of field name {f!r}", lambda s, f=f: s.get_meta(["x", f], None, "p", mode="force_fetch"),
       (InvalidInputError,)) for f in ("bad\0name", "", "y" * 300)],
    ("int field name", lambda s: s.kv_batch_put(["k"], "p", fields={5: torch.zeros(1)}), (InvalidInputError,)),
    ("int field name, streaming put", lambda s: s.put({5: torch.zeros(1)}, partition_id="p"), (InvalidInputError,)),
    ("NUL in a key", lambda s: s.kv_put("a\0b", "p", fields={"x": torch.zeros(2)}), (InvalidInputError,)),
    ("one dict for the tags of a batch (its keys would become the tags)",
     lambda s: s.kv_batch_put(["a", "b"], "p", tags={"score": 0.5, "len": 3}), (InvalidInputError,)),
    ("a sampling_config that is not a dict", lambda s: s.get_meta(["x"], 1, "p", task_name="t", sampling_config=[1]),
     (InvalidInputError,)),
]


@pytest.mark.parametrize("name,call,errors", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_raises_a_tqstore_error_and_writes_nothing(tmp_path, name, call, errors):
    with tqstore.open(tmp_path / "s", num_units=2) as s:
        _seed(s)
        before = _state(s)
        with pytest.raises(TqstoreError) as ei:
            call(s)
        for cls in errors:
            assert isinstance(ei.value, cls), (name, type(ei.value).__mro__)
        assert str(ei.value)
        assert _state(s) == before
    with tqstore.open(tmp_path / "s") as s:  # reopens, earlier rows intact
        assert _state(s) == before
        s.kv_put("c", "p", fields={"x": torch.zeros(2), "t": "three"})  # and keeps working


def test_bad_input_through_the_module_api(tmp_path):
    tq.init({"path": str(tmp_path / "s")})
    try:
        tq.kv_put("a", "p", fields={"x": torch.zeros(2)}, tag={"n": 1})
        for call in (lambda: tq.kv_put("\ud800", "p", fields={"x": torch.zeros(2)}),
                     lambda: tq.kv_batch_put(["k" * 600], "p", fields={"x": torch.zeros(1, 2)}),
                     lambda: tq.kv_put("k", "p", fields={"s": torch.eye(2).to_sparse()}),
                     lambda: tq.get_meta(["x"], 10 ** 12, "p", mode="insert"),
                     lambda: tq.get_client().put({"x": torch.zeros(1, 2)}, partition_id="\ud800")):
            with pytest.raises(TqstoreError):
                call()
        assert tq.kv_list() == {"p": {"a": {"n": 1}}}
    finally:
        tq.close()


# ---------------------------------------------------------------------------- limits, exactly
def test_lmdb_key_limit_is_the_one_the_limits_are_computed_from(tmp_path):
    env = lmdb.open(str(tmp_path / "e"))
    try:
        assert env.max_key_size() == LMDB_MAX_KEY_BYTES == 511
    finally:
        env.close()
    assert MIN_KEY_BYTES == 260 and 2 * MAX_NAME_BYTES + 10 <= 511 and MAX_NAME_BYTES + 1 + MAX_FIELD_BYTES <= 511


def test_names_and_keys_at_their_byte_limits_work_and_survive_reopen(tmp_path):
    pid = "é" * (MAX_NAME_BYTES // 2)  # 250 UTF-8 bytes
    task = "t" * MAX_NAME_BYTES
    field = "f" * MAX_FIELD_BYTES
    key = "k" * (LMDB_MAX_KEY_BYTES - 1 - MAX_NAME_BYTES)  # 260 bytes: the most a key of this partition may have
    with tqstore.open(tmp_path / "s") as s:
        s.kv_batch_put([key], pid, fields={field: torch.arange(3)[None]}, tags=[{"k": 1}])
        with pytest.raises(InvalidInputError, match="260 allowed"):
            s.kv_batch_put([key + "k"], pid, fields={field: torch.arange(3)[None]})
        long_key = "k" * (LMDB_MAX_KEY_BYTES - 2)  # 509 bytes: fits beside a one-byte partition id
        s.kv_put(long_key, "p", fields={"x": torch.zeros(1)})
        assert s.get_meta([field], 1, pid, task_name=task).size == 1  # cons key: 250 + 1 + 250 + 1 + 8 bytes
    with tqstore.open(tmp_path / "s") as s:
        assert s.kv_list()[pid] == {key: {"k": 1}}
        assert s.kv_batch_get(key, pid)[field].tolist() == [[0, 1, 2]]
        assert list(s.kv_list()["p"]) == [long_key]
        assert s.get_meta([field], 1, pid, task_name=task).size == 0  # consumed, and remembered


# ---------------------------------------------------------------------------- round trips
@pytest.mark.parametrize("big", [10 ** 5000, -(10 ** 5000) - 7, [1, {"n": 3 ** 20000}], 2 ** 64],
                         ids=["10**5000", "-10**5000-7", "nested-3**20000", "2**64"])
def test_integers_of_any_size_round_trip_as_tags_and_values(tmp_path, big):
    with tqstore.open(tmp_path / "s", num_units=2) as s:
        s.kv_put("a", "p", fields={"v": big}, tag={"big": big})
        s.kv_batch_put(["b"], "p", fields={"v": [big]}, tags=[big])
        assert s.kv_list()["p"] == {"a": {"big": big}, "b": big}
        assert s.kv_batch_get(["a", "b"], "p")["v"] == [big, big]
        s.save_checkpoint(tmp_path / "ckpt")
    with tqstore.open(tmp_path / "s") as s:
        assert s.kv_list()["p"] == {"a": {"big": big}, "b": big}
        assert s.kv_batch_get(["a", "b"], "p")["v"] == [big, big]
    with tqstore.open(tmp_path / "s2", num_units=3) as s:  # through a checkpoint, resharded
        s.load_checkpoint(tmp_path / "ckpt")
        assert s.kv_list()["p"] == {"a": {"big": big}, "b": big}
        assert s.kv_batch_get(["a", "b"], "p")["v"] == [big, big]
    assert tqstore.verify_checkpoint(tmp_path / "ckpt").ok


def test_big_integers_round_trip_under_the_smallest_int_digit_limit(tmp_path):
    import sys

    old = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(640)
    try:
        with tqstore.open(tmp_path / "s") as s:
            s.kv_put("a", "p", fields={"v": 10 ** 700 + 1}, tag=-(10 ** 700))
        with tqstore.open(tmp_path / "s") as s:
            assert s.kv_list()["p"]["a"] == -(10 ** 700)
            assert s.kv_batch_get("a", "p")["v"] == [10 ** 700 + 1]
    finally:
        sys.set_int_max_str_digits(old)


def _bits(t: torch.Tensor) -> bytes:
    return t.resolve_conj().resolve_neg().contiguous().numpy().tobytes()


def test_conjugate_and_negative_views_are_stored_as_their_values_bit_identical(tmp_path):
    z = torch.complex(torch.randn(3, 4), torch.randn(3, 4))
    conj = z.conj()  # lazy: its memory holds z
    neg = z.conj().imag  # a negative-bit view of a real tensor
    assert conj.is_conj() and neg.is_neg()
    with tqstore.open(tmp_path / "s", num_units=2) as s:
        s.kv_batch_put(["a", "b", "c"], "p", fields={"c": conj, "n": neg, "c128": conj.to(torch.complex128)})
        s.kv_put("d", "q", fields={"c": conj[0]})  # one row
        s.kv_batch_put(["e", "f"], "q2", fields={"c": [conj[0], conj[1, :2]]})  # jagged rows
    with tqstore.open(tmp_path / "s") as s:
        got = s.kv_batch_get(["a", "b", "c"], "p")
        assert _bits(got["c"]) == _bits(conj) and torch.equal(got["c"], conj.resolve_conj())
        assert _bits(got["n"]) == _bits(neg) and torch.equal(got["n"], -z.imag)
        assert _bits(got["c128"]) == _bits(conj.to(torch.complex128))
        assert _bits(s.kv_batch_get("d", "q")["c"][0]) == _bits(conj[0])
        rows = s.kv_batch_get(["e", "f"], "q2")["c"].unbind()
        assert _bits(rows[0]) == _bits(conj[0]) and _bits(rows[1]) == _bits(conj[1, :2])


# ---------------------------------------------------------------------------- damaged metadata
def _controller_env(store_root: Path) -> lmdb.Environment:
    state = store_root / L.read_current(store_root)
    return lmdb.open(str(L.controller_dir(state)), max_dbs=12, lock=False)


def _put_raw(env, db: bytes, key: bytes, value: bytes, *, delete: bool = False) -> None:
    with env.begin(write=True) as txn:
        d = env.open_db(db, txn=txn)
        if delete:
            txn.delete(key, db=d)
        else:
            txn.put(key, value, db=d)


def _gidx_key(g: int) -> bytes:
    return g.to_bytes(8, "big")


ROW_OK = b'{"p":"p","k":"a","t":null,"f":["x"],"s":0}'
CRAFTED = [
    ("row value not UTF-8", b"rows", _gidx_key(0), b"\xff\xfe{"),
    ("row value not JSON", b"rows", _gidx_key(0), b"{nope"),
    ("row value a JSON list", b"rows", _gidx_key(0), b"[1, 2]"),
    ("row partition an int", b"rows", _gidx_key(0), b'{"p":5,"k":"a","t":null,"f":["x"],"s":0}'),
    ("row fields not a list", b"rows", _gidx_key(0), b'{"p":"p","k":"a","t":null,"f":5,"s":0}'),
    ("row seq a string", b"rows", _gidx_key(0), b'{"p":"p","k":"a","t":null,"f":[],"s":"0"}'),
    ("row member missing", b"rows", _gidx_key(0), b'{"p":"p","k":"a","f":[],"s":0}'),
    ("row of an unknown partition", b"rows", _gidx_key(0), ROW_OK.replace(b'"p":"p"', b'"p":"zz"')),
    ("row key of the wrong length", b"rows", b"\x01", ROW_OK),
    ("row beyond next_gidx", b"rows", _gidx_key(99), ROW_OK.replace(b'"k":"a"', b'"k":"zz"')),
    ("two rows claim one key", b"rows", _gidx_key(1), ROW_OK.replace(b'"s":0', b'"s":1')),
    ("partition value a JSON string", b"parts", b"p", b'"x"'),
    ("partition id not UTF-8", b"parts", b"\xff", b'{"next_seq": 0, "meta": {}}'),
    ("schema value without kind", b"schema", b"p\0x", b'{"dtype": 9}'),
    ("schema kind unknown", b"schema", b"p\0x", b'{"kind": 7, "dtype": 9}'),
    ("schema key without NUL", b"schema", b"px", b'{"kind": 0, "dtype": 9}'),
    ("consumption key too short", b"cons", b"t\0", b""),
    ("consumption key not UTF-8", b"cons", b"\xff\0p\0" + _gidx_key(0), b""),
    ("unit count not a number", b"meta", b"num_units", b"two"),
    ("unit count zero", b"meta", b"num_units", b"0"),
    ("next_gidx negative", b"meta", b"next_gidx", b"-1"),
    ("put_token garbage", b"meta", b"put_token", b"\xff"),
    ("format garbage", b"meta", b"format", b"v1"),
    ("free entry of the wrong length", b"free", b"\x00", b""),
    ("free entry that is a row", b"free", _gidx_key(0), b""),
    ("sampler state not JSON", b"sampler", b"p", b"\x80"),
]


def _made_store(root: Path) -> None:
    with tqstore.open(root, num_units=2) as s:
        s.kv_batch_put(["a", "b"], "p", fields={"x": torch.zeros(2, 3)}, tags=[{"n": 1}, None])
        assert s.get_meta(["x"], 1, "p", task_name="t").size == 1


@pytest.mark.parametrize("name,db,key,value", CRAFTED, ids=[c[0] for c in CRAFTED])
def test_crafted_controller_value_is_a_corruption_error_naming_the_file(tmp_path, name, db, key, value):
    root = tmp_path / "s"
    _made_store(root)
    env = _controller_env(root)
    try:
        _put_raw(env, db, key, value)
        data_mdb = Path(env.path()) / "data.mdb"
    finally:
        env.close()
    with pytest.raises(CorruptionError) as ei:
        tqstore.open(root)
    assert ei.value.path == str(data_mdb) and str(data_mdb) in str(ei.value)
    assert "controller index" in str(ei.value)
    with pytest.raises(CorruptionError):  # the failed open released the store: a second try says the same
        tqstore.open(root)


def test_missing_meta_value_is_a_corruption_error(tmp_path):
    root = tmp_path / "s"
    _made_store(root)
    env = _controller_env(root)
    try:
        _put_raw(env, b"meta", b"next_gidx", b"", delete=True)
    finally:
        env.close()
    with pytest.raises(CorruptionError, match="next_gidx"):
        tqstore.open(root)


def _reseal_controller(ckpt: Path) -> None:
    """Rewrite MANIFEST.json so that its controller entry matches the (edited) controller file."""
    man = M.parse((ckpt / M.MANIFEST_NAME).read_bytes())
    files = []
    for e in man.files:
        if e.path == M.CONTROLLER_FILE:
            data = (ckpt / e.path).read_bytes()
            blocks = None
            if e.block_crc32c is not None:
                blocks = tuple(crc32c(data[i:i + M.INDEX_BLOCK_BYTES])
                               for i in range(0, len(data), M.INDEX_BLOCK_BYTES))
            e = M.FileEntry(e.path, e.role, len(data), crc32c(data), e.unit, e.seg, e.frames, e.live_bytes, e.origin,
                            blocks)
        files.append(e)
    raw = M.build(created_unix=man.created_unix, include_storage=man.include_storage, num_units=man.num_units,
                  snapshot=man.snapshot, metadata=man.metadata, files=files)
    (ckpt / M.MANIFEST_NAME).write_bytes(raw)


@pytest.mark.parametrize("name,db,key,value", [c for c in CRAFTED if c[1] in (b"rows", b"parts", b"cons", b"meta")
                                                and c[0] != "row beyond next_gidx"],
                         ids=lambda v: v if isinstance(v, str) else None)
def test_verify_reports_a_crafted_controller_value_instead_of_ok(tmp_path, name, db, key, value):
    root = tmp_path / "s"
    _made_store(root)
    with tqstore.open(root) as s:
        s.save_checkpoint(tmp_path / "ckpt", copy_segments=True)
    ckpt = tmp_path / "ckpt"
    assert tqstore.verify_checkpoint(ckpt).ok
    env = lmdb.open(str(ckpt / "controller"), max_dbs=12, lock=False)
    try:
        _put_raw(env, db, key, value)
    finally:
        env.close()
    for extra in ("lock.mdb",):
        if (ckpt / "controller" / extra).exists():
            os.unlink(ckpt / "controller" / extra)
    _reseal_controller(ckpt)
    rep = tqstore.verify_checkpoint(ckpt, raise_on_error=False)
    assert not rep.ok
    assert any(p.path == str(ckpt / "controller" / "data.mdb") and "controller" in p.message for p in rep.problems), \
        rep.problems
    with pytest.raises(CorruptionError):
        tqstore.verify_checkpoint(ckpt)
    # a load refuses it and leaves the store as it was (same unit count: the controller is copied
    # as is; another count: its num_units is rewritten, so that value's damage does not matter)
    for units in ((2,) if key == b"num_units" else (2, 1)):
        with tqstore.open(tmp_path / f"other-{units}", num_units=units) as s:
            s.kv_put("z", "mine", fields={"v": 1})
            with pytest.raises((CorruptionError, CheckpointError)):
                s.load_checkpoint(ckpt)
            assert s.kv_list() == {"mine": {"z": {}}}


@pytest.mark.parametrize("member,value", [("num_units", v) for v in ("missing", "two", 0, -1, True, 1.5, None)]
                         + [("created", v) for v in ("abc", 1e300, -1e20, [1])])
def test_store_json_with_a_bad_member_is_a_corruption_error_naming_the_file(tmp_path, member, value):
    """A damaged STORE.json (a unit count that is no positive int, a creation time that is no
    unix time): CorruptionError naming the file and the member; the CLI says so in one line."""
    root = tmp_path / "s"
    with tqstore.open(root) as s:
        s.kv_put("a", "p", fields={"v": 1})
    p = root / L.STORE_FILE
    d = json.loads(p.read_text())
    if value == "missing":
        del d[member]
    else:
        d[member] = value
    p.write_text(json.dumps(d))
    with pytest.raises(CorruptionError) as ei:
        tqstore.open(root)
    assert ei.value.path == str(p) and member in str(ei.value)
    code, _, err = _cli("inspect", root)
    assert code == EXIT_DAMAGED and member in err and len(err.strip().splitlines()) == 1


# ---------------------------------------------------------------------------- checkpoint roots, reopen
def test_checkpoint_manager_on_an_unusable_root_raises_storage_io_error_with_the_path(tmp_path):
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(TqstoreError) as ei:  # a file in the way: refused as a root (CheckpointError)
        CheckpointManager(tmp_path / "file" / "gens")
    assert str(tmp_path / "file" / "gens") in str(ei.value)
    gens = tmp_path / "gens"
    with tqstore.open(tmp_path / "s") as s:
        s.kv_put("a", "p", fields={"v": 1})
        m = CheckpointManager(gens, store=s)
        os.unlink(gens / ".tqstore-checkpoints.lock")
        (gens / ".tqstore-checkpoints.lock").mkdir()  # the lock cannot be opened any more
        with pytest.raises(TqstoreError) as ei:
            m.prune()
        assert str(gens) in str(ei.value)
        with pytest.raises(TqstoreError):
            m.save(1)


def test_second_open_in_the_same_process_says_so(tmp_path):
    with tqstore.open(tmp_path / "s") as s:
        s.kv_put("a", "p", fields={"v": 1})
        with pytest.raises(StorageIOError, match="already open in this process"):
            tqstore.open(tmp_path / "s")
        os.symlink(tmp_path / "s", tmp_path / "alias")
        with pytest.raises(StorageIOError, match="already open in this process"):
            tqstore.open(tmp_path / "alias")  # keyed by real path
    with pytest.raises(TqstoreError):  # a failed open does not leave the store marked open
        tqstore.open(tmp_path / "s", num_units=3)
    with tqstore.open(tmp_path / "alias") as s:
        assert s.kv_list() == {"p": {"a": {}}}


# ---------------------------------------------------------------------------- CLI ls of a store
def _cli(*argv):
    out, err = io.StringIO(), io.StringIO()
    code = main(list(map(str, argv)), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_cli_ls_of_a_store_lists_partitions_with_row_and_key_counts(tmp_path):
    root = tmp_path / "s"
    with tqstore.open(root, num_units=2) as s:
        s.kv_batch_put(["a", "b", "c"], "train", fields={"x": torch.zeros(3, 2)})
        s.put({"x": torch.zeros(4, 2)}, partition_id="stream")
        s.get_meta(["x"], 2, "empty", mode="insert")
        s.kv_clear(["c"], "train")
        r = subprocess.run([sys.executable, "-m", "tqstore", "ls", str(root)], capture_output=True, text=True,
                           timeout=120, cwd=ROOT)  # while the store is open in another process
        assert r.returncode == EXIT_OK and r.stderr == ""
        want = [["2", "rows", "0", "keys", "empty"], ["4", "rows", "0", "keys", "stream"],
                ["2", "rows", "2", "keys", "train"]]
        assert [ln.split() for ln in r.stdout.splitlines()] == want
    code, out, err = _cli("ls", root)
    assert code == EXIT_OK and err == "" and [ln.split() for ln in out.splitlines()] == want
    code, out, _ = _cli("ls", root, "--json")
    assert code == EXIT_OK
    assert json.loads(out) == [{"partition": "empty", "rows": 2, "keys": 0},
                               {"partition": "stream", "rows": 4, "keys": 0},
                               {"partition": "train", "rows": 2, "keys": 2}]


def test_cli_ls_of_an_empty_store_and_of_a_damaged_one(tmp_path):
    root = tmp_path / "s"
    tqstore.open(root).close()
    assert _cli("ls", root)[:2] == (EXIT_OK, "")
    assert json.loads(_cli("ls", root, "--json")[1]) == []
    _made_store(tmp_path / "bad")
    env = _controller_env(tmp_path / "bad")
    try:
        _put_raw(env, b"rows", _gidx_key(0), b"[]")
    finally:
        env.close()
    code, out, err = _cli("ls", tmp_path / "bad")
    assert code == EXIT_DAMAGED and out == "" and "data.mdb" in err and "\n" == err[-1]


def test_cli_ls_of_a_generation_root_is_unchanged(tmp_path):
    with tqstore.open(tmp_path / "s") as s:
        s.kv_put("a", "p", fields={"v": 1})
        m = CheckpointManager(tmp_path / "gens", store=s)
        m.save(3)
        m.save(7)
    code, out, _ = _cli("ls", tmp_path / "gens")
    assert code == EXIT_OK and [ln.split()[0] for ln in out.splitlines()] == ["3", "7"]


def test_a_manifest_that_cannot_be_read_is_damage_naming_its_path_for_the_api_and_the_cli(tmp_path, monkeypatch):
    """A MANIFEST.json the process may not read (permission denied, an I/O error): the checkpoint
    cannot be loaded, so reading it is CorruptionError naming the file, and the CLI exits 1
    ("damaged or unreadable"), not 2, with one line."""
    from tqstore._io import files as F

    with tqstore.open(tmp_path / "s") as s:
        s.kv_put("a", "p", fields={"v": 1})
        s.save_checkpoint(tmp_path / "ck")
    real = F.open_regular

    def denied(p, *a, **k):
        if str(p).endswith("MANIFEST.json"):
            raise PermissionError(13, "Permission denied", str(p))
        return real(p, *a, **k)

    monkeypatch.setattr(F, "open_regular", denied)
    with pytest.raises(CorruptionError, match="cannot be read") as ei:
        M_read = __import__("tqstore.checkpoint", fromlist=["read_manifest"]).read_manifest
        M_read(tmp_path / "ck")
    assert ei.value.path == str(tmp_path / "ck" / "MANIFEST.json")
    for cmd in ("inspect", "verify"):
        code, out, err = _cli(cmd, tmp_path / "ck")
        assert code == EXIT_DAMAGED and "MANIFEST.json" in out + err and "Traceback" not in out + err, (cmd, out, err)


@pytest.mark.parametrize("tag", [b"x", {"r": b"x"}, {"r": np.zeros(2)}, [torch.ones(1)]])
def test_a_tag_that_cannot_be_stored_is_refused_in_words_about_tags(tmp_path, tag):
    """The refusal spoke of non-tensor fields ("bytes (a whole row)", "not inside a list"),
    which a tag never takes."""
    with tqstore.open(tmp_path / "s", num_units=1) as s:
        with pytest.raises(tqstore.UnsupportedTypeError, match="in a tag: a tag holds") as e:
            s.kv_put("k", "p", fields={"x": torch.zeros(1, 2)}, tag=tag)
        assert "whole row" not in str(e.value)
        assert s.kv_list() == {}


@pytest.mark.parametrize("rows,kinds", [
    ([torch.zeros(2), None], ("row 0 is a tensor", "row 1 None")),
    ([None, np.zeros(3)], ("row 1 is a numpy array", "row 0 None")),
    ([torch.zeros(2), np.zeros(2)], ("row 0 is a tensor", "row 1 a numpy array")),
    ([np.zeros(2), "text"], ("row 0 is a numpy array", "row 1 a value of type str")),
    ([None, torch.nn.Parameter(torch.zeros(2))], ("row 1 is a tensor", "row 0 None")),  # (a Tensor subclass)
])
def test_a_field_whose_rows_mix_tensors_with_other_rows_is_refused_naming_the_rows(tmp_path, rows, kinds):
    """A missing row given as None among tensor rows was refused as "cannot store a value of
    type Tensor: non-tensor fields accept ...", which names the rows that are right."""
    with tqstore.open(tmp_path / "s", num_units=2) as s:
        with pytest.raises(tqstore.UnsupportedTypeError) as e:
            s.kv_batch_put(["a", "b"], "p", fields={"x": rows})
        for part in kinds:
            assert part in str(e.value), str(e.value)
        assert "leave the keys that have no value for it out" in str(e.value)
        assert s.kv_list() == {}


def test_compact_takes_any_real_number_in_range(tmp_path):
    """The live_ratio check must not refuse what worked: a Fraction, a Decimal, a numpy or a
    0-d tensor number."""
    from decimal import Decimal
    from fractions import Fraction

    with tqstore.open(tmp_path / "s", num_units=1) as s:
        _seed(s)
        for v in (0.5, 1, Fraction(1, 2), Decimal("0.5"), np.float32(0.5), np.int64(1), torch.tensor(0.5)):
            assert s.compact(live_ratio=v) >= 0, v
