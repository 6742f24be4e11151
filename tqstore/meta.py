"""Batch metadata handed between the data-plane calls (TransferQueue-shaped).

:class:`BatchMeta` describes rows by global index (what ``get_meta`` returns and
``put`` / ``get_data`` / ``clear_samples`` take); :class:`KVBatchMeta` describes rows by
user key (what ``kv_put`` / ``kv_batch_put`` return and ``kv_batch_get_by_meta`` takes).

Both are plain in-memory objects: nothing here touches a store.  A ``BatchMeta`` also
remembers each row's partition-local sequence number, so a stale meta (its rows cleared
and their global indexes reused) is refused instead of silently reading another row.
"""
from __future__ import annotations

import copy
import logging
from types import MappingProxyType
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence

import numpy as np

from ._format.names import as_int
from .errors import InvalidInputError
from .meta_schema import (
    batch_len_of as _batch_len_of, chunk_bounds as _chunk_bounds, extract_field_schema, merge_extra as _merge_extra,
    normalise_schema as _normalise_schema, plain as _plain, shapes_entry,
)

log = logging.getLogger("tqstore")


class BatchMeta:
    """Metadata of a batch of rows addressed by global index.

    Attributes:
        global_indexes: global index of each row.
        partition_ids: partition of each row.
        field_schema: ``{field: {"dtype", "kind", "is_non_tensor", "shape", "is_nested"}}`` of
            the fields this batch is about (``kind`` is ``"tensor"``, ``"ndarray"`` or
            ``"value"``; ``dtype`` a ``torch.dtype``/``numpy.dtype`` or None for non-tensor
            fields; ``shape`` the per-row shape when rows share one, else None with
            ``is_nested`` True and ``per_sample_shapes``).  In a meta from ``get_meta`` the
            shapes are read from the stored rows' frame heads on first access of
            ``field_schema`` (not on the get_meta path).
        production_status: ``numpy.int8`` array, 1 where the row has every field of
            ``field_schema`` produced.
        extra_info: batch-level user information.
        custom_meta: per-row user metadata (the row's tag, a dict).
        keys: per-row user key (None for rows made by ``put`` without keys).
    """

    __slots__ = ("global_indexes", "partition_ids", "_field_schema", "production_status", "extra_info",
                 "_custom_meta", "_backend_meta", "keys", "_seqs", "_shape_source", "_lazy_tags")

    def __init__(self, global_indexes: Sequence[int], partition_ids: Sequence[str],
                 field_schema: Optional[Dict[str, Dict[str, Any]]] = None, production_status: Any = None,
                 extra_info: Optional[Dict[str, Any]] = None, custom_meta: Optional[Sequence[Any]] = None,
                 keys: Optional[Sequence[Optional[str]]] = None, _seqs: Optional[Sequence[Optional[int]]] = None,
                 *, _custom_backend_meta: Optional[Sequence[Dict[str, Any]]] = None,
                 _shape_source: Optional[Callable[..., Dict[str, List[Any]]]] = None):
        self._lazy_tags = None
        self.global_indexes = [g if type(g) is int else as_int(g) for g in global_indexes]  # (not 3.7, "3", True)
        if None in self.global_indexes:
            bad = list(global_indexes)[self.global_indexes.index(None)]
            raise InvalidInputError(f"BatchMeta: global indexes must be ints, got {bad!r:.80}")
        if isinstance(partition_ids, (str, bytes)):  # (list() would split it into characters)
            raise InvalidInputError(f"BatchMeta: partition_ids must be a list of str (one per row), got "
                                    f"{type(partition_ids).__name__} {partition_ids!r:.80}")
        self.partition_ids = list(partition_ids)
        if not set(map(type, self.partition_ids)) <= {str}:
            bad = next((p for p in self.partition_ids if not isinstance(p, str)), None)
            if bad is not None:
                raise InvalidInputError(f"BatchMeta: partition ids must be str, got {type(bad).__name__} {bad!r:.80}")
        n = len(self.global_indexes)
        if len(self.partition_ids) != n:
            raise InvalidInputError(f"BatchMeta: {n} global indexes but {len(self.partition_ids)} partition ids")
        self._field_schema = _normalise_schema(field_schema)
        self._shape_source = _shape_source
        for name, entry in self._field_schema.items():
            pss = entry.get("per_sample_shapes")
            if pss is not None and len(pss) != n:
                raise InvalidInputError(f"Field {name!r} per_sample_shapes length {len(pss)} != batch_size {n}")
        if production_status is None:
            self.production_status = np.zeros(n, dtype=np.int8)
        else:
            self.production_status = np.array(production_status, dtype=np.int8, copy=True).reshape(-1)
            if self.production_status.shape[0] != n:
                raise InvalidInputError(f"BatchMeta: production_status has {self.production_status.shape[0]} "
                                        f"entries for {n} rows")
        self.extra_info = dict(extra_info or {})
        self.custom_meta = ([({} if m is None else dict(m) if isinstance(m, dict) else m) for m in custom_meta]
                            if custom_meta else [{} for _ in range(n)])
        if len(self.custom_meta) != n:
            raise InvalidInputError(f"BatchMeta: custom_meta has {len(self.custom_meta)} entries for {n} rows")
        self._custom_backend_meta = ([dict(m or {}) for m in _custom_backend_meta] if _custom_backend_meta
                                     else [{} for _ in range(n)])
        if len(self._custom_backend_meta) != n:
            raise InvalidInputError(f"BatchMeta: _custom_backend_meta has {len(self._custom_backend_meta)} entries "
                                    f"for {n} rows")
        self.keys = list(keys) if keys is not None else [None] * n
        if len(self.keys) != n:
            raise InvalidInputError(f"BatchMeta: {len(self.keys)} keys for {n} rows")
        self._seqs = list(_seqs) if _seqs is not None else [None] * n
        if len(self._seqs) != n:
            raise InvalidInputError(f"BatchMeta: {len(self._seqs)} row ids for {n} rows")

    @classmethod
    def _of_rows(cls, global_indexes: List[int], pid: str, field_schema: Dict[str, Dict[str, Any]],
                 production_status: np.ndarray, tags: List[Any], keys: List[Optional[str]],
                 seqs: List[Optional[int]], shape_source: Optional[Callable[..., Dict[str, List[Any]]]] = None
                 ) -> "BatchMeta":
        """A meta of one partition's rows from a controller answer, without the constructor's
        copies and checks: every argument is the caller's own fresh object, handed over (lists of
        equal length, ints, an int8 array, schema entries with ``shape`` and ``is_nested`` keys,
        tags already copies, None for no tag).  The data plane's hot path (get_meta, put)."""
        self = cls.__new__(cls)
        n = len(global_indexes)
        self.global_indexes = global_indexes
        self.partition_ids = [pid] * n
        self._field_schema = field_schema
        self._shape_source = shape_source
        self.production_status = production_status
        self.extra_info = {}
        # per-row dicts made on first use (most metas go to get_data untouched): the tags as
        # answered (None: no tag, {} when looked at); no backend meta yet
        self._custom_meta, self._lazy_tags, self._backend_meta = None, tags, None
        self.keys = keys
        self._seqs = seqs
        return self

    # ------------------------------------------------------------------ properties
    @property
    def custom_meta(self) -> List[Any]:
        """Per-row user metadata (the row's tag, a dict; ``{}`` for a row without one)."""
        if self._custom_meta is None:
            tags, self._lazy_tags = self._lazy_tags, None
            self._custom_meta = [{} if t is None else t for t in tags] if None in tags else tags
        return self._custom_meta

    @custom_meta.setter
    def custom_meta(self, value: List[Any]) -> None:
        """(None: no metadata for any row, as the constructor takes it.)"""
        self._custom_meta, self._lazy_tags = ([{} for _ in range(self.size)] if value is None else value), None

    @property
    def _custom_backend_meta(self) -> List[Dict[str, Any]]:
        if self._backend_meta is None:
            self._backend_meta = [{} for _ in range(len(self.global_indexes))]
        return self._backend_meta

    @_custom_backend_meta.setter
    def _custom_backend_meta(self, value: List[Dict[str, Any]]) -> None:
        self._backend_meta = value

    @property
    def field_schema(self) -> Dict[str, Dict[str, Any]]:
        """The field schema (class docstring); shapes of a ``get_meta`` answer are read on first access."""
        if self._shape_source is not None:
            self._resolve_shapes()
        return self._field_schema

    @field_schema.setter
    def field_schema(self, value: Dict[str, Dict[str, Any]]) -> None:
        self._field_schema = value

    def _resolve_shapes(self) -> None:
        """Fill ``shape`` / ``is_nested`` of tensor fields from the stored rows (``_shape_source(pid,
        gidxs, fields)`` → per-row shapes); a failure (store closed, rows cleared) leaves them None."""
        source, self._shape_source = self._shape_source, None
        todo = [f for f, e in self._field_schema.items()
                if e.get("kind") in ("tensor", "ndarray") and e.get("shape") is None and e.get("is_nested") is None]
        if not todo or not self.size:
            return
        groups: Dict[str, List[int]] = {}
        for i, pid in enumerate(self.partition_ids):
            groups.setdefault(pid, []).append(i)
        shapes: Dict[str, List[Any]] = {f: [None] * self.size for f in todo}
        try:
            for pid, pos in groups.items():
                got = source(pid, [self.global_indexes[i] for i in pos], todo)
                for f in todo:
                    for i, sh in zip(pos, got[f]):
                        shapes[f][i] = sh
        except Exception as e:  # noqa: BLE001 - the schema stays as it was; the data calls report errors
            log.debug("BatchMeta: row shapes not read (%s: %s)", type(e).__name__, e)
            return
        for f in todo:
            shapes_entry(self._field_schema[f], shapes[f])

    @property
    def size(self) -> int:
        """Number of rows."""
        return len(self.global_indexes)

    def __len__(self) -> int:
        return self.size

    @property
    def field_names(self) -> List[str]:
        """Sorted names of the fields this batch is about."""
        return sorted(self._field_schema)

    @property
    def is_ready(self) -> bool:
        """True when the batch has rows and every row has every field produced."""
        return self.size > 0 and bool(np.all(self.production_status == 1))

    @property
    def partition_id(self) -> Optional[str]:
        """The partition when all rows share one, else None."""
        ps = set(self.partition_ids)
        return next(iter(ps)) if len(ps) == 1 else None

    @property
    def samples(self) -> "_SampleViewList":
        """Lazy read-only per-row views: ``meta.samples[i].fields["x"]["shape"]``, ``len()``, iteration."""
        return _SampleViewList(self)

    def get_dtypes(self, field_name: str) -> List[Any]:
        """The field's dtype once per row (KeyError when this batch is not about ``field_name``)."""
        if field_name not in self._field_schema:
            raise KeyError(f"Field '{field_name}' not found in field_schema")
        return [self._field_schema[field_name].get("dtype")] * self.size

    def get_shapes(self, field_name: str) -> List[Any]:
        """The field's per-row shape, once per row (``per_sample_shapes`` for jagged fields)."""
        if field_name not in self.field_schema:
            raise KeyError(f"Field '{field_name}' not found in field_schema")
        meta = self.field_schema[field_name]
        pss = meta.get("per_sample_shapes")
        return list(pss) if pss is not None else [meta.get("shape")] * self.size

    # ------------------------------------------------------------------ pickling (in-memory transport only)
    def __getstate__(self):
        if self._shape_source is not None:
            self._resolve_shapes()  # the source (the store) does not travel
        return tuple(getattr(self, slot) for slot in self.__slots__)

    def __setstate__(self, state) -> None:
        self._shape_source = None
        for slot, value in zip(self.__slots__, state):
            if slot == "production_status" and isinstance(value, np.ndarray) and not value.flags.writeable:
                value = value.copy()  # zero-copy deserialisers hand out read-only arrays
            setattr(self, slot, value)

    # ------------------------------------------------------------------ extra info / custom meta
    def get_extra_info(self, key: str, default: Any = None) -> Any:
        return self.extra_info.get(key, default)

    def set_extra_info(self, key: str, value: Any) -> None:
        self.extra_info[key] = value

    def update_extra_info(self, info: Dict[str, Any]) -> None:
        self.extra_info.update(info)

    def remove_extra_info(self, key: str) -> Any:
        return self.extra_info.pop(key, None)

    def has_extra_info(self, key: str) -> bool:
        return key in self.extra_info

    def get_all_extra_info(self) -> Dict[str, Any]:
        return copy.deepcopy(self.extra_info)

    def clear_extra_info(self) -> None:
        self.extra_info.clear()

    def get_all_custom_meta(self) -> List[Any]:
        """A deep copy of the per-row custom metadata (tags)."""
        return copy.deepcopy(self.custom_meta)

    def update_custom_meta(self, custom_meta: Optional[Sequence[Dict[str, Any]]]) -> None:
        """Merge one dict per row into the rows' custom metadata; ``put`` stores it as the tag."""
        if custom_meta is None:
            return
        if len(custom_meta) != self.size:
            raise InvalidInputError(f"update_custom_meta: {len(custom_meta)} entries for {self.size} rows")
        for i, m in enumerate(custom_meta):
            if m is None:
                continue
            if isinstance(self.custom_meta[i], dict) and isinstance(m, dict):
                self.custom_meta[i] = {**self.custom_meta[i], **m}
            else:
                self.custom_meta[i] = m

    def clear_custom_meta(self) -> None:
        self.custom_meta = [{} for _ in range(self.size)]

    # ------------------------------------------------------------------ selection
    def select_samples(self, sample_indices: Sequence[int]) -> "BatchMeta":
        """A new BatchMeta holding the rows at ``sample_indices`` (positions in this batch)."""
        idx = [int(i) for i in sample_indices]
        if any(i < 0 or i >= self.size for i in idx):
            raise InvalidInputError(f"sample indices must be in [0, {self.size})")
        schema = copy.deepcopy(self._field_schema)
        for entry in schema.values():
            if entry.get("per_sample_shapes") is not None:
                entry["per_sample_shapes"] = [entry["per_sample_shapes"][i] for i in idx]
                shapes_entry(entry, entry["per_sample_shapes"])  # a part of a jagged batch may be uniform
        return BatchMeta([self.global_indexes[i] for i in idx], [self.partition_ids[i] for i in idx],
                         schema, self.production_status[idx] if idx else [],
                         copy.deepcopy(self.extra_info), [copy.deepcopy(self.custom_meta[i]) for i in idx],
                         [self.keys[i] for i in idx], [self._seqs[i] for i in idx],
                         _custom_backend_meta=[copy.deepcopy(self._custom_backend_meta[i]) for i in idx],
                         _shape_source=self._shape_source)

    def select_fields(self, field_names: Iterable[str]) -> "BatchMeta":
        """A new BatchMeta about only ``field_names`` (those this batch knows)."""
        names = [field_names] if isinstance(field_names, str) else list(field_names)
        schema = {f: self._field_schema[f] for f in names if f in self._field_schema}
        backend = [{f: v for f, v in m.items() if f.startswith("_") or f in names} for m in self._custom_backend_meta]
        return BatchMeta(self.global_indexes, self.partition_ids, schema, self.production_status,
                         copy.deepcopy(self.extra_info), copy.deepcopy(self.custom_meta), self.keys, self._seqs,
                         _custom_backend_meta=copy.deepcopy(backend), _shape_source=self._shape_source)

    def copy(self) -> "BatchMeta":
        """A deep copy."""
        return BatchMeta(self.global_indexes, self.partition_ids, self._field_schema, self.production_status,
                         copy.deepcopy(self.extra_info), copy.deepcopy(self.custom_meta), self.keys, self._seqs,
                         _custom_backend_meta=copy.deepcopy(self._custom_backend_meta),
                         _shape_source=self._shape_source)

    def add_fields(self, tensor_dict: Any, set_all_ready: bool = True) -> "BatchMeta":
        """Add the fields of a batch (TensorDict or mapping, one entry per row) to this meta, in place.

        With ``set_all_ready`` every row is marked produced.  Returns ``self`` (TransferQueue's shape).
        """
        schema = extract_field_schema(tensor_dict)
        if not schema:
            log.warning("add_fields: empty batch, nothing added")
            return self
        n = len(next(iter(schema.values())).get("per_sample_shapes") or []) or _batch_len_of(
            _plain(tensor_dict[next(iter(tensor_dict.keys()))]))
        if hasattr(tensor_dict, "batch_size") and len(tuple(tensor_dict.batch_size)):
            n = int(tuple(tensor_dict.batch_size)[0])
        if n != self.size:
            raise InvalidInputError(f"add_fields batch size mismatch: self.size={self.size} vs tensor_dict={n}")
        self.field_schema.update(schema)
        if set_all_ready:
            self.production_status[:] = 1
        return self

    def __getitem__(self, item) -> "BatchMeta":
        if isinstance(item, (int, np.integer)):
            i = int(item) + (self.size if item < 0 else 0)
            if i < 0 or i >= self.size:
                raise IndexError("BatchMeta index out of range")
            return self.select_samples([i])
        if isinstance(item, slice):
            return self.select_samples(list(range(*item.indices(self.size))))
        raise TypeError(f"BatchMeta cannot be indexed with {type(item).__name__}")

    def chunk(self, chunks: int) -> List["BatchMeta"]:
        """Split into ``chunks`` parts of near-equal size (earlier parts one larger)."""
        return [self.select_samples(range(start, end)) for start, end in _chunk_bounds(self.size, chunks)]

    def chunk_by_partition(self) -> List["BatchMeta"]:
        """Split into one BatchMeta per partition, in order of first appearance."""
        groups: Dict[str, List[int]] = {}
        for i, p in enumerate(self.partition_ids):
            groups.setdefault(p, []).append(i)
        return [self.select_samples(ix) for ix in groups.values()]

    def reorder(self, indices: Sequence[int]) -> None:
        """Reorder rows in place; ``indices`` is a permutation of ``range(size)``."""
        idx = [int(i) for i in indices]
        if len(idx) != self.size:
            raise InvalidInputError(f"Indices length {len(idx)} mismatch batch size {self.size}")
        if len(set(idx)) != self.size:
            raise InvalidInputError("Indices contain duplicates")
        if sorted(idx) != list(range(self.size)):
            raise InvalidInputError(f"Reorder indices must be in range [0, {self.size})")
        for entry in self._field_schema.values():
            if entry.get("per_sample_shapes") is not None:
                entry["per_sample_shapes"] = [entry["per_sample_shapes"][i] for i in idx]
        self._custom_backend_meta = [self._custom_backend_meta[i] for i in idx]
        self.global_indexes = [self.global_indexes[i] for i in idx]
        self.partition_ids = [self.partition_ids[i] for i in idx]
        self.production_status = self.production_status[idx]
        self.custom_meta = [self.custom_meta[i] for i in idx]
        self.keys = [self.keys[i] for i in idx]
        self._seqs = [self._seqs[i] for i in idx]

    @classmethod
    def concat(cls, data: Sequence["BatchMeta"], validate: bool = True) -> "BatchMeta":
        """Concatenate batches (empty ones skipped); their field names (and, with ``validate``, dtypes) must agree."""
        data = [d for d in data if d is not None and d.size > 0]
        if not data:
            return cls.empty()
        names = data[0].field_names
        if validate:
            for i, d in enumerate(data):
                if d.field_names != names:
                    raise InvalidInputError(f"BatchMeta.concat: field_names mismatch at chunk[{i}]: {d.field_names}, "
                                            f"chunk[0] {names}")
            for f in names:
                base = data[0].field_schema[f].get("dtype")
                for i, d in enumerate(data[1:], start=1):
                    other = d.field_schema[f].get("dtype")
                    if base is not None and other is not None and other != base:  # None: not yet produced
                        raise InvalidInputError(f"Field {f!r} dtype mismatch in concat: chunk[0]={base}, "
                                                f"chunk[{i}]={d.field_schema[f].get('dtype')}")
        schema: Dict[str, Dict[str, Any]] = {}
        for f, first in data[0].field_schema.items():
            entries = [d.field_schema.get(f, {}) for d in data]
            nested = any(e.get("is_nested") for e in entries)
            entry = dict(first)
            entry.pop("per_sample_shapes", None)
            if nested:
                entry["is_nested"], entry["shape"] = True, None
            if nested or any(e.get("per_sample_shapes") for e in entries):
                shapes: List[Any] = []
                for d, e in zip(data, entries):
                    shapes += list(e.get("per_sample_shapes") or [e.get("shape")] * d.size)
                entry["per_sample_shapes"] = shapes
            schema[f] = entry
        gi, pi, ps, cm, bm, ks, sq = [], [], [], [], [], [], []
        for d in data:
            gi += d.global_indexes
            pi += d.partition_ids
            ps.append(d.production_status)
            cm += copy.deepcopy(d.custom_meta)
            bm += copy.deepcopy(d._custom_backend_meta)
            ks += d.keys
            sq += d._seqs
        return cls(gi, pi, schema, np.concatenate(ps), _merge_extra([d.extra_info for d in data],
                   "BatchMeta.concat"), cm, ks, sq, _custom_backend_meta=bm)

    def union(self, other: "BatchMeta") -> "BatchMeta":
        """TransferQueue's union: the same rows with the fields of both batches, as a new BatchMeta.

        Both must hold the same global indexes and partitions in the same order (ValueError
        otherwise).  ``other``'s schema wins on a shared field; a row is produced only when it is
        produced in both; extra_info and per-row custom metadata are merged, ``other`` winning.
        An empty side yields a copy of the other.  (Appending rows is :meth:`union_rows`.)
        """
        if other is None or other.size == 0:
            return self.copy()
        if self.size == 0:
            return other.copy()
        if self.global_indexes != other.global_indexes:
            raise InvalidInputError(f"BatchMeta.union: global_indexes do not match. self.global_indexes="
                                    f"{self.global_indexes}, other.global_indexes={other.global_indexes}")
        if self.partition_ids != other.partition_ids:
            raise InvalidInputError(f"BatchMeta.union: partition_ids do not match. self.partition_ids="
                                    f"{self.partition_ids}, other.partition_ids={other.partition_ids}")
        schema = copy.deepcopy(self.field_schema)
        schema.update(copy.deepcopy(other.field_schema))
        custom = []
        for a, b in zip(self.custom_meta, other.custom_meta):
            if isinstance(a, dict) and isinstance(b, dict):
                custom.append({**copy.deepcopy(a), **copy.deepcopy(b)})
            else:
                custom.append(copy.deepcopy(b if b not in (None, {}) else a))
        backend = [{**copy.deepcopy(a), **copy.deepcopy(b)}
                   for a, b in zip(self._custom_backend_meta, other._custom_backend_meta)]
        keys = [k if k is not None else ok for k, ok in zip(self.keys, other.keys)]
        seqs = [s if s is not None else os_ for s, os_ in zip(self._seqs, other._seqs)]
        return BatchMeta(self.global_indexes, self.partition_ids, schema,
                         np.bitwise_and(self.production_status, other.production_status),
                         {**copy.deepcopy(self.extra_info), **copy.deepcopy(other.extra_info)}, custom, keys, seqs,
                         _custom_backend_meta=backend)

    def union_rows(self, other: "BatchMeta") -> "BatchMeta":
        """This batch plus the rows of ``other`` it does not already hold (tqstore's former ``union``)."""
        if other is None or other.size == 0:
            return self
        if self.size == 0:
            return other
        mine = set(zip(self.partition_ids, self.global_indexes))
        extra = [i for i, pg in enumerate(zip(other.partition_ids, other.global_indexes)) if pg not in mine]
        return self if not extra else BatchMeta.concat([self, other.select_samples(extra)])

    @classmethod
    def empty(cls, extra_info: Optional[Dict[str, Any]] = None) -> "BatchMeta":
        """A batch with no rows."""
        return cls([], [], {}, None, extra_info or {})

    def __repr__(self) -> str:
        return (f"BatchMeta(size={self.size}, field_names={self.field_names}, is_ready={self.is_ready}, "
                f"partitions={sorted(set(self.partition_ids))}, global_indexes={self.global_indexes[:8]}"
                f"{'...' if self.size > 8 else ''})")


