"""Selective dump and restore of chosen keys (shared/DESIGN.md §5; docs/FORMAT.md, "Dump
directory" and "Selective restores").

``Store.dump_data_by_key`` (mixed into :class:`~tqstore.Store` by :class:`DumpMixin`;
``tqstore.dump_data_by_key`` forwards to the default store's) writes exactly those keys of
one partition at an MVCC cut: the row index and, per owning unit, a shard of its rows'
frames copied byte for byte by the unit itself.  :func:`read_row_index`,
:func:`describe_dump` and :func:`verify_dump` read a dump without a store.  Engine over the
ports: no LMDB, no segment file, no controller mirror here.  ``Store.load_data_by_key`` merges
a dump's rows into a running store and ``Store.recover_data_load`` settles a load a crash or
an error left unresolved (:mod:`tqstore.dump.load`, :mod:`tqstore.dump.restore`).
"""
from __future__ import annotations

from typing import Any, Dict, List

from .._format.names import check_flag
from .._gcpause import paused
from .._gilswitch import quick_handoff
from ..running_loads import waits_for_running_loads
from .publish import lock_path, marker_path
from .reader import DumpIndex, describe_dump, open_dump, read_index, row_index_dict, verify_dump
from .writer import DumpHandle

PathLike = Any


class DumpMixin:
    """``dump_data_by_key``, ``load_data_by_key`` and ``recover_data_load`` of :class:`~tqstore.Store`."""

    @waits_for_running_loads
    def dump_data_by_key(self, dump_dir: PathLike, keys: List[str], partition_id: str, *, blocking: bool = True):
        """Dump exactly ``keys`` of ``partition_id`` to the directory ``dump_dir``, atomically.

        The keys are resolved at an MVCC cut (duplicates dropped, the first kept); puts,
        overwrites and clears after the cut never reach the dump.  Each unit owning dumped
        frames writes its own shard (frames copied byte for byte from its segments, in
        parallel); ``rows.json`` holds every dumped row (key, source global index, tag,
        produced fields; rows with no produced field too), in the partition's insertion order
        whatever the order of ``keys`` (a load numbers new keys in that order: GRPO groups
        dumped whole load as whole groups), and the partition's schemas;
        ``MANIFEST.json`` is written last.  The dump is written into ``<dir>.tmp`` and
        renamed into place (a previous dump there stays readable until the new one is
        durable) under the exclusive lock ``<dir>.lock``, which every dump, load and
        ``read_row_index`` of the path takes, also in other processes.  An empty key list
        gives a valid empty dump.

        Args:
            dump_dir: target directory: missing, empty, or a dump (replaced); its parent is
                created if missing.  Symlinks are resolved.
            keys: list (or tuple) of str.
            partition_id: the partition (it must exist, also for an empty key list).
            blocking: False returns a :class:`DumpHandle` right after the cut (``stall_s``);
                the write runs in a background thread (one save or dump in flight per store).
                The keys are then checked in the cut's snapshot by that thread: a key that is
                unknown or not a valid key raises from ``result()`` (nothing written); an
                unknown partition or a keys argument that is not a list or tuple still raises
                at once.

        Returns:
            The report mapping: ``keys`` (rows dumped), ``rows_with_data``, ``shards``,
            ``bytes`` (of the dump's files), ``frames``, ``payload_bytes``, ``path``,
            ``partition_id``, ``stall_s``, ``write_s`` (or a handle whose ``result()`` is it).

        Raises:
            InvalidInputError: ``keys`` is not a list (or tuple) of valid str keys, or
                ``blocking`` is not a bool (nothing written); or the row index would pass the
                1 GiB a reader accepts (tags of long text: nothing published, the previous dump
                intact).
            PartitionNotFoundError, KeyNotFoundError: an unknown partition or key (nothing
                written, no directory left; with ``blocking=False`` a key's error is raised by
                the handle's ``result()``).
            RestorePendingError: ``<dir>.restore`` exists while no call holds ``<dir>.lock``
                (a load left unresolved may still read the dump; call
                ``recover_data_load(dump_dir)``; while a call holds the lock, a load may be
                running, in this process or another: the dump waits for the lock and checks
                the marker again under it, so the error may come after the cut, from the
                handle's ``result()`` with ``blocking=False``), or the partition has an unresolved
                restore (a load of it that another thread of this process runs is waited for
                instead).
            CheckpointError: the target is a file, a user's directory, a store, a checkpoint,
                or inside one of those; its name is longer than 243 bytes (a load writes
                ``<dir>.restore.tmp`` beside it); a user's directory named ``<dir>.tmp`` or
                ``<dir>.old`` is in the way; or the write failed (a previous dump is intact; or,
                when the message says the new one is in place, only making it durable
                failed: the path holds the new one, or after a crash the previous one).
            CorruptionError: a stored frame does not verify (names file and offset).
        """
        from .writer import dump

        with paused(), quick_handoff():  # thousands of small objects per call: no full collection in between
            return dump(self, dump_dir, keys, partition_id, blocking=blocking)

    @waits_for_running_loads
    def load_data_by_key(self, dump_dir) -> Dict[str, Any]:
        """Merge the rows of the dump at ``dump_dir`` into the running store.

        Everything but the frames is checked first (manifest, row index, shard sizes, headers
        and tables, format versions, the shards' frames against the row index, the dump's
        schema against the live partition's); then target units read only their frames' byte
        ranges, check each (CRC32C against the dump's record, structure, field name), in
        bounded batches, in parallel, re-stamping frames whose global index changes (CRC
        recomputed).  Existing keys keep their global index (their tag becomes the dump's and
        the dumped fields' values replace theirs), new keys get fresh ones; other keys,
        partitions, sampler and consumption state are untouched.  Any source unit count onto
        any target count.  Holds ``<dir>.lock`` exclusively and keeps a ``<dir>.restore``
        marker while the load may read the dump; a dump on read-only storage (a read-only
        file system, a directory this process may not write) is loaded creating nothing
        beside it: under its lock file when there is one, without a marker.

        Returns:
            a report: ``keys``, ``new_keys``, ``existing_keys``, ``rows_with_data``,
            ``frames``, ``bytes`` (read and verified), ``partition_id``, ``restore_id``,
            ``seconds``, and ``phases_s``: the seconds of its steps (``check_s``: the
            checks of the dump; ``begin_s``: the controller's begin; ``import_s``: the units'
            reads, checks and appends; ``commit_s``: publish, finish, settle).

        Raises:
            CheckpointNotFoundError: no dump at ``dump_dir`` (a FileNotFoundError).
            FormatVersionError: a dump file of another format version.
            CorruptionError: a missing, truncated or damaged file (names file and offset).
            SchemaError: a field's kind clashes with the live partition's (or its dtype, with
                ``strict_schema=True``; else the field becomes mixed).
            CapacityError: a unit would hold more rows with data than ``total_storage_size``
                gives it (nothing is written).
            RestorePendingError: the partition has an unresolved restore (a load of it that
                another thread of this process runs is waited for instead).
            CheckpointError: the dump's restore marker ``<dir>.restore`` cannot be written,
                or is there but cannot be read (it may list other stores' pending loads: it
                is left as it is); or the dump's name is longer than 243 bytes (room for
                the marker's temporary file beside it).
            In every case nothing was written (a restore that failed once its units started
            is cancelled before the error is raised; should the cancel fail too, the restore
            stays pending and the error says to call :meth:`recover_data_load`), except for an
            error raised after the commit point (the controller's finish committed): then the
            load is complete and is settled as such before the error is raised.  If the
            process dies during the load, the restore stays pending: :meth:`recover_data_load`
            settles it.  Should settling the units fail after the commit point, the load
            still returns (it is complete; the failure is logged) and the restore stays
            recorded as committed: the calls it blocks raise RestorePendingError until
            :meth:`recover_data_load` or the next open settles it.
        """
        from . import restore

        self._check_open()
        with paused(), quick_handoff():
            return restore.load(self, dump_dir)

    def recover_data_load(self, dump_dir, cancel: bool = False) -> bool:
        """Settle an unresolved restore from ``dump_dir`` (a load interrupted by an error it
        could not undo, or by the death of its process): complete it (the units not complete
        re-import their frames; the dump is checked again) or, with ``cancel=True``, cancel
        it (units drop what it wrote, then its reserved indexes are freed).  A restore that
        was committed before a crash is completed either way; one a failed load had already
        cancelled (it could not undo its writes: a full disk) is cancelled either way, with a
        warning: none of its keys were loaded, so load the dump again.

        Returns True when a restore of ``dump_dir`` was pending and is settled now, False when
        none was (so repeating the call after a lost reply is safe).

        Raises:
            CorruptionError, FormatVersionError, CheckpointNotFoundError: completing needs the
                dump and it does not check, or a unit lost frames it had imported (say, to a
                power loss in the default durability); the restore stays pending: cancel it.
            CapacityError: completing it would take a unit past ``total_storage_size`` (a
                pending restore holds no room; nothing is written, it stays pending).
            InvalidInputError: ``dump_dir`` is not a path, or ``cancel`` is not a bool.
        """
        from . import restore

        self._check_open()
        cancel = check_flag("cancel", cancel)
        with paused(), quick_handoff():
            return restore.recover(self, dump_dir, cancel=cancel)



def read_row_index(dump_dir: PathLike) -> Dict[str, Any]:
    """The row index of the dump at ``dump_dir``, without reading any payload:
    ``{"partition_id", "format_version", "num_units", "rows": {key: {"tag", "fields",
    "gidx"}}, "schemas": {field: {"kind", "dtype"}}}`` (rows in dump order: the source partition's
    insertion order; a key without a tag has the tag ``{}``, as ``kv_list`` gives it).  Holds the path's
    lock and repairs an interrupted publication first.

    Raises:
        CheckpointNotFoundError: no dump there (a FileNotFoundError).
        FormatVersionError: a format version this tqstore does not read.
        CorruptionError: a damaged manifest or row index (names the file).
        StorageIOError: the manifest or row index cannot be read (no permission, an I/O
            error).
        CheckpointError: the dump's lock cannot be taken (a link or FIFO where its lock file
            belongs, say).
    """
    return row_index_dict(read_index(dump_dir))


__all__ = ["DumpMixin", "DumpHandle", "DumpIndex", "read_row_index", "describe_dump", "verify_dump", "open_dump",
           "read_index", "lock_path", "marker_path"]
