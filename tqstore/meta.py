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
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from .errors import InvalidInputError

log = logging.getLogger("tqstore")


def _equal(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray):
        return bool(np.array_equal(a, b))
    try:
        import torch
        if isinstance(a, torch.Tensor):
            return bool(torch.equal(a, b))
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - incomparable values are different
        return False


def _merge_extra(infos: Sequence[Dict[str, Any]], what: str) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for info in infos:
        for k, v in (info or {}).items():
            if k in out and not _equal(out[k], v):
                raise InvalidInputError(f"{what}: extra_info key {k!r} has conflicting values across chunks")
            out.setdefault(k, v)
    return out


def _chunk_bounds(size: int, chunks: int) -> List[Tuple[int, int]]:
    """``(start, end)`` of ``chunks`` near-equal parts of ``range(size)``, earlier parts one larger."""
    if chunks < 1:
        raise InvalidInputError(f"chunks must be >= 1, got {chunks}")
    base, rem = divmod(size, chunks)
    bounds, start = [], 0
    for i in range(chunks):
        end = start + base + (1 if i < rem else 0)
        bounds.append((start, end))
        start = end
    return bounds


class BatchMeta:
    """Metadata of a batch of rows addressed by global index.

    Attributes:
        global_indexes: global index of each row.
        partition_ids: partition of each row.
        field_schema: ``{field: {"dtype", "kind", "is_non_tensor"}}`` of the fields this
            batch is about (``kind`` is ``"tensor"``, ``"ndarray"`` or ``"value"``;
            ``dtype`` a ``torch.dtype``/``numpy.dtype`` or None for non-tensor fields).
        production_status: ``numpy.int8`` array, 1 where the row has every field of
            ``field_schema`` produced.
        extra_info: batch-level user information.
        custom_meta: per-row user metadata (the row's tag, a dict).
        keys: per-row user key (None for rows made by ``put`` without keys).
    """

    __slots__ = ("global_indexes", "partition_ids", "field_schema", "production_status", "extra_info",
                 "custom_meta", "keys", "_seqs")

    def __init__(self, global_indexes: Sequence[int], partition_ids: Sequence[str],
                 field_schema: Optional[Dict[str, Dict[str, Any]]] = None, production_status: Any = None,
                 extra_info: Optional[Dict[str, Any]] = None, custom_meta: Optional[Sequence[Any]] = None,
                 keys: Optional[Sequence[Optional[str]]] = None, _seqs: Optional[Sequence[Optional[int]]] = None):
        self.global_indexes = [int(g) for g in global_indexes]
        self.partition_ids = list(partition_ids)
        n = len(self.global_indexes)
        if len(self.partition_ids) != n:
            raise InvalidInputError(f"BatchMeta: {n} global indexes but {len(self.partition_ids)} partition ids")
        self.field_schema = {k: dict(v) for k, v in (field_schema or {}).items()}
        if production_status is None:
            self.production_status = np.zeros(n, dtype=np.int8)
        else:
            self.production_status = np.array(production_status, dtype=np.int8, copy=True).reshape(-1)
            if self.production_status.shape[0] != n:
                raise InvalidInputError(f"BatchMeta: production_status has {self.production_status.shape[0]} "
                                        f"entries for {n} rows")
        self.extra_info = dict(extra_info or {})
        self.custom_meta = [({} if m is None else m) for m in custom_meta] if custom_meta else [{} for _ in range(n)]
        if len(self.custom_meta) != n:
            raise InvalidInputError(f"BatchMeta: custom_meta has {len(self.custom_meta)} entries for {n} rows")
        self.keys = list(keys) if keys is not None else [None] * n
        if len(self.keys) != n:
            raise InvalidInputError(f"BatchMeta: {len(self.keys)} keys for {n} rows")
        self._seqs = list(_seqs) if _seqs is not None else [None] * n
        if len(self._seqs) != n:
            raise InvalidInputError(f"BatchMeta: {len(self._seqs)} row ids for {n} rows")

    # ------------------------------------------------------------------ properties
    @property
    def size(self) -> int:
        """Number of rows."""
        return len(self.global_indexes)

    def __len__(self) -> int:
        return self.size

    @property
    def field_names(self) -> List[str]:
        """Sorted names of the fields this batch is about."""
        return sorted(self.field_schema)

    @property
    def is_ready(self) -> bool:
        """True when the batch has rows and every row has every field produced."""
        return self.size > 0 and bool(np.all(self.production_status == 1))

    @property
    def partition_id(self) -> Optional[str]:
        """The partition when all rows share one, else None."""
        ps = set(self.partition_ids)
        return next(iter(ps)) if len(ps) == 1 else None

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
        return BatchMeta([self.global_indexes[i] for i in idx], [self.partition_ids[i] for i in idx],
                         self.field_schema, self.production_status[idx] if idx else [],
                         copy.deepcopy(self.extra_info), [copy.deepcopy(self.custom_meta[i]) for i in idx],
                         [self.keys[i] for i in idx], [self._seqs[i] for i in idx])

    def select_fields(self, field_names: Iterable[str]) -> "BatchMeta":
        """A new BatchMeta about only ``field_names`` (those this batch knows)."""
        names = [field_names] if isinstance(field_names, str) else list(field_names)
        schema = {f: self.field_schema[f] for f in names if f in self.field_schema}
        return BatchMeta(self.global_indexes, self.partition_ids, schema, self.production_status,
                         copy.deepcopy(self.extra_info), copy.deepcopy(self.custom_meta), self.keys, self._seqs)

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
        if sorted(idx) != list(range(self.size)):
            raise InvalidInputError(f"reorder needs a permutation of range({self.size}), got {idx[:8]}...")
        self.global_indexes = [self.global_indexes[i] for i in idx]
        self.partition_ids = [self.partition_ids[i] for i in idx]
        self.production_status = self.production_status[idx]
        self.custom_meta = [self.custom_meta[i] for i in idx]
        self.keys = [self.keys[i] for i in idx]
        self._seqs = [self._seqs[i] for i in idx]

    @classmethod
    def concat(cls, data: Sequence["BatchMeta"]) -> "BatchMeta":
        """Concatenate batches (empty ones skipped); their field names must agree."""
        data = [d for d in data if d is not None and d.size > 0]
        if not data:
            return cls.empty()
        names = data[0].field_names
        for i, d in enumerate(data):
            if d.field_names != names:
                raise InvalidInputError(f"BatchMeta.concat: chunk {i} has fields {d.field_names}, chunk 0 {names}")
        gi, pi, ps, cm, ks, sq = [], [], [], [], [], []
        for d in data:
            gi += d.global_indexes
            pi += d.partition_ids
            ps.append(d.production_status)
            cm += copy.deepcopy(d.custom_meta)
            ks += d.keys
            sq += d._seqs
        return cls(gi, pi, data[0].field_schema, np.concatenate(ps), _merge_extra([d.extra_info for d in data],
                   "BatchMeta.concat"), cm, ks, sq)

    def union(self, other: "BatchMeta") -> "BatchMeta":
        """This batch plus the rows of ``other`` it does not already hold."""
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


