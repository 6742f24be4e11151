"""Pure-Python implementation of the record hot path.

Same functions, arguments and results as the C extension ``_frames``; chosen when the
extension is missing or ``TQSTORE_PURE=1``.  Holds no state.
"""
from __future__ import annotations

import errno
import math
import os
import operator
from typing import Optional, Sequence

import crc32c as _crc
import numpy as np
from numpy.lib.stride_tricks import as_strided

from ._pure_args import _contig, _i64s, _uint
from ._pure_restamp import crc32c_frames, restamp_frames  # noqa: F401 - re-exported: the twins of the
# kernels over checked frames
from ._pure_lmdb import leaf_columns, leaf_room  # noqa: F401 - re-exported: the LMDB leaf kernel's twin
from .layout import (
    ALIGN,
    CODEC_MASK,
    CODEC_ZSTD,
    DTYPE_ITEMSIZE,
    FRAME_CRC,
    FRAME_DIFFERS,
    FRAME_EXTENT,
    FRAME_FLAGS,
    FRAME_GIDX,
    FRAME_HEADER,
    FRAME_INDEX_CRC,
    FRAME_MAGIC_BAD,
    FRAME_OK,
    FRAME_PADDING,
    FRAME_SIZE,
    FRAME_TORN,
    FRAME_TRUNCATED,
    FRAME_VERSION_UNKNOWN,
    HEADER_HEAD_SIZE,
    KIND_VALUE,
    KINDS,
    FRAME_END_MAGIC,
    FRAME_MAGIC,
    FRAME_VERSION,
    HEADER_HEAD,
    INDEX_KEY_HEAD,
    INDEX_VALUE,
    LOC_DTYPE,
    MAX_FIELD_BYTES,
    MAX_NDIM,
    PREFIX,
    PREFIX_SIZE,
    TRAILER,
    TRAILER_SIZE,
    frame_extent,
    payload_offset,
)

IMPLEMENTATION = "pure"


def _as_bytes(b) -> bytes:
    return b if type(b) is bytes else bytes(memoryview(b))


def _field(field) -> bytes:
    field = _as_bytes(field)
    if len(field) > MAX_FIELD_BYTES:
        raise ValueError(f"field name is {len(field)} bytes, at most {MAX_FIELD_BYTES} allowed")
    return field


def _dims(shape):
    dims = tuple(shape)
    if len(dims) > MAX_NDIM:
        raise ValueError(f"shape has {len(dims)} dimensions, at most {MAX_NDIM} allowed")
    return [_uint(d, 64, "shape dimension") for d in dims]


def _header(field: bytes, kind: int, dtype: int, gidx: int, dims) -> bytes:
    return HEADER_HEAD.pack(gidx, kind, dtype, len(dims), len(field)) + field + b"".join(
        d.to_bytes(8, "little") for d in dims
    )


def _head(header: bytes, payload_len: int, flags: int, raw_len: int) -> bytes:
    head = PREFIX.pack(FRAME_MAGIC, FRAME_VERSION, flags, len(header), payload_len, raw_len) + header
    return head + b"\0" * ((-len(head)) % ALIGN)


def crc32c(data, value: int = 0) -> int:
    """CRC32C (Castagnoli) of ``data`` continuing from ``value``."""
    return _crc.crc32c(data, value)


def build_header(field: bytes, kind: int, dtype: int, gidx: int, shape: Sequence[int]) -> bytes:
    """Header bytes of one frame (see docs/FORMAT.md).

    Raises TypeError for non-integers, OverflowError for integers out of their field's
    range (negative included), ValueError for a field over 255 bytes or over 32 dims.
    """
    field = _field(field)
    kind = _uint(kind, 8, "kind")
    dtype = _uint(dtype, 8, "dtype")
    gidx = _uint(gidx, 64, "gidx")
    return _header(field, kind, dtype, gidx, _dims(shape))


