"""What the LMDB record codecs share (docs/FORMAT.md, "Controller index" and "Unit index").

:mod:`tqstore._format.controller_records` and :mod:`tqstore._format.unit_records` encode
and decode every key and value the controller's and the units' LMDB indexes hold: bytes
in, objects out, no I/O.  Their decoders raise exactly one error type,
:class:`RecordError`, for any malformed input; the code that read the bytes (and knows
the file and the entry) turns it into :class:`~tqstore.errors.CorruptionError`.
"""
from __future__ import annotations

from typing import Any, Dict

from .values import loads as _loads_value

#: an ASCII decimal of the ``meta`` databases has at most this many digits (u64)
MAX_DECIMAL_DIGITS = 20


class RecordError(ValueError):
    """A key or value of an LMDB index is malformed (wrong length, not UTF-8, not the JSON
    the format says, a member of the wrong type).  Raised by every decoder of
    :mod:`~tqstore._format.controller_records` and :mod:`~tqstore._format.unit_records`, and
    by nothing else; callers add the file and the entry and raise ``CorruptionError``.

    A ``ValueError``, not a ``TqstoreError``: it never reaches a user as it is.
    """


def _bytes(raw: Any) -> bytes:
    if raw is None:
        raise RecordError("missing")
    try:
        return bytes(raw)
    except TypeError as e:
        raise RecordError(f"not bytes: {type(raw).__name__}") from None


def encode_decimal(n: int) -> bytes:
    """ASCII decimal of a non-negative integer (a ``meta`` value)."""
    return str(int(n)).encode("ascii")


def decode_decimal(raw: Any, least: int = 0) -> int:
    """A ``meta`` value: ASCII digits only, at most 20 of them, at least ``least``.

    Raises:
        RecordError: missing (None), empty, not digits, too long or below ``least``.
    """
    b = _bytes(raw)
    if not b.isdigit() or len(b) > MAX_DECIMAL_DIGITS or int(b) < least:
        raise RecordError(f"{b[:40]!r} is not an ASCII decimal integer >= {least}")
    return int(b)


def decode_optional_decimal(raw: Any, default: int = 0) -> int:
    """:func:`decode_decimal` of a value that may be absent (None gives ``default``)."""
    return default if raw is None else decode_decimal(raw)


def decode_json_object(raw: Any, what: str = "value") -> Dict[str, Any]:
    """A UTF-8 JSON object (integers of any size, ``NaN`` and infinities allowed).

    Raises:
        RecordError: not UTF-8, not JSON, nested too deep, or not an object.
    """
    b = _bytes(raw)
    try:
        d = _loads_value(b)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise RecordError(f"{what} is not UTF-8 JSON: {type(e).__name__}: {e}") from None
    if not isinstance(d, dict):
        raise RecordError(f"{what} is a JSON {type(d).__name__}, not an object")
    return d


def decode_utf8(raw: Any, what: str) -> str:
    """UTF-8 text of a key part. Raises RecordError when it is not UTF-8."""
    try:
        return _bytes(raw).decode("utf-8")
    except UnicodeDecodeError as e:
        raise RecordError(f"{what} is not UTF-8 ({e.reason} at byte {e.start})") from None


def member(d: Dict[str, Any], name: str, what: str) -> Any:
    """``d[name]``; RecordError naming ``what`` when it is missing."""
    try:
        return d[name]
    except KeyError:
        raise RecordError(f"{what} has no member {name!r}") from None


def is_uint(v: Any) -> bool:
    """True for a JSON integer >= 0 (bool is not an integer here)."""
    return type(v) is int and v >= 0


__all__ = ["RecordError", "MAX_DECIMAL_DIGITS", "encode_decimal", "decode_decimal", "decode_optional_decimal",
           "decode_json_object", "decode_utf8", "member", "is_uint"]
