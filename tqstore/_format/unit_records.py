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
``restore`` restore tag u64 big-endian ‖ kind byte ‖    staged (kind 0): the location of a frame a
            index key (:func:`restore_entry_key`;       selective restore wrote; published (kind 1):
            kind 255: no index key)                     the location it replaced (20 bytes) or empty
                                                       (none); closed (kind 255): empty
==========  =========================================  ===============================================

Bytes in, objects out: no I/O, no LMDB.  Every ``decode_*`` (and :meth:`SegInfo.unpack`)
raises :class:`~tqstore._format.records.RecordError` and nothing else for malformed input;
callers name the file and entry in a ``CorruptionError`` (or, for the format marker, a
``FormatVersionError``).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Tuple

from .records import RecordError, decode_decimal, decode_json_object, encode_decimal, is_uint, member

#: the unit index format version this code reads and writes (``meta/format``; absent: 1)
UNIT_INDEX_FORMAT = 1

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
RESTORE_STAGED = 0  # a frame a restore wrote, not yet in ``loc``
RESTORE_PUBLISHED = 1  # a ``loc`` entry a restore set: what it replaced (empty: nothing)
RESTORE_CLOSED = 255  # the restore was settled: later writes with its tag are refused
RESTORE_KINDS = (RESTORE_STAGED, RESTORE_PUBLISHED, RESTORE_CLOSED)


def restore_prefix(tag: int, kind: int) -> bytes:
    """The common head of a restore's entries of one kind: tag (u64 big-endian) ‖ kind byte."""
    return tag.to_bytes(TOKEN_BYTES, "big") + bytes([kind])


def restore_entry_key(tag: int, kind: int, index_key: bytes = b"") -> bytes:
    """Key of ``restore``: tag ‖ kind ‖ index key (no index key for :data:`RESTORE_CLOSED`)."""
    return restore_prefix(tag, kind) + bytes(index_key)


def decode_restore_entry_key(raw: Any) -> Tuple[int, int, bytes]:
    """``(tag, kind, index key)`` of a ``restore`` key. Raises RecordError."""
    k = bytes(raw) if raw is not None else b""
    if len(k) < TOKEN_BYTES + 1 or k[TOKEN_BYTES] not in RESTORE_KINDS \
            or (k[TOKEN_BYTES] == RESTORE_CLOSED) != (len(k) == TOKEN_BYTES + 1) \
            or (k[TOKEN_BYTES] != RESTORE_CLOSED and len(k) < TOKEN_BYTES + 10):
        raise RecordError(f"not a restore entry key: {k[:40]!r}")
    return int.from_bytes(k[:TOKEN_BYTES], "big"), k[TOKEN_BYTES], k[TOKEN_BYTES + 1:]


__all__ = ["UNIT_INDEX_FORMAT", "UNIT_INDEX_DBS", "META_FORMAT", "RecordError", "SegInfo", "encode_seg_info",
           "decode_seg_info", "seg_key", "decode_seg_key", "undo_prefix", "undo_key", "decode_undo_key",
           "encode_format", "decode_format", "RESTORE_STAGED", "RESTORE_PUBLISHED", "RESTORE_CLOSED",
           "RESTORE_KINDS", "restore_prefix", "restore_entry_key", "decode_restore_entry_key"]