def frame_head(header: bytes, payload_len: int, flags: int, raw_len: int) -> bytes:
    """Prefix + header + zero padding up to the 64-byte-aligned payload start."""
    header = _as_bytes(header)
    if len(header) > 0xFFFF:
        raise ValueError(f"header is {len(header)} bytes, at most 65535 allowed")
    payload_len = _uint(payload_len, 64, "payload_len")
    flags = _uint(flags, 8, "flags")
    raw_len = _uint(raw_len, 64, "raw_len")
    return _head(header, payload_len, flags, raw_len)


def frame_tail(crc: int, end: int) -> bytes:
    """Trailer (crc, end magic) plus zero padding so the frame ends 64-byte aligned.

    ``end`` is the offset of the trailer from the frame start.
    """
    crc = _uint(crc, 32, "crc")
    end = operator.index(end)
    return TRAILER.pack(crc, FRAME_END_MAGIC) + b"\0" * ((-(end + TRAILER_SIZE)) % ALIGN)


def encode_frames(
    field: bytes,
    kind: int,
    dtype: int,
    gidxs: Sequence[int],
    shapes: Sequence[Sequence[int]],
    payloads: Sequence,
    flags: int,
    raw_lens: Optional[Sequence[int]],
    seg_id: int,
    base_offset: int,
):
    """Encode one frame per payload, concatenated, as they will lie from ``base_offset``.

    Returns ``(blob, items)`` where ``items`` are the unit-index ``(key, value)`` pairs
    (key: gidx big-endian + field; value: segment id, offset, frame length, crc).
    Payloads are C-contiguous buffers (BufferError otherwise); ``gidxs``, ``shapes``,
    ``payloads`` and ``raw_lens`` (unless None) must have the same length (ValueError).
    """
    field = _field(field)
    kind = _uint(kind, 8, "kind")
    dtype = _uint(dtype, 8, "dtype")
    flags = _uint(flags, 8, "flags")
    seg_id = _uint(seg_id, 32, "seg_id")
    base_offset = _uint(base_offset, 64, "base_offset")
    gidxs = tuple(gidxs)
    shapes = tuple(shapes)
    payloads = tuple(payloads)
    if raw_lens is not None:
        raw_lens = tuple(raw_lens)
    n = len(gidxs)
    if len(shapes) != n or len(payloads) != n or (raw_lens is not None and len(raw_lens) != n):
        raise ValueError("gidxs, shapes, payloads and raw_lens must have the same length")
    parts = []
    items = []
    off = base_offset
    for i in range(n):
        gidx = _uint(gidxs[i], 64, "gidx")
        dims = _dims(shapes[i])
        payload = payloads[i]
        mv = memoryview(payload)
        if not mv.c_contiguous:
            raise BufferError(f"payload {i} is not C-contiguous")
        plen = mv.nbytes
        raw = plen if raw_lens is None else _uint(raw_lens[i], 64, "raw_len")
        if off >> 64:
            raise OverflowError("frame offset exceeds 2**64")
        head = _head(_header(field, kind, dtype, gidx, dims), plen, flags, raw)
        crc = _crc.crc32c(mv, _crc.crc32c(head))
        flen = len(head) + plen + TRAILER_SIZE
        pad = (-flen) % ALIGN
        flen += pad
        if flen >> 32:
            raise OverflowError(f"frame of {flen} bytes is too long for the index")
        parts.append(head)
        parts.append(mv)
        parts.append(TRAILER.pack(crc, FRAME_END_MAGIC) + b"\0" * pad)
        items.append((INDEX_KEY_HEAD.pack(gidx) + field, INDEX_VALUE.pack(seg_id, off, flen, crc)))
        off += flen
    return b"".join(parts), items


