"""Plans of checkpoint saves and loads, as plain data: what goes where, no I/O.

* :func:`plan_segment_writes` (defined with its values in :mod:`tqstore.ports`: each
  exporting unit applies it) decides, per segment of a snapshot, whether the checkpoint
  gets a hard link to the store's file, a hard link to an identical file of an earlier
  generation, or a verified copy.
* :func:`plan_reshard` routes every frame of an ``N``-unit checkpoint to target unit
  ``gidx % M`` and groups each target's frames into byte ranges of the source segments
  (adjacent frames coalesced, nothing in between read), so that each target reads only
  its own rows' bytes.

Both are pure functions of their arguments and are tested without a disk.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np

from .._format.index import LOC_DTYPE, check_index_keys
from .._format.lmdb_pages import Packed
from ..errors import CorruptionError
# the save's plan of every segment is made by the exporting unit, with the rule and values of the port
from ..ports import COPY, LINK, REUSE, Reusable, SegmentSource, SegmentWrite, plan_segment_writes  # noqa: F401

DEFAULT_RANGE_BYTES = 8 << 20


class FrameRef(NamedTuple):
    """One entry of a source unit's index: the frame of (gidx, field) in segment ``seg``."""

    key: bytes  # unit index key: gidx (u64 big-endian) + field UTF-8
    gidx: int
    seg: int
    offset: int
    length: int
    crc: int


class FrameTable:
    """The entries of one source unit's index as parallel arrays (a store holds millions of
    frames: no Python object per frame but the key)."""

    def __init__(self, keys: Optional[Sequence[bytes]], gidx, seg, offset, length, crc, *,
                 packed_keys: Optional[Tuple[np.ndarray, Any]] = None) -> None:
        # keys as a list, or packed (``packed_keys``: each key's start in ``joined``, and
        # ``joined``): a list of a million keys is made only when asked for (a reshard)
        self._keys = list(keys) if keys is not None else None
        self._packed = packed_keys
        self.gidx = np.asarray(gidx, np.uint64)
        self.seg = np.asarray(seg, np.int64)
        self.offset = np.asarray(offset, np.int64)
        self.length = np.asarray(length, np.int64)
        self.crc = np.asarray(crc, np.uint32)
        n = len(self.gidx)
        if (self._keys is None) == (packed_keys is None) or \
                (len(self._keys) if self._keys is not None else len(packed_keys[0]) - 1) != n or \
                not all(len(a) == n for a in (self.seg, self.offset, self.length, self.crc)):
            raise ValueError("FrameTable columns differ in length")

    @property
    def keys(self) -> List[bytes]:
        """Each entry's unit index key (gidx u64 big-endian + field UTF-8)."""
        if self._keys is None:
            assert self._packed is not None
            starts, joined = self._packed
            b = bytes(joined)
            se = starts.tolist()
            self._keys = [b[x:y] for x, y in zip(se[:-1], se[1:])]
            self._packed = None
        return self._keys

    def take(self, idx: np.ndarray) -> "FrameTable":
        """The entries at positions ``idx`` (ascending)."""
        return FrameTable([self.keys[i] for i in idx.tolist()], self.gidx[idx], self.seg[idx], self.offset[idx],
                          self.length[idx], self.crc[idx])

    @classmethod
    def from_refs(cls, refs: Iterable[Sequence]) -> "FrameTable":
        """From :class:`FrameRef` (or plain ``(key, gidx, seg, offset, length, crc)``) tuples."""
        rows = list(refs)
        cols = list(zip(*rows)) if rows else [[]] * 6
        return cls(cols[0], cols[1], cols[2], cols[3], cols[4], cols[5])

    @classmethod
    def from_index(cls, keys: Any, values: Any) -> "FrameTable":
        """From unit index keys (a list of bytes, or a
        :class:`~tqstore._format.lmdb_pages.Packed`) and their concatenated ``<IQII`` values.
        Raises ValueError (RecordError) for a key that is not a gidx and a UTF-8 field name."""
        if isinstance(keys, Packed):
            return cls.from_columns(keys.lens, keys.buf, values)
        check_index_keys(keys)
        v = np.frombuffer(values, LOC_DTYPE)
        gidx = np.frombuffer(b"".join(k[:8] for k in keys), ">u8") if keys else np.zeros(0, np.uint64)
        return cls(keys, gidx, v["seg"], v["offset"], v["length"], v["crc"])

    @classmethod
    def from_columns(cls, lens: Any, joined: Any, values: Any) -> "FrameTable":
        """From the columns of a unit index's entries: each key's length (int64), the keys
        back to back, their ``<IQII`` values back to back.  No Python object per entry.

        Raises:
            ValueError: the columns do not add up, or a key is shorter than 9 bytes.
        """
        ln = np.asarray(lens, np.int64)
        n = len(ln)
        starts = np.zeros(n + 1, np.int64)
        np.cumsum(ln, out=starts[1:])
        if int(starts[-1]) != len(joined) or len(values) != n * LOC_DTYPE.itemsize:
            raise ValueError("unit index columns do not add up")
        if n and int(ln.min()) < 9:
            raise ValueError("a unit index key is shorter than a global index and a field name")
        check_index_keys(Packed(joined, ln))  # (field names: UTF-8)
        kb, first = np.frombuffer(joined, np.uint8), starts[:-1]
        gidx = np.zeros(n, np.uint64)
        for j in range(8):  # each key's first 8 bytes, big-endian: one gather per byte
            gidx <<= np.uint64(8)
            gidx |= kb[first + j]
        v = np.frombuffer(values, LOC_DTYPE)
        return cls(None, gidx, v["seg"], v["offset"], v["length"], v["crc"], packed_keys=(starts, joined))

    def __len__(self) -> int:
        return len(self.gidx)


