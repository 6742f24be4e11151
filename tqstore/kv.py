"""KV and streaming operations of a Store (TransferQueue-shaped); mixed into Store.

Two ways to address rows, over the same partitions:

* by user key — ``kv_put``, ``kv_batch_put``, ``kv_batch_get``, ``kv_batch_get_by_meta``,
  ``kv_list``, ``kv_clear`` (rows are :class:`~tqstore.meta.KVBatchMeta`);
* by global index, streaming — ``put``, ``get_meta`` (modes ``fetch`` / ``force_fetch`` /
  ``insert``), ``get_data``, ``clear_samples``, ``clear_partition``, status queries
  (rows are :class:`~tqstore.meta.BatchMeta`).

Every call validates its whole input before anything is written (sizes, duplicate keys,
dtype clashes, unsupported types, stale metadata) and raises a
:class:`~tqstore.errors.TqstoreError` subclass.  Clears are idempotent.

Locking: the store's ``_write_lock`` serialises puts and clears (held for a whole put,
unit writes included); its ``_meta_lock`` protects the controller's in-memory mirror,
the sampler and the consumption state, and is held only for metadata work (a put's plan
and commit, a clear's controller step, fetches, status queries).  Consumers therefore
never wait for a producer's unit writes.  Order: ``_write_lock`` before ``_meta_lock``.
``fetch`` (ready rows, sampling, marking consumed, saving sampler state) is atomic under
``_meta_lock``, so concurrent consumers never get the same row for one task.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from collections import defaultdict
from itertools import islice
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from ._format.columns import KIND_NAMES, assemble, plain_tensor, to_column
from ._format.dtypes import CODE_TO_NUMPY, CODE_TO_TORCH
from ._format.layout import KIND_NDARRAY, KIND_TENSOR, KIND_VALUE
from .controller import check_name
from .errors import (
    FieldNotFoundError, InvalidInputError, KeyNotFoundError, PartitionNotFoundError,
)
from .meta import BatchMeta, KVBatchMeta
from .samplers import BaseSampler, make_sampler

log = logging.getLogger("tqstore")

MODES = ("fetch", "force_fetch", "insert")
MAX_INSERT_ROWS = 1 << 24  # rows one get_meta(mode="insert") may reserve
_POLL_S = 0.05


class _KVState:
    """Per-store data-plane state: the sampler, which partitions' sampler state is loaded,
    and the condition consumers wait on for new rows."""

    def __init__(self, lock, controller, sampler: BaseSampler) -> None:
        self.sampler = sampler
        self.controller = controller
        self.loaded: set = set()
        self.cond = threading.Condition(lock)


def _is_tensordict(x: Any) -> bool:
    return type(x).__module__.split(".")[0] == "tensordict" and hasattr(x, "batch_size")


def _key_list(keys: Union[str, Sequence[str]]) -> List[str]:
    if isinstance(keys, str):
        return [keys]
    if keys is None or not isinstance(keys, (list, tuple)):
        raise InvalidInputError(f"keys must be a str or a list of str, got {type(keys).__name__}")
    keys = list(keys)
    if not keys:
        raise InvalidInputError("keys is an empty list")
    bad = [k for k in keys if not isinstance(k, str)]
    if bad:
        raise InvalidInputError(f"keys must be str, got {type(bad[0]).__name__} {bad[0]!r}")
    return keys


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


def _check_pid(pid: Any) -> str:
    if not isinstance(pid, str) or not pid:
        raise InvalidInputError(f"partition_id must be a non-empty str, got {pid!r}")
    return pid


def _merge_tag(old: Any, new: Any) -> Any:
    """TransferQueue semantics: a new dict tag updates the old one; None leaves it alone."""
    if new is None:
        return old
    if isinstance(old, dict) and isinstance(new, dict):
        return {**old, **new}
    return new


def _tag_out(tag: Any) -> Any:
    return {} if tag is None else tag


def _single_row(fields: Any) -> Any:
    """``kv_put``'s fields (one row, no batch dimension) → a batch of one row."""
    if _is_tensordict(fields):
        if tuple(fields.batch_size)[:1] != (1,):
            raise InvalidInputError(f"kv_put takes a TensorDict of batch size 1, got {tuple(fields.batch_size)}")
        return fields
    if not isinstance(fields, Mapping):
        raise InvalidInputError(f"fields must be a mapping of field name to value, got {type(fields).__name__}")
    out = {}
    for name, v in fields.items():
        if isinstance(v, torch.Tensor):
            if v.is_nested:
                raise InvalidInputError(f"field {name!r}: a nested tensor is a batch; use kv_batch_put")
            out[name] = plain_tensor(str(name), v).unsqueeze(0)
        elif isinstance(v, np.ndarray) and v.dtype.kind not in "OUSV":
            out[name] = v[None]
        else:
            out[name] = [v]
    return out


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


