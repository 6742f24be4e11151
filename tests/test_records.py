"""The LMDB record codecs of ``tqstore/_format`` (docs/FORMAT.md, "Unit index", "Controller index").

* the bytes are those the code wrote before the codecs got one home: literals of the old
  expressions, for a few records, and the raw entries of a store written through the engine;
* every codec round-trips (Hypothesis);
* every decoder raises :class:`RecordError` (and nothing else) for malformed input, and the
  engine turns it into ``CorruptionError`` naming the index.
"""
from __future__ import annotations

import json
import struct
import math
from pathlib import Path

import lmdb
import pytest
import torch
from hypothesis import given, settings, strategies as st

import tqstore
import tqstore.controller as controller_module
from tqstore import CorruptionError, FormatVersionError
from tqstore._format import controller_records as CR, unit_records as UR
from tqstore._format.dtypes import DTYPE_NAMES
from tqstore._format.index import decode_index_key, index_key
from tqstore._format.layout import KINDS
from tqstore._format.records import RecordError, decode_decimal, decode_json_object, encode_decimal

# ---------------------------------------------------------------------------- strategies
name = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), min_size=1, max_size=20)
key = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=20)
json_scalar = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=True) | \
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=10)
json_value = st.recursive(json_scalar, lambda kids: st.lists(kids, max_size=4) |
                          st.dictionaries(st.text(st.characters(blacklist_categories=("Cs",)), max_size=5), kids,
                                          max_size=4), max_leaves=12)
uint = st.integers(min_value=0, max_value=2**64 - 1)


# ---------------------------------------------------------------------------- same bytes as before
def test_controller_records_are_the_bytes_the_old_code_wrote():
    # each right-hand side is the expression controller.py / controller_mirror.py used before
    tag = {"r": "\u00e9", "big": 10**30, "x": [1.5, None, True]}
    assert CR.encode_row("p", "a", tag, {"y", "x"}, 3) == json.dumps(
        {"p": "p", "k": "a", "t": tag, "f": ["x", "y"], "s": 3}, separators=(",", ":"), allow_nan=True).encode()
    assert CR.encode_row("p", None, None, [], 0) == b'{"p":"p","k":null,"t":null,"f":[],"s":0}'
    assert CR.encode_row("\u00fc", "k", float("nan"), ["f"], 1) == b'{"p":"\\u00fc","k":"k","t":NaN,"f":["f"],"s":1}'
    assert CR.encode_partition(5, {}) == json.dumps({"next_seq": 5, "meta": {}}).encode() == \
        b'{"next_seq": 5, "meta": {}}'
    assert CR.encode_schema(0, 9) == json.dumps({"kind": 0, "dtype": 9}).encode() == b'{"kind": 0, "dtype": 9}'
    state = {"sampler": "seq", "state": {"t": {"n": 2}}}
    assert CR.encode_sampler(state) == json.dumps(state).encode()
    assert [encode_decimal(n) for n in (1, 0, 42)] == [str(1).encode(), b"0", b"42"]
    assert CR.gidx_key(258) == (258).to_bytes(8, "big") == b"\0" * 6 + b"\1\2"
    assert CR.keys_key("p", "k") == "p".encode() + b"\0" + "k".encode()
    assert CR.cons_key("t", "p", 258) == b"t\0p\0" + (258).to_bytes(8, "big")
    assert CR.cons_prefix("t", "p") + CR.gidx_key(7) == CR.cons_key("t", "p", 7)
    assert CR.schema_key("p", "x") == ("p" + "\0" + "x").encode()
    assert CR.parts_key("\u00e9") == CR.sampler_key("\u00e9") == "\u00e9".encode()
    assert (CR.META_FORMAT, CR.META_NUM_UNITS, CR.META_NEXT_GIDX, CR.META_PUT_TOKEN) == \
        (b"format", b"num_units", b"next_gidx", b"put_token")


def test_unit_records_are_the_bytes_the_old_code_wrote():
    info = UR.SegInfo(64, 0, False)
    assert info.pack() == json.dumps({"size": 64, "live": 0, "sealed": False}).encode() == \
        b'{"size": 64, "live": 0, "sealed": false}'
    assert UR.encode_seg_info(UR.SegInfo(1 << 33, 128, True)) == b'{"size": 8589934592, "live": 128, "sealed": true}'
    assert UR.seg_key(3) == (3).to_bytes(4, "big")
    assert UR.undo_key(5, b"\0" * 8 + b"x") == (5).to_bytes(8, "big") + b"\0" * 8 + b"x"
    assert UR.undo_prefix(5) == (5).to_bytes(8, "big")
    assert UR.META_FORMAT == b"format" and UR.encode_format() == str(1).encode()
    assert index_key(7, "f\u00e9") == (7).to_bytes(8, "big") + "f\u00e9".encode()


