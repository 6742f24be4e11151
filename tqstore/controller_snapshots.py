"""The controller's side of MVCC cuts and checkpoints (:class:`~tqstore.ports.ControllerPort`:
``snapshot``, ``release``, ``export_snapshot``, ``snapshot_rows``, ``stage_import``,
``sync_staged``, ``seq_high``, ``raise_seq_floor``), a mixin of :class:`~tqstore.controller.Controller`.

A snapshot is an LMDB read transaction opened under the controller's lock: it sees the
index as of that instant whatever commits after it, until :meth:`SnapshotCalls.release`
(or the controller's close) ends it.  The export writes a compacted copy of the index as
of a snapshot (:func:`tqstore.controller_export.export_controller`); the import stages a
checkpoint's copy beside the live index and never touches the live one
(:func:`tqstore.controller_export.stage_controller`).
"""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Dict, Optional, Sequence

from ._format import controller_records as R
from ._io import files
from ._io.lmdbenv import lmdb_commit_point, wrap_errors
from .errors import InvalidInputError
from .ports import RowBatch


class SnapshotCalls:
    """Snapshots, export and staged import of the controller's index (see the module
    docstring); the host class provides ``env``, ``db``, ``path``, ``parts``, ``seq_floor``, ``_lock``,
    ``_snapshots``, ``_next_snapshot`` and ``drop_fields``."""

    def snapshot(self) -> int:
        """Open the controller's side of an MVCC cut (a read transaction); returns its id."""
        with self._lock:
            sid, self._next_snapshot = self._next_snapshot, self._next_snapshot + 1
            self._snapshots[sid] = self.env.begin(buffers=False)
            return sid

    def release(self, snapshot: int) -> None:
        """Close a snapshot (idempotent)."""
        with self._lock:
            txn = self._snapshots.pop(snapshot, None)
        if txn is not None:
            with contextlib.suppress(Exception):  # (an env already closed)
                txn.abort()

    def _txn_of(self, snapshot: int):
        txn = self._snapshots.get(snapshot)
        if txn is None:
            raise InvalidInputError(f"controller: snapshot {snapshot!r} is unknown or released")
        return txn

    def export_snapshot(self, snapshot: int, dest_dir, *, index_block_bytes: int = 1 << 20):
        from .controller_export import export_controller

        with self._lock:
            txn = self._txn_of(snapshot)
        return export_controller(self.env, txn, self.db, Path(dest_dir), index_block_bytes=index_block_bytes)

    def snapshot_rows(self, snapshot: int, pid: str, keys: Sequence[str]) -> Optional[RowBatch]:
        from .controller_dump import rows_at  # (see ControllerPort)

        with self._lock:
            return rows_at(self._txn_of(snapshot), self.db, pid, list(keys), path=str(self.path / "data.mdb"))

    def stage_import(self, target_dir, src_dir, *, num_units: Optional[int] = None,
                     clear_produced: bool = False, src_checked: bool = True, sync: bool = True) -> bool:
        from .controller_export import stage_controller

        if not src_checked and clear_produced:
            return False
        if not stage_controller(Path(target_dir), Path(src_dir), num_units=num_units, src_checked=src_checked,
                                sync=sync):
            return False
        if clear_produced:  # a checkpoint saved without storage: its rows keep no produced field
            c = type(self)(Path(target_dir), num_units=num_units or 1)  # (an existing index keeps its count)
            try:
                with wrap_errors("clear produced fields", target_dir):
                    c.drop_fields(c.claims_all())
                    c.env.sync(True)
                    files.fsync_tree(target_dir)
            finally:
                c.close()
        return True

    def sync_staged(self, target_dir) -> None:
        with wrap_errors("sync the staged controller", target_dir):
            files.fsync_tree(Path(target_dir))

    def seq_high(self) -> int:
        with self._lock:
            return max([self.seq_floor] + [p.next_seq for p in self.parts.values()])

    def raise_seq_floor(self, floor: int) -> None:
        if type(floor) is not int or floor < 0:
            raise InvalidInputError(f"raise_seq_floor: floor must be an int >= 0, got {floor!r}")
        with self._lock:
            low = [p for p in self.parts.values() if p.next_seq < floor]
            new_floor = R.seq_aligned(max(floor, self.seq_floor))
            if new_floor == self.seq_floor and not low:
                return
            raised = {p.pid: R.seq_raised(p.next_seq, floor) for p in low}  # (groups go on where they were)
            if max([new_floor, *raised.values()]) >= R.SEQ_LIMIT:
                raise R.seq_exhausted(f"raising the sequence floor to {floor}")
            m = self.db
            with wrap_errors("recording the sequence floor (after a load)", self.path), self.env.begin(write=True) as txn:
                txn.put(R.META_SEQ_FLOOR, R.encode_decimal(new_floor), db=m["meta"])
                for p in low:
                    txn.put(R.parts_key(p.pid), R.encode_partition(raised[p.pid], p.meta, p.num), db=m["parts"])
                lmdb_commit_point("controller_commit")
            with wrap_errors("sync the raised sequence floor", self.path):
                self.env.sync(True)
            self.seq_floor = new_floor
            for p in low:
                p.next_seq = raised[p.pid]

    def claims_all(self) -> Dict[int, frozenset]:
        """Every row with its produced fields (rows without any left out)."""
        out: Dict[int, frozenset] = {}
        for p in self.parts.values():
            sl = p.live_slots()
            out.update((g, p.fsets[f]) for g, f in zip(p.s_gidx[sl].tolist(), p.s_fs[sl].tolist()) if p.fsets[f])
        return out
