"""Batch metadata of rows addressed by user key: :class:`KVBatchMeta` (what ``kv_put`` /
``kv_batch_put`` return and ``kv_batch_get_by_meta`` takes; re-exported by :mod:`tqstore.meta`).

A plain in-memory object: nothing here touches a store.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

from .errors import InvalidInputError, KeyNotFoundError
from .meta_schema import chunk_bounds as _chunk_bounds, merge_extra as _merge_extra


class _KeysNotInBatchError(KeyNotFoundError, RuntimeError):
    """``KVBatchMeta.select_keys`` with keys the batch does not hold (TransferQueue raises RuntimeError)."""


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
        if self.keys is None or isinstance(self.keys, (str, bytes)) or not hasattr(self.keys, "__iter__"):
            raise InvalidInputError(f"KVBatchMeta: keys must be a list of str, got {type(self.keys).__name__}")
        self.keys = list(self.keys)
        # a copy of each tag (an empty dict, the common tag, copied without deepcopy's bookkeeping)
        self.tags = [{} if type(t) is dict and not t else t if t is None else copy.deepcopy(t) for t in self.tags]
        if len(self.keys) != len(self.tags):
            raise InvalidInputError(f"KVBatchMeta: keys and tags must have same length, but got {len(self.keys)} "
                                    f"and {len(self.tags)}")
        if len(set(self.keys)) != len(self.keys):
            raise InvalidInputError("KVBatchMeta: Got duplicated keys.")
        if self.fields is not None:
            self.fields = list(self.fields)
            if len(set(self.fields)) != len(self.fields):
                raise InvalidInputError("KVBatchMeta: Got duplicated fields.")
        self.extra_info = copy.deepcopy(dict(self.extra_info or {}))

    @classmethod
    def _of_rows(cls, keys: List[str], tags: List[Any], partition_id: str, fields: List[str]) -> "KVBatchMeta":
        """The meta of a put's or get's distinct ``keys`` from the controller's answer, without
        ``__post_init__``'s copies and checks: ``keys`` and ``fields`` are the caller's fresh
        lists, ``tags`` the answer's copies (None: no tag, given as ``{}``)."""
        self = cls.__new__(cls)
        self.keys, self.partition_id, self.fields, self.extra_info = keys, partition_id, fields, {}
        self.tags = [{} if t is None else t for t in tags] if None in tags else list(tags)
        return self

    @property
    def size(self) -> int:
        return len(self.keys)

    def __len__(self) -> int:
        return len(self.keys)

    def select_keys(self, keys_to_select: Sequence[str]) -> "KVBatchMeta":
        """A new KVBatchMeta with only ``keys_to_select`` (all must be in this batch)."""
        ks = list(keys_to_select)
        if len(set(ks)) != len(ks):
            raise InvalidInputError("select_keys: Contain duplicate keys.")
        pos = {k: i for i, k in enumerate(self.keys)}
        missing = [k for k in ks if k not in pos]
        if missing:
            raise _KeysNotInBatchError(f"select_keys: keys {missing[:5]!r} not found in current batch")
        return KVBatchMeta(ks, [self.tags[pos[k]] for k in ks], self.partition_id, self.fields, self.extra_info)

    def reorder(self, indexes: Sequence[int]) -> None:
        """Reorder keys and tags in place; ``indexes`` is a permutation of ``range(size)``."""
        idx = [int(i) for i in indexes]
        if len(idx) != self.size:
            raise InvalidInputError(f"reorder: indexes length {len(idx)} does not match the batch size {self.size}")
        if len(set(idx)) != len(idx):
            raise InvalidInputError("reorder: Contain duplicate indexes.")
        if sorted(idx) != list(range(self.size)):
            raise InvalidInputError(f"reorder: indexes must be a permutation of range({self.size})")
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
                raise InvalidInputError("KVBatchMeta.concat: Partition do not match for concatenation.")
            if d.fields is not None and base.fields is not None and set(d.fields) != set(base.fields):
                raise InvalidInputError("KVBatchMeta.concat: Field names do not match for concatenation.")
            keys += d.keys
            tags += d.tags
        return cls(keys, tags, base.partition_id, base.fields,
                   _merge_extra([d.extra_info for d in data], "KVBatchMeta.concat"))


__all__ = ["KVBatchMeta"]
