"""Streaming calls of the data plane (TransferQueue-shaped), rows addressed by global index.

``put``, ``get_meta`` (modes ``fetch`` / ``force_fetch`` / ``insert``), ``get_data``,
``clear_samples``, ``clear_partition``, status queries; rows are
:class:`~tqstore.meta.BatchMeta`.  :class:`Streaming` is composed into
:class:`~tqstore.kv.DataPlane` and works through the same collaborators: the controller
(a :class:`~tqstore.ports.ControllerPort`, answering values) and the store's payload side
(``write`` / ``read`` / ``delete_rows`` / ``drop_partition``).

A fetch is one controller call (the controller chooses and marks rows in one transaction,
see :meth:`~tqstore.ports.ControllerPort.fetch`); waiting for producers (``timeout_s``)
happens here, on a condition the data plane notifies after every put.
"""
from __future__ import annotations

import logging
import time
from collections import defaultdict
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from ._format.columns import KIND_NAMES
from ._format.layout import KIND_VALUE
from ._format.names import check_field_name, check_name
from . import _interrupts as interrupts
from ._format.values import check_value, dumps_each
from .call_checks import (GIDX_END as _GIDX_END, NO_ROW as _NO_ROW, check_pid as _check_pid,
                          check_rows as _check_rows, check_task as _check_task,
                          check_timeout, checked_custom_meta as _checked_custom_meta, no_rows as _no_rows,
                          sampling_kwargs)
from .edge import join_rows
from .errors import (
    FieldNotFoundError, InvalidInputError, PartitionNotFoundError, StalePartitionError,
    StorageKeyNotFoundError,
)
from .meta import BatchMeta, KVBatchMeta
from .ports import RowBatch, check_no_restore

if TYPE_CHECKING:  # pragma: no cover
    from .kv import DataPlane

log = logging.getLogger("tqstore")

MODES = ("fetch", "force_fetch", "insert")
MAX_INSERT_ROWS = 1 << 24  # rows one get_meta(mode="insert") may reserve
MAX_BATCH_ROWS = 1 << 40  # the largest batch_size of any get_meta
_POLL_S = 0.05


# ---------------------------------------------------------------------------- helpers
def check_tags(tags: Sequence[Any]) -> List[Any]:
    """Each of ``tags`` checked as a put checks a tag (normalised for JSON).  Raises
    UnsupportedTypeError / InvalidInputError for the first that cannot be stored."""
    return [check_value(t, tag=True) for t in tags]


def _field_list(fields: Union[None, str, Sequence[str]], what: str = "select_fields") -> Optional[List[str]]:
    if fields is None:
        return None
    if isinstance(fields, str):
        return [fields]
    if not isinstance(fields, (list, tuple)) or not all(isinstance(f, str) for f in fields):
        raise InvalidInputError(f"{what} must be a str or a list of str, got {fields!r}")
    if len(set(fields)) != len(fields):
        raise InvalidInputError(f"{what} names a field twice: {list(fields)}")
    return list(fields)


def _tag_out(tag: Any) -> Any:
    return {} if tag is None else tag


def _no_partition(pid: str, known: Sequence[str]) -> PartitionNotFoundError:
    return PartitionNotFoundError(f"partition {pid!r} not found: it does not exist (known: {list(known)[:10]})")


def _field_names(data: Any) -> List[str]:
    if data is None:
        return []
    if not hasattr(data, "keys"):
        raise InvalidInputError(f"data must be a mapping of field name to batched value, got {type(data).__name__}")
    names = list(data.keys())
    bad = [k for k in names if not isinstance(k, str)]
    if bad:
        raise InvalidInputError(f"field names must be str, got {type(bad[0]).__name__} {bad[0]!r}")
    return names


