"""The byte layout of records, unit index entries and segment headers, for the format
layer and everything above it (docs/FORMAT.md).

Defined in :mod:`tqstore._native.layout`, below both layers, because the record hot path
(``tqstore._native``) needs the same constants and must not import ``_format``
(tests/test_layers.py); this module only re-exports them.
"""
from __future__ import annotations

from .._native.layout import (
    FRAME_MAGIC,
    FRAME_END_MAGIC,
    FRAME_VERSION,
    ALIGN,
    PREFIX,
    PREFIX_SIZE,
    HEADER_HEAD,
    HEADER_HEAD_SIZE,
    TRAILER,
    TRAILER_SIZE,
    CODEC_MASK,
    CODEC_RAW,
    CODEC_ZSTD,
    KNOWN_FLAGS,
    KIND_TENSOR,
    KIND_NDARRAY,
    KIND_VALUE,
    KINDS,
    MAX_FIELD_BYTES,
    MAX_NDIM,
    INDEX_KEY_HEAD,
    INDEX_VALUE,
    align_up,
    payload_offset,
    frame_extent,
    SEGMENT_MAGIC,
    SEGMENT_VERSION,
    SEGMENT_HEADER,
    SEGMENT_HEADER_SIZE,
)

__all__ = [
    "FRAME_MAGIC",
    "FRAME_END_MAGIC",
    "FRAME_VERSION",
    "ALIGN",
    "PREFIX",
    "PREFIX_SIZE",
    "HEADER_HEAD",
    "HEADER_HEAD_SIZE",
    "TRAILER",
    "TRAILER_SIZE",
    "CODEC_MASK",
    "CODEC_RAW",
    "CODEC_ZSTD",
    "KNOWN_FLAGS",
    "KIND_TENSOR",
    "KIND_NDARRAY",
    "KIND_VALUE",
    "KINDS",
    "MAX_FIELD_BYTES",
    "MAX_NDIM",
    "INDEX_KEY_HEAD",
    "INDEX_VALUE",
    "align_up",
    "payload_offset",
    "frame_extent",
    "SEGMENT_MAGIC",
    "SEGMENT_VERSION",
    "SEGMENT_HEADER",
    "SEGMENT_HEADER_SIZE",
]
