"""Reads that never return the payload of a row removed (or removed and reused) meanwhile.

A read asks the controller which rows exist (one answer), then reads their payload from the
units, without the store's write lock (reads do not wait for puts).  A clear removes the
rows from the controller first and then their entries from the units, and the freed global
indexes may go to new rows right after.  So a read racing a clear could find a payload
gone (and report the store inconsistent) or, worse, read a new row's payload under an old
row's global index.

:class:`RemovalGuard` is a sequence lock around removals: the count is odd while a removal
is between its controller step and its unit step, and each removal adds two.  A read runs
its attempt (controller answer, then unit read) and keeps the result only if no removal
began or was running meanwhile; otherwise it tries again (the controller now says what is
gone: ``KeyNotFoundError``), and the last try holds the write lock, which removals need, so
a read always ends.  A read's result is therefore the rows' payload as of a moment when the
controller's answer held.

A load by key marks the window from its units' publish to the controller's commit point
(or to the units' unpublish, when the commit fails) as a removal too (tqstore.dump.restore):
a read racing it tries again and then waits for the write lock, so it never returns a
restored payload that is not committed (and may never be).

A checkpoint load (:func:`tqstore.state_switch.install_state`) marks its switch, from closing
the replaced state's units and controller to the data plane's use of the new ones, as a
removal too: a read whose controller answer came from the replaced state tries again (a
unit closed under it raises ``StoreClosedError``, which counts as overlapped), so it never
returns a loaded row's payload under a replaced row's global index.

Puts that overwrite fields are not removals: as documented (docs/FORMAT.md, "Undo
records"), a read racing an overwriting put may see new values on some units and old ones
on others.

Segment files go without the readers' knowledge too: a unit deletes a segment once none of
its frames is live (after a clear or an overwrite) and compaction deletes the segments it
emptied, so a read that resolved a frame's location just before may find its file gone, or
(segment ids are reused) another file of that name.  The unit reports that as damage
(``CorruptionError``); an attempt without the lock that raises it is therefore tried again
under the write lock, which every such removal needs: an error that repeats there is real
damage and is raised.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Callable, ContextManager, Iterator, TypeVar

from .errors import CorruptionError, FieldNotFoundError, StoreClosedError

T = TypeVar("T")

ATTEMPTS_WITHOUT_LOCK = 3


class RemovalGuard:
    """The store's removal count (a sequence lock: odd while a removal runs).

    Writers (``Store.delete_rows`` / ``drop_partition``) hold the store's write lock and wrap
    the controller's removal and the units' with :meth:`removing`; readers call :meth:`stable`.
    """

    def __init__(self) -> None:
        self._count = 0
        self._mutex = threading.Lock()

    @property
    def count(self) -> int:
        """The number of removal steps begun or ended (odd while one runs)."""
        return self._count

    @contextmanager
    def removing(self) -> Iterator[None]:
        """Mark a removal (controller step, then unit step) as running for the ``with`` body."""
        with self._mutex:
            self._count += 1
        try:
            yield
        finally:
            with self._mutex:
                self._count += 1

    def stable(self, attempt: Callable[[], T], write_lock: ContextManager[Any]) -> T:
        """``attempt()`` (a controller answer, then the unit read it allows), run until no
        removal overlapped it; the last try under ``write_lock`` (removals take it).

        Raises what ``attempt`` raises: ``KeyNotFoundError`` / ``PartitionNotFoundError`` when
        the controller says the rows are gone; ``FieldNotFoundError`` for a missing payload
        (``StoreClosedError`` for a closed unit) only if no removal overlapped the read;
        ``CorruptionError`` only from the try under the lock (see the module docstring).
        """
        for _ in range(ATTEMPTS_WITHOUT_LOCK):
            before = self._count
            if before & 1:  # a removal is between its two steps: try again after it
                with write_lock:
                    pass
                continue
            try:
                out = attempt()
            except (FieldNotFoundError, StoreClosedError):  # (closed units: a checkpoint load switched them)
                if self._count == before:
                    raise
                continue
            except CorruptionError:  # a segment deleted under the read, or damage: the locked try tells
                break
            if self._count == before:
                return out
        with write_lock:
            return attempt()


__all__ = ["RemovalGuard"]
