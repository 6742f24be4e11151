"""Segment file header (docs/FORMAT.md, "Segment file")."""
from __future__ import annotations

from typing import Tuple

from .. import _native
from ..errors import CorruptionError, FormatVersionError
from .layout import SEGMENT_HEADER, SEGMENT_HEADER_SIZE, SEGMENT_MAGIC, SEGMENT_VERSION


def segment_name(seg_id: int) -> str:
    return f"seg-{seg_id:08d}.tqs"


def parse_segment_name(name: str):
    """Segment id of a file name like ``seg-00000012.tqs``, or None for other names."""
    if name.startswith("seg-") and name.endswith(".tqs") and name[4:-4].isdigit():
        return int(name[4:-4])
    return None


def encode_segment_header(unit_id: int, seg_id: int) -> bytes:
    body = SEGMENT_HEADER.pack(SEGMENT_MAGIC, SEGMENT_VERSION, 0, unit_id, seg_id, b"\0" * 44, 0)[:-4]
    return body + _native.crc32c(body).to_bytes(4, "little")


def decode_segment_header(data, *, path: str) -> Tuple[int, int]:
    """Return ``(unit_id, seg_id)``. Raises CorruptionError / FormatVersionError."""
    if len(data) < SEGMENT_HEADER_SIZE:
        raise CorruptionError("segment file shorter than its header", path=path, offset=0)
    magic, version, _r, unit_id, seg_id, _z, crc = SEGMENT_HEADER.unpack_from(data, 0)
    if magic != SEGMENT_MAGIC:
        raise CorruptionError("not a tqstore segment file (bad magic)", path=path, offset=0)
    actual = _native.crc32c(bytes(data[:SEGMENT_HEADER_SIZE - 4]))
    if actual != crc:
        raise CorruptionError("segment header checksum mismatch", path=path, offset=0, expected_crc=crc,
                              actual_crc=actual)
    if version != SEGMENT_VERSION:
        raise FormatVersionError(f"segment format version {version} is not supported (reads {SEGMENT_VERSION})",
                                 path=path, offset=0)
    return unit_id, seg_id
