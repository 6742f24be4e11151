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
from typing import Any, Dict, List, Mapping, Optional, Sequence, Set, Tuple

try:  # Python 3.8+: typing.Protocol
    from typing import Protocol, runtime_checkable
except ImportError:  # pragma: no cover
    from typing_extensions import Protocol, runtime_checkable  # type: ignore

import numpy as np

from .ports_restore import RestoreImport, RestoreInfo, check_no_restore  # noqa: F401 - values of the restore calls
from .ports_transfer import (  # noqa: F401 - the values of the export and import calls, re-exported
    LINK, REUSE, COPY, Reusable, SegmentSource, SegmentWrite, plan_segment_writes, UnitExport, ControllerExport, UnitImport, ShardInfo,
)

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


class FrameProblem(str):
    """A line of :meth:`UnitPort.verify` about one indexed frame: the problem (``message``)
    and the row's global index and field (``gidx``, ``field``), which the line names; a
    store's verify adds the row's partition and key."""

    gidx: int
    field: str
    message: str

    def __new__(cls, message: str, gidx: int, field: str) -> "FrameProblem":
        self = super().__new__(cls, f"{message} (row {int(gidx)}, field {field!r})")
        self.message, self.gidx, self.field = str(message), int(gidx), str(field)
        return self

    def __reduce__(self):  # (sent between processes, e.g. from a unit on a Ray node)
        return FrameProblem, (self.message, self.gidx, self.field)


@dataclass(frozen=True)
class PartitionInfo:
    """A partition's schema (field -> (kind code, dtype code)) and row count."""

    pid: str
    schema: Dict[str, Tuple[int, int]]
    rows: int


@dataclass(frozen=True)
class RowBatch:
    """Rows of one partition with the partition's schema, in one answer, column by column
    (what a BatchMeta is made from; one list per column keeps a batch of thousands of rows
    cheap to build and to send).  Columns follow the order asked for; a gidx or key that is
    not a row of the partition has ``seqs[i] is None`` (and None in the other columns but
    ``gidxs``, which keeps the gidx asked for).  ``fields[i]`` are row i's produced fields."""

    pid: str
    schema: Dict[str, Tuple[int, int]]
    gidxs: List[Optional[int]]
    keys: List[Optional[str]]
    tags: List[Any]
    fields: List[Optional[frozenset]]
    seqs: List[Optional[int]]

    def __len__(self) -> int:
        return len(self.seqs)

    def missing(self) -> List[int]:
        """Positions that are not rows of the partition."""
        return [i for i, q in enumerate(self.seqs) if q is None]

    def row(self, i: int) -> Optional[RowInfo]:
        """Row ``i`` as a RowInfo (None when it is not a row)."""
        if self.seqs[i] is None:
            return None
        return RowInfo(self.gidxs[i], self.keys[i], self.tags[i], self.fields[i], self.seqs[i])


