"""Pure-Python implementation of the record hot path.

Same functions, arguments and results as the C extension ``_frames``; chosen when the
extension is missing or ``TQSTORE_PURE=1``.  Holds no state.
"""
from __future__ import annotations

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
    PREFIX,
    PREFIX_SIZE,
    TRAILER,
    TRAILER_SIZE,
)

IMPLEMENTATION = "pure"


def crc32c(data, value: int = 0) -> int:
    """CRC32C (Castagnoli) of ``data`` continuing from ``value``."""
    return _crc.crc32c(data, value)


def build_header(field: bytes, kind: int, dtype: int, gidx: int, shape: Sequence[int]) -> bytes:
    """Header bytes of one frame (see docs/FORMAT.md)."""
    return HEADER_HEAD.pack(gidx, kind, dtype, len(shape), len(field)) + field + b"".join(
        d.to_bytes(8, "little") for d in shape
    )


def frame_head(header: bytes, payload_len: int, flags: int, raw_len: int) -> bytes:
    """Prefix + header + zero padding up to the 64-byte-aligned payload start."""
    head = PREFIX.pack(FRAME_MAGIC, FRAME_VERSION, flags, len(header), payload_len, raw_len) + header
    return head + b"\0" * ((-len(head)) % ALIGN)


def frame_tail(crc: int, end: int) -> bytes:
    """Trailer (crc, end magic) plus zero padding so the frame ends 64-byte aligned.

    ``end`` is the offset of the trailer from the frame start.
    """
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
    """
    parts = []
    items = []
    off = base_offset
    for i, gidx in enumerate(gidxs):
        payload = payloads[i]
        plen = len(payload) if isinstance(payload, (bytes, bytearray)) else memoryview(payload).nbytes
        raw = plen if raw_lens is None else raw_lens[i]
        head = frame_head(build_header(field, kind, dtype, gidx, shapes[i]), plen, flags, raw)
        crc = _crc.crc32c(payload, _crc.crc32c(head))
        tail = frame_tail(crc, len(head) + plen)
        parts.append(head)
        parts.append(payload)
        parts.append(tail)
        flen = len(head) + plen + len(tail)
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
