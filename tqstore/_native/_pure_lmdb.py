"""Pure-Python twin of the native LMDB leaf kernel (``leaf_room``, ``leaf_columns`` of
:mod:`tqstore._native._frames`): the leaf level of an LMDB B+tree read as columns with numpy,
the same checks, failure codes and messages as the C kernel.  Re-exported by
:mod:`tqstore._native._pure`, which is the pure build's whole surface; its byte readers
(``_le16``, ``_le64_even``, ``_le64_any``) are shared with :mod:`tqstore._format.lmdb_pages`.
"""
from __future__ import annotations

from typing import Optional, Tuple

import numpy as np

from ._pure_args import _contig, _uint

# ---- leaf_columns: the leaf level of an LMDB B+tree -----------------------------------
# (LMDB 0.9, 64-bit; the page and node layout is in tqstore/_format/lmdb_pages.py, whose
# branch levels lead here.)

_MDB_PAGEHDRSZ = 16
_MDB_NODESZ = 8
_MDB_P_LEAF = 0x02
_MDB_F_BIGDATA = 0x01
# The failures, in the order each page is checked (as the C kernel's LEAF_* codes).
(_LEAF_OK, _LEAF_OUTSIDE, _LEAF_TWICE, _LEAF_KIND, _LEAF_NUMBER, _LEAF_AREA, _LEAF_NODE_OFFSET,
 _LEAF_NODE_FLAGS, _LEAF_NODE_END, _LEAF_NODES_SIZE) = range(10)
_LEAF_WHAT = (
    "",
    "a page number outside the file",
    "a page named twice in the tree",
    "a page of another kind than the tree's level",
    "a page that is not the page its number names",
    "a page's node area is malformed",
    "a node offset outside its page",
    "a node of unexpected flags",
    "a node past the end of its page",
    "nodes of more bytes than the page's node area",
)
_GATHER = 1 << 20  # bytes gathered at a time (bounds the index arrays)


def _le16(b: np.ndarray, at: np.ndarray) -> np.ndarray:
    """The little-endian u16 at each even offset ``at`` of ``b``, as int64."""
    b16 = (b[:-1] if len(b) % 2 else b).view("<u2")
    return b16[at >> 1].astype(np.int64)