def rows_gaining_data(gidxs: Sequence[int], rows: Optional[RowBatch], num_units: int) -> Dict[int, int]:
    """Per unit (``gidx % num_units``), how many of ``gidxs`` hold no data yet: not rows (as
    ``rows``, the partition's answer for them, says; None: no such partition) or rows without
    produced fields.  What giving each of them data adds against ``total_storage_size``."""
    grow: Dict[int, int] = {}
    for i, g in enumerate(gidxs):
        if rows is None or rows.seqs[i] is None or not rows.fields[i]:
            u = int(g) % num_units
            grow[u] = grow.get(u, 0) + 1
    return grow


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

    def field_rows(self, *, snapshot: Optional[SnapshotId] = None) -> Dict[str, np.ndarray]:
        """What :meth:`keys` lists, by field: field -> sorted int64 array of the gidxs holding
        it (at ``snapshot``, or now).  Read and decoded in bulk (the store's reconcile)."""

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
        """``(head, payload)`` of each frame, checked; payloads decompressed.  Each head is
        its frame's own (``head.gidx == gidxs[i]``), checked against ``gidxs``.  A payload is a
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

    def export_snapshot(self, snapshot: SnapshotId, dest_dir: str, *, link: bool = True,
                        reuse: Optional[Mapping[str, Reusable]] = None, put_token: int = 0,
                        known_crc: Optional[Mapping[str, int]] = None,
                        index_block_bytes: int = 1 << 20) -> UnitExport:
        """Write the snapshot into the directory ``dest_dir`` (created if missing, else empty;
        owner-side I/O):
        ``index/data.mdb``, a compact copy of the cut's index describing exactly the segments
        it holds (all sealed; undo records dropped, entries of overwriting puts after
        ``put_token`` put back), and every segment it names, placed by
        :func:`plan_segment_writes`: hard-linked (``link`` allows it and the file system is
        the same), linked from an earlier generation (``reuse``: identity -> Reusable), or
        copied and checked frame by frame against the index CRCs.  ``known_crc`` (identity ->
        CRC32C) adds to the unit's own cache of segments already checksummed.  Every file and
        directory written is fsynced.  Raises CorruptionError (a segment does not verify),
        StorageIOError / OSError (the caller removes ``dest_dir``)."""

    def export_rows(self, snapshot: SnapshotId, gidxs: Sequence[int], fields: Sequence[Optional[Sequence[str]]],
                    dest_path: str, *, num_units: int, put_token: int = 0) -> ShardInfo:
        """Write the dump shard of rows ``gidxs`` at ``snapshot`` as the new file ``dest_path``
        (docs/FORMAT.md, "shard-NNN.tqd"; owner-side I/O): the frames of fields ``fields[i]``
        of row ``i`` (None: every field the unit holds for it) copied byte for byte from the
        unit's segments in segment order, each checked with the frame-check kernel first,
        then the table; fsynced.  ``num_units``: the store's unit count (every gidx must live
        on this unit); ``put_token``: the controller's last committed overwriting put at the
        cut (entries of later, unsettled ones are read as they were before).  Raises
        InvalidInputError (a row of another unit), CorruptionError (a frame missing or not
        verifying: names file and offset), StorageIOError / OSError (the caller removes the file)."""

    def stage_import(self, target_dir: str, plan: UnitImport) -> int:
        """Fill the new unit directory ``target_dir`` (created) from a checkpoint as ``plan``
        says, owner-side; never touches the unit's live state.  Returns bytes read and
        verified.  Reshard: every frame is checked (structure, padding, CRC32C) before it is
        appended.  Raises CorruptionError naming the checkpoint file and offset."""

    def verify_import(self, target_dir: str, plan: UnitImport) -> int:
        """After :meth:`stage_import` of a "same" plan: check every staged segment (its
        CRC32C and every indexed frame) and return bytes read; 0 for a "reshard" plan
        (checked as it was staged).  May run while the caller opens the new state.  A
        linked plan (``plan.link``) reads only the checkpoint's files: it may also run
        before or beside :meth:`stage_import`."""

    # selective restores -------------------------------------------------------
    # A restore's frames are tagged with its ``tag`` (never reused): written as *staged*
    # entries that reads, keys() and the store's reconcile never see, then *published* into
    # the index keeping what they replaced, then settled.  Every call is idempotent.
    def import_restore(self, tag: int, plan: RestoreImport) -> int:
        """Drop the staged entries of ``tag`` (a retried claim), then read the frames of
        ``plan`` in batches of at most ``plan.batch_bytes``, check each (structure, padding,
        CRC32C against the recorded one), re-stamp those whose gidx differs (CRC
        recomputed), append them and index them as staged entries.  Returns bytes read.
        Raises CorruptionError naming the file and offset (nothing of the batch indexed),
        InvalidInputError when ``tag`` was settled already."""

    def publish_restore(self, tag: int) -> int:
        """Move the staged entries of ``tag`` into the index, keeping what each replaced (one
        transaction); returns entries published."""

    def unpublish_restore(self, tag: int) -> int:
        """Undo :meth:`publish_restore`: replaced entries back, the restore's entries staged
        again (one transaction); returns entries moved."""

    def settle_restore(self, tag: int, *, committed: bool, close: bool = True) -> int:
        """Committed: forget what the published entries replaced (those frames become dead).
        Not committed: unpublish, then drop every staged entry.  ``close`` refuses later
        imports with ``tag``; ``close=False`` forgets the tag entirely.  Returns entries settled."""

    def restore_tags(self) -> List[int]:
        """Tags that have entries on this unit (staged, published or closed)."""

    # maintenance -------------------------------------------------------------
    def verify(self) -> List[str]:
        """Check every stored frame; one line per problem (a :class:`FrameProblem` for a
        frame the index names)."""

    def compact(self, *, live_ratio: float = 0.5) -> int:
        """Compact mostly dead sealed segments and merge small ones; returns segments compacted."""

    def index_state(self, *, sync: bool = False) -> Tuple[int, int]:
        """``(entries, commit)``: how many (row, field) entries the index holds, and a counter
        that every committed change of the index advances (and nothing else does); ``sync``
        makes the index durable first.  The store's clean-close marker records these."""

    def close(self) -> None:
        """Close (idempotent)."""


