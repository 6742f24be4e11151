"""``StreamingDataset`` / ``StreamingDataLoader``: a torch ``IterableDataset`` over ``get_meta`` + ``get_data``
for one task (TransferQueue's ``transfer_queue.dataloader``, same arguments).

Each iteration step fetches ``batch_size`` rows for ``task_name`` (``sampling_config`` carries
``dp_rank`` and ``batch_index``, so ranks of one data-parallel group get the same rows with
the rank-aware samplers), reads them as a ``TensorDict`` and yields ``(micro_batch, meta)``
pairs cut by ``process_batch_fn`` (default :func:`chunk_batch_fn`).

The batch is a ``TensorDict`` whatever the store's result type (the torch adapter's
:func:`~tqstore.torch_adapter.to_tensordict` converts a plain mapping).
"""
from __future__ import annotations

import logging
import operator
import os
import time
from typing import Any, Callable, Iterator, List, Optional, Tuple

import torch
from torch.utils.data import DataLoader, IterableDataset

from .errors import InvalidInputError, TqstoreError, WaitTimeoutError
from .meta import BatchMeta
from .torch_adapter import to_tensordict

log = logging.getLogger("tqstore")

#: seconds to wait after an empty fetch (TransferQueue's TQ_STREAMING_DATASET_EMPTY_BATCH_SLEEP_INTERVAL)
EMPTY_BATCH_SLEEP_S = float(os.environ.get("TQ_STREAMING_DATASET_EMPTY_BATCH_SLEEP_INTERVAL", 1))


def default_fetch_batch_fn(tq_client: Any, data_fields: List[str], batch_size: int, partition_id: str,
                           task_name: str, sampling_config: dict, batch_index: int) -> Tuple[Any, BatchMeta]:
    """One ``get_meta`` (+ ``get_data`` when rows came back): ``(TensorDict or None, BatchMeta)``."""
    cfg = {k: v for k, v in {**sampling_config, "batch_index": batch_index}.items()
           if k not in ("task_name", "partition_id")}  # passed as get_meta's own arguments
    meta = tq_client.get_meta(data_fields=data_fields, batch_size=batch_size, partition_id=partition_id,
                              task_name=task_name, sampling_config=cfg)
    if meta.size == 0:
        log.debug("StreamingDataset: empty batch for task %r in %r; waiting for data", task_name, partition_id)
        return None, meta
    return to_tensordict(tq_client.get_data(meta), meta.size), meta


def chunk_batch_fn(td: Any, batch_meta: BatchMeta, micro_batch_size: int = 1) -> List[Tuple[Any, BatchMeta]]:
    """Split a TensorDict and its BatchMeta into micro-batches of ``micro_batch_size`` rows (the last may be smaller).

    Nested (jagged or strided) fields are re-nested per chunk in their layout.

    Raises:
        TypeError: ``td`` is not a TensorDict.
        ValueError: ``micro_batch_size`` not a positive int or larger than the batch, or no batch dimension.
    """
    from tensordict import TensorDict
    if not isinstance(td, TensorDict):
        raise TypeError(f"Expected TensorDict, got {type(td).__name__}")
    if isinstance(micro_batch_size, bool) or not isinstance(micro_batch_size, int) or micro_batch_size <= 0:
        raise InvalidInputError(f"micro_batch_size must be a positive integer, got {micro_batch_size}")
    if len(td.batch_size) == 0:
        raise InvalidInputError("Input TensorDict must have non-empty batch_size")
    total = int(td.batch_size[0])
    if micro_batch_size > total:
        raise InvalidInputError(f"micro_batch_size ({micro_batch_size}) exceeds total batch size ({total})")
    splits = (total + micro_batch_size - 1) // micro_batch_size
    # each micro-batch's rows of the meta are the rows of its data: the same bounds (chunk()
    # cuts near-equal parts, 4 3 3 where the data is cut 4 4 2)
    metas = [batch_meta.select_samples(range(i * micro_batch_size, min((i + 1) * micro_batch_size, total)))
             for i in range(splits)]
    nested, dense = {}, {}
    for key, value in td.items():
        if isinstance(value, torch.Tensor) and value.is_nested:
            nested[key] = (value.unbind(0), value.layout)
        else:
            dense[key] = value
    dense_td = TensorDict(dense, batch_size=td.batch_size) if dense else None
    out = []
    for i in range(splits):
        start, end = i * micro_batch_size, min((i + 1) * micro_batch_size, total)
        chunk = dense_td[start:end] if dense_td is not None else TensorDict({}, batch_size=(end - start,))
        for key, (rows, layout) in nested.items():
            chunk[key] = torch.nested.as_nested_tensor(list(rows[start:end]), layout=layout)
        out.append((chunk, metas[i]))
    return out