def encode_rows(
    field: bytes,
    kind: int,
    dtype: int,
    gidxs: Sequence[int],
    shape: Sequence[int],
    data,
    row_bytes: int,
    rows: Optional[Sequence[int]],
    seg_id: int,
    base_offset: int,
):
    """:func:`encode_frames` of rows of one contiguous batch: payload ``i`` is row ``rows[i]``
    (``i`` when ``rows`` is None) of ``data``, a C-contiguous buffer of rows of ``row_bytes``
    bytes each, every frame of shape ``shape`` and raw.  The same bytes and items as
    ``encode_frames`` of those payloads.  ``rows`` must have as many entries as ``gidxs``
    (ValueError); a row outside ``data`` raises IndexError."""
    row_bytes = _uint(row_bytes, 64, "row_bytes")
    mv = memoryview(data)
    if not mv.c_contiguous:
        raise BufferError("data is not C-contiguous")
    mv = mv.cast("B")
    gidxs = tuple(gidxs)
    n = len(gidxs)
    rows = range(n) if rows is None else tuple(rows)
    if len(rows) != n:
        raise ValueError("gidxs and rows must have the same length")
    payloads = []
    for r in rows:
        r = _uint(r, 64, "row")
        if (r + 1) * row_bytes > mv.nbytes:
            raise IndexError(f"row {r} of {row_bytes} bytes lies outside the {mv.nbytes}-byte data")
        payloads.append(mv[r * row_bytes:(r + 1) * row_bytes])
    shape = tuple(shape)
    return encode_frames(field, kind, dtype, gidxs, [shape] * n, payloads, 0, None, seg_id, base_offset)


def _head_code(mv, f: int, ln: int):
    """Head checks of the frame at ``mv[f:f + ln]`` (inside ``mv``), in the order of the
    ``FRAME_*`` codes up to ``FRAME_SIZE``: ``(code, trailer offset from f)``."""
    if ln < PREFIX_SIZE:
        return FRAME_EXTENT, 0
    magic, ver, flags, hlen, plen, raw = PREFIX.unpack_from(mv, f)
    if magic != FRAME_MAGIC:
        return FRAME_MAGIC_BAD, 0
    if ver != FRAME_VERSION:
        return FRAME_VERSION_UNKNOWN, 0
    if flags & ~CODEC_MASK or (flags & CODEC_MASK) > CODEC_ZSTD:
        return FRAME_FLAGS, 0
    if hlen < HEADER_HEAD_SIZE or PREFIX_SIZE + hlen > ln:
        return FRAME_HEADER, 0
    _gidx, kind, dtype, ndim, flen = HEADER_HEAD.unpack_from(mv, f + PREFIX_SIZE)
    if HEADER_HEAD_SIZE + flen + 8 * ndim != hlen or kind not in KINDS:
        return FRAME_HEADER, 0
    h = f + PREFIX_SIZE + HEADER_HEAD_SIZE
    try:
        bytes(mv[h:h + flen]).decode("utf-8")
    except UnicodeDecodeError:
        return FRAME_HEADER, 0
    pstart = payload_offset(hlen)
    if frame_extent(pstart, plen) != ln:
        return FRAME_EXTENT, 0
    zstd = (flags & CODEC_MASK) == CODEC_ZSTD
    if not zstd and raw != plen:
        return FRAME_SIZE, 0
    if kind != KIND_VALUE:
        size = DTYPE_ITEMSIZE[dtype] if dtype < len(DTYPE_ITEMSIZE) else 0
        d = h + flen
        if not size or size * math.prod(int.from_bytes(mv[d + 8 * k:d + 8 * k + 8], "little")
                                        for k in range(ndim)) != (raw if zstd else plen):
            return FRAME_SIZE, 0
    return FRAME_OK, pstart + plen


