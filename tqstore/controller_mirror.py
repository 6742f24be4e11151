"""The controller's in-memory mirror, columnar: rows, partitions, ready views, and the values
made from them.

Only :class:`~tqstore.controller.Controller` (and its sampler host) touches these objects;
everything the data plane sees crosses :class:`~tqstore.ports.ControllerPort` as values
(:class:`~tqstore.ports.RowInfo`, :class:`~tqstore.ports.PartitionInfo`,
:class:`~tqstore.ports.RowBatch`), made here by :func:`row_info` / :func:`row_batch`.

Layout (a few machine words per row, no Python object per row but its key string):

* :class:`GidxMap` — for every global index, the number of the partition whose row it is
  (``-1``: none) and the row's *slot* in that partition (numpy arrays indexed by gidx);
* :class:`Partition` — per slot, in insertion (``seq``) order: ``s_gidx`` (``-1``: a
  cleared row, compacted away once they are many), ``s_seq``, ``s_fs`` (the id of the
  row's produced field set, interned per partition: rows share a handful of sets) and
  ``s_key`` (a list of str / None); ``keys`` maps key -> gidx (built on first use after an
  open: a store that is only streamed never pays for it); ``tags`` holds only the rows
  that have a tag (gidx -> tag).  Each field of the schema has a bit (``bits``), the
  bit of the row value's bitmap on disk (docs/FORMAT.md, "Controller index").
* ``Partition.ready[task][need]`` — for each ``(task, requested field set)`` a fetch has
  asked about — the rows whose ``need`` fields are produced and that ``task`` has not
  consumed, so that a fetch costs O(ready).  Built on first use, updated by
  ``commit_put``, ``mark_consumed``, ``clear_rows``, dropped by ``reset_consumption`` /
  ``drop_fields``.

:class:`Row` objects are made on demand (``Partition.row``, the read-only mappings
``Partition.rows`` and ``Controller.rows``) for callers that want one row as an object.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from itertools import islice
from operator import itemgetter
from typing import AbstractSet, Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ._format.columns import take_rows
from ._format.controller_records import SEQ_ALIGN
from ._io.heap import trim_heap
from .ports import PartitionInfo, RowBatch, RowInfo
from .samplers import SeqsInOrder

_MAX_VIEWS_PER_TASK = 8
_I64 = np.int64


@dataclass
class Row:
    """One row's metadata (a copy made from the mirror). ``fields`` are the produced fields."""

    gidx: int
    pid: str
    key: Optional[str]
    tag: Any
    fields: AbstractSet[str]
    seq: int


