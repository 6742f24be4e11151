"""The ports: what the data plane, the checkpoint writer/loader and the dump need from a
storage unit (:class:`UnitPort`) and from the controller (:class:`ControllerPort`).

This module is the one line everything distributed crosses (shared/DESIGN.md §1).  Values
in, values out: numpy arrays, bytes, plain dataclasses, lists of ints and strings,
snapshot ids, directory paths.  Never an LMDB transaction, a file descriptor or an
in-memory mirror.  In the embedded backend the ports are plain method calls on
:class:`~tqstore.unit.Unit` and :class:`~tqstore.controller.Controller`; in the Ray backend
the same classes run inside actors and the calls go through ``actor.method.remote``.

Rules every implementation keeps (and :mod:`tqstore.testing.conformance` tests):

* a method either completes or raises a :class:`~tqstore.errors.TqstoreError`; a failed
  mutating call changes nothing that a later call can observe;
* a snapshot id names an MVCC cut that the implementation resolves; it stays valid until
  :meth:`release` (idempotent), and nothing written after the cut is visible through it;
* arguments named ``into`` are optional destinations: an in-process implementation fills
  them (the single copy of the embedded read path); one across a process boundary
  ignores them and returns the values, and the caller copies (see
  :func:`fill_or_copy`);
* paths are strings naming directories that the implementation can reach (owner-side
  I/O): an export writes its own files there, an import reads byte ranges from them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

try:  # Python 3.8+: typing.Protocol
    from typing import Protocol, runtime_checkable
except ImportError:  # pragma: no cover
    from typing_extensions import Protocol, runtime_checkable  # type: ignore

import numpy as np

#: An MVCC cut of one unit or of the controller, resolved by its owner.
SnapshotId = int


# ---------------------------------------------------------------------------- values
@dataclass(frozen=True)
class RowInfo:
    """Metadata of one row as the controller records it (a value: a copy, never the mirror)."""

    gidx: int
    key: Optional[str]
    tag: Any
    fields: frozenset
    seq: int


@dataclass(frozen=True)
class PartitionInfo:
    """A partition's schema (field -> (kind code, dtype code)) and row count."""

    pid: str
    schema: Dict[str, Tuple[int, int]]
    rows: int


@dataclass
class UnitExport:
    """What a unit wrote when it exported a snapshot into a checkpoint or dump directory.

    ``files`` are manifest entries (dicts in the manifest's JSON shape, relative paths);
    byte counts say how each segment was placed.
    """

    files: List[Dict[str, Any]]
    frames: int = 0
    live_bytes: int = 0
    copied_bytes: int = 0
    linked_bytes: int = 0
    reused_bytes: int = 0
    checksummed_bytes: int = 0


@dataclass
class ControllerExport:
    """What the controller wrote when it exported a snapshot, and a summary of the cut."""

    files: List[Dict[str, Any]]
    summary: Dict[str, Any] = field(default_factory=dict)  # rows, partitions, next_gidx, put_token


