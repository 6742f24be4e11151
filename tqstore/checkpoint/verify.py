"""Finding, reading and verifying checkpoint directories.

:func:`verify_checkpoint` checks a checkpoint without loading it: the manifest (format,
version, its own checksum), every listed file (present, size, CRC32C), no unlisted file,
and (``deep=True``) the indexes themselves: every index entry names bytes the checkpoint
holds and every indexed frame matches its CRC32C.  Nothing is written.
"""
from __future__ import annotations

import logging
import os
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from .. import embedded
from .._format.layout import SEGMENT_HEADER_SIZE
from .._format.segment import decode_segment_header
from .._io import files
from .._io.lmdbwalk import DEFAULT_TIMEOUT_S, LmdbWalk
from ..errors import CheckpointNotFoundError, CorruptionError, FormatVersionError, StorageIOError, TqstoreError
from . import manifest as M
from .planner import FrameTable
from .._io.scan import listed_file_problem, scan_file
from . import target as T
from .target import read_locked

log = logging.getLogger("tqstore")

PathLike = Any
WALK_BYTES_PER_S = 16 << 20  # the walk's time bound grows by a second per this many index bytes


def resolve_checkpoint_dir(path: PathLike) -> Path:
    """The directory holding the checkpoint published at ``path``.

    Normally ``path`` itself.  If a replacement was interrupted between its two renames,
    ``path`` is missing and the previous checkpoint sits at ``<path>.old``: that one is used.

    ``path`` is resolved as a save resolves it (symbolic links first, then ``..``:
    :func:`~tqstore.checkpoint.target.real_path`), so a path names the checkpoint a save to
    it published.

    Raises:
        CheckpointNotFoundError: no checkpoint at ``path`` (missing, or no MANIFEST.json).
        InvalidInputError: ``path`` is not a path.
    """
    p = T.real_path(path)
    if T.is_dump_dir(p):
        raise CheckpointNotFoundError(f"{p} is a dump (dump_data_by_key), not a checkpoint: load it with "
                                      f"load_data_by_key, read it with read_row_index")
    if (p / M.MANIFEST_NAME).is_file():
        return p
    old = p.with_name(p.name + ".old")
    if not os.path.lexists(p) and (old / M.MANIFEST_NAME).is_file():
        log.warning("checkpoint %s is missing but %s holds the one it was replacing (a save was interrupted "
                    "while publishing); using it", p, old)
        return old
    if p.is_dir():
        steps = T.generation_steps(p)
        if steps is not None:
            newest = f" (its newest: {p / T.step_name(steps[-1])})" if steps else ""
            raise CheckpointNotFoundError(
                f"{p} is a checkpoint generation root (CheckpointManager), not a checkpoint: restore it with "
                f"tqstore.CheckpointManager({str(p)!r}, store=...).restore(), or load one of its generations{newest}")
        raise CheckpointNotFoundError(f"{p} holds no {M.MANIFEST_NAME}: not a tqstore checkpoint (or a save that "
                                      f"never completed)")
    if os.path.lexists(p):
        raise CheckpointNotFoundError(f"{p} is not a directory: not a tqstore checkpoint")
    raise CheckpointNotFoundError(f"checkpoint directory {p} does not exist")


