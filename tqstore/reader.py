"""The get hot path: read one field of many rows from the units into one output.

Each byte is copied once, from the page cache into the object returned, and every
frame's CRC32C is checked unless ``verify=False``.

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

The output is allocated once: a batch tensor (or array) when rows share a shape, one
buffer under a jagged nested tensor when they differ only in their first dimension,
else one allocation per row.
"""
from __future__ import annotations

import math
from collections import defaultdict
from typing import Any, Callable, Dict, List, Sequence, Tuple

import numpy as np

from ._format import dtypes
from ._format.columns import allocate_batch, allocate_jagged, allocate_rows, assemble, jagged_layout, row_to_object
from ._format.frame import head_template
from ._format.layout import CODEC_MASK, INDEX_KEY_HEAD, KIND_VALUE
from ._io.memory import advise_hugepages
from .errors import CorruptionError, FieldNotFoundError
from .unit import MMAP_READ_BYTES, Loc, Unit

_ITEMSIZE = {c: dtypes.itemsize(c) for c in dtypes.DTYPE_NAMES if c in dtypes.CODE_TO_TORCH or c in dtypes.CODE_TO_NUMPY}


PARALLEL_MIN_BYTES = 4 << 20  # below this a read runs on the calling thread: handing work to the pool costs more


def _each(pool, fn: Callable[[int], Any], units: Sequence[int]) -> None:
    if pool is not None and len(units) > 1:
        list(pool.map(fn, units))
    else:
        for u in units:
            fn(u)


class _Split:
    """Rows of one read split by unit, shared by every field read."""

    def __init__(self, gidxs: List[int], nu: int) -> None:
        per_unit: Dict[int, List[int]] = defaultdict(list)
        for pos, g in enumerate(gidxs):
            per_unit[g % nu].append(pos)
        self.per_unit = per_unit
        self.order = sorted(per_unit)
        self.gidxs = {u: [gidxs[i] for i in ps] for u, ps in per_unit.items()}
        self.keys = {u: [INDEX_KEY_HEAD.pack(g) for g in gs] for u, gs in self.gidxs.items()}


def read_fields(units: Sequence[Unit], pool, gidxs: List[int], fields: Sequence[Tuple[str, int]], *,
                verify: bool = True, txns: Sequence[Any] = None) -> Dict[str, Any]:
    """Read each ``(field, kind)`` of rows ``gidxs`` (row g on unit g % len(units)) as one
    batched value per field.

    Each unit's index is read in one transaction, so all fields come from one state:
    ``txns`` optionally gives each unit's read transaction (a snapshot); else the latest.

    Raises:
        FieldNotFoundError: a row has no stored payload of a field.
        CorruptionError: a frame does not check (names file and offset).
    """
    split = _Split(gidxs, len(units))
    own = txns is None
    if own:
        txns = [units[u].env.begin() if u in split.per_unit else None for u in range(len(units))]
    try:
        return {f: _read_one(units, pool, gidxs, f, kind, verify, txns, split) for f, kind in fields}
    finally:
        if own:
            for t in txns:
                if t is not None:
                    t.abort()


def _read_one(units, pool, gidxs, field, kind, verify, txns, split: _Split) -> Any:
    n = len(gidxs)
    per_unit, order = split.per_unit, split.order
    arrays: Dict[int, np.ndarray] = {}
    for u in order:  # index lookups hold the GIL: threads would only add hand-offs
        arr = units[u].lookup_array(split.gidxs[u], field, txn=txns[u], key_heads=split.keys[u])
        if arr is None:
            got = units[u].lookup(split.gidxs[u], field, txn=txns[u])
            bad = [g for g, loc in zip(split.gidxs[u], got) if loc is None]
            raise FieldNotFoundError(f"field {field!r} has no stored payload for rows {bad[:5]} (store "
                                     f"inconsistent; run verify)")
        arrays[u] = arr
    if n == 0:
        return assemble(kind, [])
    lengths = np.concatenate([arrays[u]["length"] for u in order])
    if int(lengths.sum(dtype=np.int64)) < PARALLEL_MIN_BYTES:
        pool = None
    if kind != KIND_VALUE:
        if (lengths == lengths[0]).all():
            out = _read_uniform(units, pool, gidxs, field, kind, verify, per_unit, order, arrays)
            if out is not None:
                return out
    locs: List[Any] = [None] * n
    for u in order:
        for i, rec in zip(per_unit[u], arrays[u].tolist()):
            locs[i] = Loc._make(rec)
    return _read_general(units, pool, gidxs, field, kind, verify, per_unit, order, locs)


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
                                  path=unit._seg_path(locs[i].seg), offset=locs[i].offset)