# ---------------------------------------------------------------------------- ports
@runtime_checkable
class UnitPort(Protocol):
    """One storage unit: payload frames of the rows ``g`` with ``g % num_units == unit_id``."""

    unit_id: int

    # writes -----------------------------------------------------------------
    def write(self, columns: Sequence[Tuple[Any, Sequence[int], Sequence[int]]], *, fresh: bool = False,
              token: Optional[int] = None) -> int:
        """Append rows (``(Column, positions in the column, gidxs)`` per field) and index them
        in one transaction; returns bytes written.  ``token`` makes replaced entries undoable
        until :meth:`settle`.  Raises StorageIOError (nothing indexed)."""

    def settle(self, token: int, *, committed: bool) -> int:
        """Drop (committed) or put back (not committed) the undo records of put ``token``."""

    def undo_tokens(self) -> List[int]:
        """Tokens of overwriting puts not yet settled."""

    def delete(self, gidxs: Sequence[int], fields: Optional[Sequence[str]] = None) -> int:
        """Drop index entries (all fields, or ``fields``); idempotent; returns entries dropped."""

    def keys(self, *, snapshot: Optional[SnapshotId] = None) -> List[Tuple[int, str]]:
        """Every ``(gidx, field)`` the unit holds (at ``snapshot``, or now)."""

    # reads ------------------------------------------------------------------
    # A location is the unit index's value (tqstore._format.index): one row of a LOC_DTYPE
    # array, or a Loc named tuple (seg, offset, length, crc) made from one.
    def lookup(self, gidxs: Sequence[int], fields: Sequence[str], *, snapshot: Optional[SnapshotId] = None
               ) -> Dict[str, Optional[np.ndarray]]:
        """Locations (``LOC_DTYPE`` arrays, in the order of ``gidxs``) of each field, all read
        in one index transaction; None for a field some row lacks (:meth:`locate` says which)."""

    def locate(self, gidxs: Sequence[int], field: str, *, snapshot: Optional[SnapshotId] = None
               ) -> List[Optional[Any]]:
        """The ``Loc`` of ``field`` for each gidx, None where the row has none."""

    def describe(self, loc: Any) -> str:
        """Where the frame at ``loc`` lives (its file's path), for errors raised caller-side."""

    def read_head(self, loc: Any) -> Tuple[Any, bytes]:
        """The head of the frame at ``loc`` (a FrameHead, structure checked, and its bytes up
        to the payload start); the CRC is checked by the read of the payload."""

    def read_uniform(self, locs: np.ndarray, gidxs: np.ndarray, template: Tuple[bytes, bytes],
                     payload_start: int, payload_len: int, *, into: Optional[np.ndarray] = None,
                     rows: Optional[np.ndarray] = None, verify: bool = True) -> Any:
        """Payloads of frames of one length and one head template: filled into ``into[rows]``
        (returns True/False: False when a head differs from the template) or returned as a
        ``(n, payload_len)`` uint8 array (None when a head differs).  The unit chooses how it
        reads them (mapped, or vectored reads for large frames)."""

    def read_frames(self, locs: Sequence[Any], gidxs: Sequence[int], *, verify: bool = True
                    ) -> List[Tuple[Any, Any]]:
        """``(head, payload)`` of each frame, checked; payloads decompressed.  A payload is a
        buffer: in process a read-only view of the mapped segment (copy it before the unit
        closes), across a process boundary bytes."""

    def read_heads(self, locs: Sequence[Any]) -> List[Any]:
        """Heads of (large) frames, to size their destinations before :meth:`read_into`."""

    def read_into(self, locs: Sequence[Any], heads: Sequence[Any], into: Optional[Sequence[Any]] = None, *,
                  verify: bool = True) -> Optional[List[Any]]:
        """Payloads of large frames into the writable buffers ``into`` (returns None), or
        returned as buffers when ``into`` is None (as a unit across a process boundary does)."""

    # snapshots, checkpoints, dumps -------------------------------------------
    def snapshot(self) -> SnapshotId:
        """Seal the active segment and pin an MVCC cut; returns its id (resolved by
        :meth:`keys`, :meth:`lookup` and :meth:`locate` given ``snapshot=``)."""

    def release(self, snapshot: SnapshotId) -> None:
        """Unpin a snapshot (idempotent)."""

    def export_snapshot(self, snapshot: SnapshotId, dest_dir: str, **options: Any) -> UnitExport:
        """Write the snapshot's index copy and segments (linked, reused or copied and
        verified) under ``dest_dir``; fsync every file and directory written."""

    # maintenance -------------------------------------------------------------
    def verify(self) -> List[str]:
        """Check every stored frame; one line per problem."""

    def compact(self, *, live_ratio: float = 0.5) -> int:
        """Compact mostly dead sealed segments; returns segments compacted."""

    def close(self) -> None:
        """Close (idempotent)."""