class RangeFrame(NamedTuple):
    """Layout of the ``(key, rel_offset, length, crc)`` tuples of :attr:`ReadRange.frames`."""

    key: bytes
    rel_offset: int  # from the start of the range
    length: int
    crc: int


@dataclass(frozen=True)
class ReadRange:
    """Contiguous bytes ``[offset, offset + length)`` of a source segment, holding whole frames
    (``frames``: ``(key, rel_offset, length, crc)`` tuples, see :class:`RangeFrame`)."""

    src_unit: int
    seg: int
    offset: int
    length: int
    frames: Tuple[Tuple[bytes, int, int, int], ...]


class KeyList(Sequence):
    """The index keys of one target's frames, picked lazily from the keys of all sources
    (``base[idx[i]]``): planning makes no Python object per frame.  Pickles as a plain list."""

    def __init__(self, base: Sequence[bytes], idx: np.ndarray) -> None:
        self.base = base
        self.idx = np.asarray(idx, np.int64)

    def __len__(self) -> int:
        return len(self.idx)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return self.take(self.idx[i], absolute=True)
        return self.base[int(self.idx[i])]

    def __iter__(self):
        return iter(self.take(self.idx, absolute=True))

    def take(self, positions, *, absolute: bool = False) -> List[bytes]:
        """The keys at ``positions`` (of this list; ``absolute``: of ``base``)."""
        at = np.asarray(positions, np.int64) if absolute else self.idx[np.asarray(positions, np.int64)]
        return list(map(self.base.__getitem__, at.tolist()))

    def __reduce__(self):
        return (list, (list(self),))


@dataclass(frozen=True, eq=False)
class TargetPlan:
    """The frames target unit ``unit`` reads, as arrays sorted by (source unit, segment,
    offset): sequential reads, one source segment after the other.  ``gidx`` and
    ``key_rank`` (when given) let the target check each frame's row and index the frames
    in key order without comparing keys."""

    unit: int
    src_unit: np.ndarray
    seg: np.ndarray
    offset: np.ndarray
    length: np.ndarray
    crc: np.ndarray
    keys: Sequence[bytes]  # a list, or a KeyList
    max_range_bytes: int = DEFAULT_RANGE_BYTES
    gidx: Optional[np.ndarray] = None  # u64: each frame's row (its key's first 8 bytes)
    #: i64 ranks that sort the frames as their keys sort (None: sort the keys themselves)
    key_rank: Optional[np.ndarray] = None

    @property
    def nbytes(self) -> int:
        return int(self.length.sum())

    def groups(self) -> List[Tuple[int, int, int, int]]:
        """``(src_unit, seg, lo, hi)``: the frames ``lo:hi`` come from that source segment."""
        n = len(self.keys)
        if not n:
            return []
        cut = np.flatnonzero((self.src_unit[1:] != self.src_unit[:-1]) | (self.seg[1:] != self.seg[:-1])) + 1
        bounds = [0, *cut.tolist(), n]
        return [(int(self.src_unit[a]), int(self.seg[a]), a, b) for a, b in zip(bounds[:-1], bounds[1:])]

    @property
    def ranges(self) -> Tuple[ReadRange, ...]:
        """The frames coalesced into byte ranges: adjacent frames of one source segment, at
        most ``max_range_bytes`` (or one frame if larger); nothing between frames."""
        out: List[ReadRange] = []
        for src, seg, lo, hi in self.groups():
            offs, lens, crcs = self.offset[lo:hi].tolist(), self.length[lo:hi].tolist(), self.crc[lo:hi].tolist()
            start = end = -1
            cur: list = []
            for key, off, ln, crc in zip(self.keys[lo:hi], offs, lens, crcs):
                if cur and off == end and end - start + ln <= self.max_range_bytes:
                    cur.append((key, off - start, ln, crc))
                    end += ln
                    continue
                if cur:
                    out.append(ReadRange(src, seg, start, end - start, tuple(cur)))
                start, end = off, off + ln
                cur = [(key, 0, ln, crc)]
            if cur:
                out.append(ReadRange(src, seg, start, end - start, tuple(cur)))
        return tuple(out)