class _Ready:
    """Rows of one partition ready for one ``(task, need)``: ``rows`` (gidx -> seq, in seq
    order) and ``late`` (gidx -> seq, unordered: rows that became ready after a newer one,
    as insert-mode reservations filled out of order do).  The oldest ``limit`` rows are a
    merge of ``rows``' front with the sorted late rows, O(limit + late log late): a fetch
    never sorts the whole backlog for a few late rows.  The late rows are folded into
    ``rows`` (one pass over it) once there are many of them, or when every row is asked for."""

    __slots__ = ("rows", "late", "last", "_gone")

    def __init__(self, rows: Dict[int, int]) -> None:
        self.rows = rows
        self.late: Dict[int, int] = {}
        self.last = max(rows.values(), default=-1)
        self._gone = 0  # rows removed from ``rows`` since it was last built

    def __len__(self) -> int:
        return len(self.rows) + len(self.late)

    def remove(self, gidxs: Sequence[int]) -> None:
        """Take ``gidxs`` out (consumed or cleared; absent ones ignored).  A dict keeps the
        slots of removed entries until it is rebuilt, and the oldest rows are the ones
        removed, so :meth:`ordered` would walk them all on every fetch: the dict is rebuilt
        once more rows were removed than it holds."""
        rows, late = self.rows, self.late
        before = len(rows)
        for g in gidxs:
            if rows.pop(g, None) is None and late:
                late.pop(g, None)
        self._gone += before - len(rows)
        if self._gone > max(1024, len(rows)):
            self.rows = dict(rows)
            self._gone = 0

    def add(self, gidx: int, seq: int) -> None:
        """Row ``gidx`` (partition sequence number ``seq``) became ready; kept by its number
        modulo ``SEQ_ALIGN``, as :meth:`Partition.ready_view` keeps every row."""
        if gidx in self.rows or gidx in self.late:
            return
        seq %= SEQ_ALIGN
        if seq < self.last:
            self.late[gidx] = seq
        else:
            self.rows[gidx] = seq
            self.last = seq

    def _fold(self) -> None:
        """Merge the late rows into ``rows`` (timsort of one sorted run and a short one)."""
        merged = list(self.rows.items())
        merged.extend(self.late.items())
        merged.sort(key=itemgetter(1))
        self.rows, self.late, self._gone = dict(merged), {}, 0

    def _front(self, limit: int) -> List[Tuple[int, int]]:
        """(gidx, seq) of the oldest ``limit`` rows, oldest first: O(limit + late rows)."""
        if self.late:
            if len(self.late) > max(256, len(self.rows) >> 4):
                self._fold()
            else:
                late = sorted(self.late.items(), key=itemgetter(1))
                return list(islice(heapq.merge(islice(self.rows.items(), limit), late, key=itemgetter(1)), limit))
        return list(islice(self.rows.items(), limit))

    def ordered(self, limit: Optional[int] = None) -> List[int]:
        """The rows, oldest first (the first ``limit`` of them: O(limit + late rows))."""
        if limit is not None:
            return [g for g, _q in self._front(limit)]
        if self.late:
            self._fold()
        return list(self.rows)

    def front(self, limit: int) -> Tuple[List[int], List[int]]:
        """The oldest ``limit`` rows and their sequence numbers (ascending, marked so:
        :class:`~tqstore.samplers.SeqsInOrder`), oldest first."""
        pairs = self._front(limit)
        return [g for g, _q in pairs], SeqsInOrder(q for _g, q in pairs)

    def seqs(self) -> List[int]:
        """Sequence numbers parallel to :meth:`ordered` without a limit (call it first):
        ascending, and marked so (:class:`~tqstore.samplers.SeqsInOrder`)."""
        return SeqsInOrder(self.rows.values())


def _grow(a: np.ndarray, n: int, fill: int) -> np.ndarray:
    if n <= len(a):
        return a
    b = np.full(max(n, 2 * len(a), 1024), fill, dtype=a.dtype)
    b[:len(a)] = a
    return b


class GidxMap:
    """gidx -> (partition number, slot): ``part[g] == -1`` when ``g`` is no row."""

    __slots__ = ("part", "slot")

    def __init__(self) -> None:
        self.part = np.full(0, -1, dtype=np.int32)
        self.slot = np.zeros(0, dtype=_I64)

    def set(self, gidxs: np.ndarray, num: int, slots: np.ndarray) -> None:
        if len(gidxs):
            top = int(gidxs.max()) + 1
            self.part = _grow(self.part, top, -1)
            self.slot = _grow(self.slot, top, 0)
            self.part[gidxs] = num
            self.slot[gidxs] = slots

    def lookup(self, gidxs: np.ndarray, num: int) -> np.ndarray:
        """Slots of ``gidxs`` in partition ``num`` (-1 where not a row of it)."""
        ok = (gidxs >= 0) & (gidxs < len(self.part))
        out = np.full(len(gidxs), -1, dtype=_I64)
        g = gidxs[ok]
        hit = self.part[g] == num
        sub = np.where(hit, self.slot[g], -1)
        out[ok] = sub
        return out

    def clear(self, gidxs: Sequence[int]) -> None:
        if len(gidxs):
            self.part[np.asarray(gidxs, dtype=_I64)] = -1