def _schema_entry(edge: Any, kind: int, dtype: int) -> Dict[str, Any]:
    """A field's schema entry from the controller's (kind, dtype code); a non-tensor field has no
    shape and is not nested, a tensor field's shape is read from its rows later (BatchMeta)."""
    entry = {"dtype": edge.dtype(kind, dtype), "kind": KIND_NAMES.get(kind, "?"), "is_non_tensor": kind == KIND_VALUE}
    if kind == KIND_VALUE:
        entry["shape"], entry["is_nested"] = None, False
    return entry


def common_fields(fields: Sequence[frozenset]) -> frozenset:
    """The fields every row has produced (rows' field sets, usually a few distinct objects)."""
    distinct = set(fields)  # frozensets cache their hash: C speed per row
    return frozenset.intersection(*distinct) if distinct else frozenset()


def check_produced(rows: RowBatch, idx: Sequence[int], fields: Sequence[str]) -> None:
    """Raise FieldNotFoundError unless rows ``idx`` of ``rows`` have produced every one of ``fields``."""
    sets = rows.fields if isinstance(idx, range) and len(idx) == len(rows) else [rows.fields[j] for j in idx]
    distinct = set(sets)
    for f in fields:
        if all(f in fs for fs in distinct):
            continue
        lacking = [j for j, fs in zip(idx, sets) if f not in fs]
        named = [rows.keys[j] if rows.keys[j] is not None else rows.gidxs[j] for j in lacking[:3]]
        raise FieldNotFoundError(f"field {f!r} is not produced for {len(lacking)} row(s) of partition {rows.pid!r} "
                                 f"(e.g. {named!r}); fields of the partition: {sorted(rows.schema)}")


def _pick(column: List[Any], idx: Sequence[int]) -> List[Any]:
    """``column[j] for j in idx`` (the column itself when ``idx`` is all of it, in order)."""
    if isinstance(idx, range) and len(idx) == len(column):
        return column
    return [column[j] for j in idx]


def meta_from(batch: RowBatch, fields: Sequence[str], *, placeholders: bool = False, edge: Any = None,
              shape_source: Any = None) -> BatchMeta:
    """A BatchMeta of ``batch``'s rows about ``fields`` (those of the schema; with
    ``placeholders`` also the others, kind unknown); ``edge`` names the dtypes, ``shape_source``
    reads the rows' shapes when the meta's schema is first looked at."""
    if edge is None:
        from .edge import NumpyEdge
        edge = NumpyEdge()
    schema = {}
    for f in fields:
        if f in batch.schema:
            schema[f] = _schema_entry(edge, *batch.schema[f])
        elif placeholders:
            schema[f] = {"dtype": None, "kind": None, "is_non_tensor": None}
    if None in batch.seqs:
        raise StorageKeyNotFoundError(f"a row of partition {batch.pid!r} was removed meanwhile; get fresh metadata")
    for entry in schema.values():
        entry.setdefault("shape", None)
        entry.setdefault("is_nested", None)
    need = set(schema)
    ready = {fs: need <= fs for fs in set(batch.fields)}  # rows share a few interned field sets
    status = np.fromiter(map(ready.__getitem__, batch.fields), dtype=np.int8, count=len(batch))
    # the answer's lists are its own (the tags copies, not the controller's): handed over
    return BatchMeta._of_rows(list(batch.gidxs), batch.pid, schema, status, list(batch.tags), list(batch.keys),
                              list(batch.seqs), shape_source)


