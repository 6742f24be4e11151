"""The values of the selective-restore operations of the ports (re-exported by
:mod:`tqstore.ports`): :class:`RestoreInfo` (what the controller records of a restore),
:class:`RestoreImport` (what one unit imports) and :func:`check_no_restore` (the guard of
dumps and full checkpoints).  Plain values: they cross a process boundary by pickle."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

@dataclass(frozen=True)
class RestoreInfo:
    """A selective restore as the controller records it (a value).  ``state`` "running"
    (units importing), "committed" or "cancelled" (decided; units still settling);
    ``units[u]`` "pending", "claimed" or "complete", ``attempts[u]`` the unit's claim count.
    ``keys``/``gidxs``/``srcs`` (the key -> store gidx mapping, and each key's gidx in the
    dump) are filled by :meth:`ControllerPort.restore` and :meth:`ControllerPort.begin_restore`,
    None in :meth:`ControllerPort.restores` summaries; ``new_keys`` (the rows the restore
    creates: as many as the indexes it reserved) always."""

    rid: str
    tag: int
    pid: str
    dump: str
    state: str
    units: Tuple[str, ...]
    attempts: Tuple[int, ...]
    rows: int
    keys: Optional[Tuple[str, ...]] = None
    gidxs: Optional[Tuple[int, ...]] = None
    srcs: Optional[Tuple[int, ...]] = None
    new_keys: Optional[int] = None

    def pending_error(self, refused: str) -> Any:
        """The :class:`~tqstore.errors.RestorePendingError` for a call this restore blocks:
        which units are pending, running (claimed) or complete, and what to do (wait for a load
        still running; recover_data_load for one that failed or died; a decided
        restore, committed or cancelled, whose units are not all settled: that it is decided,
        and that recover_data_load settles it)."""
        from .errors import RestorePendingError

        if self.state != "running":  # decided; its units' bookkeeping is left to settle
            done = "its rows are in place" if self.state == "committed" else "the store is as before the load"
            return RestorePendingError(
                f"{refused} refused: partition {self.pid!r} has a restore {self.rid} from dump {self.dump!r} that "
                f"is {self.state} ({done}) but whose units are not all settled; call "
                f"recover_data_load({self.dump!r}) to settle it (reopening the store does too)", rid=self.rid)
        by = {s: [u for u, x in enumerate(self.units) if x == s] for s in ("pending", "claimed", "complete")}
        what = "units pending %s, running %s, complete %s" % (by["pending"], by["claimed"], by["complete"])
        return RestorePendingError(
            f"{refused} refused: partition {self.pid!r} has an unresolved restore {self.rid} from dump "
            f"{self.dump!r} ({what}); if a load_data_by_key of it is still running, retry once it has "
            f"returned; if it failed or its process died, call recover_data_load({self.dump!r}) to complete it, "
            f"or recover_data_load({self.dump!r}, cancel=True) to cancel it", rid=self.rid)


@dataclass
class RestoreImport:
    """What one unit imports for a selective restore (planned by the loader): frames at byte
    ranges of files under ``src_dir`` (``files``: file number -> path relative to ``src_dir``,
    ``file_sizes`` their sizes), one per array position: ``file``, ``offset``, ``length``,
    ``crc`` (the CRC32C the dump recorded), ``src_gidx`` (the gidx in the frame's header),
    ``gidx`` (the store's: re-stamped when it differs) and ``fields`` (UTF-8 names).
    ``batch_bytes`` bounds the bytes the unit reads, checks and appends at a time.
    ``schemas``: field name (UTF-8) -> (kind code, dtype code) the dump declares; each frame's
    header must agree (dtype code 255, "mixed": any dtype of that kind)."""

    src_dir: str
    files: Dict[int, str]
    file_sizes: Dict[int, int]
    file: np.ndarray
    offset: np.ndarray
    length: np.ndarray
    crc: np.ndarray
    src_gidx: np.ndarray
    gidx: np.ndarray
    fields: List[bytes]
    batch_bytes: int = 32 << 20
    schemas: Dict[bytes, Tuple[int, int]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.fields)


def check_no_restore(controller: Any, pid: Optional[str], refused: str) -> None:
    """Raise the RestorePendingError of the first unresolved restore (of ``pid``, or of any
    partition when None): the guard of dumps of a partition and of full checkpoint saves
    and loads."""
    pending = controller.restores(pid)
    if pending:
        raise pending[0].pending_error(refused)


__all__ = ["RestoreInfo", "RestoreImport", "check_no_restore"]
