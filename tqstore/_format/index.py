"""The unit index's entries (format version 1; see docs/FORMAT.md, "Unit index").

The engine's one name for the location value: the index of a unit maps key (gidx, field) to where
the frame lies, ``(segment id, frame offset, frame length, frame CRC32C)``, 20 bytes
little-endian.  Three views of those same bytes:

* :data:`INDEX_VALUE`, the :mod:`struct` (one value at a time);
* :data:`LOC_DTYPE`, the numpy record (many values at once: lookups, plans, scans);
* :class:`Loc`, the named tuple one value unpacks to.

Constants and pure conversions only: no I/O.  Engine code (unit, reader, checkpoint)
imports the location value from here and nowhere else.
"""
from __future__ import annotations

from typing import NamedTuple, Tuple

# the key, the value's struct and its numpy record are defined beside the other byte
# constants, at the bottom of the record path (_native needs them and imports nothing
# from _format); everything above names them here
from .._native.layout import INDEX_KEY_HEAD, INDEX_VALUE, LOC_DTYPE
from .records import RecordError

#: frames up to this many bytes are read through the segment mmap, larger ones with
#: ``preadv`` straight into their destination (the unit chooses the path of a uniform read;
#: the reader sizes the destinations of large frames from their heads first)
MMAP_READ_BYTES = 16 << 10


class Loc(NamedTuple):
    """Where a frame lies: segment id, offset in the segment file, frame length, frame CRC.

    A named tuple: one is made per row and field read, so it must be cheap.
    """

    seg: int
    offset: int
    length: int
    crc: int

    @classmethod
    def unpack(cls, raw: bytes) -> "Loc":
        return cls._make(INDEX_VALUE.unpack(raw))

    def pack(self) -> bytes:
        return INDEX_VALUE.pack(self.seg, self.offset, self.length, self.crc)


def index_key(gidx: int, field: str) -> bytes:
    """The ``loc`` (and, after a token, ``undo``) key of ``(gidx, field)``: the global index
    u64 big-endian followed by the field name in UTF-8 (hot paths build it inline from
    :data:`INDEX_KEY_HEAD`: the same bytes)."""
    return INDEX_KEY_HEAD.pack(gidx) + field.encode()


def decode_index_key(raw) -> Tuple[int, str]:
    """``(gidx, field)`` of an index key.

    Raises:
        RecordError: shorter than a global index and a one-byte field name, or a field name
            that is not UTF-8.
    """
    k = bytes(raw)
    if len(k) < INDEX_KEY_HEAD.size + 1:
        raise RecordError(f"not an index key (global index, field name): {k[:40]!r}")
    try:
        return INDEX_KEY_HEAD.unpack_from(k)[0], k[INDEX_KEY_HEAD.size:].decode("utf-8")
    except UnicodeDecodeError as e:
        raise RecordError(f"index key: field name is not UTF-8 ({e.reason})") from None
