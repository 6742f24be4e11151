"""tqstore: an embedded storage engine for the sample buffer of RL post-training.

``import tqstore as tq``; ``tq.init({"path": ...})`` opens the default store that the
module functions act on; ``tqstore.open(path)`` gives a :class:`Store` object.
"""
from __future__ import annotations

import logging

from ._version import __version__
from .api import close, current_store, init
from .errors import (
    CapacityError, CheckpointError, CheckpointNotFoundError, ConfigError, CorruptionError, FieldNotFoundError,
    FormatVersionError, InvalidInputError, KeyNotFoundError, NotFoundError, PartitionNotFoundError,
    RestorePendingError, SchemaError, StorageIOError, StoreClosedError, TqstoreError, UnsupportedTypeError,
)
from .store import Store, open

logging.getLogger("tqstore").addHandler(logging.NullHandler())

__all__ = [
    "__version__",
    "init", "close", "current_store", "Store", "open",
    "TqstoreError", "ConfigError", "InvalidInputError", "SchemaError", "UnsupportedTypeError", "NotFoundError",
    "PartitionNotFoundError", "KeyNotFoundError", "FieldNotFoundError", "StoreClosedError", "CapacityError",
    "StorageIOError", "CorruptionError", "FormatVersionError", "CheckpointError", "CheckpointNotFoundError",
    "RestorePendingError",
]
