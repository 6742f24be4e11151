"""Reading LMDB databases in bulk from the data file's pages (tqstore/_format/lmdb_pages.py,
tqstore/_io/lmdbenv.read_columns) gives exactly what iterating them through lmdb gives, or
nothing (the caller then iterates): a store decodes the same controller state and the same
unit keys either way."""
from __future__ import annotations

import mmap
import os
import random

import lmdb
import numpy as np
import pytest

from tqstore import _native
from tqstore._format.lmdb_pages import LmdbPageError, Packed, packed_chunks, read_databases
from tqstore._io.lmdbenv import read_columns

pytestmark = pytest.mark.skipif(_native.IMPLEMENTATION != "native", reason="bulk reads need the native build")


def _through_lmdb(env, txn, name):
    db = env.open_db(name, txn=txn, create=False)
    return list(txn.cursor(db))


def _fill(env, rng):
    dbs = {n: env.open_db(n) for n in (b"small", b"big", b"wide", b"empty")}
    with env.begin(write=True) as txn:
        for i in range(50_000):  # depth 3, keys of many lengths
            txn.put(i.to_bytes(8, "big") + b"f" * rng.randrange(1, 12), rng.randbytes(rng.randrange(0, 40)),
                    db=dbs[b"small"])
        for i in range(300):  # values on overflow pages, some of several pages
            txn.put(b"k%05d" % i, rng.randbytes(rng.choice((3000, 5000, 20000))), db=dbs[b"big"])
        for i in range(2000):  # long keys
            txn.put(rng.randbytes(rng.randrange(100, 400)), b"v", db=dbs[b"wide"])
    with env.begin(write=True) as txn:  # deletes: free pages, pages of other shapes
        cur = txn.cursor(db=dbs[b"small"])
        for k in list(cur.iternext(values=False))[::7]:
            txn.delete(k, db=dbs[b"small"])
    return list(dbs)


def test_bulk_columns_equal_lmdb_iteration(tmp_path):
    rng = random.Random(1)
    env = lmdb.open(str(tmp_path / "env"), max_dbs=8, map_size=1 << 30)
    names = _fill(env, rng)
    with env.begin() as txn:
        cols = read_columns(env, txn, names)
        assert cols is not None and set(cols) == set(names)
        for n in names:
            want = _through_lmdb(env, txn, n)
            c = cols[n]
            assert len(c) == len(want)
            got = list(zip(Packed(c.keys, c.key_lens), Packed(c.values, c.value_lens)))
            assert got == want, n
            chunks = list(packed_chunks(c, 777))
            assert [k for ks, _ in chunks for k in ks] == [k for k, _ in want]
    env.close()


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


def test_damaged_pages_raise_a_page_error_never_crash(tmp_path):
    rng = random.Random(2)
    env = lmdb.open(str(tmp_path / "env"), max_dbs=8, map_size=1 << 30)
    names = _fill(env, rng)
    env.close()
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