@dataclass(frozen=True)
class ReshardPlan:
    num_sources: int
    num_targets: int
    targets: Tuple[TargetPlan, ...]

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.targets)


def plan_reshard(sources: Mapping[int, Union[FrameTable, Iterable[Sequence]]], num_targets: int, *,
                 max_range_bytes: int = DEFAULT_RANGE_BYTES) -> ReshardPlan:
    """Route every frame of every source unit to unit ``gidx % num_targets``; each target gets
    exactly its frames, sorted for sequential reads (see :attr:`TargetPlan.ranges` for the
    byte ranges they form: nothing between frames is read).

    ``sources`` maps a source unit to a :class:`FrameTable` or to FrameRef-like tuples.

    Raises:
        CorruptionError: two index entries claim overlapping bytes of one segment.
    """
    if num_targets < 1:
        raise ValueError(f"num_targets must be >= 1, got {num_targets}")
    tables = {u: (t if isinstance(t, FrameTable) else FrameTable.from_refs(t)) for u, t in sources.items()}
    units = sorted(tables)
    keys: List[bytes] = []
    for u in units:
        keys.extend(tables[u].keys)
    cat = (lambda name, dt: np.concatenate([np.asarray(getattr(tables[u], name), dt) for u in units])
           if tables else np.zeros(0, dt))
    src = np.repeat(np.asarray(units, np.int64), [len(tables[u]) for u in units]) if tables \
        else np.zeros(0, np.int64)
    gidx, seg, off, ln, crc = (cat("gidx", np.uint64), cat("seg", np.int64), cat("offset", np.int64),
                               cat("length", np.int64), cat("crc", np.uint32))
    # overlap check over each whole source segment (entries routed anywhere)
    order = np.lexsort((off, seg, src))
    so, sg, sf, sl = src[order], seg[order], off[order], ln[order]
    bad = np.flatnonzero((so[1:] == so[:-1]) & (sg[1:] == sg[:-1]) & (sf[1:] < sf[:-1] + sl[:-1]))
    if len(bad):
        i = order[bad[0] + 1]
        raise CorruptionError(f"index entries of unit {int(src[i])} overlap in segment {int(seg[i])}",
                              offset=int(off[i]))
    # a row lives on one source unit, whose keys ascend in its table: (gidx, position) sorts
    # the frames of any target as their keys sort
    target = (gidx % np.uint64(num_targets)).astype(np.int64)
    order = order[np.argsort(target[order], kind="stable")]  # by target, then (source, segment, offset)
    bounds = np.searchsorted(target[order], np.arange(num_targets + 1), side="left")
    targets = []
    for t in range(num_targets):
        sel = order[bounds[t]:bounds[t + 1]]
        targets.append(TargetPlan(t, src[sel], seg[sel], off[sel], ln[sel], crc[sel], KeyList(keys, sel),
                                  max_range_bytes, gidx=gidx[sel], key_rank=sel))
    return ReshardPlan(len(tables), num_targets, tuple(targets))


def plan_load_mode(num_sources: int, num_targets: int, include_storage: bool) -> str:
    """``"metadata"`` (no storage saved), ``"same"`` (link or copy whole files) or ``"reshard"``."""
    if not include_storage:
        return "metadata"
    return "same" if num_sources == num_targets else "reshard"
