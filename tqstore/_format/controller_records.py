"""Keys and values of the controller's LMDB index, format version 1 (docs/FORMAT.md,
"Controller index"): the one definition of their bytes.

Every writer and reader of the controller index (the controller, its decoder, checkpoint
loading and verification, the CLI) encodes and decodes through these functions.  Bytes
in, objects out: no I/O, no LMDB.  Names are UTF-8, ``\\0`` separates the parts of a
composite key, a *gidx key* is a global index as u64 big-endian:

==========  ==================================  =====================================================
db          key                                 value
==========  ==================================  =====================================================
``meta``    ``format`` ``num_units``            ASCII decimal (:func:`encode_decimal`)
            ``next_gidx`` ``put_token``
``free``    gidx key (:func:`gidx_key`)         empty
``parts``   partition id (:func:`parts_key`)    :func:`encode_partition` (JSON, default separators)
``keys``    :func:`keys_key` (pid ``\\0`` key)   gidx key
``rows``    gidx key                            :func:`encode_row` (compact ASCII JSON)
``cons``    :func:`cons_key`                    empty
            (task ``\\0`` pid ``\\0`` gidx key)
``schema``  :func:`schema_key` (pid ``\\0`` f)   :func:`encode_schema` (JSON, default separators)
``sampler`` partition id                        :func:`encode_sampler` (JSON, default separators)
==========  ==================================  =====================================================

Every ``decode_*`` raises :class:`~tqstore._format.records.RecordError` (a ``ValueError``)
and nothing else for malformed input; callers name the file and entry in a
``CorruptionError``.  Consistency across entries (a row's partition exists, a key is
claimed once) is the caller's: these functions see one entry at a time.
"""
from __future__ import annotations

import json
from typing import Any, AbstractSet, Dict, Iterable, NamedTuple, Optional, Tuple

from .dtypes import DTYPE_NAMES, SCHEMA_MIXED
from .layout import KIND_VALUE, KINDS
from .records import (
    RecordError, decode_decimal, decode_json_object, decode_optional_decimal, decode_utf8, encode_decimal, is_uint,
    member,
)
from .values import dumps as _dumps_value

#: the controller index format version this code reads and writes (``meta/format``)
CONTROLLER_FORMAT = 1

#: the named databases of the controller index (``restores`` is reserved, never read)
CONTROLLER_DBS = ("meta", "free", "parts", "keys", "rows", "cons", "schema", "sampler", "restores")

#: keys of the ``meta`` database
META_FORMAT = b"format"
META_NUM_UNITS = b"num_units"
META_NEXT_GIDX = b"next_gidx"
META_PUT_TOKEN = b"put_token"

GIDX_BYTES = 8


# ---------------------------------------------------------------------------- keys
def gidx_key(gidx: int) -> bytes:
    """Key of ``rows`` and ``free``, value of ``keys``: the global index, u64 big-endian."""
    return gidx.to_bytes(GIDX_BYTES, "big")


def decode_gidx_key(raw: Any) -> int:
    """The global index of a gidx key. Raises RecordError unless it is 8 bytes."""
    if raw is None or len(raw) != GIDX_BYTES:
        raise RecordError(f"not a global index (8 bytes): {None if raw is None else bytes(raw)[:40]!r}")
    return int.from_bytes(raw, "big")


def parts_key(pid: str) -> bytes:
    """Key of ``parts`` and ``sampler``: the partition id (UTF-8)."""
    return pid.encode()


sampler_key = parts_key


def decode_parts_key(raw: Any) -> str:
    """The partition id of a ``parts`` or ``sampler`` key. Raises RecordError (not UTF-8)."""
    return decode_utf8(raw, "partition id")


def keys_key(pid: str, key: str) -> bytes:
    """Key of ``keys``: partition id ``\\0`` key."""
    return pid.encode() + b"\0" + key.encode()


def decode_keys_key(raw: Any) -> Tuple[str, str]:
    """``(partition id, key)`` of a ``keys`` key. Raises RecordError."""
    pid, sep, key = decode_utf8(raw, "keys key").partition("\0")
    if not sep or not pid:
        raise RecordError("not partition NUL key")
    return pid, key


def cons_prefix(task: str, pid: str) -> bytes:
    """The common head of the ``cons`` keys of ``(task, pid)``: task ``\\0`` pid ``\\0``."""
    return task.encode() + b"\0" + pid.encode() + b"\0"


def cons_key(task: str, pid: str, gidx: int) -> bytes:
    """Key of ``cons``: task ``\\0`` partition id ``\\0`` gidx key (the row was consumed)."""
    return cons_prefix(task, pid) + gidx.to_bytes(GIDX_BYTES, "big")


def decode_cons_key(raw: Any) -> Tuple[str, str, int]:
    """``(task, partition id, gidx)`` of a ``cons`` key. Raises RecordError."""
    k = bytes(raw) if raw is not None else b""
    task, sep, pid = decode_utf8(k[:-9], "consumption key").partition("\0")
    if len(k) < 11 or k[-9] != 0 or not sep or not task or not pid:
        raise RecordError("not task NUL partition NUL global index")
    return task, pid, int.from_bytes(k[-8:], "big")


