"""The controller's in-memory mirror: rows, partitions, ready views, and the values made from them.

Only :class:`~tqstore.controller.Controller` (and its sampler host) touches these objects;
everything the data plane sees crosses :class:`~tqstore.ports.ControllerPort` as values
(:class:`~tqstore.ports.RowInfo`, :class:`~tqstore.ports.PartitionInfo`,
:class:`~tqstore.ports.RowBatch`), made here by :func:`row_info` / :func:`row_batch`.

Incremental structures (kept in step by every mutating method of the controller):

* ``Partition.rows`` is in insertion order, i.e. ordered by ``seq`` (new rows always get
  the partition's next sequence number; the controller's load sorts once);
* ``Partition.ready[task][need]`` — for each ``(task, requested field set)`` a fetch has
  asked about — the rows whose ``need`` fields are produced and that ``task`` has not
  consumed, so that a fetch costs O(ready) rather than a scan and sort of the partition.
  Built on first use, updated by ``commit_put``, ``mark_consumed``, ``clear_rows``,
  dropped by ``reset_consumption`` / ``drop_fields``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import AbstractSet, Any, Dict, List, Optional, Sequence, Set, Tuple

import numpy as np

from ._format.controller_records import decode_row, encode_partition, encode_row
from .ports import PartitionInfo, RowBatch, RowInfo

_MAX_VIEWS_PER_TASK = 8


@dataclass
class Row:
    """One row's metadata. ``fields`` are the produced fields."""

    gidx: int
    pid: str
    key: Optional[str]
    tag: Any
    fields: AbstractSet[str]  # a frozenset in the mirror: handed out as a value as it is
    seq: int

    def pack(self) -> bytes:
        """The ``rows`` value (:func:`tqstore._format.controller_records.encode_row`)."""
        return encode_row(self.pid, self.key, self.tag, self.fields, self.seq)

    @classmethod
    def unpack(cls, gidx: int, raw: bytes) -> "Row":
        """Raises RecordError (a ValueError) on a malformed value."""
        p, k, t, f, s = decode_row(raw)
        return cls(gidx, p, k, t, frozenset(f), s)


class _Ready:
    """Rows of one partition ready for one ``(task, need)``: gidx -> seq, seq-ordered unless
    ``dirty`` (a row older than the newest one became ready; sorted on next use)."""

    __slots__ = ("rows", "last", "dirty")

    def __init__(self, rows: Dict[int, int]) -> None:
        self.rows = rows
        self.last = max(rows.values(), default=-1)
        self.dirty = False

    def add(self, gidx: int, seq: int) -> None:
        if gidx in self.rows:
            return
        self.rows[gidx] = seq
        if seq < self.last:
            self.dirty = True
        else:
            self.last = seq

    def ordered(self) -> List[int]:
        if self.dirty:
            self.rows = dict(sorted(self.rows.items(), key=lambda kv: kv[1]))
            self.dirty = False
        return list(self.rows)

    def seqs(self) -> List[int]:
        """Sequence numbers parallel to :meth:`ordered` (call it first)."""
        return list(self.rows.values())


@dataclass
class Partition:
    pid: str
    keys: Dict[str, int] = field(default_factory=dict)
    rows: Dict[int, Row] = field(default_factory=dict)
    schema: Dict[str, Tuple[int, int]] = field(default_factory=dict)  # field -> (kind, dtype)
    next_seq: int = 0
    meta: Dict[str, Any] = field(default_factory=dict)
    # task -> frozenset(requested fields) -> rows ready and unconsumed (see the module docstring)
    ready: Dict[str, Dict[frozenset, _Ready]] = field(default_factory=dict, repr=False, compare=False)

    def pack(self) -> bytes:
        return encode_partition(self.next_seq, self.meta)

    def ready_view(self, task: str, need: frozenset, done) -> _Ready:
        """The ready view of ``(task, need)`` (``done``: the rows ``task`` consumed), built
        on first use (O(rows)), most recently used last, at most 8 per task."""
        views = self.ready.setdefault(task, {})
        v = views.pop(need, None)
        if v is None:
            v = _Ready({g: r.seq for g, r in self.rows.items() if g not in done and need <= r.fields})
            while len(views) >= _MAX_VIEWS_PER_TASK:
                del views[next(iter(views))]  # least recently used
        views[need] = v  # most recently used last
        return v


@dataclass
class PutPlan:
    """A validated put, with global indexes reserved in memory but nothing committed."""

    pid: str
    gidxs: List[int]
    new_rows: List[Row]
    tags: Optional[List[Any]]
    fields: List[str]
    schema_new: Dict[str, Tuple[int, int]]
    overwrites: bool  # some (gidx, field) already produced
    new_partition: bool