def _take(value: Any, idx: List[int]) -> Any:
    """Rows ``idx`` of a batched value (for splitting a put across partitions)."""
    if isinstance(value, torch.Tensor):
        if value.is_nested:
            rows = value.unbind()
            return [rows[i] for i in idx]
        return value[torch.as_tensor(idx, dtype=torch.long)]
    if isinstance(value, np.ndarray):
        return value[idx]
    if type(value).__name__ in ("NonTensorStack", "NonTensorData"):
        value = list(value.tolist())
    if isinstance(value, (list, tuple)):
        return [value[i] for i in idx]
    return value  # to_column rejects it with a clear error


def _rows_of(value: Any) -> List[Any]:
    if isinstance(value, torch.Tensor):
        return list(value.unbind()) if value.is_nested else list(value.unbind(0))
    if isinstance(value, np.ndarray):
        return list(value)
    return list(value)


def _schema_entry(kind: int, dtype: int) -> Dict[str, Any]:
    if kind == KIND_TENSOR:
        dt: Any = CODE_TO_TORCH.get(dtype)
    elif kind == KIND_NDARRAY:
        dt = CODE_TO_NUMPY.get(dtype)
    else:
        dt = None
    return {"dtype": dt, "kind": KIND_NAMES.get(kind, "?"), "is_non_tensor": kind == KIND_VALUE}