class _SampleView:
    """Read-only view of one row of a BatchMeta (``BatchMeta.samples[i]``)."""

    __slots__ = ("_batch", "_idx")

    def __init__(self, batch: BatchMeta, idx: int) -> None:
        self._batch, self._idx = batch, idx

    @property
    def global_index(self) -> int:
        return self._batch.global_indexes[self._idx]

    @property
    def partition_id(self) -> str:
        return self._batch.partition_ids[self._idx]

    @property
    def production_status(self) -> int:
        return int(self._batch.production_status[self._idx])

    @property
    def custom_meta(self) -> "MappingProxyType[str, Any]":
        m = self._batch.custom_meta[self._idx]
        return MappingProxyType(m if isinstance(m, dict) else {"tag": m})

    @property
    def fields(self) -> "MappingProxyType[str, MappingProxyType]":
        """Per-row schema: for a jagged field ``shape`` is this row's shape."""
        out = {}
        for name, meta in self._batch.field_schema.items():
            entry = {k: v for k, v in meta.items() if k != "per_sample_shapes"}
            if meta.get("per_sample_shapes") is not None:
                entry["shape"] = meta["per_sample_shapes"][self._idx]
            out[name] = MappingProxyType(entry)
        return MappingProxyType(out)

    def __repr__(self) -> str:
        return (f"_SampleView(global_index={self.global_index}, partition_id={self.partition_id!r}, "
                f"production_status={self.production_status}, fields={list(self._batch.field_schema)})")


class _SampleViewList:
    """``BatchMeta.samples``: indexable, sized, iterable, lazy."""

    __slots__ = ("_batch",)

    def __init__(self, batch: BatchMeta) -> None:
        self._batch = batch

    def __len__(self) -> int:
        return self._batch.size

    def __getitem__(self, idx: int) -> _SampleView:
        i = int(idx) + (self._batch.size if idx < 0 else 0)
        if i < 0 or i >= self._batch.size:
            raise IndexError("sample index out of range")
        return _SampleView(self._batch, i)

    def __iter__(self):
        return (_SampleView(self._batch, i) for i in range(self._batch.size))


from .meta_kv import KVBatchMeta  # noqa: E402 - re-exported (its own module: meta.py stays one job)

__all__ = ["BatchMeta", "KVBatchMeta", "extract_field_schema"]
