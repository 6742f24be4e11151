"""Copies of LMDB index files a checkpoint load stages (tqstore/_io/lmdbenv.copy_env_file,
copy_env; ControllerPort.stage_import): a checkpoint's index is a compacted copy, so its bytes
are copied as they are, without LMDB mapping it (the controller's copy is made before its
source is checked); a file with free pages is compacted instead, so a staged copy never holds
a free page; and a staging that would need LMDB on the unchecked source writes nothing, as
does one whose copy does not read checked page by page and entry by entry (LMDB opens a
staged copy of an unchecked source only when every page and entry of the copy did)."""
from __future__ import annotations

import mmap
import shutil
from pathlib import Path

import lmdb
import pytest

from tqstore._format.lmdb_pages import PageFile
from tqstore._io.lmdbenv import copy_env, copy_env_file
from tqstore.checkpoint import read_manifest
from tqstore.controller import Controller
from tqstore.store import Store

from checkpoint_helpers import fill, state


def _free_list_empty(env_dir: Path) -> bool:
    with open(env_dir / "data.mdb", "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            return PageFile(mm).free_list_empty
        finally:
            mm.close()


def _env_with_free_pages(d: Path) -> Path:
    d.mkdir()
    env = lmdb.open(str(d), map_size=1 << 28, max_dbs=4)
    db = env.open_db(b"x")
    with env.begin(write=True) as txn:
        for i in range(20_000):
            txn.put(i.to_bytes(8, "big"), b"v" * 40, db=db)
    for _ in range(2):  # deletes, then another commit: freed pages are on the free list
        with env.begin(write=True) as txn:
            for i in range(0, 20_000, 2):
                txn.delete(i.to_bytes(8, "big"), db=db)
    env.close()
    assert not _free_list_empty(d)
    return d


def _entries(env_dir: Path):
    env = lmdb.open(str(env_dir), readonly=True, lock=False, max_dbs=16, subdir=True)
    try:
        with env.begin() as txn:
            names = [k for k, _ in txn.cursor()]
            return {n: list(txn.cursor(env.open_db(n, txn=txn, create=False))) for n in names}
    finally:
        env.close()


@pytest.fixture
def checkpoint(tmp_path):
    with Store(tmp_path / "src", num_units=2) as s:
        fill(s, "train", 30)
        s.kv_clear(["k3"], "train")
        s.save_checkpoint(tmp_path / "ck")
        want = state(s)
    return tmp_path / "ck", want


def test_a_checkpoints_index_files_are_copied_byte_for_byte(checkpoint, tmp_path):
    ck, _ = checkpoint
    for rel in [e.path for e in read_manifest(ck).files if e.path.endswith("data.mdb")]:
        src = (ck / rel).parent
        assert _free_list_empty(src)  # the save wrote compacted copies
        dst = tmp_path / ("copy-" + rel.replace("/", "-"))
        dst.mkdir()
        assert copy_env_file(src, dst)
        assert (dst / "data.mdb").read_bytes() == (src / "data.mdb").read_bytes()


def test_an_index_with_free_pages_is_compacted_not_copied(tmp_path):
    src = _env_with_free_pages(tmp_path / "src")
    dst = tmp_path / "dst"
    dst.mkdir()
    assert not copy_env_file(src, dst)
    assert list(dst.iterdir()) == []  # nothing written
    copy_env(src, dst)
    assert _free_list_empty(dst)
    assert (dst / "data.mdb").stat().st_size < (src / "data.mdb").stat().st_size
    assert _entries(dst) == _entries(src)


def test_a_file_that_is_not_an_lmdb_environment_is_left_to_lmdb(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "data.mdb").write_bytes(b"\0" * 8192)
    dst = tmp_path / "dst"
    dst.mkdir()
    assert not copy_env_file(src, dst)
    assert list(dst.iterdir()) == []


def test_the_controller_stages_from_an_unchecked_source_only_what_needs_no_map(checkpoint, tmp_path):
    ck, _ = checkpoint
    src = ck / "controller"
    c = Controller(tmp_path / "live", num_units=2)
    try:
        for kwargs in ({"num_units": 3}, {"clear_produced": True}):
            target = tmp_path / f"refused-{sorted(kwargs)[0]}"
            assert c.stage_import(str(target), str(src), src_checked=False, **kwargs) is False
            assert not target.exists()
        freed = _env_with_free_pages(tmp_path / "freed")
        assert c.stage_import(str(tmp_path / "refused-free"), str(freed), src_checked=False) is False
        assert not (tmp_path / "refused-free").exists()
        damaged = tmp_path / "damaged"
        damaged.mkdir()
        raw = bytearray((src / "data.mdb").read_bytes())
        page = 4096
        assert len(raw) >= 4 * page
        raw[3 * page + 12:3 * page + 16] = b"\xff\xff\x00\x00"  # a page's node area past the page
        (damaged / "data.mdb").write_bytes(bytes(raw))
        assert c.stage_import(str(tmp_path / "refused-damaged"), str(damaged), src_checked=False) is False
        assert not (tmp_path / "refused-damaged").exists()
        lie = tmp_path / "lie"  # well-formed pages, an entry of the wrong shape: a free gidx with a value
        (tmp_path / "lie-raw").mkdir()
        shutil.copy(src / "data.mdb", tmp_path / "lie-raw" / "data.mdb")
        raw_env = lmdb.open(str(tmp_path / "lie-raw"), map_size=1 << 28, max_dbs=16)
        with raw_env.begin(write=True) as txn:
            txn.put((7).to_bytes(8, "big"), b"not empty", db=raw_env.open_db(b"free", txn=txn))
        lie.mkdir()
        raw_env.copy(str(lie), compact=True)
        raw_env.close()
        assert c.stage_import(str(tmp_path / "refused-lie"), str(lie), src_checked=False) is False
        assert not (tmp_path / "refused-lie").exists()
        assert c.stage_import(str(tmp_path / "early"), str(src), src_checked=False) is True
        assert (tmp_path / "early" / "data.mdb").read_bytes() == (src / "data.mdb").read_bytes()
        assert c.stage_import(str(tmp_path / "resharded"), str(src), num_units=3) is True
    finally:
        c.close()
    staged = Controller(tmp_path / "resharded", num_units=3)
    try:
        assert staged.num_units == 3
    finally:
        staged.close()


def test_a_load_whose_controller_was_copied_early_equals_the_saved_store(checkpoint, tmp_path, monkeypatch):
    ck, want = checkpoint
    staged = []
    real = Controller.stage_import

    def stage_import(self, target_dir, src_dir, **kw):
        done = real(self, target_dir, src_dir, **kw)
        staged.append((kw.get("src_checked", True), done, done and _free_list_empty(Path(target_dir))))
        return done

    monkeypatch.setattr(Controller, "stage_import", stage_import)
    with Store(tmp_path / "dst", num_units=2) as d:
        fill(d, "other", 4)
        info = d.load_checkpoint(ck)
        assert info.mode == "same"
        assert state(d) == want
        assert staged == [(False, True, True)]  # the early byte copy, no free page in it
    with Store(tmp_path / "dst") as d:
        assert state(d) == want