@runtime_checkable
class ControllerPort(Protocol):
    """The store's metadata: partitions, keys, rows, schemas, allocator, consumption, sampler."""

    num_units: int
    put_token: int
    #: True when this open created the index (it did not exist): the store refuses an index
    #: lost from a store whose units hold data rather than take their rows for a crash's debris
    created: bool

    # puts -------------------------------------------------------------------
    def plan_put(self, pid: str, columns: Sequence[Any], *, keys: Optional[Sequence[str]] = None,
                 gidxs: Optional[Sequence[int]] = None, n_new: int = 0, tags: Optional[Sequence[Any]] = None,
                 create_keys: bool = True, strict_dtypes: bool = True) -> Any:
        """Validate a put and reserve global indexes (nothing committed); returns a PutPlan.

        A field's kind is fixed by its first put in a partition; its dtype too unless
        ``strict_dtypes=False``, when a change marks the field mixed in the schema
        (``SCHEMA_MIXED``; each row's dtype is in its frame)."""

    def commit_put(self, plan: Any, *, token: Optional[int] = None) -> None:
        """Commit a planned put in one transaction."""

    # queries (values, never the mirror) -------------------------------------
    # Each costs O(what is asked) unless it says otherwise; an unknown partition is an
    # error only where the method says so (else None / empty).
    def partitions(self) -> List[str]:
        """Partition ids, oldest first (the order they were created in; a partition cleared and
        made again is new; the partitions of a store made before partition numbers existed
        keep the id order they were numbered in)."""

    def verify_index(self) -> List[str]:
        """Decode and check every entry of the controller's durable index (as an open that
        has no mirror file to read does) and compare its counts with the state the
        controller serves; one line per problem (empty when clean).  A damaged index that
        the mirror file hides would otherwise surface only when a checkpoint of the store
        is loaded."""

    def partition_info(self, pid: str) -> PartitionInfo:
        """Schema and row count; raises PartitionNotFoundError."""

    def resolve_keys(self, pid: str, keys: Sequence[str]) -> List[int]:
        """Global indexes of ``keys``; raises PartitionNotFoundError / KeyNotFoundError."""

    def check_keys(self, pid: str, keys: Sequence[str]) -> int:
        """How many distinct keys ``keys`` holds, when every one is a row of ``pid`` (a
        membership test: no value per key is answered, so it is cheaper than
        :meth:`resolve_keys`; a selective dump's cut).  Raises PartitionNotFoundError /
        KeyNotFoundError (naming the first missing keys in the order given), TypeError (an
        unhashable key)."""

    def removal_epoch(self) -> int:
        """A value that changes whenever rows or a partition are removed (clears, drops).  Two
        equal answers of one controller mean that no key of any partition was removed between
        them, so a :meth:`check_keys` made between them still holds (a selective dump checks
        its keys before its cut and only compares epochs at the cut).  Another controller
        instance (a reopened store, a loaded checkpoint) answers another value."""

    def row_infos(self, pid: str, gidxs: Sequence[int]) -> List[Optional[RowInfo]]:
        """Row metadata (None for a gidx that is not a row of ``pid``).  (Not ``rows``: the
        embedded Controller's ``rows`` is its in-memory index, which no port exposes.)"""

    def rows_by_key(self, pid: str, keys: Sequence[str]) -> Optional[RowBatch]:
        """Schema and row metadata of ``keys`` (a key not in ``pid``: ``seqs[i] is None``);
        None for an unknown partition."""

    def row_batch(self, pid: str, gidxs: Sequence[int]) -> Optional[RowBatch]:
        """Schema and row metadata of ``gidxs`` in one answer; None for an unknown partition."""

    def first_rows(self, pid: str, limit: Optional[int] = None) -> Optional[RowBatch]:
        """The partition's first ``limit`` rows (all when None) in insertion order, with the
        schema; None for an unknown partition.  O(limit)."""

    def list_keys(self, pid: Optional[str] = None) -> Dict[str, Dict[str, Any]]:
        """``{partition: {key: tag}}`` (partitions oldest first, keys in insertion order; tags as
        stored, None for none).  O(partition)."""

    def key_list(self, pid: str) -> Optional[Tuple[List[Optional[str]], Dict[str, Any]]]:
        """``(keys, tags)``: the keys of ``pid`` in insertion order (a list copied whole, so
        None may stand among them: rows without a key), and ``{key: tag}`` of the keys that
        have a tag; None for an unknown partition.  O(partition) at C speed, O(tagged rows) else."""

    def claims(self, unit_id: int) -> Dict[int, frozenset]:
        """Every row living on unit ``unit_id`` (``gidx % num_units``) with its produced
        fields, for the store's reconcile.  O(rows)."""

    def claim_rows(self, unit_id: int) -> Dict[str, np.ndarray]:
        """What :meth:`claims` says, by field: field -> sorted int64 array of the gidxs of the
        rows living on unit ``unit_id`` that have it produced (fields no such row has are
        absent).  O(rows) in array operations (the store's reconcile)."""

    def claim_counts(self) -> List[int]:
        """Per unit, how many (row, produced field) pairs the controller says it holds."""

    def drop_fields(self, missing: Mapping[int, Set[str]]) -> None:
        """Mark the fields ``missing[g]`` of rows ``g`` not produced (the reconcile after a
        power loss: no unit holds their payload any more); a row that is gone is skipped."""

    def mark_clean(self, digest: int) -> None:
        """Record the clean-close marker with the units' ``digest`` (an int in [0, 2**63)),
        durably, as the last commit before the store closes (docs/FORMAT.md, "Clean close")."""

    def take_clean(self) -> Optional[int]:
        """Remove the clean-close marker durably; its digest if no other commit came after
        it, else None (none, stale or malformed).  The store calls it first when it opens."""

    # clears -----------------------------------------------------------------
    def clear_rows(self, pid: str, gidxs: Sequence[int], *, drop_partition: bool = False) -> List[int]:
        """Remove rows (idempotent; with the sampler's results that mention them, in the same
        transaction); returns the gidxs removed."""

    def drop_partition(self, pid: str) -> List[int]:
        """Remove a partition with its rows, consumption and sampler state (idempotent);
        returns the gidxs removed."""

    # consumption --------------------------------------------------------------
    def set_sampler(self, sampler: Any) -> None:
        """Sample fetches with ``sampler`` (a BaseSampler, or a spec for make_sampler) from now
        on; its state per partition is loaded from the controller as fetches need it."""

    def fetch(self, pid: str, task: str, fields: Optional[Sequence[str]], batch_size: int,
              sampling_config: Optional[Mapping[str, Any]] = None) -> Optional[RowBatch]:
        """Choose ready rows with the sampler and mark them consumed, sampler state and
        consumption marks in one transaction, so no row goes to two consumers of one task.
        ``fields=None`` means the partition's whole schema.  Returns the chosen rows with the
        schema (no rows when the sampler chose none); None for an unknown partition.
        O(ready rows)."""

    def production_status(self, pid: str, fields: Sequence[str]) -> Optional[Tuple[np.ndarray, np.ndarray]]:
        """``(sorted gidxs, int8 matrix rows x fields)``; None for an unknown partition."""

    def consumption_status(self, pid: str, task: str) -> Optional[Tuple[np.ndarray, np.ndarray]]:
        """``(sorted gidxs, int8 flags)``; None for an unknown partition."""

    def reset_consumption(self, pid: str, task: Optional[str] = None) -> bool:
        """Forget consumption (and the sampler's cache); False for an unknown partition."""

    def first_batch_index(self, pid: str, task: str, dp_rank: Any) -> int:
        """The ``batch_index`` a new streaming consumer of ``(task, dp_rank)`` starts at: past
        every result the sampler held cached for them, fetched by them, when this controller
        first answered it (results of an earlier run, kept across reopens and in checkpoints,
        which a consumer counting from 0 would be handed again; a share another rank's fetch
        set aside for them and they have not fetched yet is not passed, so it is fetched), the
        same answer to every caller until the controller is closed; 0 when there were none."""

    # snapshots -----------------------------------------------------------------
    def snapshot(self) -> SnapshotId:
        """Open the controller's side of an MVCC cut."""

    def release(self, snapshot: SnapshotId) -> None:
        """Close a snapshot (idempotent)."""

    def export_snapshot(self, snapshot: SnapshotId, dest_dir: str, *, index_block_bytes: int = 1 << 20
                        ) -> ControllerExport:
        """Write a compact copy of the controller index at the snapshot as ``dest_dir/data.mdb``
        (``dest_dir`` created if missing, else empty; file and directory fsynced); returns its
        manifest entry and the cut's summary.  An unknown or released id is a TqstoreError."""

    def snapshot_rows(self, snapshot: SnapshotId, pid: str, keys: Sequence[str]) -> Optional[RowBatch]:
        """Schema and rows of ``keys`` of ``pid`` as they were at ``snapshot`` (a dump's row
        index), read from the snapshot, not the live state: a key that was no row at the cut
        has ``seqs[i] is None``; None when the partition did not exist at the cut.  An unknown
        or released id is a TqstoreError."""

    def stage_import(self, target_dir: str, src_dir: str, *, num_units: Optional[int] = None,
                     clear_produced: bool = False, src_checked: bool = True, sync: bool = True) -> bool:
        """Fill the new controller directory ``target_dir`` (created) with a copy of the
        checkpoint's controller index ``src_dir`` (its CRC checked by the caller) that has no
        free page, with its unit count set to ``num_units`` (None keeps it) and, with
        ``clear_produced``, no field produced (a checkpoint saved without storage); answers
        True when staged.  ``src_checked=False``: ``src_dir`` has not been checked (the loader's
        LMDB check, in process or by a walk), so nothing may map it: only a byte copy is
        staged, when that is all it takes (neither ``num_units`` nor ``clear_produced``, an
        empty free list), and only when every page and entry of the copy reads checked, so that
        the copy may be opened; else nothing is left and the answer is False (call again once
        ``src_dir`` is checked).  The staged copy is durable when this returns, except with
        ``sync=False`` and ``src_checked=False``: then it may be opened at once, and the caller
        calls :meth:`sync_staged` before the new state is switched in.  Never
        touches the live controller."""

    def sync_staged(self, target_dir: str) -> None:
        """Make the directory ``target_dir`` staged by :meth:`stage_import` durable (every
        file and the directory fsynced).  Raises StorageIOError when a sync fails."""

    def seq_high(self) -> int:
        """A sequence number past every one this index has given out: the largest of
        ``meta/seq_floor`` and every partition's ``next_seq`` (docs/FORMAT.md)."""

    def raise_seq_floor(self, floor: int) -> None:
        """Make ``floor`` the least sequence number this index gives out from now on: raise
        ``meta/seq_floor`` to ``floor`` (rounded up to a multiple of ``SEQ_ALIGN``) and every
        partition's ``next_seq`` below it past it by a multiple of ``SEQ_ALIGN`` (so its GRPO
        groups go on where they were), in one transaction, durable when this returns
        (nothing lower is left alone).  Called on the
        new state of a checkpoint load before it is switched in, with the replaced state's
        :meth:`seq_high`: a BatchMeta of the replaced state (each row's gidx and seq) then
        matches none of the rows put after the load, though their gidxs are reused.  Raises
        InvalidInputError for a negative or non-int ``floor``, CapacityError (nothing written)
        when the raised numbers would pass ``SEQ_LIMIT`` (2**63), StorageIOError."""

    # selective restores (see RestoreInfo; the load orchestrates them, tqstore.dump) -------
    def begin_restore(self, pid: str, dump_dir: str, entries: Sequence[Tuple[str, int, Any, Sequence[str]]],
                      schema: Mapping[str, Tuple[int, int]], *, strict_dtypes: bool = True,
                      unit_room: Optional[Sequence[int]] = None) -> RestoreInfo:
        """Record a restore of ``entries`` (rows ``(key, gidx in the dump, tag, produced fields)``) into
        ``pid`` in one transaction: existing keys keep their gidx, new keys get reserved ones.
        With ``strict_dtypes=False`` a field whose dtype differs from the partition's becomes
        mixed on finish (as a put's, see ``plan_put``).  ``unit_room``: per unit, how many
        more rows with data it may hold (``total_storage_size``; None: no limit).
        Returns the info with the mapping.  Raises RestorePendingError (``pid`` has an
        unresolved restore), SchemaError (``schema`` clashes with the partition's: another
        kind, or with ``strict_dtypes`` another dtype), CapacityError (a unit would get more
        rows with data than its room), InvalidInputError (bad keys, tags, duplicate keys,
        fields not in ``schema``); nothing is written then."""

    def claim_restore(self, rid: str, unit: int) -> int:
        """Mark unit ``unit`` of a running restore as importing; returns the attempt number
        that :meth:`complete_restore` must quote.  Raises InvalidInputError (unknown restore,
        not running, unit already complete)."""

    def complete_restore(self, rid: str, unit: int, attempt: int) -> None:
        """Mark the unit's import of claim ``attempt`` complete (InvalidInputError for a stale
        attempt or a restore not running)."""

    def finish_restore(self, rid: str) -> None:
        """Every unit complete: the rows (new keys created, tags, produced fields) and the
        schema committed with the state "committed" in one transaction.  Idempotent for a
        committed restore; InvalidInputError when units are not complete or it was cancelled."""

    def cancel_restore(self, rid: str) -> None:
        """Mark a running restore "cancelled" (idempotent); its reserved gidxs stay reserved
        until :meth:`forget_restore`.  InvalidInputError for a committed one."""

    def forget_restore(self, rid: str) -> None:
        """After the units settled a decided restore: delete its record (a cancelled one
        frees its reserved gidxs in the same transaction).  Idempotent (unknown id: nothing)."""

    def restores(self, pid: Optional[str] = None) -> List[RestoreInfo]:
        """Unresolved restores (of ``pid``, or all), summaries without rows."""

    def restore(self, rid: str) -> Optional[RestoreInfo]:
        """The restore ``rid`` with its key -> gidx mapping; None when unknown."""

    def close_created(self) -> None:
        """Close, and remove the index file if this open created it (``created``): a store that
        refuses such an index (its units hold data) leaves it missing, as it found it."""

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


__all__ = ["SnapshotId", "RowInfo", "PartitionInfo", "RowBatch", "LINK", "REUSE", "COPY", "Reusable", "SegmentSource",
           "SegmentWrite", "plan_segment_writes", "UnitExport", "ShardInfo", "ControllerExport", "UnitImport", "UnitPort",
           "ControllerPort", "fill_or_copy", "RestoreInfo", "RestoreImport", "check_no_restore", "rows_gaining_data"]