def _read_uniform(units, pool, gidxs, field, kind, verify, per_unit, order, arrays):
    """The uniform plan; None when it does not apply (the caller takes the general plan)."""
    n = len(gidxs)
    u0 = order[0]
    loc0 = Loc._make(arrays[u0][0].tolist())
    h0, raw0 = units[u0].read_head_raw(loc0)
    if h0.flags & CODEC_MASK:
        return None
    _check_heads(units, kind, field, [gidxs[per_unit[u0][0]]], [loc0], [h0])
    template = head_template(raw0)
    out, rows = allocate_rows(kind, h0.dtype, n, h0.shape)
    advise_hugepages(rows)
    plen = h0.payload_len
    mapped = loc0.length <= MMAP_READ_BYTES
    ok: List[bool] = []

    def fill(u: int):
        ps = per_unit[u]
        gs = [gidxs[i] for i in ps]
        if mapped:
            done = units[u].read_uniform_mapped(arrays[u], np.asarray(gs, dtype=np.uint64), template,
                                                h0.payload_start, plen, rows, np.asarray(ps, dtype=np.int64),
                                                verify=verify)
        else:
            done = units[u].read_uniform_into(arrays[u], np.asarray(gs, dtype=np.uint64), template,
                                              h0.payload_start, plen, rows, np.asarray(ps, dtype=np.int64),
                                              verify=verify)
        ok.append(done)

    _each(pool, fill, order)
    return out if all(ok) else None


def _read_general(units, pool, gidxs, field, kind, verify, per_unit, order, locs) -> Any:
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
            got = units[u].read_small([locs[i] for i in ps], [gidxs[i] for i in ps], verify=verify)
            for i, (h, payload) in zip(ps, got):
                heads[i] = h
                payloads[i] = payload

    _each(pool, scan, order)

    if kind == KIND_VALUE:
        return [row_to_object(KIND_VALUE, h.dtype, h.shape, p) for h, p in zip(heads, payloads)]
    _check_heads(units, kind, field, gidxs, locs, heads)

    h0 = heads[0]
    finish = None
    out = None
    if all(h.dtype == h0.dtype and h.shape == h0.shape for h in heads):
        out, rows = allocate_rows(kind, h0.dtype, n, h0.shape)
        advise_hugepages(rows)
        views = list(rows)
    elif all(h.dtype == h0.dtype for h in heads) and jagged_layout(kind, h0.dtype, [h.shape for h in heads]):
        finish, views = allocate_jagged(h0.dtype, [h.shape for h in heads])
    else:
        outs = [allocate_batch(kind, h.dtype, 1, h.shape) for h in heads]
        views = [o[1][0] for o in outs]

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
                                      f"{heads[i].shape} needs {dv.nbytes}", path=unit._seg_path(locs[i].seg),
                                      offset=locs[i].offset)
            dv[:] = src
        if ps_big:
            unit.read_into([locs[i] for i in ps_big], [heads[i] for i in ps_big], [views[i] for i in ps_big],
                           verify=verify)

    _each(pool, fill, order)
    if out is not None:
        return out
    if finish is not None:
        return finish()
    return assemble(kind, [o[0][0] for o in outs])
