"""The unit index's entries (format version 1; see docs/FORMAT.md, "Unit index").

The one home of the location value: the index of a unit maps key (gidx, field) to where
the frame lies, ``(segment id, frame offset, frame length, frame CRC32C)``, 20 bytes
little-endian.  Three views of those same bytes:

* :data:`INDEX_VALUE`, the :mod:`struct` (one value at a time);
* :data:`LOC_DTYPE`, the numpy record (many values at once: lookups, plans, scans);
* :class:`Loc`, the named tuple one value unpacks to.

Constants and pure conversions only: no I/O.
"""
from __future__ import annotations

import struct
from typing import NamedTuple

import numpy as np

# key = gidx (u64 big-endian, so keys sort by row) + field UTF-8
INDEX_KEY_HEAD = struct.Struct(">Q")
# value = segment id, frame offset, frame length, frame crc32c
INDEX_VALUE = struct.Struct("<IQII")

#: an index value (:data:`INDEX_VALUE`) as a numpy record, for vectorised lookups and plans
LOC_DTYPE = np.dtype({"names": ["seg", "offset", "length", "crc"], "formats": ["<u4", "<u8", "<u4", "<u4"],
                      "offsets": [0, 4, 12, 16], "itemsize": INDEX_VALUE.size})
assert LOC_DTYPE.itemsize == INDEX_VALUE.size == 20

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
