"""The small files of a store directory (docs/FORMAT.md, "Store directory"): ``STORE.json``
(the store descriptor, version 1) and ``CURRENT`` (the name of the live state directory).

Bytes in, objects out; :mod:`tqstore.layout_dirs` reads and writes the files.
"""
from __future__ import annotations

import json
import time
from typing import Any, Dict, Optional

from ..errors import CorruptionError, FormatVersionError

STORE_FILE = "STORE.json"
CURRENT_FILE = "CURRENT"
STORE_FORMAT = "tqstore-store"
STORE_VERSION = 1
#: the most units a store may have (each an LMDB environment with its own files; a store
#: refuses more, and a descriptor naming more is damaged)
MAX_UNITS = 4096


def state_name(n: int) -> str:
    """The name of state directory ``n``: ``state-NNNNNNNN``."""
    return f"state-{n:08d}"


def parse_state_name(name: str) -> Optional[int]:
    """The number of a state directory name, or None for any other name."""
    if name.startswith("state-") and name[6:].isdigit():
        return int(name[6:])
    return None


def store_descriptor(num_units: int, created: Optional[float] = None) -> Dict[str, Any]:
    """The ``STORE.json`` object of a new store."""
    return {"format": STORE_FORMAT, "version": STORE_VERSION, "num_units": num_units,
            "created": time.time() if created is None else created}


def encode_store_descriptor(d: Dict[str, Any]) -> bytes:
    """``STORE.json``: ``json.dumps(..., indent=1)``."""
    return json.dumps(d, indent=1).encode()


def decode_store_descriptor(data: bytes, *, path: str) -> Dict[str, Any]:
    """The checked ``STORE.json`` object.

    Raises:
        CorruptionError: not UTF-8 JSON, not a store descriptor, ``num_units`` not an int in
            ``[1, MAX_UNITS]``, or
            ``created`` (when present) not a unix time.
        FormatVersionError: another version.
    """
    try:
        d = json.loads(data.decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as e:  # (nested too deeply: not ours)
        raise CorruptionError(f"unreadable {STORE_FILE}: {e}", path=path) from e
    if not isinstance(d, dict) or d.get("format") != STORE_FORMAT:
        raise CorruptionError(f"{STORE_FILE} is not a tqstore store descriptor", path=path)
    if d.get("version") != STORE_VERSION:
        raise FormatVersionError(f"store format version {d.get('version')} is not supported (reads "
                                 f"{STORE_VERSION})", path=path)
    n = d.get("num_units")
    if type(n) is not int or not 1 <= n <= MAX_UNITS:
        raise CorruptionError(f"{STORE_FILE} has num_units {n!r}, not a positive int (damaged descriptor: it must "
                              f"match the controller's unit count)", path=path)
    c = d.get("created")
    if c is not None and (type(c) not in (int, float) or not 0 <= c < _LATEST_CREATED):
        raise CorruptionError(f"{STORE_FILE} has created {c!r:.40}, not a unix time (damaged descriptor)", path=path)
    return d


_LATEST_CREATED = 2.0 ** 34  # (unix seconds, past the year 2500: a larger one is no creation time)


def encode_current(name: str) -> bytes:
    """``CURRENT``: the state directory's name and a newline."""
    return (name + "\n").encode()


def decode_current(data: bytes, *, path: str) -> str:
    """The state directory ``CURRENT`` names. Raises CorruptionError."""
    try:
        name = data.decode("utf-8").strip()
    except UnicodeDecodeError as e:
        raise CorruptionError(f"unreadable {CURRENT_FILE} (not UTF-8): {e}", path=path) from e
    if parse_state_name(name) is None:
        raise CorruptionError(f"{CURRENT_FILE} names {name!r}, not a state directory", path=path)
    return name
