"""Limits on the names and keys that go into LMDB keys (docs/FORMAT.md, "Name and key limits").

LMDB keys are at most 511 bytes (py-lmdb's ``Environment.max_key_size()``).  The longest
keys the controller builds are (``\\0`` one byte, a global index 8 bytes)::

    keys    partition id ‖ \\0 ‖ key
    cons    task name ‖ \\0 ‖ partition id ‖ \\0 ‖ global index
    schema  partition id ‖ \\0 ‖ field name
    parts, sampler   partition id

and a unit index's longest is ``undo``: token (8) ‖ global index (8) ‖ field name.  So,
counting UTF-8 bytes: partition ids and task names at most 250 (``cons``: 250 + 1 + 250
+ 1 + 8 = 510), field names at most 255 (the frame header stores their length in one
byte; ``schema``: 250 + 1 + 255 = 506), and a key at most 510 minus its partition id's
bytes (``keys``), so at least 260.  Every name and key is valid Unicode (no lone
surrogates) without NUL (NUL separates the parts of composite keys).  Checked before
anything is written; a violation raises :class:`~tqstore.errors.InvalidInputError`.
"""
from __future__ import annotations

import numbers
import operator
from typing import Any, Optional

from ..errors import ConfigError, InvalidInputError

LMDB_MAX_KEY_BYTES = 511
MAX_NAME_BYTES = 250    # partition ids and task names
MAX_FIELD_BYTES = 255   # field names
MIN_KEY_BYTES = LMDB_MAX_KEY_BYTES - 1 - MAX_NAME_BYTES  # 260: fits with any partition id


def utf8(what: str, value: str) -> bytes:
    """``value`` as UTF-8; InvalidInputError (naming ``what``) for lone surrogates."""
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidInputError(f"{what} {value[:40]!r} is not valid Unicode ({e.reason} at position {e.start}); "
                                f"names and keys are stored as UTF-8") from None


def _check(what: str, value: Any, limit: int, *, empty_ok: bool = False, why: str = "") -> int:
    if not isinstance(value, str) or (not value and not empty_ok):
        raise InvalidInputError(f"{what} must be a {'' if empty_ok else 'non-empty '}str, got "
                                f"{type(value).__name__} {value!r}")
    if "\0" in value:
        raise InvalidInputError(f"{what} {value!r} contains a NUL character (NUL separates the parts of index "
                                f"keys)")
    n = len(value) if value.isascii() else len(utf8(what, value))
    if n > limit:
        raise InvalidInputError(f"{what} {value[:40]!r}... has {n} UTF-8 bytes, more than the {limit} allowed{why} "
                                f"(LMDB index keys hold at most {LMDB_MAX_KEY_BYTES} bytes); use a shorter one, or a "
                                f"hash of it")
    return n


def check_name(what: str, value: Any) -> None:
    """A partition id or task name: non-empty str, no NUL, valid Unicode, at most 250 UTF-8 bytes.

    Raises:
        InvalidInputError: otherwise.
    """
    _check(what, value, MAX_NAME_BYTES)


def check_field_name(value: Any) -> None:
    """A field name: non-empty str, no NUL, valid Unicode, at most 255 UTF-8 bytes.

    Raises:
        InvalidInputError: otherwise.
    """
    _check("field name", value, MAX_FIELD_BYTES)


def max_key_bytes(partition_id: str) -> int:
    """UTF-8 bytes a key of ``partition_id`` may have: 510 minus the partition id's."""
    return LMDB_MAX_KEY_BYTES - 1 - len(partition_id.encode("utf-8"))


def check_key(partition_id: str, key: Any) -> None:
    """A key of ``partition_id`` (already checked): str, no NUL, valid Unicode, at most
    :func:`max_key_bytes` UTF-8 bytes.

    Raises:
        InvalidInputError: otherwise.
    """
    _check("key", key, max_key_bytes(partition_id), empty_ok=True,
           why=f" in partition {partition_id[:40]!r} (510 minus the partition id's UTF-8 bytes)")


def is_bool(value: Any) -> bool:
    """Whether ``value`` is a bool or a ``numpy.bool_`` (which ``operator.index`` and ``float``
    would take as 0 or 1)."""
    t = type(value)
    return t is bool or (t.__module__ == "numpy" and t.__name__ in ("bool", "bool_"))


def check_flag(what: str, value: Any) -> bool:
    """``value`` as a bool when it is one (``bool`` or ``numpy.bool_``); raises
    InvalidInputError naming ``what`` for anything else (``None``, ``0``, ``"no"``: a
    switch is never guessed from a truthy value)."""
    if is_bool(value):
        return bool(value)
    raise InvalidInputError(f"{what} must be True or False, got {value!r}")


def as_int(value: Any) -> Optional[int]:
    """``value`` as an int when it is an integer (an int, a numpy integer, a one-element
    integer tensor: what ``operator.index`` takes) and not a bool; else None."""
    if is_bool(value):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def check_int_option(name: str, value: Any, least: int, most: Optional[int] = None, *,
                     optional: bool = True) -> Optional[int]:
    """A store option that must be an int (a numpy integer too; not a bool) in
    ``[least, most]`` (None allowed when ``optional``); returns it as an int.

    Raises ConfigError naming the option, before anything is opened or written."""
    if value is None and optional:
        return None
    v = as_int(value)
    if v is None:
        raise ConfigError(f"{name} must be an int, got {value!r:.80}")
    if v < least or (most is not None and v > most):
        bound = f"between {least} and {most}" if most is not None else f"at least {least}"
        raise ConfigError(f"{name} must be {bound}, got {v}")
    return v


def check_fraction(what: str, value: Any) -> float:
    """An argument that is a real number in (0, 1] (an int, a float, a Fraction or Decimal,
    a numpy scalar, a one-element tensor: what ``float()`` takes; not a bool, a string, a
    complex number or NaN); returns it as a float.  Raises InvalidInputError naming it."""
    v = None
    if not (is_bool(value) or isinstance(value, (str, bytes, bytearray))
            or (isinstance(value, numbers.Complex) and not isinstance(value, numbers.Real))):
        try:
            v = float(value)
        except (TypeError, ValueError, OverflowError):  # (not a number; an int past the float range)
            v = None
    if v is None or not 0.0 < v <= 1.0:  # (NaN fails both)
        raise InvalidInputError(f"{what} must be a number in (0, 1], got {value!r:.80}")
    return v


def check_bool_option(name: str, value: Any) -> bool:
    """A store option that is a switch: a bool (``numpy.bool_`` too), 0 or 1, or the strings
    "true"/"false" in any case (what a config file or an environment variable gives); returns
    it as a bool.  Raises ConfigError naming the option for anything else (``bool("false")``
    is True, ``None`` is not "off")."""
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    if is_bool(value):
        return bool(value)
    v = as_int(value)
    if v in (0, 1):
        return bool(v)
    raise ConfigError(f"{name} must be true or false, got {value!r:.80}")


__all__ = ["as_int", "check_int_option", "check_bool_option", "LMDB_MAX_KEY_BYTES", "MAX_NAME_BYTES", "MAX_FIELD_BYTES", "MIN_KEY_BYTES", "check_name",
           "check_field_name", "check_key", "max_key_bytes", "check_flag"]

