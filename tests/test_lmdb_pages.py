"""Reading LMDB databases in bulk from the data file's pages (tqstore/_format/lmdb_pages.py,
tqstore/_io/lmdbenv.read_columns) gives exactly what iterating them through lmdb gives, or
nothing (the caller then iterates): a store decodes the same controller state and the same
unit keys either way.  The leaf level is read by the native kernel (_native.leaf_room and
leaf_columns) or its pure twin: both read real files alike and turn each kind of damage
into an LmdbPageError."""
from __future__ import annotations

import random
import struct

import lmdb
import numpy as np
import pytest

from tqstore import _native
from tqstore._format.lmdb_pages import LmdbPageError, Packed, PageFile, packed_chunks, read_databases
from tqstore._io.lmdbenv import read_columns

import lmdb_helpers

native_only = pytest.mark.skipif(_native.IMPLEMENTATION != "native",
                                 reason="read_columns reads in bulk with the native build only")


def _through_lmdb(env, txn, name):
    db = env.open_db(name, txn=txn, create=False)
    return list(txn.cursor(db))


def _entries(c):
    return list(zip(Packed(c.keys, c.key_lens), Packed(c.values, c.value_lens)))


@pytest.fixture(scope="module")
def lmdb_file(tmp_path_factory):
    """A data file written by py-lmdb (tests/lmdb_helpers.fill_env): its bytes, its database
    names and their entries through lmdb."""
    path = tmp_path_factory.mktemp("pages")
    names = lmdb_helpers.fill_env(path, random.Random(3))
    return (path / "data.mdb").read_bytes(), names, lmdb_helpers.through_lmdb(path, names)


@native_only
def test_bulk_columns_equal_lmdb_iteration(tmp_path):
    rng = random.Random(1)
    names = lmdb_helpers.fill_env(tmp_path / "env", rng)
    env = lmdb.open(str(tmp_path / "env"), max_dbs=8, map_size=1 << 30)
    with env.begin() as txn:
        cols = read_columns(env, txn, names)
        assert cols is not None and set(cols) == set(names)
        for n in names:
            want = _through_lmdb(env, txn, n)
            c = cols[n]
            assert len(c) == len(want)
            assert _entries(c) == want, n
            chunks = list(packed_chunks(c, 777))
            assert [k for ks, _ in chunks for k in ks] == [k for k, _ in want]
    env.close()


@native_only
def test_a_reader_sees_its_own_transaction_or_falls_back(tmp_path):
    env = lmdb.open(str(tmp_path / "env"), max_dbs=2, map_size=1 << 30)
    db = env.open_db(b"d")
    with env.begin(write=True) as txn:
        txn.put(b"a", b"1", db=db)
    with env.begin() as old:
        with env.begin(write=True) as txn:
            txn.put(b"b", b"2", db=db)
        cols = read_columns(env, old, [b"d"])  # the meta page of ``old`` is still there: its view
        assert cols is not None and len(cols[b"d"]) == 1
        for v in (b"3", b"4"):  # two more commits overwrite both meta pages
            with env.begin(write=True) as txn:
                txn.put(v, v, db=db)
        assert read_columns(env, old, [b"d"]) is None  # the caller iterates through lmdb
    env.close()