def check_frames(buf, locs, gidxs=None, verify: bool = True, index_crc: bool = True, base: int = 0):
    """The frame-check kernel: check every frame the unit-index values ``locs`` name in ``buf``.

    ``locs`` holds ``n`` index values (``INDEX_VALUE``: segment id, offset, frame length, crc;
    the segment id is not looked at); a frame's bytes are ``buf[offset - base:][:length]``
    (``base``: the file offset of ``buf[0]``).  ``gidxs`` (``n`` little-endian u64, or None)
    are the rows the frames must belong to.  Each frame gets every check of docs/FORMAT.md
    ("Record frame") in the order of the ``FRAME_*`` codes (layout): extent inside ``buf``,
    magic, version, flags, header, exact extent, sizes (raw_len, dtype and shape against the
    payload length), gidx (with ``gidxs``), end magic, the index's CRC (with ``index_crc``),
    zero padding, then (with ``verify``) the CRC32C.  Nothing is raised for a bad frame.

    Returns ``(status, crcs, trailers)``, bytes: one ``FRAME_*`` code per frame (the first
    check it fails, or ``FRAME_OK``), the computed CRC32C of each frame and the CRC its
    trailer holds (little-endian u32 each; 0 where the checks stopped before).

    Raises ValueError / BufferError / TypeError / OverflowError for bad arguments.
    """
    verify = bool(verify)
    index_crc = bool(index_crc)
    base = _uint(base, 64, "base")
    mv = _contig(buf, "buf")
    vl = _contig(locs, "locs")
    vg = None if gidxs is None else _contig(gidxs, "gidxs")
    if vl.nbytes % INDEX_VALUE.size:
        raise ValueError(f"locs holds {vl.nbytes} bytes, not a whole number of {INDEX_VALUE.size}-byte index values")
    n = vl.nbytes // INDEX_VALUE.size
    if vg is not None and vg.nbytes != 8 * n:
        raise ValueError("gidxs must hold one 8-byte integer per index value")
    loc = np.frombuffer(vl, LOC_DTYPE)
    want = None if vg is None else bytes(vg)
    size = mv.nbytes
    status = bytearray(n)
    crcs = np.zeros(n, "<u4")
    trailers = np.zeros(n, "<u4")
    heads = {}  # head bytes but the gidx, and extent -> (code, trailer offset): frames of one shape repeat
    for i, (off, ln, icrc) in enumerate(zip(loc["offset"].tolist(), loc["length"].tolist(), loc["crc"].tolist())):
        f = off - base
        if f < 0 or ln > size or f > size - ln:
            status[i] = FRAME_TRUNCATED
            continue
        key = None
        if ln >= PREFIX_SIZE:
            hlen = mv[f + 6] | mv[f + 7] << 8
            if 8 <= hlen and PREFIX_SIZE + hlen <= ln:
                key = (bytes(mv[f:f + PREFIX_SIZE]), bytes(mv[f + PREFIX_SIZE + 8:f + PREFIX_SIZE + hlen]), ln)
        got = heads.get(key) if key is not None else None
        if got is None:
            got = _head_code(mv, f, ln)
            if key is not None:
                heads[key] = got
        code, tpos = got
        if code == FRAME_OK:
            code = _tail_code(mv, f, tpos, ln, want, i, icrc if index_crc else None, verify, crcs, trailers)
        status[i] = code
    return bytes(status), crcs.tobytes(), trailers.tobytes()


_ZEROS = bytes(ALIGN)


def _tail_code(mv, f: int, tpos: int, ln: int, want, i: int, icrc, verify: bool, crcs, trailers) -> int:
    """The checks after the head, in the order of the ``FRAME_*`` codes from ``FRAME_GIDX``."""
    if want is not None and mv[f + PREFIX_SIZE:f + PREFIX_SIZE + 8] != want[8 * i:8 * i + 8]:
        return FRAME_GIDX
    t = f + tpos
    if mv[t + 4:t + 8] != FRAME_END_MAGIC:
        return FRAME_TORN
    tcrc = trailers[i] = int.from_bytes(mv[t:t + 4], "little")
    if icrc is not None and tcrc != icrc:
        return FRAME_INDEX_CRC
    pad = ln - tpos - TRAILER_SIZE
    if pad and mv[t + TRAILER_SIZE:f + ln] != _ZEROS[:pad]:
        return FRAME_PADDING
    if verify:
        c = crcs[i] = _crc.crc32c(mv[f:t])
        if c != tcrc:
            return FRAME_CRC
    return FRAME_OK