def read_manifest(path: PathLike) -> M.Manifest:
    """Parse the manifest of the checkpoint at ``path`` (resolved as :func:`resolve_checkpoint_dir`).

    Raises:
        CheckpointNotFoundError, CorruptionError, FormatVersionError.
    """
    src = resolve_checkpoint_dir(path)
    mp = src / M.MANIFEST_NAME
    try:
        fd = files.open_regular(mp, under=src)
    except FileNotFoundError as e:
        raise CheckpointNotFoundError(f"{mp} does not exist") from e
    except files.NotRegularFile as e:
        raise CorruptionError(f"{M.MANIFEST_NAME} is {e.strerror}", path=str(e.filename or mp)) from e
    except OSError as e:  # (permission denied, an I/O error: unreadable, so not a checkpoint one can load)
        raise CorruptionError(f"{M.MANIFEST_NAME} cannot be read: {e.strerror or e}", path=str(mp)) from e
    try:
        chunks, left = [], M.MAX_MANIFEST_BYTES + 1
        while left > 0:
            b = os.read(fd, min(left, 1 << 20))
            if not b:
                break
            chunks.append(b)
            left -= len(b)
    except OSError as e:
        raise CorruptionError(f"{M.MANIFEST_NAME} cannot be read: {e.strerror or e}", path=str(mp)) from e
    finally:
        os.close(fd)
    return M.parse(b"".join(chunks), path=str(mp))


def file_problem(src: Path, e: M.FileEntry) -> Optional[Problem]:
    """The cheap checks of one listed file, before any byte is read: it exists, it is a
    regular file reached through real directories (no symbolic link, FIFO or device; see
    :func:`tqstore._io.files.open_regular`), and it holds the size MANIFEST.json records."""
    prob = listed_file_problem(src / e.path, e.size, under=src)
    return None if prob is None else Problem(*prob)


_SCHEMA = {M.ROLE_CONTROLLER: "controller", M.ROLE_UNIT_INDEX: "unit_index"}


def lmdb_walk(src: Path, entries: List[M.FileEntry], *, first_only: bool) -> LmdbWalk:
    """Start the structural walk (in a child process, see :mod:`tqstore._io.lmdbwalk`) of
    the controller and unit index files ``entries``, which :func:`file_problem` passed."""
    timeout_s = DEFAULT_TIMEOUT_S + sum(e.size for e in entries) / WALK_BYTES_PER_S  # a slow disk is not damage
    return LmdbWalk([(str((src / e.path).parent), _SCHEMA[e.role]) for e in entries], first_only=first_only,
                    timeout_s=timeout_s)


def walk_problems(walk: LmdbWalk) -> List[Problem]:
    """The walk's findings as problems (waits for it)."""
    return [Problem(w.path, w.message) for w in walk.result()]


