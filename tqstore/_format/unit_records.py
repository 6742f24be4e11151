"""Keys and values of a unit index besides the location value, format version 1
(docs/FORMAT.md, "Unit index"): the one definition of their bytes.

==========  =========================================  ===============================================
db          key                                        value
==========  =========================================  ===============================================
``loc``     index key (:mod:`tqstore._format.index`)   location (:class:`~tqstore._format.index.Loc`)
``segs``    segment id, u32 big-endian (:func:`seg_key`) :class:`SegInfo` JSON ``{"size", "live", "sealed"}``
                                                       (Python's default separators)
``undo``    token u64 big-endian ‖ index key            the replaced location (20 bytes)
            (:func:`undo_key`)
``meta``    ``format`` (:data:`META_FORMAT`)            ASCII decimal unit index format version
``restore`` restore tag u64 big-endian ‖ kind byte ‖    staged batch (kind 2): the index keys and
            batch number u32 big-endian (kinds 2, 3;    locations of frames one import window wrote;
            :func:`restore_batch_key`), index key       published batch (kind 3): index keys and the
            (kinds 0, 1), nothing (kind 255)            locations they replaced (a batch value,
                                                       :func:`encode_restore_batch`); closed (kind
                                                       255): empty; kinds 0 and 1, the per-frame
                                                       forms of older writers, are still read
==========  =========================================  ===============================================

Bytes in, objects out: no I/O, no LMDB.  Every ``decode_*`` (and :meth:`SegInfo.unpack`)
raises :class:`~tqstore._format.records.RecordError` and nothing else for malformed input;
callers name the file and entry in a ``CorruptionError`` (or, for the format marker, a
``FormatVersionError``).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, List, Sequence, Tuple

import numpy as np

from .index import LOC_DTYPE
from .records import RecordError, decode_decimal, decode_json_object, encode_decimal, is_uint, member

#: the unit index format version this code reads and writes (``meta/format``; absent: 1)
UNIT_INDEX_FORMAT = 1
#: the version while a selective restore's batch entries (``restore`` kinds 2 and 3) are in the
#: index: a reader of version 1, which knows only the per-frame kinds, rejects it by name instead
#: of missing the batches; the index is version 1 again once none is left (docs/FORMAT.md)
UNIT_INDEX_FORMAT_BATCHES = 2
#: every unit index version this tqstore reads
UNIT_INDEX_FORMATS = (UNIT_INDEX_FORMAT, UNIT_INDEX_FORMAT_BATCHES)

#: the named databases of a unit index
UNIT_INDEX_DBS = ("loc", "segs", "undo", "meta")

#: the key of the format marker in the ``meta`` database
META_FORMAT = b"format"

SEG_KEY_BYTES = 4
TOKEN_BYTES = 8


@dataclass
class SegInfo:
    """A ``segs`` record: the segment's logical size (header included), its live frame bytes,
    and whether it is sealed."""

    size: int
    live: int
    sealed: bool

    def pack(self) -> bytes:
        return json.dumps({"size": self.size, "live": self.live, "sealed": self.sealed}).encode()

    @classmethod
    def unpack(cls, raw: Any) -> "SegInfo":
        """Raises RecordError unless ``raw`` is a JSON object with ``size`` and ``live``
        integers >= 0 and ``sealed`` a bool."""
        d = decode_json_object(raw, "segment record")
        size, live, sealed = (member(d, m, "segment record") for m in ("size", "live", "sealed"))
        if not is_uint(size) or not is_uint(live) or type(sealed) is not bool:
            raise RecordError(f"segment record members of the wrong type: size {size!r}, live {live!r}, "
                              f"sealed {sealed!r}")
        return cls(size, live, sealed)


def encode_seg_info(info: SegInfo) -> bytes:
    return info.pack()


def decode_seg_info(raw: Any) -> SegInfo:
    """See :meth:`SegInfo.unpack`."""
    return SegInfo.unpack(raw)


def seg_key(seg_id: int) -> bytes:
    """Key of ``segs``: the segment id, u32 big-endian."""
    return seg_id.to_bytes(SEG_KEY_BYTES, "big")


def decode_seg_key(raw: Any) -> int:
    """The segment id of a ``segs`` key. Raises RecordError unless it is 4 bytes."""
    if raw is None or len(raw) != SEG_KEY_BYTES:
        raise RecordError(f"not a segment id (4 bytes): {None if raw is None else bytes(raw)[:40]!r}")
    return int.from_bytes(raw, "big")


def undo_prefix(token: int) -> bytes:
    """The common head of the ``undo`` keys of one overwriting put: its token, u64 big-endian."""
    return token.to_bytes(TOKEN_BYTES, "big")


def undo_key(token: int, index_key: bytes) -> bytes:
    """Key of ``undo``: token ‖ the index key the put replaced."""
    return undo_prefix(token) + bytes(index_key)


def decode_undo_key(raw: Any) -> Tuple[int, bytes]:
    """``(token, index key)`` of an ``undo`` key. Raises RecordError when it cannot hold a
    token, a global index and a field name (at least 17 bytes)."""
    if raw is None or len(raw) < TOKEN_BYTES + 9:
        raise RecordError("not an undo key (token, global index, field name)")
    k = bytes(raw)
    return int.from_bytes(k[:TOKEN_BYTES], "big"), k[TOKEN_BYTES:]


def encode_format(version: int = UNIT_INDEX_FORMAT) -> bytes:
    """The ``meta/format`` value: ASCII decimal."""
    return encode_decimal(version)


def decode_format(raw: Any) -> int:
    """The version a ``meta/format`` value names (None: written before the marker, version 1).

    Raises:
        RecordError: not an ASCII decimal in canonical form (no leading zero; callers report it
            as an unknown version).
    """
    if raw is None:
        return UNIT_INDEX_FORMAT
    v = decode_decimal(raw)
    if bytes(raw) != encode_decimal(v):
        raise RecordError(f"format marker {bytes(raw)[:40]!r} is not a canonical decimal")
    return v


# ---------------------------------------------------------------------------- selective restores
RESTORE_STAGED = 0  # a frame a restore wrote, not yet in ``loc`` (one entry per frame: read, no longer written)
RESTORE_PUBLISHED = 1  # a ``loc`` entry a restore set: what it replaced (empty: nothing) (likewise)
RESTORE_STAGED_BATCH = 2  # the frames one import window of a restore wrote, not yet in ``loc``
RESTORE_PUBLISHED_BATCH = 3  # ``loc`` entries a restore set, with what each replaced
RESTORE_CLOSED = 255  # the restore was settled: later writes with its tag are refused
RESTORE_KINDS = (RESTORE_STAGED, RESTORE_PUBLISHED, RESTORE_STAGED_BATCH, RESTORE_PUBLISHED_BATCH, RESTORE_CLOSED)
RESTORE_BATCH_KINDS = (RESTORE_STAGED_BATCH, RESTORE_PUBLISHED_BATCH)
#: entries of one batch value at most (writers split larger sets)
RESTORE_BATCH_MAX = 1 << 16
BATCH_NO_BYTES = 4  # bytes of a batch entry's number (u32 big-endian)
_LOC_BYTES = 20


def restore_prefix(tag: int, kind: int) -> bytes:
    """The common head of a restore's entries of one kind: tag (u64 big-endian) ‖ kind byte."""
    return tag.to_bytes(TOKEN_BYTES, "big") + bytes([kind])


