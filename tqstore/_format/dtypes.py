"""Dtype codes stored in frame headers and schemas (docs/FORMAT.md, "Dtype codes").

Codes are part of the on-disk format: never renumber, only append.
"""
from __future__ import annotations

from typing import Dict

import numpy as np

# code -> (name, itemsize)
DTYPE_NAMES: Dict[int, str] = {
    0: "none",
    1: "bool",
    2: "uint8",
    3: "int8",
    4: "int16",
    5: "int32",
    6: "int64",
    7: "float16",
    8: "bfloat16",
    9: "float32",
    10: "float64",
    11: "complex64",
    12: "complex128",
    13: "uint16",
    14: "uint32",
    15: "uint64",
    16: "float8_e4m3fn",
    17: "float8_e5m2",
}
NAME_TO_CODE = {v: k for k, v in DTYPE_NAMES.items()}

#: the dtype code a controller ``schema`` record holds for a tensor or ndarray field whose rows in
#: the partition hold more than one dtype (put with ``strict_schema=False``); each row's dtype is in
#: its frame header.  Never a frame's dtype (so not in :data:`DTYPE_NAMES`).
SCHEMA_MIXED = 255

# bytes per element of every code (numpy lacks bfloat16 and the float8 types; the torch adapter
# maps codes to torch dtypes by name: tqstore.torch_adapter)
ITEMSIZE: Dict[int, int] = {
    1: 1, 2: 1, 3: 1, 4: 2, 5: 4, 6: 8, 7: 2, 8: 2, 9: 4, 10: 8, 11: 8, 12: 16, 13: 2, 14: 4, 15: 8, 16: 1, 17: 1,
}

_NUMPY_NAMES = [
    "bool", "uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64",
    "complex64", "complex128", "uint16", "uint32", "uint64",
]
NUMPY_TO_CODE = {np.dtype(n): NAME_TO_CODE[n] for n in _NUMPY_NAMES}
CODE_TO_NUMPY = {NAME_TO_CODE[n]: np.dtype(n) for n in _NUMPY_NAMES}


def itemsize(code: int) -> int:
    """Bytes per element of dtype ``code`` (KeyError for code 0 or an unknown code)."""
    return ITEMSIZE[code]
