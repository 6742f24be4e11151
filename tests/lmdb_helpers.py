"""Real LMDB data files for the bulk page reader's tests (tests/test_lmdb_pages.py, the leaf
kernel's twins in tests/test_native.py): environments written by py-lmdb, never faked; and
ways to find, and damage, the pages and nodes of a database's leaf level in a copy of the
file (tqstore/_format/lmdb_pages.py has the layout)."""
from __future__ import annotations

import random
import struct
from pathlib import Path
from typing import Dict, List, Tuple

import lmdb
import numpy as np

from tqstore._format.lmdb_pages import PageFile

PSIZE = 4096  # (py-lmdb's page size on this platform: the tests check it)


def fill_env(path: Path, rng: random.Random, scale: int = 1) -> List[bytes]:
    """An environment at ``path`` with named databases of every shape the reader meets: many
    small entries (depth 3 at scale 1), values on overflow pages (some of several pages),
    small and big values interleaved, long keys, and an empty one; then deletes (free pages,
    pages of other fill levels).  Returns the database names."""
    env = lmdb.open(str(path), max_dbs=8, map_size=1 << 30)
    names = (b"small", b"big", b"mixed", b"wide", b"empty")
    dbs = {n: env.open_db(n) for n in names}
    with env.begin(write=True) as txn:
        for i in range(50_000 // scale):  # keys of many lengths
            txn.put(i.to_bytes(8, "big") + b"f" * rng.randrange(1, 12), rng.randbytes(rng.randrange(0, 40)),
                    db=dbs[b"small"])
        for i in range(300 // scale):
            txn.put(b"k%05d" % i, rng.randbytes(rng.choice((3000, 5000, 20000))), db=dbs[b"big"])
        for i in range(3000 // scale):  # a big value now and then among inline ones
            size = rng.choice((2500, 9000)) if i % 37 == 0 else rng.randrange(0, 64)
            txn.put(b"m%06d" % i, rng.randbytes(size), db=dbs[b"mixed"])
        for i in range(2000 // scale):
            txn.put(rng.randbytes(rng.randrange(100, 400)), b"v", db=dbs[b"wide"])
    with env.begin(write=True) as txn:
        cur = txn.cursor(db=dbs[b"small"])
        for k in list(cur.iternext(values=False))[::7]:
            txn.delete(k, db=dbs[b"small"])
    env.close()
    return list(names)


def through_lmdb(path: Path, names: List[bytes]) -> Dict[bytes, List[Tuple[bytes, bytes]]]:
    """Every entry of the databases ``names`` of the environment at ``path``, through lmdb."""
    env = lmdb.open(str(path), max_dbs=8, map_size=1 << 30, readonly=True, lock=False)
    try:
        with env.begin() as txn:
            return {n: list(txn.cursor(env.open_db(n, txn=txn, create=False))) for n in names}
    finally:
        env.close()


def leaves(raw, name: bytes) -> Tuple[PageFile, np.ndarray]:
    """The page file of ``raw`` and the leaf pages of its database ``name``, in tree order."""
    pf = PageFile(raw)
    return pf, pf.leaf_pages(pf.databases()[name])


def put16(buf: bytearray, at: int, v: int) -> None:
    struct.pack_into("<H", buf, at, v)


def get16(buf, at: int) -> int:
    return struct.unpack_from("<H", buf, at)[0]


def node_at(buf, pg: int, k: int) -> int:
    """The file offset of node ``k`` of page ``pg``."""
    return pg * PSIZE + get16(buf, pg * PSIZE + 16 + 2 * k)


def big_node(buf, pgnos: np.ndarray) -> Tuple[int, int]:
    """(page, node index) of the first F_BIGDATA node of the pages ``pgnos``."""
    for pg in pgnos.tolist():
        for k in range((get16(buf, pg * PSIZE + 12) - 16) // 2):
            if get16(buf, node_at(buf, pg, k) + 4) & 1:
                return pg, k
    raise AssertionError("no F_BIGDATA node")


def leaf_pointers(raw, name: bytes) -> np.ndarray:
    """The file offsets of the branch nodes that name the leaf pages of database ``name``
    (a tree of depth 2 or more), in leaf order: a node's first 6 bytes are the child's page."""
    from tqstore._format.lmdb_pages import P_BRANCH, _words
    pf = PageFile(raw)
    db = pf.databases()[name]
    assert db.depth >= 2
    level, node = np.array([db.root], np.int64), None
    for _ in range(db.depth - 1):
        off, n = pf._pages(level, P_BRANCH)
        node = pf._nodes(off, n)
        level = (_words(pf.b, node) & np.uint64((1 << 48) - 1)).astype(np.int64)
    return node


def set_pointer(buf: bytearray, at: int, pg: int) -> None:
    """Make the branch node at ``at`` name page ``pg``."""
    struct.pack_into("<IH", buf, at, pg & 0xFFFFFFFF, pg >> 32)


# One way to damage each check of a leaf page, made on the middle leaf of a database:
# (name, what it does, the phrase of the failure it raises).  File-level damage; the page
# number classes (outside the file, named twice) are made on the page numbers, or through a
# branch node.
DAMAGE = {
    "kind": "a page of another kind than the tree's level",
    "number": "a page that is not the page its number names",
    "area_odd": "a page's node area is malformed",
    "area_upper": "a page's node area is malformed",
    "area_crowded": "a page's node area is malformed",
    "offset_out": "a node offset outside its page",
    "offset_odd": "a node offset outside its page",
    "offset_header": "a node offset outside its page",
    "flags": "a node of unexpected flags",
    "key_past_end": "a node past the end of its page",
    "data_past_end": "a node past the end of its page",
    "overlap": "nodes of more bytes than the page's node area",
    "same_node": "nodes of more bytes than the page's node area",
}


def damage(raw, name: bytes, kind: str) -> Tuple[bytes, int]:
    """A copy of ``raw`` with the middle leaf page of database ``name`` damaged as ``kind``
    (a key of DAMAGE); returns it and the damaged page's number."""
    buf = bytearray(raw)
    _pf, lv = leaves(raw, name)
    pg = int(lv[len(lv) // 2])
    p = pg * PSIZE
    lower, upper = get16(buf, p + 12), get16(buf, p + 14)
    n = (lower - 16) // 2
    node = node_at(buf, pg, n - 1)
    if kind == "kind":
        put16(buf, p + 10, 0x01)  # a branch page
    elif kind == "number":
        struct.pack_into("<Q", buf, p, pg + 1)
    elif kind == "area_odd":
        put16(buf, p + 12, lower + 1)
    elif kind == "area_upper":
        put16(buf, p + 14, PSIZE + 2)
    elif kind == "offset_out":
        put16(buf, p + 16 + 2 * (n - 1), PSIZE - 4)  # its 8-byte header past the page
    elif kind == "offset_odd":
        put16(buf, p + 16 + 2 * (n - 1), get16(buf, p + 16 + 2 * (n - 1)) + 1)
    elif kind == "offset_header":
        put16(buf, p + 16, 8)  # inside the page header
    elif kind == "flags":
        put16(buf, node + 4, get16(buf, node + 4) | 0x04)  # F_DUPDATA
    elif kind == "key_past_end":
        put16(buf, node + 6, 0xFFFF)
    elif kind == "data_past_end":
        struct.pack_into("<I", buf, node, PSIZE)  # (an inline value)
    elif kind == "area_crowded":
        put16(buf, p + 14, PSIZE - 8 * n + 2)  # less than the nodes' headers
    elif kind == "overlap":
        put16(buf, p + 14, PSIZE - 8 * n - 2)  # the nodes' headers and 2 bytes
    elif kind == "same_node":  # every offset names the page's largest node
        sizes = [get16(buf, node_at(buf, pg, k) + 6) + struct.unpack_from("<I", buf, node_at(buf, pg, k))[0]
                 for k in range(n)]
        top = get16(buf, p + 16 + 2 * int(np.argmax(sizes)))
        for k in range(n):
            put16(buf, p + 16 + 2 * k, top)
    else:
        raise KeyError(kind)
    return bytes(buf), pg
