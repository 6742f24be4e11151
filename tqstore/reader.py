"""The get hot path: read one field of many rows from the units into one output.

Works through :class:`~tqstore.ports.UnitPort` only (values in, values out).  In process
each byte is copied once, from the page cache into the object returned (the units fill
the destinations passed as ``into``); a unit across a process boundary returns the
payloads instead, and they are copied into the same destinations here.  Every frame's
CRC32C is checked unless ``verify=False``.

* Uniform plan (every frame of the field has one length, no compression — the common
  case of a batch of same-shaped rows): the first frame's head is read and taken as
  the template; the output is allocated from it; then each unit fills its rows, frames
  up to ``MMAP_READ_BYTES`` through the segment mmap (one native pass per segment checks
  every frame against the template, its CRC32C included, and copies its payload into the
  output: ``_native.gather_frames``), larger ones with vectored ``preadv``
  straight into the output (no mapping, so no resident file pages are added).  Every
  frame's head is checked against the template; one that differs (same length, other
  shape) sends the field to the general plan.
* General plan (jagged rows, compressed frames, values): small frames are checked in
  bulk through the mmaps (one native call per segment), large raw ones have their heads
  read first and then their payloads read into the output with ``preadv``.

All fields of one read come from one index state per unit: one ``lookup`` per unit names
every field's locations (rows put together are found by one cursor scan of the unit's
index).  The rows are split by unit with numpy, and the data plane hands its read the rows
it already has from its one controller answer (``Store.read_rows``): a get does no per-row
Python loop between the controller's answer and the result (the general plan for jagged
rows and values still works row by row).

The output is allocated once, through the caller's
:class:`~tqstore._format.columns.Allocator` (the torch adapter's gives tensors; the
framework-free default numpy arrays): one batch when rows share a shape, one buffer under a
jagged nested tensor when they differ only in their first dimension, else one allocation per
row.  The reader sees only writable numpy uint8 views of that memory and the allocator's
``finish`` callable.
"""
from __future__ import annotations

import math
from collections import defaultdict
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ._format import dtypes
from ._format.columns import NUMPY, Allocator, jagged_layout, row_to_object
from ._format.frame import head_template
from ._format.index import MMAP_READ_BYTES, Loc
from ._format.layout import CODEC_MASK, KIND_VALUE
from ._io.memory import advise_hugepages
from ._io.workpool import WorkPool
from .errors import CorruptionError, FieldNotFoundError, KeyNotFoundError
from .ports import SnapshotId, UnitPort, fill_or_copy

_ITEMSIZE = dict(dtypes.ITEMSIZE)


SPLIT_SCAN_UNITS = 8  # up to this many units, rows are split by one pass per unit (else by one sort)
PARALLEL_MIN_BYTES = 4 << 20  # below this a read runs on the calling thread: handing work to the pool costs more
REMOTE_CALLS_AT_ONCE = 32  # a read over remote units: at most this many of its calls under way at once


def _each(pool, fn: Callable[[int], Any], units: Sequence[int]) -> None:
    if pool is not None and len(units) > 1:
        list(pool.map(fn, units))
    else:
        for u in units:
            fn(u)


