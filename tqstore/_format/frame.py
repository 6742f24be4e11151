"""Encode and decode single record frames (docs/FORMAT.md, "Record frame").

Bulk encoding of many small frames lives in ``tqstore._native`` (C or pure Python);
this module turns raw bytes into checked frames: one at a time (:func:`decode_frame`),
many of one buffer (:func:`decode_frames`), runs of one shape (:func:`check_run`, or
:func:`gather_run`, which also copies the payloads out), or
frames read apart from their payloads (:func:`check_rows`).  A torn, truncated,
bit-flipped or foreign frame is never returned: it raises
:class:`~tqstore.errors.CorruptionError` naming the file and offset.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from .. import _native
from .._native._pure import GATHER_DIFFERS as _GATHER_DIFFERS, GATHER_GIDX as _GATHER_GIDX, \
    GATHER_INDEX_CRC as _GATHER_INDEX_CRC, GATHER_PADDING as _GATHER_PADDING, GATHER_TORN as _GATHER_TORN, \
    GATHER_TRUNCATED as _GATHER_TRUNCATED
from ..errors import CorruptionError, FormatVersionError
from .index import LOC_DTYPE
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
    frame_extent,
    payload_offset,
)


@dataclass(frozen=True)
class _HeadFields:
    """What a frame's header says, shared by :class:`Frame` and :class:`FrameHead`."""

    gidx: int
    field: str
    kind: int
    dtype: int
    shape: Tuple[int, ...]
    flags: int
    raw_len: int


@dataclass(frozen=True)
class Frame(_HeadFields):
    """A verified frame. ``payload`` is a memoryview into the source buffer (no copy)."""

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


def encode_uniform(field: bytes, kind: int, dtype: int, shape, gidxs: Sequence[int], payloads: Sequence):
    """Frame many payloads of one shape and length (raw codec) without copying them.

    The head is built once and only the gidx changes per frame.  Returns ``(parts, crcs,
    frame_len)``: ``parts`` is ``[head, payload, tail] * n`` to write back to back.

    Raises:
        ValueError: the payloads differ in length.  OverflowError: a gidx out of range.
    """
    if not payloads:
        return [], [], 0
    plen = memoryview(payloads[0]).nbytes
    head0, tail0, _crc, flen = encode_parts(field, kind, dtype, gidxs[0], shape, payloads[0])
    pre, rest = head_template(head0)
    pad = bytes(tail0[TRAILER_SIZE:])
    crc32c = _native.crc32c
    pack = TRAILER.pack
    parts: List = []
    crcs: List[int] = []
    for g, p in zip(gidxs, payloads):
        if memoryview(p).nbytes != plen:
            raise ValueError(f"payloads of one shape differ in length ({memoryview(p).nbytes} != {plen})")
        head = pre + g.to_bytes(8, "little") + rest
        c = crc32c(p, crc32c(head))
        parts += (head, p, pack(c, FRAME_END_MAGIC) + pad)
        crcs.append(c)
    return parts, crcs, flen


@dataclass(frozen=True)
class FrameHead(_HeadFields):
    """The parsed prefix and header of a frame (not yet CRC-verified)."""

    payload_start: int  # from the frame start
    payload_len: int


