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

from typing import Any, Dict, List, NamedTuple, Tuple

# the key, the value's struct and its numpy record are defined beside the other byte
# constants, at the bottom of the record path (_native needs them and imports nothing
# from _format); everything above names them here
from .._native.layout import INDEX_KEY_HEAD, INDEX_VALUE, LOC_DTYPE
from .lmdb_pages import Packed
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


def _joined(keys: Any):
    """``(bytes as uint8, lengths, starts)`` of index keys (a list of bytes or a Packed),
    each checked to be longer than a global index."""
    import numpy as np

    packed = isinstance(keys, Packed)
    lens = keys.lens if packed else np.fromiter(map(len, keys), dtype=np.int64, count=len(keys))
    if int(lens.min()) < INDEX_KEY_HEAD.size + 1:
        decode_index_key(keys[int(np.argmin(lens))])
    kb = np.frombuffer(keys.buf if packed else b"".join(keys), dtype=np.uint8)
    return kb, lens, np.cumsum(lens) - lens


def _field_groups(kb, lens, starts):
    """``(field, positions)`` per distinct field name of the keys (positions: an index array,
    or None for all of them).  The names of one length are compared as integers (up to 8
    bytes) or byte strings (longer), and each distinct one decoded once.  Raises RecordError
    (a name that is not UTF-8)."""
    import numpy as np

    head = INDEX_KEY_HEAD.size
    for n in np.flatnonzero(np.bincount(lens)).tolist():  # the key lengths there are (a few)
        at = np.flatnonzero(lens == n) if int(lens[0]) != n or not (lens == n).all() else None
        first = starts if at is None else starts[at]
        width = n - head
        if width <= 8:  # the name as an integer: one gather per byte
            code = np.zeros(len(first), dtype=np.uint64)
            for j in range(width):
                code <<= np.uint64(8)
                code |= kb[first + head + j]
        else:
            code = np.ascontiguousarray(kb[first[:, None] + np.arange(head, n)]).view(f"V{width}").reshape(-1)
        uniq, inv = (code[:1], None) if (code == code[0]).all() else np.unique(code, return_inverse=True)
        for i in range(len(uniq)):
            sel = None if inv is None else np.flatnonzero(inv.reshape(-1) == i)
            k = int(first[0] if sel is None else first[sel[0]])
            try:
                f = kb[k + head:k + n].tobytes().decode("utf-8")
            except UnicodeDecodeError as e:
                raise RecordError(f"index key: field name is not UTF-8 ({e.reason})") from None
            yield f, (at if sel is None else (sel if at is None else at[sel]))


def check_index_keys(keys: Any) -> List[str]:
    """The distinct field names of index keys (a list of bytes, or a
    :class:`~tqstore._format.lmdb_pages.Packed`), every key checked as :func:`decode_index_key`
    checks it, in bulk.  Raises RecordError."""
    if not len(keys):
        return []
    return sorted({f for f, _ in _field_groups(*_joined(keys))})


def decode_index_keys(keys: Any) -> Dict[str, "np.ndarray"]:
    """Index keys in bulk (a list of bytes, or a :class:`~tqstore._format.lmdb_pages.Packed`):
    field -> the global indexes holding it (int64, ascending).

    No Python work per key: the keys are joined once, each key's global index is gathered
    from its first 8 bytes, and the field names are found by :func:`_field_groups` (a store
    has few field names).

    Raises:
        RecordError: as :func:`decode_index_key`, for any of them.
    """
    import numpy as np

    if not len(keys):
        return {}
    kb, lens, starts = _joined(keys)
    g = np.zeros(len(lens), dtype=np.uint64)
    for j in range(INDEX_KEY_HEAD.size):  # big-endian u64 of each key's first 8 bytes
        g <<= np.uint64(8)
        g |= kb[starts + j]
    g = g.astype(np.int64)
    out: Dict[str, list] = {}
    for f, pos in _field_groups(kb, lens, starts):
        out.setdefault(f, []).append(g if pos is None else g[pos])
    res = {}
    for f, parts in out.items():
        a = parts[0] if len(parts) == 1 else np.concatenate(parts)
        res[f] = a if len(parts) == 1 and (len(a) < 2 or bool((a[1:] > a[:-1]).all())) else np.sort(a)
    return res


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
