"""Segment files on disk: append-only writer and an mmap cache for zero-copy reads."""
from __future__ import annotations

import errno
import fcntl
import mmap
import os
import threading
from pathlib import Path
from typing import Dict, Optional, Sequence

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


#: new segments staged front to back (:class:`StagedSegmentWriter`) write whole blocks with
#: direct I/O where the file system takes it (False: always through the page cache)
DIRECT_IO = True
BLOCK = 4096  # direct I/O unit: buffer address, file offset and length are multiples of it


class StagedSegmentWriter:
    """A new segment written front to back through two aligned buffers that the caller fills
    in place (a load staging a unit beside the live one): :meth:`space` is where the next
    bytes go (e.g. frames read from a checkpoint and checked there), :meth:`commit` appends
    them.  Whole 4 KiB blocks are written by a background thread while the caller fills the
    other buffer, with direct I/O when the file system takes it (no copy into the page cache:
    the bytes go from the buffer to the disk), else through the page cache with their
    writeback started at once; the last partial block is written by :meth:`finish`, which
    waits for the writes and fsyncs (a failed write raises there or at the next commit).
    ``size`` is the logical end (header included).  Not thread-safe.  Failpoints
    ``segment_create`` (before the file exists), ``write``, ``fsync_file``.
    """

    def __init__(self, directory: Path, unit_id: int, seg_id: int, *, capacity: int) -> None:
        self.path = Path(directory) / segment_name(seg_id)
        self.seg_id = seg_id
        files._fp(SEGMENT_CREATE, str(self.path))
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
        direct = getattr(os, "O_DIRECT", 0) if DIRECT_IO else 0
        self.fd = -1
        if direct:
            try:
                self.fd = os.open(self.path, flags | direct, 0o644)
            except OSError as e:
                if e.errno != errno.EINVAL:  # EINVAL: this file system takes no direct I/O
                    raise
        self.direct = self.fd >= 0
        if not self.direct:
            self.fd = os.open(self.path, flags, 0o644)
        size = self._round(capacity) + BLOCK
        self._mems = [mmap.mmap(-1, size), mmap.mmap(-1, size)]  # page-aligned
        self._buf = memoryview(self._mems[0])
        self._inflight: Optional[threading.Thread] = None
        self._error: Optional[BaseException] = None
        head = encode_segment_header(unit_id, seg_id)
        self._buf[:len(head)] = head
        self._pending = len(head)  # bytes in the buffer not yet written, from file offset _done
        self._done = 0
        self.size = len(head)

    @staticmethod
    def _round(n: int) -> int:
        return -(-max(int(n), 1) // BLOCK) * BLOCK

    def space(self, nbytes: int) -> memoryview:
        """The writable view where the next ``nbytes`` go (valid until the next call)."""
        if self._pending + nbytes > self._buf.nbytes:  # a frame larger than the buffer: grow it
            mem = mmap.mmap(-1, self._round(self._pending + nbytes) + BLOCK)
            mem[:self._pending] = self._buf[:self._pending]
            i = self._mems.index(self._buf.obj)
            self._buf.release()
            old, self._mems[i] = self._mems[i], mem
            self._buf = memoryview(mem)
            _close_map(old)
        return self._buf[self._pending:self._pending + nbytes]

    def commit(self, nbytes: int) -> int:
        """Append the ``nbytes`` put into :meth:`space`; returns the file offset they start at."""
        at = self.size
        self._pending += nbytes
        self.size += nbytes
        n = self._pending // BLOCK * BLOCK if self.direct else self._pending
        if n:
            self._wait()  # the other buffer's write is done: it takes the tail
            full, offset = self._buf, self._done
            other = self._mems[1] if full.obj is self._mems[0] else self._mems[0]
            rest = self._pending - n
            nxt = memoryview(other)
            if nxt.nbytes < rest + BLOCK:  # the other buffer is smaller than a grown one
                nxt.release()
                i = self._mems.index(other)
                _close_map(other)
                self._mems[i] = other = mmap.mmap(-1, full.nbytes)
                nxt = memoryview(other)
            nxt[:rest] = full[n:self._pending]
            self._buf = nxt
            self._done += n
            self._pending = rest
            self._inflight = threading.Thread(target=self._write, args=(full, n, offset), daemon=True,
                                              name="tqstore-segwrite")
            self._inflight.start()
        return at

    def _write(self, buf: memoryview, n: int, offset: int) -> None:
        try:
            try:
                files.pwrite_all(self.fd, [buf[:n]], offset)
            except OSError as e:
                if not (self.direct and e.errno == errno.EINVAL):
                    raise
                self._buffered()  # a file system that opens with direct I/O but refuses its writes
                files.pwrite_all(self.fd, [buf[:n]], offset)
            if not self.direct:
                files.start_writeback(self.fd, offset, n)
        except BaseException as e:  # noqa: BLE001 - raised in the caller's thread by _wait
            self._error = e
        finally:
            buf.release()

    def _wait(self) -> None:
        t, self._inflight = self._inflight, None
        if t is not None:
            t.join()
        if self._error is not None:
            raise self._error

    def finish(self) -> None:
        """Wait for the writes, write what is left (the last partial block, through the page
        cache) and fsync."""
        self._wait()
        if self._pending:
            self._buffered()
            files.pwrite_all(self.fd, [self._buf[:self._pending]], self._done)
            self._done += self._pending
            self._pending = 0
        files.fsync_fd(self.fd, str(self.path))

    def _buffered(self) -> None:
        """Write through the page cache from now on (the last partial block, or a file system
        that takes no direct I/O after all)."""
        if self.direct:
            fcntl.fcntl(self.fd, fcntl.F_SETFL, fcntl.fcntl(self.fd, fcntl.F_GETFL) & ~os.O_DIRECT)
            self.direct = False

    def close(self) -> None:
        """Close the file (after any write in flight) and free the buffers; idempotent."""
        t, self._inflight = self._inflight, None
        if t is not None:
            t.join()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self._buf.release()
        for m in self._mems:
            _close_map(m)


def _close_map(m: mmap.mmap) -> None:
    try:
        m.close()
    except BufferError:  # a view still held (an exception's traceback): unmapped when collected
        pass


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
