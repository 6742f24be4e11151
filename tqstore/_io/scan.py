"""Streaming integrity scans of checkpoint and segment files.

Files are read with positional reads into one reusable buffer per call (never mmapped),
so a scan adds a bounded amount of memory whatever the file size.  A segment scan
computes the whole-file CRC32C and, in the same pass, checks every listed frame against
the CRC its index recorded.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable, List, Optional, Sequence, Tuple

from .. import _native
from ..errors import StorageIOError
from . import files
from .._format.layout import (
    FRAME_END_MAGIC, FRAME_MAGIC, FRAME_VERSION, PREFIX, PREFIX_SIZE, TRAILER, TRAILER_SIZE,
    payload_offset,
)

CHUNK_BYTES = 8 << 20
TAIL_BYTES = 4096

Progress = Optional[Callable[[int], None]]
FrameSpec = Tuple[int, int, int]  # (offset, length, crc) of a frame in a segment


@dataclass(frozen=True)
class BadFrame:
    offset: int
    message: str
    expected_crc: Optional[int] = None
    actual_crc: Optional[int] = None


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
        straddling: List[FrameSpec] = []
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
            offs: List[int] = []
            lens: List[int] = []
            exp: List[int] = []
            while fi < nf and frames[fi][0] < end:
                off, ln, c = frames[fi]
                if off < pos:  # cannot happen for sorted, non-overlapping frames
                    straddling.append(frames[fi])
                elif off + ln <= end:
                    offs.append(off - pos)
                    lens.append(ln)
                    exp.append(c)
                else:
                    straddling.append(frames[fi])
                fi += 1
            if offs:
                for (status, _po, _pl, cexp, cact), o, c in zip(_native.verify_frames(view, offs, lens), offs, exp):
                    _judge(bad, pos + o, status, cexp, cact, c)
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
        for off, ln, c in straddling:
            if off + ln <= pos:
                b = check_frame(fd, off, ln, c)
                if b is not None:
                    bad.append(b)
            else:
                bad.append(BadFrame(off, "record frame lies past the end of the file (truncated)"))
        while fi < nf:
            bad.append(BadFrame(frames[fi][0], "record frame lies past the end of the file (truncated)"))
            fi += 1
        bad.sort(key=lambda b: b.offset)
        return ScanResult(pos, crc, blocks, bad, nf)
    finally:
        os.close(fd)


def _judge(bad: List[BadFrame], offset: int, status: int, cexp: int, cact: int, recorded: int) -> None:
    if status == 1:
        bad.append(BadFrame(offset, "not an intact record frame (bad magic, version or lengths)"))
    elif status == 2:
        bad.append(BadFrame(offset, "record frame checksum mismatch", cexp, cact))
    elif cexp != recorded:
        bad.append(BadFrame(offset, "record frame is not the one the index names", recorded, cexp))


def check_frame(fd: int, offset: int, length: int, recorded: int, *, chunk_bytes: int = CHUNK_BYTES
                ) -> Optional[BadFrame]:
    """Check one frame read straight from ``fd`` (streamed when larger than a chunk)."""
    if length <= chunk_bytes:
        buf = bytearray(length)
        n = _read_exact(fd, memoryview(buf), offset)
        if n < length:
            return BadFrame(offset, "record frame lies past the end of the file (truncated)")
        status, _po, _pl, cexp, cact = _native.verify_frames(buf, [0], [length])[0]
        out: List[BadFrame] = []
        _judge(out, offset, status, cexp, cact, recorded)
        return out[0] if out else None
    head = os.pread(fd, PREFIX_SIZE, offset)
    if len(head) < PREFIX_SIZE:
        return BadFrame(offset, "record frame lies past the end of the file (truncated)")
    magic, version, _flags, hlen, plen, _raw = PREFIX.unpack(head)
    pstart = payload_offset(hlen)
    end = pstart + plen
    if magic != FRAME_MAGIC or version != FRAME_VERSION or end + TRAILER_SIZE > length:
        return BadFrame(offset, "not an intact record frame (bad magic, version or lengths)")
    buf = bytearray(chunk_bytes)
    mv = memoryview(buf)
    crc = 0
    pos = 0
    while pos < end:
        want = min(chunk_bytes, end - pos)
        n = _read_exact(fd, mv[:want], offset + pos)
        if n < want:
            return BadFrame(offset, "record frame lies past the end of the file (truncated)")
        crc = _native.crc32c(mv[:n], crc)
        pos += n
    trail = os.pread(fd, TRAILER_SIZE, offset + end)
    if len(trail) < TRAILER_SIZE:
        return BadFrame(offset, "record frame lies past the end of the file (truncated)")
    cexp, emagic = TRAILER.unpack(trail)
    if emagic != FRAME_END_MAGIC:
        return BadFrame(offset, "not an intact record frame (trailer missing)")
    if crc != cexp:
        return BadFrame(offset, "record frame checksum mismatch", cexp, crc)
    if cexp != recorded:
        return BadFrame(offset, "record frame is not the one the index names", recorded, cexp)
    return None


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
