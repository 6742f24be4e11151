"""Hostile dump directories: a dump from another team's job on a shared file system may be
damaged, or crafted.  Reading, verifying or loading one must never write outside the dump's
own names, block, read a declared size it cannot hold, remove what no dump writer made, or
raise anything but a TqstoreError; and the store is left as it was.

Each case tampers with a copy of one clean dump (re-signed where it matters: the manifest's
sizes, CRCs and checksum recomputed, as an attacker or a buggy tool would).  The cases that
blocked a process forever before their fix run in a child process with a time bound.
"""
from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import tqstore
from tqstore import CheckpointError, CorruptionError, StorageIOError, TqstoreError
from tqstore import _native
from tqstore._format import dump_records as D

from checkpoint_helpers import fill
from restore_helpers import write_dump

ROOT = Path(__file__).resolve().parents[1]
CHILD_TIMEOUT_S = 60


@pytest.fixture(scope="module")
def clean_dump(tmp_path_factory):
    base = tmp_path_factory.mktemp("hostile-dump")
    with tqstore.open(base / "src", num_units=2) as s:
        keys = fill(s, "train", 6)
        write_dump(s, base / "dump", keys, "train")
    return base / "dump"


@pytest.fixture
def dump(clean_dump, tmp_path):
    d = tmp_path / "share" / "dump"
    d.parent.mkdir()
    shutil.copytree(clean_dump, d)
    return d


def resign(dump: Path, *, rows: bytes = None, mutate=None) -> None:
    """Recompute the manifest's row index entry (when ``rows`` replace rows.json) and its
    checksum after ``mutate(manifest)``."""
    mp = dump / D.MANIFEST_NAME
    m = json.loads(mp.read_bytes())
    if rows is not None:
        (dump / D.ROW_INDEX_NAME).write_bytes(rows)
        m["row_index"].update(size=len(rows), crc32c=_native.crc32c(rows))
    if mutate is not None:
        mutate(m)
    m.pop("manifest_crc32c", None)
    m["manifest_crc32c"] = _native.crc32c(D._canonical(m))
    mp.write_text(json.dumps(m, sort_keys=True) + "\n")


def run_child(code: str) -> subprocess.CompletedProcess:
    """``code`` in a new interpreter importing this checkout; fails the test if it runs past
    the time bound (a hang is the failure these cases guard against)."""
    prog = f"import sys; sys.path.insert(0, {str(ROOT)!r}); import tqstore\n" + textwrap.dedent(code)
    try:
        return subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"blocked for more than {CHILD_TIMEOUT_S} s")


