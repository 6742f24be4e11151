"""Plans of checkpoint saves and loads, as plain data: what goes where, no I/O.

* :func:`plan_segment_writes` decides, per segment of a snapshot, whether the checkpoint
  gets a hard link to the store's file, a hard link to an identical file of an earlier
  generation, or a verified copy.
* :func:`plan_reshard` routes every frame of an ``N``-unit checkpoint to target unit
  ``gidx % M`` and groups each target's frames into byte ranges of the source segments
  (adjacent frames coalesced, nothing in between read), so that each target reads only
  its own rows' bytes.

Both are pure functions of their arguments and are tested without a disk.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from operator import itemgetter
from typing import Dict, Iterable, List, Mapping, NamedTuple, Optional, Sequence, Tuple

from ..errors import CorruptionError

LINK = "link"  # hard link to the store's sealed segment
REUSE = "reuse"  # hard link to the identical file of an earlier generation
COPY = "copy"  # copy_file_range + frame verification

DEFAULT_RANGE_BYTES = 8 << 20


@dataclass(frozen=True)
class SegmentSource:
    """Facts about one segment of a snapshot (gathered by the writer)."""

    unit: int
    seg: int
    path: str  # the store's segment file
    size: int  # bytes the snapshot's index records
    sealed: bool
    file_size: int  # bytes on disk now (a torn tail past ``size`` may exist)
    identity: str
    frames: int
    live_bytes: int


@dataclass(frozen=True)
class Reusable:
    """An identical file already in an earlier generation."""

    path: str
    size: int
    crc32c: int


@dataclass(frozen=True)
class SegmentWrite:
    """How one segment lands in the checkpoint."""

    source: SegmentSource
    method: str  # LINK | REUSE | COPY
    link_from: str  # file to hard link (LINK, REUSE) or copy from (COPY)
    crc32c: Optional[int]  # known already (REUSE, or cached), else computed while writing


def plan_segment_writes(sources: Sequence[SegmentSource], *, link: bool,
                        reuse: Mapping[str, Reusable] = {},  # noqa: B006 - read only
                        known_crc: Mapping[str, int] = {}) -> List[SegmentWrite]:  # noqa: B006
    """Choose the method of every segment.

    ``link``: the checkpoint may hard-link the store's files (same file system, not forced
    to copy).  A sealed segment whose file is exactly as long as the index says is linked;
    anything else (still open for appends, or with a torn tail) is copied, ``size`` bytes.
    ``reuse`` maps an identity to an identical file of an earlier generation: linked instead,
    whatever ``link`` says (the generations share a file system).
    """
    out: List[SegmentWrite] = []
    for s in sources:
        r = reuse.get(s.identity)
        if r is not None and r.size == s.size and s.sealed:
            out.append(SegmentWrite(s, REUSE, r.path, r.crc32c))
        elif link and s.sealed and s.file_size == s.size:
            out.append(SegmentWrite(s, LINK, s.path, known_crc.get(s.identity)))
        else:
            out.append(SegmentWrite(s, COPY, s.path, None))
    return out


class FrameRef(NamedTuple):
    """One entry of a source unit's index: the frame of (gidx, field) in segment ``seg``.

    Plain ``(key, gidx, seg, offset, length, crc)`` tuples are accepted wherever a FrameRef
    is (the loader builds plain tuples: a NamedTuple per frame costs more than the plan)."""

    key: bytes  # unit index key: gidx (u64 big-endian) + field UTF-8
    gidx: int
    seg: int
    offset: int
    length: int
    crc: int


class RangeFrame(NamedTuple):
    """Layout of the plain ``(key, rel_offset, length, crc)`` tuples of :attr:`ReadRange.frames`."""

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


@dataclass(frozen=True)
class TargetPlan:
    unit: int
    ranges: Tuple[ReadRange, ...]

    @property
    def nbytes(self) -> int:
        return sum(r.length for r in self.ranges)

    @property
    def nframes(self) -> int:
        return sum(len(r.frames) for r in self.ranges)


@dataclass(frozen=True)
class ReshardPlan:
    num_sources: int
    num_targets: int
    targets: Tuple[TargetPlan, ...]

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.targets)


def plan_reshard(sources: Mapping[int, Iterable[Sequence]], num_targets: int, *,
                 max_range_bytes: int = DEFAULT_RANGE_BYTES) -> ReshardPlan:
    """Route every frame (a :class:`FrameRef` or plain tuple of its fields) to unit
    ``gidx % num_targets`` and coalesce each target's frames into ranges of adjacent bytes
    (at most ``max_range_bytes``, or one frame if larger).

    Ranges of a target are ordered by (source unit, segment, offset): sequential reads.

    Raises:
        CorruptionError: two index entries claim overlapping bytes of one segment.
    """
    if num_targets < 1:
        raise ValueError(f"num_targets must be >= 1, got {num_targets}")
    per_target: List[Dict[Tuple[int, int], list]] = [defaultdict(list) for _ in range(num_targets)]
    for src, refs in sources.items():
        for r in refs:  # r = (key, gidx, seg, offset, length, crc)
            per_target[r[1] % num_targets][(src, r[2])].append(r)
    by_offset = itemgetter(3)
    targets = []
    for t, groups in enumerate(per_target):
        ranges: List[ReadRange] = []
        for (src, seg) in sorted(groups):
            refs = groups[(src, seg)]
            refs.sort(key=by_offset)
            start = end = -1
            cur: list = []
            for key, _g, _s, off, ln, crc in refs:
                if off < end:
                    raise CorruptionError(f"index entries of unit {src} overlap in segment {seg}", offset=off)
                if cur and off == end and end - start + ln <= max_range_bytes:
                    cur.append((key, off - start, ln, crc))
                    end += ln
                    continue
                if cur:
                    ranges.append(ReadRange(src, seg, start, end - start, tuple(cur)))
                start, end = off, off + ln
                cur = [(key, 0, ln, crc)]
            if cur:
                ranges.append(ReadRange(src, seg, start, end - start, tuple(cur)))
        targets.append(TargetPlan(t, tuple(ranges)))
    return ReshardPlan(len(sources), num_targets, tuple(targets))


def plan_load_mode(num_sources: int, num_targets: int, include_storage: bool) -> str:
    """``"metadata"`` (no storage saved), ``"same"`` (link or copy whole files) or ``"reshard"``."""
    if not include_storage:
        return "metadata"
    return "same" if num_sources == num_targets else "reshard"
