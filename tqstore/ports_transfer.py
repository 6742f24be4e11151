"""The values a checkpoint's export and import, and a dump's shards, carry across the ports
(:mod:`tqstore.ports`, which re-exports them): what a unit exports (:class:`UnitExport`,
with its segments' :class:`SegmentSource` and the :class:`SegmentWrite` plan of how each is
written: linked, reused from an earlier generation, or copied), what the controller exports
(:class:`ControllerExport`), what a unit imports (:class:`UnitImport`) and a dump's
:class:`ShardInfo`.  Plain dataclasses and strings: they cross a process boundary as they are.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple


LINK = "link"  # hard link to the store's sealed segment
REUSE = "reuse"  # hard link to the identical file of an earlier generation
COPY = "copy"  # copy_file_range + frame verification


@dataclass(frozen=True)
class Reusable:
    """An identical file already in an earlier generation (an argument of ``export_snapshot``)."""

    path: str
    size: int
    crc32c: int


@dataclass(frozen=True)
class SegmentSource:
    """Facts about one segment of a snapshot (gathered by its unit when it exports)."""

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
class SegmentWrite:
    """How one segment lands in the checkpoint."""

    source: SegmentSource
    method: str  # LINK | REUSE | COPY
    link_from: str  # file to hard link (LINK, REUSE) or copy from (COPY)
    crc32c: Optional[int]  # known already (REUSE, or cached), else computed while writing


def plan_segment_writes(sources: Sequence[SegmentSource], *, link: bool,
                        reuse: Mapping[str, Reusable] = {},  # noqa: B006 - read only
                        known_crc: Mapping[str, int] = {}) -> List[SegmentWrite]:  # noqa: B006
    """Choose the method of every segment (pure: the rule every exporting unit follows).

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


@dataclass
class UnitExport:
    """What a unit wrote when it exported a snapshot into a checkpoint or dump directory.

    ``files`` are manifest entries in the manifest's JSON shape (``path`` relative to the
    ``dest_dir`` of the export, ``role`` "unit_index" or "segment", ``size``, ``crc32c``,
    ``unit``, and per segment ``seg``, ``frames``, ``live_bytes``, ``origin``; per index
    file ``block_crc32c``); byte counts say how each segment was placed.
    """

    files: List[Dict[str, Any]]
    frames: int = 0
    live_bytes: int = 0
    copied_bytes: int = 0
    linked_bytes: int = 0
    reused_bytes: int = 0
    checksummed_bytes: int = 0


@dataclass
class ControllerExport:
    """What the controller wrote when it exported a snapshot (``files`` as in
    :class:`UnitExport`, role "controller"), and a summary of the cut: ``rows``,
    ``partitions``, ``next_gidx``, ``put_token`` (the last committed overwriting put)."""

    files: List[Dict[str, Any]]
    summary: Dict[str, Any] = field(default_factory=dict)


@dataclass
class UnitImport:
    """What one unit stages from a checkpoint into a new state directory (planned by the loader).

    ``mode`` "same" (as many units as the checkpoint: the unit's index copy ``index_dir`` and
    its ``segments`` ``(seg, path, size, crc32c)`` are copied or, with ``link``, hard-linked;
    ``frames[seg]`` are the ``(offset, length, crc)`` its index names (tuples, or the rows of
    an ``(n, 3)`` uint64 numpy array, sorted by offset), checked by
    :meth:`UnitPort.verify_import`) or "reshard" (``target``, a planner ``TargetPlan``: the
    frames routed to this unit, read as byte ranges of the source segments ``seg_paths[(source
    unit, seg)]``, CRC-checked, appended to new segments and indexed).  Paths are relative to
    ``src_dir``, the checkpoint directory, which the unit can reach.
    """

    mode: str
    src_dir: str
    index_dir: Optional[str] = None
    segments: List[Tuple[int, str, int, int]] = field(default_factory=list)
    frames: Dict[int, Any] = field(default_factory=dict)  # seg -> (offset, length, crc) rows
    link: bool = False
    target: Any = None
    seg_paths: Dict[Tuple[int, int], str] = field(default_factory=dict)


@dataclass(frozen=True)
class ShardInfo:
    """What a unit wrote when it exported rows into a dump shard (:meth:`UnitPort.export_rows`):
    the file (``path`` as given), its exact ``size`` and whole-file ``crc32c``, its ``frames``,
    the ``rows`` with at least one frame, and ``payload_bytes`` (bytes of the frames);
    ``dtypes``: each field's dtype codes among its frames (a field the partition's schema calls
    "mixed" whose dumped frames hold one dtype is written with that one)."""

    unit: int
    path: str
    size: int
    crc32c: int
    frames: int
    rows: int
    payload_bytes: int
    dtypes: Dict[str, Tuple[int, ...]] = field(default_factory=dict)