class StreamingDataset(IterableDataset):
    """Batches of one task's rows from a store, as ``(TensorDict, BatchMeta)`` micro-batches.

    Args:
        config: TransferQueue's config (ignored: the default store of ``tq.init`` is used),
            a :class:`~tqstore.store.Store`, or a client.
        batch_size: rows fetched per ``get_meta``.
        micro_batch_size: rows per yielded micro-batch.
        data_fields: fields to read.
        partition_id, task_name: what to consume, and as whom.
        dp_rank: data-parallel group; ranks with one ``dp_rank`` get the same rows
            (with ``RankAwareSampler``-style samplers).
        should_check_consumption_status: False (default): an endless stream, waiting
            ``EMPTY_BATCH_SLEEP_S`` after an empty fetch (with ``polling_mode=False`` a fetch
            that finds no batch raises ``WaitTimeoutError`` instead, out of the iteration:
            the stream ends at the first wait longer than the fetch's timeout).  True: stop once the buffer is
            drained, a fetch comes back empty and the partition's rows are all consumed by
            ``task_name`` (so a replica still gets the share another replica of its
            ``dp_rank`` consumed for it).  The fetch waits for whole batches: rows left over
            when fewer than ``batch_size`` remain keep it waiting (logged once at WARNING).
            With ``polling_mode=False`` (an empty fetch raises ``WaitTimeoutError``) the
            iteration ends there too when every row is consumed; else the error is raised.
            No rows are reserved ahead (TransferQueue's ``TQ_PRE_ALLOC_SAMPLE_NUM``: a warning
            when it is set): the iteration ends once every row put so far is consumed.
        fetch_batch_fn: replaces :func:`default_fetch_batch_fn`.
        process_batch_fn: replaces :func:`chunk_batch_fn`.

    An iteration left early (``break`` after some micro-batches of a batch) loses nothing:
    the next iteration resumes with the batch's next micro-batch (TransferQueue's dataset
    starts with the next batch, and the rest of that one, consumed, is never yielded).
    ``data_fields`` may be one field name as a str.

    Raises:
        InvalidInputError: ``batch_size`` or ``micro_batch_size`` not a positive int,
            ``micro_batch_size`` larger than ``batch_size`` (with the default
            ``process_batch_fn``), no ``data_fields``, a ``dp_rank`` that is not an int
            of at least 0, a ``partition_id`` or ``task_name`` that is not a non-empty str.
    """

    def __init__(self, config: Any, batch_size: int, micro_batch_size: int, data_fields: List[str],
                 partition_id: str, task_name: str, dp_rank: int, should_check_consumption_status: bool = False,
                 fetch_batch_fn: Optional[Callable] = None, process_batch_fn: Optional[Callable] = None) -> None:
        for name, v in (("batch_size", batch_size), ("micro_batch_size", micro_batch_size)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InvalidInputError(f"{name} must be a positive int, got {v!r}")
        if process_batch_fn is None and micro_batch_size > batch_size:  # (else the first batch would be
            # consumed, then refused by chunk_batch_fn)
            raise InvalidInputError(f"micro_batch_size ({micro_batch_size}) exceeds batch_size ({batch_size})")
        if isinstance(data_fields, str):  # one field (as get_meta takes it), not its characters
            data_fields = [data_fields]
        if not isinstance(data_fields, (bytes, dict)) and hasattr(data_fields, "__iter__") \
                and not hasattr(data_fields, "__len__"):  # (a generator: its names, once)
            data_fields = list(data_fields)
        if isinstance(data_fields, (bytes, dict)) or not hasattr(data_fields, "__iter__") or len(data_fields) < 1 \
                or not all(isinstance(f, str) for f in data_fields):
            raise InvalidInputError(f"data_fields must be a list with at least one field name, got {data_fields!r}")
        try:
            if isinstance(dp_rank, bool):
                raise TypeError
            dp_rank = operator.index(dp_rank)  # (an int, or a numpy integer)
        except TypeError:
            raise InvalidInputError(f"dp_rank must be an int, got {dp_rank!r}") from None
        if dp_rank < 0:
            raise InvalidInputError(f"dp_rank {dp_rank} must be greater than or equal to 0")
        for name, v in (("partition_id", partition_id), ("task_name", task_name)):
            if not isinstance(v, str) or not v:
                raise InvalidInputError(f"{name} must be a non-empty str, got {v!r}")
        if should_check_consumption_status and os.environ.get("TQ_PRE_ALLOC_SAMPLE_NUM"):
            log.warning("StreamingDataset: TQ_PRE_ALLOC_SAMPLE_NUM is set, but tqstore reserves no rows ahead: "
                        "with should_check_consumption_status=True the iteration ends as soon as every row put so "
                        "far is consumed, even while producers are still putting (docs/MIGRATING.md)")
        super().__init__()
        self.config = config
        self.batch_size = batch_size
        self.micro_batch_size = micro_batch_size
        self.data_fields = list(data_fields)
        self.partition_id = partition_id
        self.task_name = task_name
        self.dp_rank = dp_rank
        self.should_check_consumption_status = should_check_consumption_status
        self.fetch_batch_fn = fetch_batch_fn or default_fetch_batch_fn
        self.process_batch_fn = process_batch_fn or chunk_batch_fn
        self.sampling_config = {"dp_rank": dp_rank, "task_name": task_name}
        self.buffer: List[Tuple[Any, BatchMeta]] = []
        self.batch_index = 0
        self._first = 0  # the batch index of buffer[0]
        self._started = False  # whether the first batch index was asked of the store
        self._micro_done = 0  # micro-batches of buffer[batch_index - _first] already yielded
        self._tq_client: Any = None

    def _client(self) -> Any:
        if self._tq_client is None:
            from .client import TransferQueueClient
            from .store import Store
            if isinstance(self.config, TransferQueueClient):
                self._tq_client = self.config
            else:
                self._tq_client = TransferQueueClient(self.config if isinstance(self.config, Store) else None)
        return self._tq_client

    def _finished(self, client: Any) -> bool:
        """After an empty fetch: True when ``should_check_consumption_status`` and ``task_name``
        has consumed every row of the partition.  (Asked only after a fetch came back empty, so
        a replica of a data-parallel group still gets the share another replica's fetch
        consumed and cached for it.)"""
        return self.should_check_consumption_status and \
            bool(client.check_consumption_status(self.task_name, self.partition_id))

    def _short_tail(self, client: Any) -> Optional[int]:
        """The number of rows left to ``task_name`` when all of them are produced and fewer
        than a fetch needs (``batch_size``, or what the store's sampler needs for it: the
        seqlen-balanced sampler forms every rank's batch at once; the fetch waits for them:
        more rows must come), else None."""
        try:
            _, consumed = client.get_consumption_status(self.task_name, self.partition_id)
            _, produced = client.get_production_status(self.data_fields, self.partition_id)
        except TqstoreError:  # (a field no row has yet, say: not a short tail)
            return None
        if consumed is None or produced is None or len(consumed) != len(produced):
            return None
        left = [all(p) for c, p in zip(consumed.tolist(), produced.tolist()) if not c]
        need = self.batch_size
        rows_per_fetch = getattr(getattr(client, "store", None), "rows_per_fetch", None)  # (Ray's store: a call)
        if rows_per_fetch is not None:
            try:
                need = int(rows_per_fetch(self.batch_size))
            except Exception:  # noqa: BLE001 - a user's sampler: the warning falls back to the batch size
                pass
        return len(left) if left and all(left) and len(left) < need else None

    def _start(self, client: Any) -> None:
        """A new dataset starts past the batches the store's rank cache holds for its ``(task,
        dp_rank)`` from an earlier run (a restart, a checkpoint restore: they were consumed
        then, and a count from 0 would be handed them again); every replica of the rank
        starts at the same index (``Store.first_batch_index``).  A store without that call
        (another client's) starts at 0."""
        self._started = True
        if self.buffer or self.batch_index:
            return  # (moved by the caller: left as it is)
        fn = getattr(getattr(client, "store", None), "first_batch_index", None)
        if fn is not None:
            self._first = self.batch_index = int(fn(self.partition_id, self.task_name, self.dp_rank))
            if self._first:
                log.info("StreamingDataset: task %r, dp_rank %d of partition %r starts at batch_index %d, past "
                         "the batches an earlier run was handed", self.task_name, self.dp_rank,
                         self.partition_id, self._first)

    def __iter__(self) -> Iterator[Tuple[Any, BatchMeta]]:
        client = self._client()
        if not self._started:
            self._start(client)
        warned = False
        while True:
            if self.batch_index - self._first < len(self.buffer):
                current = self.buffer[self.batch_index - self._first]
                done = self._micro_done  # (an iteration left early resumes after what it yielded)
                for i, micro in enumerate(self.process_batch_fn(*current, micro_batch_size=self.micro_batch_size)):
                    if i >= done:
                        self._micro_done = i + 1
                        yield micro
                self.batch_index += 1
                self._micro_done = 0
                continue
            try:
                data, meta = self.fetch_batch_fn(tq_client=client, data_fields=self.data_fields,
                                                 batch_size=self.batch_size, partition_id=self.partition_id,
                                                 task_name=self.task_name, sampling_config=self.sampling_config,
                                                 batch_index=self.batch_index)
            except WaitTimeoutError:  # (polling_mode=False: an empty fetch raises) the end, or no rows in time
                if self._finished(client):
                    return
                raise
            if data is not None:
                self.buffer.append((data, meta))
                continue
            if self._finished(client):
                return
            if self.should_check_consumption_status and not warned:
                left = self._short_tail(client)
                if left is not None:
                    warned = True
                    log.warning("StreamingDataset: %d rows of partition %r are left to task %r, fewer than a "
                                "fetch of batch_size=%d needs; the iteration ends when every row is consumed, so it "
                                "waits for more rows (a partition of whole batches ends)", left, self.partition_id,
                                self.task_name, self.batch_size)
            time.sleep(EMPTY_BATCH_SLEEP_S)

    def reset(self) -> None:
        """Iterate the buffered batches again from the first."""
        self.batch_index = self._first
        self._micro_done = 0

    def step(self, partition_id: str) -> None:
        """Switch to another partition, dropping the buffer (the next iteration asks where
        its batches start, as a new dataset does)."""
        self.buffer = []
        self.batch_index = self._first = 0
        self._started = False
        self._micro_done = 0
        self.partition_id = partition_id


def _identity_collate_fn(data: Any) -> Any:
    return data


class StreamingDataLoader(DataLoader):
    """A ``DataLoader`` over a :class:`StreamingDataset` (batching is the dataset's; ``batch_size=None``).

    ``num_workers`` must be 0 with the embedded backend: a store is one process's open LMDB
    environments, which forked workers must not share (docs/MIGRATING.md).
    """

    def __init__(self, dataset: StreamingDataset, num_workers: int = 0, collate_fn: Optional[Callable] = None,
                 pin_memory: bool = False, worker_init_fn: Optional[Callable] = None, multiprocessing_context=None,
                 prefetch_factor: Optional[int] = None, persistent_workers: bool = False,
                 pin_memory_device: str = "") -> None:
        if num_workers:
            raise InvalidInputError("StreamingDataLoader: num_workers must be 0 with tqstore's embedded store "
                                    "(worker processes cannot share its open LMDB environments)")
        kwargs = {"pin_memory_device": pin_memory_device} if pin_memory_device else {}
        super().__init__(dataset=dataset, batch_size=None, shuffle=None, sampler=None, batch_sampler=None,
                         num_workers=0, collate_fn=collate_fn or _identity_collate_fn, pin_memory=pin_memory,
                         drop_last=False, timeout=0, worker_init_fn=worker_init_fn,
                         multiprocessing_context=multiprocessing_context, generator=None,
                         prefetch_factor=prefetch_factor, persistent_workers=persistent_workers, **kwargs)

    def reset(self) -> None:
        self.dataset.reset()

    def step(self, partition_id: str) -> None:
        self.dataset.step(partition_id)

    def get_buffer(self) -> List[Tuple[Any, BatchMeta]]:
        """The dataset's buffer of fetched ``(batch, BatchMeta)`` pairs (TransferQueue's name)."""
        return self.dataset.buffer


__all__ = ["StreamingDataset", "StreamingDataLoader", "chunk_batch_fn", "default_fetch_batch_fn", "to_tensordict"]