class Partition:
    """One partition's rows, columnar (see the module docstring)."""

    def __init__(self, pid: str, num: int, gmap: GidxMap, *, next_seq: int = 0,
                 meta: Optional[Dict[str, Any]] = None) -> None:
        self.pid, self.num, self.gmap = pid, num, gmap
        self.next_seq = next_seq
        self.meta: Dict[str, Any] = {} if meta is None else meta
        self.schema: Dict[str, Tuple[int, int]] = {}  # field -> (kind, dtype)
        self.bits: Dict[str, int] = {}  # field -> its bit in row bitmaps
        self._keys: Optional[Dict[str, int]] = {}  # key -> gidx; None: not built yet (see ``keys``)
        self.tags: Dict[int, Any] = {}
        self.s_gidx = np.zeros(0, dtype=_I64)
        self.s_seq = np.zeros(0, dtype=_I64)
        self.s_fs = np.zeros(0, dtype=np.int32)
        self.s_key: List[Optional[str]] = []
        self.n = 0  # slots used
        self.live = 0
        self.fsets: List[frozenset] = []  # field-set id -> fields
        self.fs_masks: List[int] = []  # field-set id -> bitmap
        self._fs_id: Dict[frozenset, int] = {}
        self._mask_id: Dict[int, int] = {}  # bitmap -> field-set id (a cache of fs_of_mask)
        # task -> frozenset(requested fields) -> rows ready and unconsumed (see the module docstring)
        self.ready: Dict[str, Dict[frozenset, _Ready]] = {}

    # ---------------------------------------------------------------- keys
    @property
    def keys(self) -> Dict[str, int]:
        """key -> gidx of the keyed rows.  A partition decoded on open starts without it
        (``s_key`` holds the keys); it is built from ``s_key`` on first use, O(rows), under
        the controller's lock like every use of the mirror."""
        d = self._keys
        if d is None:
            sl = self.live_slots()
            sk = self.s_key
            ks = sk if len(sl) == self.n else [sk[s] for s in sl.tolist()]
            d = dict(zip(ks, self.s_gidx[sl].tolist()))
            d.pop(None, None)  # (unkeyed rows)
            self._keys = d
            if len(d) > 1 << 16:
                trim_heap()  # (its temporaries: a list of the gidxs)
        return d

    @keys.setter
    def keys(self, d: Optional[Dict[str, int]]) -> None:
        """Install a key index (None: build it from ``s_key`` on first use)."""
        self._keys = d

    def key_count(self) -> int:
        """How many rows are keyed (without building the key index)."""
        if self._keys is not None:
            return len(self._keys)
        return self.n - self.s_key.count(None)

    # ---------------------------------------------------------------- field sets
    def fs_id(self, fs: frozenset) -> int:
        """The id of field set ``fs`` (interned; every field must have a bit)."""
        i = self._fs_id.get(fs)
        if i is None:
            i = len(self.fsets)
            self.fsets.append(fs)
            self.fs_masks.append(sum(1 << self.bits[f] for f in fs))
            self._fs_id[fs] = i
        return i

    def fs_of_mask(self, mask: int) -> Optional[int]:
        """The field-set id of a bitmap; None when it sets a bit no field of the schema has."""
        i = self._mask_id.get(mask)
        if i is not None and self.fs_masks[i] == mask:
            return i
        names = {b: f for f, b in self.bits.items()}
        fs, m, b = [], mask, 0
        while m:
            if m & 1:
                if b not in names:
                    return None
                fs.append(names[b])
            m >>= 1
            b += 1
        i = self.fs_id(frozenset(fs))
        self._mask_id[mask] = i
        return i

    def add_field(self, f: str, kind: int, dtype: int, bit: Optional[int] = None) -> int:
        self.schema[f] = (kind, dtype)
        if bit is None:
            bit = max(self.bits.values(), default=-1) + 1
        self.bits[f] = bit
        return bit

    # ---------------------------------------------------------------- rows
    def append(self, gidxs: np.ndarray, seqs: np.ndarray, fs: np.ndarray, keys: List[Optional[str]]) -> None:
        """Add rows at the end (seqs larger than every existing one, or a load in seq order)."""
        m = len(gidxs)
        end = self.n + m
        self.s_gidx = _grow(self.s_gidx, end, -1)
        self.s_seq = _grow(self.s_seq, end, 0)
        self.s_fs = _grow(self.s_fs, end, 0)
        self.s_gidx[self.n:end] = gidxs
        self.s_seq[self.n:end] = seqs
        self.s_fs[self.n:end] = fs
        self.s_key.extend(keys)
        self.gmap.set(gidxs, self.num, np.arange(self.n, end, dtype=_I64))
        self.n, self.live = end, self.live + m

    def slots(self, gidxs: Sequence[int]) -> np.ndarray:
        """Slots of ``gidxs`` (-1: not a row of this partition)."""
        return self.gmap.lookup(np.asarray(gidxs, dtype=_I64).reshape(-1), self.num)

    def has(self, g: int) -> bool:
        part = self.gmap.part
        return 0 <= g < len(part) and int(part[g]) == self.num

    def live_slots(self, limit: Optional[int] = None) -> np.ndarray:
        """Slots of the live rows in insertion order (the first ``limit`` of them: the scan
        stops once it has them, so a partition's first rows cost the same at any size)."""
        n = self.n
        if limit is None:
            return np.flatnonzero(self.s_gidx[:n] >= 0)
        limit = max(0, min(int(limit), self.live))
        if self.live == n:  # no removed row below n: the first slots
            return np.arange(limit, dtype=np.intp)
        found: List[np.ndarray] = []
        got, lo, step = 0, 0, max(4096, 2 * limit)
        while got < limit and lo < n:
            hi = min(n, lo + step)
            found.append(np.flatnonzero(self.s_gidx[lo:hi] >= 0) + lo)
            got += len(found[-1])
            lo, step = hi, 2 * step
        return np.concatenate(found)[:limit] if found else np.zeros(0, dtype=np.intp)

    def gidxs(self) -> List[int]:
        """Row gidxs in insertion order."""
        return self.s_gidx[self.live_slots()].tolist()

    def row(self, g: int) -> Optional[Row]:
        if not self.has(g):
            return None
        s = int(self.gmap.slot[g])
        return Row(g, self.pid, self.s_key[s], self.tags.get(g), self.fsets[int(self.s_fs[s])], int(self.s_seq[s]))

    def fields_of(self, g: int) -> frozenset:
        return self.fsets[int(self.s_fs[int(self.gmap.slot[g])])]

    def remove(self, gidxs: List[int]) -> None:
        """Drop rows (all must be rows of this partition)."""
        if not gidxs:
            return
        sl = self.slots(gidxs)
        index = self._keys  # (not built yet: nothing to drop from it)
        for s in sl.tolist():
            k = self.s_key[s]
            if k is not None:
                if index is not None:
                    index.pop(k, None)
                self.s_key[s] = None
        for g in gidxs:
            self.tags.pop(g, None)
        self.s_gidx[sl] = -1
        self.gmap.clear(gidxs)
        self.live -= len(gidxs)
        if self.n - self.live > max(1024, self.live):
            self._compact()

    def _compact(self) -> None:
        keep = self.live_slots()
        self.s_gidx = self.s_gidx[keep].copy()
        self.s_seq = self.s_seq[keep].copy()
        self.s_fs = self.s_fs[keep].copy()
        self.s_key = [self.s_key[s] for s in keep.tolist()]
        self.n = len(keep)
        self.gmap.set(self.s_gidx, self.num, np.arange(self.n, dtype=_I64))

    @property
    def rows(self) -> "RowsView":
        """A read-only mapping gidx -> :class:`Row` in insertion order (Rows made on demand)."""
        return RowsView([self])

    # ---------------------------------------------------------------- ready views
    def ready_view(self, task: str, need: frozenset, done) -> _Ready:
        """The ready view of ``(task, need)`` (``done``: the rows ``task`` consumed), built
        on first use (O(rows), vectorised), most recently used last, at most 8 per task.

        Its sequence numbers (a sampler's ``ready_seqs``) are the partition's modulo
        ``SEQ_ALIGN``: counted from 0 at the partition's first row (a multiple of it), and
        unchanged by the raises a reopen or a checkpoint load makes (multiples of it), so a
        GRPO group of any size holds the rows of one prompt."""
        views = self.ready.setdefault(task, {})
        v = views.pop(need, None)
        if v is None:
            good = [i for i, fs in enumerate(self.fsets) if need <= fs]
            sl = self.live_slots()
            sl = sl[np.isin(self.s_fs[sl], good)]
            gs, qs = self.s_gidx[sl].tolist(), (self.s_seq[sl] % SEQ_ALIGN).tolist()
            v = _Ready({g: q for g, q in zip(gs, qs) if g not in done} if done else dict(zip(gs, qs)))
            while len(views) >= _MAX_VIEWS_PER_TASK:
                del views[next(iter(views))]  # least recently used
        views[need] = v  # most recently used last
        return v


