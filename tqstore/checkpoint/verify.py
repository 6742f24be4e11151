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

import lmdb

from .._format.layout import INDEX_VALUE, SEGMENT_HEADER_SIZE
from .._io.lmdbenv import open_env
from ..errors import CheckpointNotFoundError, CorruptionError, FormatVersionError
from ..controller import CONTROLLER_DBS, decode_controller
from ..unit import check_index_format
from . import manifest as M
from .scan import scan_file

log = logging.getLogger("tqstore")

PathLike = Any


def resolve_checkpoint_dir(path: PathLike) -> Path:
    """The directory holding the checkpoint published at ``path``.

    Normally ``path`` itself.  If a replacement was interrupted between its two renames,
    ``path`` is missing and the previous checkpoint sits at ``<path>.old``: that one is used.

    Raises:
        CheckpointNotFoundError: no checkpoint at ``path`` (missing, or no MANIFEST.json).
    """
    p = Path(os.path.abspath(os.fspath(path)))
    if (p / M.MANIFEST_NAME).is_file():
        return p
    old = p.with_name(p.name + ".old")
    if not os.path.lexists(p) and (old / M.MANIFEST_NAME).is_file():
        log.warning("checkpoint %s is missing but %s holds the one it was replacing (a save was interrupted "
                    "while publishing); using it", p, old)
        return old
    if p.is_dir():
        raise CheckpointNotFoundError(f"{p} holds no {M.MANIFEST_NAME}: not a tqstore checkpoint (or a save that "
                                      f"never completed)")
    raise CheckpointNotFoundError(f"checkpoint directory {p} does not exist")


