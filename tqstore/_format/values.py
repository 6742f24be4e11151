"""Safe codec for non-tensor values: UTF-8 JSON (NaN and infinities allowed), never pickle.

Accepted: ``None``, ``bool``, ``int``, ``float`` (NaN and infinities included), ``str``,
``list``/``tuple`` (tuples come back as lists) and ``dict`` with ``str`` keys, nested.
Numpy scalars are stored as the matching Python number.  Anything else raises
:class:`~tqstore.errors.UnsupportedTypeError` before anything is written.
"""
from __future__ import annotations

import json
from typing import Any

import numpy as np

from ..errors import CorruptionError, UnsupportedTypeError

_MAX_DEPTH = 64


def check_value(value: Any, _depth: int = 0) -> Any:
    """Return ``value`` normalised for JSON (numpy scalars → Python) or raise.

    Raises:
        UnsupportedTypeError: for any type outside the accepted set, non-str dict keys,
            or nesting deeper than 64.
    """
    if _depth > _MAX_DEPTH:
        raise UnsupportedTypeError("non-tensor value nested deeper than 64 levels")
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value
    if isinstance(value, np.generic) and value.shape == ():
        return check_value(value.item(), _depth)
    if isinstance(value, (list, tuple)):
        return [check_value(v, _depth + 1) for v in value]
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise UnsupportedTypeError(
                    f"dict keys of non-tensor values must be str, got {type(k).__name__} key {k!r}"
                )
            out[k] = check_value(v, _depth + 1)
        return out
    raise UnsupportedTypeError(
        f"cannot store a value of type {type(value).__name__}: non-tensor fields accept "
        "str, int, float, bool, None and lists/dicts of these (tqstore never pickles)"
    )


def encode_value(value: Any) -> bytes:
    """Encode an accepted value to bytes. Raises UnsupportedTypeError for others."""
    return json.dumps(check_value(value), ensure_ascii=False, separators=(",", ":"), allow_nan=True).encode()


def decode_value(data, *, path: str = None, offset: int = None) -> Any:
    """Decode bytes made by :func:`encode_value`.

    Raises:
        CorruptionError: the bytes are not valid UTF-8 JSON.
    """
    try:
        return json.loads(bytes(data).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CorruptionError(f"undecodable non-tensor value: {e}", path=path, offset=offset) from e