def restore_entry_key(tag: int, kind: int, index_key: bytes = b"") -> bytes:
    """Key of ``restore``: tag ‖ kind ‖ index key (no index key for :data:`RESTORE_CLOSED`)."""
    return restore_prefix(tag, kind) + bytes(index_key)


def restore_batch_key(tag: int, kind: int, batch: int) -> bytes:
    """Key of a batch entry of ``restore`` (kinds 2 and 3): tag ‖ kind ‖ batch number (u32 big-endian)."""
    return restore_prefix(tag, kind) + int(batch).to_bytes(BATCH_NO_BYTES, "big")


def decode_restore_entry_key(raw: Any) -> Tuple[int, int, bytes]:
    """``(tag, kind, rest)`` of a ``restore`` key: ``rest`` the index key (kinds 0 and 1), the
    batch number's 4 bytes (kinds 2 and 3) or empty (kind 255). Raises RecordError."""
    k = bytes(raw) if raw is not None else b""
    kind = k[TOKEN_BYTES] if len(k) > TOKEN_BYTES else -1
    rest = len(k) - TOKEN_BYTES - 1
    if kind not in RESTORE_KINDS or (kind == RESTORE_CLOSED and rest != 0) \
            or (kind in RESTORE_BATCH_KINDS and rest != BATCH_NO_BYTES) \
            or (kind in (RESTORE_STAGED, RESTORE_PUBLISHED) and rest < 9):
        raise RecordError(f"not a restore entry key: {k[:40]!r}")
    return int.from_bytes(k[:TOKEN_BYTES], "big"), kind, k[TOKEN_BYTES + 1:]


