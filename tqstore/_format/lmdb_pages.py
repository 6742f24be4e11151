"""The entries of LMDB databases read in bulk from the data file's pages, as columns.

Reading millions of entries through the ``lmdb`` binding makes two Python objects per
entry; a store's open and a checkpoint's load need every entry of a few large databases
(the controller's ``rows`` and ``keys``, a unit's ``loc`` keys) and nothing else of them.
This module decodes the B+tree pages of an LMDB data file (LMDB 0.9, data format version
1, 64-bit): the branch levels with array operations (few pages), giving a database's leaf
pages in tree order; then the leaf level, nearly all of the work, by the native kernel
(:func:`tqstore._native.leaf_room` sizes the outputs, :func:`~tqstore._native.leaf_columns`
fills them: C without the GIL, or its numpy twin in the pure-Python build), which checks
every leaf page and node and copies the keys and the inline values into one buffer each
with their lengths; a value on overflow pages (F_BIGDATA, rare) is read here and put in
its place.

Bytes in, columns out: ``buf`` is the file's bytes (a read-only map or a bytes object).
Entries are decoded this way from files whose structure LMDB wrote (a store's own index)
or that passed a checkpoint's LMDB check, which is this reader run over an untrusted file
(:func:`tqstore._io.lmdbenv.check_env_pages`); so every page number, node offset and
length is checked against the page and the file, a page's nodes must fit its node area,
the traversal must see each page once, and the totals must match the database's record
(depth, branch, leaf and overflow pages, entries): anything else raises
:class:`LmdbPageError` (naming the leaf, page and node of a leaf's failure), and the caller
reads the database through ``lmdb`` instead.  The order of the entries is the tree's, which
is LMDB's cursor order.

Layout (``lmdb/libraries/liblmdb/mdb.c``): a page starts with a 16-byte header (page
number u64, pad u16, flags u16, lower u16, upper u16; an overflow page's lower/upper are its
page count u32), then ``(lower - 16) / 2`` node offsets (u16); the nodes lie side by side
from ``upper`` to the page's end (its node area).  A node is lo u16, hi u16,
flags u16, key size u16, the key, then (leaf) the value of ``lo | hi << 16`` bytes or
(F_BIGDATA) the page number u64 of the overflow pages holding it; a branch node's child page
number is ``lo | hi << 16 | flags << 32``.  Pages 0 and 1 are meta pages: after the header,
magic u32, version u32, address u64, map size u64, two database records (free list and
main; 48 bytes each: pad u32 (the page size, in the free list's), flags u16, depth u16,
branch, leaf, overflow pages, entries, root page, u64 each), last page u64, txnid u64; the
one with the larger txnid is current.  A named database is a main-database entry of flags
F_SUBDATA whose value is its 48-byte record.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from .. import _native
from .._native._pure_lmdb import _le16 as _u16, _le64_any as _u64, _le64_even as _words  # (the pure twin's byte readers)

PAGEHDRSZ = 16
P_BRANCH, P_LEAF, P_OVERFLOW, P_META, P_LEAF2 = 0x01, 0x02, 0x04, 0x08, 0x20
F_BIGDATA, F_SUBDATA, F_DUPDATA = 0x01, 0x02, 0x04
MDB_MAGIC = 0xBEEFC0DE
MDB_DATA_VERSION = 1
P_INVALID = (1 << 64) - 1
DB_RECORD = struct.Struct("<IHHQQQQQ")  # pad, flags, depth, branch, leaf, overflow, entries, root
META = struct.Struct("<IIQQ")  # magic, version, address, map size (the records follow)
MDB_DUPSORT = 0x04


class LmdbPageError(ValueError):
    """The file's pages do not read as this module expects (the caller uses ``lmdb``)."""


@dataclass(frozen=True)
class DbRecord:
    flags: int
    depth: int
    branch_pages: int
    leaf_pages: int
    overflow_pages: int
    entries: int
    root: int