def _raw(env_dir: Path, db: bytes, k: bytes) -> bytes:
    env = lmdb.open(str(env_dir), readonly=True, lock=False, max_dbs=16, subdir=True)
    try:
        with env.begin() as txn:
            return bytes(txn.get(k, db=env.open_db(db, txn=txn, create=False)))
    finally:
        env.close()


def test_a_store_written_through_the_engine_holds_exactly_these_bytes(tmp_path, monkeypatch):
    monkeypatch.setattr(controller_module.secrets, "randbelow", lambda n: 0)  # (a new store's first seq: 0 here)
    root = tmp_path / "s"
    with tqstore.open(root, num_units=2) as s:
        s.kv_batch_put(["a", "b"], "p", fields={"x": torch.zeros(2, 3)}, tags=[{"n": 1, "u": "\u00e9"}, None])
        s.get_meta(["x"], 1, "p", task_name="t")
        s.controller.set_sampler_state("p", {"sampler": "seq", "state": {"t": {"n": 2}}})
        state = s.state_dir
    ctrl = state / "controller"
    assert _raw(ctrl, b"meta", b"format") == b"3"
    assert _raw(ctrl, b"meta", b"num_units") == b"2"
    assert _raw(ctrl, b"meta", b"next_gidx") == b"2"
    # version 2 rows: partition number u32, flags u16 (1 keyed, 2 tagged), bitmap words u16, seq u64,
    # the bitmap (bit 0: field "x"), then the tag's compact ASCII JSON
    assert _raw(ctrl, b"rows", b"\0" * 8) == (struct.pack("<IHHQ", 0, 3, 1, 0) + (1).to_bytes(8, "little")
                                              + b'{"n":1,"u":"\\u00e9"}')
    assert _raw(ctrl, b"rows", b"\0" * 7 + b"\1") == struct.pack("<IHHQ", 0, 1, 1, 1) + (1).to_bytes(8, "little")
    assert _raw(ctrl, b"keys", b"p\0b") == b"\0" * 7 + b"\1"
    assert _raw(ctrl, b"parts", b"p") == b'{"next_seq": 2, "meta": {}, "num": 0}'
    assert _raw(ctrl, b"schema", b"p\0x") == b'{"kind": 0, "dtype": 9, "bit": 0}'
    assert _raw(ctrl, b"cons", b"t\0p\0" + b"\0" * 8) == b""
    assert _raw(ctrl, b"sampler", b"p") == b'{"sampler": "seq", "state": {"t": {"n": 2}}}'
    unit = state / "unit-000" / "index"
    assert _raw(unit, b"meta", b"format") == b"1"
    seg = json.loads(_raw(unit, b"segs", b"\0\0\0\1"))
    assert _raw(unit, b"segs", b"\0\0\0\1") == json.dumps(seg).encode() and set(seg) == {"size", "live", "sealed"}


# ---------------------------------------------------------------------------- round trips
def test_row2_round_trips_and_the_bulk_encoder_writes_the_same_bytes():
    for part, keyed, seq, mask, tag in [(0, True, 0, 1, None), (7, False, 2**61, 2**64 - 1, None),
                                        (1, True, 5, 2**70 + 3, None), (2, False, 9, 0, {"a": [1, float("inf")]})]:
        tj = CR.encode_tag(tag)
        raw = CR.encode_row2(part, keyed, seq, mask, tj)
        r = CR.decode_row2(raw)
        assert (r.part, bool(r.flags & CR.ROW2_KEYED), r.seq, r.mask) == (part, keyed, seq, mask)
        assert CR.encode_tag(r.tag) == tj
    import numpy as np
    keyed, seqs, masks = np.array([True, False, True]), np.array([3, 4, 5]), [1, 2, 3]
    assert CR.encode_rows2(4, keyed, seqs, masks) == [CR.encode_row2(4, k, q, m) for k, q, m in zip([True, False, True],
                                                                                                 [3, 4, 5], masks)]
    tags = [CR.encode_tag(t) for t in ({"turn": 3}, None, "x\u00e9")]
    for ms in (masks, np.array(masks, np.uint64), [1, 2**64 - 1, 0], [1, 2**70, 3]):
        want = [CR.encode_row2(4, k, q, m, t) for k, q, m, t in zip([True, False, True], [3, 4, 5],
                                                                   np.asarray(ms, object).tolist(), tags)]
        assert CR.encode_rows2(4, keyed, seqs, ms, tags) == want
        assert [CR.decode_row2(v).tag for v in want] == [{"turn": 3}, None, "x\u00e9"]
    assert CR.gidx_keys(np.array([0, 1, 2**40])) == [CR.gidx_key(g) for g in (0, 1, 2**40)]