def _le64_even(b: np.ndarray, at: np.ndarray) -> np.ndarray:
    """The 8 bytes at each even offset ``at`` of ``b`` (each ``at + 8 <= len(b)``), as
    little-endian uint64: one gather per residue of ``at`` modulo 8, from ``b`` viewed as
    words starting there."""
    out = np.empty(len(at), dtype=np.uint64)
    res = at & 7
    for r in (0, 2, 4, 6):
        sel = np.flatnonzero(res == r)
        if len(sel):
            words = b[r:r + (len(b) - r) // 8 * 8].view("<u8")
            out[sel] = words[(at[sel] - r) >> 3]
    return out


def _le64_any(b: np.ndarray, at: np.ndarray) -> np.ndarray:
    """The little-endian u64 at each offset ``at`` of ``b`` (any alignment), as uint64."""
    out = np.zeros(len(at), dtype=np.uint64)
    for j in range(7, -1, -1):
        out <<= np.uint64(8)
        out |= b[at + j].astype(np.uint64)
    return out


def _gather(b: np.ndarray, starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """``b[starts[i]:starts[i] + lens[i]]`` of every ``i`` (each inside ``b``), back to back."""
    total = int(lens.sum())
    out = np.empty(total, dtype=np.uint8)
    if not total:
        return out
    width = int(lens.max())
    if width <= 64:  # short (keys, small records): a 2-D gather of the widest, the rest masked off
        same = bool((lens == width).all())
        step = max(1, _GATHER // width)
        cols = np.arange(width)
        pos = 0
        for a in range(0, len(starts), step):
            s, ln = starts[a:a + step], lens[a:a + step]
            idx = s[:, None] + cols
            if not same:  # (bytes past a shorter entry are dropped: never past the buffer)
                np.minimum(idx, len(b) - 1, out=idx)
            rows = b[idx]
            m = rows.reshape(-1) if same else rows[cols < ln[:, None]]
            out[pos:pos + len(m)] = m
            pos += len(m)
        return out
    ends = np.cumsum(lens)
    pos = 0
    i = 0
    while i < len(starts):  # chunks of about _GATHER bytes
        j = int(np.searchsorted(ends, (ends[i - 1] if i else 0) + _GATHER, side="right"))
        j = max(j, i + 1)
        s, ln = starts[i:j], lens[i:j]
        m = int(ln.sum())
        rel = np.arange(m) - np.repeat(np.cumsum(ln) - ln, ln)
        out[pos:pos + m] = b[np.repeat(s, ln) + rel]
        pos += m
        i = j
    return out


def _leaf_headers(b: np.ndarray, pg: np.ndarray, psize: int) -> np.ndarray:
    """The ``_LEAF_*`` code of each page's header checks (the first that fails, else 0): in
    range, not named before, a leaf, its own number, a sane node area (holding its nodes'
    8-byte headers at least)."""
    npages = len(b) // psize
    code = np.where((pg < 2) | (pg >= npages), _LEAF_OUTSIDE, _LEAF_OK).astype(np.int8)
    inside = np.flatnonzero(code == _LEAF_OK)
    order = inside[np.argsort(pg[inside], kind="stable")]  # equal numbers in index order
    code[order[1:][pg[order[1:]] == pg[order[:-1]]]] = _LEAF_TWICE
    ok = np.flatnonzero(code == _LEAF_OK)
    off = pg[ok] * psize
    lower, upper = _le16(b, off + 12), _le16(b, off + 14)
    checks = (  # the last assignment wins: the earliest check in order
        ((lower < _MDB_PAGEHDRSZ) | (lower & 1 != 0) | (upper > psize) | (lower > upper)
         | ((lower - _MDB_PAGEHDRSZ) // 2 * _MDB_NODESZ > psize - upper), _LEAF_AREA),
        (_le64_even(b, off) != pg[ok].astype(np.uint64), _LEAF_NUMBER),
        (_le16(b, off + 10) != _MDB_P_LEAF, _LEAF_KIND),  # exactly (LMDB refuses a leaf with P_DIRTY too)
    )
    sub = np.zeros(len(ok), np.int8)
    for bad, c in checks:
        sub[bad] = c
    code[ok] = sub
    return code


def _leaf_nodes(b: np.ndarray, off: np.ndarray, psize: int, allowed: int) -> dict:
    """Every node of the pages at ``off`` (headers checked), in order: its page, index in the
    page, offset, sizes and flags, and the ``_LEAF_*`` code of its checks (offset, flags,
    extent); ``span`` is its bytes (0 when it fails).  Per page: ``n`` nodes, ``upper``."""
    lower, upper = _le16(b, off + 12), _le16(b, off + 14)
    n = (lower - _MDB_PAGEHDRSZ) >> 1
    page = np.repeat(np.arange(len(off)), n)
    k = np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)
    at = _le16(b, off[page] + _MDB_PAGEHDRSZ + 2 * k)
    bad_at = (at < _MDB_PAGEHDRSZ) | (at + _MDB_NODESZ > psize) | (at & 1 != 0)
    at = np.where(bad_at, _MDB_PAGEHDRSZ, at)  # (a node header read where it cannot be past the page)
    head = _le64_even(b, off[page] + at)  # lo u16, hi u16, flags u16, key size u16
    dsize = (head & np.uint64(0xFFFFFFFF)).astype(np.int64)
    flags = ((head >> np.uint64(32)) & np.uint64(0xFFFF)).astype(np.int64)
    ksize = (head >> np.uint64(48)).astype(np.int64)
    big = (flags & _MDB_F_BIGDATA) != 0
    span = _MDB_NODESZ + ksize + np.where(big, 8, dsize)
    code = np.zeros(len(at), np.int8)
    code[span > psize - at] = _LEAF_NODE_END
    code[(flags & ~allowed) != 0] = _LEAF_NODE_FLAGS
    code[bad_at] = _LEAF_NODE_OFFSET
    span[code != 0] = 0
    return dict(page=page, k=k, at=at, dsize=dsize, flags=flags, ksize=ksize, big=big, span=span, code=code,
                n=n, upper=upper)


def _leaf_failure(nodes: dict, psize: int) -> Optional[Tuple[int, int, int]]:
    """The first failure among the nodes, in page order (a page's nodes in order, then their
    bytes against its node area): (page, node or -1, code), or None."""
    first = None
    bad = np.flatnonzero(nodes["code"])
    if len(bad):
        i = int(bad[0])
        first = (int(nodes["page"][i]), int(nodes["k"][i]), int(nodes["code"][i]))
    ends = np.cumsum(nodes["n"])
    cs = np.concatenate(([0], np.cumsum(nodes["span"])))
    over = np.flatnonzero(cs[ends] - cs[ends - nodes["n"]] > psize - nodes["upper"])
    if len(over) and (first is None or int(over[0]) < first[0]):  # (on one page, a bad node first)
        first = (int(over[0]), -1, _LEAF_NODES_SIZE)
    return first


def _leaf_error(pg: np.ndarray, where: Tuple[int, int, int]) -> ValueError:
    i, k, code = where
    node = f" node {k}" if k >= 0 else ""
    return ValueError(f"leaf {i} (page {int(pg[i])}){node}: {_LEAF_WHAT[code]}")


def _leaf_begin(buf, pgnos, page_size):
    """The (buf, pgnos, page_size) arguments: (bytes as uint8, page numbers as int64, page size)."""
    b = np.frombuffer(_contig(buf, "buf"), np.uint8)
    vp = _contig(pgnos, "pgnos")
    if vp.nbytes % 8:
        raise ValueError("pgnos must hold 8-byte integers")
    pg = np.frombuffer(vp, "<i8").astype(np.int64) if vp.nbytes else np.zeros(0, np.int64)
    psize = _uint(page_size, 64, "page_size")
    if not 512 <= psize <= 1 << 31 or psize & (psize - 1):
        raise ValueError(f"page_size must be a power of two in [512, 2**31], got {psize}")
    return b, pg, psize


def _leaf_room(b: np.ndarray, pg: np.ndarray, psize: int) -> Tuple[int, int]:
    """The headers' checks (the first failure raises), then (nodes, room)."""
    head = _leaf_headers(b, pg, psize)
    bad = np.flatnonzero(head)
    if len(bad):
        raise _leaf_error(pg, (int(bad[0]), -1, int(head[bad[0]])))
    off = pg * psize
    n = (_le16(b, off + 12) - _MDB_PAGEHDRSZ) >> 1
    return int(n.sum()), int((psize - _le16(b, off + 14) - _MDB_NODESZ * n).sum())


def leaf_room(buf, pgnos, page_size: int) -> Tuple[int, int]:
    """``(nodes, room)`` of an LMDB database's leaf pages (``buf``, ``pgnos``, ``page_size`` as
    for :func:`leaf_columns`, which checks their headers the same way, raising the same
    ValueError): the number of their nodes, and a bound on the bytes of their keys (and on
    those of their inline values): their node areas (``page size - upper``) less the nodes'
    8-byte headers.  The sizes of :func:`leaf_columns`' outputs: at most ``len(buf) / 10``
    nodes, a room of at most ``len(buf)``."""
    return _leaf_room(*_leaf_begin(buf, pgnos, page_size))


def leaf_columns(buf, pgnos, page_size: int, allowed_flags: int, keys, key_lens, values, value_lens, flags):
    """The entries of an LMDB database's leaf pages into the caller's outputs: ``pgnos``
    (little-endian i64) are their numbers in tree order, ``buf`` the data file, ``page_size``
    its page size (a power of two in [512, 2**31]), ``allowed_flags`` the node flags an entry
    may have (F_BIGDATA 0x01, F_SUBDATA 0x02, ...).

    First every page's header is checked, in order: its number inside the file and not named
    before, its flags exactly P_LEAF (0x02), its first 8 bytes its own number, 16 <= lower
    (even) <= upper <= page size and a node area (``page size - upper``) of at least 8 bytes
    per node (``(lower - 16) / 2`` of them).  Then the outputs against :func:`leaf_room`'s ``(nodes,
    room)``, in argument order: ``keys`` and ``values`` at least ``room`` bytes, ``key_lens``
    and ``value_lens`` at least ``8 * nodes``, ``flags`` at least ``2 * nodes`` (writable
    buffers).  Then each page's ``(lower - 16) / 2`` nodes, in order: the offset even, >= 16
    and 8 bytes inside the page, the flags within ``allowed_flags``, the key and the inline
    data (for F_BIGDATA the 8-byte overflow page number) inside the page; then the page's
    nodes together at most its node area (``page size - upper``: LMDB lays them side by side
    there).  The first failure raises ValueError (a page's or node's names the leaf's index,
    its page and the node); the outputs may then be partly written.

    Fills ``keys`` (the keys back to back), ``key_lens`` (each node's key size, i64),
    ``values`` (the inline values back to back: an F_BIGDATA node's value is not there),
    ``value_lens`` (each node's data size, i64, F_BIGDATA's included) and ``flags`` (each
    node's, u16); bytes past the filled ones may be overwritten.  Returns ``(key bytes,
    value bytes, big)``: ``big`` holds per F_BIGDATA node (node index, position in ``values``
    where its value belongs, its first overflow page (the u64 as read)) as three
    little-endian i64.  Raises ValueError, BufferError, TypeError or OverflowError for bad
    arguments.
    """
    b, pg, psize = _leaf_begin(buf, pgnos, page_size)
    allowed = _uint(allowed_flags, 16, "allowed_flags")
    outs = [_contig(o, name, writable=True) for o, name in
            ((keys, "keys"), (key_lens, "key_lens"), (values, "values"), (value_lens, "value_lens"), (flags, "flags"))]
    nodes, room = _leaf_room(b, pg, psize)
    for mv, name, need in zip(outs, ("keys", "key_lens", "values", "value_lens", "flags"),
                              (room, 8 * nodes, room, 8 * nodes, 2 * nodes)):
        if mv.nbytes < need:
            raise ValueError(f"{name} holds {mv.nbytes} bytes, the pages need {need}")
    found = _leaf_nodes(b, pg * psize, psize, allowed)
    where = _leaf_failure(found, psize)
    if where is not None:
        raise _leaf_error(pg, where)
    return _leaf_fill(b, pg * psize, found, [np.frombuffer(mv, np.uint8) for mv in outs])


def _leaf_fill(b: np.ndarray, off: np.ndarray, nodes: dict, outs: list):
    """:func:`leaf_columns`' outputs (uint8 views of the caller's) filled from the checked
    nodes; its result."""
    keys, key_lens, values, value_lens, flags = outs
    key_start = off[nodes["page"]] + nodes["at"] + _MDB_NODESZ
    ksize, dsize, big = nodes["ksize"], nodes["dsize"], nodes["big"]
    inline = np.where(big, 0, dsize)
    data_start = key_start + ksize
    n = len(ksize)
    k = _gather(b, key_start, ksize)
    v = _gather(b, data_start, inline)
    keys[:len(k)] = k
    values[:len(v)] = v
    key_lens[:8 * n] = ksize.astype("<i8").view(np.uint8)
    value_lens[:8 * n] = dsize.astype("<i8").view(np.uint8)
    flags[:2 * n] = nodes["flags"].astype("<u2").view(np.uint8)
    bigs = np.flatnonzero(big)
    rows = np.empty((len(bigs), 3), "<i8")
    rows[:, 0] = bigs
    rows[:, 1] = (np.cumsum(inline) - inline)[bigs]
    rows[:, 2] = _le64_any(b, data_start[bigs]).view(np.int64)
    return len(k), len(v), rows.tobytes()