class _Split:
    """Rows of one read split by unit, shared by every field read (numpy arrays: no per-row
    Python).  ``per_unit[u]`` are the positions in the read of unit ``u``'s rows (int64, in
    read order), ``gidxs[u]`` their global indexes (uint64)."""

    def __init__(self, gidxs: Sequence[int], nu: int) -> None:
        ga = (np.fromiter(gidxs, np.int64, len(gidxs)) if type(gidxs) is list  # (a list of ints: faster)
              else np.asarray(gidxs, dtype=np.int64).reshape(-1))
        if ga.size and int(ga.min()) < 0:
            raise KeyNotFoundError(f"global index {int(ga.min())} is negative")
        self.all = ga
        if nu == 1:
            self.per_unit = {0: np.arange(ga.size, dtype=np.int64)} if ga.size else {}
        elif nu <= SPLIT_SCAN_UNITS:  # one pass per unit beats a sort of the rows
            u_of = ga % nu
            self.per_unit = {u: ps for u, ps in ((u, np.flatnonzero(u_of == u)) for u in range(nu)) if ps.size}
        else:
            u_of = ga % nu
            order = np.argsort(u_of, kind="stable")
            counts = np.bincount(u_of, minlength=nu)
            ends = np.cumsum(counts)
            self.per_unit = {u: order[ends[u] - counts[u]:ends[u]] for u in range(nu) if counts[u]}
        self.order = sorted(self.per_unit)
        self.gidxs = {u: ga[ps].astype(np.uint64) for u, ps in self.per_unit.items()}


def read_fields(units: Sequence[UnitPort], pool, gidxs: Sequence[int], fields: Sequence[Tuple[str, int]], *,
                verify: bool = True, snapshots: Optional[Sequence[SnapshotId]] = None,
                alloc: Allocator = NUMPY, remote: bool = False) -> Dict[str, Any]:
    """Read each ``(field, kind)`` of rows ``gidxs`` (row g on unit g % len(units)) as one
    batched value per field, allocated by ``alloc``.

    Each unit's index is read in one lookup (one transaction), so all fields come from one
    state: ``snapshots`` optionally gives each unit's snapshot id; else the latest.

    ``remote``: the units answer from other processes (Ray actors), so a call costs a round
    trip rather than this process's CPU: the units' lookups, and then every field's reads,
    run at once, whatever the read's size, on threads of this read (one per field, and one
    per field and unit for the units' calls; ``pool`` is not used).  The result and the
    errors are the same; with several failures, the first field's (in ``fields`` order) is
    raised, after every call has ended.

    Raises:
        FieldNotFoundError: a row has no stored payload of a field.
        CorruptionError: a frame does not check (names file and offset).
    """
    split = _Split(gidxs, len(units))
    if remote and len(split.order) > 1:
        with WorkPool(max_workers=min(REMOTE_CALLS_AT_ONCE, len(split.order) * max(1, len(fields))),
                                thread_name_prefix="tqstore-call") as calls:
            return _read_fields(units, calls, split, fields, verify, snapshots, alloc, remote)
    return _read_fields(units, pool, split, fields, verify, snapshots, alloc, remote)


def _read_fields(units, pool, split: _Split, fields, verify, snapshots, alloc, remote) -> Dict[str, Any]:
    names = [f for f, _kind in fields]
    found: Dict[int, Dict[str, Optional[np.ndarray]]] = {}

    def lookup(u: int) -> None:
        snap = None if snapshots is None else snapshots[u]
        found[u] = units[u].lookup(split.gidxs[u], names, snapshot=snap)

    if names:
        # in this process index lookups hold the GIL: threads would only add hand-offs
        _each(pool if remote else None, lookup, split.order)
        for u in split.order:
            for f in names:
                if found[u][f] is None:
                    snap = None if snapshots is None else snapshots[u]
                    gs = split.gidxs[u].tolist()
                    locs = units[u].locate(gs, f, snapshot=snap)
                    bad = [g for g, loc in zip(gs, locs) if loc is None]
                    raise FieldNotFoundError(f"field {f!r} has no stored payload for rows {bad[:5]} (store "
                                             f"inconsistent; run verify)")

    def one(field: Tuple[str, int]) -> Any:
        f, kind = field
        return _read_one(units, pool, f, kind, verify, {u: found[u][f] for u in split.order}, split, alloc,
                         remote=remote)

    if remote and len(fields) > 1 and len(split.all):
        # the fields' threads wait on the units' calls: two pools, so no field waits in the pool it waits on
        with WorkPool(max_workers=len(fields), thread_name_prefix="tqstore-field") as fields_pool:
            futures = [fields_pool.submit(one, fk) for fk in fields]
            _wait_all(futures)
            return {f: fut.result() for (f, _), fut in zip(fields, futures)}
    return {f: one((f, kind)) for f, kind in fields}