@given(name, st.none() | key, json_value, st.frozensets(name, max_size=5), uint)
def test_row_round_trips(pid, k, tag, fields, seq):
    rec = CR.decode_row(CR.encode_row(pid, k, tag, fields, seq))
    assert rec == CR.RowRecord(pid, k, tag, tuple(sorted(fields)), seq)
    assert CR.encode_row(*rec) == CR.encode_row(pid, k, tag, fields, seq)


def test_row_round_trips_non_finite_and_huge_values():
    rec = CR.decode_row(CR.encode_row("p", "k", [float("nan"), float("inf"), -10**5000], [], 0))
    assert math.isnan(rec.tag[0]) and rec.tag[1] == float("inf") and rec.tag[2] == -10**5000


@given(uint, st.dictionaries(st.text(max_size=5), json_scalar.filter(lambda v: not isinstance(v, float)), max_size=3))
def test_partition_round_trips(seq, meta):
    assert CR.decode_partition(CR.encode_partition(seq, meta)) == (seq, meta)


def test_partition_without_meta_reads_as_empty_meta():
    assert CR.decode_partition(b'{"next_seq": 3}') == (3, {})


@given(st.sampled_from(KINDS), st.sampled_from(sorted(DTYPE_NAMES)))
def test_schema_round_trips(kind, dtype):
    assert CR.decode_schema(CR.encode_schema(kind, dtype)) == (kind, dtype)


@given(st.dictionaries(st.text(max_size=5), json_value, max_size=4))
def test_sampler_round_trips(state):
    assert CR.decode_sampler(CR.encode_sampler(state)) == state


@given(uint)
def test_decimal_and_gidx_key_round_trip(n):
    assert decode_decimal(encode_decimal(n)) == n
    assert CR.decode_optional_decimal(encode_decimal(n)) == n
    assert CR.decode_gidx_key(CR.gidx_key(n)) == n


@given(name, key, name, uint)
def test_composite_keys_round_trip(pid, k, task, g):
    assert CR.decode_parts_key(CR.parts_key(pid)) == pid
    assert CR.decode_keys_key(CR.keys_key(pid, k)) == (pid, k)
    assert CR.decode_cons_key(CR.cons_key(task, pid, g)) == (task, pid, g)
    assert CR.decode_schema_key(CR.schema_key(pid, task)) == (pid, task)
    assert decode_index_key(index_key(g, task)) == (g, task)


@given(uint, uint, st.booleans(), st.integers(0, 2**32 - 1), uint, name)
def test_unit_records_round_trip(size, live, sealed, seg, token, field):
    info = UR.SegInfo(size, live, sealed)
    assert UR.SegInfo.unpack(info.pack()) == info == UR.decode_seg_info(UR.encode_seg_info(info))
    assert UR.decode_seg_key(UR.seg_key(seg)) == seg
    ik = index_key(seg, field)
    assert UR.decode_undo_key(UR.undo_key(token, ik)) == (token, ik)
    assert UR.decode_format(UR.encode_format()) == UR.UNIT_INDEX_FORMAT
    assert UR.decode_format(None) == 1  # written before the marker existed


