"""Safe codec for non-tensor values: UTF-8 JSON (NaN and infinities allowed), never pickle.

Accepted: ``None``, ``bool``, ``int`` (any size), ``float`` (NaN and infinities included),
``str`` (valid Unicode: no lone surrogates), ``list``/``tuple`` (tuples come back as
lists) and ``dict`` with ``str`` keys, nested.  Numpy scalars are stored as the matching
Python number.  ``bytes`` (also ``numpy.bytes_``, ``bytearray``) is accepted as a whole
row value: its payload is a ``0x00`` byte and the bytes themselves (no JSON text starts
with ``0x00``, so the two forms never collide; docs/FORMAT.md "Non-tensor values").
Anything else raises :class:`~tqstore.errors.UnsupportedTypeError` (a
string that is not valid Unicode :class:`~tqstore.errors.InvalidInputError`) before
anything is written.

Integers of any size: Python refuses to convert integers of more than
``sys.get_int_max_str_digits()`` (default 4300) decimal digits to or from text, so
:func:`dumps` and :func:`loads` fall back to a slower path that converts such integers in
pieces when the fast ``json`` path refuses them.  The bytes are plain JSON numbers either
way.
"""
from __future__ import annotations

import json
import json.scanner
from itertools import repeat
from typing import Any, Callable, List, Optional, Sequence

import numpy as np

from ..errors import CorruptionError, InvalidInputError, UnsupportedTypeError

_MAX_DEPTH = 64
# pieces of at most this many digits convert under any int_max_str_digits (its minimum is 640)
_PIECE_DIGITS = 600
_PIECE_BITS = 1900  # < 600 · log2(10): an int of fewer bits has fewer than 600 digits


def check_str(s: str, what: str = "a string") -> str:
    """``s`` if it encodes to UTF-8 (no lone surrogates); raises InvalidInputError naming ``what``."""
    if not s.isascii():
        try:
            s.encode("utf-8")
        except UnicodeEncodeError as e:
            raise InvalidInputError(f"{what} {s[:40]!r} is not valid Unicode ({e.reason} at position {e.start}); "
                                    f"tqstore stores text as UTF-8") from None
    return s