def read_manifest(path: PathLike) -> M.Manifest:
    """Parse the manifest of the checkpoint at ``path`` (resolved as :func:`resolve_checkpoint_dir`).

    Raises:
        CheckpointNotFoundError, CorruptionError, FormatVersionError.
    """
    src = resolve_checkpoint_dir(path)
    mp = src / M.MANIFEST_NAME
    try:
        with open(mp, "rb") as f:
            data = f.read(M.MAX_MANIFEST_BYTES + 1)
    except FileNotFoundError as e:
        raise CheckpointNotFoundError(f"{mp} does not exist") from e
    return M.parse(data, path=str(mp))


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a checkpoint."""

    path: str
    message: str
    offset: Optional[int] = None
    expected_crc: Optional[int] = None
    actual_crc: Optional[int] = None

    def to_error(self) -> CorruptionError:
        return CorruptionError(self.message, path=self.path, offset=self.offset, expected_crc=self.expected_crc,
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
        return Problem(str(p), f"{b.message} ({len(res.bad)} bad frame(s))", b.offset, b.expected_crc, b.actual_crc)
    offset, where = bad_block(e, res)
    if e.role == M.ROLE_SEGMENT and offset is None:
        where = " (outside every indexed frame)" if res.frames else ""
    return Problem(str(p), f"file checksum mismatch{where}", offset, e.crc32c, res.crc)


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
        FormatVersionError: the manifest declares an unknown format version.
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
        p = src / e.path
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            problems.append(Problem(str(p), "file listed in MANIFEST.json is missing"))
            continue
        if not os.path.isfile(p) or os.path.islink(p):
            problems.append(Problem(str(p), "not a regular file"))
        elif st.st_size != e.size:
            problems.append(Problem(str(p), f"holds {st.st_size} bytes, MANIFEST.json records {e.size} (truncated "
                                            f"or replaced)", min(st.st_size, e.size)))
        else:
            present[e.path] = e
    listed = {e.path for e in man.files} | {M.MANIFEST_NAME}
    for dirpath, _dirs, names in os.walk(src):
        for n in names:
            rel = os.path.relpath(os.path.join(dirpath, n), src).replace(os.sep, "/")
            if rel not in listed:
                problems.append(Problem(os.path.join(dirpath, n), "file is not listed in MANIFEST.json (foreign or "
                                                                  "left over)"))
    good_index: Dict[str, M.FileEntry] = {}
    for e in man.files:
        if e.role == M.ROLE_SEGMENT or e.path not in present:
            continue
        res = scan_file(src / e.path, e.size, block_bytes=M.INDEX_BLOCK_BYTES if e.block_crc32c else None,
                        progress=progress)
        rep.bytes_checked += res.nread
        if res.crc != e.crc32c:
            problems.append(_crc_problem(src / e.path, e, res))
        else:
            good_index[e.path] = e
    frames_by_seg: Dict[Tuple[int, int], List[Tuple[int, int, int]]] = defaultdict(list)
    if deep:
        if M.CONTROLLER_FILE in good_index:
            problems.extend(_check_controller(src, man))
        for u in range(man.num_units):
            rel = M.unit_index_file(u)
            if rel in good_index:
                problems.extend(_read_unit_index(src, man, u, frames_by_seg))
    for e in man.files:
        if e.role != M.ROLE_SEGMENT or e.path not in present:
            continue
        frames = sorted(frames_by_seg.get((e.unit, e.seg), ()))
        res = scan_file(src / e.path, e.size, frames=frames, progress=progress)
        rep.bytes_checked += res.nread
        rep.frames_checked += len(frames)
        if res.bad or res.crc != e.crc32c:
            problems.append(_crc_problem(src / e.path, e, res))
        if deep and e.frames is not None and len(frames) != e.frames and M.unit_index_file(e.unit) in good_index:
            problems.append(Problem(str(src / e.path), f"the unit index names {len(frames)} frames in this segment, "
                                                      f"MANIFEST.json records {e.frames}"))
    rep.elapsed_s = time.perf_counter() - t0
    if problems and raise_on_error:
        raise problems[0].to_error()
    return rep


def _check_controller(src: Path, man: M.Manifest) -> List[Problem]:
    p = src / "controller"
    out: List[Problem] = []
    try:
        env = open_env(p, max_dbs=12, readonly=True)
    except Exception as e:  # noqa: BLE001 - reported, not raised
        return [Problem(str(p / "data.mdb"), f"controller index cannot be opened: {e}")]
    try:
        with env.begin() as txn:
            dbs = {n: env.open_db(n.encode(), txn=txn, create=False) for n in CONTROLLER_DBS if n != "restores"}
            st = decode_controller(txn, dbs, p)  # the store's own decoder: every entry checked
            if st.num_units != man.num_units:
                out.append(Problem(str(p / "data.mdb"), f"controller says {st.num_units} units, MANIFEST.json "
                                                       f"{man.num_units}"))
            if len(st.rows) != man.rows:
                out.append(Problem(str(p / "data.mdb"), f"controller holds {len(st.rows)} rows, MANIFEST.json records "
                                                       f"{man.rows}"))
    except CorruptionError as e:
        out.append(Problem(e.path or str(p / "data.mdb"), e.message))
    except (lmdb.Error, ValueError) as e:
        out.append(Problem(str(p / "data.mdb"), f"controller index cannot be read: {e}"))
    finally:
        env.close()
    return out


def _read_unit_index(src: Path, man: M.Manifest, u: int,
                     frames_by_seg: Dict[Tuple[int, int], List[Tuple[int, int, int]]]) -> List[Problem]:
    rel = M.unit_index_file(u)
    p = src / rel
    segs = man.segments(u)
    out: List[Problem] = []
    try:
        env = open_env(p.parent, max_dbs=8, readonly=True)
    except Exception as e:  # noqa: BLE001 - reported, not raised
        return [Problem(str(p), f"unit index cannot be opened: {e}")]
    try:
        try:
            check_index_format(env, p.parent, create=False)
        except FormatVersionError as e:
            return [Problem(str(p), str(e))]
        with env.begin() as txn:
            try:
                db = env.open_db(b"loc", txn=txn, create=False)
            except lmdb.NotFoundError:
                return out
            bad = 0
            for k, v in txn.cursor(db):
                seg, off, ln, crc = INDEX_VALUE.unpack(v)
                e = segs.get(seg)
                if e is None or off < SEGMENT_HEADER_SIZE or off + ln > e.size:
                    bad += 1
                    if bad <= 5:
                        out.append(Problem(str(p), f"entry for global index {int.from_bytes(bytes(k[:8]), 'big')} "
                                                   f"names bytes [{off}, {off + ln}) of segment {seg}, which the "
                                                   f"checkpoint does not hold"))
                    continue
                frames_by_seg[(u, seg)].append((off, ln, crc))
            if bad > 5:
                out.append(Problem(str(p), f"{bad - 5} more entries name bytes the checkpoint does not hold"))
    except (lmdb.Error, ValueError) as e:
        out.append(Problem(str(p), f"unit index cannot be read: {e}"))
    finally:
        env.close()
    return out