def encode_restore_batch(keys: Sequence[bytes], locs: Any, present: Any = None) -> bytes:
    """The value of a batch entry (kinds 2 and 3) of ``n`` index keys: u32 ``n`` ‖ ``n`` 20-byte
    locations (``locs``: a ``LOC_DTYPE`` array or the packed values; zero bytes where ``present``
    is 0) ‖ ``n`` presence bytes (1: the location is one, 0: none; all 1 when ``present`` is
    None) ‖ ``n`` u16 key lengths ‖ the keys back to back.  Little-endian.  Raises
    ValueError for more than :data:`RESTORE_BATCH_MAX` entries or a key of another size
    than an index key's (9..263 bytes)."""
    n = len(keys)
    if n > RESTORE_BATCH_MAX:
        raise ValueError(f"a restore batch holds at most {RESTORE_BATCH_MAX} entries, got {n}")
    lv = bytes(memoryview(locs).cast("B")) if not isinstance(locs, (bytes, bytearray)) else bytes(locs)
    if len(lv) != n * _LOC_BYTES:
        raise ValueError(f"{n} keys need {n * _LOC_BYTES} location bytes, got {len(lv)}")
    lens = np.fromiter(map(len, keys), np.int64, n)
    if n and (lens.min() < 9 or lens.max() > 8 + 255):
        raise ValueError("a restore batch key is not an index key (9 to 263 bytes)")
    pr = np.ones(n, np.uint8) if present is None else np.asarray(present, np.uint8)
    if len(pr) != n or (pr > 1).any():
        raise ValueError("present must hold one 0 or 1 per key")
    return b"".join((n.to_bytes(4, "little"), lv, pr.tobytes(), lens.astype("<u2").tobytes(), *keys))


def decode_restore_batch(raw: Any) -> Tuple[List[bytes], np.ndarray, np.ndarray]:
    """``(keys, locs, present)`` of a batch entry's value (:func:`encode_restore_batch`):
    ``locs`` a ``LOC_DTYPE`` array, ``present`` a bool array.  Raises RecordError unless the
    lengths add up exactly, each key is 9..263 bytes and each presence byte 0 or 1."""
    b = bytes(raw) if raw is not None else b""
    if len(b) < 4:
        raise RecordError("restore batch: shorter than its count")
    n = int.from_bytes(b[:4], "little")
    head = 4 + n * (_LOC_BYTES + 1 + 2)
    if n > RESTORE_BATCH_MAX or len(b) < head:
        raise RecordError(f"restore batch: {len(b)} bytes cannot hold {n} entries")
    p = 4 + n * _LOC_BYTES
    locs = np.frombuffer(b, LOC_DTYPE, n, 4).copy()
    pr = np.frombuffer(b, np.uint8, n, p)
    lens = np.frombuffer(b, "<u2", n, p + n).astype(np.int64)
    if (pr > 1).any() or (n and (lens.min() < 9 or lens.max() > 8 + 255)) or head + int(lens.sum()) != len(b):
        raise RecordError("restore batch: malformed presence bytes or key lengths")
    ends = (head + np.cumsum(lens)).tolist()
    starts = [head, *ends[:-1]]
    return [b[x:y] for x, y in zip(starts, ends)], locs, pr.astype(bool)


__all__ = ["UNIT_INDEX_FORMAT", "UNIT_INDEX_FORMAT_BATCHES", "UNIT_INDEX_FORMATS", "UNIT_INDEX_DBS", "META_FORMAT", "RecordError", "SegInfo", "encode_seg_info",
           "decode_seg_info", "seg_key", "decode_seg_key", "undo_prefix", "undo_key", "decode_undo_key",
           "encode_format", "decode_format", "RESTORE_STAGED", "RESTORE_PUBLISHED", "RESTORE_CLOSED",
           "RESTORE_KINDS", "RESTORE_STAGED_BATCH", "RESTORE_PUBLISHED_BATCH", "RESTORE_BATCH_KINDS",
           "RESTORE_BATCH_MAX", "BATCH_NO_BYTES", "restore_prefix", "restore_entry_key", "restore_batch_key", "decode_restore_entry_key",
           "encode_restore_batch", "decode_restore_batch"]