def _wait_all(futures: Sequence[Any]) -> None:
    """Wait until every future has ended; raise the first error, in ``futures`` order."""
    for fut in futures:
        fut.exception()
    for fut in futures:
        fut.result()


def read_shapes(units: Sequence[UnitPort], gidxs: List[int], fields: Sequence[str]
                ) -> Dict[str, List[Optional[Tuple[int, ...]]]]:
    """Each field's stored row shape for rows ``gidxs`` (None where a row has no payload of it),
    from the frames' heads (structure checked, no payload read)."""
    split = _Split(gidxs, len(units))
    out: Dict[str, List[Optional[Tuple[int, ...]]]] = {f: [None] * len(gidxs) for f in fields}
    for u in split.order:
        gs = split.gidxs[u].tolist()
        got = units[u].lookup(gs, list(fields))
        for f in fields:
            if got[f] is not None:
                locs = [Loc._make(rec) for rec in got[f].tolist()]
            else:
                locs = units[u].locate(gs, f)
            present = [(i, loc) for i, loc in zip(split.per_unit[u].tolist(), locs) if loc is not None]
            for (i, _), h in zip(present, units[u].read_heads([loc for _, loc in present])):
                out[f][i] = tuple(h.shape)
    return out


def _read_one(units, pool, field, kind, verify, arrays: Dict[int, np.ndarray], split: _Split,
              alloc: Allocator, *, remote: bool = False) -> Any:
    n = len(split.all)
    order = split.order
    if n == 0:
        return alloc.empty(kind)
    lengths = np.concatenate([arrays[u]["length"] for u in order]) if len(order) > 1 else arrays[order[0]]["length"]
    if not remote and int(lengths.sum(dtype=np.int64)) < PARALLEL_MIN_BYTES:
        pool = None
    if kind != KIND_VALUE:
        if (lengths == lengths[0]).all():
            out = _read_uniform(units, pool, field, kind, verify, split, arrays, alloc)
            if out is not None:
                return out
    gidxs = split.all.tolist()
    per_unit = {u: ps.tolist() for u, ps in split.per_unit.items()}
    locs: List[Any] = [None] * n
    for u in order:
        for i, rec in zip(per_unit[u], arrays[u].tolist()):
            locs[i] = Loc._make(rec)
    return _read_general(units, pool, gidxs, field, kind, verify, per_unit, order, locs, alloc)


def _check_heads(units, kind: int, field: str, gidxs, locs, heads) -> None:
    """Heads read ahead of their CRC check must be sane before any output is sized from them."""
    seen = set()
    for i, h in enumerate(heads):
        if id(h) in seen:
            continue
        seen.add(id(h))
        size = _ITEMSIZE.get(h.dtype)
        need = None if size is None else size * math.prod(h.shape)
        have = h.raw_len if h.flags & CODEC_MASK else h.payload_len
        if h.kind != kind or need != have or h.field != field or h.gidx != gidxs[i]:
            unit = units[gidxs[i] % len(units)]
            raise CorruptionError(f"row {gidxs[i]} field {field!r}: frame header is inconsistent (kind {h.kind}, "
                                  f"dtype code {h.dtype}, shape {h.shape}, {have} payload bytes)",
                                  path=unit.describe(locs[i]), offset=locs[i].offset)


