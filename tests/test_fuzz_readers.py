"""Every reader, fed damaged input, raises a ``TqstoreError`` — never crashes, hangs or
returns wrong data.

* in-process (Hypothesis): record frames, segment headers, manifests, ``STORE.json`` and
  ``CURRENT`` with random bit flips, truncation, spliced garbage and foreign bytes;
* in a forked child with a timeout (LMDB is C: a crash must not take pytest down): a
  store whose segment files are damaged, read row by row; a checkpoint with one file
  damaged, verified and loaded: ``verify`` and ``load`` agree, a load that succeeds
  returns exactly the saved data, one that fails leaves the store as it was.

``TQSTORE_FUZZ_TRIALS`` (default 12) sets the damaged stores/checkpoints per test (the
``crash``-marked variants run 20x as many, ``make crash-test``); ``TQSTORE_FUZZ_EXAMPLES``
(default 200) the Hypothesis examples per in-process reader.
"""
from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tqstore import _native
from tqstore import layout_dirs as L
from tqstore._format import dump_records as DR
from tqstore._format.frame import check_run, decode_frame, encode_parts, parse_head
from tqstore._format.index import LOC_DTYPE
from tqstore._format.layout import INDEX_VALUE, KINDS
from tqstore._format.segment import decode_segment_header, encode_segment_header
from tqstore.checkpoint import manifest as M
from tqstore.checkpoint import verify_checkpoint
from tqstore.errors import CorruptionError, TqstoreError
from tqstore.store import Store
from tqstore.testing import run_forked

from crash.model import store_state
from crash.scenarios import SEG, batch

