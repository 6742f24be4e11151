"""Encode and decode single record frames (docs/FORMAT.md, "Record frame").

Bulk encoding of many small frames lives in ``tqstore._native`` (C or pure Python), and
so does the frame-check kernel (``_native.check_frames``; :func:`check_run` here): every
check docs/FORMAT.md requires of a frame, for a run of frames of one buffer, as one
``FRAME_*`` status code per frame (:func:`first_fault` / :class:`FrameFault` turn a code
into the error to raise).  This module turns raw bytes into checked frames with it: one
at a time (:func:`decode_frame`), many of one buffer (:func:`decode_frames`); runs of one
shape go through :func:`gather_run` (the kernel's checks against a head template, copying
the payloads out), frames read apart from their payloads through :func:`check_rows`.  A
torn, truncated, bit-flipped or foreign frame is never returned: it raises
:class:`~tqstore.errors.CorruptionError` (``FormatVersionError`` for an unknown frame
version) naming the file and offset.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from .. import _native
from ..errors import CorruptionError, FormatVersionError
from .index import LOC_DTYPE
from .layout import (
    CODEC_MASK,
    FRAME_OK,
    CODEC_RAW,
    CODEC_ZSTD,
    FRAME_END_MAGIC,
    FRAME_MAGIC,
    FRAME_VERSION,
    FRAME_CRC,
    FRAME_DIFFERS,
    FRAME_EXTENT,
    FRAME_FLAGS,
    FRAME_GIDX,
    FRAME_HEADER,
    FRAME_INDEX_CRC,
    FRAME_MAGIC_BAD,
    FRAME_PADDING,
    FRAME_SIZE,
    FRAME_TORN,
    FRAME_TRUNCATED,
    FRAME_VERSION_UNKNOWN,
    HEADER_HEAD,
    HEADER_HEAD_SIZE,
    INDEX_VALUE,
    KINDS,
    KNOWN_FLAGS,
    PREFIX,
    PREFIX_SIZE,
    TRAILER,
    TRAILER_SIZE,
    frame_extent,
    payload_offset,
)

#: where a record frame's header fields lie from the frame's start (docs/FORMAT.md, "Record
#: frame": the prefix, then gidx u64, kind u8, dtype u8, ndim u8, field name length u8, name)
KIND_AT = PREFIX_SIZE + 8
DTYPE_AT = PREFIX_SIZE + 9
NAME_LEN_AT = PREFIX_SIZE + 11
NAME_AT = PREFIX_SIZE + 12


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


# ---------------------------------------------------------------------------------- the kernel

FRAME_MESSAGES = {
    FRAME_TRUNCATED: "truncated record frame",
    FRAME_MAGIC_BAD: "not a tqstore record frame (bad magic)",
    FRAME_VERSION_UNKNOWN: "record frame format version {version} is not supported (this tqstore reads version "
                           f"{FRAME_VERSION})",
    FRAME_FLAGS: "record frame has unknown flags",
    FRAME_HEADER: "record frame header is truncated or malformed",
    FRAME_EXTENT: "record frame lengths disagree with its extent (torn or truncated)",
    FRAME_SIZE: "record frame payload length disagrees with its header (raw length, dtype or shape)",
    FRAME_GIDX: "record frame belongs to another row than the index says (row {expected})",
    FRAME_TORN: "record frame trailer missing (torn write)",
    FRAME_INDEX_CRC: "record frame is not the one the index names",
    FRAME_PADDING: "record frame padding is not zero (damaged)",
    FRAME_CRC: "record frame checksum mismatch",
}


@dataclass(frozen=True)
class FrameFault:
    """Why one frame failed the kernel's checks: its ``FRAME_*`` code, a message, and the
    expected and actual CRCs of a checksum or identity mismatch."""

    code: int
    message: str
    expected_crc: Optional[int] = None
    actual_crc: Optional[int] = None

    def error(self, *, path: Optional[str], offset: Optional[int], prefix: str = "") -> CorruptionError:
        """The exception a reader raises: FormatVersionError for an unknown frame version."""
        cls = FormatVersionError if self.code == FRAME_VERSION_UNKNOWN else CorruptionError
        return cls(prefix + self.message, path=path, offset=offset, expected_crc=self.expected_crc,
                   actual_crc=self.actual_crc)


def frame_fault(code: int, frame, *, recorded: int = 0, crc: int = 0, trailer: int = 0,
                gidx: Optional[int] = None) -> FrameFault:
    """Describe a failed check: ``code`` from :func:`check_run` for the frame whose bytes start
    ``frame`` (a buffer, for the version byte), ``recorded`` the index's CRC, ``crc`` and
    ``trailer`` the kernel's computed and trailer CRCs, ``gidx`` the expected row."""
    msg = FRAME_MESSAGES.get(code, f"record frame fails check {code}")
    if code == FRAME_VERSION_UNKNOWN:
        return FrameFault(code, msg.format(version=memoryview(frame).cast("B")[4]))
    if code == FRAME_GIDX:
        return FrameFault(code, msg.format(expected=gidx))
    if code == FRAME_INDEX_CRC:
        return FrameFault(code, msg, recorded, trailer)
    if code == FRAME_CRC:
        return FrameFault(code, msg, trailer, crc)
    return FrameFault(code, msg)