class RowsView(Mapping):
    """Read-only mapping gidx -> :class:`Row` over partitions (insertion order in each)."""

    def __init__(self, parts: List[Partition]) -> None:
        self._parts = parts

    def _find(self, g: Any) -> Optional[Partition]:
        if not isinstance(g, (int, np.integer)):
            return None
        for p in self._parts:
            if p.has(int(g)):
                return p
        return None

    def __getitem__(self, g: int) -> Row:
        p = self._find(g)
        if p is None:
            raise KeyError(g)
        return p.row(int(g))

    def __contains__(self, g: object) -> bool:
        return self._find(g) is not None

    def __iter__(self) -> Iterator[int]:
        for p in self._parts:
            yield from p.gidxs()

    def __len__(self) -> int:
        return sum(p.live for p in self._parts)


@dataclass
class PutPlan:
    """A validated put, with global indexes reserved in memory but nothing committed.

    ``gidxs[i]`` is the row of batch position i; the new rows are ``new_gidxs`` (with
    ``new_keys``, seqs from ``seq0`` on), all of them at the end of ``gidxs``'s new rows."""

    pid: str
    gidxs: List[int]
    new_gidxs: List[int]
    new_keys: List[Optional[str]]
    seq0: int
    tags: Optional[List[Any]]
    fields: List[str]
    schema_new: Dict[str, Tuple[int, int]]
    overwrites: bool  # some (gidx, field) already produced
    new_partition: bool
    from_free: int = 0  # how many new gidxs were taken from the free list (its smallest)

    @property
    def new_rows(self) -> List[Row]:
        return [Row(g, self.pid, k, None, frozenset(), self.seq0 + i)
                for i, (g, k) in enumerate(zip(self.new_gidxs, self.new_keys))]


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
    return RowInfo(r.gidx, r.key, copy_value(r.tag), frozenset(r.fields), r.seq)


