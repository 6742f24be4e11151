"""Pure-Python twins of the C kernels over frames the frame check passed
(:mod:`tqstore._native._frames`): ``restamp_frames`` (a new global index in each header,
the trailer's CRC32C updated for the change) and ``crc32c_frames`` (the CRC32C of such frames
back to back, from their trailers' CRCs).  Same results, same exceptions for the same bad
arguments; re-exported by :mod:`tqstore._native._pure`."""
from __future__ import annotations

import crc32c as _crc

from ._pure_args import _contig, _i64s
from .layout import HEADER_HEAD_SIZE, PREFIX_SIZE, TRAILER_SIZE, payload_offset


def _covers(b: memoryview, offs: list, lens: list) -> list:
    """The covered length (``align64(24 + H) + P``) of each frame at ``offs``/``lens`` of
    ``b``; ValueError naming the first frame outside ``b`` or whose lengths do not fit its
    extent (frames the frame check passed always fit)."""
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
    return covers


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
    covers = _covers(b, offs, lens)
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


_POLY_REFLECTED = 0x82F63B78  # CRC32C's polynomial, bit-reversed (x^0 is bit 31)


def _multmodp(a: int, b: int) -> int:
    """``a * b`` modulo the polynomial, in the reflected bit order (zlib's ``multmodp``)."""
    p = 0
    for i in range(31, -1, -1):
        if (a >> i) & 1:
            p ^= b
        b = (b >> 1) ^ (_POLY_REFLECTED if b & 1 else 0)
    return p


def _x8nmodp(n: int) -> int:
    """x^(8n) modulo the polynomial: the operator that shifts a CRC through n zero bytes."""
    p, sq = 1 << 31, 1 << 30  # x^0; x^1, squared below to x^8, x^16, x^32, ...
    for _ in range(3):
        sq = _multmodp(sq, sq)
    while n:
        if n & 1:
            p = _multmodp(sq, p)
        n >>= 1
        sq = _multmodp(sq, sq)
    return p


def crc32c_frames(buf, offsets, lengths, value: int = 0) -> int:
    """The CRC32C of ``value``'s bytes followed by the frames at ``offsets``/``lengths`` of
    ``buf`` back to back, from each frame's trailer CRC (its covered bytes are not read): the
    trailer and what follows it are appended to that CRC, and the frame's CRC is combined into
    the running one (zlib's ``crc32_combine``).  Only for frames that passed the frame check.
    Raises ValueError (nothing computed) for a frame outside ``buf`` or whose lengths do not
    fit its extent."""
    b = _contig(buf, "buf")
    offs, lens = _i64s(offsets, "offsets"), _i64s(lengths, "lengths")
    if len(offs) != len(lens):
        raise ValueError("offsets and lengths must have the same length")
    covers = _covers(b, offs, lens)
    crc = int(value) & 0xFFFFFFFF
    for o, n, cover in zip(offs, lens, covers):
        fcrc = _crc.crc32c(bytes(b[o + cover:o + n]), int.from_bytes(b[o + cover:o + cover + 4], "little"))
        crc = _multmodp(_x8nmodp(n), crc) ^ fcrc
    return crc


__all__ = ["restamp_frames", "crc32c_frames"]
