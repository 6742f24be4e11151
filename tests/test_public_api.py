"""The public names of ``tqstore`` are pinned: adding or removing one is a deliberate act
(update ``EXPECTED`` in the same change)."""
from __future__ import annotations

import inspect

import tqstore
from tqstore.client import FORWARDED, TransferQueueClient
from tqstore.store import Store

EXPECTED = {
    "__version__",
    # lifecycle and object API
    "init", "close", "current_store", "Store", "open", "get_client", "TransferQueueClient",
    # errors
    "TqstoreError", "ConfigError", "InvalidInputError", "SchemaError", "UnsupportedTypeError", "NotFoundError",
    "PartitionNotFoundError", "PartitionKeysNotFoundError", "KeyNotFoundError", "FieldNotFoundError", "StoreClosedError", "CapacityError",
    "StorageIOError", "CorruptionError", "FormatVersionError", "CheckpointError", "CheckpointNotFoundError",
    "RestorePendingError", "DistributedError", "StorageKeyNotFoundError", "StalePartitionError", "WaitTimeoutError",
    # KV
    "kv_put", "kv_batch_put", "kv_batch_get", "kv_batch_get_by_meta", "kv_list", "kv_clear", "KVBatchMeta",
    # streaming
    "get_meta", "put", "get_data", "clear_partition", "clear_samples", "get_consumption_status",
    "get_production_status", "check_consumption_status", "check_production_status", "reset_consumption",
    "get_partition_list", "BatchMeta",
    # samplers
    "BaseSampler", "SequentialSampler", "GRPOGroupNSampler", "RankAwareSampler", "RandomSampler",
    # checkpoints
    "save_checkpoint", "load_checkpoint", "CheckpointManager", "verify_checkpoint",
    "CheckpointFallbackWarning",  # (named in the README: filterwarnings(category=tq.CheckpointFallbackWarning))
    # selective dump and restore by key (issue 10)
    "dump_data_by_key", "read_row_index", "load_data_by_key", "recover_data_load",
    # how often to checkpoint (tqstore.policy)
    "checkpoint_interval", "young_interval", "expected_overhead",
    # TransferQueue drop-in: async twins, streaming dataset, seqlen balancing, metrics
    "async_kv_put", "async_kv_batch_put", "async_kv_batch_get", "async_kv_batch_get_by_meta", "async_kv_list",
    "async_kv_clear", "AsyncTransferQueueClient", "StreamingDataset", "StreamingDataLoader",
    "SeqlenBalancedSampler", "get_seqlen_balanced_partitions", "get_metrics_endpoint",
}


def test_all_is_exactly_the_pinned_public_names():
    assert len(tqstore.__all__) == len(set(tqstore.__all__)), "duplicate names in __all__"
    assert set(tqstore.__all__) == EXPECTED


def test_every_public_name_resolves():
    for name in tqstore.__all__:
        assert getattr(tqstore, name) is not None, name


def test_module_functions_and_client_methods_mirror_the_store_methods():
    for name in FORWARDED:
        store_sig = inspect.signature(getattr(Store, name))
        params = list(store_sig.parameters.values())[1:]
        assert inspect.signature(getattr(tqstore, name)) == store_sig.replace(parameters=params), name
        assert inspect.signature(getattr(TransferQueueClient(None), name)) == store_sig.replace(parameters=params)
        assert getattr(tqstore, name).__doc__ == getattr(Store, name).__doc__


def test_async_twins_mirror_the_sync_signatures():
    for name in FORWARDED:
        assert inspect.signature(getattr(TransferQueueClient(None), "async_" + name)) == \
            inspect.signature(getattr(TransferQueueClient(None), name)), name
    for name in ("kv_put", "kv_batch_put", "kv_batch_get", "kv_batch_get_by_meta", "kv_list", "kv_clear"):
        assert inspect.signature(getattr(tqstore, "async_" + name)) == inspect.signature(getattr(tqstore, name))


def test_not_found_errors_catch_as_key_and_value_errors_with_a_readable_message():
    err = tqstore.KeyNotFoundError("key 'a' not in partition 'p'")
    assert isinstance(err, KeyError) and isinstance(err, ValueError) and isinstance(err, tqstore.TqstoreError)
    assert str(err) == "key 'a' not in partition 'p'"
    mro = tqstore.KeyNotFoundError.__mro__
    assert mro.index(KeyError) < mro.index(ValueError) < mro.index(Exception)


def test_errors_inherit_the_matching_builtins():
    assert issubclass(tqstore.InvalidInputError, ValueError)
    assert issubclass(tqstore.KeyNotFoundError, KeyError)
    assert issubclass(tqstore.UnsupportedTypeError, TypeError)
    assert issubclass(tqstore.StoreClosedError, RuntimeError)
