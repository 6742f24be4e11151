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

from itertools import compress
from typing import Dict, List, NamedTuple, Tuple

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


def decode_index_keys(keys: List[bytes]) -> Dict[str, "np.ndarray"]:
    """Index keys in bulk: field -> the global indexes holding it (int64, in key order).

    Keys of one length are decoded together as one byte matrix (a store has few field names).

    Raises:
        RecordError: as :func:`decode_index_key`, for any of them.
    """
    import numpy as np

    out: Dict[str, list] = {}
    if not keys:
        return {}
    lens = np.fromiter(map(len, keys), dtype=np.int64, count=len(keys))
    head = INDEX_KEY_HEAD.size
    if int(lens.min()) < head + 1:
        decode_index_key(keys[int(np.argmin(lens))])
    for n in np.unique(lens).tolist():
        sel = lens == n
        mat = np.frombuffer(b"".join(compress(keys, sel.tolist())), dtype=np.uint8).reshape(-1, n)
        g = np.ascontiguousarray(mat[:, :head]).view(">u8").reshape(-1).astype(np.int64)
        names = np.ascontiguousarray(mat[:, head:]).view(f"V{n - head}").reshape(-1)
        uniq, inv = np.unique(names, return_inverse=True)
        inv = inv.reshape(-1)
        for i, raw in enumerate(uniq.tolist()):
            try:
                f = bytes(raw).decode("utf-8")
            except UnicodeDecodeError as e:
                raise RecordError(f"index key: field name is not UTF-8 ({e.reason})") from None
            out.setdefault(f, []).append(g[inv == i])
    return {f: np.sort(np.concatenate(parts)) for f, parts in out.items()}


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
