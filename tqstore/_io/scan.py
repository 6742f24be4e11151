"""Streaming integrity scans of checkpoint and segment files.

Files are read with positional reads into one reusable buffer per call (never mmapped),
so a scan adds a bounded amount of memory whatever the file size (a frame larger than
the buffer is read whole into one of its own).  A segment scan computes the whole-file
CRC32C and, in the same pass, checks every listed frame with the frame-check kernel
(:func:`tqstore._format.frame.check_run`): everything docs/FORMAT.md requires of a frame
(exact extent, head, sizes, end magic, zero padding, CRC32C) and the CRC its index
recorded.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np

from .. import _native
from . import files
from .._format.frame import check_run, frame_fault
from .._format.index import LOC_DTYPE
from .._format.layout import FRAME_TRUNCATED, FRAME_VERSION_UNKNOWN
from ..errors import CorruptionError, FormatVersionError, StorageIOError

CHUNK_BYTES = 2 << 20  # per concurrent scan (a load verifies its units' segments side by side)
TAIL_BYTES = 4096

Progress = Optional[Callable[[int], None]]
FrameSpec = Tuple[int, int, int]  # (offset, length, crc) of a frame in a segment (or a row of an (n, 3) array)


@dataclass(frozen=True)
class BadFrame:
    """A frame that failed a check: where, why (``code``: the kernel's ``FRAME_*`` status)."""

    offset: int
    message: str
    expected_crc: Optional[int] = None
    actual_crc: Optional[int] = None
    code: int = FRAME_TRUNCATED

    @property
    def unknown_version(self) -> bool:
        return self.code == FRAME_VERSION_UNKNOWN

    def error(self, message: Optional[str] = None, *, path: Optional[str]) -> CorruptionError:
        """The exception to raise for it (``FormatVersionError`` for an unknown frame version)."""
        cls = FormatVersionError if self.unknown_version else CorruptionError
        return cls(self.message if message is None else message, path=path, offset=self.offset,
                   expected_crc=self.expected_crc, actual_crc=self.actual_crc)


_PAST_END = "record frame lies past the end of the file (truncated)"


def _locs(frames: Sequence[FrameSpec]) -> np.ndarray:
    """``frames`` (``(offset, length, crc)`` tuples, or an ``(n, 3)`` integer array) as LOC records."""
    loc = np.zeros(len(frames), LOC_DTYPE)
    if len(frames):
        a = np.asarray(frames, dtype=np.uint64).reshape(-1, 3)
        loc["offset"], loc["length"], loc["crc"] = a[:, 0], a[:, 1], a[:, 2]
    return loc


def _check(buf, loc: np.ndarray, base: int, bad: List[BadFrame]) -> None:
    """Run the kernel over the frames ``loc`` lying whole in ``buf`` (file offset ``base``)."""
    status, crcs, trailers = check_run(buf, loc, base=base)
    for i in np.flatnonzero(status).tolist():
        off = int(loc["offset"][i])
        f = frame_fault(int(status[i]), memoryview(buf)[off - base:off - base + 8], recorded=int(loc["crc"][i]),
                        crc=int(crcs[i]), trailer=int(trailers[i]))
        bad.append(BadFrame(off, f.message, f.expected_crc, f.actual_crc, f.code))


@dataclass
class ScanResult:
    """What a scan found: bytes read, whole-file CRC, per-block CRCs (when asked) and bad frames."""

    nread: int
    crc: int
    blocks: Optional[List[int]] = None
    bad: List[BadFrame] = field(default_factory=list)
    frames: int = 0
    stopped: bool = False  # ended before ``size`` at a bad block or frame (``stop_at_bad``)


def _read_exact(fd: int, view: memoryview, offset: int) -> int:
    got = 0
    while got < view.nbytes:
        n = os.preadv(fd, [view[got:]], offset + got)
        if n == 0:
            break
        got += n
    return got


def scan_file(path, size: int, *, frames: Sequence[FrameSpec] = (), block_bytes: Optional[int] = None,
              chunk_bytes: int = CHUNK_BYTES, progress: Progress = None, under=None,
              expect_blocks: Optional[Sequence[int]] = None, stop_at_bad: bool = False) -> ScanResult:
    """Read the first ``size`` bytes of ``path`` once: whole-file CRC32C, optional per-block
    CRCs, and a check of each frame in ``frames`` (sorted by offset, non-overlapping).

    The file is opened with :func:`tqstore._io.files.open_regular` (``under``: the
    checkpoint directory, so no symbolic link or non-directory inside it is followed).
    With ``stop_at_bad``, the scan ends (``stopped``) after the chunk holding the first bad
    frame or the first block whose CRC differs from ``expect_blocks`` (one CRC per
    ``block_bytes`` block): a damaged file is rejected without reading all of it.

    ``nread < size`` without ``stopped`` means the file is shorter (truncated).  Raises
    OSError (``files.NotRegularFile`` for a link or a non-regular file) when the file
    cannot be opened.
    """
    if block_bytes is not None:
        chunk_bytes = max(block_bytes, (chunk_bytes // block_bytes) * block_bytes)
    fd = files.open_regular(path, under=under)
    stopped = False
    try:
        try:
            os.posix_fadvise(fd, 0, size, os.POSIX_FADV_SEQUENTIAL)
        except (AttributeError, OSError):
            pass
        buf = bytearray(min(chunk_bytes, max(size, 1)))
        mv = memoryview(buf)
        crc = 0
        blocks: Optional[List[int]] = [] if block_bytes is not None else None
        bad: List[BadFrame] = []
        straddling: List[int] = []
        loc = _locs(frames)
        offs = np.ascontiguousarray(loc["offset"])  # (searched once per chunk: no strided copy each time)
        ends = offs + loc["length"]
        fi = 0
        nf = len(frames)
        pos = 0
        while pos < size:
            want = min(len(buf), size - pos)
            n = _read_exact(fd, mv[:want], pos)
            if n == 0:
                break
            view = mv[:n]
            crc = _native.crc32c(view, crc)
            if blocks is not None:
                first = len(blocks)
                for b in range(0, n, block_bytes):
                    blocks.append(_native.crc32c(view[b:b + block_bytes]))
                if stop_at_bad and expect_blocks is not None and list(expect_blocks[first:len(blocks)]) != \
                        blocks[first:]:
                    stopped = True
            end = pos + n
            fj = fi + int(np.searchsorted(offs[fi:], end, side="left"))  # the frames that start before end
            if fj > fi:
                inside = (offs[fi:fj] >= pos) & (ends[fi:fj] <= end)
                if inside.all():
                    _check(view, loc[fi:fj], pos, bad)
                else:  # a frame across the chunk's end (or out of order): checked on its own below
                    _check(view, loc[fi:fj][inside], pos, bad)
                    straddling.extend((fi + np.flatnonzero(~inside)).tolist())
                fi = fj
            if progress is not None:
                progress(n)
            pos = end
            if n < want:
                break
            if stop_at_bad and bad:
                stopped = True
            if stopped and pos < size:
                bad.sort(key=lambda b: b.offset)
                return ScanResult(pos, crc, blocks, bad, nf, stopped=True)
        for k in straddling:
            off, ln, c = int(offs[k]), int(loc["length"][k]), int(loc["crc"][k])
            if off + ln <= pos:
                b = check_frame(fd, off, ln, c)
                if b is not None:
                    bad.append(b)
            else:
                bad.append(BadFrame(off, _PAST_END))
        bad.extend(BadFrame(int(o), _PAST_END) for o in offs[fi:].tolist())
        bad.sort(key=lambda b: b.offset)
        return ScanResult(pos, crc, blocks, bad, nf)
    finally:
        os.close(fd)


def check_frame(fd: int, offset: int, length: int, recorded: int, *, chunk_bytes: int = CHUNK_BYTES
                ) -> Optional[BadFrame]:
    """Check one frame read straight from ``fd`` with the frame-check kernel (``chunk_bytes``
    is kept for callers; the frame is read whole into a buffer of its length)."""
    buf = bytearray(length)
    n = _read_exact(fd, memoryview(buf), offset)
    if n < length:
        return BadFrame(offset, _PAST_END)
    out: List[BadFrame] = []
    _check(buf, _locs([(offset, length, recorded)]), offset, out)
    return out[0] if out else None


def identity(path, size: int) -> str:
    """A cheap identity of an immutable (sealed) segment file: device, inode, mtime, size and
    the CRC32C of its last bytes.  Two files with one identity hold the same bytes (a sealed
    segment never changes; a reused inode would also need the same mtime, size and tail)."""
    st = os.stat(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        n = min(TAIL_BYTES, size)
        tail = os.pread(fd, n, size - n) if n else b""
    finally:
        os.close(fd)
    return f"{st.st_dev}:{st.st_ino}:{st.st_mtime_ns}:{size}:{_native.crc32c(tail):08x}"


def seal_index_file(path, block_bytes: int) -> Tuple[int, int, Tuple[int, ...]]:
    """fsync a freshly written LMDB copy and describe it: ``(size, CRC32C, per-block CRCs)``."""
    files.fsync_file(path)
    size = os.stat(path).st_size
    res = scan_file(path, size, block_bytes=block_bytes)
    if res.nread != size:
        raise StorageIOError(f"{path} changed while it was being checksummed")
    return size, res.crc, tuple(res.blocks or [0])


def listed_file_problem(path, size: int, *, under) -> Optional[Tuple[str, str, Optional[int]]]:
    """The cheap checks of one file a checkpoint lists, before any byte is read: it exists, it
    is a regular file reached through real directories below ``under`` (no symbolic link,
    FIFO or device; see :func:`files.open_regular`), and it holds ``size`` bytes.  Returns
    ``(path, message, offset)`` of the problem, or None."""
    p = str(path)
    try:
        st = files.check_regular(path, under=under)
    except FileNotFoundError:
        return p, "file listed in MANIFEST.json is missing", None
    except files.NotRegularFile as err:
        return (str(err.filename or p), f"{err.strerror}: refused (a checkpoint holds only regular files in real "
                                        f"directories)", None)
    except OSError as err:
        return p, f"file cannot be opened: {err}", None
    if st.st_size != size:
        return p, f"holds {st.st_size} bytes, MANIFEST.json records {size} (truncated or replaced)", min(st.st_size,
                                                                                                          size)
    return None