def partition_info(p: Partition) -> PartitionInfo:
    return PartitionInfo(p.pid, dict(p.schema), p.live)


def rows_of_slots(p: Partition, sl: np.ndarray, gidxs: Optional[np.ndarray] = None) -> RowBatch:
    """The answer for the rows at slots ``sl`` of ``p`` (every one a live slot; ``gidxs``
    their gidxs when known), one list per column."""
    n = len(sl)
    sll = sl.tolist()
    fsets, sk, tags = p.fsets, p.s_key, p.tags
    gl = (p.s_gidx[sl] if gidxs is None else gidxs).tolist()
    ids = p.s_fs[sl].tolist()
    fs_col = [fsets[ids[0]]] * n if n and ids.count(ids[0]) == n else [fsets[i] for i in ids]
    return RowBatch(p.pid, dict(p.schema), gl, take_rows(sk, sll) if p.keys else [None] * n,
                    [copy_value(tags[g]) if g in tags else None for g in gl] if tags else [None] * n,
                    fs_col, p.s_seq[sl].tolist())


def row_batch(p: Partition, gidxs: Sequence[Optional[int]]) -> RowBatch:
    """The answer for ``gidxs`` of ``p`` (None, or a gidx that is not a row of ``p``: a
    missing row, ``seqs[i] is None``).  Row fields are the interned frozensets."""
    n = len(gidxs)
    try:
        arr = np.fromiter(gidxs, dtype=_I64, count=n)
    except TypeError:  # a None among them
        arr = np.fromiter((-1 if g is None else g for g in gidxs), dtype=_I64, count=n)
    sl = p.slots(arr)
    tags = p.tags
    if n and int(sl.min()) >= 0:  # every one is a row: one list per column
        return rows_of_slots(p, sl, arr)
    ok = sl >= 0
    sll = sl.tolist()
    some = n and bool(ok.any())  # (a partition reopened without rows has empty columns)
    fs = p.s_fs[np.where(ok, sl, 0)].tolist() if some else [0] * n
    seqs = p.s_seq[np.where(ok, sl, 0)].tolist() if some else [0] * n
    return RowBatch(p.pid, dict(p.schema), list(gidxs),
                    [p.s_key[s] if s >= 0 else None for s in sll],
                    [copy_value(tags.get(g)) if s >= 0 else None for g, s in zip(gidxs, sll)],
                    [p.fsets[f] if s >= 0 else None for f, s in zip(fs, sll)],
                    [q if s >= 0 else None for q, s in zip(seqs, sll)])


def partition_order(parts: Dict[str, Partition]) -> List[str]:
    """The partition ids, oldest first: by partition number, which a new partition takes one
    past the largest in use (docs/FORMAT.md, ``parts``), so this is their creation order
    (TransferQueue's order), also after a reopen."""
    return sorted(parts, key=lambda q: parts[q].num)


