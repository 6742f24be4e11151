"""Hostile checkpoints: crafted files that must never crash, hang or fool a load or a verify.

Every case is a copy of one clean checkpoint, tampered with and (where it matters)
re-signed: the manifest's sizes, CRCs and checksum recomputed, as an attacker or a buggy
tool would.  Each case runs in a child process forked from a server that imported
tqstore once (a crash of LMDB kills a process, and a FIFO blocks one forever): the child
loads the checkpoint into a live store and verifies it, and the test asserts a clean
``TqstoreError`` subclass, no signal, no hang, an answer within the time bound, and the
live store exactly as it was.  Damage verify reports must also fail the load.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import lmdb
import pytest

import tqstore
from tqstore.checkpoint import manifest as M

from checkpoint_helpers import fill, first_segment, resign, resign_manifest, rewrite, state

CASE_TIMEOUT_S = 30.0
PAGE = 4096
GIANT = 16 << 30  # sparse: costs no disk

_SERVER = textwrap.dedent(r"""
    import json, os, select, signal, sys, time, traceback
    sys.path.insert(0, sys.argv[1])
    import tqstore
    from tqstore.checkpoint import verify_checkpoint
    from checkpoint_helpers import state

    def outcome(fn):
        try:
            fn()
            return {"ok": True}
        except BaseException as e:  # noqa: BLE001 - reported to the test
            return {"ok": False, "type": type(e).__name__, "mro": [c.__name__ for c in type(e).__mro__],
                    "message": str(e)[:2000]}

    def run(req):
        out = {}
        live = req["live"]
        with tqstore.open(live) as s:
            before = state(s)
            t0 = time.monotonic()
            out["load"] = outcome(lambda: s.load_checkpoint(req["ckpt"]))
            out["load_s"] = time.monotonic() - t0
            after = {}
            out["read_after"] = outcome(lambda: after.setdefault("s", state(s)))
            out["unchanged"] = repr(after.get("s")) == repr(before)
        t0 = time.monotonic()
        out["verify"] = outcome(lambda: verify_checkpoint(req["ckpt"]))
        rep = {}
        def report():
            r = verify_checkpoint(req["ckpt"], raise_on_error=False)
            rep["problems"] = [str(p) for p in r.problems]
        out["report"] = outcome(report)
        out["problems"] = rep.get("problems")
        out["verify_s"] = time.monotonic() - t0
        return out

    print("ready", flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        r, w = os.pipe()
        t0 = time.monotonic()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            try:
                res = run(req)
            except BaseException as e:  # noqa: BLE001
                res = {"crash": traceback.format_exc()}
            data = json.dumps(res).encode()
            while data:
                data = data[os.write(w, data):]
            os._exit(0)
        os.close(w)
        data, timed_out = b"", False
        deadline = t0 + req["timeout_s"]
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                os.kill(pid, signal.SIGKILL)
                break
            ready, _, _ = select.select([r], [], [], left)
            if ready:
                chunk = os.read(r, 1 << 16)
                if not chunk:
                    break
                data += chunk
        os.close(r)
        _, st = os.waitpid(pid, 0)
        reply = {"elapsed_s": time.monotonic() - t0, "timed_out": timed_out,
                 "signal": os.WTERMSIG(st) if os.WIFSIGNALED(st) else None,
                 "exit": os.WEXITSTATUS(st) if os.WIFEXITED(st) else None,
                 "result": json.loads(data) if data and not timed_out else None}
        print(json.dumps(reply), flush=True)
""")


class CaseServer:
    """A process that imported tqstore once and forks one child per case."""

    def __init__(self) -> None:
        self.p = subprocess.Popen([sys.executable, "-c", _SERVER, str(Path(__file__).parent)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        assert self.p.stdout.readline().strip() == "ready"

    def run(self, ckpt: Path, live: Path, timeout_s: float = CASE_TIMEOUT_S) -> dict:
        self.p.stdin.write(json.dumps({"ckpt": str(ckpt), "live": str(live), "timeout_s": timeout_s}) + "\n")
        self.p.stdin.flush()
        return json.loads(self.p.stdout.readline())

    def close(self) -> None:
        self.p.stdin.close()
        self.p.wait(timeout=30)


# ---------------------------------------------------------------------------- crafting
def _mdb(c: Path, role: str) -> Path:
    return c / (M.CONTROLLER_FILE if role == "controller" else M.unit_index_file(0))


def _edit(path: Path, fn) -> None:
    data = bytearray(path.read_bytes())
    fn(data)
    rewrite(path, bytes(data))


def _meta_root_past_eof(data: bytearray) -> None:
    """Both meta pages: the main database's root a page past the end, ``last_pg`` beyond it
    (LMDB then maps and reads it: SIGBUS in the reading process)."""
    for pg in (0, 1):
        base = pg * PAGE + 16 + 4 + 4 + 8 + 8  # page header, magic, version, address, mapsize
        root = base + 48 + 40  # mm_dbs[MAIN_DBI].md_root
        last = base + 96  # mm_last_pg
        data[root:root + 8] = struct.pack("<Q", 1 << 10)
        data[last:last + 8] = struct.pack("<Q", 1 << 12)


def _scramble(seed: int, every: int = 97):
    def fn(data: bytearray) -> None:
        r = random.Random(seed)
        for pg in range(2, len(data) // PAGE):
            for i in range(16 + r.randrange(every), PAGE, every):
                data[pg * PAGE + i] = r.randrange(256)
    return fn


def _flips(seed: int, n: int = 8):
    def fn(data: bytearray) -> None:
        r = random.Random(seed)
        for _ in range(n):
            i = r.randrange(2 * PAGE, len(data))
            data[i] ^= 1 << r.randrange(8)
    return fn


def _lmdb_edit(path: Path, db: bytes, fn) -> None:
    """Rewrite one database of an LMDB copy with lmdb itself (a well-formed file holding a
    lie), in a new inode."""
    tmp = path.parent.parent / (path.parent.name + ".edit")
    shutil.copytree(path.parent, tmp)
    env = lmdb.open(str(tmp), max_dbs=12, lock=False, subdir=True)
    try:
        d = env.open_db(db)
        with env.begin(write=True) as txn:
            fn(txn, d)
    finally:
        env.close()
    rewrite(path, (tmp / "data.mdb").read_bytes())
    shutil.rmtree(tmp)


def _first_loc(txn, d):
    return next(iter(txn.cursor(d)))


def _loc_outside(txn, d):
    k, v = _first_loc(txn, d)
    seg, off, ln, crc = struct.unpack("<IQII", v)
    txn.put(k, struct.pack("<IQII", seg, off + (1 << 30), ln, crc), db=d)


def _loc_wrong_crc(txn, d):
    k, v = _first_loc(txn, d)
    seg, off, ln, crc = struct.unpack("<IQII", v)
    txn.put(k, struct.pack("<IQII", seg, off, ln, crc ^ 1), db=d)


def _loc_short_value(txn, d):
    k, v = _first_loc(txn, d)
    txn.put(k, bytes(v)[:19], db=d)


def _rows_not_json(txn, d):
    k, _v = _first_loc(txn, d)
    txn.put(k, b"{not json", db=d)


def _fifo(rel: str):
    def fn(c: Path) -> None:
        (c / rel).unlink()
        os.mkfifo(c / rel)
    return fn


def _symlink(rel: str):
    """Replace ``rel`` (a file or a directory) by a symbolic link to an identical copy
    outside the checkpoint: the bytes verify, the link must not be followed."""
    def fn(c: Path) -> None:
        p = c / rel
        out = c.parent / ("outside-" + rel.replace("/", "_"))
        if p.is_dir():
            shutil.copytree(p, out)
            shutil.rmtree(p)
        else:
            shutil.copy2(p, out)
            p.unlink()
        os.symlink(out, p)
    return fn


def _giant_segment(zeros: bool):
    """A 16 GiB sparse segment whose manifest entry records that size and a wrong CRC."""
    def fn(c: Path) -> None:
        seg = first_segment(c)
        rel = str(seg.relative_to(c))
        if zeros:
            seg.unlink()
            seg.touch()
        os.truncate(seg, GIANT)
        d = json.loads((c / M.MANIFEST_NAME).read_bytes())
        for e in d["files"]:
            if e["path"] == rel:
                e["size"] = GIANT
        resign_manifest(c, d)
    return fn


def _giant_index(c: Path) -> None:
    """A 16 GiB sparse unit index (its real bytes, then zeros) recorded at that size, with
    the block CRCs of the real file followed by wrong ones."""
    p = _mdb(c, "unit")
    os.truncate(p, GIANT)
    d = json.loads((c / M.MANIFEST_NAME).read_bytes())
    for e in d["files"]:
        if e["path"] == M.unit_index_file(0):
            e["size"] = GIANT
            e["block_crc32c"] = e["block_crc32c"] + [1] * (GIANT // M.INDEX_BLOCK_BYTES - len(e["block_crc32c"]))
    resign_manifest(c, d)


def _damage(role: str, fn, *, lmdb_db: bytes = b""):
    def craft(c: Path) -> None:
        if lmdb_db:
            _lmdb_edit(_mdb(c, role), lmdb_db, fn)
        else:
            _edit(_mdb(c, role), fn)
        resign(c)
    return craft


CASES = {
    # damaged LMDB pages behind a re-signed manifest
    "unit_index_root_past_eof": _damage("unit", _meta_root_past_eof),
    "controller_root_past_eof": _damage("controller", _meta_root_past_eof),
    "unit_index_truncated": lambda c: (_edit(_mdb(c, "unit"), lambda d: d.__delitem__(slice(4 * PAGE, None))),
                                       resign(c)),
    "unit_index_scrambled": _damage("unit", _scramble(1)),
    "controller_scrambled": _damage("controller", _scramble(2)),
    **{f"unit_index_flips_{s}": _damage("unit", _flips(s)) for s in range(4)},
    **{f"controller_flips_{s}": _damage("controller", _flips(100 + s)) for s in range(2)},
    # well-formed LMDB files holding lies, re-signed (load must check what verify checks)
    "loc_outside_segment": _damage("unit", _loc_outside, lmdb_db=b"loc"),
    "loc_wrong_frame_crc": _damage("unit", _loc_wrong_crc, lmdb_db=b"loc"),
    "loc_short_value": _damage("unit", _loc_short_value, lmdb_db=b"loc"),
    "controller_row_not_json": _damage("controller", _rows_not_json, lmdb_db=b"rows"),
    # FIFOs (a blocking open or read would hang the process)
    "fifo_segment": lambda c: _fifo(str(first_segment(c).relative_to(c)))(c),
    "fifo_unit_index": _fifo(M.unit_index_file(0)),
    "fifo_controller": _fifo(M.CONTROLLER_FILE),
    "fifo_manifest": _fifo(M.MANIFEST_NAME),
    # symbolic links to identical copies outside the checkpoint
    "symlink_segment": lambda c: _symlink(str(first_segment(c).relative_to(c)))(c),
    "symlink_controller_file": _symlink(M.CONTROLLER_FILE),
    "symlink_unit_dir": _symlink(M.unit_dir_name(0)),
    "symlink_index_dir": _symlink(M.unit_dir_name(1) + "/index"),
    "symlink_manifest": _symlink(M.MANIFEST_NAME),
    # 16 GiB sparse files with a wrong CRC: rejected without reading them
    "giant_segment_zeros": _giant_segment(zeros=True),
    "giant_segment_extended": _giant_segment(zeros=False),
    "giant_unit_index": _giant_index,
}

# cases where a valid-looking file may still decode: the load may succeed, but only if
# verify finds nothing either
MAY_LOAD = {n for n in CASES if "_flips_" in n}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("hostile")
    with tqstore.open(d / "src", num_units=2) as s:
        fill(s, "train", 40)
        s.save_checkpoint(d / "pristine", copy_segments=True)
    with tqstore.open(d / "live", num_units=2) as s:
        fill(s, "live", 6, prefix="L", seed=42)
        want = state(s)
    server = CaseServer()
    yield d, want, server
    server.close()


def _sparse_ok(d: Path) -> bool:
    p = d / "sparse-probe"
    try:
        with open(p, "wb") as f:
            f.truncate(GIANT)
        return os.stat(p).st_blocks * 512 < (1 << 20)
    except OSError:
        return False
    finally:
        p.unlink(missing_ok=True)


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_hostile_checkpoint_fails_cleanly_and_leaves_the_store_unchanged(setup, name):
    d, want, server = setup
    if name.startswith("giant") and not _sparse_ok(d):
        pytest.skip("this file system does not keep sparse files sparse")
    case = d / name
    shutil.copytree(d / "pristine", case / "ckpt", symlinks=True)
    CASES[name](case / "ckpt")
    shutil.copytree(d / "live", case / "live")
    t0 = time.monotonic()
    r = server.run(case / "ckpt", case / "live")
    assert not r["timed_out"], f"{name}: no answer within {CASE_TIMEOUT_S} s (hang)"
    assert r["signal"] is None, f"{name}: the process died of signal {r['signal']}"
    res = r["result"]
    assert res is not None and "crash" not in res, f"{name}: {res}"
    for what in ("load", "verify", "report"):
        o = res[what]
        assert o["ok"] or "TqstoreError" in o["mro"], f"{name}: {what} raised a foreign {o['type']}: {o['message']}"
    if not res["load"]["ok"]:
        assert res["unchanged"], f"{name}: the failed load changed the live store"
    damaged = not res["verify"]["ok"]
    if res["report"]["ok"]:
        assert damaged == bool(res["problems"]), f"{name}: verify raises and reports differently: {res}"
    o = res["read_after"]
    assert o["ok"] or (name in MAY_LOAD and "TqstoreError" in o["mro"]), f"{name}: reading after the load: {o}"
    if name not in MAY_LOAD:
        assert not res["load"]["ok"], f"{name}: the hostile checkpoint loaded"
        assert damaged, f"{name}: verify found nothing"
    if damaged:
        assert not res["load"]["ok"], f"{name}: verify reports damage {res['problems']} but the load succeeded"
    if not res["load"]["ok"]:
        assert "CorruptionError" in res["load"]["mro"] or "CheckpointError" in res["load"]["mro"], res["load"]
    assert time.monotonic() - t0 < CASE_TIMEOUT_S
    with tqstore.open(case / "live") as s:  # and from outside the child: one state, as before
        if not res["load"]["ok"]:
            assert state(s) == want
        assert len(list((case / "live").glob("state-*"))) == 1
    shutil.rmtree(case)


def test_the_walk_reports_a_crash_a_timeout_and_a_clean_file_by_name(setup, tmp_path):
    from tqstore._io.lmdbwalk import LmdbWalk

    d, _want, _server = setup
    ck = tmp_path / "ck"
    shutil.copytree(d / "pristine", ck)
    _edit(_mdb(ck, "unit"), _meta_root_past_eof)
    targets = [(str(ck / "controller"), "controller"), (str(ck / M.unit_dir_name(0) / "index"), "unit_index"),
               (str(ck / M.unit_dir_name(1) / "index"), "unit_index")]
    w = LmdbWalk(targets)
    probs = w.result()
    assert [p.index for p in probs] == [1] and "SIGBUS" in probs[0].message
    assert probs[0].path == str(ck / M.unit_index_file(0))
    assert w.entries > 0  # the others were walked, by a second child after the crash
    slow = LmdbWalk(targets, timeout_s=0.0)
    probs = slow.result()
    assert len(probs) == 1 and "within 0 s" in probs[0].message


def test_the_walk_clears_each_file_as_it_passes_it_and_never_one_behind_a_crash(setup, tmp_path):
    """A loader maps each LMDB file once the walk passed it cleanly (``wait_clean``), while
    the child goes on; a file at or after a damaged one is never cleared."""
    from tqstore._io.lmdbwalk import LmdbWalk

    d, _want, _server = setup
    ck = tmp_path / "ck"
    shutil.copytree(d / "pristine", ck)
    _edit(_mdb(ck, "unit"), _meta_root_past_eof)  # unit 0's index crashes the walking child
    targets = [(str(ck / M.unit_dir_name(1) / "index"), "unit_index"),
               (str(ck / M.unit_dir_name(0) / "index"), "unit_index"), (str(ck / "controller"), "controller")]
    w = LmdbWalk(targets, first_only=True)
    assert w.wait_clean(0) == []  # unit 1 walked cleanly before the crash
    for i in (1, 2):  # the damaged file and the one behind it: the crash is reported, never "clean"
        probs = w.wait_clean(i)
        assert [p.index for p in probs] == [1] and "SIGBUS" in probs[0].message
    assert w.result() == probs
    clean = LmdbWalk([targets[0], targets[2]], first_only=True)
    assert clean.wait_clean(1) == [] and clean.wait_clean(0) == [] and clean.result() == []
    with pytest.raises(IndexError):
        clean.wait_clean(2)


def test_waiting_for_each_file_while_the_child_writes_loses_no_record(setup, tmp_path):
    """Polling the walk's records while the child is still writing them (as a loader does)
    must not disturb them: every clean file is reported clean, the walk ends clean."""
    from tqstore._io.lmdbwalk import LmdbWalk

    d, _want, _server = setup
    targets = [(str(d / "pristine" / M.unit_dir_name(i % 2) / "index"), "unit_index") for i in range(40)]
    one = LmdbWalk(targets[:1])
    assert one.result() == []
    w = LmdbWalk(targets, first_only=True)
    for i in range(len(targets)):
        assert w.wait_clean(i, poll_s=0.0) == [], i
    other = LmdbWalk(targets[1:2])
    assert other.result() == []
    assert w.result() == [] and w.entries == 20 * (one.entries + other.entries)


def test_a_controller_entry_the_walk_passes_but_the_decoder_refuses_fails_the_load_naming_the_checkpoint(
        setup, tmp_path):
    """A well-formed row that breaks a rule of the controller index (its partition has no
    ``parts`` entry), re-signed: the load refuses it with CorruptionError naming the
    checkpoint's controller file (the entries are checked once, by the open of the staged
    copy), verify reports it, and the live store is unchanged."""
    from tqstore.checkpoint import verify_checkpoint
    from tqstore.errors import CorruptionError

    d, want, _server = setup
    ck = tmp_path / "ck"
    shutil.copytree(d / "pristine", ck)

    def orphan_row(txn, db):
        k, _v = _first_loc(txn, db)
        txn.put(k, b'{"p":"no-such-partition","k":"x","t":null,"f":[],"s":0}', db=db)

    _lmdb_edit(_mdb(ck, "controller"), b"rows", orphan_row)
    resign(ck)
    shutil.copytree(d / "live", tmp_path / "live")
    with tqstore.open(tmp_path / "live") as s:
        with pytest.raises(CorruptionError) as ei:
            s.load_checkpoint(ck)
        assert ei.value.path == str(ck / M.CONTROLLER_FILE)
        assert state(s) == want
        assert len(list((tmp_path / "live").glob("state-*"))) == 1
    assert not verify_checkpoint(ck, raise_on_error=False).ok