# ---------------------------------------------------------------------------- malformed input
MALFORMED = {
    "decode_row": [None, b"", b"\xff", b"{nope", b"[1]", b'{"p":"p","k":"a","t":null,"f":["x"]}',
                   b'{"p":5,"k":"a","t":null,"f":[],"s":0}', b'{"p":"p","k":1,"t":null,"f":[],"s":0}',
                   b'{"p":"p","k":"a","t":null,"f":"x","s":0}', b'{"p":"p","k":"a","t":null,"f":[1],"s":0}',
                   b'{"p":"p","k":"a","t":null,"f":[],"s":-1}', b'{"p":"p","k":"a","t":null,"f":[],"s":true}',
                   b'{"p":"p","k":"a","t":null,"f":[],"s":"0"}', b"[" * 100000],
    "decode_partition": [b'"x"', b"{}", b'{"next_seq": -1}', b'{"next_seq": 1.0}', b'{"next_seq": 0, "meta": []}',
                         b'{"next_seq": false}'],
    "decode_schema": [b'{"dtype": 9}', b'{"kind": 7, "dtype": 9}', b'{"kind": 0, "dtype": 99}',
                      b'{"kind": true, "dtype": 9}', b'{"kind": 0, "dtype": "9"}', b"null"],
    "decode_row2": [None, b"", b"\0" * 23, struct.pack("<IHHQ", 0, 4, 1, 0) + bytes(8),  # unknown flag
                    struct.pack("<IHHQ", 0, 0, 0, 0), struct.pack("<IHHQ", 0, 0, 2, 0) + bytes(8),  # words
                    struct.pack("<IHHQ", 0, 0, 1, 0) + bytes(9),  # bytes after an untagged bitmap
                    struct.pack("<IHHQ", 0, 2, 1, 0) + bytes(8) + b"{nope",  # a tag that is no JSON
                    struct.pack("<IHHQ", 0, 2, 1, 0) + bytes(8) + b"null"],
    "decode_partition2": [b'{"next_seq": 0, "num": -1}', b'{"next_seq": 0, "num": 2147483648}',
                          b'{"next_seq": 0, "num": true}'],
    "decode_schema2": [b'{"kind": 0, "dtype": 9, "bit": -1}', b'{"kind": 0, "dtype": 9, "bit": 65536}',
                       b'{"kind": 0, "dtype": 9, "bit": 1.0}'],
    "decode_sampler": [b"\x80", b"[]", b"1", b""],
    "decode_decimal": [None, b"", b"-1", b"1.0", b" 1", b"two", b"\xff", b"1" * 21],
    "decode_gidx_key": [None, b"", b"\x01", b"\0" * 9],
    "decode_parts_key": [b"\xff", None],
    "decode_keys_key": [b"pk", b"\0k", b"\xff\0k"],
    "decode_cons_key": [b"t\0", b"\xff\0p\0" + b"\0" * 8, b"tp" + b"\0" * 9, b"\0p\0" + b"\0" * 8,
                        b"t\0\0" + b"\0" * 8, b"t\0p" + b"\1" + b"\0" * 8],
    "decode_schema_key": [b"px", b"p\0", b"\0x", b"\xff\0x"],
}
UNIT_MALFORMED = {
    "decode_seg_info": [None, b"{", b"[]", b'{"size": 64, "live": 0}', b'{"size": -1, "live": 0, "sealed": false}',
                        b'{"size": 64, "live": "0", "sealed": false}', b'{"size": 64, "live": 0, "sealed": 0}',
                        b'{"size": 6.4, "live": 0, "sealed": true}'],
    "decode_seg_key": [None, b"", b"\0\0\0", b"\0" * 5],
    "decode_undo_key": [None, b"", b"\0" * 16],
    "decode_format": [b"", b"v1", b"01", b"-1", b"\xff"],
}
CASES = [(CR, n, v) for n, vs in MALFORMED.items() for v in vs] + \
        [(UR, n, v) for n, vs in UNIT_MALFORMED.items() for v in vs]


@pytest.mark.parametrize("mod,fn,raw", CASES, ids=[f"{n}-{i}" for i, (_m, n, _v) in enumerate(CASES)])
def test_each_decoder_raises_record_error_for_malformed_input(mod, fn, raw):
    decode = getattr(mod, fn)
    with pytest.raises(RecordError):
        decode(raw)


def test_index_key_decoder_raises_record_error():
    for raw in (b"", b"\0" * 8, b"\0" * 8 + b"\xff"):
        with pytest.raises(RecordError):
            decode_index_key(raw)


