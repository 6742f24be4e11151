"""Advice to the kernel about large output buffers (best effort, Linux only).

A get allocates its output and the kernel then fills it page by page.  With 4 KiB pages
that first touch costs more than the copy itself (one fault per page); transparent huge
pages cut the faults 512-fold.  Linux often enables them only for memory that asks
(``madvise`` mode); numpy asks for its large arrays, torch does not, so a get asks for
the outputs it allocates before writing to them.  Failure is harmless and ignored.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import sys

import numpy as np

MADV_HUGEPAGE = 14
HUGE_PAGE = 2 << 20

_madvise = None
if sys.platform.startswith("linux"):
    try:
        _libc = ctypes.CDLL(None, use_errno=True)
        _madvise = _libc.madvise
        _madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        _madvise.restype = ctypes.c_int
    except (OSError, AttributeError):  # pragma: no cover - exotic libc
        _madvise = None


def advise_hugepages(buf: np.ndarray) -> bool:
    """Ask for transparent huge pages over the whole 2 MiB pages inside ``buf`` (an array
    not yet written to).  Returns True if the advice was taken."""
    if _madvise is None or buf.nbytes < 2 * HUGE_PAGE:
        return False
    addr = buf.__array_interface__["data"][0]
    start = (addr + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1)
    end = (addr + buf.nbytes) & ~(HUGE_PAGE - 1)
    return end > start and _madvise(start, end - start, MADV_HUGEPAGE) == 0