def gather_frames(buf, locs, gidxs, template, payload_start: int, payload_len: int, out, rows, verify: bool = True):
    """Check frames that share one head template and copy their payloads into rows of ``out``.

    ``locs`` holds ``n`` unit-index values (``INDEX_VALUE``: segment id, offset, frame length,
    crc; the segment id is not looked at), offsets relative to ``buf``; ``gidxs`` ``n``
    little-endian u64 (each frame's row), ``rows`` ``n`` little-endian i64 (the row of ``out``,
    a writable buffer of ``payload_len``-byte rows, each payload goes to).  ``template`` is
    ``(prefix, rest)``: every frame's bytes before its payload must be ``prefix + gidx + rest``
    (``prefix`` is the 24-byte frame prefix, ``payload_start`` their total length).

    Every frame is checked in order: index length equal to the template's frame length, extent
    inside ``buf``, head equal to the template, gidx, end magic, trailer CRC equal to the
    index's, zero padding, then (when ``verify``) the CRC32C itself.  Returns ``(code, index,
    expected, actual)`` for the first frame and check that fails (see ``FRAME_*``), or
    ``(0, -1, 0, 0)``; payloads of frames before a failing one may have been copied.

    Raises ValueError / BufferError / TypeError / IndexError / OverflowError for bad arguments
    (before any frame is looked at).
    """
    template = tuple(template) if not isinstance(template, tuple) else template
    if len(template) != 2:
        raise ValueError("template must be a (prefix, rest) pair")
    pre, rest = _as_bytes(template[0]), _as_bytes(template[1])
    pstart = _uint(payload_start, 64, "payload_start")
    plen = _uint(payload_len, 64, "payload_len")
    verify = bool(verify)
    if len(pre) != PREFIX_SIZE or len(pre) + 8 + len(rest) != pstart:
        raise ValueError("template does not match payload_start")
    if plen > 1 << 62:
        raise OverflowError("payload_len too large")
    vb = _contig(buf, "buf")
    vl = _contig(locs, "locs")
    vg = _contig(gidxs, "gidxs")
    vo = _contig(out, "out", writable=True)
    vr = _contig(rows, "rows")
    if vl.nbytes % INDEX_VALUE.size:
        raise ValueError(f"locs holds {vl.nbytes} bytes, not a whole number of {INDEX_VALUE.size}-byte index values")
    n = vl.nbytes // INDEX_VALUE.size
    if vg.nbytes != 8 * n or vr.nbytes != 8 * n:
        raise ValueError("gidxs and rows must hold one 8-byte integer per index value")
    loc = np.frombuffer(vl, LOC_DTYPE)
    want = np.frombuffer(vg, "<u8")
    dest = np.frombuffer(vr, "<i8")
    if plen:
        if vo.nbytes % plen:
            raise ValueError("out is not a whole number of payload_len rows")
        if n and (dest.min() < 0 or dest.max() >= vo.nbytes // plen):
            raise IndexError("row index out of range of out")
    if not n:
        return (FRAME_OK, -1, 0, 0)
    seg = np.frombuffer(vb, np.uint8)
    size = seg.size
    tpos = pstart + plen
    flen = frame_extent(pstart, plen)
    offs = loc["offset"]
    code = np.zeros(n, np.int8)
    expected = np.zeros(n, np.uint64)
    actual = np.zeros(n, np.uint64)
    fits = (offs <= size - flen) if flen <= size else np.zeros(n, bool)
    code[~fits] = FRAME_TRUNCATED
    code[loc["length"] != flen] = FRAME_DIFFERS
    ok = np.flatnonzero(code == 0)
    if ok.size:
        at = offs[ok].astype(np.int64)[:, None]
        heads = seg[at + np.arange(pstart)]
        tails = seg[at + (tpos + np.arange(flen - tpos))]
        got = np.ascontiguousarray(heads[:, PREFIX_SIZE:PREFIX_SIZE + 8]).view("<u8").ravel()
        tcrc = np.ascontiguousarray(tails[:, :4]).view("<u4").ravel()
        icrc = loc["crc"][ok]
        c = np.zeros(ok.size, np.int8)
        e = np.zeros(ok.size, np.uint64)
        a = np.zeros(ok.size, np.uint64)

        def mark(m, what, exp=0, act=0):  # later (earlier-checked) marks win
            c[m] = what
            e[m] = exp[m] if isinstance(exp, np.ndarray) else exp
            a[m] = act[m] if isinstance(act, np.ndarray) else act

        if verify:
            calc = np.array([_crc.crc32c(vb[o:o + tpos]) for o in offs[ok].tolist()], dtype=np.uint32)
            mark(calc != tcrc, FRAME_CRC, tcrc, calc)
        mark(tails[:, TRAILER_SIZE:].any(axis=1), FRAME_PADDING)
        mark(tcrc != icrc, FRAME_INDEX_CRC, icrc, tcrc)
        mark((tails[:, 4:8] != np.frombuffer(FRAME_END_MAGIC, np.uint8)).any(axis=1), FRAME_TORN)
        mark(got != want[ok], FRAME_GIDX, want[ok], got)
        mark((heads[:, :PREFIX_SIZE] != np.frombuffer(pre, np.uint8)).any(axis=1)
             | (heads[:, PREFIX_SIZE + 8:] != np.frombuffer(rest, np.uint8)).any(axis=1), FRAME_DIFFERS)
        code[ok], expected[ok], actual[ok] = c, e, a
    bad = np.flatnonzero(code)
    if bad.size:
        i = int(bad[0])
        if plen:  # as the native pass, which copies frame by frame up to the first bad one
            _copy_runs(seg, offs[:i], dest[:i], pstart, plen, flen, vo)
        return (int(code[i]), i, int(expected[i]), int(actual[i]))
    if plen:
        _copy_runs(seg, offs, dest, pstart, plen, flen, vo)
    return (FRAME_OK, -1, 0, 0)


def _copy_runs(seg, offs, dest, pstart: int, plen: int, flen: int, vo) -> None:
    """Copy the payloads of frames at ``offs`` into rows ``dest`` of ``vo``, one strided copy
    per run of frames lying back to back."""
    if not offs.size:
        return
    dst = np.frombuffer(vo, np.uint8).reshape(-1, plen)
    order = np.argsort(offs, kind="stable")
    so = offs[order]
    cuts = np.flatnonzero(np.diff(so) != flen) + 1
    for a, b in zip([0, *cuts.tolist()], [*cuts.tolist(), so.size]):
        src = as_strided(seg[int(so[a]) + pstart:], shape=(b - a, plen), strides=(flen, 1), writeable=False)
        dst[dest[order[a:b]]] = src


def _src_ranges(src, offsets, lengths):
    """``(src as a byte view, offsets, lengths)`` with every range checked to lie inside
    ``src`` (ValueError naming the first that does not, or unequal lengths)."""
    s = _contig(src, "src")
    offs, lens = _i64s(offsets, "offsets"), _i64s(lengths, "lengths")
    if len(offs) != len(lens):
        raise ValueError("offsets and lengths must have the same length")
    size = s.nbytes
    for i, (o, n) in enumerate(zip(offs, lens)):
        if o < 0 or n < 0 or o > size or n > size - o:
            raise ValueError(f"range {i} ([{o}, +{n})) is not inside src ({size} bytes)")
    return s, offs, lens


def copy_ranges(src, offsets, lengths, dst) -> int:
    """Copy the byte ranges ``offsets[i], lengths[i]`` (little-endian i64) of ``src`` back to
    back into the writable ``dst``; returns the bytes copied.  Raises ValueError for a range
    outside ``src`` or more bytes than ``dst`` holds (before copying anything)."""
    s, offs, lens = _src_ranges(src, offsets, lengths)
    d = _contig(dst, "dst", writable=True)
    total = sum(lens)
    if total > d.nbytes:
        raise ValueError(f"dst holds {d.nbytes} bytes, the ranges {total}")
    pos = 0
    for o, n in zip(offs, lens):
        d[pos:pos + n] = s[o:o + n]
        pos += n
    return total


def pwrite_ranges(fd, src, offsets, lengths, pos, writeback) -> int:
    """Write the byte ranges ``offsets[i], lengths[i]`` (little-endian i64) of ``src`` back to
    back into the open file ``fd`` from its offset ``pos`` (vectored writes of up to 1024
    ranges, repeated on a short write); ``writeback`` > 0 starts the writeback of every that
    many bytes written (``posix_fadvise(DONTNEED)``, a hint; its errors are ignored).  Returns
    the bytes written.  Raises ValueError (before writing) for a range outside ``src`` or a
    negative ``pos``, OSError for a failed write."""
    fd = fd if isinstance(fd, int) else fd.fileno()
    pos, writeback = operator.index(pos), operator.index(writeback)
    if pos < 0:
        raise ValueError("pos must not be negative")
    s, offs, lens = _src_ranges(src, offsets, lengths)
    views = [s[o:o + n] for o, n in zip(offs, lens) if n]
    try:
        return _pwritev_views(fd, views, pos, writeback)
    finally:  # (an error's traceback must not pin ``src``: a mapping with views cannot close)
        for v in views:
            v.release()


def _pwritev_views(fd: int, views: list, pos: int, writeback: int) -> int:
    start = mark = pos
    i = 0
    while i < len(views):
        w = os.pwritev(fd, views[i:i + 1024], pos)
        if w == 0:
            raise OSError(errno.EIO, "pwritev wrote nothing")
        pos += w
        while w and i < len(views):
            if w >= views[i].nbytes:
                w -= views[i].nbytes
                i += 1
            else:
                views[i] = views[i][w:]
                w = 0
        if writeback > 0 and pos - mark >= writeback:
            try:
                os.posix_fadvise(fd, mark, pos - mark, os.POSIX_FADV_DONTNEED)
            except OSError:
                pass
            mark = pos
    return pos - start


def pread_ranges(fd, offsets, lengths, dst) -> int:
    """Read the byte ranges ``offsets[i], lengths[i]`` (little-endian i64) of the open file
    ``fd`` back to back into the writable ``dst`` (one ``preadv`` per range, repeated on a
    short read); returns the bytes read, fewer than the ranges hold only when the file ends
    first.  Reads only.  Raises ValueError (before reading) for a negative range or more
    bytes than ``dst`` holds, OSError for a failed read."""
    fd = fd if isinstance(fd, int) else fd.fileno()
    offs, lens = _i64s(offsets, "offsets"), _i64s(lengths, "lengths")
    d = _contig(dst, "dst", writable=True)
    if len(offs) != len(lens):
        raise ValueError("offsets and lengths must have the same length")
    total = 0
    for i, (o, n) in enumerate(zip(offs, lens)):
        if o < 0 or n < 0 or n > d.nbytes - total:
            raise ValueError(f"range {i} ([{o}, +{n})) is negative or past dst ({d.nbytes} bytes)")
        total += n
    pos = 0
    for o, n in zip(offs, lens):
        end = pos + n
        while pos < end:
            got = os.preadv(fd, [d[pos:end]], o)
            if not got:
                return pos
            pos += got
            o += got
    return pos



def place_keys(buf, lens, prefix, slots, out: list):
    """Entries of ``buf`` back to back (i64 ``lens``), each ``prefix`` followed by UTF-8 without
    NUL, decoded into ``out[slots[i]]`` (None before): ``(status, i)`` as the native kernel."""
    mv = _contig(buf, "buf")
    pre = bytes(_contig(prefix, "prefix"))
    ln, sl = _i64s(lens, "lens"), _i64s(slots, "slots")
    if not isinstance(out, list):
        raise TypeError("out must be a list")
    if len(ln) != len(sl):
        raise ValueError("lens and slots must have the same length")
    pos, size, plen = 0, mv.nbytes, len(pre)
    for i, (m, s) in enumerate(zip(ln, sl)):
        if m < 0 or m > size - pos:
            raise ValueError(f"entry {i} runs past buf ({size} bytes)")
        e = mv[pos:pos + m].tobytes()
        pos += m
        if m < plen or e[:plen] != pre:
            return 1, i
        k = e[plen:]
        if b"\0" in k:
            return 2, i
        if not 0 <= s < len(out) or out[s] is not None:
            return 3, i
        try:
            out[s] = k.decode("utf-8")
        except UnicodeDecodeError:
            return 4, i
    return 0, len(ln)