# ---------------------------------------------------------------------------- values out
def copy_value(v: Any) -> Any:
    """A copy of a stored non-tensor value (tags: None, numbers, str, lists, str-keyed dicts),
    so that a caller editing what it got never edits the mirror."""
    if isinstance(v, dict):
        v = dict(v)  # stored values are JSON-shaped: only nested dicts and lists need more
        for k, x in v.items():
            if isinstance(x, (dict, list)):
                v[k] = copy_value(x)
        return v
    if isinstance(v, list):
        return [copy_value(x) if isinstance(x, (dict, list)) else x for x in v]
    return v


def row_info(r: Row) -> RowInfo:
    return RowInfo(r.gidx, r.key, copy_value(r.tag), r.fields, r.seq)


def partition_info(p: Partition) -> PartitionInfo:
    return PartitionInfo(p.pid, dict(p.schema), len(p.rows))


def row_batch(p: Partition, rows: List[Optional[Row]], asked: Optional[Sequence[int]] = None) -> RowBatch:
    """The answer for ``rows`` of ``p`` (None: not a row; ``asked[i]`` is then the gidx asked
    for, when rows were asked by gidx).  Row fields are frozensets: handed out as they are."""
    try:
        seqs = [r.seq for r in rows]
    except AttributeError:  # a None: some are not rows
        pass
    else:  # every one is a row: one list per column
        return RowBatch(p.pid, dict(p.schema), [r.gidx for r in rows], [r.key for r in rows],
                        [None if r.tag is None else copy_value(r.tag) for r in rows], [r.fields for r in rows], seqs)
    gidxs = [r.gidx if r is not None else (None if asked is None else asked[i]) for i, r in enumerate(rows)]
    return RowBatch(p.pid, dict(p.schema), gidxs, [None if r is None else r.key for r in rows],
                    [None if r is None else copy_value(r.tag) for r in rows],
                    [None if r is None else r.fields for r in rows], [None if r is None else r.seq for r in rows])


def list_keys(parts: Dict[str, Partition], pid: Optional[str]) -> Dict[str, Dict[str, Any]]:
    """``{partition: {key: tag}}`` of one partition (nothing when unknown) or all, keys in
    insertion order."""
    out: Dict[str, Dict[str, Any]] = {}
    for q in (sorted(parts) if pid is None else [pid]):
        p = parts.get(q)
        if p is not None:
            out[q] = {r.key: r.tag if r.tag is None else copy_value(r.tag) for r in p.rows.values()
                      if r.key is not None}
    return out


def production_status(p: Partition, fields: Sequence[str]) -> Tuple[np.ndarray, np.ndarray]:
    """``(sorted gidxs, int8 matrix rows x fields: 1 produced)``."""
    gidxs = sorted(p.rows)
    status = np.zeros((len(gidxs), len(fields)), dtype=np.int8)
    rows = p.rows
    for i, g in enumerate(gidxs):
        have = rows[g].fields
        for j, f in enumerate(fields):
            if f in have:
                status[i, j] = 1
    return np.array(gidxs, dtype=np.int64), status


def consumption_status(p: Partition, done) -> Tuple[np.ndarray, np.ndarray]:
    """``(sorted gidxs, int8 flags: 1 in done)``."""
    gidxs = sorted(p.rows)
    return np.array(gidxs, dtype=np.int64), np.array([g in done for g in gidxs], dtype=np.int8)


def check_mirror(parts: Dict[str, Partition], rows: Dict[int, Row], consumed) -> None:
    """Assert the incremental structures agree with the rows and consumption (tests)."""
    for pid, p in parts.items():
        seqs = [r.seq for r in p.rows.values()]
        assert seqs == sorted(seqs), f"rows of {pid!r} are not in seq order"
        assert len(set(seqs)) == len(seqs), f"duplicate seq in {pid!r}"
        assert all(rows.get(g) is r for g, r in p.rows.items()), f"rows of {pid!r} differ from the index"
        assert {k: g for k, g in p.keys.items()} == {r.key: g for g, r in p.rows.items()
                                                      if r.key is not None}, f"keys of {pid!r}"
        for task, views in p.ready.items():
            done = consumed.get((pid, task), set())
            for need, v in views.items():
                want = [g for g, r in p.rows.items() if g not in done and need <= r.fields]
                assert v.ordered() == want, (pid, task, sorted(need), v.ordered(), want)
    assert sum(len(p.rows) for p in parts.values()) == len(rows)


__all__ = ["Row", "Partition", "PutPlan", "copy_value", "row_info", "partition_info", "row_batch", "list_keys",
           "production_status", "consumption_status", "check_mirror"]