@dataclass
class KVBatchMeta:
    """Metadata of a batch of rows addressed by user key.

    ``fields`` is cumulative: after a put it lists every field all these keys have
    produced so far (earlier puts included), sorted.  ``tags`` are the keys' current tags.
    """

    keys: List[str] = field(default_factory=list)
    tags: List[Any] = field(default_factory=list)
    partition_id: Optional[str] = None
    fields: Optional[List[str]] = None
    extra_info: Dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.keys = list(self.keys)
        self.tags = copy.deepcopy(list(self.tags))
        if len(self.keys) != len(self.tags):
            raise InvalidInputError(f"KVBatchMeta: {len(self.keys)} keys but {len(self.tags)} tags")
        if len(set(self.keys)) != len(self.keys):
            raise InvalidInputError("KVBatchMeta: duplicate keys")
        if self.fields is not None:
            self.fields = list(self.fields)
            if len(set(self.fields)) != len(self.fields):
                raise InvalidInputError("KVBatchMeta: duplicate fields")
        self.extra_info = copy.deepcopy(dict(self.extra_info or {}))

    @property
    def size(self) -> int:
        return len(self.keys)

    def __len__(self) -> int:
        return len(self.keys)

    def select_keys(self, keys_to_select: Sequence[str]) -> "KVBatchMeta":
        """A new KVBatchMeta with only ``keys_to_select`` (all must be in this batch)."""
        ks = list(keys_to_select)
        if len(set(ks)) != len(ks):
            raise InvalidInputError("select_keys: duplicate keys")
        pos = {k: i for i, k in enumerate(self.keys)}
        missing = [k for k in ks if k not in pos]
        if missing:
            from .errors import KeyNotFoundError
            raise KeyNotFoundError(f"select_keys: keys not in this batch: {missing[:5]!r}")
        return KVBatchMeta(ks, [self.tags[pos[k]] for k in ks], self.partition_id, self.fields, self.extra_info)

    def reorder(self, indexes: Sequence[int]) -> None:
        """Reorder keys and tags in place; ``indexes`` is a permutation of ``range(size)``."""
        idx = [int(i) for i in indexes]
        if sorted(idx) != list(range(self.size)):
            raise InvalidInputError(f"reorder needs a permutation of range({self.size})")
        self.keys = [self.keys[i] for i in idx]
        self.tags = [self.tags[i] for i in idx]

    def chunk(self, chunks: int) -> List["KVBatchMeta"]:
        """Split into ``chunks`` parts of near-equal size (earlier parts one larger)."""
        return [KVBatchMeta(self.keys[start:end], self.tags[start:end], self.partition_id, self.fields,
                            self.extra_info) for start, end in _chunk_bounds(self.size, chunks)]

    @classmethod
    def concat(cls, data: Sequence["KVBatchMeta"]) -> "KVBatchMeta":
        """Concatenate batches of one partition with the same fields (empty ones skipped)."""
        data = [d for d in data if d is not None and d.size > 0]
        if not data:
            return cls()
        base = data[0]
        keys: List[str] = []
        tags: List[Any] = []
        for d in data:
            if d.partition_id != base.partition_id:
                raise InvalidInputError("KVBatchMeta.concat: partitions differ")
            if d.fields is not None and base.fields is not None and set(d.fields) != set(base.fields):
                raise InvalidInputError("KVBatchMeta.concat: fields differ")
            keys += d.keys
            tags += d.tags
        return cls(keys, tags, base.partition_id, base.fields,
                   _merge_extra([d.extra_info for d in data], "KVBatchMeta.concat"))


__all__ = ["BatchMeta", "KVBatchMeta"]