DECODERS = [CR.decode_row, CR.decode_row2, CR.decode_partition2, CR.decode_schema2, CR.decode_partition, CR.decode_schema, CR.decode_sampler, CR.decode_decimal,
            CR.decode_gidx_key, CR.decode_parts_key, CR.decode_keys_key, CR.decode_cons_key, CR.decode_schema_key,
            UR.decode_seg_info, UR.decode_seg_key, UR.decode_undo_key, UR.decode_format, decode_index_key,
            decode_json_object]


@settings(max_examples=300)
@given(st.sampled_from(DECODERS), st.binary(max_size=40) | st.builds(lambda d: json.dumps(d).encode(), json_value))
def test_decoders_raise_only_record_error_on_any_bytes(decode, raw):
    try:
        decode(raw)
    except RecordError:
        pass


def test_record_error_is_a_value_error_not_a_tqstore_error():
    assert issubclass(RecordError, ValueError) and not issubclass(RecordError, tqstore.TqstoreError)


def _put_raw(env_dir: Path, db: bytes, k: bytes, v: bytes) -> None:
    env = lmdb.open(str(env_dir), max_dbs=16, subdir=True)
    try:
        with env.begin(write=True) as txn:
            txn.put(k, v, db=env.open_db(db, txn=txn))
    finally:
        env.close()


@pytest.mark.parametrize("value", [b"{", b'{"size": "64", "live": 0, "sealed": false}', b"[]"])
def test_a_malformed_segment_record_is_a_corruption_error_naming_the_unit_index(tmp_path, value):
    root = tmp_path / "s"
    with tqstore.open(root, num_units=1) as s:
        s.kv_put("a", "p", fields={"x": torch.zeros(3)})
        index = s.state_dir / "unit-000" / "index"
    _put_raw(index, b"segs", b"\0\0\0\1", value)
    with pytest.raises(CorruptionError) as ei:
        tqstore.open(root)
    assert ei.value.path == str(index / "data.mdb") and "segs" in str(ei.value)


@pytest.mark.parametrize("value", [b"3", b"0", b"01", b"v1"])  # 1 and 2 are read (docs/FORMAT.md)
def test_an_unknown_unit_index_format_marker_is_a_format_version_error(tmp_path, value):
    root = tmp_path / "s"
    with tqstore.open(root, num_units=1) as s:
        index = s.state_dir / "unit-000" / "index"
    _put_raw(index, b"meta", b"format", value)
    with pytest.raises(FormatVersionError):
        tqstore.open(root)


# ---------------------------------------------------------------------------- STORE.json and CURRENT
def test_store_files_are_the_bytes_the_old_code_wrote_and_round_trip():
    from tqstore._format import store_files as SF

    d = SF.store_descriptor(3, created=1.5)
    assert SF.encode_store_descriptor(d) == json.dumps(
        {"format": "tqstore-store", "version": 1, "num_units": 3, "created": 1.5}, indent=1).encode()
    assert SF.decode_store_descriptor(SF.encode_store_descriptor(d), path="x") == d
    assert SF.encode_current("state-00000001") == b"state-00000001\n"
    assert SF.decode_current(SF.encode_current(SF.state_name(12)), path="x") == "state-00000012"
    for bad in (b"\xff", b"[]", b'{"format": "tqstore-store", "version": 1, "num_units": 0}', b"{"):
        with pytest.raises(CorruptionError):
            SF.decode_store_descriptor(bad, path="x")
    with pytest.raises(FormatVersionError):
        SF.decode_store_descriptor(b'{"format": "tqstore-store", "version": 2, "num_units": 1}', path="x")
    for bad in (b"\xff\n", b"state-x\n", b"other\n"):
        with pytest.raises(CorruptionError):
            SF.decode_current(bad, path="x")


