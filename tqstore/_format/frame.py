"""Encode and decode single record frames (docs/FORMAT.md, "Record frame").

Bulk encoding of many small frames lives in ``tqstore._native`` (C or pure Python);
this module handles one frame at a time and turns raw bytes into a checked
:class:`Frame`.  A torn, truncated, bit-flipped or foreign frame is never returned:
it raises :class:`~tqstore.errors.CorruptionError` naming the file and offset.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

from .. import _native
from ..errors import CorruptionError, FormatVersionError
from .layout import (
    ALIGN,
    CODEC_MASK,
    CODEC_RAW,
    CODEC_ZSTD,
    FRAME_END_MAGIC,
    FRAME_MAGIC,
    FRAME_VERSION,
    HEADER_HEAD,
    HEADER_HEAD_SIZE,
    KINDS,
    KNOWN_FLAGS,
    PREFIX,
    PREFIX_SIZE,
    TRAILER,
    TRAILER_SIZE,
)


@dataclass(frozen=True)
class Frame:
    """A verified frame. ``payload`` is a memoryview into the source buffer (no copy)."""

    gidx: int
    field: str
    kind: int
    dtype: int
    shape: Tuple[int, ...]
    flags: int
    raw_len: int
    payload: memoryview
    crc: int

    @property
    def codec(self) -> int:
        return self.flags & CODEC_MASK


def encode_parts(field: bytes, kind: int, dtype: int, gidx: int, shape, payload, flags: int = 0,
                 raw_len: Optional[int] = None):
    """Frame ``payload`` without copying it: returns ``(head, tail, crc, frame_len)``.

    Write ``head``, the payload, then ``tail`` back to back (e.g. with ``os.writev``).
    """
    plen = memoryview(payload).nbytes
    head = _native.frame_head(_native.build_header(field, kind, dtype, gidx, tuple(shape)), plen, flags,
                              plen if raw_len is None else raw_len)
    crc = _native.crc32c(payload, _native.crc32c(head))
    tail = _native.frame_tail(crc, len(head) + plen)
    return head, tail, crc, len(head) + plen + len(tail)


@dataclass(frozen=True)
class FrameHead:
    """The parsed prefix and header of a frame (not yet CRC-verified)."""

    gidx: int
    field: str
    kind: int
    dtype: int
    shape: Tuple[int, ...]
    flags: int
    raw_len: int
    payload_start: int  # from the frame start
    payload_len: int


def parse_head(buf, offset: int = 0, length: Optional[int] = None, *, path: str = "<buffer>") -> FrameHead:
    """Parse a frame's prefix and header from ``buf[offset:]``; checks structure, not CRC.

    ``length`` is the frame's extent when known (from an index); lengths are checked against it.

    Raises:
        CorruptionError / FormatVersionError as :func:`decode_frame`.
    """
    mv = memoryview(buf).cast("B")
    avail = mv.nbytes - offset
    if offset < 0 or avail < PREFIX_SIZE:
        raise CorruptionError("truncated record frame", path=path, offset=offset)
    magic, version, flags, hlen, plen, raw_len = PREFIX.unpack_from(mv, offset)
    if magic != FRAME_MAGIC:
        raise CorruptionError("not a tqstore record frame (bad magic)", path=path, offset=offset)
    if version != FRAME_VERSION:
        raise FormatVersionError(
            f"record frame format version {version} is not supported (this tqstore reads version "
            f"{FRAME_VERSION})", path=path, offset=offset)
    if flags & ~KNOWN_FLAGS or (flags & CODEC_MASK) not in (CODEC_RAW, CODEC_ZSTD):
        raise CorruptionError(f"record frame has unknown flags {flags:#x}", path=path, offset=offset)
    pstart = (PREFIX_SIZE + hlen + ALIGN - 1) & ~(ALIGN - 1)
    if hlen < HEADER_HEAD_SIZE or PREFIX_SIZE + hlen > avail:
        raise CorruptionError("record frame header is truncated or malformed", path=path, offset=offset)
    if length is not None and pstart + plen + TRAILER_SIZE > length:
        raise CorruptionError("record frame lengths exceed its extent (torn or truncated)", path=path,
                              offset=offset)
    gidx, kind, dtype, ndim, flen = HEADER_HEAD.unpack_from(mv, offset + PREFIX_SIZE)
    hpos = offset + PREFIX_SIZE + HEADER_HEAD_SIZE
    if HEADER_HEAD_SIZE + flen + 8 * ndim != hlen or kind not in KINDS:
        raise CorruptionError("record frame header is malformed", path=path, offset=offset)
    try:
        field = bytes(mv[hpos:hpos + flen]).decode("utf-8")
    except UnicodeDecodeError as e:
        raise CorruptionError("record frame field name is not UTF-8", path=path, offset=offset) from e
    hpos += flen
    shape = tuple(int.from_bytes(mv[hpos + 8 * i:hpos + 8 * i + 8], "little") for i in range(ndim))
    return FrameHead(gidx, field, kind, dtype, shape, flags, raw_len, pstart, plen)


def decode_frame(buf, offset: int, length: int, *, path: str = "<buffer>", verify: bool = True,
                 expected_crc: Optional[int] = None) -> Frame:
    """Parse and check the frame at ``buf[offset:offset+length]``.

    Args:
        verify: check the CRC32C (default). Structure is always checked.
        expected_crc: the CRC recorded in an index; a mismatch is corruption too.

    Raises:
        CorruptionError: bad magic, bad lengths, truncated, or CRC mismatch.
        FormatVersionError: the frame declares an unknown format version.
    """
    mv = memoryview(buf).cast("B")
    if offset < 0 or length < PREFIX_SIZE + TRAILER_SIZE or offset + length > mv.nbytes:
        raise CorruptionError("truncated record frame", path=path, offset=offset)
    h = parse_head(mv[:offset + length], offset, length, path=path)
    end = h.payload_start + h.payload_len
    crc_exp, emagic = TRAILER.unpack_from(mv, offset + end)
    if emagic != FRAME_END_MAGIC:
        raise CorruptionError("record frame trailer missing (torn write)", path=path, offset=offset)
    if verify:
        crc_act = _native.crc32c(mv[offset:offset + end])
        if crc_act != crc_exp:
            raise CorruptionError("record frame checksum mismatch", path=path, offset=offset,
                                  expected_crc=crc_exp, actual_crc=crc_act)
    if expected_crc is not None and expected_crc != crc_exp:
        raise CorruptionError("record frame is not the one the index names", path=path, offset=offset,
                              expected_crc=expected_crc, actual_crc=crc_exp)
    return Frame(h.gidx, h.field, h.kind, h.dtype, h.shape, h.flags, h.raw_len,
                 mv[offset + h.payload_start:offset + end], crc_exp)