def test_a_link_at_the_markers_temporary_name_is_not_written_through(dump, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("IMPORTANT DATA\n")
    os.symlink(victim, dump.with_name("dump.restore.tmp"))
    with tqstore.open(tmp_path / "store", num_units=2) as s:
        assert s.load_data_by_key(dump)["keys"] == 6
        assert victim.read_text() == "IMPORTANT DATA\n"
        assert not os.path.lexists(dump.with_name("dump.restore"))  # (settled: the marker is gone)
        assert s.load_data_by_key(dump)["keys"] == 6  # (a second load is not refused by a marker left behind)


def test_a_fifo_at_the_markers_temporary_name_does_not_block_a_load(dump, tmp_path):
    os.mkfifo(dump.with_name("dump.restore.tmp"))
    r = run_child(f"""
        with tqstore.open({str(tmp_path / "store")!r}, num_units=2) as s:
            print(s.load_data_by_key({str(dump)!r})["keys"])""")
    assert r.returncode == 0 and r.stdout.split() == ["6"], r.stderr


def test_a_lock_file_that_is_a_link_is_refused_and_nothing_is_created_at_its_target(dump, tmp_path):
    target = tmp_path / "outside" / "created-by-tqstore"
    target.parent.mkdir()
    os.symlink(target, dump.with_name("dump.lock"))
    with pytest.raises(CheckpointError, match="must be a regular file"):
        tqstore.read_row_index(dump)
    assert not os.path.lexists(target)


def test_a_lock_file_linked_to_the_loading_stores_own_lock_does_not_deadlock(dump, tmp_path):
    os.symlink(tmp_path / "store" / "LOCK", dump.with_name("dump.lock"))
    r = run_child(f"""
        with tqstore.open({str(tmp_path / "store")!r}, num_units=2) as s:
            try:
                s.load_data_by_key({str(dump)!r})
            except tqstore.TqstoreError as e:
                print(type(e).__name__, e)""")
    assert r.returncode == 0 and r.stdout.startswith("CheckpointError") and "regular file" in r.stdout, r


def test_a_lock_file_that_is_a_fifo_is_refused_without_blocking(dump, tmp_path):
    os.mkfifo(dump.with_name("dump.lock"))
    r = run_child(f"""
        with tqstore.open({str(tmp_path / "store")!r}, num_units=2) as s:
            try:
                s.load_data_by_key({str(dump)!r})
            except tqstore.TqstoreError as e:
                print(type(e).__name__, e)
            print(s.kv_list())""")
    assert r.returncode == 0 and r.stdout.startswith("CheckpointError") and "regular file" in r.stdout, r
    assert r.stdout.splitlines()[-1] == "{}"  # nothing loaded


def test_a_read_never_removes_a_directory_tree_no_dump_writer_made(dump):
    precious = dump.with_name("dump.tmp") / "shard-000.tqd" / "work" / "notes.txt"
    precious.parent.mkdir(parents=True)
    precious.write_text("precious")
    assert len(tqstore.read_row_index(dump)["rows"]) == 6
    assert precious.read_text() == "precious"


def test_a_row_index_larger_than_the_limit_is_refused_before_it_is_read(dump, tmp_path):
    rows = dump / D.ROW_INDEX_NAME
    size = D.MAX_JSON_BYTES + 4096
    with open(rows, "r+b") as f:
        f.truncate(size)  # (sparse: costs no disk)
    resign(dump, mutate=lambda m: m["row_index"].update(size=size))
    with tqstore.open(tmp_path / "store", num_units=2) as s:
        with pytest.raises(CorruptionError, match=f"at most {D.MAX_JSON_BYTES}"):
            s.load_data_by_key(dump)
        assert s.kv_list() == {}


def test_a_shard_claiming_more_frames_than_the_row_index_is_refused_before_its_table_is_read(dump, tmp_path):
    n = 1 << 24
    toff, tlen = D.SHARD_HEADER_SIZE + n * 64, n * 32 + 4
    head = D.SHARD_HEADER.pack(D.SHARD_MAGIC, 1, 0, 0, 2, n, toff, tlen, 0, bytes(16), 0)
    head = head[:-4] + struct.pack("<I", _native.crc32c(head[:-4]))
    shard = dump / D.shard_name(0)
    with open(shard, "wb") as f:
        f.write(head)
        f.truncate(toff + tlen)  # (sparse)
    resign(dump, mutate=lambda m: next(s for s in m["shards"] if s["unit"] == 0).update(size=toff + tlen, frames=n))
    with tqstore.open(tmp_path / "store", num_units=2) as s:
        with pytest.raises(CorruptionError, match=f"holds {n} frames, the row index's rows on its unit"):
            s.load_data_by_key(dump)
        assert s.kv_list() == {}


@pytest.mark.parametrize("schema", [{"kind": [], "dtype": "float32"}, {"kind": "tensor", "dtype": {}}])
def test_a_schema_of_the_wrong_json_type_is_damage(dump, tmp_path, schema):
    doc = json.loads((dump / D.ROW_INDEX_NAME).read_bytes())
    doc["schemas"][next(iter(doc["schemas"]))] = schema
    resign(dump, rows=json.dumps(doc).encode())
    with pytest.raises(CorruptionError, match="not a known kind and dtype"):
        tqstore.read_row_index(dump)
    with tqstore.open(tmp_path / "store", num_units=2) as s:
        with pytest.raises(CorruptionError, match="not a known kind and dtype"):
            s.load_data_by_key(dump)


def test_a_unit_count_past_the_limit_is_damage(dump, tmp_path):
    resign(dump, mutate=lambda m: m.update(num_units=2 ** 64))
    with tqstore.open(tmp_path / "store", num_units=2) as s:
        with pytest.raises(CorruptionError, match="'num_units' must be an int from 1 to 4096"):
            s.load_data_by_key(dump)


def test_a_huge_integer_in_the_manifest_is_refused_at_once(dump):
    mp = dump / D.MANIFEST_NAME
    text = mp.read_text()
    mp.write_text(text.replace('"num_units": 2', '"num_units": 1' + "0" * 2_000_000, 1))
    with pytest.raises(CorruptionError, match="dump MANIFEST.json: not UTF-8 JSON"):
        tqstore.read_row_index(dump)  # (parsed in pieces: minutes of CPU for 20 million digits)


@pytest.mark.skipif(shutil.which("setpriv") is None or os.geteuid() != 0, reason="needs root and setpriv")
def test_an_unreadable_row_index_is_a_storage_error_naming_it(dump, tmp_path):
    (dump / D.ROW_INDEX_NAME).chmod(0)
    code = f"""import sys; sys.path.insert(0, {str(ROOT)!r}); import tqstore
try:
    tqstore.read_row_index({str(dump)!r})
except tqstore.TqstoreError as e:
    print(type(e).__name__, e)
with tqstore.open({str(tmp_path / "store")!r}, num_units=2) as s:
    try:
        s.load_data_by_key({str(dump)!r})
    except tqstore.TqstoreError as e:
        print(type(e).__name__, e)
    print(s.kv_list())"""
    # (root reads any file: drop the capabilities that let it)
    r = subprocess.run(["setpriv", "--bounding-set", "-dac_override,-dac_read_search", sys.executable, "-c", code],
                       capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    assert r.returncode == 0, r.stderr
    read, load, last = r.stdout.splitlines()
    for first in (read, load):  # (read_row_index and a load say the same of the same file)
        assert first.startswith("StorageIOError") and str(dump / D.ROW_INDEX_NAME) in first, first
    assert last == "{}"
    assert issubclass(StorageIOError, TqstoreError)


def test_verify_reports_a_tag_that_a_load_refuses(dump, tmp_path):
    from tqstore.dump import verify_dump

    doc = json.loads((dump / D.ROW_INDEX_NAME).read_bytes())
    deep: object = 1
    for _ in range(70):  # (a put refuses tags nested deeper than 64 levels)
        deep = [deep]
    doc["rows"][0]["tag"] = deep
    resign(dump, rows=json.dumps(doc).encode())
    problems = verify_dump(dump)
    assert len(problems) == 1 and f"the tag of key {doc['rows'][0]['key']!r} cannot be loaded" in problems[0]
    with tqstore.open(tmp_path / "store", num_units=2) as s:
        with pytest.raises(TqstoreError):
            s.load_data_by_key(dump)
        assert s.kv_list() == {}


def test_an_integer_too_long_to_show_in_the_row_index_is_damage_not_a_value_error(dump, tmp_path):
    from tqstore.dump import verify_dump

    raw = (dump / D.ROW_INDEX_NAME).read_text()
    doc = json.loads(raw)
    g = doc["rows"][0]["gidx"]
    resign(dump, rows=raw.replace(f'"gidx": {g},', '"gidx": 1' + "0" * 5000 + ",", 1).replace(
        f'"gidx":{g},', '"gidx":1' + "0" * 5000 + ",", 1).encode())
    with pytest.raises(CorruptionError, match="integer too long to show"):
        tqstore.read_row_index(dump)
    assert any("integer too long to show" in p for p in verify_dump(dump))
    with tqstore.open(tmp_path / "store", num_units=2) as s:
        with pytest.raises(CorruptionError):
            s.load_data_by_key(dump)