# ---------------------------------------------------------------------------- streaming
class Streaming:
    """The streaming calls of a :class:`~tqstore.kv.DataPlane` (see the module docstring)."""

    def __init__(self, plane: "DataPlane") -> None:
        self._dp = plane

    def _meta(self, batch: RowBatch, fields: Sequence[str], *, placeholders: bool = False) -> BatchMeta:
        return meta_from(batch, fields, placeholders=placeholders, edge=self._dp.edge,
                         shape_source=self._dp.io.row_shapes)

    # ------------------------------------------------------------------ metadata
    def _batch_meta(self, pid: str, gidxs: Sequence[int], fields: Sequence[str], *,
                    placeholders: bool = False) -> BatchMeta:
        batch = self._dp.controller.row_batch(pid, list(gidxs))
        if batch is None:
            raise _no_partition(pid, self._dp.controller.partitions())
        return self._meta(batch, fields, placeholders=placeholders)

    def get_meta(self, data_fields: Union[None, str, Sequence[str]], batch_size: Optional[int], partition_id: str,
                 mode: str = "fetch", task_name: Optional[str] = None,
                 sampling_config: Optional[Mapping[str, Any]] = None, *, timeout_s: float = 0.0) -> BatchMeta:
        """Metadata of a batch of rows, in one of three modes.

        * ``"fetch"``: rows whose ``data_fields`` are all produced and that ``task_name``
          has not consumed, chosen by the store's sampler and marked consumed by that task
          (atomically, with the sampler's state).  With fewer ready rows than the sampler
          needs, waits up to ``timeout_s`` for producers, then returns an empty BatchMeta.
          An unknown partition counts as "no rows yet".
        * ``"force_fetch"``: the partition's rows in insertion order (the first
          ``batch_size`` when given), produced or not, consumed or not; marks nothing,
          bypasses the sampler.  ``production_status`` says which rows are ready.
        * ``"insert"``: reserves ``batch_size`` new empty rows (creating the partition) for a
          later ``put(data, metadata)``.

        ``data_fields=None`` means every field of the partition's schema (not for insert).
        ``batch_size=0`` gives an empty BatchMeta in every mode (nothing reserved or marked).
        ``sampling_config`` goes to the sampler; it may repeat the call's ``task_name`` and
        ``partition_id`` (as TransferQueue's dataset puts them there), not contradict them.

        Raises:
            InvalidInputError: bad mode, batch_size, task_name, data_fields (a name no put
                could write included) or sampling_config (not a dict; a ``task_name`` or
                ``partition_id`` in it that is not the call's).
            PartitionNotFoundError: ``force_fetch`` of an unknown partition.
        """
        if mode not in MODES:
            raise InvalidInputError(f"mode must be one of {MODES}, got {mode!r}")
        fields = _field_list(data_fields, "data_fields")
        _check_pid(partition_id)
        if batch_size is not None:
            if isinstance(batch_size, (bool, np.bool_)) or not isinstance(batch_size, (int, np.integer)) \
                    or not 0 <= batch_size <= MAX_BATCH_ROWS:
                raise InvalidInputError(f"batch_size must be an int from 0 to 2**40, got {batch_size!r}")
            batch_size = int(batch_size)
        if mode != "force_fetch" and batch_size is None:
            raise InvalidInputError(f"mode {mode!r} needs a batch_size")
        cfg = sampling_kwargs(sampling_config, partition_id, task_name)
        dp = self._dp
        dp.check_open()
        for f in fields or ():  # (insert and force_fetch keep a field not produced yet in the meta: one
            check_field_name(f)  # no put can write would leave its rows never ready)
        if mode == "insert":
            if fields is None:
                raise InvalidInputError("mode 'insert' needs data_fields")
            if batch_size == 0:
                return BatchMeta.empty()
            if batch_size > MAX_INSERT_ROWS:
                raise InvalidInputError(f"mode 'insert' reserves at most {MAX_INSERT_ROWS} rows per call, got "
                                        f"batch_size={batch_size}; reserve them in several calls")
            with dp.write_lock:
                gidxs = dp.io.write(partition_id, {}, new_rows=True, tags=[None] * batch_size)
                return self._batch_meta(partition_id, gidxs, fields, placeholders=True)
        if mode == "force_fetch":
            if batch_size == 0:
                return BatchMeta.empty()
            with dp.lock:
                batch = dp.controller.first_rows(partition_id, batch_size)
                if batch is None:
                    raise _no_partition(partition_id, dp.controller.partitions())
                # (a field asked for that no row has produced yet stays in the meta: no row is ready)
                return self._meta(batch, list(batch.schema) if fields is None else fields, placeholders=True)
        if not isinstance(task_name, str) or not task_name:
            raise InvalidInputError(f"mode 'fetch' needs a task_name (non-empty str), got {task_name!r}")
        check_name("task_name", task_name)
        deadline = time.monotonic() + check_timeout(timeout_s)
        if batch_size == 0:  # (TransferQueue's answer too: nothing asked, nothing consumed)
            return BatchMeta.empty()
        with dp.lock:
            while True:
                dp.check_open()
                with interrupts.deferred():  # (its consumption commit and the mirror's update together)
                    batch = dp.controller.fetch(partition_id, task_name, fields, batch_size, cfg)
                if batch is not None and len(batch):
                    return self._meta(batch, list(batch.schema) if fields is None else fields)
                left = deadline - time.monotonic()
                if left <= 0:
                    return BatchMeta.empty()
                dp.cond.wait(min(left, _POLL_S))

    # ------------------------------------------------------------------ data
    def _live_rows(self, meta: BatchMeta, *, strict: bool
                   ) -> Dict[str, Tuple[RowBatch, Sequence[int], Sequence[int]]]:
        """Group a BatchMeta's rows by partition: ``pid -> (answer, positions in the meta,
        indexes in the answer)`` of the rows that are still the rows the meta was made for
        (same insertion sequence number).  ``strict``: raise for the first (in meta order)
        that is not."""
        ctrl = self._dp.controller
        gi, want = meta.global_indexes, meta._seqs
        pids = meta.partition_ids
        asked: Dict[str, Optional[RowBatch]] = {}
        no_index = [i for i, g in enumerate(gi) if not 0 <= g < _GIDX_END]  # (a forged meta's: no row has it)
        if pids and pids.count(pids[0]) == len(pids) and not no_index:  # one partition (the usual case)
            b = asked[pids[0]] = ctrl.row_batch(pids[0], gi)
            if b is not None and b.seqs == want and None not in want:  # and every row is live: C-speed checks
                every = range(len(gi))
                return {pids[0]: (b, every, every)}
        positions: Dict[str, List[int]] = defaultdict(list)
        skip = set(no_index)
        for i, pid in enumerate(pids):
            if i not in skip:
                positions[pid].append(i)
        groups: Dict[str, Tuple[RowBatch, Sequence[int], Sequence[int]]] = {}
        bad: List[Tuple[int, str, Optional[RowBatch]]] = [(i, pids[i], _NO_ROW) for i in no_index]
        for pid, pos in positions.items():
            b = asked[pid] if pid in asked else ctrl.row_batch(pid, [gi[i] for i in pos])
            if b is None:
                bad.extend((i, pid, None) for i in pos)
                continue
            live_pos, live_idx = [], []
            for j, (i, seq) in enumerate(zip(pos, b.seqs)):
                if seq is None or (want[i] is not None and seq != want[i]):
                    bad.append((i, pid, b))
                else:
                    live_pos.append(i)
                    live_idx.append(j)
            if live_pos:
                groups[pid] = (b, live_pos, live_idx)
        if strict and bad:
            i, pid, b = min(bad, key=lambda x: x[0])
            if b is _NO_ROW:
                raise StorageKeyNotFoundError(f"row {gi[i]} of partition {pid!r} in the BatchMeta is no row index")
            if b is None:
                raise StalePartitionError(f"partition {pid!r} of the BatchMeta does not exist (cleared or replaced "
                                          f"by a checkpoint load since: the BatchMeta is stale)")
            raise StorageKeyNotFoundError(f"row {gi[i]} of partition {pid!r} in the BatchMeta no longer exists "
                                          f"(cleared or replaced by a checkpoint load since, or of another store: the BatchMeta is "
                                          f"stale); get fresh metadata")
        return groups

    def put(self, data: Any, metadata: Optional[BatchMeta] = None, partition_id: Optional[str] = None) -> BatchMeta:
        """Write a batch of fields.

        Without ``metadata``, appends ``len(batch)`` new rows to ``partition_id`` (created
        when missing; a batch of 0 rows writes nothing, creates nothing and returns an empty
        BatchMeta).  With it, writes the fields to the meta's rows (e.g. from
        ``get_meta(mode="insert")`` or ``"fetch"``); the meta's ``custom_meta`` is stored as
        the rows' tags.  Returns the meta (updated in place with the new fields and
        production status when given).

        Raises:
            InvalidInputError: no partition_id and no metadata, an empty metadata, sizes, a
                ``partition_id`` that is not the partition of every row of ``metadata``.
            StorageKeyNotFoundError (a KeyNotFoundError): the metadata's rows were cleared
                (StalePartitionError, also a PartitionNotFoundError: its partition was).
            SchemaError, UnsupportedTypeError: nothing written.
        """
        names = _field_names(data)
        if not names:
            raise InvalidInputError("put needs at least one field")
        dp = self._dp
        dp.check_open()
        data = dict(dp.edge.items(data))  # (each field as the edge reads it: a TensorDict's shared
        # non-tensor entry as its per-row values, not the one value data[name] unwraps it to)
        if metadata is None:
            if partition_id is None:
                raise InvalidInputError("put needs metadata or a partition_id")
            _check_pid(partition_id)
            if _no_rows(dp.edge, data, names):  # an empty batch: nothing written, no partition or schema made
                for f in names:
                    check_field_name(f)
                return BatchMeta.empty()
            with dp.write_lock:
                gidxs = dp.io.write(partition_id, data, new_rows=True)
                dp.notify(partition_id)
                return self._batch_meta(partition_id, gidxs, names)
        if not isinstance(metadata, BatchMeta):
            raise InvalidInputError(f"metadata must be a BatchMeta, got {type(metadata).__name__}")
        if metadata.size == 0:
            raise InvalidInputError("metadata is empty")
        if partition_id is not None and any(p != partition_id for p in metadata.partition_ids):
            others = sorted(set(metadata.partition_ids) - {partition_id}, key=str)
            raise InvalidInputError(f"put: partition_id={partition_id!r} contradicts the metadata, whose rows are in "
                                    f"partition(s) {others[:5]!r}; nothing written (the metadata's rows are the ones "
                                    f"written: pass partition_id only without metadata)")
        _checked_custom_meta(metadata)
        with dp.write_lock:
            groups = self._live_rows(metadata, strict=True)
            if len(groups) > 1:  # (one partition: its write checks the rows against the meta's)
                _check_rows(dp.edge, data, names, metadata.size)
            plans = []
            for pid, (b, pos, idx) in groups.items():
                gidxs = _pick(b.gidxs, idx)
                part = data if len(groups) == 1 else {f: dp.edge.take(data[f], pos) for f in names}
                stored = _pick(b.tags, idx)
                # checked first (a tag that cannot be stored: its error, nothing written), then
                # compared as the JSON stored: True is not 1, nor 6.0 6 (== took them as the same
                # and kept the old value), and an array is not compared with ==
                want = check_tags([metadata.custom_meta[i] for i in pos])
                w_text, c_text = dumps_each(want), dumps_each([_tag_out(t) for t in stored])
                tags = None
                if w_text != c_text:
                    tags = [w if a != c else t for w, t, a, c in zip(want, stored, w_text, c_text)]
                plans.append((pid, part, gidxs, tags))
            if len(plans) > 1:  # every partition checked (and the capacity of all of them) before any is written
                dp.io.check_writes(plans)
            for pid, part, gidxs, tags in plans:
                dp.io.write(pid, part, gidxs=gidxs, tags=tags)
            dp.notify(plans[0][0] if len(plans) == 1 else None)
            after = {pid: dp.controller.row_batch(pid, gidxs) for pid, _, gidxs, _ in plans}
            for f in names:
                for pid in groups:
                    kind_dtype = after[pid].schema.get(f)
                    if kind_dtype is not None:  # shapes of the new rows: read when the schema is looked at
                        metadata._field_schema[f] = _schema_entry(dp.edge, *kind_dtype)
                        metadata._field_schema[f].setdefault("shape", None)
                        metadata._field_schema[f].setdefault("is_nested", None)
                        metadata._shape_source = dp.io.row_shapes
                        break
            status = np.zeros(metadata.size, dtype=np.int8)
            need = set(metadata._field_schema)
            for pid, (_, pos, _) in groups.items():
                a = after[pid]
                for i, fs, tag in zip(pos, a.fields, a.tags):
                    status[i] = 1 if need <= fs else 0
                    metadata.custom_meta[i] = _tag_out(tag)
            metadata.production_status = status
        return metadata

    def set_custom_meta(self, metadata: BatchMeta) -> None:
        """Store ``metadata.custom_meta`` as the tags of the meta's rows (replacing them; no
        field is written), in one controller transaction per partition.

        The rows are checked and written under the store's write lock: a clear (and a put
        reusing the cleared indexes) waits until the tags are written, so a stale meta's
        tags never land on other rows.  Every tag of every partition is checked before any
        is written.  An empty meta does nothing.

        Raises:
            InvalidInputError: not a BatchMeta; UnsupportedTypeError / InvalidInputError: a
                tag that cannot be stored (nothing written).
            StorageKeyNotFoundError (a KeyNotFoundError): the meta's rows were cleared
                (StalePartitionError, also a PartitionNotFoundError: its partition was).
        """
        if not isinstance(metadata, BatchMeta):
            raise InvalidInputError(f"set_custom_meta takes a BatchMeta, got {type(metadata).__name__}")
        if metadata.size == 0:
            return
        _checked_custom_meta(metadata)
        dp = self._dp
        dp.check_open()
        with dp.write_lock:
            plans = []
            for pid, (b, pos, idx) in self._live_rows(metadata, strict=True).items():
                tags = check_tags([metadata.custom_meta[i] for i in pos])  # (as a put checks them)
                plans.append((pid, _pick(b.gidxs, idx), tags))
            for pid, gidxs, tags in plans:  # a write with no fields: a tag-only controller transaction
                dp.io.write(pid, {}, gidxs=gidxs, tags=tags)

    def get_data(self, metadata: Union[BatchMeta, KVBatchMeta]) -> Any:
        """Read the fields of a BatchMeta (``metadata.field_names``) for its rows, in order, as the
        store's result type (a ``TensorDict`` with ``batch_size``, or a plain dict).

        An empty meta gives an empty result.  A :class:`KVBatchMeta` is read by key.  Rows of
        several partitions whose field has different kinds or dtypes there give a list of rows.

        Raises:
            StorageKeyNotFoundError (a KeyNotFoundError): the meta's rows were cleared
                (StalePartitionError, also a PartitionNotFoundError: its partition was).
            FieldNotFoundError: a field is not produced for some row.
        """
        if isinstance(metadata, KVBatchMeta):
            return self._dp.kv_batch_get_by_meta(metadata)
        if not isinstance(metadata, BatchMeta):
            raise InvalidInputError(f"get_data takes a BatchMeta, got {type(metadata).__name__}")
        edge = self._dp.edge
        if metadata.size == 0 or not metadata.field_names:
            return edge.result({}, 0)
        self._dp.check_open()
        io = self._dp.io
        fields = metadata.field_names

        def read(b: RowBatch, idx: Sequence[int]) -> Dict[str, Any]:
            check_produced(b, idx, fields)
            return io.read_rows(_pick(b.gidxs, idx), [(f, b.schema[f][0]) for f in fields])

        def attempt() -> Tuple[Any, Dict[str, Any]]:
            groups = self._live_rows(metadata, strict=True)  # the controller's one answer per partition
            return groups, {pid: read(b, idx) for pid, (b, _, idx) in groups.items()}

        groups, parts = io.removals.stable(attempt, self._dp.write_lock)  # a clear racing the read: tried again
        if len(groups) == 1:
            return edge.result(next(iter(parts.values())), metadata.size)
        out: Dict[str, Any] = {}
        for f in fields:
            kinds = {b.schema[f] for b, _, _ in groups.values()}
            joined = join_rows(edge, next(iter(kinds))[0], [(pos, parts[pid][f]) for pid, (_, pos, _) in groups.items()],
                               metadata.size)
            out[f] = joined if len(kinds) == 1 else list(joined)
        return edge.result(out, metadata.size)

    # ------------------------------------------------------------------ clears
    def clear_partition(self, partition_id: str) -> None:
        """Remove a partition with all its rows, consumption and sampler state (idempotent).

        Raises InvalidInputError: ``partition_id`` is not a non-empty str."""
        _check_pid(partition_id)
        self._dp.check_open()
        with self._dp.write_lock:
            gone = self._dp.io.drop_partition(partition_id)
        if gone:
            log.info("cleared partition %r (%d rows)", partition_id, len(gone))

    def clear_samples(self, metadata: Union[BatchMeta, KVBatchMeta]) -> None:
        """Remove the rows of a BatchMeta (or the keys of a KVBatchMeta); idempotent.

        Rows already gone — also rows whose global index now belongs to a newer row — are
        skipped, never the newer row.
        """
        if isinstance(metadata, KVBatchMeta):
            if metadata.partition_id is not None and metadata.size:
                self._dp.kv_clear(metadata.keys, metadata.partition_id)
            return
        if not isinstance(metadata, BatchMeta):
            raise InvalidInputError(f"clear_samples takes a BatchMeta, got {type(metadata).__name__}")
        self._dp.check_open()
        with self._dp.write_lock:
            live = self._live_rows(metadata, strict=False)
            if len(live) > 1:  # every partition's pending restore checked before any row goes
                for pid in live:
                    check_no_restore(self._dp.controller, pid, f"clearing rows of partition {pid!r}")
            for pid, (b, _, idx) in live.items():
                self._dp.io.delete_rows(pid, _pick(b.gidxs, idx))

    # ------------------------------------------------------------------ status
    def _consumption(self, task_name: str, partition_id: str) -> Optional[Tuple[np.ndarray, np.ndarray]]:
        _check_pid(partition_id)
        _check_task(task_name)
        self._dp.check_open()
        with self._dp.lock:
            return self._dp.controller.consumption_status(partition_id, task_name)

    def _production(self, data_fields: Union[str, Sequence[str]], partition_id: str, *, known_only: bool = False
                    ) -> Optional[Tuple[np.ndarray, np.ndarray]]:
        """The controller's answer for ``data_fields`` (a name given twice counted once); with
        ``known_only``, None also when no field is asked (TransferQueue's get_production_status)."""
        if isinstance(data_fields, (list, tuple)):
            data_fields = list(dict.fromkeys(data_fields)) if all(isinstance(f, str) for f in data_fields) \
                else data_fields
        fields = _field_list(data_fields, "data_fields") or []
        _check_pid(partition_id)
        self._dp.check_open()
        with self._dp.lock:
            if known_only and not fields:
                return None
            return self._dp.controller.production_status(partition_id, fields)

    def get_consumption_status(self, task_name: str, partition_id: str) -> Tuple[Any, Any]:
        """``(global_indexes, consumed)`` of a partition's rows for a task, sorted by global index.

        ``consumed`` is an int8 tensor (1 consumed, 0 not; the edge's tensor type, numpy arrays
        without the torch adapter).  ``(None, None)`` when the partition does not exist (as
        TransferQueue).
        """
        st = self._consumption(task_name, partition_id)
        return (None, None) if st is None else (self._dp.edge.status(st[0]), self._dp.edge.status(st[1]))

    def get_production_status(self, data_fields: Union[str, Sequence[str]], partition_id: str
                              ) -> Tuple[Any, Any]:
        """``(global_indexes, produced)`` for ``data_fields``, sorted by global index.

        ``produced`` is an int8 tensor of shape ``(rows, fields)``, a column per field in the
        order asked (a field named twice has one column; TransferQueue orders the columns by
        the fields' first put instead); a field no row has produced has a column of 0.
        ``(None, None)`` when the partition does not exist or no field is asked (as
        TransferQueue).
        """
        st = self._production(data_fields, partition_id, known_only=True)
        return (None, None) if st is None else (self._dp.edge.status(st[0]), self._dp.edge.status(st[1]))

    def check_consumption_status(self, task_name: str, partition_id: str) -> bool:
        """True when the partition has rows and ``task_name`` consumed all of them."""
        st = self._consumption(task_name, partition_id)
        return st is not None and st[1].size > 0 and bool(np.all(st[1] == 1))

    def check_production_status(self, data_fields: Union[str, Sequence[str]], partition_id: str) -> bool:
        """True when the partition has rows and all of them produced every one of ``data_fields``."""
        st = self._production(data_fields, partition_id)
        return st is not None and st[1].shape[0] > 0 and bool(np.all(st[1] == 1))

    def reset_consumption(self, partition_id: str, task_name: Optional[str] = None) -> bool:
        """Forget what ``task_name`` (every task when None) consumed, and its sampler cache.

        Returns False when the partition does not exist.  InvalidInputError: a partition id
        that is not a non-empty str, a task name that is neither None nor one.
        """
        _check_pid(partition_id)
        if task_name is not None:
            _check_task(task_name)
        self._dp.check_open()
        with self._dp.lock:
            with interrupts.deferred():
                done = self._dp.controller.reset_consumption(partition_id, task_name)
            if done:
                self._dp.wake_locked(partition_id)
        return done

    def first_batch_index(self, partition_id: str, task_name: str, dp_rank: Any) -> int:
        """The ``batch_index`` a new :class:`~tqstore.StreamingDataset` of ``(task_name, dp_rank)``
        starts at: past the batches the sampler's rank cache holds from an earlier run (kept
        across reopens and in checkpoints), which a dataset counting from 0 would be handed
        again; every replica of the rank gets the same answer for as long as the store is open
        (ControllerPort.first_batch_index).  0 when there are none.  InvalidInputError: a
        partition id or task name that is not a non-empty str."""
        _check_pid(partition_id)
        _check_task(task_name)
        self._dp.check_open()
        with self._dp.lock:
            return self._dp.controller.first_batch_index(partition_id, task_name, dp_rank)

    def rows_per_fetch(self, batch_size: int) -> int:
        """Ready rows a fetch of ``batch_size`` needs (the sampler's ``rows_per_fetch``; a waiting dataset says it)."""
        self._dp.check_open()
        return int(self._dp.sampler.rows_per_fetch(batch_size))

    def get_partition_list(self) -> List[str]:
        """Partition ids, oldest first (the order they were created in, as TransferQueue lists
        them; a partition cleared and made again is the newest)."""
        self._dp.check_open()
        with self._dp.lock:
            return self._dp.controller.partitions()


#: the public calls of :class:`Streaming`, in documentation order
STREAMING_CALLS = ("get_meta", "put", "get_data", "clear_partition", "clear_samples", "get_consumption_status",
                   "get_production_status", "check_consumption_status", "check_production_status",
                   "reset_consumption", "get_partition_list", "set_custom_meta", "first_batch_index", "rows_per_fetch")

__all__ = ["Streaming", "STREAMING_CALLS", "MODES", "meta_from"]