@native_only
def test_damaged_pages_raise_a_page_error_never_crash(tmp_path):
    rng = random.Random(2)
    names = lmdb_helpers.fill_env(tmp_path / "env", rng)
    raw = bytearray((tmp_path / "env" / "data.mdb").read_bytes())
    psize = 4096
    for trial in range(200):
        buf = bytearray(raw)
        for _ in range(rng.randrange(1, 20)):
            pg = rng.randrange(2, len(buf) // psize)
            at = pg * psize + rng.choice((0, 10, 12, 14, 16, 18, 20, rng.randrange(psize)))
            buf[at] ^= 1 << rng.randrange(8)
        try:
            read_databases(bytes(buf), names)
        except LmdbPageError:
            pass  # (a flip inside a key or value reads as other bytes: lmdb would return them too)


# ---- both leaf kernels (record_path: the C one, then the pure twin) ----------------------


def test_both_kernels_read_what_lmdb_reads(lmdb_file, record_path):
    raw, names, want = lmdb_file
    cols = read_databases(raw, names + [b"absent"])
    assert set(cols) == set(names)
    for n in names:  # small and big values, interleaved too (b"mixed"), many pages, an empty tree
        assert len(cols[n]) == len(want[n]) and _entries(cols[n]) == want[n], n
        assert cols[n].key_lens.dtype == cols[n].value_lens.dtype == np.int64
    assert PageFile(raw).psize == lmdb_helpers.PSIZE


@pytest.mark.parametrize("kind", sorted(lmdb_helpers.DAMAGE))
def test_each_damaged_leaf_page_is_a_page_error(lmdb_file, record_path, kind):
    raw, names, _want = lmdb_file
    buf, pg = lmdb_helpers.damage(raw, b"small", kind)
    with pytest.raises(LmdbPageError, match=rf"\(page {pg}\).*{lmdb_helpers.DAMAGE[kind]}$"):
        read_databases(buf, names)
    assert set(read_databases(buf, [b"wide", b"big"])) == {b"wide", b"big"}  # the other trees read on


@pytest.mark.parametrize("target, phrase", [("outside", "a page number outside the file"),
                                            ("twice", "a page named twice in the tree"),
                                            ("branch", "a page of another kind than the tree's level")])
def test_a_branch_node_naming_a_wrong_leaf_is_a_page_error(lmdb_file, record_path, target, phrase):
    raw, names, _want = lmdb_file
    pf, lv = lmdb_helpers.leaves(raw, b"small")
    pointers = lmdb_helpers.leaf_pointers(raw, b"small")
    buf = bytearray(raw)
    pg = {"outside": len(raw) // lmdb_helpers.PSIZE + 3, "twice": int(lv[0]),
          "branch": int(pf.databases()[b"small"].root)}[target]
    lmdb_helpers.set_pointer(buf, int(pointers[5]), pg)
    with pytest.raises(LmdbPageError, match=rf"^leaf 5 \(page {pg}\): {phrase}$"):
        read_databases(bytes(buf), names)


def test_a_big_value_on_a_wrong_overflow_page_is_a_page_error(lmdb_file, record_path):
    raw, names, _want = lmdb_file
    _pf, lv = lmdb_helpers.leaves(raw, b"mixed")
    pg, k = lmdb_helpers.big_node(raw, lv)
    node = lmdb_helpers.node_at(raw, pg, k)
    at = node + 8 + lmdb_helpers.get16(raw, node + 6)  # its overflow page number, after the key
    for over, phrase in ((len(raw) // lmdb_helpers.PSIZE, "an overflow page number outside the file"),
                         (int(lv[0]), "a malformed overflow run")):
        buf = bytearray(raw)
        struct.pack_into("<Q", buf, at, over)
        with pytest.raises(LmdbPageError, match=phrase):
            read_databases(bytes(buf), names)


def test_truncated_files_are_page_errors(lmdb_file, record_path):
    raw, names, _want = lmdb_file
    for cut in (len(raw) - 1, len(raw) - lmdb_helpers.PSIZE, len(raw) // 2, 3 * lmdb_helpers.PSIZE + 17, 100, 0):
        with pytest.raises(LmdbPageError):
            read_databases(raw[:cut], names)


def test_a_record_naming_a_page_past_2_63_is_a_page_error(lmdb_file, record_path):
    raw, names, _want = lmdb_file
    pf = PageFile(raw)
    main = pf.leaf_pages(pf.main)
    cols = read_databases(raw, names)
    assert len(cols[b"wide"])
    buf = bytearray(raw)  # the root page of b"wide"'s record (a main database value)
    for k in range((lmdb_helpers.get16(buf, int(main[0]) * 4096 + 12) - 16) // 2):
        node = lmdb_helpers.node_at(buf, int(main[0]), k)
        ksize = lmdb_helpers.get16(buf, node + 6)
        if bytes(buf[node + 8:node + 8 + ksize]) == b"wide":
            struct.pack_into("<Q", buf, node + 8 + ksize + 40, (1 << 63) + 5)
    with pytest.raises(LmdbPageError, match="a page number outside the file"):
        read_databases(bytes(buf), [b"wide"])
