"""Pure-Python implementation of the record hot path.

Same functions, arguments and results as the C extension ``_frames``; chosen when the
extension is missing or ``TQSTORE_PURE=1``.  Holds no state.
"""
from __future__ import annotations

import math
import os
import operator
from typing import Optional, Sequence, Tuple

import crc32c as _crc
import numpy as np
from numpy.lib.stride_tricks import as_strided

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


def _uint(v, bits: int, what: str) -> int:
    """``operator.index(v)`` checked to fit an unsigned field of ``bits`` bits."""
    v = operator.index(v)
    if v < 0 or v >> bits:
        raise OverflowError(f"{what} must be in [0, 2**{bits}), got {v}")
    return v


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


def _contig(o, what: str, writable: bool = False) -> memoryview:
    mv = memoryview(o)
    if not mv.c_contiguous:
        raise BufferError(f"{what} is not C-contiguous")
    if writable and mv.readonly:
        raise TypeError(f"{what} must be a writable buffer")
    if not mv.nbytes:
        return memoryview(bytearray())
    return mv.cast("B") if mv.ndim != 1 or mv.format != "B" else mv


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


def _i64s(o, what: str) -> list:
    mv = _contig(o, what)
    if mv.nbytes % 8:
        raise ValueError(f"{what} must hold 8-byte integers")
    return np.frombuffer(mv, "<i8").tolist() if mv.nbytes else []


def copy_ranges(src, offsets, lengths, dst) -> int:
    """Copy the byte ranges ``offsets[i], lengths[i]`` (little-endian i64) of ``src`` back to
    back into the writable ``dst``; returns the bytes copied.  Raises ValueError for a range
    outside ``src`` or more bytes than ``dst`` holds (before copying anything)."""
    s = _contig(src, "src")
    offs, lens = _i64s(offsets, "offsets"), _i64s(lengths, "lengths")
    d = _contig(dst, "dst", writable=True)
    if len(offs) != len(lens):
        raise ValueError("offsets and lengths must have the same length")
    size = s.nbytes
    for i, (o, n) in enumerate(zip(offs, lens)):
        if o < 0 or n < 0 or o > size or n > size - o:
            raise ValueError(f"range {i} ([{o}, +{n})) is not inside src ({size} bytes)")
    total = sum(lens)
    if total > d.nbytes:
        raise ValueError(f"dst holds {d.nbytes} bytes, the ranges {total}")
    pos = 0
    for o, n in zip(offs, lens):
        d[pos:pos + n] = s[o:o + n]
        pos += n
    return total


def restamp_frames(buf, offsets, lengths, gidxs) -> bytes:
    """Give the frames at ``offsets``/``lengths`` of the writable ``buf`` the global indexes
    ``gidxs`` (u64) in their headers (bytes 24-31) and update their trailers' CRC32C for the
    change: the old trailer CRC xor the CRC32C of the old and of the new covered bytes (CRC32C
    is affine), so a frame whose old CRC did not match keeps not matching.  Returns the new
    CRCs (u32 each, little-endian).  Raises ValueError (before changing anything) for a frame
    outside ``buf`` or whose lengths do not fit its extent."""
    b = _contig(buf, "buf", writable=True)
    offs, lens = _i64s(offsets, "offsets"), _i64s(lengths, "lengths")
    gs = [g & ((1 << 64) - 1) for g in _i64s(gidxs, "gidxs")]
    if not len(offs) == len(lens) == len(gs):
        raise ValueError("offsets, lengths and gidxs must have the same length")
    size = b.nbytes
    covers = []
    for i, (o, n) in enumerate(zip(offs, lens)):
        if o < 0 or n < 0 or o > size or n > size - o or n < PREFIX_SIZE + HEADER_HEAD_SIZE + TRAILER_SIZE:
            raise ValueError(f"frame {i} ([{o}, +{n})) is not inside buf ({size} bytes)")
        hlen = int.from_bytes(b[o + 6:o + 8], "little")
        plen = int.from_bytes(b[o + 8:o + 16], "little")
        cover = payload_offset(hlen) + plen
        if hlen < HEADER_HEAD_SIZE or plen > n or cover + TRAILER_SIZE > n:
            raise ValueError(f"frame {i}: its lengths do not fit its extent (not a checked frame)")
        covers.append(cover)
    out = []
    for o, cover, g in zip(offs, covers, gs):
        old = bytes(b[o:o + cover])
        crc = int.from_bytes(b[o + cover:o + cover + 4], "little")
        new = g.to_bytes(8, "little")
        if old[PREFIX_SIZE:PREFIX_SIZE + 8] != new:
            crc ^= _crc.crc32c(old) ^ _crc.crc32c(old[:PREFIX_SIZE] + new + old[PREFIX_SIZE + 8:])
            b[o + PREFIX_SIZE:o + PREFIX_SIZE + 8] = new
            b[o + cover:o + cover + 4] = crc.to_bytes(4, "little")
        out.append(crc.to_bytes(4, "little"))
    return b"".join(out)


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
