"""Record hot path: the compiled ``_frames`` extension, or the pure-Python fallback.

The choice is made once at import: the extension when it imports and ``TQSTORE_PURE``
is not set to ``1``; otherwise ``_pure``.  Both expose the same stateless functions:
``crc32c``, ``build_header``, ``frame_head``, ``frame_tail``, ``encode_frames``, ``encode_rows``
(``encode_frames`` of rows of one contiguous batch),
``check_frames`` (the frame-check kernel: per-frame ``FRAME_*`` status codes, in
``layout``), ``gather_frames`` (the same checks against a head template, copying the
payloads; the same codes), ``copy_ranges``, ``restamp_frames``, ``crc32c_frames`` (the
CRC32C of checked frames back to back, from their trailers' CRCs), ``pread_ranges`` (byte
ranges of an open file read into one buffer without the GIL: reads only), ``pwrite_ranges``
(byte ranges of a buffer written back to back into an open file without the GIL), ``leaf_room``
and ``leaf_columns`` (the entries of an LMDB database's leaf pages, every page and node
checked, keys and inline values copied into the caller's arrays without the GIL;
``leaf_room`` sizes them; ``_format.lmdb_pages`` walks the branch levels to the leaves),
``place_keys`` (the keys of a controller index's ``keys`` entries decoded into a list),
and the name ``IMPLEMENTATION`` (``"native"`` or ``"pure"``).  The byte layout they
implement is in ``layout`` (that of LMDB's pages in ``_format.lmdb_pages``).  This package
is the bottom of the record path: it imports nothing from the rest of tqstore (``_format``
builds on it; tests/test_layers.py).
"""
from __future__ import annotations

import logging
import os

from . import _pure

_log = logging.getLogger("tqstore")


def _load():
    if os.environ.get("TQSTORE_PURE", "") == "1":
        return _pure
    try:
        from . import _frames  # type: ignore[attr-defined]
    except ImportError:  # pragma: no cover - depends on the build
        _log.debug("tqstore native extension not built; using the pure-Python record path")
        return _pure
    return _frames


impl = _load()
IMPLEMENTATION: str = impl.IMPLEMENTATION
crc32c = impl.crc32c
build_header = impl.build_header
frame_head = impl.frame_head
frame_tail = impl.frame_tail
encode_frames = impl.encode_frames
encode_rows = impl.encode_rows
check_frames = impl.check_frames
gather_frames = impl.gather_frames
copy_ranges = impl.copy_ranges
restamp_frames = impl.restamp_frames
crc32c_frames = impl.crc32c_frames
pread_ranges = impl.pread_ranges
pwrite_ranges = impl.pwrite_ranges
leaf_room = impl.leaf_room
leaf_columns = impl.leaf_columns
place_keys = impl.place_keys

__all__ = [
    "IMPLEMENTATION",
    "crc32c",
    "build_header",
    "frame_head",
    "frame_tail",
    "encode_frames",
    "encode_rows",
    "check_frames",
    "gather_frames",
    "copy_ranges",
    "restamp_frames",
    "crc32c_frames",
    "pread_ranges",
    "pwrite_ranges",
    "leaf_room",
    "leaf_columns",
    "place_keys",
    "impl",
]
