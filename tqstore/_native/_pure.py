"""Pure-Python implementation of the record hot path.

Same functions, arguments and results as the C extension ``_frames``; chosen when the
extension is missing or ``TQSTORE_PURE=1``.  Holds no state.
"""
from __future__ import annotations

import operator
from typing import Optional, Sequence

import crc32c as _crc

from .._format.layout import (
    ALIGN,
    FRAME_END_MAGIC,
    FRAME_MAGIC,
    FRAME_VERSION,
    HEADER_HEAD,
    INDEX_KEY_HEAD,
    INDEX_VALUE,
    MAX_FIELD_BYTES,
    MAX_NDIM,
    PREFIX,
    PREFIX_SIZE,
    TRAILER,
    TRAILER_SIZE,
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
        pstart = (PREFIX_SIZE + hlen + ALIGN - 1) & ~(ALIGN - 1)
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
