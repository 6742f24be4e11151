"""tqstore: an embedded storage engine for the sample buffer of RL post-training.

``import tqstore as tq``; ``tq.init({"path": ...})`` opens the default store that the
module functions act on; ``tqstore.open(path)`` gives a :class:`Store` object.

``import tqstore`` does not import torch (about 3 s on a loaded machine, and more than the
rest of tqstore many times over): the torch adapter (:mod:`tqstore.torch_adapter`) is
imported by the first store opened without an ``edge`` (every ``tq.init`` and
``tqstore.open``), and ``StreamingDataset`` / ``StreamingDataLoader`` (torch datasets) when
first named.  The command-line tools (they open stores with the numpy edge) and the Ray
backend's unit and controller actors never import it.
"""
from __future__ import annotations

import logging

from ._version import __version__
from . import edge as _edge
from .api import (
    check_consumption_status, check_production_status, clear_partition, clear_samples, close, current_store,
    get_client, get_consumption_status, get_data, get_meta, get_partition_list, get_production_status, init,
    kv_batch_get, kv_batch_get_by_meta, kv_batch_put, kv_clear, kv_list, kv_put, load_checkpoint, put,
    reset_consumption, save_checkpoint, get_metrics_endpoint, dump_data_by_key, read_row_index, load_data_by_key,
    recover_data_load, CheckpointManager,
)
from .async_api import (
    async_kv_batch_get, async_kv_batch_get_by_meta, async_kv_batch_put, async_kv_clear, async_kv_list, async_kv_put,
)
from .client import AsyncTransferQueueClient, TransferQueueClient
from .checkpoint import CheckpointFallbackWarning, verify_checkpoint
from .errors import (
    CapacityError, CheckpointError, CheckpointNotFoundError, ConfigError, CorruptionError, FieldNotFoundError,
    FormatVersionError, InvalidInputError, KeyNotFoundError, NotFoundError, PartitionKeysNotFoundError, PartitionNotFoundError,
    DistributedError, RestorePendingError, SchemaError, StalePartitionError, StorageIOError, StorageKeyNotFoundError,
    StoreClosedError, TqstoreError, UnsupportedTypeError, WaitTimeoutError,
)
from .meta import BatchMeta, KVBatchMeta
from .policy import checkpoint_interval, expected_overhead, young_interval
from .samplers import BaseSampler, GRPOGroupNSampler, RandomSampler, RankAwareSampler, SequentialSampler
from .seqlen_sampler import SeqlenBalancedSampler, get_seqlen_balanced_partitions
from .store import Store, open

logging.getLogger("tqstore").addHandler(logging.NullHandler())


def _torch_edge(result_type: str = "tensordict"):
    """The edge of a store opened without one: the torch adapter's, imported here on first use."""
    from .torch_adapter import TorchEdge

    return TorchEdge(result_type)


_edge.set_default_factory(_torch_edge)
_LAZY = {"StreamingDataset": "dataloader", "StreamingDataLoader": "dataloader"}


def __getattr__(name: str):
    """``StreamingDataset`` and ``StreamingDataLoader`` (torch datasets), imported when first named."""
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'tqstore' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{mod}", __name__), name)
    globals()[name] = value
    return value

__all__ = [
    "__version__",
    "init", "close", "current_store", "Store", "open",
    "TqstoreError", "ConfigError", "InvalidInputError", "SchemaError", "UnsupportedTypeError", "NotFoundError",
    "PartitionNotFoundError", "PartitionKeysNotFoundError", "KeyNotFoundError", "FieldNotFoundError", "StoreClosedError", "CapacityError",
    "StorageIOError", "CorruptionError", "FormatVersionError", "CheckpointError", "CheckpointNotFoundError",
    "RestorePendingError", "DistributedError", "StorageKeyNotFoundError", "StalePartitionError", "WaitTimeoutError",
    # data plane (issue 3)
    "get_client", "TransferQueueClient", "BatchMeta", "KVBatchMeta",
    "kv_put", "kv_batch_put", "kv_batch_get", "kv_batch_get_by_meta", "kv_list", "kv_clear",
    "get_meta", "put", "get_data", "clear_partition", "clear_samples", "get_consumption_status",
    "get_production_status", "check_consumption_status", "check_production_status", "reset_consumption",
    "get_partition_list", "save_checkpoint", "load_checkpoint",
    "CheckpointManager", "CheckpointFallbackWarning", "verify_checkpoint",
    # selective dump and restore (issue 10)
    "dump_data_by_key", "read_row_index", "load_data_by_key", "recover_data_load",
    "checkpoint_interval", "young_interval", "expected_overhead",
    "BaseSampler", "SequentialSampler", "GRPOGroupNSampler", "RankAwareSampler", "RandomSampler",
    # TransferQueue drop-in (issue 11)
    "async_kv_put", "async_kv_batch_put", "async_kv_batch_get", "async_kv_batch_get_by_meta", "async_kv_list",
    "async_kv_clear", "AsyncTransferQueueClient", "StreamingDataset", "StreamingDataLoader",
    "SeqlenBalancedSampler", "get_seqlen_balanced_partitions", "get_metrics_endpoint",
]