TRIALS = int(os.environ.get("TQSTORE_FUZZ_TRIALS", "12"))
FUZZ = settings(deadline=None, max_examples=int(os.environ.get("TQSTORE_FUZZ_EXAMPLES", "200")),
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


# ---------------------------------------------------------------------------- mutations
@st.composite
def mutation(draw, size: int):
    """A damage recipe for a buffer of ``size`` bytes."""
    kind = draw(st.sampled_from(["flip", "truncate", "splice", "zero", "foreign"]))
    if kind == "flip":
        return kind, draw(st.lists(st.tuples(st.integers(0, max(size - 1, 0)), st.integers(0, 7)), min_size=1,
                                   max_size=4))
    if kind == "truncate":
        return kind, draw(st.integers(0, max(size - 1, 0)))
    if kind in ("splice", "zero"):
        a = draw(st.integers(0, max(size - 1, 0)))
        return kind, (a, draw(st.integers(1, 64)), draw(st.binary(min_size=64, max_size=64)))
    return kind, draw(st.binary(min_size=0, max_size=size + 16))


def damage(data: bytes, recipe) -> bytes:
    kind, arg = recipe
    b = bytearray(data)
    if kind == "flip":
        for pos, bit in arg:
            if pos < len(b):
                b[pos] ^= 1 << bit
    elif kind == "truncate":
        del b[arg:]
    elif kind == "splice":
        a, n, junk = arg
        b[a:a + n] = junk[:n]
    elif kind == "zero":
        a, n, _ = arg
        b[a:a + n] = bytes(min(n, max(0, len(b) - a)))
    else:
        b = bytearray(arg)
    return bytes(b)


def rng_damage(rng: random.Random, data: bytes) -> bytes:
    kind = rng.choice(["flip", "flip", "truncate", "splice", "zero", "foreign"])
    n = max(len(data), 1)
    if kind == "flip":
        return damage(data, (kind, [(rng.randrange(n), rng.randrange(8)) for _ in range(rng.randint(1, 3))]))
    if kind == "truncate":
        return damage(data, (kind, rng.randrange(n)))
    if kind in ("splice", "zero"):
        return damage(data, (kind, (rng.randrange(n), rng.randint(1, 64), rng.randbytes(64))))
    return rng.randbytes(rng.randint(0, n + 16))


# ---------------------------------------------------------------------------- frames
@st.composite
def frames(draw):
    field = draw(st.text(min_size=1, max_size=12)).encode()[:255] or b"f"
    kind = draw(st.sampled_from(KINDS))
    dtype = draw(st.integers(0, 12))
    shape = tuple(draw(st.lists(st.integers(0, 5), max_size=3)))
    payload = draw(st.binary(min_size=0, max_size=300))
    gidx = draw(st.integers(0, 2**40))
    return field, kind, dtype, gidx, shape, payload


@FUZZ
@given(frames(), st.data())
def test_damaged_frame_raises_or_decodes_to_the_original(fr, data):
    field, kind, dtype, gidx, shape, payload = fr
    head, tail, crc, flen = encode_parts(field, kind, dtype, gidx, shape, payload)
    good = bytes(head) + payload + bytes(tail)
    assert len(good) == flen
    bad = damage(good, data.draw(mutation(len(good))))
    for kwargs in ({"expected_crc": crc}, {}):
        length = flen if len(bad) >= flen else len(bad)
        try:
            got = decode_frame(bad, 0, length, path="fuzz", **kwargs)
        except TqstoreError:
            continue
        # a change the CRC cannot see (padding) must not change what is returned
        assert (got.gidx, got.field, got.kind, got.dtype, got.shape) == (gidx, field.decode(), kind, dtype, shape)
        assert bytes(got.payload) == payload
    try:
        parse_head(bad, 0, len(bad), path="fuzz")
    except TqstoreError:
        pass


@FUZZ
@given(st.lists(st.binary(min_size=0, max_size=100), min_size=1, max_size=5), st.data())
def test_damaged_frame_batch_is_flagged_by_the_kernel(payloads, data):
    shapes = [(len(p),) for p in payloads]
    blob, items = _native.encode_frames(b"x", 0, 2, list(range(len(payloads))), shapes, payloads, 0, None, 1, 0)
    locs = b"".join(v for _k, v in items)
    bad = damage(bytes(blob), data.draw(mutation(len(blob))))
    status, _crcs, _trailers = check_run(bad, locs, np.arange(len(payloads), dtype=np.uint64))
    for (_k, v), code, payload in zip(items, status.tolist(), payloads):
        _seg, off, ln, _crc = INDEX_VALUE.unpack(v)
        if code == 0:  # an intact frame is the original, byte for byte
            assert bad[off:off + ln] == bytes(blob[off:off + ln])
            assert decode_frame(bad, off, ln).payload == payload


@FUZZ
@given(st.integers(0, 2**16), st.integers(0, 2**31), st.data())
def test_damaged_segment_header_raises_or_reads_the_original(unit, seg, data):
    good = encode_segment_header(unit, seg)
    bad = damage(good, data.draw(mutation(len(good))))
    try:
        assert decode_segment_header(bad, path="fuzz") == (unit, seg)
    except TqstoreError:
        pass


def _manifest_bytes() -> bytes:
    files = [M.FileEntry(M.CONTROLLER_FILE, M.ROLE_CONTROLLER, 4096, 7),
             M.FileEntry(M.unit_index_file(0), M.ROLE_UNIT_INDEX, 8192, 9, 0),
             M.FileEntry(M.segment_file(0, 1), M.ROLE_SEGMENT, 1000, 11, 0, 1, 3, 900)]
    return M.build(created_unix=1.5, include_storage=True, num_units=1, snapshot={"rows": 3},
                   metadata={"step": 7}, files=files)


@FUZZ
@given(st.data())
def test_damaged_manifest_raises_or_parses_to_the_original(data):
    good = _manifest_bytes()
    want = M.parse(good)
    bad = damage(good, data.draw(mutation(len(good))))
    try:
        got = M.parse(bad)
    except TqstoreError:
        return
    assert got == want


def _row_index_of(rows) -> bytes:
    doc = json.loads(_dump_docs()[0])
    doc["rows"] = rows
    return json.dumps(doc).encode()


_GOOD_ROW = {"key": "c", "gidx": 5, "tag": None, "fields": ["x"]}


@pytest.mark.parametrize("bad, message", [
    (["not a row"], "malformed row"), ([[1, 2]], "malformed row"),
    ([{k: v for k, v in _GOOD_ROW.items() if k != "tag"}], "malformed row"),
    ([{**_GOOD_ROW, "key": 7}], "malformed row"), ([{**_GOOD_ROW, "gidx": True}], "malformed row"),
    ([{**_GOOD_ROW, "gidx": -1}], "malformed row"), ([{**_GOOD_ROW, "gidx": 2**64}], "malformed row"),
    ([{**_GOOD_ROW, "gidx": 5.0}], "malformed row"), ([{**_GOOD_ROW, "fields": "x"}], "malformed row"),
    ([{**_GOOD_ROW, "fields": ["nope"]}], "malformed row"), ([{**_GOOD_ROW, "fields": [["x"]]}], "malformed row"),
    ([{**_GOOD_ROW, "fields": ["x", "x"]}], "appears twice"), ([{**_GOOD_ROW, "gidx": 3}], "appears twice"),
    ([{**_GOOD_ROW, "key": "a"}], "appears twice"),
])
def test_a_malformed_row_of_the_row_index_is_named(bad, message):
    good = json.loads(_dump_docs()[0])["rows"]
    ri = DR.decode_row_index(_row_index_of(good + [_GOOD_ROW]))
    assert (ri.keys, ri.gidxs, ri.fields) == (["a", "b", "c"], [3, 1, 5], [["text", "x"], [], ["x"]])
    assert ri.rows["c"] == {"gidx": 5, "tag": None, "fields": ["x"]} and list(ri.rows) == ["a", "b", "c"]
    assert ri.tags[0]["n"] == 10**30 and len(ri) == 3
    for rows in (good + bad, bad + good):
        with pytest.raises(CorruptionError, match=message):
            DR.decode_row_index(_row_index_of(rows))


@pytest.mark.parametrize("schema, ok", [({"kind": "tensor", "dtype": "mixed"}, True),
                                        ({"kind": "ndarray", "dtype": "mixed"}, True),
                                        ({"kind": "value", "dtype": "mixed"}, False),
                                        ({"kind": "tensor", "dtype": "int128"}, False),
                                        ({"kind": "sparse", "dtype": "int64"}, False), ("tensor", False)])
def test_the_row_index_schema_names_a_known_kind_and_dtype_or_mixed(schema, ok):
    doc = json.loads(_dump_docs()[0])
    doc["schemas"]["x"] = schema
    raw = json.dumps(doc).encode()
    if ok:
        assert DR.decode_row_index(raw).schemas["x"][1] == 255  # the controller's "mixed" code
        assert json.loads(DR.encode_row_index("p", 1, {"x": DR.decode_row_index(raw).schemas["x"]}, []))[
            "schemas"] == {"x": schema}
    else:
        with pytest.raises(CorruptionError, match="known kind and dtype"):
            DR.decode_row_index(raw)


@pytest.mark.parametrize("foreign", [b"", b"{}", b"[]", b"null", b'{"format": "tqstore-checkpoint", "version": 99}',
                                     b'{"format": "tqstore-checkpoint", "version": 1}', b"\xff\xfe" * 10,
                                     json.dumps({"format": "zarr"}).encode(), b"PK\x03\x04" + bytes(100)])
def test_foreign_manifest_raises(foreign):
    with pytest.raises(TqstoreError):
        M.parse(foreign)


@FUZZ
@given(st.binary(max_size=200))
def test_foreign_store_descriptor_and_pointer_raise(tmp_path_factory, junk):
    d = tmp_path_factory.mktemp("sd")
    (d / L.STORE_FILE).write_bytes(junk)
    (d / L.CURRENT_FILE).write_bytes(junk)
    for fn in (L.read_store_file, L.read_current):
        try:
            fn(d)
        except TqstoreError:
            pass


# ---------------------------------------------------------------------------- dump files
def _shard_bytes() -> bytes:
    """A shard of unit 1 of 2 holding three frames of rows 1, 3 (two fields)."""
    frames, gidxs, fields = [], [1, 3, 3], ["x", "x", "text"]
    for g, f in zip(gidxs, fields):
        payload = np.arange(g * 4, dtype=np.int32).tobytes() if f == "x" else b'"hello"'
        head, tail, _crc, _n = encode_parts(f.encode(), KINDS[0] if f == "x" else 2, 5 if f == "x" else 0, g,
                                            (g * 4,) if f == "x" else (), payload)
        frames.append(head + payload + tail)
    names = ["x", "text"]
    table = DR.encode_shard_table(gidxs, [len(b) for b in frames],
                                  [_trailer_crc(b) for b in frames],
                                  [names.index(f) for f in fields], names)
    return DR.encode_shard_header(1, 2, 3, sum(len(b) for b in frames), table) + b"".join(frames) + table


def _trailer_crc(frame: bytes) -> int:
    fr = decode_frame(frame, 0, len(frame))
    return fr.crc


def _read_shard(raw: bytes):
    """Everything a reader takes from a shard: header, table, each frame's (gidx, field, bytes)."""
    h = DR.decode_shard_header(raw, path="fuzz", file_size=len(raw))
    t = DR.decode_shard_table(raw[h.table_offset:], h, path="fuzz")
    locs = np.zeros(len(t.entries), LOC_DTYPE)
    locs["offset"], locs["length"], locs["crc"] = t.entries["offset"], t.entries["length"], t.entries["crc"]
    status, _c, _t = check_run(raw, locs, np.ascontiguousarray(t.entries["gidx"], dtype="<u8"))
    if status.any():
        raise CorruptionError("a frame does not verify", path="fuzz")
    return h, [(int(e["gidx"]), f, raw[int(e["offset"]):int(e["offset"]) + int(e["length"])])
               for e, f in zip(t.entries, t.fields())]


@FUZZ
@given(st.data())
def test_damaged_dump_shard_raises_or_reads_the_original(data):
    good = _shard_bytes()
    want = _read_shard(good)
    bad = damage(good, data.draw(mutation(len(good))))
    try:
        got = _read_shard(bad)
    except TqstoreError:
        return
    assert got == want


def _dump_docs():
    index = DR.encode_row_index("p", 2, {"x": (0, 5), "text": (2, 0)},
                                [("a", 3, {"score": float("nan"), "n": 10**30}, ["text", "x"]), ("b", 1, None, [])])
    manifest = DR.encode_manifest(created_unix=1.0, partition_id="p", num_units=2,
                                  summary={"keys": 2, "rows_with_data": 1, "frames": 2, "payload_bytes": 256},
                                  row_index={"size": len(index), "crc32c": _native.crc32c(index)},
                                  shards=[{"unit": 1, "size": 400, "crc32c": 5, "frames": 2, "rows": 1,
                                           "payload_bytes": 256}])
    return index, manifest


@FUZZ
@given(st.data())
def test_damaged_dump_row_index_and_manifest_raise_or_read_the_original(tmp_path_factory, data):
    from tqstore.dump.reader import open_dump

    index, manifest = _dump_docs()
    d = tmp_path_factory.mktemp("dump") / "d"
    d.mkdir()
    (d / DR.MANIFEST_NAME).write_bytes(manifest)
    (d / DR.ROW_INDEX_NAME).write_bytes(index)
    want = open_dump(d)
    which = data.draw(st.sampled_from([DR.MANIFEST_NAME, DR.ROW_INDEX_NAME]))
    good = (d / which).read_bytes()
    (d / which).write_bytes(damage(good, data.draw(mutation(len(good)))))
    try:
        got = open_dump(d)
    except TqstoreError:
        return
    assert (repr(got.rows), got.manifest) == (repr(want.rows), want.manifest)
    try:  # the row index alone (no CRC of its own): a decode raises a TqstoreError or gives a RowIndex
        assert isinstance(DR.decode_row_index(damage(index, data.draw(mutation(len(index))))), DR.RowIndex)
    except TqstoreError:
        pass


@pytest.mark.parametrize("foreign", [b"", b"{}", b"[]", b'{"format": "tqstore dump", "version": 2}',
                                     b'{"format": "tqstore dump row index", "version": 1}', b"\xff\xfe" * 10,
                                     b"TQDS" + bytes(60), b"PK\x03\x04" + bytes(100)])
def test_foreign_dump_files_raise(foreign):
    for fn in (DR.decode_manifest, DR.decode_row_index, DR.decode_shard_header):
        with pytest.raises(TqstoreError):
            fn(foreign)


# ---------------------------------------------------------------------------- stores and checkpoints
def _make_store(path: Path, num_units: int = 2) -> dict:
    with Store(path, num_units=num_units, segment_bytes=SEG, max_workers=1) as s:
        for i in range(3):
            keys = [f"r{i}_{j}" for j in range(3)]
            s.write("p", batch(keys, salt=i, big=i == 1), keys=keys)
        s.write("q", batch(["z"], salt=9), keys=["z"])
        return store_state(s)


def _segments(root: Path):
    return sorted(p for p in root.rglob("seg-*.tqs"))


def _judge_store(path: Path, want: dict) -> dict:
    """In a child: open the damaged store, read every row; report what happened."""
    try:
        s = Store(path, num_units=None, segment_bytes=SEG, max_workers=1)
    except TqstoreError as e:
        return {"opened": False, "error": type(e).__name__}
    with s:
        got = store_state(s)
        problems = s.verify()
    wrong = []
    for pid, rows in got.items():
        for k, (g, tag, fields) in rows.items():
            ref = want.get(pid, {}).get(k)
            if ref is None or ref[0] != g:
                wrong.append(f"{pid}/{k}: row not in the original")
                continue
            for f, dig in fields.items():
                if not dig.startswith("ERR:") and dig != ref[2].get(f):
                    wrong.append(f"{pid}/{k}.{f}: returned wrong data")
    errors = sum(1 for rows in got.values() for _g, _t, fs in rows.values() for d in fs.values()
                 if d.startswith("ERR:"))
    return {"opened": True, "wrong": wrong, "read_errors": errors, "verify_problems": len(problems)}


def _run_store_fuzz(tmp_path: Path, trials: int, seed: int) -> None:
    want = _make_store(tmp_path / "orig")
    rng = random.Random(seed)
    seen = {"opened": 0, "errors": 0}
    for t in range(trials):
        work = tmp_path / "work"
        if work.exists():
            shutil.rmtree(work)
        shutil.copytree(tmp_path / "orig", work)
        seg = rng.choice(_segments(work))
        data = seg.read_bytes()
        if rng.random() < 0.1:
            seg.unlink()
        else:
            seg.write_bytes(rng_damage(rng, data))
        res = run_forked(lambda: _judge_store(work, want), timeout_s=60)
        assert not res.timed_out, f"trial {t}: reading a damaged store hung ({seg.name})"
        assert res.ok, f"trial {t}: reading a damaged store crashed or raised a non-tqstore error:\n{res.error}"
        v = res.value
        assert not v.get("wrong"), f"trial {t} ({seg.name}): {v['wrong'][:3]}"
        seen["opened"] += v["opened"]
        seen["errors"] += v.get("read_errors", 0) + v.get("verify_problems", 0)
    assert seen["errors"] > 0  # the damage was noticed, not only survived


def test_damaged_segment_files_never_return_wrong_data(tmp_path):
    _run_store_fuzz(tmp_path, TRIALS, seed=1)


@pytest.mark.crash
def test_damaged_segment_files_never_return_wrong_data_long(tmp_path):
    _run_store_fuzz(tmp_path, TRIALS * 20, seed=2)


def _judge_checkpoint(base: Path, ck: Path, want: dict, live: dict) -> dict:
    """In a child: verify the damaged checkpoint and load it into a store holding ``live``."""
    try:
        ok = verify_checkpoint(ck, raise_on_error=False).ok
        verify_error = None
    except TqstoreError as e:
        ok, verify_error = False, type(e).__name__
    with Store(base / "target", num_units=None, segment_bytes=SEG, max_workers=1) as s:
        try:
            s.load_checkpoint(ck)
            loaded, load_error = True, None
        except TqstoreError as e:
            loaded, load_error = False, f"{type(e).__name__}: {e}"
        got = store_state(s)
    return {"verify_ok": ok, "verify_error": verify_error, "loaded": loaded, "load_error": load_error,
            "correct": got == (want if loaded else live)}


def _run_checkpoint_fuzz(tmp_path: Path, trials: int, seed: int, *, target_units: int) -> None:
    want = _make_store(tmp_path / "src")
    with Store(tmp_path / "src", segment_bytes=SEG, max_workers=1) as s:
        s.save_checkpoint(tmp_path / "ck")
    live = _make_store(tmp_path / "target0", num_units=target_units)  # other rows: a load must replace them all
    rng = random.Random(seed)
    outcomes = set()
    for t in range(trials):
        base = tmp_path / "work"
        if base.exists():
            shutil.rmtree(base)
        base.mkdir()
        shutil.copytree(tmp_path / "ck", base / "ck", copy_function=shutil.copyfile)
        shutil.copytree(tmp_path / "target0", base / "target")
        victims = sorted(p for p in (base / "ck").rglob("*") if p.is_file())
        victim = rng.choice(victims)
        if rng.random() < 0.1:
            victim.unlink()
        else:
            victim.write_bytes(rng_damage(rng, victim.read_bytes()))
        res = run_forked(lambda: _judge_checkpoint(base, base / "ck", want, live), timeout_s=60)
        name = victim.relative_to(base / "ck")
        assert not res.timed_out, f"trial {t}: verify/load of a checkpoint with {name} damaged hung"
        assert res.ok, f"trial {t} ({name}): crashed or raised a non-tqstore error:\n{res.error}"
        v = res.value
        assert v["correct"], f"trial {t} ({name}): wrong data after {'a load' if v['loaded'] else 'a failed load'}"
        # verify passing means the load must get through; the converse may not hold (a reshard
        # reads only the indexed frames, verify checks every byte), the data is right either way
        assert v["loaded"] or not v["verify_ok"], f"trial {t} ({name}): verify passed but the load failed: {v}"
        outcomes.add(v["loaded"])
    assert False in outcomes


@pytest.mark.parametrize("target_units", [2, 3])
def test_damaged_checkpoint_file_is_refused_by_verify_and_load_alike(tmp_path, target_units):
    _run_checkpoint_fuzz(tmp_path, TRIALS, seed=3 + target_units, target_units=target_units)


@pytest.mark.crash
@pytest.mark.parametrize("target_units", [2, 3])
def test_damaged_checkpoint_file_is_refused_by_verify_and_load_alike_long(tmp_path, target_units):
    _run_checkpoint_fuzz(tmp_path, TRIALS * 20, seed=30 + target_units, target_units=target_units)
