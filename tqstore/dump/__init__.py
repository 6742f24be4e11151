"""Selective dump and restore by key (DESIGN.md §5; docs/FORMAT.md, "Dump directory" and
"Selective restores").

``Store.load_data_by_key`` / ``Store.recover_data_load`` (mixed into :class:`~tqstore.Store`
by :class:`DumpMixin`; ``tqstore.load_data_by_key`` / ``recover_data_load`` forward to the
default store's).  Engine over the ports: the payload moves inside the units.
"""
from __future__ import annotations

from typing import Any, Dict


class DumpMixin:
    """The selective dump and restore calls of :class:`~tqstore.Store`."""

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
        marker while the load may read the dump.

        Returns:
            a report: ``keys``, ``new_keys``, ``existing_keys``, ``rows_with_data``,
            ``frames``, ``bytes`` (read and verified), ``partition_id``, ``restore_id``,
            ``seconds``.

        Raises:
            CheckpointNotFoundError: no dump at ``dump_dir`` (a FileNotFoundError).
            FormatVersionError: a dump file of another format version.
            CorruptionError: a missing, truncated or damaged file (names file and offset).
            SchemaError: a field's kind or dtype clashes with the live partition's.
            RestorePendingError: the partition has an unresolved restore.
            In every case nothing was written (a restore that failed once its units started
            is cancelled before the error is raised).  If the process dies during the load,
            the restore stays pending: :meth:`recover_data_load` settles it.
        """
        from . import restore

        self._check_open()
        return restore.load(self, dump_dir)

    def recover_data_load(self, dump_dir, cancel: bool = False) -> bool:
        """Settle an unresolved restore from ``dump_dir`` (a load interrupted by an error it
        could not undo, or by the death of its process): complete it (the units not complete
        re-import their frames; the dump is checked again) or, with ``cancel=True``, cancel
        it (units drop what it wrote, then its reserved indexes are freed).  A restore that
        was committed before a crash is completed either way.

        Returns True when a restore of ``dump_dir`` was pending and is settled now, False when
        none was (so repeating the call after a lost reply is safe).

        Raises:
            CorruptionError, FormatVersionError, CheckpointNotFoundError: completing needs the
                dump and it does not check (the restore stays pending; cancel it instead).
        """
        from . import restore

        self._check_open()
        return restore.recover(self, dump_dir, cancel=bool(cancel))


__all__ = ["DumpMixin"]
