"""Read path of a storage unit: index lookups and verified, zero-copy or single-copy reads.

Mixed into :class:`tqstore.unit.Unit`.  Every read checks each frame's structure, that it
is the frame the index names (extent, CRC, row), and its CRC32C unless told not to; a
failure raises :class:`~tqstore.errors.CorruptionError` naming file and offset.  Nothing
here writes.
"""
from __future__ import annotations

import functools
import logging
import os
from collections import defaultdict
from itertools import islice
from typing import Any, Dict, List, Optional, Sequence, Tuple

import lmdb
import numpy as np
import zstandard

from . import _native
from ._format.frame import (
    Frame, FrameHead, check_rows, decode_frame, decode_frames, gather_run,
    parse_head,
)
from ._format.index import INDEX_KEY_HEAD, LOC_DTYPE, MMAP_READ_BYTES, Loc, decode_index_key, decode_index_keys
from ._format.lmdb_pages import Packed
from ._format.records import RecordError
from ._format.layout import (
    CODEC_MASK, CODEC_ZSTD, PREFIX_SIZE, SEGMENT_HEADER_SIZE, TRAILER,
    FRAME_END_MAGIC, frame_extent,
)
from ._format.segment import decode_segment_header, segment_name
from ._io import files
from ._io.lmdbenv import read_columns
from ._format.unit_records import SegInfo
from .errors import CorruptionError, StoreClosedError
from .ports import FrameProblem
from .unit_gate import ReadGate

log = logging.getLogger("tqstore")

HEAD_READ_BYTES = 640  # covers the largest header (255-byte field name, 32 dims)


def _raise_truncated(path: str, offset: int):
    raise CorruptionError("truncated record frame", path=path, offset=offset)


#: a lookup of at least this many rows tries one cursor scan first (:func:`_scan_lookup`)
SCAN_MIN_ROWS = 32
#: the scan reads every field of the rows: not when they hold many more than asked for
SCAN_MAX_EXTRA = 3


def _scan_lookup(cur, gidxs: Sequence[int], fields: Sequence[str]) -> Optional[Dict[str, np.ndarray]]:
    """:meth:`UnitReader.lookup` by one scan of the index from the lowest row asked for: when the
    rows asked for (duplicates allowed) are the next rows of the index and each has the fields
    the first one has (``fields`` among them), the scan's keys equal exactly the keys built from
    the rows and those fields (compared as one byte string), and its values are the locations,
    row by row.  None when that does not hold (the caller looks the keys up one by one)."""
    g = np.asarray(gidxs, dtype=np.uint64)
    if g.ndim != 1:
        return None
    if g.size > 1 and bool((g[1:] > g[:-1]).all()):
        uniq, inv = g, None
    else:
        uniq, inv = np.unique(g, return_inverse=True)
    first = INDEX_KEY_HEAD.pack(int(uniq[0]))
    if not cur.set_range(first):
        return None
    names: List[bytes] = []
    limit = SCAN_MAX_EXTRA * len(fields) + 1
    for k in cur.iternext(keys=True, values=False):
        if k[:8] != first:
            break
        names.append(k[8:])
        if len(names) > limit:
            return None
    want = [f.encode() for f in fields]
    if not names or any(f not in names for f in want):
        return None
    dt = np.dtype([(f"g{j}", ">u8") if half == 0 else (f"f{j}", f"S{len(n)}")
                   for j, n in enumerate(names) for half in (0, 1)])
    exp = np.empty(len(uniq), dt)
    for j, n in enumerate(names):
        exp[f"g{j}"] = uniq
        exp[f"f{j}"] = n
    m = len(uniq) * len(names)
    cur.set_range(first)
    if b"".join(islice(cur.iternext(keys=True, values=False), m)) != exp.tobytes():
        return None
    cur.set_range(first)
    raw = b"".join(islice(cur.iternext(keys=False, values=True), m))
    if len(raw) != m * LOC_DTYPE.itemsize:
        return None  # pragma: no cover - a value of another size is not an index value
    locs = np.frombuffer(raw, LOC_DTYPE).reshape(len(uniq), len(names))
    out = {}
    for field, f in zip(fields, want):
        col = locs[:, names.index(f)]
        out[field] = np.ascontiguousarray(col if inv is None else col[inv.reshape(-1)])
    return out