# ---------------------------------------------------------------------------- version 1 indexes
def _to_version_1(ctrl: Path) -> None:
    """Rewrite a version-2 controller index as version 1 wrote it (JSON rows, no partition
    numbers, no schema bits), from the entries themselves."""
    env = lmdb.open(str(ctrl), max_dbs=16, subdir=True)
    try:
        with env.begin(write=True) as txn:
            db = {n: env.open_db(n.encode(), txn=txn) for n in CR.CONTROLLER_DBS}
            parts = {}
            for k, v in list(txn.cursor(db["parts"])):
                seq, meta, num = CR.decode_partition2(v)
                parts[num] = bytes(k).decode()
                txn.put(bytes(k), CR.encode_partition(seq, meta), db=db["parts"])
            bits = {}
            for k, v in list(txn.cursor(db["schema"])):
                pid, f = CR.decode_schema_key(k)
                kind, dt, bit = CR.decode_schema2(v)
                bits[(pid, bit)] = f
                txn.put(bytes(k), CR.encode_schema(kind, dt), db=db["schema"])
            keys = {bytes(v): CR.decode_keys_key(k)[1] for k, v in txn.cursor(db["keys"])}
            for k, v in list(txn.cursor(db["rows"])):
                r = CR.decode_row2(v)
                pid = parts[r.part]
                fields = [bits[(pid, b)] for b in range(r.mask.bit_length()) if r.mask >> b & 1]
                txn.put(bytes(k), CR.encode_row(pid, keys.get(bytes(k)), r.tag, fields, r.seq), db=db["rows"])
            txn.put(CR.META_FORMAT, b"1", db=db["meta"])
    finally:
        env.close()


def test_a_version_1_store_opens_with_everything_and_is_migrated_to_version_3(tmp_path):
    root = tmp_path / "s"
    with tqstore.open(root, num_units=2, result_type="dict") as s:
        s.kv_batch_put(["a", "b", "c"], "p", fields={"x": torch.arange(6).view(3, 2), "y": ["u", "v", "w"]},
                       tags=[{"n": 1}, None, {"z": [1.5]}])
        s.kv_batch_put(["d"], "q", fields={"x": torch.zeros(1, 2)})
        s.kv_clear(["b"], "p")
        s.get_meta(["x"], 1, "p", task_name="t")
        want = (s.kv_list(), s.kv_batch_get(["a", "c"], "p"), s.get_consumption_status("t", "p"))
        state = s.state_dir
    _to_version_1(state / "controller")
    assert _raw(state / "controller", b"rows", b"\0" * 8).startswith(b'{"p":"p","k":"a"')
    with tqstore.open(root, result_type="dict") as s:
        got = (s.kv_list(), s.kv_batch_get(["a", "c"], "p"), s.get_consumption_status("t", "p"))
        assert got[0] == want[0] and got[1]["y"] == want[1]["y"]
        assert torch.equal(torch.as_tensor(got[1]["x"]), torch.as_tensor(want[1]["x"]))
        assert all(torch.equal(torch.as_tensor(a), torch.as_tensor(b)) for a, b in zip(got[2], want[2]))
        s.controller.check_mirror()
        s.kv_batch_put(["e"], "p", fields={"x": torch.ones(1, 2, dtype=torch.int64), "y": ["e"]})
    assert _raw(state / "controller", b"meta", b"format") == b"3"
    with tqstore.open(root, result_type="dict") as s:
        assert list(s.kv_list()["p"]) == ["a", "c", "e"] and s.kv_list()["p"]["c"] == {"z": [1.5]}


@pytest.mark.parametrize("damage", ["bit", "flags", "short", "part", "key_row"])
def test_a_damaged_version_2_row_is_a_corruption_error_naming_the_index(tmp_path, damage):
    root = tmp_path / "s"
    with tqstore.open(root) as s:
        s.kv_batch_put(["a", "b"], "p", fields={"x": torch.zeros(2, 1)})
        ctrl = s.state_dir / "controller"
    env = lmdb.open(str(ctrl), max_dbs=16, subdir=True)
    with env.begin(write=True) as txn:
        rows = env.open_db(b"rows", txn=txn)
        v = bytearray(txn.get(b"\0" * 7 + b"\1", db=rows))
        if damage == "bit":
            v[16] = 2  # a bit no field has
        elif damage == "flags":
            v[4] = 8
        elif damage == "short":
            del v[20:]
        elif damage == "part":
            v[0] = 9
        else:  # the row says keyed, its key is gone
            txn.delete(b"p\0b", db=env.open_db(b"keys", txn=txn))
        txn.put(b"\0" * 7 + b"\1", bytes(v), db=rows)
    env.close()
    with pytest.raises(tqstore.CorruptionError, match="data.mdb"):
        tqstore.open(root)