def check_run(buf, locs, gidxs=None, *, verify: bool = True, index_crc: bool = True,
              base: int = 0) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Run the frame-check kernel (``_native.check_frames``) over the frames ``locs`` (a
    ``LOC_DTYPE`` array, or packed ``INDEX_VALUE`` bytes) name in ``buf`` (``base``: the file
    offset of ``buf[0]``); ``gidxs`` the rows they must belong to (u64), or None.

    Returns ``(status, crcs, trailers)`` arrays (``FRAME_*`` codes as uint8; computed and
    trailer CRCs as uint32); nothing is raised for a bad frame (see :func:`frame_fault`).
    """
    if gidxs is not None:
        gidxs = np.ascontiguousarray(gidxs, dtype="<u8")
    st, crcs, trailers = _native.check_frames(buf, locs, gidxs, verify, index_crc, base)
    return np.frombuffer(st, np.uint8), np.frombuffer(crcs, "<u4"), np.frombuffer(trailers, "<u4")


def first_fault(buf, locs, result, gidxs=None, *, base: int = 0) -> Optional[Tuple[int, FrameFault]]:
    """``(index, fault)`` of the first frame of a :func:`check_run` result that failed, or None."""
    status, crcs, trailers = result
    bad = np.flatnonzero(status)
    if not bad.size:
        return None
    i = int(bad[0])
    loc = np.frombuffer(memoryview(locs).cast("B"), LOC_DTYPE)[i]
    off = int(loc["offset"]) - base
    mv = memoryview(buf).cast("B")
    return i, frame_fault(int(status[i]), mv[off:off + PREFIX_SIZE] if 0 <= off < mv.nbytes else b"",
                          recorded=int(loc["crc"]), crc=int(crcs[i]), trailer=int(trailers[i]),
                          gidx=None if gidxs is None else int(gidxs[i]))


def _raise_first(buf, locs, result, gidxs, *, path: str, base: int = 0) -> None:
    got = first_fault(buf, locs, result, gidxs, base=base)
    if got is not None:
        i, fault = got
        raise fault.error(path=path, offset=int(np.frombuffer(memoryview(locs).cast("B"), LOC_DTYPE)[i]["offset"]))


def _locs(offsets: Sequence[int], lengths: Sequence[int], crcs: Optional[Sequence[int]] = None) -> np.ndarray:
    loc = np.zeros(len(offsets), LOC_DTYPE)
    loc["offset"] = offsets
    loc["length"] = lengths
    if crcs is not None:
        loc["crc"] = crcs
    return loc


def decode_frame(buf, offset: int, length: int, *, path: str = "<buffer>", verify: bool = True,
                 expected_crc: Optional[int] = None) -> Frame:
    """Parse and check the frame at ``buf[offset:offset+length]`` (the frame-check kernel).

    Args:
        verify: check the CRC32C (default). Structure is always checked.
        expected_crc: the CRC recorded in an index; a mismatch is corruption too.

    Raises:
        CorruptionError: bad magic, bad lengths, truncated, or CRC mismatch.
        FormatVersionError: the frame declares an unknown format version.
    """
    mv = memoryview(buf).cast("B")
    if offset < 0 or length < PREFIX_SIZE + TRAILER_SIZE or offset + length > mv.nbytes or length >> 32:
        raise CorruptionError("truncated record frame", path=path, offset=offset)
    loc = INDEX_VALUE.pack(0, offset, length, expected_crc or 0)
    res = check_run(mv, loc, verify=verify, index_crc=expected_crc is not None)
    _raise_first(mv, loc, res, None, path=path)
    h = parse_head(mv[:offset + length], offset, length, path=path)
    end = h.payload_start + h.payload_len
    return Frame(h.gidx, h.field, h.kind, h.dtype, h.shape, h.flags, h.raw_len,
                 mv[offset + h.payload_start:offset + end], int(res[2][0]))


# ---------------------------------------------------------------------------------- bulk reads

_GIDX = slice(PREFIX_SIZE, PREFIX_SIZE + 8)  # where a frame's gidx lies, from the frame start


def decode_frames(buf, offsets: Sequence[int], lengths: Sequence[int], *, crcs: Optional[Sequence[int]] = None,
                  gidxs: Optional[Sequence[int]] = None, verify: bool = True,
                  path: str = "<buffer>") -> List[Tuple[FrameHead, memoryview]]:
    """Check many frames of one buffer (e.g. an mmapped segment) in one kernel call.

    Same checks as :func:`decode_frame` for each ``(offset, length)``: structure, extent,
    sizes, zero padding, CRC32C (unless ``verify=False``), and, when given, the index's CRC
    and the row's global index.  Headers that repeat (same field, dtype, shape) are parsed once.

    Returns ``(head, payload)`` per frame; ``payload`` is a view into ``buf`` (no copy).  Each
    head is the frame's own (its ``gidx`` is the frame's row); heads of frames that differ only
    in their row share everything else.

    Raises:
        CorruptionError / FormatVersionError: the first frame that does not check.
    """
    mv = memoryview(buf).cast("B")
    n = len(offsets)
    if any(o < 0 for o in offsets) or any(ln < 0 or ln >> 32 for ln in lengths[:n]):
        bad = next(i for i in range(n) if offsets[i] < 0 or lengths[i] < 0 or lengths[i] >> 32)
        raise CorruptionError("truncated record frame", path=path, offset=offsets[bad])
    loc = _locs(offsets, lengths[:n], crcs)
    want = None if gidxs is None else np.asarray(gidxs, dtype=np.uint64)
    res = check_run(mv, loc, want, verify=verify, index_crc=crcs is not None)
    _raise_first(mv, loc, res, want, path=path)
    cache: Dict[bytes, FrameHead] = {}
    out = []
    for off, length in zip(offsets, lengths):
        hlen = mv[off + 6] | mv[off + 7] << 8
        key = mv[off + 4:off + PREFIX_SIZE].tobytes() + mv[off + PREFIX_SIZE + 8:off + PREFIX_SIZE + hlen].tobytes()
        h = cache.get(key)
        if h is None:
            h = cache[key] = parse_head(mv, off, length, path=path)
        else:  # same template, parsed once: only the row's gidx differs
            g = int.from_bytes(mv[off + PREFIX_SIZE:off + PREFIX_SIZE + 8], "little")
            if g != h.gidx:
                h = _with_gidx(h, g)
        pos = off + h.payload_start
        out.append((h, mv[pos:pos + h.payload_len]))
    return out


def _with_gidx(h: FrameHead, gidx: int) -> FrameHead:
    """``h`` for another row (a copy with ``gidx``; every other field shared)."""
    c = copy.copy(h)
    object.__setattr__(c, "gidx", gidx)
    return c


def run_locs(blob, n: int, seg: int, offset: int) -> Optional[np.ndarray]:
    """The :data:`LOC_DTYPE` locations of ``n`` frames laid end to end in ``blob`` (as
    ``encode_frames`` lays them out) when it is written at ``offset`` of segment ``seg``, or None
    unless they are all one length with one prefix (the frames of one uniform column).

    Each frame's prefix, read where a run of equal frames puts it, must equal the first one,
    whose lengths must add up to that extent: then every frame lies there.  CRCs are read from
    the trailers (not computed: the caller encoded them)."""
    size = memoryview(blob).nbytes
    if n <= 0 or size % n or (size // n) % 8:
        return None
    flen = size // n
    _magic, _version, _flags, hlen, plen, _raw = PREFIX.unpack_from(blob, 0)
    start = payload_offset(hlen)
    if flen < PREFIX_SIZE or frame_extent(start, plen) != flen:
        return None
    prefix = np.frombuffer(blob, "<u8").reshape(n, flen // 8)[:, :PREFIX_SIZE // 8]  # (frames are 64-byte aligned)
    if not all(bool((prefix[:, j] == prefix[0, j]).all()) for j in range(PREFIX_SIZE // 8)):
        return None
    words = np.frombuffer(blob, "<u4").reshape(n, flen // 4)
    at = start + plen
    if at % 4:
        crcs = np.ascontiguousarray(words.view(np.uint8)[:, at:at + 4]).view("<u4").reshape(-1)
    else:
        crcs = words[:, at // 4]
    out = np.empty((n, 5), "<u4")  # the LOC_DTYPE record as words: seg, offset (lo, hi), length, crc
    offs = np.arange(offset, offset + n * flen, flen, dtype=np.uint64)
    out[:, 0] = seg
    out[:, 1] = offs & 0xFFFFFFFF
    out[:, 2] = offs >> 32
    out[:, 3] = flen
    out[:, 4] = crcs
    return out.view(LOC_DTYPE).reshape(-1)


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
    if code == FRAME_DIFFERS:
        return False
    off = int(np.frombuffer(memoryview(locs).cast("B"), LOC_DTYPE)[i]["offset"])
    fault = frame_fault(code, b"", recorded=expected, crc=actual, trailer=expected if code == FRAME_CRC else actual,
                        gidx=expected)
    raise fault.error(path=path, offset=off)


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