def _open_unit_read(fn):
    """A read of a unit through its :class:`ReadGate` (``_reads``): the unit's close waits for
    it, and a read of a closed unit raises StoreClosedError (the data plane's read guard,
    :mod:`tqstore.read_guard`, tries it again when a checkpoint load switched the store to
    new units meanwhile); LMDB's error about a closed environment never reaches the caller."""
    @functools.wraps(fn)
    def read(self, *args, **kwargs):
        gate = self.__dict__.get("_reads")
        if gate is None:  # (a reader without a gate: nothing closes it under a read)
            return fn(self, *args, **kwargs)
        gate.enter()
        try:
            return fn(self, *args, **kwargs)
        except lmdb.Error as e:
            if gate.closed:
                raise StoreClosedError(f"{gate.what} was closed during the read") from e
            raise
        finally:
            gate.leave()
    return read


class UnitReader:
    """The read methods of a unit (needs ``path``, ``env``, ``db_loc``, ``maps``, ``locs`` of the Unit;
    :meth:`verify` also its lock, segment records and pins)."""

    # The index is read through a transaction of its own or through a snapshot's (``snapshot``:
    # an id from :meth:`Unit.snapshot`, resolved by ``_snapshot_txn``).

    @_open_unit_read
    def locate(self, gidxs: Sequence[int], field: str, *, snapshot: Optional[int] = None) -> List[Optional[Loc]]:
        """The :class:`Loc` of ``field`` for each gidx (None where absent), in one transaction."""
        f = field.encode()
        own = snapshot is None
        txn = self.env.begin() if own else self._snapshot_txn(snapshot)
        try:
            out = []
            get = txn.get
            db = self.db_loc
            key = INDEX_KEY_HEAD.pack
            unpack = Loc.unpack
            held = self.held_loc if own and self.held_back else None
            for g in gidxs:
                v = (held(key(g) + f) if held else None) or get(key(g) + f, db=db)
                out.append(None if v is None else unpack(v))
            return out
        finally:
            if own:
                txn.abort()

    @_open_unit_read
    def lookup(self, gidxs: Sequence[int], fields: Sequence[str], *, snapshot: Optional[int] = None
               ) -> Dict[str, Optional[np.ndarray]]:
        """Locations of each field for the rows ``gidxs``: a :data:`LOC_DTYPE` array in the order of
        ``gidxs``, None for a field some row lacks (:meth:`locate` tells which).  Every field is
        read in one index transaction: all come from one state.

        Rows that lie side by side in the index with one set of fields (a batch put together)
        are read by one cursor scan, checked against the keys they must have; any other set
        by one native multi-get per field.  The latest state, and a snapshot's when the cache is
        exact for its commit, is first looked for in the unit's location cache
        (:mod:`tqstore.unit_locs`); what the index gives for the latest state is kept there."""
        out: Optional[Dict[str, Optional[np.ndarray]]] = None
        own = snapshot is None
        held = own and bool(self.held_back)  # (a failed put's rollback pending: no cache, see unit_held)
        if own and not held:
            out = self.locs.get(gidxs, fields)
            if out is not None:
                return out
        txn = self.env.begin() if own else self._snapshot_txn(snapshot)
        try:
            if not own:  # a snapshot's state: from the cache only when it is exact for the snapshot's commit
                out = self.locs.get(gidxs, fields, at=txn.id())
                if out is not None:
                    return out
            cur = txn.cursor(self.db_loc)
            if len(gidxs) >= SCAN_MIN_ROWS and fields:
                out = _scan_lookup(cur, gidxs, fields)
            if out is None:
                out = {}
                key = INDEX_KEY_HEAD.pack
                heads = [key(g) for g in (gidxs.tolist() if isinstance(gidxs, np.ndarray) else gidxs)]
                for field in fields:
                    f = field.encode()
                    keys = [h + f for h in heads]
                    pairs = cur.getmulti(keys)
                    out[field] = (np.frombuffer(b"".join([v for _k, v in pairs]), LOC_DTYPE)
                                  if len(pairs) == len(keys) else None)
            if held:
                self.patch_held(gidxs, fields, out)
            elif own and len(gidxs):
                self.locs.populate(txn.id(), gidxs, out)
        finally:
            if own:
                txn.abort()
        return out

    def describe(self, loc) -> str:
        """Where the frame at ``loc`` lives (its segment file's path), for error messages."""
        return self._seg_path(int(loc[0]))

    @_open_unit_read
    def read_uniform(self, locs: np.ndarray, gidxs: np.ndarray, template: Tuple[bytes, bytes],
                     payload_start: int, payload_len: int, *, into: Optional[np.ndarray] = None,
                     rows: Optional[np.ndarray] = None, verify: bool = True):
        """Payloads of frames of one length and one expected head (``template``, see
        :func:`~tqstore._format.frame.head_template`), each frame checked.

        ``locs`` is a :data:`LOC_DTYPE` array, ``gidxs`` the rows' global indexes.  With ``into``
        (a writable C-contiguous ``(m, payload_len)`` uint8 array) the payload of frame ``i``
        lands in ``into[rows[i]]`` (the single copy) and the answer is True, or False when a
        head differs from the template (another shape or dtype of the same length: read those
        frames with :meth:`read_frames` or :meth:`read_heads` and :meth:`read_into`).  Without
        ``into`` the answer is a ``(len(locs), payload_len)`` uint8 array, or None when a head
        differs.  Frames up to ``MMAP_READ_BYTES`` are read through the segment mmaps, larger
        ones with ``preadv`` straight into the destination.

        Raises:
            CorruptionError: a frame is truncated, torn or fails its CRC32C.
        """
        n = len(locs)
        gidxs = np.asarray(gidxs, dtype=np.uint64)
        if into is None:
            out = np.empty((n, payload_len), np.uint8)
            done = self.read_uniform(locs, gidxs, template, payload_start, payload_len, into=out,
                                     rows=np.arange(n, dtype=np.int64), verify=verify)
            return out if done else None
        if not n:
            return True
        rows = np.asarray(rows, dtype=np.int64)
        read = self._uniform_mapped if int(locs["length"][0]) <= MMAP_READ_BYTES else self._uniform_preadv
        return read(locs, gidxs, template, payload_start, payload_len, into, rows, verify=verify)

    def _uniform_mapped(self, locs: np.ndarray, gidxs: np.ndarray, template: Tuple[bytes, bytes],
                        payload_start: int, payload_len: int, out: np.ndarray, rows: np.ndarray, *,
                        verify: bool = True) -> bool:
        """:meth:`read_uniform` through the segment mmaps: one
        :func:`~tqstore._format.frame.gather_run` per segment checks every frame (head against
        ``template``, gidx, trailer, index CRC, padding, CRC32C) and copies its payload, in one
        native pass.  ``gidxs`` u64 and ``rows`` i64 arrays."""
        n = len(locs)
        if not n:
            return True
        flen = int(locs["length"][0])
        segs = locs["seg"]
        s0 = int(segs[0])
        if n == 1 or (segs == s0).all():
            groups = [(s0, locs, gidxs, rows)]
        else:
            groups = []
            for seg in np.unique(segs).tolist():
                sel = np.flatnonzero(segs == seg)
                groups.append((seg, locs[sel], gidxs[sel], rows[sel]))
        for seg, ls, gs, rs in groups:
            m = self._map_to(seg, int(ls["offset"].max()) + flen)
            if not gather_run(m, ls, gs, out, rs, template=template, payload_start=payload_start,
                              payload_len=payload_len, verify=verify, path=self._seg_path(seg)):
                return False
        return True

    def _seg_path(self, seg: int) -> str:
        p = self._paths.get(seg)
        if p is None:
            p = self._paths[seg] = str(self.path / segment_name(seg))
        return p

    def _map_to(self, seg: int, end: int, offset: Optional[int] = None):
        try:
            return self.maps.get(seg, end)
        except (FileNotFoundError, EOFError) as e:
            raise CorruptionError(f"segment missing or truncated: {e}", path=self._seg_path(seg),
                                  offset=offset) from e

    @_open_unit_read
    def read_frame(self, loc: Loc, *, verify: bool = True) -> Frame:
        """The verified frame at ``loc``; its payload is a zero-copy view of the mmapped segment."""
        m = self._map_to(loc.seg, loc.offset + loc.length, loc.offset)
        return decode_frame(m, loc.offset, loc.length, path=self._seg_path(loc.seg), verify=verify,
                            expected_crc=loc.crc)

    def decode_payload(self, fr: Frame):
        """The frame's raw payload bytes (decompressed if the frame is compressed)."""
        if fr.codec == CODEC_ZSTD:
            try:
                return zstandard.ZstdDecompressor().decompress(fr.payload, max_output_size=fr.raw_len)
            except zstandard.ZstdError as e:
                raise CorruptionError(f"zstd payload does not decode: {e}", path=None) from e
        return fr.payload

    @_open_unit_read
    def read_heads(self, locs: Sequence[Loc]) -> List[FrameHead]:
        """Parse the head of each frame with a small positional read (no mapping of payloads)."""
        out = []
        fds: Dict[int, int] = {}
        try:
            for loc in locs:
                out.append(self._head_at(self._fd(fds, loc.seg), loc)[0])
        finally:
            for fd in fds.values():
                os.close(fd)
        return out

    def _head_at(self, fd: int, loc: Loc) -> Tuple[FrameHead, bytes]:
        """The parsed head of the frame at ``loc`` and the bytes read for it (the head, at least)."""
        want = min(loc.length, HEAD_READ_BYTES)
        raw = os.pread(fd, want, loc.offset)
        if len(raw) < PREFIX_SIZE:
            _raise_truncated(self._seg_path(loc.seg), loc.offset)
        return parse_head(raw, 0, loc.length if len(raw) == want else None, path=self._seg_path(loc.seg)), raw

    @_open_unit_read
    def read_head(self, loc: Loc) -> Tuple[FrameHead, bytes]:
        """The parsed head of the frame at ``loc`` and its bytes up to the payload start
        (one positional read: ``HEAD_READ_BYTES`` covers the largest payload start); the
        structure is checked, the CRC is not (the frame's read checks it)."""
        fds: Dict[int, int] = {}
        try:
            h, raw = self._head_at(self._fd(fds, loc.seg), loc)
        finally:
            for fd in fds.values():
                os.close(fd)
        if len(raw) < h.payload_start:
            _raise_truncated(self._seg_path(loc.seg), loc.offset)
        return h, raw[:h.payload_start]

    def _fd(self, fds: Dict[int, int], seg: int) -> int:
        fd = fds.get(seg)
        if fd is None:
            try:
                fd = fds[seg] = os.open(self._seg_path(seg), os.O_RDONLY)
            except FileNotFoundError as e:
                raise CorruptionError("segment file missing", path=self._seg_path(seg)) from e
        return fd

    @_open_unit_read
    def read_into(self, locs: Sequence[Loc], heads: Sequence[FrameHead], into: Optional[Sequence] = None, *,
                  verify: bool = True) -> Optional[List[bytearray]]:
        """Read each frame's payload straight into the writable buffer ``into[i]`` (sized from
        ``heads``, see :meth:`read_heads`); returns None.  Without ``into`` the payloads are
        read into new buffers and returned.

        One ``preadv`` per frame (head, destination, trailer); the CRC32C is checked over
        what landed.  Compressed frames are decompressed into the destination.
        Raises CorruptionError on any mismatch (the destination content is then undefined).
        """
        if into is None:
            bufs = [bytearray(h.raw_len if h.flags & CODEC_MASK else h.payload_len) for h in heads]
            self.read_into(locs, heads, bufs, verify=verify)
            return bufs
        dests = into
        fds: Dict[int, int] = {}
        try:
            for loc, h, dest in zip(locs, heads, dests):
                dv = memoryview(dest).cast("B")
                path = self._seg_path(loc.seg)
                if h.flags & CODEC_MASK:
                    data = self.decode_payload(self.read_frame(loc, verify=verify))
                    if len(data) != dv.nbytes:
                        raise CorruptionError(f"row payload holds {len(data)} bytes, expected {dv.nbytes}", path=path,
                                              offset=loc.offset)
                    dv[:] = data
                    continue
                if h.payload_len != dv.nbytes:
                    raise CorruptionError(f"row payload holds {h.payload_len} bytes, expected {dv.nbytes}", path=path,
                                          offset=loc.offset)
                end = h.payload_start + h.payload_len
                if frame_extent(h.payload_start, h.payload_len) != loc.length:
                    raise CorruptionError("record frame lengths do not match its extent in the index", path=path,
                                          offset=loc.offset)
                fd = self._fd(fds, loc.seg)
                head = bytearray(h.payload_start)
                trail = bytearray(loc.length - end)  # trailer and zero padding
                n = os.preadv(fd, [head, dv, trail], loc.offset)
                if n != loc.length:
                    raise CorruptionError("truncated record frame", path=path, offset=loc.offset)
                hlen = int.from_bytes(head[6:8], "little")
                if any(head[PREFIX_SIZE + hlen:]) or any(trail[TRAILER.size:]):
                    raise CorruptionError("record frame padding is not zero", path=path, offset=loc.offset)
                crc_exp, emagic = TRAILER.unpack_from(trail)
                if emagic != FRAME_END_MAGIC or crc_exp != loc.crc:
                    raise CorruptionError("record frame trailer does not match the index", path=path,
                                          offset=loc.offset, expected_crc=loc.crc, actual_crc=crc_exp)
                if verify:
                    act = _native.crc32c(dv, _native.crc32c(head))
                    if act != crc_exp:
                        raise CorruptionError("record frame checksum mismatch", path=path, offset=loc.offset,
                                              expected_crc=crc_exp, actual_crc=act)
        finally:
            for fd in fds.values():
                os.close(fd)
        return None

    @_open_unit_read
    def read_frames(self, locs: Sequence[Loc], gidxs: Sequence[int], *, verify: bool = True
                    ) -> List[Tuple[FrameHead, object]]:
        """Read frames through the segment mmaps, checked in bulk (one native call per segment).

        Returns ``(head, payload)`` per frame: the payload is a read-only view of the mapped
        segment (no copy), or the decompressed bytes of a compressed frame.

        Raises:
            CorruptionError: a frame does not check (names file and offset).
        """
        out: List = [None] * len(locs)
        by_seg: Dict[int, List[int]] = defaultdict(list)
        for i, loc in enumerate(locs):
            by_seg[loc.seg].append(i)
        for seg, idx in by_seg.items():
            sel = [locs[i] for i in idx]
            m = self._map_to(seg, max(l.offset + l.length for l in sel))
            got = decode_frames(m, [l.offset for l in sel], [l.length for l in sel], crcs=[l.crc for l in sel],
                                gidxs=[gidxs[i] for i in idx], verify=verify, path=self._seg_path(seg))
            for i, l, (h, payload) in zip(idx, sel, got):
                if h.flags & CODEC_MASK:
                    payload = self._decompress(payload, h.raw_len, self._seg_path(seg), l.offset)
                out[i] = (h, payload)
        return out

    def _decompress(self, payload, raw_len: int, path: str, offset: int) -> bytes:
        try:
            data = zstandard.ZstdDecompressor().decompress(payload, max_output_size=raw_len)
        except zstandard.ZstdError as e:
            raise CorruptionError(f"zstd payload does not decode: {e}", path=path, offset=offset) from e
        if len(data) != raw_len:
            raise CorruptionError(f"zstd payload holds {len(data)} bytes, the frame says {raw_len}", path=path,
                                  offset=offset)
        return data

    def _uniform_preadv(self, locs: np.ndarray, gidxs: np.ndarray, template: Tuple[bytes, bytes],
                        payload_start: int, payload_len: int, out: np.ndarray, rows: np.ndarray, *,
                        verify: bool = True) -> bool:
        """:meth:`read_uniform` with vectored reads, no mapping (so no resident file pages are
        added): frames adjacent on disk are read with one ``preadv`` (heads and trailers into a
        scratch buffer, payloads into ``out``), then checked (vectorised) against ``template``,
        the index and their CRC32C."""
        n = len(locs)
        if not n:
            return True
        flen = int(locs["length"][0])
        gap = flen - payload_len
        if gap < payload_start + TRAILER.size or out.shape[1] != payload_len or not out.flags.c_contiguous:
            return False
        order = np.lexsort((locs["offset"], locs["seg"]))
        segs = locs["seg"][order]
        offs = locs["offset"][order].astype(np.int64)
        crcs = locs["crc"][order]
        gs = np.asarray(gidxs, dtype=np.uint64)[order]
        brk = np.flatnonzero((np.diff(offs) != flen) | (np.diff(segs) != 0)) + 1
        starts = [0] + brk.tolist() + [n]
        scratch = np.empty((n, gap), np.uint8)
        sv = memoryview(scratch.reshape(-1))
        ov = memoryview(out.reshape(-1))
        dests = [ov[p * payload_len:(p + 1) * payload_len] for p in np.asarray(rows)[order].tolist()]
        offl = offs.tolist()
        ps = payload_start
        fds: Dict[int, int] = {}
        try:
            for a, b in zip(starts[:-1], starts[1:]):
                seg = int(segs[a])
                path = self._seg_path(seg)
                iov = [sv[a * gap:a * gap + ps]]
                for r in range(a, b):
                    iov.append(dests[r])
                    iov.append(sv[r * gap + ps:(r + 1) * gap + (ps if r + 1 < b else 0)])
                got = files.preadv_all(self._fd(fds, seg), iov, offl[a])
                if got != (b - a) * flen:
                    raise CorruptionError("truncated record frame", path=path, offset=offl[a] + got - got % flen)
                if not check_rows(scratch[a:b, :ps], scratch[a:b, ps:], template=template, gidxs=gs[a:b],
                                  crcs=crcs[a:b], offsets=offs[a:b], path=path):
                    return False
        finally:
            for fd in fds.values():
                os.close(fd)
        if verify:
            crc = _native.crc32c
            act = np.fromiter((crc(dests[r], crc(sv[r * gap:r * gap + ps])) for r in range(n)), dtype=np.uint32,
                              count=n)
            bad = np.flatnonzero(act != crcs)
            if bad.size:
                r = int(bad[0])
                raise CorruptionError("record frame checksum mismatch", path=self._seg_path(int(segs[r])),
                                      offset=offl[r], expected_crc=int(crcs[r]), actual_crc=int(act[r]))
        return True

    @_open_unit_read
    def verify(self) -> List[str]:
        """Check every indexed frame and segment header of one view of the index (a read
        transaction whose segments stay pinned meanwhile, so that clears, overwrites and
        compaction running beside it unlink none of them: nothing they do is reported as
        missing); returns one line per problem, a :class:`~tqstore.ports.FrameProblem` (naming
        the row and field) for a frame that does not check."""
        problems: List[str] = []
        with self._lock:
            txn = self.env.begin()
            try:
                segs = list(self._load_segs(txn))
            except BaseException:
                txn.abort()
                raise
            for s in segs:
                self._pins[s] += 1
        try:
            for s in segs:
                p = self.path / segment_name(s)
                try:
                    with open(p, "rb") as f:
                        decode_segment_header(f.read(SEGMENT_HEADER_SIZE), path=str(p))
                except (OSError, CorruptionError) as e:
                    problems.append(str(e))
            for k, v in txn.cursor(self.db_loc):
                loc = Loc.unpack(v)
                try:
                    self.read_frame(loc)
                except CorruptionError as e:
                    problems.append(FrameProblem(str(e), *decode_index_key(k)))
        finally:
            txn.abort()
            self._unpin(segs)
        return problems

    @_open_unit_read
    def keys(self, *, snapshot: Optional[int] = None) -> List[Tuple[int, str]]:
        """All (gidx, field) pairs in the index (at ``snapshot``, or now)."""
        return self._loc_keys(snapshot, lambda ks: [decode_index_key(k) for k in ks])

    @_open_unit_read
    def field_rows(self, *, snapshot: Optional[int] = None) -> dict:
        """field -> sorted int64 gidxs holding it (at ``snapshot``, or now); decoded in bulk,
        the keys read in bulk from the index's pages when the file allows."""
        return self._loc_keys(snapshot, decode_index_keys, bulk=True)

    def _loc_keys(self, snapshot, decode, bulk: bool = False):
        own = snapshot is None
        txn = self.env.begin() if own else self._snapshot_txn(snapshot)
        try:
            try:
                cols = read_columns(self.env, txn, [b"loc"]) if bulk else None
                if cols is not None:
                    c = cols.get(b"loc")
                    return decode(Packed(c.keys, c.key_lens)) if c is not None else {}
                return decode(list(txn.cursor(self.db_loc).iternext(values=False)))
            except RecordError as e:
                raise CorruptionError(f"unit index: malformed loc entry: {e}",
                                      path=str(self.path / "index" / "data.mdb")) from e
        finally:
            if own:
                txn.abort()


class UnitView:
    """A unit's LMDB read transaction pinned to the segments it references (an MVCC cut).

    Held by its unit under a snapshot id (:meth:`Unit.snapshot`); callers name the id."""

    def __init__(self, unit: Any, txn: Any, seg_ids: List[int]) -> None:
        self.unit = unit
        self.txn = txn
        self.seg_ids = seg_ids  # pinned at the cut; their records are decoded when first asked for
        self._segs: Optional[Dict[int, SegInfo]] = None
        self._released = False

    @property
    def segs(self) -> Dict[int, SegInfo]:
        """The cut's segment records, read on first use (the cut pins ids only); CorruptionError if malformed."""
        if self._segs is None:
            self._segs = self.unit._load_segs(self.txn)
        return self._segs

    def release(self) -> None:
        if not self._released:
            self._released = True
            try:
                self.txn.abort()
            finally:
                self.unit._unpin(self.seg_ids)