class KVMixin:
    """The data plane of :class:`~tqstore.store.Store`. See the module docstring."""

    # ------------------------------------------------------------------ sampler plumbing
    def _kv(self) -> _KVState:
        st = self.__dict__.get("_kv_state")
        if st is None or st.controller is not self.controller:
            with self._meta_lock:
                st = self.__dict__.get("_kv_state")
                if st is None:
                    st = _KVState(self._meta_lock, self.controller, make_sampler(None))
                    self.__dict__["_kv_state"] = st
                elif st.controller is not self.controller:  # state replaced (load_checkpoint)
                    st.controller = self.controller
                    st.loaded.clear()
                    st.sampler._states.clear()
        return st

    @property
    def sampler(self) -> BaseSampler:
        """The sampler ``get_meta(mode="fetch")`` uses (default :class:`SequentialSampler`)."""
        return self._kv().sampler

    def set_sampler(self, sampler: Any) -> BaseSampler:
        """Use ``sampler`` (instance, class, name or ``{"name": ..., **kwargs}``) from now on.

        Its state per partition is loaded from the controller when it was saved by a sampler
        of the same kind, else it starts empty.  Raises ConfigError for a bad spec.
        """
        s = make_sampler(sampler)
        with self._meta_lock:
            st = self._kv()
            st.sampler = s
            st.loaded.clear()
        return s

    def _sampler_for(self, pid: str) -> BaseSampler:
        st = self._kv()
        if pid not in st.loaded:
            st.sampler.load_state_dict(pid, self.controller.sampler_state(pid))
            st.loaded.add(pid)
        return st.sampler

    def _sampler_snapshot(self, sampler: BaseSampler, pid: str) -> str:
        return json.dumps(sampler.state_dict(pid), sort_keys=True)

    def _save_sampler_state(self, pid: str, before: str) -> None:
        sampler = self._kv().sampler
        now = self._sampler_snapshot(sampler, pid)
        if now != before and pid in self.controller.parts:
            try:
                self.controller.set_sampler_state(pid, sampler.state_dict(pid))
            except BaseException:
                sampler.load_state_dict(pid, self.controller.sampler_state(pid))
                raise

    def _forget_rows(self, pid: str, gidxs: Sequence[int]) -> None:
        if not gidxs:
            return
        sampler = self._sampler_for(pid)
        before = self._sampler_snapshot(sampler, pid)
        sampler.forget_rows(pid, gidxs)
        self._save_sampler_state(pid, before)

    def _notify(self) -> None:
        st = self._kv()
        with self._meta_lock:
            st.cond.notify_all()

    def _clear_rows(self, pid: str, gidxs: Sequence[int], *, drop_partition: bool = False) -> List[int]:
        """Remove rows (or the whole partition): the controller step and the sampler's
        bookkeeping atomically under the metadata lock, then the units' entries.  Caller
        holds ``_write_lock`` (no put may sit between its plan and commit)."""
        with self._meta_lock:
            self._check_open()
            gone = self.controller.clear_rows(pid, gidxs, drop_partition=drop_partition)
            if drop_partition:
                st = self._kv()
                st.sampler.clear_cache(pid)
                st.loaded.discard(pid)
            else:
                self._forget_rows(pid, gone)
        self._delete_units(gone)
        return gone

    # ------------------------------------------------------------------ KV: by key
    def kv_put(self, key: str, partition_id: str, fields: Any = None, tag: Any = None) -> KVBatchMeta:
        """Put one row by key: ``fields`` maps field → value of this row (no batch dimension).

        Tensors gain a batch dimension, anything else is one non-tensor value.  Without
        ``fields`` only the tag is updated (the key is created if new).  A dict ``tag`` is
        merged into the key's existing dict tag.

        Returns:
            KVBatchMeta of the key, whose ``fields`` lists every field it has produced.

        Raises:
            InvalidInputError: neither fields nor tag, a nested tensor, a bad key.
            SchemaError, UnsupportedTypeError: nothing written.
        """
        if fields is None and tag is None:
            raise InvalidInputError("kv_put needs fields or tag (or both)")
        if not isinstance(key, str):
            raise InvalidInputError(f"key must be a str, got {type(key).__name__} {key!r}")
        return self.kv_batch_put([key], partition_id, None if fields is None else _single_row(fields),
                                 None if tag is None else [tag])

    def kv_batch_put(self, keys: Sequence[str], partition_id: str, fields: Any = None,
                     tags: Optional[Sequence[Any]] = None) -> KVBatchMeta:
        """Put a batch of rows by key; missing keys are created.

        Args:
            keys: one key per row, no duplicates.
            partition_id: partition (created when missing).
            fields: mapping (dict or TensorDict) of field → batched value with ``len(keys)``
                rows; None to update tags only.
            tags: one tag per key (dicts are merged into existing dict tags; None entries
                leave a tag unchanged).

        Returns:
            KVBatchMeta whose ``fields`` are all fields every one of these keys has produced,
            including earlier puts.

        Raises:
            InvalidInputError: sizes disagree, duplicate keys, neither fields nor tags.
            SchemaError: a dtype/kind clashes with the partition's schema.
            UnsupportedTypeError: a value tqstore cannot store without pickle.
            Nothing is written when any of these is raised.
        """
        keys = _key_list(keys)
        if fields is None and tags is None:
            raise InvalidInputError("kv_batch_put needs fields or tags (or both)")
        _check_pid(partition_id)
        if tags is not None:
            tags = list(tags)
            if len(tags) != len(keys):
                raise InvalidInputError(f"{len(tags)} tags for {len(keys)} keys")
        with self._write_lock:
            self._check_open()
            merged = None
            if tags is not None:
                p = self.controller.parts.get(partition_id)
                old = [p.rows[p.keys[k]].tag if p is not None and k in p.keys else None for k in keys]
                merged = [_merge_tag(o, t) for o, t in zip(old, tags)]
            self.write(partition_id, fields if fields is not None else {}, keys=keys, tags=merged)
            self._notify()
            meta = self._kv_meta(partition_id, keys)
        log.debug("kv_batch_put %d keys into %r (fields %s)", len(keys), partition_id, meta.fields)
        return meta

    def _kv_meta(self, pid: str, keys: List[str]) -> KVBatchMeta:
        p = self.controller.partition(pid)
        rows = [p.rows[g] for g in self.controller.gidxs_for_keys(pid, keys)]
        common = set.intersection(*(r.fields for r in rows)) if rows else set()
        return KVBatchMeta(keys, [_tag_out(r.tag) for r in rows], pid, sorted(common))

    def kv_batch_get(self, keys: Union[str, Sequence[str]], partition_id: str,
                     select_fields: Union[None, str, Sequence[str]] = None) -> Dict[str, Any]:
        """Read rows by key: ``{field: batched value}`` in the order of ``keys``.

        ``select_fields=None`` reads every field all the keys have produced.  Values are a
        tensor when rows share a shape, a jagged nested tensor when they do not, a numpy
        array for numpy fields, a list for non-tensor fields.

        Raises:
            PartitionNotFoundError, KeyNotFoundError: unknown partition or key.
            FieldNotFoundError: a selected field is not produced for some key, or (with
                ``select_fields=None``) the keys have no field in common.
        """
        keys = _key_list(keys)
        sel = _field_list(select_fields)
        self._check_open()
        p = self.controller.partition(partition_id)
        gidxs = self.controller.gidxs_for_keys(partition_id, keys)
        if sel is None:
            rows = [p.rows[g] for g in gidxs]
            common = set.intersection(*(r.fields for r in rows))
            if not common:
                raise FieldNotFoundError(f"the {len(keys)} key(s) of partition {partition_id!r} have no field "
                                         f"produced in common; pass select_fields")
            sel = sorted(common)
        return self.read(partition_id, gidxs, sel)

    def kv_batch_get_by_meta(self, meta: KVBatchMeta, select_fields: Union[None, str, Sequence[str]] = None
                             ) -> Dict[str, Any]:
        """Read the rows of a :class:`KVBatchMeta` (its ``fields``, or ``select_fields`` ⊆ them).

        Raises:
            InvalidInputError: the meta has no partition_id.
            FieldNotFoundError: a selected field is not among ``meta.fields``.
        """
        if not isinstance(meta, KVBatchMeta):
            raise InvalidInputError(f"kv_batch_get_by_meta takes a KVBatchMeta, got {type(meta).__name__}")
        if meta.partition_id is None:
            raise InvalidInputError("the KVBatchMeta has no partition_id")
        sel = _field_list(select_fields)
        if sel is not None:
            missing = [f for f in sel if meta.fields is None or f not in meta.fields]
            if missing:
                raise FieldNotFoundError(f"fields {missing} are not in the KVBatchMeta (it has {meta.fields})")
        else:
            sel = meta.fields
        return self.kv_batch_get(meta.keys, meta.partition_id, sel)

    def kv_list(self, partition_id: Optional[str] = None) -> Dict[str, Dict[str, Any]]:
        """``{partition: {key: tag}}`` for one partition (empty dict if unknown) or all.

        Keys are in insertion order; a key without a tag maps to ``{}``.
        """
        self._check_open()
        with self._meta_lock:
            pids = sorted(self.controller.parts) if partition_id is None else [partition_id]
            out: Dict[str, Dict[str, Any]] = {}
            for pid in pids:
                p = self.controller.parts.get(pid)
                if p is None:
                    continue
                # Partition.rows is in insertion (seq) order
                out[pid] = {r.key: _tag_out(r.tag) for r in p.rows.values() if r.key is not None}
            return out

    def kv_clear(self, keys: Union[str, Sequence[str]], partition_id: str) -> None:
        """Remove keys with their data (idempotent: unknown keys or partition are ignored)."""
        keys = _key_list(keys)
        self._check_open()
        with self._write_lock:
            p = self.controller.parts.get(partition_id)
            if p is None:
                return
            gidxs = [p.keys[k] for k in keys if k in p.keys]
            if gidxs:
                self._clear_rows(partition_id, gidxs)
        log.debug("kv_clear %d keys of %r", len(gidxs), partition_id)

    # ------------------------------------------------------------------ streaming: metadata
    def _production(self, p, gidxs: Sequence[int], fields: Sequence[str]) -> np.ndarray:
        need = set(fields)
        return np.array([1 if need <= p.rows[g].fields else 0 for g in gidxs], dtype=np.int8)

    def _batch_meta(self, pid: str, gidxs: Sequence[int], fields: Sequence[str], *,
                    placeholders: bool = False) -> BatchMeta:
        p = self.controller.partition(pid)
        schema = {}
        for f in fields:
            if f in p.schema:
                schema[f] = _schema_entry(*p.schema[f])
            elif placeholders:
                schema[f] = {"dtype": None, "kind": None, "is_non_tensor": None}
        rows = [p.rows[g] for g in gidxs]
        return BatchMeta(list(gidxs), [pid] * len(rows), schema, self._production(p, gidxs, schema),
                         None, [_tag_out(r.tag) for r in rows], [r.key for r in rows], [r.seq for r in rows])

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

        Raises:
            InvalidInputError: bad mode, batch_size, task_name or data_fields.
            PartitionNotFoundError: ``force_fetch`` of an unknown partition.
        """
        if mode not in MODES:
            raise InvalidInputError(f"mode must be one of {MODES}, got {mode!r}")
        fields = _field_list(data_fields, "data_fields")
        _check_pid(partition_id)
        if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int)
                                       or batch_size < 1):
            raise InvalidInputError(f"batch_size must be a positive int, got {batch_size!r}")
        if mode != "force_fetch" and batch_size is None:
            raise InvalidInputError(f"mode {mode!r} needs a batch_size")
        cfg = dict(sampling_config or {})
        self._check_open()
        if mode == "insert":
            if fields is None:
                raise InvalidInputError("mode 'insert' needs data_fields")
            if batch_size > MAX_INSERT_ROWS:
                raise InvalidInputError(f"mode 'insert' reserves at most {MAX_INSERT_ROWS} rows per call, got "
                                        f"batch_size={batch_size}; reserve them in several calls")
            with self._write_lock:
                gidxs = self.write(partition_id, {}, new_rows=True, tags=[None] * batch_size)
                return self._batch_meta(partition_id, gidxs, fields, placeholders=True)
        if mode == "force_fetch":
            with self._meta_lock:
                p = self.controller.partition(partition_id)
                use = list(p.schema) if fields is None else fields
                # Partition.rows is in insertion (seq) order
                gidxs = list(p.rows) if batch_size is None else list(islice(p.rows, batch_size))
                return self._batch_meta(partition_id, gidxs, use)
        if not isinstance(task_name, str) or not task_name:
            raise InvalidInputError(f"mode 'fetch' needs a task_name (non-empty str), got {task_name!r}")
        check_name("task_name", task_name)
        deadline = time.monotonic() + max(0.0, float(timeout_s))
        st = self._kv()
        with self._meta_lock:
            while True:
                self._check_open()
                meta = self._fetch_once(partition_id, fields, batch_size, task_name, cfg)
                left = deadline - time.monotonic()
                if meta.size or left <= 0:
                    return meta
                st.cond.wait(min(left, _POLL_S))

    def _fetch_once(self, pid: str, fields: Optional[List[str]], batch_size: int, task: str,
                    cfg: Dict[str, Any]) -> BatchMeta:
        p = self.controller.parts.get(pid)
        if p is None:
            return BatchMeta.empty()
        use = list(p.schema) if fields is None else fields
        need = frozenset(use)
        done = self.controller.consumed.get((pid, task), set())
        if any(f not in p.schema for f in need):
            ready: List[int] = []
        else:
            ready = self.controller.ready(pid, task, need)
        sampler = self._sampler_for(pid)
        before = self._sampler_snapshot(sampler, pid)
        try:
            sampled, consumed = sampler(ready, batch_size, partition_id=pid, task_name=task, partition=p, **cfg)
            sampled, consumed = [int(g) for g in sampled], [int(g) for g in consumed]
            bad = [g for g in list(sampled) + list(consumed) if g not in p.rows]
            if bad or len(set(sampled)) != len(sampled):
                raise InvalidInputError(f"sampler {sampler!r} returned rows that are not (unique) rows of partition "
                                        f"{pid!r}: {bad[:5] or sampled[:8]}")
            new = [g for g in dict.fromkeys(consumed) if g not in done]
            after = self._sampler_snapshot(sampler, pid)
            if new or after != before:
                self.controller.mark_consumed(pid, task, new, sampler_state=sampler.state_dict(pid)
                                              if after != before else None, sampler_key=pid)
        except BaseException:
            sampler.load_state_dict(pid, self.controller.sampler_state(pid))  # back to the committed state
            raise
        if not sampled:
            return BatchMeta.empty()
        log.debug("fetch %d rows of %r for task %r", len(sampled), pid, task)
        return self._batch_meta(pid, sampled, use)

    # ------------------------------------------------------------------ streaming: data
    def _live_rows(self, meta: BatchMeta, *, strict: bool) -> Dict[str, List[Tuple[int, int]]]:
        """Group a BatchMeta's rows by partition as (position, gidx); check they are the same
        rows (same insertion sequence number) the meta was made for."""
        groups: Dict[str, List[Tuple[int, int]]] = defaultdict(list)
        for i, (pid, g, seq) in enumerate(zip(meta.partition_ids, meta.global_indexes, meta._seqs)):
            p = self.controller.parts.get(pid)
            r = p.rows.get(g) if p is not None else None
            if r is None or (seq is not None and r.seq != seq):
                if strict:
                    if p is None:
                        raise PartitionNotFoundError(f"partition {pid!r} of the BatchMeta does not exist (cleared?)")
                    raise KeyNotFoundError(f"row {g} of partition {pid!r} in the BatchMeta no longer exists "
                                           f"(cleared); get fresh metadata")
                continue
            groups[pid].append((i, g))
        return groups

    def put(self, data: Any, metadata: Optional[BatchMeta] = None, partition_id: Optional[str] = None) -> BatchMeta:
        """Write a batch of fields.

        Without ``metadata``, appends ``len(batch)`` new rows to ``partition_id`` (created
        when missing).  With it, writes the fields to the meta's rows (e.g. from
        ``get_meta(mode="insert")`` or ``"fetch"``); the meta's ``custom_meta`` is stored as
        the rows' tags.  Returns the meta (updated in place with the new fields and
        production status when given).

        Raises:
            InvalidInputError: no partition_id and no metadata, an empty metadata, sizes.
            KeyNotFoundError: the metadata's rows were cleared.
            SchemaError, UnsupportedTypeError: nothing written.
        """
        names = _field_names(data)
        if not names:
            raise InvalidInputError("put needs at least one field")
        self._check_open()
        if metadata is None:
            if partition_id is None:
                raise InvalidInputError("put needs metadata or a partition_id")
            _check_pid(partition_id)
            with self._write_lock:
                gidxs = self.write(partition_id, data, new_rows=True)
                self._notify()
                return self._batch_meta(partition_id, gidxs, names)
        if not isinstance(metadata, BatchMeta):
            raise InvalidInputError(f"metadata must be a BatchMeta, got {type(metadata).__name__}")
        if metadata.size == 0:
            raise InvalidInputError("metadata is empty")
        with self._write_lock:
            groups = self._live_rows(metadata, strict=True)
            plans = []
            for pid, pos_g in groups.items():
                p = self.controller.parts[pid]
                pos = [i for i, _ in pos_g]
                gidxs = [g for _, g in pos_g]
                part = data if len(groups) == 1 else {f: _take(data[f], pos) for f in names}
                cur = [_tag_out(p.rows[g].tag) for g in gidxs]
                want = [metadata.custom_meta[i] for i in pos]
                tags = None
                if any(w != c for w, c in zip(want, cur)):
                    tags = [w if w != c else p.rows[g].tag for w, c, g in zip(want, cur, gidxs)]
                if len(groups) > 1:  # validate every partition before writing any
                    cols = [to_column(f, part[f], len(gidxs)) for f in names]
                    self.controller.plan_put(pid, cols, gidxs=gidxs, tags=tags)
                plans.append((pid, part, gidxs, tags))
            for pid, part, gidxs, tags in plans:
                self.write(pid, part, gidxs=gidxs, tags=tags)
            self._notify()
            for f in names:
                for pid in groups:
                    kind_dtype = self.controller.parts[pid].schema.get(f)
                    if kind_dtype is not None:
                        metadata.field_schema[f] = _schema_entry(*kind_dtype)
                        break
            status = np.zeros(metadata.size, dtype=np.int8)
            need = set(metadata.field_schema)
            for pid, pos_g in groups.items():
                p = self.controller.parts[pid]
                for i, g in pos_g:
                    status[i] = 1 if need <= p.rows[g].fields else 0
                    metadata.custom_meta[i] = _tag_out(p.rows[g].tag)
            metadata.production_status = status
        return metadata

    def get_data(self, metadata: Union[BatchMeta, KVBatchMeta]) -> Dict[str, Any]:
        """Read the fields of a BatchMeta (``metadata.field_names``) for its rows, in order.

        Returns ``{}`` for an empty meta.  A :class:`KVBatchMeta` is read by key.

        Raises:
            KeyNotFoundError, PartitionNotFoundError: the meta's rows were cleared.
            FieldNotFoundError: a field is not produced for some row.
        """
        if isinstance(metadata, KVBatchMeta):
            return self.kv_batch_get_by_meta(metadata)
        if not isinstance(metadata, BatchMeta):
            raise InvalidInputError(f"get_data takes a BatchMeta, got {type(metadata).__name__}")
        if metadata.size == 0 or not metadata.field_names:
            return {}
        self._check_open()
        fields = metadata.field_names
        groups = self._live_rows(metadata, strict=True)
        if len(groups) == 1:
            pid, pos_g = next(iter(groups.items()))
            return self.read(pid, [g for _, g in pos_g], fields)
        parts = {pid: self.read(pid, [g for _, g in pos_g], fields) for pid, pos_g in groups.items()}
        out: Dict[str, Any] = {}
        for f in fields:
            rows: List[Any] = [None] * metadata.size
            kinds = set()
            for pid, pos_g in groups.items():
                kinds.add(self.controller.parts[pid].schema[f])
                for (i, _), v in zip(pos_g, _rows_of(parts[pid][f])):
                    rows[i] = v
            out[f] = assemble(next(iter(kinds))[0], rows) if len(kinds) == 1 else rows
        return out

    # ------------------------------------------------------------------ clears
    def clear_partition(self, partition_id: str) -> None:
        """Remove a partition with all its rows, consumption and sampler state (idempotent)."""
        self._check_open()
        with self._write_lock:
            p = self.controller.parts.get(partition_id)
            gone = [] if p is None else self._clear_rows(partition_id, list(p.rows), drop_partition=True)
        if gone:
            log.info("cleared partition %r (%d rows)", partition_id, len(gone))

    def clear_samples(self, metadata: Union[BatchMeta, KVBatchMeta]) -> None:
        """Remove the rows of a BatchMeta (or the keys of a KVBatchMeta); idempotent.

        Rows already gone — also rows whose global index now belongs to a newer row — are
        skipped, never the newer row.
        """
        if isinstance(metadata, KVBatchMeta):
            if metadata.partition_id is not None and metadata.size:
                self.kv_clear(metadata.keys, metadata.partition_id)
            return
        if not isinstance(metadata, BatchMeta):
            raise InvalidInputError(f"clear_samples takes a BatchMeta, got {type(metadata).__name__}")
        self._check_open()
        with self._write_lock:
            for pid, pos_g in self._live_rows(metadata, strict=False).items():
                self._clear_rows(pid, [g for _, g in pos_g])

    # ------------------------------------------------------------------ status
    def get_consumption_status(self, task_name: str, partition_id: str
                               ) -> Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
        """``(global_indexes, consumed)`` of a partition's rows for a task, sorted by global index.

        ``consumed`` is an int8 tensor (1 consumed, 0 not).  ``(None, None)`` when the
        partition does not exist (as TransferQueue).
        """
        def consumed(p, gidxs):
            done = self.controller.consumed.get((partition_id, task_name), set())
            return torch.tensor([1 if g in done else 0 for g in gidxs], dtype=torch.int8)
        return self._row_status(partition_id, consumed)

    def get_production_status(self, data_fields: Union[str, Sequence[str]], partition_id: str
                              ) -> Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
        """``(global_indexes, produced)`` for ``data_fields``, sorted by global index.

        ``produced`` is an int8 tensor of shape ``(rows, len(data_fields))``.  ``(None,
        None)`` when the partition does not exist (as TransferQueue).
        """
        fields = _field_list(data_fields, "data_fields") or []

        def produced(p, gidxs):
            status = [[1 if f in p.rows[g].fields else 0 for f in fields] for g in gidxs]
            return torch.tensor(status, dtype=torch.int8).reshape(len(gidxs), len(fields))
        return self._row_status(partition_id, produced)

    def _row_status(self, partition_id: str, status: Callable[[Any, List[int]], torch.Tensor]
                    ) -> Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
        """``(global_indexes, status(partition, global_indexes))`` with the partition's global
        indexes sorted, under the meta lock; ``(None, None)`` when the partition does not exist."""
        self._check_open()
        with self._meta_lock:
            p = self.controller.parts.get(partition_id)
            if p is None:
                return None, None
            gidxs = sorted(p.rows)
            return torch.tensor(gidxs, dtype=torch.long), status(p, gidxs)

    def check_consumption_status(self, task_name: str, partition_id: str) -> bool:
        """True when the partition has rows and ``task_name`` consumed all of them."""
        _, c = self.get_consumption_status(task_name, partition_id)
        return c is not None and c.numel() > 0 and bool(torch.all(c == 1))

    def check_production_status(self, data_fields: Union[str, Sequence[str]], partition_id: str) -> bool:
        """True when the partition has rows and all of them produced every one of ``data_fields``."""
        _, s = self.get_production_status(data_fields, partition_id)
        return s is not None and s.shape[0] > 0 and bool(torch.all(s == 1))

    def reset_consumption(self, partition_id: str, task_name: Optional[str] = None) -> bool:
        """Forget what ``task_name`` (every task when None) consumed, and its sampler cache.

        Returns False when the partition does not exist.
        """
        self._check_open()
        with self._meta_lock:
            if partition_id not in self.controller.parts:
                return False
            self.controller.reset_consumption(partition_id, task_name)
            sampler = self._sampler_for(partition_id)
            before = self._sampler_snapshot(sampler, partition_id)
            sampler.clear_cache(partition_id, task_name)
            self._save_sampler_state(partition_id, before)
            self._notify()
        return True

    def get_partition_list(self) -> List[str]:
        """Partition ids, sorted."""
        self._check_open()
        with self._meta_lock:
            return sorted(self.controller.parts)


__all__ = ["KVMixin"]
