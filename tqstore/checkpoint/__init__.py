"""Checkpoints of a whole store: MVCC snapshot, atomic publication, generations, loads.

``Store.save_checkpoint`` / ``Store.load_checkpoint`` (mixed into :class:`~tqstore.Store`
by :class:`CheckpointMixin`; ``tqstore.save_checkpoint`` / ``load_checkpoint`` forward to the
default store's), :class:`CheckpointManager`, :func:`verify_checkpoint`.  On-disk layout:
docs/FORMAT.md, "Checkpoints".
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator, Mapping, Optional

from .._gilswitch import quick_handoff
from .._io.locks import telling_waits  # (for the command line: a wait on a path's lock said on stderr)
from .. import running_loads
from ..running_loads import waits_for_running_loads
from .loader import LoadInfo
from .manager import CheckpointFallbackWarning, CheckpointManager
from .retention import KeepAll, KeepAny, KeepEvery, KeepLast, KeepSteps, RetentionPolicy
from .verify import CheckpointReport, Problem, read_manifest, resolve_checkpoint_dir, verify_checkpoint
from .writer import CheckpointInfo, SaveHandle


class CheckpointMixin:
    """``save_checkpoint`` and ``load_checkpoint`` of :class:`~tqstore.Store`."""

    @waits_for_running_loads
    def save_checkpoint(self, checkpoint_dir, *, include_storage: bool = True,
                        metadata: Optional[Mapping[str, Any]] = None, blocking: bool = True,
                        copy_segments: bool = False):
        """Save the whole store to ``checkpoint_dir`` atomically.

        The store is cut under its write lock (each unit seals its active segment; read
        transactions pin the state); puts and clears go on at once and never reach the
        checkpoint.  The checkpoint is written into ``<dir>.tmp-XXXXXXXX``, every file and
        directory fsynced, MANIFEST.json written last, then renamed into place (an existing
        checkpoint there is replaced atomically and stays readable until the new one is
        durable; a concurrent load of that path, also from another process, sees the old
        checkpoint or the new one).

        Only a tqstore checkpoint is ever replaced, and an empty directory filled: anything
        else at ``checkpoint_dir`` (a file, a user's directory, a store directory) is
        refused before anything is touched, as is a path inside a store directory (the
        live store included), a checkpoint or a generation root.  A symlinked path is
        resolved: the checkpoint is published at the link's target, the link stays.

        Args:
            checkpoint_dir: target directory (its parent is created if missing).
            include_storage: False saves the controller only (partitions, keys, tags,
                consumption, sampler state); loading it leaves every field unproduced.
            metadata: JSON-serialisable mapping stored in MANIFEST.json.
            blocking: False returns a :class:`SaveHandle` right after the cut; the write
                runs in a background thread.  One save is in flight per store: a second
                save or load call waits for it to finish, and raises its error if the
                handle's ``result()`` has not.
            copy_segments: copy segment files even when they could be hard-linked.

        Returns:
            :class:`CheckpointInfo`, or a :class:`SaveHandle` with ``blocking=False``.

        Raises:
            InvalidInputError: metadata is not JSON, or ``blocking`` is not a bool (nothing was
                cut).
            CheckpointError: the target is not a checkpoint, not empty, or inside a store,
                a checkpoint or a generation root (nothing was cut or written); the save
                failed (the previous checkpoint at the path is intact; or, when the message
                says the new one is in place, only making it durable failed: the path holds
                the new one, or after a crash the previous one); or the previous background
                save failed unseen.
            CorruptionError: a store segment does not verify (names file and offset).
            RestorePendingError: a load by key into the store is unresolved (its message
                says what to call; nothing was cut).
        """
        from . import writer

        self._check_open()
        with quick_handoff():
            return writer.save(self, checkpoint_dir, include_storage=include_storage, metadata=metadata,
                               blocking=blocking, copy_segments=copy_segments)

    @waits_for_running_loads
    def load_checkpoint(self, checkpoint_dir) -> LoadInfo:
        """Replace the whole store with the checkpoint at ``checkpoint_dir``, transactionally.

        Verifies the manifest and every byte used (CRC32C), builds the new state beside the
        live one and switches with one atomic rename; on any failure the store is exactly
        as it was.  Works into a store holding data (the result equals the checkpoint) and
        onto any unit count (rows re-routed by global index, each unit reading only its
        rows' byte ranges).  New rows never collide with loaded ones (the allocator state
        is part of the checkpoint), and a BatchMeta taken before the load (a rollback) names
        none of the rows put after it: reading, putting, tagging or clearing through it raises
        ``KeyNotFoundError`` or touches nothing, though those rows reuse its global indexes.
        The load holds the path's lock file shared (see :func:`target.reading`): a save
        replacing that checkpoint meanwhile, in any process, publishes only after the load,
        so the load sees one complete checkpoint.

        Raises:
            CheckpointNotFoundError: no directory or no MANIFEST.json (a FileNotFoundError).
            FormatVersionError: an unknown checkpoint format version.
            CorruptionError: a file is missing, truncated or does not match its CRC32C
                (names file and offset).
            CheckpointError: the previous background save failed unseen, or an I/O error.
            RestorePendingError: a load by key into the store is unresolved (nothing was
                loaded).
        """
        from . import loader, writer
        from .target import reading

        self._check_open()
        st = writer.state_of(self)
        with st.lock:  # our own background save first: it may need the lock exclusively to publish
            writer.settle(st)
            with reading(checkpoint_dir), quick_handoff():
                return loader.load(self, checkpoint_dir)

    @contextlib.contextmanager
    def _long_calls_ended(self) -> Iterator[None]:
        """For ``close``: the ``with`` body runs once the long calls of other threads have
        ended, holding the store's checkpoint lock, which a blocking save or dump holds for
        its whole run (one called meanwhile waits for it, then finds the store closed): a
        background save or dump is waited for (its error logged), then every load by key (or
        recovery) another thread runs."""
        from . import writer

        st = writer.state_of(self)
        with st.lock:
            writer.wait_quietly(self)
            running_loads.of(self).wait_others()
            yield


__all__ = [
    "CheckpointMixin", "CheckpointManager", "verify_checkpoint",
    "read_manifest", "resolve_checkpoint_dir", "CheckpointInfo", "SaveHandle", "LoadInfo", "CheckpointReport",
    "Problem", "CheckpointFallbackWarning", "RetentionPolicy", "KeepAll", "KeepLast", "KeepEvery", "KeepAny", "KeepSteps",
]