@runtime_checkable
class ControllerPort(Protocol):
    """The store's metadata: partitions, keys, rows, schemas, allocator, consumption, sampler."""

    num_units: int
    put_token: int

    # puts -------------------------------------------------------------------
    def plan_put(self, pid: str, columns: Sequence[Any], *, keys: Optional[Sequence[str]] = None,
                 gidxs: Optional[Sequence[int]] = None, n_new: int = 0, tags: Optional[Sequence[Any]] = None,
                 create_keys: bool = True) -> Any:
        """Validate a put and reserve global indexes (nothing committed); returns a PutPlan."""

    def commit_put(self, plan: Any, *, token: Optional[int] = None) -> None:
        """Commit a planned put in one transaction."""

    # queries (values, never the mirror) -------------------------------------
    def partitions(self) -> List[str]:
        """Partition ids, sorted."""

    def partition_info(self, pid: str) -> PartitionInfo:
        """Schema and row count; raises PartitionNotFoundError."""

    def resolve_keys(self, pid: str, keys: Sequence[str]) -> List[int]:
        """Global indexes of ``keys``; raises PartitionNotFoundError / KeyNotFoundError."""

    def rows(self, pid: str, gidxs: Sequence[int]) -> List[Optional[RowInfo]]:
        """Row metadata (None for a gidx that is not a row of ``pid``)."""

    def list_keys(self, pid: Optional[str] = None) -> Dict[str, Dict[str, Any]]:
        """``{partition: {key: tag}}`` in insertion order."""

    # clears -----------------------------------------------------------------
    def clear_rows(self, pid: str, gidxs: Sequence[int], *, drop_partition: bool = False) -> List[int]:
        """Remove rows (idempotent); returns the gidxs removed."""

    # consumption --------------------------------------------------------------
    def fetch(self, pid: str, task: str, fields: Optional[Sequence[str]], batch_size: int,
              sampling_config: Optional[Mapping[str, Any]] = None) -> List[int]:
        """Choose ready rows with the sampler and mark them consumed, sampler state and
        consumption marks in one transaction; ``[]`` when the sampler chose none."""

    def production_status(self, pid: str, fields: Sequence[str]) -> Optional[Tuple[np.ndarray, np.ndarray]]:
        """``(sorted gidxs, int8 matrix rows x fields)``; None for an unknown partition."""

    def consumption_status(self, pid: str, task: str) -> Optional[Tuple[np.ndarray, np.ndarray]]:
        """``(sorted gidxs, int8 flags)``; None for an unknown partition."""

    def reset_consumption(self, pid: str, task: Optional[str] = None) -> bool:
        """Forget consumption (and the sampler's cache); False for an unknown partition."""

    # snapshots -----------------------------------------------------------------
    def snapshot(self) -> SnapshotId:
        """Open the controller's side of an MVCC cut."""

    def release(self, snapshot: SnapshotId) -> None:
        """Close a snapshot (idempotent)."""

    def export_snapshot(self, snapshot: SnapshotId, dest_dir: str, **options: Any) -> ControllerExport:
        """Write a copy of the controller at the snapshot under ``dest_dir`` (fsynced)."""

    def close(self) -> None:
        """Close (idempotent)."""


def fill_or_copy(result: Any, into: Optional[np.ndarray], rows: Optional[np.ndarray]) -> Any:
    """Normalise a :meth:`UnitPort.read_uniform` answer for a caller that passed ``into``:
    an in-process port filled it and answered True/False; a remote one answered an array
    (or None), which is copied into ``into[rows]`` here."""
    if into is None or isinstance(result, (bool, np.bool_)):
        return result
    if result is None:
        return False
    into[rows] = result
    return True


__all__ = ["SnapshotId", "RowInfo", "PartitionInfo", "UnitExport", "ControllerExport", "UnitPort",
           "ControllerPort", "fill_or_copy"]