@dataclass
class Columns:
    """A database's entries in cursor order: ``keys`` and ``values`` back to back (uint8
    arrays), ``key_lens`` and ``value_lens`` (int64), ``key_starts``/``value_starts``."""

    keys: np.ndarray
    key_lens: np.ndarray
    values: np.ndarray
    value_lens: np.ndarray

    def __len__(self) -> int:
        return len(self.key_lens)

    @property
    def key_starts(self) -> np.ndarray:
        return np.cumsum(self.key_lens) - self.key_lens

    @property
    def value_starts(self) -> np.ndarray:
        return np.cumsum(self.value_lens) - self.value_lens


class PageFile:
    """An LMDB data file's bytes (``buf``: anything numpy can view as bytes), as of the
    transaction ``txnid`` (its meta page must still be in the file: a reader that holds
    that transaction open keeps its pages from being reused), or of the newest one.
    ``main`` and ``free_list`` are that meta page's database records.  Only the two meta
    pages are read until a database's entries are asked for."""

    def __init__(self, buf: Any, txnid: Optional[int] = None) -> None:
        self.b = np.frombuffer(buf, dtype=np.uint8)
        if len(self.b) < 2 * PAGEHDRSZ + META.size + 2 * DB_RECORD.size + 16:
            raise LmdbPageError("shorter than a meta page")
        head = bytes(self.b[:PAGEHDRSZ + META.size + DB_RECORD.size])
        psize = DB_RECORD.unpack_from(head, PAGEHDRSZ + META.size)[0]
        if psize < 512 or psize & (psize - 1) or len(self.b) < 2 * psize:
            raise LmdbPageError(f"page size {psize}")
        self.psize = psize
        self.npages = len(self.b) // psize
        best = None
        for pg in (0, 1):
            raw = bytes(self.b[pg * psize:pg * psize + PAGEHDRSZ + META.size + 2 * DB_RECORD.size + 16])
            flags = struct.unpack_from("<H", raw, 10)[0]
            magic, version, _addr, _size = META.unpack_from(raw, PAGEHDRSZ)
            if not flags & P_META or magic != MDB_MAGIC or version != MDB_DATA_VERSION:
                raise LmdbPageError("not an LMDB meta page")
            at = PAGEHDRSZ + META.size + 2 * DB_RECORD.size
            last_pg, tid = struct.unpack_from("<QQ", raw, at)
            if (tid == txnid if txnid is not None else best is None or tid > best[0]):
                best = (tid, _record(raw, PAGEHDRSZ + META.size + DB_RECORD.size), last_pg,
                        _record(raw, PAGEHDRSZ + META.size))
        if best is None:
            raise LmdbPageError(f"no meta page of transaction {txnid}")
        self.txnid, self.main, last_pg, self.free_list = best
        if last_pg >= self.npages:
            raise LmdbPageError(f"last page {last_pg} past the file's {self.npages}")

    @property
    def free_list_empty(self) -> bool:
        """The current meta page records an empty free list (no page of the file is free): so
        does every compacted copy."""
        f = self.free_list
        return f.root == P_INVALID and not (f.entries or f.depth or f.branch_pages or f.leaf_pages or f.overflow_pages)

    def databases(self) -> Dict[bytes, DbRecord]:
        """The named databases (the main database's F_SUBDATA entries)."""
        cols, flags = self._entries(self.main, want_flags=True)
        out = {}
        ks, vs = cols.key_starts, cols.value_starts
        for i in range(len(cols)):
            if not flags[i] & F_SUBDATA or int(cols.value_lens[i]) != DB_RECORD.size:
                raise LmdbPageError("a main database entry is not a database record")
            name = cols.keys[ks[i]:ks[i] + cols.key_lens[i]].tobytes()
            out[name] = _record(cols.values[vs[i]:vs[i] + DB_RECORD.size].tobytes(), 0)
        return out

    def columns(self, db: DbRecord) -> Columns:
        """Every entry of the database ``db`` (a record from :meth:`databases`)."""
        if db.flags & MDB_DUPSORT:
            raise LmdbPageError("a database with sorted duplicates")
        return self._entries(db)[0]

    # ------------------------------------------------------------------ the tree
    def _pages(self, pgnos: np.ndarray, want: int) -> Tuple[np.ndarray, np.ndarray]:
        """Checked headers of ``pgnos``: (page offsets, node counts)."""
        if len(pgnos) and (int(pgnos.max()) >= self.npages or int(pgnos.min()) < 2):
            raise LmdbPageError("a page number outside the file")
        off = pgnos.astype(np.int64) * self.psize
        if (_u16(self.b, off + 10) != want).any():  # exactly (LMDB refuses a tree page with P_DIRTY too)
            raise LmdbPageError("a page of another kind than the tree's level")
        if (_u64(self.b, off) != pgnos.astype(np.uint64)).any():
            raise LmdbPageError("a page that is not the page its number names")
        lower, upper = _u16(self.b, off + 12), _u16(self.b, off + 14)
        if ((lower < PAGEHDRSZ) | (lower & 1 != 0) | (upper > self.psize) | (lower > upper)).any():
            raise LmdbPageError("a page's node area is malformed")
        return off, (lower - PAGEHDRSZ) >> 1

    def _nodes(self, off: np.ndarray, n: np.ndarray) -> np.ndarray:
        """Absolute offsets of the nodes of pages at ``off`` with ``n`` nodes each, in order."""
        total = int(n.sum())
        page = np.repeat(off, n)
        k = np.arange(total) - np.repeat(np.cumsum(n) - n, n)
        at = _u16(self.b, page + PAGEHDRSZ + 2 * k)
        if ((at < PAGEHDRSZ) | (at + 8 > self.psize) | (at & 1 != 0)).any():
            raise LmdbPageError("a node offset outside its page")
        return page + at

    def leaf_pages(self, db: DbRecord) -> np.ndarray:
        """The leaf page numbers of the non-empty database ``db`` in tree order (int64): its
        branch levels walked and checked here, the page counts matched against its record.
        The leaves themselves are checked by :func:`tqstore._native.leaf_columns`."""
        if not 1 <= db.depth <= 64 or db.branch_pages + db.leaf_pages + db.overflow_pages > self.npages:
            raise LmdbPageError("a database record larger than the file")
        if db.root >= self.npages:  # (before it becomes an int64)
            raise LmdbPageError("a page number outside the file")
        level = np.array([db.root], dtype=np.int64)
        branch = 0
        for _ in range(db.depth - 1):  # branch levels: each page's children, in order
            if len(level) > self.npages or len(np.unique(level)) != len(level):
                raise LmdbPageError("a page named twice in the tree")
            off, n = self._pages(level, P_BRANCH)
            branch += len(level)
            if (n < 1).any():
                raise LmdbPageError("an empty branch page")
            node = self._nodes(off, n)
            child = (_words(self.b, node) & np.uint64((1 << 48) - 1)).astype(np.int64)  # lo, hi, flags: the page
            level = child
        if branch != db.branch_pages or len(level) != db.leaf_pages:
            raise LmdbPageError("the tree's pages do not match its record")
        return level

    def _entries(self, db: DbRecord, want_flags: bool = False) -> Tuple[Columns, Optional[np.ndarray]]:
        empty = Columns(np.zeros(0, np.uint8), np.zeros(0, np.int64), np.zeros(0, np.uint8), np.zeros(0, np.int64))
        if db.root == P_INVALID:
            if db.entries or db.depth or db.leaf_pages or db.branch_pages:
                raise LmdbPageError("an empty tree whose record counts entries")
            return empty, np.zeros(0, np.uint16)
        leaves = self.leaf_pages(db)
        allowed = F_BIGDATA | (F_SUBDATA if want_flags else 0)  # (a named database's record: the main's only)
        try:
            keys, key_lens, values, value_lens, flags, big = self._leaf_columns(leaves, allowed)
        except ValueError as e:  # the kernel's message names the leaf, its page and node
            raise LmdbPageError(str(e)) from None
        if len(key_lens) != db.entries:
            raise LmdbPageError(f"{len(key_lens)} entries, the record says {db.entries}")
        values = self._with_big_values(db, values, value_lens, big)
        return Columns(keys, key_lens, values, value_lens), (flags if want_flags else None)

    def _leaf_columns(self, leaves: np.ndarray, allowed: int) -> Tuple[np.ndarray, ...]:
        """The kernel over the leaf pages ``leaves``: keys, key lengths, inline values, value
        lengths, node flags and the F_BIGDATA rows (node, position in the values, overflow
        page).  The outputs are sized by the page headers (each leaf page once, its nodes'
        headers within its node area: at most the file's size) before any node is read, and
        allocated by numpy, which gives large arrays huge pages (fresh memory faulted in 4 KiB
        at a time costs more than the copy into it); keys and values are views of the bytes
        filled."""
        nodes, room = _native.leaf_room(self.b, leaves, self.psize)
        keys, values = np.empty(room, np.uint8), np.empty(room, np.uint8)
        key_lens, value_lens, flags = np.empty(nodes, np.int64), np.empty(nodes, np.int64), np.empty(nodes, np.uint16)
        n_keys, n_values, big = _native.leaf_columns(self.b, leaves, self.psize, allowed, keys, key_lens, values,
                                                     value_lens, flags)
        big = np.frombuffer(big, "<i8").reshape(-1, 3)
        return keys[:n_keys], key_lens, values[:n_values], value_lens, flags, big

    def _with_big_values(self, db: DbRecord, inline: np.ndarray, value_lens: np.ndarray,
                         big: np.ndarray) -> np.ndarray:
        """Every value back to back: the inline ones (``inline``, from the kernel) with the
        value of each F_BIGDATA node (``big`` rows: node index, its position in ``inline``,
        its first overflow page) read from its overflow pages in its place.  The overflow
        runs are checked, and their pages counted against the record, before anything is
        allocated."""
        n_over = 0
        if len(big):
            pgnos, sizes = big[:, 2], value_lens[big[:, 0]]
            off, count = self._overflow(pgnos, sizes)
            if len(np.unique(pgnos)) != len(pgnos):
                raise LmdbPageError("an overflow page named twice")
            n_over = int(count.sum())
        if n_over != db.overflow_pages:
            raise LmdbPageError(f"{n_over} overflow pages, the record says {db.overflow_pages}")
        if not len(big):
            return inline
        pieces, prev = [], 0
        for at, start, size in zip(big[:, 1].tolist(), (off + PAGEHDRSZ).tolist(), sizes.tolist()):
            pieces += (inline[prev:at], self.b[start:start + size])
            prev = at
        pieces.append(inline[prev:])
        return np.concatenate(pieces)

    def _overflow(self, pgnos: np.ndarray, sizes: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        if len(pgnos) and (int(pgnos.max()) >= self.npages or int(pgnos.min()) < 2):
            raise LmdbPageError("an overflow page number outside the file")
        off = pgnos * self.psize
        flags = _u16(self.b, off + 10)
        count = _u16(self.b, off + 12) | (_u16(self.b, off + 14) << 16)
        if (flags != P_OVERFLOW).any() or \
                (pgnos + count > self.npages).any() or (PAGEHDRSZ + sizes > count * self.psize).any():
            raise LmdbPageError("a malformed overflow run")
        return off, count


class Packed:
    """Entries back to back in ``buf`` (bytes, or a uint8 array) with their ``lens``, indexed
    like a list of bytes (an entry's bytes are made when asked for)."""

    __slots__ = ("buf", "lens", "_starts")

    def __init__(self, buf: Any, lens: np.ndarray) -> None:
        self.buf, self.lens = buf, lens
        self._starts: Optional[np.ndarray] = None

    def __len__(self) -> int:
        return len(self.lens)

    def __getitem__(self, i: int) -> bytes:
        if self._starts is None:
            self._starts = np.cumsum(self.lens) - self.lens
        n = len(self.lens)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(i)
        a = int(self._starts[i])
        return bytes(self.buf[a:a + int(self.lens[i])])

    def __iter__(self):
        return iter(self.take(np.arange(len(self))))

    def take(self, idx: Any) -> List[bytes]:
        """The entries at positions ``idx`` (an int array), as a list of bytes."""
        if self._starts is None:
            self._starts = np.cumsum(self.lens) - self.lens
        buf = self.buf if isinstance(self.buf, bytes) else bytes(self.buf)
        return [buf[a:a + n] for a, n in zip(self._starts[idx].tolist(), self.lens[idx].tolist())]


#: the bytes of an LMDB data file's head read to check its extent (two meta pages of the largest page size)
HEAD_BYTES = 2 * 65536


def check_extent(head: bytes, file_size: int) -> None:
    """Raise LmdbPageError unless both meta pages in ``head`` (the file's first bytes) are
    LMDB's and the root pages of their main and free-list databases lie inside a file of
    ``file_size`` bytes: LMDB maps the file and reads those pages first, so a truncated file
    would end the process with SIGBUS.  (Their last-page number may lie past the end in a
    healthy file: a page a transaction allocated and freed again is never written.)"""
    if len(head) < PAGEHDRSZ + META.size + 2 * DB_RECORD.size:
        raise LmdbPageError("shorter than a meta page")
    psize = DB_RECORD.unpack_from(head, PAGEHDRSZ + META.size)[0]
    if psize < 512 or psize & (psize - 1) or len(head) < 2 * psize:
        raise LmdbPageError(f"page size {psize}")
    npages = file_size // psize
    for pg in (0, 1):
        at = pg * psize
        flags = struct.unpack_from("<H", head, at + 10)[0]
        magic, version, _addr, _size = META.unpack_from(head, at + PAGEHDRSZ)
        if not flags & P_META or magic != MDB_MAGIC or version != MDB_DATA_VERSION:
            raise LmdbPageError("not an LMDB meta page")
        for rec in (at + PAGEHDRSZ + META.size, at + PAGEHDRSZ + META.size + DB_RECORD.size):
            root = _record(head, rec).root
            if root != P_INVALID and root >= npages:
                raise LmdbPageError(f"root page {root} past the file's {npages} pages")


def packed_chunks(c: Columns, size: int, start: int = 0, stop: Optional[int] = None):
    """``(keys, values)`` as :class:`Packed` bytes of entries ``start:stop`` of ``c``, in
    chunks of at most ``size``."""
    stop = len(c) if stop is None else min(stop, len(c))
    ks, vs = c.key_starts, c.value_starts
    for a in range(start, stop, size):
        b = min(stop, a + size)
        k0, k1 = int(ks[a]), int(ks[b - 1] + c.key_lens[b - 1])
        v0, v1 = int(vs[a]), int(vs[b - 1] + c.value_lens[b - 1])
        yield Packed(c.keys[k0:k1].tobytes(), c.key_lens[a:b]), Packed(c.values[v0:v1].tobytes(), c.value_lens[a:b])


def _record(raw: bytes, at: int) -> DbRecord:
    _pad, flags, depth, branch, leaf, over, entries, root = DB_RECORD.unpack_from(raw, at)
    return DbRecord(flags, depth, branch, leaf, over, entries, root)


def read_databases(buf: Any, names: List[bytes], txnid: Optional[int] = None) -> Dict[bytes, Columns]:
    """The columns of the named databases ``names`` of the data file ``buf`` as of
    transaction ``txnid`` (see :class:`PageFile`; a missing database is absent from the
    result).  Raises LmdbPageError (the caller reads through lmdb)."""
    try:
        f = PageFile(buf, txnid)
        dbs = f.databases()
        return {n: f.columns(dbs[n]) for n in names if n in dbs}
    except IndexError as e:  # (numpy's own bounds check: never expected, the offsets are checked)
        raise LmdbPageError(f"an offset past the end of the file ({e})") from None


__all__ = ["Columns", "DbRecord", "LmdbPageError", "PageFile", "Packed", "packed_chunks", "read_databases"]