def parse_head(buf, offset: int = 0, length: Optional[int] = None, *, path: str = "<buffer>") -> FrameHead:
    """Parse a frame's prefix and header from ``buf[offset:]``; checks structure, not CRC.

    ``length`` is the frame's extent when known (from an index): the frame's lengths must add
    up to exactly that, padding included.

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
    pstart = payload_offset(hlen)
    if hlen < HEADER_HEAD_SIZE or PREFIX_SIZE + hlen > avail:
        raise CorruptionError("record frame header is truncated or malformed", path=path, offset=offset)
    if length is not None and frame_extent(pstart, plen) != length:
        raise CorruptionError("record frame lengths disagree with its extent (torn or truncated)", path=path,
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
    pad = mv[offset + end + TRAILER_SIZE:offset + length]
    if pad.nbytes and pad.tobytes() != bytes(pad.nbytes):
        raise CorruptionError("record frame padding is not zero (damaged)", path=path, offset=offset)
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


# ---------------------------------------------------------------------------------- bulk reads

_ZEROS = bytes(ALIGN)
_GIDX = slice(PREFIX_SIZE, PREFIX_SIZE + 8)  # where a frame's gidx lies, from the frame start


def decode_frames(buf, offsets: Sequence[int], lengths: Sequence[int], *, crcs: Optional[Sequence[int]] = None,
                  gidxs: Optional[Sequence[int]] = None, verify: bool = True,
                  path: str = "<buffer>") -> List[Tuple[FrameHead, memoryview]]:
    """Check many frames of one buffer (e.g. an mmapped segment) in one native call.

    Same checks as :func:`decode_frame` for each ``(offset, length)``: structure, extent,
    zero padding, CRC32C (unless ``verify=False``), and, when given, the index's CRC and
    the row's global index.  Headers that repeat (same field, dtype, shape) are parsed once.

    Returns ``(head, payload)`` per frame; ``payload`` is a view into ``buf`` (no copy).

    Raises:
        CorruptionError / FormatVersionError: the first frame that does not check.
    """
    mv = memoryview(buf).cast("B")
    checked = _native.verify_frames(mv, offsets, lengths)
    cache: Dict[bytes, FrameHead] = {}
    out = []
    for i, (status, pos, plen, crc_exp, crc_act) in enumerate(checked):
        off = offsets[i]
        length = lengths[i]
        if status == 1:  # structure: let the one-frame decoder name the problem
            decode_frame(mv, off, length, path=path, verify=verify)
            raise CorruptionError("record frame is malformed", path=path, offset=off)
        if status == 2 and verify:
            raise CorruptionError("record frame checksum mismatch", path=path, offset=off, expected_crc=crc_exp,
                                  actual_crc=crc_act)
        if crcs is not None and crcs[i] != crc_exp:
            raise CorruptionError("record frame is not the one the index names", path=path, offset=off,
                                  expected_crc=crcs[i], actual_crc=crc_exp)
        end = pos + plen + TRAILER_SIZE
        if frame_extent(pos - off, plen) != length or (end != off + length and mv[end:off + length] != _ZEROS[:off + length - end]):
            decode_frame(mv, off, length, path=path, verify=verify)
            raise CorruptionError("record frame extent or padding is damaged", path=path, offset=off)
        key = mv[off + 4:off + PREFIX_SIZE].tobytes() + mv[off + PREFIX_SIZE + 8:pos].tobytes()
        h = cache.get(key)
        if h is None:
            h = cache[key] = parse_head(mv, off, length, path=path)
        if gidxs is not None and int.from_bytes(mv[off + PREFIX_SIZE:off + PREFIX_SIZE + 8], "little") != gidxs[i]:
            raise CorruptionError(f"record frame belongs to another row than the index says (row {gidxs[i]})",
                                  path=path, offset=off)
        out.append((h, mv[pos:pos + plen]))
    return out


def head_template(head) -> Tuple[bytes, bytes]:
    """The parts of a frame head that frames of one field and shape share: all but the gidx.

    ``head`` holds at least the frame's bytes up to its payload start.
    """
    hb = bytes(head)
    return hb[:_GIDX.start], hb[_GIDX.stop:]


def gather_run(buf, locs, gidxs, out, rows, *, template: Tuple[bytes, bytes], payload_start: int, payload_len: int,
               verify: bool = True, path: str = "<buffer>") -> bool:
    """Check frames of one head template and copy their payloads into ``out[rows]``, in one
    native pass (``_native.gather_frames``).

    ``locs`` is the frames' unit-index values (a ``LOC_DTYPE`` array, or bytes of packed
    ``INDEX_VALUE``), offsets into ``buf``; ``gidxs`` their rows (u64), ``rows`` the rows of
    ``out`` (i64) their payloads go to; ``out`` a writable C-contiguous buffer of
    ``payload_len``-byte rows.  Every frame must equal ``template`` apart from its gidx
    (see :func:`head_template`), carry gidx ``gidxs[i]``, end magic, the index's CRC and zero
    padding, and (with ``verify``) a matching CRC32C.

    Returns False when some frame's extent or head differs from the template (another shape:
    read the frames one by one instead); ``out`` rows may then be partly written.

    Raises:
        CorruptionError: a frame is truncated, torn, damaged or not the one the index names.
    """
    code, i, expected, actual = _native.gather_frames(buf, locs, gidxs, template, payload_start, payload_len, out,
                                                      rows, verify)
    if code == 0:
        return True
    if code == _GATHER_DIFFERS:
        return False
    off = int(np.frombuffer(memoryview(locs).cast("B"), LOC_DTYPE)[i]["offset"])
    if code == _GATHER_TRUNCATED:
        raise CorruptionError("truncated record frame", path=path, offset=off)
    if code == _GATHER_GIDX:
        raise CorruptionError(f"record frame belongs to another row than the index says (row {expected})",
                              path=path, offset=off)
    if code == _GATHER_TORN:
        raise CorruptionError("record frame trailer missing (torn write)", path=path, offset=off)
    if code == _GATHER_INDEX_CRC:
        raise CorruptionError("record frame is not the one the index names", path=path, offset=off,
                              expected_crc=expected, actual_crc=actual)
    if code == _GATHER_PADDING:
        raise CorruptionError("record frame padding is not zero (damaged)", path=path, offset=off)
    raise CorruptionError("record frame checksum mismatch", path=path, offset=off, expected_crc=expected,
                          actual_crc=actual)


def check_rows(heads, tails, *, template: Tuple[bytes, bytes], gidxs, crcs, offsets, path: str) -> bool:
    """Vectorised checks of frames read apart from their payloads.

    ``heads`` is an ``(n, payload_start)`` uint8 array of the frames' bytes before their
    payloads, ``tails`` an ``(n, k)`` array of the bytes after (trailer and padding).
    Returns False when some head differs from ``template`` apart from its gidx (another
    shape or dtype); else checks gidxs, end magic, the index's CRCs and zero padding.

    Raises:
        CorruptionError: naming the first frame (by ``offsets[i]``) that does not check.
    """
    count = heads.shape[0]
    pre, rest = template
    if heads.shape[1] != len(pre) + 8 + len(rest) or not (
            np.array_equal(heads[:, :_GIDX.start], np.broadcast_to(np.frombuffer(pre, np.uint8), (count, len(pre))))
            and np.array_equal(heads[:, _GIDX.stop:],
                               np.broadcast_to(np.frombuffer(rest, np.uint8), (count, len(rest))))):
        return False
    got = np.ascontiguousarray(heads[:, _GIDX]).view("<u8").ravel()
    bad = np.flatnonzero(got != np.asarray(gidxs, dtype=np.uint64))
    if bad.size:
        raise CorruptionError(f"record frame belongs to another row than the index says (row {gidxs[bad[0]]})",
                              path=path, offset=int(offsets[bad[0]]))
    magic = np.frombuffer(FRAME_END_MAGIC, np.uint8)
    bad = np.flatnonzero((tails[:, 4:8] != magic).any(axis=1))
    if bad.size:
        raise CorruptionError("record frame trailer missing (torn write)", path=path, offset=int(offsets[bad[0]]))
    crc_got = np.ascontiguousarray(tails[:, :4]).view("<u4").ravel()
    bad = np.flatnonzero(crc_got != np.asarray(crcs, dtype=np.uint32))
    if bad.size:
        i = int(bad[0])
        raise CorruptionError("record frame is not the one the index names", path=path, offset=int(offsets[i]),
                              expected_crc=int(crcs[i]), actual_crc=int(crc_got[i]))
    if tails.shape[1] > TRAILER_SIZE:
        bad = np.flatnonzero(tails[:, TRAILER_SIZE:].any(axis=1))
        if bad.size:
            raise CorruptionError("record frame padding is not zero (damaged)", path=path,
                                  offset=int(offsets[bad[0]]))
    return True