def _read_uniform(units, pool, field, kind, verify, split: _Split, arrays, alloc):
    """The uniform plan; None when it does not apply (the caller takes the general plan)."""
    n = len(split.all)
    u0 = split.order[0]
    loc0 = Loc._make(arrays[u0][0].tolist())
    h0, raw0 = units[u0].read_head(loc0)
    if h0.flags & CODEC_MASK:
        return None
    _check_heads(units, kind, field, [int(split.gidxs[u0][0])], [loc0], [h0])
    template = head_template(raw0)
    finish, dest = alloc.rows(kind, h0.dtype, n, h0.shape)
    advise_hugepages(dest)
    plen = h0.payload_len
    ok: List[bool] = []

    def fill(u: int):
        ps = split.per_unit[u]
        got = units[u].read_uniform(arrays[u], split.gidxs[u], template, h0.payload_start, plen, into=dest, rows=ps,
                                    verify=verify)
        ok.append(fill_or_copy(got, dest, ps))

    _each(pool, fill, split.order)
    return finish() if all(ok) else None


def _read_general(units, pool, gidxs, field, kind, verify, per_unit, order, locs, alloc) -> Any:
    n = len(gidxs)
    big = [False] * n if kind == KIND_VALUE else [l.length > MMAP_READ_BYTES for l in locs]
    heads: List[Any] = [None] * n
    payloads: List[Any] = [None] * n

    def read_heads(u: int):
        ps = [i for i in per_unit[u] if big[i]]
        for i, h in zip(ps, units[u].read_heads([locs[i] for i in ps])):
            heads[i] = h
            if h.flags & CODEC_MASK:  # compressed: decoded through the mmap path below
                big[i] = False

    if any(big):
        _each(pool, read_heads, order)

    def scan(u: int):
        ps = [i for i in per_unit[u] if not big[i]]
        if ps:
            got = units[u].read_frames([locs[i] for i in ps], [gidxs[i] for i in ps], verify=verify)
            for i, (h, payload) in zip(ps, got):
                heads[i] = h
                payloads[i] = payload

    _each(pool, scan, order)

    if kind == KIND_VALUE:
        return alloc.values([row_to_object(KIND_VALUE, h.dtype, h.shape, p) for h, p in zip(heads, payloads)])
    _check_heads(units, kind, field, gidxs, locs, heads)

    h0 = heads[0]
    if all(h.dtype == h0.dtype and h.shape == h0.shape for h in heads):
        finish, rows = alloc.rows(kind, h0.dtype, n, h0.shape)
        advise_hugepages(rows)
        views = list(rows)
    elif all(h.dtype == h0.dtype for h in heads) and jagged_layout(kind, h0.dtype, [h.shape for h in heads]):
        finish, views = alloc.jagged(kind, h0.dtype, [h.shape for h in heads])
    else:
        finish, views = alloc.each(kind, [h.dtype for h in heads], [h.shape for h in heads])

    def fill(u: int):
        unit = units[u]
        ps_big = []
        for i in per_unit[u]:
            if big[i]:
                ps_big.append(i)
                continue
            dv = memoryview(views[i]).cast("B")
            src = memoryview(payloads[i]).cast("B")
            if src.nbytes != dv.nbytes:
                raise CorruptionError(f"row {gidxs[i]} field {field!r}: payload holds {src.nbytes} bytes, its shape "
                                      f"{heads[i].shape} needs {dv.nbytes}", path=unit.describe(locs[i]),
                                      offset=locs[i].offset)
            dv[:] = src
        if ps_big:
            dests = [views[i] for i in ps_big]
            got = unit.read_into([locs[i] for i in ps_big], [heads[i] for i in ps_big], dests, verify=verify)
            if got is not None:  # a unit across a process boundary returns the payloads
                for i, d, p in zip(ps_big, dests, got):
                    dv = memoryview(d).cast("B")
                    if memoryview(p).nbytes != dv.nbytes:
                        raise CorruptionError(f"row {gidxs[i]} field {field!r}: payload holds "
                                              f"{memoryview(p).nbytes} bytes, its shape {heads[i].shape} needs "
                                              f"{dv.nbytes}", path=unit.describe(locs[i]), offset=locs[i].offset)
                    dv[:] = memoryview(p).cast("B")

    _each(pool, fill, order)
    return finish()