def list_keys(parts: Dict[str, Partition], pid: Optional[str]) -> Dict[str, Dict[str, Any]]:
    """``{partition: {key: tag}}`` of one partition (nothing when unknown) or all (oldest
    partition first), keys in insertion order."""
    out: Dict[str, Dict[str, Any]] = {}
    for q in (partition_order(parts) if pid is None else [pid]):
        p = parts.get(q)
        if p is None:
            continue
        sl = p.live_slots()
        sk = p.s_key
        keys = [sk[s] for s in sl.tolist()] if len(sl) != p.n else sk
        if not p.tags:
            d = dict.fromkeys(keys)
            d.pop(None, None)
        else:
            tags = p.tags
            d = {k: copy_value(tags.get(g)) for k, g in zip(keys, p.s_gidx[sl].tolist()) if k is not None}
        out[q] = d
    return out


def key_list(p: Optional[Partition]) -> Optional[Tuple[List[Optional[str]], Dict[str, Any]]]:
    """``(keys, tags)`` of ``p`` (None: no partition): the key column copied whole, in insertion
    order (None for unkeyed and removed rows), and copies of the keyed rows' tags by key."""
    if p is None:
        return None
    sk, slot = p.s_key, p.gmap.slot
    tags = {sk[int(slot[g])]: copy_value(t) for g, t in p.tags.items()}
    tags.pop(None, None)
    return list(sk), tags


def production_status(p: Partition, fields: Sequence[str]) -> Tuple[np.ndarray, np.ndarray]:
    """``(sorted gidxs, int8 matrix rows x fields: 1 produced)``."""
    sl = p.live_slots()
    g = p.s_gidx[sl]
    order = np.argsort(g, kind="stable")
    table = np.array([[1 if f in fs else 0 for f in fields] for fs in p.fsets], dtype=np.int8).reshape(
        len(p.fsets), len(fields))
    status = table[p.s_fs[sl][order]] if len(sl) else np.zeros((0, len(fields)), dtype=np.int8)
    return g[order].astype(np.int64), status


def consumption_status(p: Partition, done) -> Tuple[np.ndarray, np.ndarray]:
    """``(sorted gidxs, int8 flags: 1 in done)``: array work only (a million rows in some ms;
    ``done`` may name gidxs that are no rows of ``p``)."""
    sl = p.live_slots()
    g = p.s_gidx[sl]
    flags = np.zeros(len(sl), dtype=np.int8)
    if done and len(sl):
        s = p.slots(np.fromiter(done, dtype=_I64, count=len(done)))
        by_slot = np.zeros(p.n, dtype=np.int8)
        by_slot[s[s >= 0]] = 1
        flags = by_slot[sl]
    if len(g) > 1 and not bool((g[1:] > g[:-1]).all()):  # (in order unless freed indexes were reused)
        order = np.argsort(g, kind="stable")
        g, flags = g[order], flags[order]
    return g.astype(np.int64), flags


def check_mirror(parts: Dict[str, Partition], gmap: GidxMap, consumed) -> None:
    """Assert the incremental structures agree with the rows and consumption (tests)."""
    total = 0
    for pid, p in parts.items():
        sl = p.live_slots()
        seqs = p.s_seq[sl].tolist()
        assert seqs == sorted(seqs), f"rows of {pid!r} are not in seq order"
        assert len(set(seqs)) == len(seqs), f"duplicate seq in {pid!r}"
        gs = p.s_gidx[sl]
        assert (gmap.part[gs] == p.num).all() and (gmap.slot[gs] == sl).all(), f"gidx map of {pid!r}"
        assert len(sl) == p.live
        assert p.keys == {p.s_key[s]: int(p.s_gidx[s]) for s in sl.tolist() if p.s_key[s] is not None}, \
            f"keys of {pid!r}"
        for task, views in p.ready.items():
            done = consumed.get((pid, task), set())
            for need, v in views.items():
                want = [g for g in gs.tolist() if g not in done and need <= p.fields_of(g)]
                assert v.ordered() == want, (pid, task, sorted(need), v.ordered(), want)
        total += p.live
    assert int((gmap.part >= 0).sum()) == total


__all__ = ["Row", "GidxMap", "Partition", "RowsView", "PutPlan", "copy_value", "row_info", "partition_info",
           "row_batch", "rows_of_slots", "partition_order", "list_keys", "key_list", "production_status", "consumption_status", "check_mirror"]
