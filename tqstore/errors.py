"""The tqstore error hierarchy.

Every error raised through the public API derives from :class:`TqstoreError`
and, where one fits, from the matching builtin, so ``except KeyError`` or
``except FileNotFoundError`` in user code keeps working.  Each error names what
failed and, where there is one, what to do about it.
"""
from __future__ import annotations

from typing import Optional


class TqstoreError(Exception):
    """Base of every error tqstore raises on purpose."""


class ConfigError(TqstoreError, ValueError):
    """A configuration value is missing, of the wrong type, or contradicts the store."""


class InvalidInputError(TqstoreError, ValueError):
    """A call's arguments are inconsistent (sizes, duplicates, types); nothing was written."""


class SchemaError(InvalidInputError):
    """A field's dtype or kind clashes with the schema recorded for it; nothing was written."""


class UnsupportedTypeError(InvalidInputError, TypeError):
    """A value of a type tqstore cannot store safely (no pickle) was given."""


class NotFoundError(TqstoreError, KeyError, ValueError):
    """A partition, key, field or row does not exist.

    Catches as ``KeyError`` and, like TransferQueue's not-found errors, as ``ValueError``.
    """

    def __str__(self) -> str:  # KeyError quotes its argument; keep the message readable
        return str(self.args[0]) if self.args else ""


class PartitionNotFoundError(NotFoundError):
    """The partition does not exist."""


class PartitionKeysNotFoundError(PartitionNotFoundError, RuntimeError):
    """``kv_retrieve_keys`` of a partition that does not exist (a RuntimeError, as TransferQueue's
    client raises there)."""


class KeyNotFoundError(NotFoundError):
    """A key does not exist in the partition."""


class FieldNotFoundError(NotFoundError):
    """A requested field was never produced for a row."""


class StorageKeyNotFoundError(KeyNotFoundError):
    """Rows a ``BatchMeta`` names no longer exist: cleared since the meta was made, or replaced by
    a ``load_checkpoint`` since, or the meta is another store's (TransferQueue's name for this
    race, whose callers catch it to skip such a batch); get fresh metadata."""


class StalePartitionError(PartitionNotFoundError, StorageKeyNotFoundError):
    """The partition a ``BatchMeta`` names no longer exists (cleared since the meta was made):
    a :class:`PartitionNotFoundError` and, as in TransferQueue, a :class:`StorageKeyNotFoundError`."""


class WaitTimeoutError(TqstoreError, TimeoutError, RuntimeError):
    """A wait ran out of time: a fetch that waits for producers found too few rows (nothing
    was taken), or a save's or dump's handle was asked for its result before it finished (it
    goes on).  Catches as ``TimeoutError`` and, as TransferQueue's client raises it, as
    ``RuntimeError``."""

    @classmethod
    def still_running(cls, what: str, path, timeout) -> "WaitTimeoutError":
        """The error of a save's or dump's handle asked for its result too early."""
        return cls(f"{what} to {path} still running after {timeout} s")


class StoreClosedError(TqstoreError, RuntimeError):
    """The store (or the module-level default store) is closed or was never opened."""


class CapacityError(TqstoreError, MemoryError):
    """A size limit was reached; the message names the setting to raise."""

    def __init__(self, message: str, *, setting: Optional[str] = None) -> None:
        super().__init__(message)
        self.setting = setting


class StorageIOError(TqstoreError, OSError):
    """An operating-system call failed; the message says which file and which step."""


class CorruptionError(TqstoreError, ValueError):
    """Stored bytes do not verify: a torn, truncated, bit-flipped or foreign record or file.

    Attributes ``path``, ``offset``, ``expected_crc`` and ``actual_crc`` say where and how.
    """

    def __init__(
        self,
        message: str,
        *,
        path: Optional[str] = None,
        offset: Optional[int] = None,
        expected_crc: Optional[int] = None,
        actual_crc: Optional[int] = None,
    ) -> None:
        parts = [message]
        if path is not None:
            parts.append(f"file {path}")
        if offset is not None:
            parts.append(f"offset {offset}")
        if expected_crc is not None and actual_crc is not None:
            parts.append(f"expected crc32c {expected_crc:#010x}, got {actual_crc:#010x}")
        super().__init__(": ".join(parts[:1]) + ("" if len(parts) == 1 else " (" + ", ".join(parts[1:]) + ")"))
        self.message = message  # without the location
        self.path = path
        self.offset = offset
        self.expected_crc = expected_crc
        self.actual_crc = actual_crc


class FormatVersionError(CorruptionError):
    """A file declares a format version this tqstore cannot read (named in the message)."""


class CheckpointError(TqstoreError):
    """A checkpoint could not be written or loaded; the live store is unchanged."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """The checkpoint directory or its MANIFEST.json does not exist."""


class RestorePendingError(TqstoreError, RuntimeError):
    """A selective restore into this partition is unresolved (its load is running, or failed
    or died: then run ``recover_data_load``); ``rid`` names the restore when known."""

    def __init__(self, message: str, *, rid: Optional[str] = None) -> None:
        super().__init__(message)
        self.rid = rid

    def __reduce__(self):  # (pickled with its rid: it crosses processes)
        return (_restore_pending_error, (self.args[0] if self.args else "", self.rid))


def _restore_pending_error(message: str, rid: Optional[str]) -> "RestorePendingError":
    return RestorePendingError(message, rid=rid)


class DistributedError(TqstoreError, RuntimeError):
    """A part of a store on a Ray cluster (a unit or the controller, an actor) failed or could
    not be reached; ``outcomes`` maps each part the operation involved to what happened to it."""

    def __init__(self, message: str, *, outcomes=None) -> None:
        super().__init__(message)
        self.outcomes = dict(outcomes or {})

    def __reduce__(self):  # (pickled with its outcomes: it crosses processes)
        return (_distributed_error, (self.args[0] if self.args else "", self.outcomes))


def _distributed_error(message: str, outcomes) -> "DistributedError":
    return DistributedError(message, outcomes=outcomes)


__all__ = [
    "TqstoreError",
    "ConfigError",
    "InvalidInputError",
    "SchemaError",
    "UnsupportedTypeError",
    "NotFoundError",
    "PartitionNotFoundError",
    "PartitionKeysNotFoundError",
    "KeyNotFoundError",
    "FieldNotFoundError",
    "StorageKeyNotFoundError",
    "StalePartitionError",
    "WaitTimeoutError",
    "StoreClosedError",
    "CapacityError",
    "StorageIOError",
    "CorruptionError",
    "FormatVersionError",
    "CheckpointError",
    "CheckpointNotFoundError",
    "RestorePendingError",
    "DistributedError",
]