def check_value(value: Any, _depth: int = 0, *, tag: bool = False) -> Any:
    """Return ``value`` normalised for JSON (numpy scalars → Python) or raise (``tag``: the
    value is a row's tag, which holds no bytes at all: the messages say so).

    Raises:
        UnsupportedTypeError: for any type outside the accepted set, non-str dict keys,
            or nesting deeper than 64.
        InvalidInputError: a string (or dict key) with a lone surrogate.
    """
    if _depth > _MAX_DEPTH:
        raise UnsupportedTypeError("non-tensor value nested deeper than 64 levels")
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return check_str(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value
    if isinstance(value, np.generic) and value.shape == () and not isinstance(value, np.void):
        return check_value(value.item(), _depth, tag=tag)
    if isinstance(value, (list, tuple)):
        return [check_value(v, _depth + 1, tag=tag) for v in value]
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise UnsupportedTypeError(
                    f"dict keys of non-tensor values must be str, got {type(k).__name__} key {k!r}"
                )
            out[check_str(k, "a dict key")] = check_value(v, _depth + 1, tag=tag)
        return out
    if tag:
        raise UnsupportedTypeError(
            f"cannot store a value of type {type(value).__name__} in a tag: a tag holds str, int, float, bool, None "
            f"and lists/dicts of these (no bytes, tensors or arrays: put those in a field)")
    if isinstance(value, (bytes, bytearray)):
        raise UnsupportedTypeError("bytes are stored as a whole row value only, not inside a list or dict "
                                   "(tqstore never pickles); store them in a field of their own")
    raise UnsupportedTypeError(
        f"cannot store a value of type {type(value).__name__}: non-tensor fields accept "
        "str, int, float, bool, None, bytes (a whole row) and lists/dicts of these (tqstore never pickles)"
    )


# ------------------------------------------------------------------ integers of any size
def _int_text(n: int) -> str:
    """Decimal text of ``n``, in pieces small enough for any int_max_str_digits."""
    if n < 0:
        return "-" + _int_text(-n)
    if n.bit_length() < _PIECE_BITS:
        return str(n)
    k = max(1, int(n.bit_length() * 0.30103) // 2)  # about half the digits
    hi, lo = divmod(n, 10 ** k)
    return _int_text(hi) + _int_text(lo).zfill(k)


def _parse_int(s: str) -> int:
    """``int(s)`` for a JSON integer of any length."""
    if len(s) <= _PIECE_DIGITS:
        return int(s)
    if s[0] == "-":
        return -_parse_int(s[1:])
    k = len(s) // 2
    return _parse_int(s[:-k]) * 10 ** k + int(_parse_int(s[-k:]))


def _dumps_slow(v: Any, ensure_ascii: bool) -> str:
    """JSON text of a checked value, writing integers through :func:`_int_text`."""
    if isinstance(v, bool) or v is None or isinstance(v, (str, float)):
        return json.dumps(v, ensure_ascii=ensure_ascii, allow_nan=True)
    if isinstance(v, int):
        return _int_text(v)
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_dumps_slow(x, ensure_ascii) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ",".join(json.dumps(str(k), ensure_ascii=ensure_ascii) + ":" + _dumps_slow(x, ensure_ascii)
                              for k, x in v.items()) + "}"
    raise UnsupportedTypeError(f"cannot store a value of type {type(v).__name__}")  # pragma: no cover


_COMPACT = json.JSONEncoder(separators=(",", ":"), allow_nan=True, ensure_ascii=False).encode
_COMPACT_ASCII = json.JSONEncoder(separators=(",", ":"), allow_nan=True).encode


def dumps(value: Any, *, ensure_ascii: bool = False) -> str:
    """Compact JSON text (separators ``,`` ``:``) of an already checked value; integers of
    any size are written in full."""
    enc: Callable[[Any], str] = _COMPACT_ASCII if ensure_ascii else _COMPACT
    try:
        return enc(value)
    except ValueError:  # an integer past sys.get_int_max_str_digits()
        return _dumps_slow(value, ensure_ascii)


def _no_default(o: Any) -> Any:
    raise TypeError(f"not a checked value: {type(o).__name__}")


def _bulk_encoder(ensure_ascii: bool) -> Optional[Callable[[Any, int], Any]]:
    """One C encoder made once (``json.dumps`` makes one per call), or None when this Python's
    ``c_make_encoder`` takes other arguments or writes other text than :func:`dumps`."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return None
    esc = json.encoder.encode_basestring_ascii if ensure_ascii else json.encoder.encode_basestring
    try:
        enc = make(None, _no_default, esc, None, ":", ",", False, False, True)
        probe = [{"a": [1, -2.5, float("nan"), float("-inf"), None, True, "\u00e9\n"]}, "x", 3, {}]
        ok = "".join(enc(probe, 0)) == dumps(probe, ensure_ascii=ensure_ascii)
    except (TypeError, ValueError):
        return None
    return enc if ok else None


_BULK = {False: _bulk_encoder(False), True: _bulk_encoder(True)}


def dumps_each(values: Sequence[Any], *, ensure_ascii: bool = False) -> List[str]:
    """:func:`dumps` of each of ``values`` (checked values), in bulk: one C encoder for them
    all; any value it cannot write (an integer past the digit limit) sends every value through
    :func:`dumps` instead, so the text is always :func:`dumps`'s."""
    enc = _BULK[bool(ensure_ascii)]
    if enc is not None:
        try:
            return list(map("".join, map(enc, values, repeat(0, len(values)))))
        except (ValueError, TypeError, RecursionError):
            pass
    return [dumps(v, ensure_ascii=ensure_ascii) for v in values]


def loads(data) -> Any:
    """Parse JSON text or UTF-8 bytes written by :func:`dumps` (integers of any size).

    Raises:
        UnicodeDecodeError, json.JSONDecodeError, ValueError: not UTF-8 JSON, or nested too
            deeply for the parser (no value tqstore writes is).
    """
    text = data if isinstance(data, str) else bytes(data).decode("utf-8")
    try:
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            raise
        except ValueError:  # an integer past sys.get_int_max_str_digits()
            return json.loads(text, parse_int=_parse_int)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


_SCAN = json.scanner.make_scanner(json.JSONDecoder())  # C: (value, end) of the JSON value at an index


def loads_each(raws: Sequence[bytes]) -> Optional[List[Any]]:
    """Each of ``raws`` parsed as one compact ASCII JSON value filling its bytes exactly (not
    null), in bulk: one ASCII decode of them all, then the C scanner on each (no per-item
    Python frame).  None when any is not of that shape (non-ASCII, leading or trailing
    bytes, not JSON, null, an integer past the digit limit): the caller then parses each with
    :func:`loads` to accept what it accepts or to name the bad one."""
    m = len(raws)
    if not m:
        return []
    lens = np.fromiter(map(len, raws), dtype=np.int64, count=m)
    try:
        text = b"".join(raws).decode("ascii")
        ends = np.cumsum(lens)
        parsed = list(map(_SCAN, map(text.__getitem__, map(slice, (ends - lens).tolist(), ends.tolist())),
                          repeat(0, m)))
    except (StopIteration, ValueError, RecursionError):
        return None
    if len(parsed) != m:  # the scanner's StopIteration (no value at 0) ends map() early, silently
        return None
    values, stops = zip(*parsed)
    if not np.array_equal(np.asarray(stops, dtype=np.int64), lens) or None in values:
        return None
    return list(values)


BYTES_PREFIX = b"\x00"  # a row value that is raw bytes, not JSON


def encode_value(value: Any) -> bytes:
    """Encode an accepted value to bytes. Raises UnsupportedTypeError / InvalidInputError for others."""
    if isinstance(value, (bytes, bytearray)):
        return BYTES_PREFIX + bytes(value)
    return dumps(check_value(value)).encode("utf-8")


def decode_value(data, *, path: str = None, offset: int = None) -> Any:
    """Decode bytes made by :func:`encode_value`.

    Raises:
        CorruptionError: the bytes are not valid UTF-8 JSON.
    """
    if len(data) and memoryview(data).cast("B")[0] == 0:
        return bytes(memoryview(data)[1:])
    try:
        return loads(data)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise CorruptionError(f"undecodable non-tensor value: {e}", path=path, offset=offset) from e
