"""Segment files on disk: append-only writer and an mmap cache for zero-copy reads."""
from __future__ import annotations

import mmap
import os
import threading
from pathlib import Path
from typing import Dict, Sequence

from .._format.layout import SEGMENT_HEADER_SIZE
from .._format.segment import encode_segment_header, segment_name
from . import files


#: failpoint of a segment file's creation (before the file exists); the header write that
#: follows is failpoint ``write``, truncating a torn tail on reopen failpoint ``truncate``
SEGMENT_CREATE = "segment_create"


class SegmentWriter:
    """The active segment of a unit: frames are appended with positional vectored writes.

    ``size`` is the logical end (bytes acknowledged by this writer). Not thread-safe;
    the owning unit serialises appends.  Failpoints ``segment_create`` (a new file),
    ``write`` (its header, every append), ``truncate`` (a torn tail cut on reopen),
    ``fsync_file``.
    """

    def __init__(self, directory: Path, unit_id: int, seg_id: int, *, create: bool, size: int = 0) -> None:
        self.path = Path(directory) / segment_name(seg_id)
        self.seg_id = seg_id
        if create:
            files._fp(SEGMENT_CREATE, str(self.path))
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                files.pwrite_all(self.fd, [encode_segment_header(unit_id, seg_id)], 0)
            except BaseException:
                self._close_fd()  # the file stays: the unit's cleanup removes files its index never named
                raise
            self.size = SEGMENT_HEADER_SIZE
        else:
            self.fd = os.open(self.path, os.O_RDWR)
            self.size = size
            try:
                if os.fstat(self.fd).st_size != size:
                    files.ftruncate(self.fd, size, self.path)  # drop a torn tail past the last committed frame
            except BaseException:
                self._close_fd()
                raise

    def append(self, buffers: Sequence) -> int:
        """Write ``buffers`` at the end; returns the offset they start at."""
        off = self.size
        self.size += files.pwrite_all(self.fd, buffers, off)
        return off

    def fsync(self) -> None:
        files.fsync_fd(self.fd, str(self.path))

    def close(self) -> None:
        self._close_fd()

    def _close_fd(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class MmapCache:
    """Read-only mmaps of segment files, remapped when a file has grown.

    Views handed out stay valid after the file is unlinked or the cache dropped.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self._maps: Dict[int, mmap.mmap] = {}
        self._lock = threading.Lock()

    def get(self, seg_id: int, need_end: int) -> mmap.mmap:
        m = self._maps.get(seg_id)
        if m is not None and len(m) >= need_end:
            return m
        with self._lock:
            m = self._maps.get(seg_id)
            if m is not None and len(m) >= need_end:
                return m
            path = self.directory / segment_name(seg_id)
            fd = os.open(path, os.O_RDONLY)
            try:
                size = os.fstat(fd).st_size
                if size < need_end or size == 0:
                    raise EOFError(f"{path} holds {size} bytes, need {need_end}")
                m = mmap.mmap(fd, size, prot=mmap.PROT_READ)
            finally:
                os.close(fd)
            self._maps[seg_id] = m
            return m

    def drop(self, seg_id: int) -> None:
        with self._lock:
            self._maps.pop(seg_id, None)

    def clear(self) -> None:
        with self._lock:
            self._maps.clear()
