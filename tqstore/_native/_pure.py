"""Pure-Python implementation of the record hot path.

Same functions, arguments and results as the C extension ``_frames``; chosen when the
extension is missing or ``TQSTORE_PURE=1``.  Holds no state.
"""
from __future__ import annotations

import operator
from typing import Optional, Sequence

import crc32c as _crc
import numpy as np
from numpy.lib.stride_tricks import as_strided

from .layout import (
    ALIGN,
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


def verify_frames(buf, offsets: Sequence[int], lengths: Sequence[int]):
    """Check frames inside ``buf`` and locate their payloads.

    For each (offset, length) returns ``(status, payload_offset, payload_len, crc_expected,
    crc_actual)`` where status 0 means intact, 1 bad magic/version/lengths, 2 CRC mismatch.
    Offsets are relative to ``buf``.
    """
    mv = memoryview(buf).cast("B")
    size = mv.nbytes
    out = []
    for off, length in zip(offsets, lengths):
        off = operator.index(off)
        length = operator.index(length)
        if off < 0 or length < PREFIX_SIZE + TRAILER_SIZE or off + length > size:
            out.append((1, 0, 0, 0, 0))
            continue
        magic, ver, flags, hlen, plen, _raw = PREFIX.unpack_from(mv, off)
        pstart = payload_offset(hlen)
        end = pstart + plen
        if magic != FRAME_MAGIC or ver != FRAME_VERSION or end + TRAILER_SIZE > length:
            out.append((1, 0, 0, 0, 0))
            continue
        crc_exp, emagic = TRAILER.unpack_from(mv, off + end)
        if emagic != FRAME_END_MAGIC:
            out.append((1, 0, 0, 0, 0))
            continue
        crc_act = _crc.crc32c(mv[off : off + end])
        out.append((0 if crc_act == crc_exp else 2, off + pstart, plen, crc_exp, crc_act))
    return out


# gather_frames result codes: the first frame (in the order given) that fails a check, and
# the first check it fails, in this order.
GATHER_OK = 0
GATHER_DIFFERS = 1  # index length or head bytes differ from the template (another shape)
GATHER_TRUNCATED = 2  # the frame extends past the buffer
GATHER_GIDX = 3  # the frame's gidx is not the row's (expected, actual: gidxs)
GATHER_TORN = 4  # no end magic
GATHER_INDEX_CRC = 5  # the trailer's CRC is not the index's (expected: index, actual: trailer)
GATHER_PADDING = 6  # padding after the trailer is not zero
GATHER_CRC = 7  # CRC32C of prefix + header + payload differs (expected: trailer, actual: computed)


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
    expected, actual)`` for the first frame and check that fails (see ``GATHER_*``), or
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
        return (GATHER_OK, -1, 0, 0)
    seg = np.frombuffer(vb, np.uint8)
    size = seg.size
    tpos = pstart + plen
    flen = frame_extent(pstart, plen)
    offs = loc["offset"]
    code = np.zeros(n, np.int8)
    expected = np.zeros(n, np.uint64)
    actual = np.zeros(n, np.uint64)
    fits = (offs <= size - flen) if flen <= size else np.zeros(n, bool)
    code[~fits] = GATHER_TRUNCATED
    code[loc["length"] != flen] = GATHER_DIFFERS
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
            mark(calc != tcrc, GATHER_CRC, tcrc, calc)
        mark(tails[:, TRAILER_SIZE:].any(axis=1), GATHER_PADDING)
        mark(tcrc != icrc, GATHER_INDEX_CRC, icrc, tcrc)
        mark((tails[:, 4:8] != np.frombuffer(FRAME_END_MAGIC, np.uint8)).any(axis=1), GATHER_TORN)
        mark(got != want[ok], GATHER_GIDX, want[ok], got)
        mark((heads[:, :PREFIX_SIZE] != np.frombuffer(pre, np.uint8)).any(axis=1)
             | (heads[:, PREFIX_SIZE + 8:] != np.frombuffer(rest, np.uint8)).any(axis=1), GATHER_DIFFERS)
        code[ok], expected[ok], actual[ok] = c, e, a
    bad = np.flatnonzero(code)
    if bad.size:
        i = int(bad[0])
        if plen:  # as the native pass, which copies frame by frame up to the first bad one
            _copy_runs(seg, offs[:i], dest[:i], pstart, plen, flen, vo)
        return (int(code[i]), i, int(expected[i]), int(actual[i]))
    if plen:
        _copy_runs(seg, offs, dest, pstart, plen, flen, vo)
    return (GATHER_OK, -1, 0, 0)


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
