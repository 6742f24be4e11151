"""The controller's persisted mirror (docs/FORMAT.md, "Controller mirror"): a cleanly closed
store reopens from ``controller/mirror.tqm`` with exactly the state a decode of its index
gives; a mirror that the clean-close marker does not name (an earlier close's, one left by a
build without mirrors, a damaged or foreign file, a kill during its write) is never used,
and the store then opens by decoding, with nothing acknowledged lost."""
from __future__ import annotations

import logging
import math
import shutil

import numpy as np
import pytest

import tqstore
from tqstore import controller_persist
from tqstore import layout_dirs as L
from tqstore._format import mirror_records as M
from tqstore._format.values import dumps
from tqstore._io import failpoints
from tqstore.controller import Controller
from tqstore.controller_decode import decode_controller
from tqstore.testing import run_forked


@pytest.fixture
def decodes(monkeypatch):
    """A list that gets one entry per decode of a controller index by a Controller."""
    calls = []
    import tqstore.controller as C

    real = C.decode_controller
    monkeypatch.setattr(C, "decode_controller", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    return calls


def _ctrl_dir(root):
    return L.controller_dir(root / L.read_current(root))


def _mirror(root):
    return _ctrl_dir(root) / M.MIRROR_FILE


def _canon(x):
    """Everything a controller state holds, as plain comparable values (tags as JSON: NaN)."""
    out = {"num_units": x.num_units, "next_gidx": x.next_gidx, "put_token": x.put_token, "free": sorted(x.free),
           "consumed": {k: sorted(v) for k, v in x.consumed.items() if v}, "order": list(x.parts)}
    for pid, p in x.parts.items():
        sl = p.live_slots().tolist()
        out[("part", pid)] = {
            "num": p.num, "next_seq": p.next_seq, "meta": p.meta, "schema": list(p.schema.items()),
            "bits": sorted(p.bits.items()), "live": p.live, "key_count": p.key_count(),
            "rows": [(int(p.s_gidx[s]), int(p.s_seq[s]), sorted(p.fsets[int(p.s_fs[s])]), p.s_key[s]) for s in sl],
            "tags": sorted((g, dumps(t)) for g, t in p.tags.items()), "keys": sorted(p.keys.items()),
            "gmap": [(int(x.gmap.part[g]), int(x.gmap.slot[g])) for g in p.s_gidx[sl].tolist()],
        }
    return out


def _decoded(c):
    with c.env.begin() as txn:
        return _canon(decode_controller(txn, c.db, c.path))


TAGS = [{"step": 1}, [1, 2.5, "x"], math.nan, math.inf, -math.inf, "text é", 10 ** 5000, True, 0, {"n": {"m": [None]}}]


def _rich_store(root, *, units=2):
    """Partitions of every shape: keyed (unicode, empty key) and unkeyed rows, tags of every
    kind, cleared rows (free indexes), fields produced on some rows only, a mixed dtype, a
    partition of 70 fields (two-word bitmaps), consumption by two tasks, a dropped partition."""
    with tqstore.open(root, num_units=units, result_type="dict") as s:
        keys = [f"ключ-{i}" for i in range(60)] + [""]
        s.kv_batch_put(keys, "p", {"x": np.arange(61)}, tags=[TAGS[i % len(TAGS)] if i % 4 else None
                                                              for i in range(61)])
        s.kv_batch_put(keys[:20], "p", {"y": np.ones((20, 2), np.float32)})
        s.kv_batch_put(keys[5:9], "p", {"z": np.zeros(4, np.int64)})
        s.kv_batch_put(keys[9:12], "p", {"z": np.zeros(3, np.float32)})  # mixed dtype
        s.kv_clear(keys[30:35], "p")
        s.write("q", {"a": np.arange(12)}, new_rows=True, tags=[None] * 11 + [{"last": 1}])
        s.kv_batch_put([f"w{i}" for i in range(3)], "wide", {f"f{j:02d}": np.arange(3) for j in range(70)})
        s.kv_batch_put(["g0", "g1"], "gone", {"x": np.arange(2)})
        s.drop_partition("gone")
        s.kv_batch_put(["n0"], "p", {"x": np.arange(1)})  # reuses a freed index
        s.get_meta(["x"], 7, "p", task_name="t1")
        s.get_meta(["a"], 3, "q", task_name="t2")
        s.get_meta(["x", "y"], 2, "p", task_name="t2")


def test_a_cleanly_closed_store_reopens_from_its_mirror_with_the_state_a_decode_gives(tmp_path, decodes,
                                                                                       reconciles, caplog):
    root = tmp_path / "s"
    _rich_store(root)
    assert _mirror(root).is_file()
    decodes.clear()
    reconciles.clear()
    with caplog.at_level(logging.INFO, logger="tqstore"):
        s = tqstore.open(root, result_type="dict")
    try:
        assert decodes == [] and reconciles == []  # neither the index walk nor the units' scan
        assert "state read from its mirror" in caplog.text
        c = s.controller
        assert _canon(c) == _decoded(c)
        c.check_mirror()
        lists = s.kv_list()
        assert sorted(lists["p"]) == sorted([f"ключ-{i}" for i in range(60) if not 30 <= i < 35] + ["", "n0"])
        assert np.asarray(s.kv_batch_get(["ключ-7"], "p")["z"]).tolist() == [0]
        nxt = s.get_meta(["x"], 5, "p", task_name="t1")  # consumption goes on where it was
    finally:
        s.close()
    shutil.rmtree(tmp_path / "d", ignore_errors=True)
    # the same store opened by decoding (its mirror removed) answers the same
    _rich_store(tmp_path / "d")
    _mirror(tmp_path / "d").unlink()
    with tqstore.open(tmp_path / "d", result_type="dict") as d:
        assert d.kv_list() == lists
        assert d.get_meta(["x"], 5, "p", task_name="t1").global_indexes == nxt.global_indexes


def test_the_mirror_path_and_the_decode_agree_after_every_kind_of_change(tmp_path, decodes):
    root = tmp_path / "s"
    _rich_store(root)
    for step in range(3):  # reopen from the mirror, change, close: the next mirror is of the changed state
        with tqstore.open(root, result_type="dict") as s:
            assert _canon(s.controller) == _decoded(s.controller)
            s.kv_batch_put([f"r{step}-{i}" for i in range(5)], "p", {"x": np.arange(5)}, tags=[{"s": step}] * 5)
            s.kv_clear([f"ключ-{step}"], "p")
            s.reset_consumption("p", "t1") if step == 1 else s.get_meta(["x"], 3, "p", task_name="t1")
    assert decodes == [1]  # the first open of the store only (a new store); every reopen read the mirror
    with tqstore.open(root, result_type="dict") as s:
        assert _canon(s.controller) == _decoded(s.controller)
        assert "r2-4" in s.kv_list("p")["p"] and "ключ-2" not in s.kv_list("p")["p"]


def _flip(path, offset):
    b = bytearray(path.read_bytes())
    b[offset] ^= 0x01
    path.write_bytes(bytes(b))


@pytest.mark.parametrize("damage", ["header", "directory", "array", "tail", "truncated", "empty", "foreign",
                                    "version"])
def test_a_damaged_mirror_is_not_used_and_the_store_opens_by_decoding(tmp_path, decodes, caplog, damage):
    root = tmp_path / "s"
    _rich_store(root)
    with tqstore.open(root, result_type="dict") as s:
        want = _canon(s.controller)
    m = _mirror(root)
    size = m.stat().st_size
    if damage == "header":
        _flip(m, 20)
    elif damage == "directory":
        _flip(m, M.HEADER_SIZE + 3)
    elif damage == "array":  # a byte inside the first partition's gidx section
        raw = m.read_bytes()
        h = M.decode_header(raw, file_size=size)
        d = M.json.loads(raw[h.dir_offset:h.dir_offset + h.dir_len])
        _flip(m, d["parts"][0]["gidx"][0] + 5)
    elif damage == "tail":
        with open(m, "ab") as f:
            f.write(b"\0" * 64)
    elif damage == "truncated":
        m.write_bytes(m.read_bytes()[:size // 2])
    elif damage == "empty":
        m.write_bytes(b"")
    elif damage == "foreign":
        m.write_bytes(b"SQLite format 3\0" + bytes(200))
    else:  # a later version, its header CRC right: not read, not misread
        b = bytearray(m.read_bytes())
        b[4:6] = (2).to_bytes(2, "little")
        b[60:64] = M._native.crc32c(bytes(b[:60])).to_bytes(4, "little")
        m.write_bytes(bytes(b))
    decodes.clear()
    with caplog.at_level(logging.INFO, logger="tqstore"):
        with tqstore.open(root, result_type="dict") as s:
            assert decodes == [1]
            assert _canon(s.controller) == want
    assert "its mirror is not used" in caplog.text
    with tqstore.open(root, result_type="dict") as s:  # the close wrote a good one again
        assert decodes == [1] and _canon(s.controller) == want


def test_a_mirror_of_an_earlier_close_is_never_used(tmp_path, decodes):
    root = tmp_path / "s"
    _rich_store(root)
    old = _mirror(root).read_bytes()
    with tqstore.open(root, result_type="dict") as s:
        s.kv_batch_put(["later"], "p", {"x": np.arange(1)})
        s.kv_clear(["ключ-0"], "p")
    _mirror(root).write_bytes(old)  # a newer marker beside the mirror of the close before
    decodes.clear()
    with tqstore.open(root, result_type="dict") as s:
        assert decodes == [1]
        assert "later" in s.kv_list("p")["p"] and "ключ-0" not in s.kv_list("p")["p"]
        assert _canon(s.controller) == _decoded(s.controller)


def _without_mirrors(monkeypatch):
    """This process behaves as a build that knows the clean-close marker but not mirrors: it
    never reads one, and its close records the units' digest alone, leaving the file as it is."""
    monkeypatch.setattr(controller_persist, "load", lambda c: None)
    monkeypatch.setattr(controller_persist, "save", lambda c, digest, commit: digest)


def test_a_store_changed_by_a_build_without_mirrors_is_decoded_not_read_from_the_stale_mirror(
        tmp_path, monkeypatch, decodes, reconciles):
    root = tmp_path / "s"
    _rich_store(root)
    stale = _mirror(root).read_bytes()
    with monkeypatch.context() as mp:
        _without_mirrors(mp)
        with tqstore.open(root, result_type="dict") as s:  # the old build: takes the marker, changes, closes
            s.kv_batch_put(["by-old"], "p", {"x": np.arange(1)})
            s.kv_clear(["ключ-1"], "p")
    assert _mirror(root).read_bytes() == stale  # left as it was
    decodes.clear()
    reconciles.clear()
    with tqstore.open(root, result_type="dict") as s:
        assert decodes == [1]
        assert reconciles == []  # the old build's marker still vouches for the units
        assert "by-old" in s.kv_list("p")["p"] and "ключ-1" not in s.kv_list("p")["p"]
        assert _canon(s.controller) == _decoded(s.controller)
    # and a store closed by this build opens in the old one (which ignores the file) as before
    with monkeypatch.context() as mp:
        _without_mirrors(mp)
        with tqstore.open(root, result_type="dict") as s:
            assert "by-old" in s.kv_list("p")["p"]


@pytest.mark.parametrize("point", ["unlink", "create", "write", "fsync_file", "rename", "fsync_dir", "lmdb_sync"])
def test_a_kill_during_the_close_that_writes_the_mirror_loses_nothing(tmp_path, decodes, point):
    root = tmp_path / "s"
    _rich_store(root)

    def child():
        s = tqstore.open(root, result_type="dict")
        s.kv_batch_put(["acked"], "p", {"x": np.arange(1)}, tags=[{"k": 1}])
        failpoints.arm(point, "kill", 1)  # the next occurrence: inside the close
        s.close()

    res = run_forked(child)
    assert res.killed, res
    if point in ("create", "write", "fsync_file", "rename"):
        assert (_ctrl_dir(root) / (M.MIRROR_FILE + ".tmp")).exists()  # killed inside the mirror's write
    decodes.clear()
    with tqstore.open(root, result_type="dict") as s:
        c = s.controller
        assert decodes == [1]  # no marker was recorded: the index is decoded
        assert "acked" in s.kv_list("p")["p"] and s.kv_list("p")["p"]["acked"] == {"k": 1}
        assert _canon(c) == _decoded(c)
        c.check_mirror()
    with tqstore.open(root, result_type="dict") as s:
        assert "acked" in s.kv_list("p")["p"]


def test_a_mirror_that_cannot_be_written_leaves_a_marker_for_the_units_alone(tmp_path, decodes, reconciles, caplog):
    root = tmp_path / "s"
    _rich_store(root)
    with tqstore.open(root, result_type="dict") as s:
        s.kv_batch_put(["more"], "p", {"x": np.arange(1)})
        failpoints.arm("write", "enospc", repeat=True)
        try:
            with caplog.at_level(logging.WARNING, logger="tqstore"):
                s.close()
        finally:
            failpoints.disarm("write")
    assert "could not write its mirror" in caplog.text
    decodes.clear()
    reconciles.clear()
    with tqstore.open(root, result_type="dict") as s:
        assert decodes == [1] and reconciles == []  # decoded; the units still vouched for
        assert "more" in s.kv_list("p")["p"]


def test_a_controller_opened_alone_reads_the_mirror_without_taking_the_marker(tmp_path, decodes):
    root = tmp_path / "s"
    _rich_store(root)
    decodes.clear()
    c = Controller(_ctrl_dir(root), num_units=2)
    try:
        assert decodes == [] and _canon(c) == _decoded(c)
    finally:
        c.close()
    with tqstore.open(root, result_type="dict"):  # the marker is still there: read again
        assert decodes == []


def test_a_mirror_file_is_rejected_by_its_own_checks(tmp_path):
    img = M.MirrorImage(1, 10, 0, np.asarray([3], np.int64), [
        M.PartImage("p", 0, 5, {}, [("x", 1, 1, 0)], [[], ["x"]], np.asarray([0, 1, 2], np.int64),
                    np.asarray([0, 1, 4], np.int64), np.asarray([1, 1, 0], np.int32), ["a", None, "c"],
                    np.asarray([2], np.int64), [{"t": 1}])], [("p", "t", np.asarray([1], np.int64))])
    bufs, size, hcrc = M.encode_mirror(img, commit=7, units_digest=99)
    raw = b"".join(bufs)
    assert len(raw) == size and size % 64 == 0
    h = M.decode_header(raw, file_size=size)
    assert (h.commit, h.units_digest, h.crc) == (7, 99, hcrc)
    back = M.decode_mirror(raw, h)
    q = back.parts[0]
    assert q.keys == ["a", None, "c"] and q.tags == [{"t": 1}] and q.fs.tolist() == [1, 1, 0]
    assert back.consumed[0][2].tolist() == [1] and back.free.tolist() == [3]
    st = controller_persist.state(back, "x")
    assert st.parts["p"].row(2).tag == {"t": 1} and st.parts["p"].row(1).key is None
    with pytest.raises(tqstore.CorruptionError):
        M.decode_header(raw, file_size=size + 64)
    bad = M.MirrorImage(1, 2, 0, np.asarray([], np.int64), img.parts)  # rows past next_gidx
    b2, s2, _ = M.encode_mirror(bad, commit=1, units_digest=1)
    raw2 = b"".join(b2)
    with pytest.raises(tqstore.CorruptionError):
        M.decode_mirror(raw2, M.decode_header(raw2, file_size=s2))
    assert M.bound_digest(99, size, hcrc) != M.bound_digest(99, size, hcrc ^ 1) < 1 << 63


def test_a_fresh_compacted_index_copy_is_read_once_in_order_before_its_decode(tmp_path, monkeypatch):
    """The decode path first reads data.mdb front to back (a compacted LMDB copy bypasses the
    page cache; a walk would then read it one 4 KiB page at a time), and still decodes it."""
    from tqstore._io import lmdbenv
    import tqstore.controller as C

    root = tmp_path / "s"
    _rich_store(root)
    _mirror(root).unlink()
    seen = []
    real = lmdbenv.warm_file
    monkeypatch.setattr(C, "warm_file", lambda p, **k: (seen.append(real(p, **k)), seen[-1])[1])
    with tqstore.open(root, result_type="dict") as s:
        assert seen == [(_ctrl_dir(root) / "data.mdb").stat().st_size] and "n0" in s.kv_list("p")["p"]
    assert lmdbenv.warm_file(tmp_path / "missing") == 0
    assert lmdbenv.warm_file(_mirror(root), chunk_bytes=4096) == _mirror(root).stat().st_size


def test_verify_finds_a_damaged_index_that_the_mirror_hides(tmp_path, decodes):
    """A cleanly closed store opens from its mirror file without decoding its index: a byte
    of the index damaged afterwards (bit rot: the index's last transaction unchanged) would
    surface only when a checkpoint of the store, which copies the index, is loaded.
    ``Store.verify`` decodes the index, compares it with the served state and names it."""
    _rich_store(tmp_path / "s")
    with tqstore.open(tmp_path / "s") as s:
        entry = b"next_gidx" + str(s.controller.next_gidx).encode()  # meta's entry: its key, then its value
    data = _ctrl_dir(tmp_path / "s") / "data.mdb"
    raw = bytearray(data.read_bytes())
    at = raw.find(entry)
    assert at > 0
    while at >= 0:  # (and stale copies in free pages)
        raw[at + len(b"next_gidx")] = ord("9")  # its first digit: a next global index past every row
        at = raw.find(entry, at + 1)
    data.write_bytes(bytes(raw))
    decodes.clear()
    with tqstore.open(tmp_path / "s") as s:
        assert not decodes  # (opened from the mirror)
        problems = s.verify()
        assert len(problems) == 1 and problems[0].startswith("controller:") and "data.mdb" in problems[0], problems
    with tqstore.open(tmp_path / "u") as u:
        u.kv_batch_put(["a"], "p", {"x": np.arange(1)})
        assert u.verify() == []
