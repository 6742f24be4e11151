"""Sweeping the failpoints of the I/O layer over a call: each occurrence of a failpoint
failed in turn (``tests/test_failpoints.py``, ``tests/test_failpoints_dump.py``)."""
from __future__ import annotations

import errno
import os
from typing import Callable

from tqstore import TqstoreError
from tqstore._io import failpoints as fp

#: every failpoint of a durable step (the I/O layer's writes, syncs and directory changes)
FAULT_NAMES = ("fsync_file", "fsync_dir", "write", "create", "copy", "link", "rename", "mkdir", "rmtree", "unlink")


def fail_each_occurrence(name: str, action: str, call: Callable[[], object],
                         check: Callable[[BaseException, int], None]) -> int:
    """Fail occurrence 1, 2, ... of failpoint ``name`` in ``call()`` until one is not reached
    (the call then succeeds); ``check(exc, n)`` runs after each failure, the failpoint
    disarmed.  Returns the failures.  Anything but a TqstoreError fails the test."""
    for n in range(1, 1000):
        fp.arm(name, action, n)
        try:
            call()
        except TqstoreError as e:
            fp.disarm()
            check(e, n)
            continue
        finally:
            fp.disarm()
        return n - 1
    raise AssertionError("never got through")


def names_the_fault(e: BaseException, action: str) -> bool:
    """Whether the error's message carries the injected fault (its text or its strerror)."""
    msg = str(e)
    return "injected" in msg or os.strerror(errno.EIO if action == "eio" else errno.ENOSPC) in msg