def schema_key(pid: str, field: str) -> bytes:
    """Key of ``schema``: partition id ``\\0`` field name."""
    return (pid + "\0" + field).encode()


def decode_schema_key(raw: Any) -> Tuple[str, str]:
    """``(partition id, field)`` of a ``schema`` key. Raises RecordError."""
    pid, sep, field = decode_utf8(raw, "schema key").partition("\0")
    if not sep or not pid or not field:
        raise RecordError("not partition NUL field")
    return pid, field


# ---------------------------------------------------------------------------- meta values
# ASCII decimals: encode_decimal / decode_decimal / decode_optional_decimal (re-exported)


# ---------------------------------------------------------------------------- rows
class RowRecord(NamedTuple):
    """A ``rows`` value: partition id, key (None: unkeyed), tag (a JSON value; None: no
    tag), produced fields (sorted), partition-local sequence number."""

    pid: str
    key: Optional[str]
    tag: Any
    fields: Tuple[str, ...]
    seq: int


def encode_row(pid: str, key: Optional[str], tag: Any, fields: Iterable[str], seq: int) -> bytes:
    """A ``rows`` value: compact ASCII JSON ``{"p", "k", "t", "f" (sorted), "s"}``; ``tag`` is a
    checked value (:func:`tqstore._format.values.check_value`), integers of any size included."""
    return _dumps_value({"p": pid, "k": key, "t": tag, "f": sorted(fields), "s": seq}, ensure_ascii=True).encode()


def decode_row(raw: Any) -> RowRecord:
    """The :class:`RowRecord` of a ``rows`` value. Raises RecordError."""
    d = decode_json_object(raw, "row")
    p, k, t, f, s = (member(d, m, "row") for m in ("p", "k", "t", "f", "s"))
    if type(p) is not str or not (k is None or type(k) is str) or type(f) is not list \
            or not is_uint(s) or not all(type(x) is str for x in f):
        raise RecordError(f"row members of the wrong type: p {type(p).__name__}, k {type(k).__name__}, "
                          f"f {type(f).__name__}, s {type(s).__name__}")
    return RowRecord(p, k, t, tuple(f), s)


# ---------------------------------------------------------------------------- parts
def encode_partition(next_seq: int, meta: Optional[Dict[str, Any]] = None) -> bytes:
    """A ``parts`` value: JSON ``{"next_seq": int, "meta": {}}`` (default separators)."""
    return json.dumps({"next_seq": next_seq, "meta": {} if meta is None else meta}).encode()


def decode_partition(raw: Any) -> Tuple[int, Dict[str, Any]]:
    """``(next_seq, meta)`` of a ``parts`` value (``meta`` absent reads as ``{}``). Raises RecordError."""
    d = decode_json_object(raw, "partition")
    seq, meta = member(d, "next_seq", "partition"), d.get("meta", {})
    if not is_uint(seq) or not isinstance(meta, dict):
        raise RecordError("partition: next_seq must be an int >= 0 and meta an object")
    return seq, meta


# ---------------------------------------------------------------------------- schema
def encode_schema(kind: int, dtype: int) -> bytes:
    """A ``schema`` value: JSON ``{"kind": int, "dtype": int}`` (default separators)."""
    return json.dumps({"kind": kind, "dtype": dtype}).encode()


def decode_schema(raw: Any) -> Tuple[int, int]:
    """``(kind, dtype code)`` of a ``schema`` value, both known codes (``SCHEMA_MIXED`` for a tensor or
    ndarray field whose rows hold several dtypes). Raises RecordError."""
    d = decode_json_object(raw, "schema")
    kind, dt = member(d, "kind", "schema"), member(d, "dtype", "schema")
    mixed_ok = dt == SCHEMA_MIXED and kind != KIND_VALUE
    if type(kind) is not int or kind not in KINDS or type(dt) is not int or (dt not in DTYPE_NAMES and not mixed_ok):
        raise RecordError(f"schema: not a known kind and dtype ({kind!r}, {dt!r})")
    return kind, dt


# ---------------------------------------------------------------------------- sampler
def encode_sampler(state: Any) -> bytes:
    """A ``sampler`` value: the JSON of ``{"sampler": name, "state": {task: state}}`` (default
    separators, ASCII)."""
    return json.dumps(state).encode()


def decode_sampler(raw: Any) -> Dict[str, Any]:
    """A ``sampler`` value: a JSON object. Raises RecordError."""
    return decode_json_object(raw, "sampler state")


__all__ = [
    "CONTROLLER_FORMAT", "CONTROLLER_DBS", "META_FORMAT", "META_NUM_UNITS", "META_NEXT_GIDX", "META_PUT_TOKEN",
    "RecordError", "RowRecord",
    "gidx_key", "decode_gidx_key", "parts_key", "sampler_key", "decode_parts_key", "keys_key", "decode_keys_key",
    "cons_prefix", "cons_key", "decode_cons_key", "schema_key", "decode_schema_key",
    "encode_decimal", "decode_decimal", "decode_optional_decimal",
    "encode_row", "decode_row", "encode_partition", "decode_partition", "encode_schema", "decode_schema",
    "encode_sampler", "decode_sampler",
]