def test_read_row_reads_one_row_of_a_transaction_in_either_format(tmp_path, monkeypatch):
    from tqstore.controller_decode import read_row

    monkeypatch.setattr(controller_module.secrets, "randbelow", lambda n: 0)  # (a new store's first seq: 0 here)

    root = tmp_path / "s"
    with tqstore.open(root) as s:
        s.kv_batch_put(["a", "b"], "p", fields={"x": torch.zeros(2, 1)}, tags=[{"n": 1}, None])
        s.put({"y": torch.ones(1, 1)}, partition_id="p")
        state = s.state_dir
    ctrl = state / "controller"
    for fmt in (2, 1):
        if fmt == 1:
            _to_version_1(ctrl)
        env = lmdb.open(str(ctrl), readonly=True, lock=False, max_dbs=16, subdir=True)
        try:
            with env.begin() as txn:
                dbs = {n: env.open_db(n.encode(), txn=txn, create=False) for n in CR.CONTROLLER_DBS}
                a = read_row(txn, dbs, "p", 0, "a")
                assert (a.key, a.tag, set(a.fields), a.seq) == ("a", {"n": 1}, {"x"}, 0)
                c = read_row(txn, dbs, "p", 2)
                assert (c.key, c.tag, set(c.fields), c.seq) == (None, None, {"y"}, 2)
                assert read_row(txn, dbs, "p", 7) is None
                with pytest.raises(RecordError):
                    read_row(txn, dbs, "q", 0, "a")
        finally:
            env.close()


def test_loads_each_parses_each_value_alone_or_gives_none():
    from tqstore._format.values import loads_each

    assert loads_each([b'{"a":1}', b"2", b'"s"', b"[1,2]", b"NaN"])[:4] == [{"a": 1}, 2, "s", [1, 2]]
    assert loads_each([]) == []
    # misaligned values that join into valid JSON, trailing bytes, null, non-ASCII, not JSON
    for bad in ([b"[1", b"2],3"], [b"1 "], [b"null"], [b'"\xc3\xa9"'], [b"{"], [b""]):
        assert loads_each(bad) is None, bad


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(key, uint, uint, json_value | st.integers(min_value=2**70, max_value=2**80),
                          st.lists(name, max_size=3, unique=True).map(lambda f: tuple(sorted(f))), st.booleans()),
                max_size=6))
def test_restore_rows_with_tags_encoded_once_are_the_same_bytes(rows):
    """A restore's begin writes its rows chunks with the tags it encoded once (and reuses that
    text at finish): the chunk is byte for byte what encoding the rows whole writes, and the
    rows' tag values are ``encode_tags``' (huge integers and non-ASCII text included)."""
    recs = [CR.RestoreRow(*r) for r in rows]
    tags = [r.tag for r in recs]
    texts = CR.restore_tag_texts(tags)
    raw = CR.encode_restore_rows(recs, texts)
    assert raw == CR.encode_restore_rows(recs)
    assert CR.decode_restore_rows(raw) == recs
    assert CR.tag_values(texts) == CR.encode_tags(tags)
    with pytest.raises(ValueError):
        CR.encode_restore_rows(recs, texts + ["null"])


_tag_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6)


@settings(max_examples=150, deadline=None)
@given(rows=st.lists(st.tuples(st.text(min_size=1, max_size=6), st.integers(0, 2**64 - 1), _tag_values,
                               st.sets(st.sampled_from(["a", "b", "t\u00e9", "d\"q"]))), max_size=8),
       schemas=st.dictionaries(st.sampled_from(["a", "b", "t\u00e9", "d\"q"]), st.tuples(st.sampled_from([0, 1]),
                                                                                    st.sampled_from([1, 2, 3])),
                               max_size=4))
def test_the_dump_row_index_text_is_that_of_its_document(rows, schemas):
    """A dump's rows.json is put together row by row from texts made in bulk: byte for byte the
    compact ASCII JSON of the document (non-ASCII keys, tags and field names escaped, huge
    integers, NaN and infinities, field sets as frozensets or lists in any order), and its
    rows decode back."""
    from tqstore._format import dump_records as DR

    as_lists = [(k, g, t, sorted(fs, reverse=True)) for k, g, t, fs in rows]
    frozen = [(k, g, t, frozenset(fs)) for k, g, t, fs in rows]
    want = DR.encode_row_index_doc("p\u00e9", 3, schemas, frozen)
    assert DR.encode_row_index("p\u00e9", 3, schemas, frozen) == want
    assert DR.encode_row_index("p\u00e9", 3, schemas, as_lists) == want
    doc = json.loads(want)
    assert [(r["key"], r["gidx"], r["fields"]) for r in doc["rows"]] == [(k, g, sorted(fs)) for k, g, _t, fs in rows]
