"""Dtype codes stored in frame headers and schemas (docs/FORMAT.md, "Dtype codes").

Codes are part of the on-disk format: never renumber, only append.
"""
from __future__ import annotations

from typing import Dict

import numpy as np
import torch

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

_TORCH_BY_NAME = {}
for _name in DTYPE_NAMES.values():
    _t = getattr(torch, _name, None)
    if isinstance(_t, torch.dtype):
        _TORCH_BY_NAME[_name] = _t
TORCH_TO_CODE = {t: NAME_TO_CODE[n] for n, t in _TORCH_BY_NAME.items()}
CODE_TO_TORCH = {NAME_TO_CODE[n]: t for n, t in _TORCH_BY_NAME.items()}

_NUMPY_NAMES = [
    "bool", "uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64",
    "complex64", "complex128", "uint16", "uint32", "uint64",
]
NUMPY_TO_CODE = {np.dtype(n): NAME_TO_CODE[n] for n in _NUMPY_NAMES}
CODE_TO_NUMPY = {NAME_TO_CODE[n]: np.dtype(n) for n in _NUMPY_NAMES}


def itemsize(code: int) -> int:
    """Bytes per element of dtype ``code``."""
    if code in CODE_TO_NUMPY:
        return CODE_TO_NUMPY[code].itemsize
    t = CODE_TO_TORCH.get(code)
    if t is None:
        raise KeyError(code)
    return torch.empty((), dtype=t).element_size()
