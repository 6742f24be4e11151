"""The argument checks the C kernels make (:mod:`tqstore._native._frames`), for their
pure-Python twins (:mod:`tqstore._native._pure`, :mod:`tqstore._native._pure_lmdb`): the
same exceptions for the same bad arguments."""
from __future__ import annotations

import operator

import numpy as np


def _uint(v, bits: int, what: str) -> int:
    """``operator.index(v)`` checked to fit an unsigned field of ``bits`` bits."""
    v = operator.index(v)
    if v < 0 or v >> bits:
        raise OverflowError(f"{what} must be in [0, 2**{bits}), got {v}")
    return v


def _contig(o, what: str, writable: bool = False) -> memoryview:
    mv = memoryview(o)
    if not mv.c_contiguous:
        raise BufferError(f"{what} is not C-contiguous")
    if writable and mv.readonly:
        raise TypeError(f"{what} must be a writable buffer")
    if not mv.nbytes:
        return memoryview(bytearray())
    return mv.cast("B") if mv.ndim != 1 or mv.format != "B" else mv


def _i64s(o, what: str) -> list:
    """The little-endian i64 values of the buffer ``o`` (ValueError: not a whole number of them)."""
    mv = _contig(o, what)
    if mv.nbytes % 8:
        raise ValueError(f"{what} must hold 8-byte integers")
    return np.frombuffer(mv, "<i8").tolist() if mv.nbytes else []
