"""Byte layout of record frames, unit index entries and segment headers (format version 1);
see docs/FORMAT.md, "Record frame", "Segment file" and "Unit index".

Constants and the alignment arithmetic over them, nothing else: the single source of
truth shared by the pure-Python codec (``_pure``), the C extension (``_frames.c``, which
repeats them and is checked against them by tests/test_native.py) and the readers.  It
lives here, at the bottom of the record path, so that ``_native`` needs nothing from
``_format``; the format layer and everything above import it as ``tqstore._format.layout``.
"""
from __future__ import annotations

import struct

import numpy as np

FRAME_MAGIC = b"TQFR"
FRAME_END_MAGIC = b"TQFE"
FRAME_VERSION = 1
ALIGN = 64

# prefix: magic, version, flags, header_len, payload_len, raw_len
PREFIX = struct.Struct("<4sBBHQQ")
PREFIX_SIZE = PREFIX.size  # 24
# header head: gidx, kind, dtype, ndim, field_len; then field bytes, then ndim u64 dims
HEADER_HEAD = struct.Struct("<QBBBB")
HEADER_HEAD_SIZE = HEADER_HEAD.size  # 12
TRAILER = struct.Struct("<I4s")  # crc32c, end magic
TRAILER_SIZE = TRAILER.size  # 8

# flags: bits 0-1 payload codec
CODEC_MASK = 0x03
CODEC_RAW = 0
CODEC_ZSTD = 1
KNOWN_FLAGS = CODEC_MASK

# kinds of payload
KIND_TENSOR = 0  # torch tensor, C-contiguous bytes
KIND_NDARRAY = 1  # numpy array, C-contiguous bytes
KIND_VALUE = 2  # non-tensor value, UTF-8 JSON of the safe value codec
KINDS = (KIND_TENSOR, KIND_NDARRAY, KIND_VALUE)

MAX_FIELD_BYTES = 255
MAX_NDIM = 32

# bytes per element of each dtype code (docs/FORMAT.md, "Dtype codes"); 0 for code 0 (none)
DTYPE_ITEMSIZE = (0, 1, 1, 1, 2, 4, 8, 2, 2, 4, 8, 8, 16, 2, 4, 8, 1, 1)

# Per-frame status codes of the frame-check kernel (``check_frames``; ``gather_frames``
# returns the same codes): the first check a frame fails, the checks made in this order
# (docs/FORMAT.md, "Record frame", "Frame status codes").
FRAME_OK = 0
FRAME_TRUNCATED = 1  # the frame's extent does not lie inside the buffer (truncated file or window)
FRAME_MAGIC_BAD = 2  # no frame magic
FRAME_VERSION_UNKNOWN = 3  # a frame version this reader does not read (callers: FormatVersionError)
FRAME_FLAGS = 4  # reserved flag bits or codec set
FRAME_HEADER = 5  # header length, layout (H = 12 + F + 8 ndim), kind or field name (UTF-8) malformed
FRAME_EXTENT = 6  # align64(payload_start + P + 8) is not the extent the index recorded
FRAME_SIZE = 7  # raw codec with raw_len != P, or (kinds 0, 1) decoded length != itemsize * prod(shape)
FRAME_GIDX = 8  # the header's global index is not the expected one (only when expected gidxs are given)
FRAME_TORN = 9  # no end magic (torn write)
FRAME_INDEX_CRC = 10  # the trailer's CRC is not the one the index recorded (not the frame it names)
FRAME_PADDING = 11  # trailing padding is not all zero
FRAME_CRC = 12  # CRC32C of prefix, header, header padding and payload differs from the trailer's
FRAME_DIFFERS = 13  # gather_frames only: index length or head differ from the template (another shape)

# index entry of a unit: key = gidx (u64 big-endian, so keys sort by row) + field UTF-8
INDEX_KEY_HEAD = struct.Struct(">Q")
# value = segment id, frame offset, frame length, frame crc32c
INDEX_VALUE = struct.Struct("<IQII")
# the same value as a numpy record, for vectorised lookups, plans and scans (the engine
# names it through tqstore._format.index, with Loc, the named tuple of one value)
LOC_DTYPE = np.dtype({"names": ["seg", "offset", "length", "crc"], "formats": ["<u4", "<u8", "<u4", "<u4"],
                      "offsets": [0, 4, 12, 16], "itemsize": INDEX_VALUE.size})
assert LOC_DTYPE.itemsize == INDEX_VALUE.size == 20


def align_up(n: int, a: int = ALIGN) -> int:
    """Round ``n`` up to a multiple of ``a`` (a power of two)."""
    return (n + a - 1) & ~(a - 1)


def payload_offset(header_len: int) -> int:
    """Offset of the payload from the frame start for a header of ``header_len`` bytes."""
    return align_up(PREFIX_SIZE + header_len)


def frame_extent(payload_start: int, payload_len: int) -> int:
    """Bytes a frame takes (trailer and zero padding included) given its payload start and length."""
    return align_up(payload_start + payload_len + TRAILER_SIZE)


# segment file: a 64-byte header, then frames back to back (each 64-byte aligned)
SEGMENT_MAGIC = b"TQSG"
SEGMENT_VERSION = 1
SEGMENT_HEADER = struct.Struct("<4sHHII44sI")  # magic, version, reserved, unit, segment, zeros, crc
SEGMENT_HEADER_SIZE = SEGMENT_HEADER.size  # 64