def lmdb_problems(src: Path, entries: List[M.FileEntry], *, first_only: bool) -> List[Problem]:
    """Check the controller and unit index files ``entries`` (which :func:`file_problem`
    passed) before this process maps them: each in this process first, every page LMDB can
    reach read by the checked page reader and every entry checked against its schema as the
    walk checks it (:func:`tqstore.embedded.index_unchecked`, a read-only map of this
    process, never LMDB's); the files that do not all read so (another layout, a free list
    that is not empty, damage, an entry of the wrong shape) are walked in a child process
    (:func:`lmdb_walk`), which decides and names what is wrong.  Returns the problems found
    (empty: every file may be mapped).  Raises nothing for a damaged file."""
    walk = []
    for e in entries:
        why = embedded.index_unchecked((src / e.path).parent, _SCHEMA[e.role])
        if why is not None:
            log.debug("%s does not read checked in process (%s): walked out of process", src / e.path, why)
            walk.append(e)
    return walk_problems(lmdb_walk(src, walk, first_only=first_only)) if walk else []


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a checkpoint."""

    path: str
    message: str
    offset: Optional[int] = None
    expected_crc: Optional[int] = None
    actual_crc: Optional[int] = None
    format_version: bool = False  # an unknown format version: raised as FormatVersionError

    def to_error(self) -> CorruptionError:
        cls = FormatVersionError if self.format_version else CorruptionError
        return cls(self.message, path=self.path, offset=self.offset, expected_crc=self.expected_crc,
                   actual_crc=self.actual_crc)

    def __str__(self) -> str:
        return str(self.to_error())

    def to_dict(self) -> Dict[str, Any]:
        return {"path": self.path, "message": self.message, "offset": self.offset,
                "expected_crc32c": self.expected_crc, "actual_crc32c": self.actual_crc}


@dataclass
class CheckpointReport:
    """What :func:`verify_checkpoint` found. ``ok`` when ``problems`` is empty."""

    path: Path
    version: Optional[int] = None
    created_unix: Optional[float] = None
    num_units: int = 0
    include_storage: bool = False
    rows: int = 0
    partitions: int = 0
    files: int = 0
    total_bytes: int = 0
    bytes_checked: int = 0
    frames_checked: int = 0
    metadata: Dict[str, Any] = field(default_factory=dict)
    problems: List[Problem] = field(default_factory=list)
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> Dict[str, Any]:
        return {"path": str(self.path), "ok": self.ok, "version": self.version, "created_unix": self.created_unix,
                "num_units": self.num_units, "include_storage": self.include_storage, "rows": self.rows,
                "partitions": self.partitions, "files": self.files, "total_bytes": self.total_bytes,
                "bytes_checked": self.bytes_checked, "frames_checked": self.frames_checked,
                "metadata": self.metadata, "problems": [p.to_dict() for p in self.problems],
                "elapsed_s": round(self.elapsed_s, 6)}


def bad_block(e: M.FileEntry, res) -> Tuple[Optional[int], str]:
    """``(offset, where)`` of the first block whose CRC32C differs from ``e.block_crc32c``:
    ``(None, "")`` when the file has no block CRCs or none differs; ``where`` ends a message."""
    if e.block_crc32c and res.blocks:
        for i, (want, got) in enumerate(zip(e.block_crc32c, res.blocks)):
            if want != got:
                return i * M.INDEX_BLOCK_BYTES, f" in the {M.INDEX_BLOCK_BYTES >> 20} MiB block at this offset"
    return None, ""


def _crc_problem(p: Path, e: M.FileEntry, res) -> Problem:
    if res.bad:
        b = res.bad[0]
        more = " before the scan stopped" if res.stopped else ""
        return Problem(str(p), f"{b.message} ({len(res.bad)} bad frame(s){more})", b.offset, b.expected_crc,
                       b.actual_crc, b.unknown_version)
    offset, where = bad_block(e, res)
    if e.role == M.ROLE_SEGMENT and offset is None:
        where = " (outside every indexed frame)" if res.frames else ""
    return Problem(str(p), f"file checksum mismatch{where}", offset, e.crc32c, None if res.stopped else res.crc)


@read_locked  # no save replaces it and no prune deletes it while it is read
def verify_checkpoint(path: PathLike, *, deep: bool = True, raise_on_error: bool = True,
                      progress: Optional[Callable[[int], None]] = None) -> CheckpointReport:
    """Check the checkpoint at ``path``; nothing is written.

    Args:
        deep: also open the indexes (only those whose CRC matched) and check every indexed
            frame against its CRC32C and every index entry against the segments held.
        raise_on_error: raise the first problem as :class:`CorruptionError` (default);
            with False, return the report listing every problem.
        progress: called with the number of bytes read, as reading goes.

    Returns:
        a :class:`CheckpointReport`.

    Raises:
        CheckpointNotFoundError: no checkpoint (or no MANIFEST.json) at ``path``.
        FormatVersionError: the manifest, or a segment's header, declares an unknown format
            version (with ``raise_on_error``; else the report lists it).
        CorruptionError: damage (``raise_on_error=True``), naming the file and offset.
    """
    t0 = time.perf_counter()
    src = resolve_checkpoint_dir(path)
    rep = CheckpointReport(src)
    try:
        man = read_manifest(src)
    except CorruptionError as e:
        if raise_on_error:
            raise
        rep.problems.append(Problem(e.path or str(src / M.MANIFEST_NAME), str(e).split(" (file ")[0], e.offset,
                                    e.expected_crc, e.actual_crc))
        rep.elapsed_s = time.perf_counter() - t0
        return rep
    rep.version, rep.created_unix, rep.num_units = man.version, man.created_unix, man.num_units
    rep.include_storage, rep.rows = man.include_storage, man.rows
    rep.partitions = int(man.snapshot.get("partitions", 0))
    rep.files, rep.total_bytes, rep.metadata = len(man.files) + 1, man.total_bytes, dict(man.metadata)
    problems = rep.problems
    present: Dict[str, M.FileEntry] = {}
    for e in man.files:
        prob = file_problem(src, e)
        if prob is not None:
            problems.append(prob)
        else:
            present[e.path] = e
    listed = {e.path for e in man.files} | {M.MANIFEST_NAME}
    for dirpath, dirs, names in os.walk(src):
        for n in dirs:
            if os.path.islink(os.path.join(dirpath, n)):
                problems.append(Problem(os.path.join(dirpath, n), "not a real directory (a symbolic link): refused"))
        for n in names:
            rel = os.path.relpath(os.path.join(dirpath, n), src).replace(os.sep, "/")
            if rel not in listed:
                problems.append(Problem(os.path.join(dirpath, n), "file is not listed in MANIFEST.json (foreign or "
                                                                  "left over)"))
    good_index: Dict[str, M.FileEntry] = {}
    for e in man.files:
        if e.role == M.ROLE_SEGMENT or e.path not in present:
            continue
        try:
            res = scan_file(src / e.path, e.size, block_bytes=M.INDEX_BLOCK_BYTES if e.block_crc32c else None,
                            progress=progress, under=src, expect_blocks=e.block_crc32c, stop_at_bad=True)
        except OSError as err:
            problems.append(Problem(str(src / e.path), f"file cannot be read: {err}"))
            continue
        rep.bytes_checked += res.nread
        if res.crc != e.crc32c or res.stopped:
            problems.append(_crc_problem(src / e.path, e, res))
        else:
            good_index[e.path] = e
    frames_by_seg: Dict[Tuple[int, int], Any] = defaultdict(list)  # (unit, seg) -> frames_of rows
    skip: set = set()
    if deep and good_index:
        # every LMDB file is checked (in process, else walked in a child process) before this one maps it
        for prob in lmdb_problems(src, [e for e in man.files if e.path in good_index], first_only=False):
            problems.append(prob)
            good_index.pop(os.path.relpath(prob.path, src).replace(os.sep, "/"), None)
        if M.CONTROLLER_FILE in good_index:
            problems.extend(_check_controller(src, man))
        for u in range(man.num_units):
            rel = M.unit_index_file(u)
            if rel in good_index:
                problems.extend(_read_unit_index(src, man, u, frames_by_seg, skip))
    for e in man.files:
        if e.role != M.ROLE_SEGMENT or e.path not in present or (e.unit, e.seg) in skip:
            continue  # (a segment of another size than its index records is not read: already reported)
        frames = frames_by_seg.get((e.unit, e.seg), [])
        try:
            res = scan_file(src / e.path, e.size, frames=frames, progress=progress, under=src, stop_at_bad=True)
        except OSError as err:
            problems.append(Problem(str(src / e.path), f"file cannot be read: {err}"))
            continue
        rep.bytes_checked += res.nread
        rep.frames_checked += len(frames)
        if res.bad or res.crc != e.crc32c:
            problems.append(_crc_problem(src / e.path, e, res))
        else:  # (its bytes are the ones saved: a header of another version was saved so)
            problems.extend(segment_header_problem(src, e))
        if deep and e.frames is not None and len(frames) != e.frames and M.unit_index_file(e.unit) in good_index:
            problems.append(Problem(str(src / e.path), f"the unit index names {len(frames)} frames in this segment, "
                                                      f"MANIFEST.json records {e.frames}"))
    rep.elapsed_s = time.perf_counter() - t0
    if problems and raise_on_error:
        raise problems[0].to_error()
    return rep


def segment_header_problem(src: Path, e: M.FileEntry) -> List[Problem]:
    """The segment header of ``e`` (its file read clean): a version this code does not read
    is a problem raised as FormatVersionError (a load would refuse it, naming its copy), a
    damaged header one as CorruptionError."""
    p = src / e.path
    try:
        fd = files.open_regular(p, under=src)
        try:
            head = os.pread(fd, SEGMENT_HEADER_SIZE, 0)
        finally:
            os.close(fd)
        decode_segment_header(head, path=str(p))
    except FormatVersionError as err:
        return [Problem(str(p), err.message, err.offset, format_version=True)]
    except CorruptionError as err:
        return [Problem(str(p), f"segment header: {err.message}", err.offset)]
    except OSError as err:
        return [Problem(str(p), f"file cannot be read: {err}")]
    return []


def _check_controller(src: Path, man: M.Manifest) -> List[Problem]:
    p = src / "controller"
    try:
        st = embedded.controller_summary(p)  # the store's own decoder: every entry checked
    except StorageIOError as e:
        return [Problem(str(p / "data.mdb"), f"controller index cannot be opened: {e}")]
    except CorruptionError as e:
        return [Problem(e.path or str(p / "data.mdb"), e.message)]
    return _count_problems(p, man, st)


def check_controller_counts(src: Path, man: M.Manifest, *, read_from: Optional[Path] = None) -> List[Problem]:
    """The controller's unit and row counts against MANIFEST.json, its entries not decoded
    (a load: the store's open of the staged copy decodes and checks every entry, with the
    decoder :func:`_check_controller` uses).  ``read_from``: a byte copy of the checkpoint's
    controller directory to read instead (the load's checked copy); problems still name
    the checkpoint's file."""
    p = src / "controller"
    try:
        st = embedded.controller_counts(read_from if read_from is not None else p)
    except StorageIOError as e:
        return [Problem(str(p / "data.mdb"), f"controller index cannot be opened: {e}")]
    except CorruptionError as e:
        return [Problem(str(p / "data.mdb") if read_from is not None else e.path or str(p / "data.mdb"), e.message)]
    return _count_problems(p, man, st)


def _count_problems(p: Path, man: M.Manifest, st: Dict[str, Any]) -> List[Problem]:
    out: List[Problem] = []
    if st["num_units"] != man.num_units:
        out.append(Problem(str(p / "data.mdb"), f"controller says {st['num_units']} units, MANIFEST.json "
                                               f"{man.num_units}"))
    if st["rows"] != man.rows:
        out.append(Problem(str(p / "data.mdb"), f"controller holds {st['rows']} rows, MANIFEST.json records "
                                               f"{man.rows}"))
    return out


def controller_summary(ctrl_dir: Path, *, shared: bool = False) -> Dict[str, Any]:
    """Every entry of the controller index in ``ctrl_dir`` decoded and checked (read only;
    ``shared``: it may be open in a store elsewhere) and summarised: ``num_units``, ``rows``,
    ``next_gidx``, ``put_token``, ``partitions`` (``{pid: {"rows": n, "keys": n}}``).

    Raises:
        CorruptionError: damage (also "cannot be read"); StorageIOError: it cannot be opened.
    """
    return embedded.controller_summary(Path(ctrl_dir), shared=shared)


def controller_partitions(ckpt: Path) -> Optional[List[Dict[str, Any]]]:
    """Partitions of a checkpoint's (or a store state's) controller copy with their row
    counts, read leniently (read only); None when it cannot be read."""
    counts = embedded.controller_partition_counts(Path(ckpt) / "controller")
    return None if counts is None else [{"partition": q, "rows": n} for q, n in sorted(counts.items())]


def unit_frames(src: Path, man: M.Manifest, u: int,
                bad_segments: Optional[set] = None) -> Tuple[Optional[FrameTable], List[Problem]]:
    """Read unit ``u``'s index of the checkpoint (already walked, see :func:`lmdb_walk`)
    and check it against the manifest: its format version; every ``loc`` entry names bytes
    ``[offset, offset + length)`` with ``offset >= 64`` inside a listed segment of the unit;
    every listed segment has a ``segs`` record of the size MANIFEST.json records.

    Returns the entries that name bytes the checkpoint holds (None if the index cannot be
    read) and the problems found; the ids of segments whose size disagrees are added to
    ``bad_segments`` (not worth reading).  Shared by :func:`verify_checkpoint` and the loader.
    """
    p = src / M.unit_index_file(u)
    segs = man.segments(u)
    out: List[Problem] = []
    try:
        keys, values, recorded = embedded.unit_index_entries(p.parent)
        table = FrameTable.from_index(keys, values)  # (each key checked: a gidx and a UTF-8 field name)
    except FormatVersionError as e:
        return None, [Problem(str(p), str(e))]
    except StorageIOError as e:
        return None, [Problem(str(p), f"unit index cannot be opened: {e}")]
    except (ValueError, KeyError, TypeError, TqstoreError) as e:
        return None, [Problem(str(p), f"unit index cannot be read: {e}")]
    for seg, e in sorted(segs.items()):
        if recorded.get(seg) != e.size:
            if bad_segments is not None:
                bad_segments.add(seg)
            out.append(Problem(str(src / e.path), f"MANIFEST.json records {e.size} bytes for this segment, the unit "
                                                  f"index {recorded.get(seg, 'no record')}"))
    sizes = np.full(int(table.seg.max()) + 1 if len(table) else 1, -1, np.int64)
    for seg, e in segs.items():
        if seg < len(sizes):
            sizes[seg] = e.size
    held = sizes[np.minimum(table.seg, len(sizes) - 1)] if len(table) else sizes[:0]
    bad = (table.seg >= len(sizes)) | (held < 0) | (table.offset < SEGMENT_HEADER_SIZE) | \
        (table.offset + table.length > held)
    nbad = int(bad.sum())
    for b in np.flatnonzero(bad)[:5].tolist():
        off, ln = int(table.offset[b]), int(table.length[b])
        out.append(Problem(str(p), f"entry for global index {int(table.gidx[b])} names bytes [{off}, {off + ln}) of "
                                   f"segment {int(table.seg[b])}, which the checkpoint does not hold"))
    if nbad > 5:
        out.append(Problem(str(p), f"{nbad - 5} more entries name bytes the checkpoint does not hold"))
    if nbad:
        keep = np.flatnonzero(~bad)
        table = table.take(keep)
    return table, out


def frames_of(table: FrameTable) -> Dict[int, np.ndarray]:
    """``{segment: uint64 array of rows (offset, length, crc), sorted by offset}`` of a unit's
    entries (arrays, not tuples: a scan takes them as they are, with no per-frame work)."""
    order = np.lexsort((table.offset, table.seg))
    seg = table.seg[order]
    out: Dict[int, np.ndarray] = {}
    if not len(order):
        return out
    rows = np.empty((len(order), 3), np.uint64)
    rows[:, 0], rows[:, 1], rows[:, 2] = table.offset[order], table.length[order], table.crc[order]
    cuts = np.flatnonzero(np.diff(seg)) + 1
    for a, b in zip(np.r_[0, cuts].tolist(), np.r_[cuts, len(seg)].tolist()):
        out[int(seg[a])] = rows[a:b]
    return out


def _read_unit_index(src: Path, man: M.Manifest, u: int,
                     frames_by_seg: Dict[Tuple[int, int], Any],
                     skip: Optional[set] = None) -> List[Problem]:
    bad: set = set()
    table, out = unit_frames(src, man, u, bad)
    if skip is not None:
        skip.update((u, s) for s in bad)
    if table is not None:
        for seg, fr in frames_of(table).items():
            frames_by_seg[(u, seg)] = fr
    return out
