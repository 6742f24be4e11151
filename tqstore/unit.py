"""Storage unit: append-only segment files of record frames plus an LMDB index.

A unit directory holds ``index/`` (LMDB: ``loc`` maps (gidx, field) to (segment, offset,
length, crc); ``segs`` holds each segment's size, live bytes and sealed flag) and
``seg-XXXXXXXX.tqs`` files.  Guarantees:

* a batch is one vectored write to the active segment and one LMDB transaction; the
  index only ever names frames that were fully written before it committed;
* reads verify each frame's CRC32C (unless asked not to) and raise
  :class:`~tqstore.errors.CorruptionError` naming file and offset;
* a sealed segment never changes; a segment with no live bytes and no pin is unlinked;
  a mostly dead sealed one is compacted (its live frames copied byte for byte).
"""
from __future__ import annotations

import json
import logging
import os
import threading
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple

import lmdb
import numpy as np
import zstandard

from . import _native
from ._format.columns import Column
from ._format.frame import (
    Frame, FrameHead, check_rows, decode_frame, decode_frames, encode_parts, encode_uniform, gather_run,
    parse_head,
)
from ._format.layout import (
    ALIGN, CODEC_MASK, CODEC_ZSTD, INDEX_KEY_HEAD, INDEX_VALUE, PREFIX, PREFIX_SIZE, SEGMENT_HEADER_SIZE, TRAILER,
    FRAME_END_MAGIC, FRAME_MAGIC, FRAME_VERSION, KIND_VALUE,
)
from ._format.segment import decode_segment_header, parse_segment_name, segment_name
from ._io import files
from ._io.lmdbenv import lmdb_commit_point, open_env, wrap_errors
from ._io.segfile import MmapCache, SegmentWriter
from .errors import CorruptionError, FormatVersionError, StorageIOError

log = logging.getLogger("tqstore")

SMALL_FRAME_BYTES = 64 << 10  # kept for callers; the read and write paths use the two bounds below
BULK_FRAME_BYTES = 4 << 10  # payloads below this are framed in bulk (one native call, copied into one buffer);
# larger ones are framed in place and written from the caller's memory (no copy)
MMAP_READ_BYTES = 16 << 10  # frames up to this are read through the segment mmap, larger ones with preadv
DEFAULT_SEGMENT_BYTES = 256 << 20
COMPACT_LIVE_RATIO = 0.5
HEAD_READ_BYTES = 640  # covers the largest header (255-byte field name, 32 dims)


# an index value (INDEX_VALUE, "<IQII") as a numpy record, for vectorised lookups
LOC_DTYPE = np.dtype({"names": ["seg", "offset", "length", "crc"], "formats": ["<u4", "<u8", "<u4", "<u4"],
                      "offsets": [0, 4, 12, 16], "itemsize": INDEX_VALUE.size})


def _raise_truncated(path: str, offset: int):
    raise CorruptionError("truncated record frame", path=path, offset=offset)


class Loc(NamedTuple):
    """Where a frame lies: segment id, offset in the segment file, frame length, frame CRC.

    A named tuple: one is made per row and field read, so it must be cheap.
    """

    seg: int
    offset: int
    length: int
    crc: int

    @classmethod
    def unpack(cls, raw: bytes) -> "Loc":
        return cls._make(INDEX_VALUE.unpack(raw))

    def pack(self) -> bytes:
        return INDEX_VALUE.pack(self.seg, self.offset, self.length, self.crc)


@dataclass
class SegInfo:
    size: int
    live: int
    sealed: bool

    def pack(self) -> bytes:
        return json.dumps({"size": self.size, "live": self.live, "sealed": self.sealed}).encode()

    @classmethod
    def unpack(cls, raw: bytes) -> "SegInfo":
        d = json.loads(bytes(raw))
        return cls(int(d["size"]), int(d["live"]), bool(d["sealed"]))


UNIT_INDEX_FORMAT = 1


def check_index_format(env: lmdb.Environment, path: Path, *, create: bool) -> None:
    """Check (or, when ``create`` and absent, record) the unit index format version.

    The version lives under key ``format`` of the ``meta`` database.  Raises
    FormatVersionError for any version other than :data:`UNIT_INDEX_FORMAT`.
    """
    with wrap_errors("open unit index", path):
        if create:
            with env.begin(write=True) as txn:
                db = env.open_db(b"meta", txn=txn)
                raw = txn.get(b"format", db=db)
                if raw is None:
                    txn.put(b"format", str(UNIT_INDEX_FORMAT).encode(), db=db)
                    return
        else:
            with env.begin() as txn:
                try:
                    db = env.open_db(b"meta", txn=txn, create=False)
                except lmdb.NotFoundError:
                    return  # written before the marker existed: version 1
                raw = txn.get(b"format", db=db)
                if raw is None:
                    return
    if bytes(raw) != str(UNIT_INDEX_FORMAT).encode():
        raise FormatVersionError(f"unit index format {bytes(raw)[:16]!r} is not supported (reads "
                                 f"{UNIT_INDEX_FORMAT})", path=str(path))


def _seg_key(seg_id: int) -> bytes:
    return seg_id.to_bytes(4, "big")


def _undo_key(token: int, index_key: bytes) -> bytes:
    return token.to_bytes(8, "big") + bytes(index_key)


class UnitView:
    """A read transaction of a unit pinned to the segments it references (an MVCC cut)."""

    def __init__(self, unit: "Unit", txn: lmdb.Transaction, segs: Dict[int, SegInfo]) -> None:
        self.unit = unit
        self.txn = txn
        self.segs = segs
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            try:
                self.txn.abort()
            finally:
                self.unit._unpin(self.segs)


class Unit:
    """One storage unit. Thread-safe: appends and index updates are serialised by a lock."""

    def __init__(self, path: Path, unit_id: int, *, durability: str = "checkpoint",
                 segment_bytes: int = DEFAULT_SEGMENT_BYTES, compress=None,
                 map_bytes: Optional[int] = None) -> None:
        self.path = Path(path)
        self.unit_id = unit_id
        self.sync = durability == "commit"
        self.segment_bytes = int(segment_bytes)
        self.compress = compress  # None | "zstd" | set of field names
        files.mkdir(self.path, exist_ok=True, parents=True)
        kw = {"map_bytes": map_bytes} if map_bytes else {}
        self.env = open_env(self.path / "index", max_dbs=8, sync=self.sync, **kw)
        check_index_format(self.env, self.path / "index", create=True)
        self.db_loc = self.env.open_db(b"loc")
        self.db_segs = self.env.open_db(b"segs")
        # undo records of overwriting puts not yet settled: token (u64 BE) + index key -> replaced loc
        self.db_undo = self.env.open_db(b"undo")
        self._lock = threading.RLock()
        self._pins: Dict[int, int] = defaultdict(int)
        self.maps = MmapCache(self.path)
        self._zc = zstandard.ZstdCompressor(level=3)
        self._writer: Optional[SegmentWriter] = None
        self._paths: Dict[int, str] = {}
        self._recover()

    # ------------------------------------------------------------------ open / recovery
    def _load_segs(self, txn=None) -> Dict[int, SegInfo]:
        own = txn is None
        txn = txn or self.env.begin()
        try:
            return {int.from_bytes(k, "big"): SegInfo.unpack(v) for k, v in txn.cursor(self.db_segs)}
        finally:
            if own:
                txn.abort()

    def _recover(self) -> None:
        """Make disk agree with the index: cut torn tails, drop stray segment files and
        index entries that point past the end of a (power-loss shortened) segment."""
        segs = self._load_segs()
        on_disk = {parse_segment_name(n): n for n in files.listdir(self.path)}
        on_disk.pop(None, None)
        for seg_id, name in on_disk.items():
            if seg_id not in segs:
                log.info("unit %d: removing segment %s not named by the index", self.unit_id, name)
                files.unlink(self.path / name)
        short = {}
        for seg_id, info in segs.items():
            p = self.path / segment_name(seg_id)
            size = p.stat().st_size if p.exists() else -1
            if size < info.size:
                short[seg_id] = max(size, 0)
        if short:
            self._drop_entries_past(short)
            segs = self._load_segs()
        self._check_segment_headers(segs)
        active = [s for s, i in segs.items() if not i.sealed]
        if active:
            sid = max(active)
            p = self.path / segment_name(sid)
            if p.exists():
                self._writer = SegmentWriter(self.path, self.unit_id, sid, create=False, size=segs[sid].size)
            for s in active:
                if s != sid:
                    self._set_seg(s, sealed=True)

    def _check_segment_headers(self, segs: Dict[int, SegInfo]) -> None:
        """Reject segments of an unknown format version by name (FormatVersionError).

        A damaged header is only logged: its frames are checked on every read anyway."""
        for seg_id in segs:
            p = self.path / segment_name(seg_id)
            try:
                with open(p, "rb") as f:
                    decode_segment_header(f.read(SEGMENT_HEADER_SIZE), path=str(p))
            except FormatVersionError:
                raise
            except (OSError, CorruptionError) as e:
                log.warning("unit %d: segment header of %s does not check: %s", self.unit_id, p.name, e)

    def _drop_entries_past(self, short: Dict[int, int]) -> None:
        log.warning("unit %d: segments %s are shorter than recorded (power loss?); dropping the rows "
                    "past their end", self.unit_id, sorted(short))
        with self.env.begin(write=True) as txn:
            cur = txn.cursor(self.db_loc)
            drop = [k for k, v in cur if Loc.unpack(v).seg in short
                    and Loc.unpack(v).offset + Loc.unpack(v).length > short[Loc.unpack(v).seg]]
            for k in drop:
                txn.delete(k, db=self.db_loc)
            for seg_id, size in short.items():
                raw = txn.get(_seg_key(seg_id), db=self.db_segs)
                info = SegInfo.unpack(raw)
                if size < SEGMENT_HEADER_SIZE:
                    txn.delete(_seg_key(seg_id), db=self.db_segs)
                    files.unlink(self.path / segment_name(seg_id))
                else:
                    info.size = size
                    info.sealed = True
                    txn.put(_seg_key(seg_id), info.pack(), db=self.db_segs)
        self._recompute_live()

    def _recompute_live(self) -> None:
        with self.env.begin(write=True) as txn:
            live: Dict[int, int] = defaultdict(int)
            for _k, v in txn.cursor(self.db_loc):
                loc = Loc.unpack(v)
                live[loc.seg] += loc.length
            for _k, v in txn.cursor(self.db_undo):  # frames an unsettled put may put back
                loc = Loc.unpack(v)
                live[loc.seg] += loc.length
            for k, v in list(txn.cursor(self.db_segs)):
                info = SegInfo.unpack(v)
                info.live = live.get(int.from_bytes(k, "big"), 0)
                txn.put(k, info.pack(), db=self.db_segs)

    def _set_seg(self, seg_id: int, **changes) -> None:
        with self.env.begin(write=True) as txn:
            info = SegInfo.unpack(txn.get(_seg_key(seg_id), db=self.db_segs))
            for k, v in changes.items():
                setattr(info, k, v)
            txn.put(_seg_key(seg_id), info.pack(), db=self.db_segs)

    # ------------------------------------------------------------------ writing
    def _compressed(self, field: str) -> bool:
        c = self.compress
        if not c:
            return False
        if c == "zstd":
            return True
        return field in c

    def _active(self, txn) -> SegmentWriter:
        w = self._writer
        if w is not None and w.size < self.segment_bytes:
            return w
        if w is not None:
            self._seal_writer(txn)
        segs = {int.from_bytes(k, "big") for k, _ in txn.cursor(self.db_segs)}
        on_disk = {parse_segment_name(n) for n in files.listdir(self.path)} - {None}
        seg_id = max(segs | on_disk | {0}) + 1
        w = SegmentWriter(self.path, self.unit_id, seg_id, create=True)
        if self.sync:
            # the new file's directory entry must be durable before an index commit names it
            files.fsync_dir(self.path)
        txn.put(_seg_key(seg_id), SegInfo(w.size, 0, False).pack(), db=self.db_segs)
        self._writer = w
        return w

    def _seal_writer(self, txn) -> None:
        w = self._writer
        if w is None:
            return
        if self.sync:
            w.fsync()
        raw = txn.get(_seg_key(w.seg_id), db=self.db_segs)
        info = SegInfo.unpack(raw)
        info.sealed = True
        info.size = w.size
        txn.put(_seg_key(w.seg_id), info.pack(), db=self.db_segs)
        w.close()
        self._writer = None

    def write(self, columns: Sequence[Tuple[Column, Sequence[int], Sequence[int]]], *, fresh: bool = False,
              token: Optional[int] = None) -> int:
        """Append the given rows and index them in one transaction.

        ``columns`` holds ``(column, row_positions, gidxs)``: rows ``row_positions`` of the
        column go to global indexes ``gidxs``.  ``fresh=True`` promises no (gidx, field)
        already exists (skips reading old entries).  With ``token``, every entry this write
        replaces is kept in an undo record (its frame stays live) until :meth:`settle` says
        whether the put was committed.  Returns bytes appended.

        Raises:
            StorageIOError: the write or commit failed; the index is unchanged.
        """
        with self._lock, wrap_errors(f"unit {self.unit_id} write", self.path):
            txn = self.env.begin(write=True)
            try:
                w = self._active(txn)
                start = w.size
                bufs: List = []
                items: List[Tuple[bytes, bytes]] = []
                off = start
                for col, positions, gidxs in columns:
                    fbytes = col.field.encode()
                    comp = self._compressed(col.field)
                    small_pos, small_gidx, large_pos, large_gidx = [], [], [], []
                    rows = zip(positions, gidxs)
                    if not comp and col.uniform_shape is not None and col.kind != KIND_VALUE and len(positions):
                        # rows of one shape and dtype have one size: sort them once, not row by row
                        if memoryview(col.payloads[positions[0]]).nbytes < BULK_FRAME_BYTES:
                            small_pos, small_gidx = list(positions), list(gidxs)
                        else:
                            large_pos, large_gidx = list(positions), list(gidxs)
                        rows = ()
                    for pos, g in rows:
                        payload = col.payloads[pos]
                        if comp:
                            raw = memoryview(payload).cast("B")
                            z = self._zc.compress(raw)
                            head, tail, crc, flen = encode_parts(fbytes, col.kind, col.dtype, g, col.shapes[pos], z,
                                                                 CODEC_ZSTD, raw.nbytes)
                            bufs += [head, z, tail]
                            items.append((INDEX_KEY_HEAD.pack(g) + fbytes, INDEX_VALUE.pack(w.seg_id, off, flen, crc)))
                            off += flen
                        elif memoryview(payload).nbytes < BULK_FRAME_BYTES:
                            small_pos.append(pos)
                            small_gidx.append(g)
                        elif col.uniform_shape is not None and col.kind != KIND_VALUE:  # values vary in length
                            large_pos.append(pos)
                            large_gidx.append(g)
                        else:
                            head, tail, crc, flen = encode_parts(fbytes, col.kind, col.dtype, g, col.shapes[pos],
                                                                 payload)
                            bufs += [head, payload, tail]
                            items.append((INDEX_KEY_HEAD.pack(g) + fbytes, INDEX_VALUE.pack(w.seg_id, off, flen, crc)))
                            off += flen
                    if large_pos:  # rows of one shape: the head is built once
                        parts, crcs, flen = encode_uniform(fbytes, col.kind, col.dtype, col.uniform_shape, large_gidx,
                                                           [col.payloads[p] for p in large_pos])
                        bufs += parts
                        key, val, seg = INDEX_KEY_HEAD.pack, INDEX_VALUE.pack, w.seg_id
                        for g, c in zip(large_gidx, crcs):
                            items.append((key(g) + fbytes, val(seg, off, flen, c)))
                            off += flen
                    if small_pos:
                        if len(small_pos) == len(col.payloads):
                            pl, sh = col.payloads, col.shapes
                        else:
                            pl = [col.payloads[p] for p in small_pos]
                            sh = [col.shapes[p] for p in small_pos]
                        blob, its = _native.encode_frames(fbytes, col.kind, col.dtype, small_gidx, sh, pl, 0, None,
                                                          w.seg_id, off)
                        bufs.append(blob)
                        items.extend(its)
                        off += len(blob)
                w.append(bufs)
                if self.sync:
                    w.fsync()
                self._index(txn, items, w.seg_id, off - start, fresh, token)
                lmdb_commit_point("unit_commit")
                txn.commit()
            except BaseException:
                txn.abort()
                self._after_failure()
                raise
            self._after_change()
            return off - start

    def _after_failure(self) -> None:
        """After an aborted write: drop the writer (its file may hold an unindexed tail), seal
        every segment the index still calls active, and remove files the index never named.
        The next write opens a fresh segment; nothing indexed is touched."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        try:
            segs = self._load_segs()
            with self.env.begin(write=True) as txn:
                for s, info in segs.items():
                    if not info.sealed:
                        info.sealed = True
                        txn.put(_seg_key(s), info.pack(), db=self.db_segs)
            for name in files.listdir(self.path):
                sid = parse_segment_name(name)
                if sid is not None and sid not in segs:
                    files.unlink(self.path / name)
        except Exception:  # noqa: BLE001 - best effort; reopen repairs the same things
            log.exception("unit %d: cleanup after a failed write did not finish", self.unit_id)

    def _index(self, txn, items, seg_id: int, added: int, fresh: bool, token: Optional[int] = None) -> None:
        dead: Dict[int, int] = defaultdict(int)
        if fresh:
            txn.cursor(self.db_loc).putmulti(items)
        else:
            for k, v in items:
                old = txn.replace(k, v, db=self.db_loc)
                if old is not None:
                    if token is not None:
                        txn.put(_undo_key(token, k), bytes(old), db=self.db_undo)
                        continue
                    o = Loc.unpack(old)
                    dead[o.seg] += o.length
        info = SegInfo.unpack(txn.get(_seg_key(seg_id), db=self.db_segs))
        info.size += added
        info.live += added
        txn.put(_seg_key(seg_id), info.pack(), db=self.db_segs)
        self._apply_dead(txn, dead)

    def _apply_dead(self, txn, dead: Dict[int, int]) -> None:
        for s, n in dead.items():
            raw = txn.get(_seg_key(s), db=self.db_segs)
            if raw is None:
                continue
            info = SegInfo.unpack(raw)
            info.live = max(0, info.live - n)
            txn.put(_seg_key(s), info.pack(), db=self.db_segs)

    def undo_tokens(self) -> List[int]:
        """Tokens of overwriting puts whose undo records are not settled yet."""
        with self.env.begin() as txn:
            return sorted({int.from_bytes(bytes(k[:8]), "big")
                           for k in txn.cursor(self.db_undo).iternext(values=False)})

    def settle(self, token: int, *, committed: bool) -> int:
        """Settle the overwriting put ``token``: committed, the frames it replaced become dead;
        not committed, the replaced entries are put back (its new frames become dead).
        Returns the undo records settled."""
        prefix = token.to_bytes(8, "big")
        with self._lock, wrap_errors(f"unit {self.unit_id} settle", self.path):
            with self.env.begin() as rtxn:
                cur = rtxn.cursor(self.db_undo)
                if not cur.set_range(prefix) or bytes(cur.key()[:8]) != prefix:
                    return 0
            dead: Dict[int, int] = defaultdict(int)
            with self.env.begin(write=True) as txn:
                cur = txn.cursor(self.db_undo)
                recs = []
                if cur.set_range(prefix):
                    for k, v in cur:
                        if bytes(k[:8]) != prefix:
                            break
                        recs.append((bytes(k), bytes(v)))
                for k, old in recs:
                    if committed:
                        o = Loc.unpack(old)
                    else:
                        o = txn.replace(k[8:], old, db=self.db_loc)
                        o = Loc.unpack(o) if o is not None else None
                    if o is not None:
                        dead[o.seg] += o.length
                    txn.delete(k, db=self.db_undo)
                self._apply_dead(txn, dead)
                lmdb_commit_point("unit_commit")
            self._after_change()
            return len(recs)

    def delete(self, gidxs: Iterable[int], fields: Optional[Iterable[str]] = None) -> int:
        """Drop index entries of rows ``gidxs`` (all fields, or only ``fields``). Returns entries dropped."""
        with self._lock, wrap_errors(f"unit {self.unit_id} delete", self.path):
            dropped = 0
            dead: Dict[int, int] = defaultdict(int)
            with self.env.begin(write=True) as txn:
                cur = txn.cursor(self.db_loc)
                for g in sorted(set(gidxs)):
                    head = INDEX_KEY_HEAD.pack(g)
                    if fields is not None:
                        keys = [head + f.encode() for f in fields]
                        for k in keys:
                            v = txn.pop(k, db=self.db_loc)
                            if v is not None:
                                dead[Loc.unpack(v).seg] += Loc.unpack(v).length
                                dropped += 1
                        continue
                    if not cur.set_range(head):
                        continue
                    while cur.key()[:8] == head:
                        loc = Loc.unpack(cur.value())
                        dead[loc.seg] += loc.length
                        dropped += 1
                        if not cur.delete():
                            break
                self._apply_dead(txn, dead)
                lmdb_commit_point("unit_commit")
            self._after_change()
            return dropped

    def keys(self, txn=None) -> List[Tuple[int, str]]:
        """All (gidx, field) pairs in the index."""
        own = txn is None
        txn = txn or self.env.begin()
        try:
            return [(INDEX_KEY_HEAD.unpack(k[:8])[0], bytes(k[8:]).decode()) for k in txn.cursor(self.db_loc).iternext(values=False)]
        finally:
            if own:
                txn.abort()

    # ------------------------------------------------------------------ segment lifecycle
    def _after_change(self) -> None:
        """Unlink sealed segments with no live bytes and no pin."""
        segs = self._load_segs()
        dead = [s for s, i in segs.items() if i.sealed and i.live == 0 and not self._pins.get(s)]
        if dead:
            self._remove_segments(dead)

    def _remove_segments(self, seg_ids: Sequence[int]) -> None:
        with self._lock:
            with self.env.begin(write=True) as txn:
                for s in seg_ids:
                    txn.delete(_seg_key(s), db=self.db_segs)
            for s in seg_ids:
                self.maps.drop(s)
                files.unlink(self.path / segment_name(s))
                log.debug("unit %d: unlinked dead segment %d", self.unit_id, s)

    def seal(self) -> Optional[int]:
        """Seal the active segment (if any holds frames). Returns its id or None."""
        with self._lock, wrap_errors(f"unit {self.unit_id} seal", self.path):
            w = self._writer
            if w is None:
                return None
            if w.size <= SEGMENT_HEADER_SIZE:
                return None
            with self.env.begin(write=True) as txn:
                self._seal_writer(txn)
            return w.seg_id

    def snapshot(self) -> UnitView:
        """Seal the active segment and open a read transaction pinned to its segments.

        Call under the store's cut lock. Release the view when done.
        """
        with self._lock:
            self.seal()
            txn = self.env.begin(buffers=False)
            segs = self._load_segs(txn)
            for s in segs:
                self._pins[s] += 1
            return UnitView(self, txn, segs)

    def _unpin(self, segs: Dict[int, SegInfo]) -> None:
        with self._lock:
            for s in segs:
                self._pins[s] -= 1
                if self._pins[s] <= 0:
                    del self._pins[s]
        self._after_change()

    def pinned(self) -> Dict[int, int]:
        return dict(self._pins)

    def segments(self) -> Dict[int, SegInfo]:
        return self._load_segs()

    def compact(self, *, live_ratio: float = COMPACT_LIVE_RATIO) -> int:
        """Rewrite the live frames of sealed, unpinned segments whose live/size ratio is
        below ``live_ratio`` into the active segment (byte copies, CRC-checked), then unlink
        them. Returns the number of segments compacted."""
        with self._lock, wrap_errors(f"unit {self.unit_id} compact", self.path):
            if self.undo_tokens():
                return 0  # an unsettled overwriting put may still put frames back
            segs = self._load_segs()
            victims = [s for s, i in segs.items() if i.sealed and not self._pins.get(s) and i.size > SEGMENT_HEADER_SIZE
                       and i.live < live_ratio * (i.size - SEGMENT_HEADER_SIZE)]
            if not victims:
                return 0
            vset = set(victims)
            with self.env.begin(write=True) as txn:
                moving = [(bytes(k), Loc.unpack(v)) for k, v in txn.cursor(self.db_loc) if Loc.unpack(v).seg in vset]
                w = self._active(txn)
                start = w.size
                off = start
                bufs, items = [], []
                for k, loc in moving:
                    m = self.maps.get(loc.seg, loc.offset + loc.length)
                    fr = decode_frame(m, loc.offset, loc.length, path=str(self.path / segment_name(loc.seg)),
                                      expected_crc=loc.crc)
                    bufs.append(memoryview(m)[loc.offset:loc.offset + loc.length])
                    items.append((k, INDEX_VALUE.pack(w.seg_id, off, loc.length, fr.crc)))
                    off += loc.length
                w.append(bufs)
                if self.sync:
                    w.fsync()
                txn.cursor(self.db_loc).putmulti(items)
                info = SegInfo.unpack(txn.get(_seg_key(w.seg_id), db=self.db_segs))
                info.size += off - start
                info.live += off - start
                txn.put(_seg_key(w.seg_id), info.pack(), db=self.db_segs)
                for s in victims:
                    raw = txn.get(_seg_key(s), db=self.db_segs)
                    i = SegInfo.unpack(raw)
                    i.live = 0
                    txn.put(_seg_key(s), i.pack(), db=self.db_segs)
                lmdb_commit_point("unit_commit")
            del bufs
            self._after_change()
            log.info("unit %d: compacted %d segments (%d frames moved)", self.unit_id, len(victims), len(items))
            return len(victims)

    # ------------------------------------------------------------------ reading
    def lookup(self, gidxs: Sequence[int], field: str, txn=None) -> List[Optional[Loc]]:
        """Locations of ``field`` for each gidx (None where absent)."""
        f = field.encode()
        own = txn is None
        txn = txn or self.env.begin()
        try:
            out = []
            get = txn.get
            db = self.db_loc
            key = INDEX_KEY_HEAD.pack
            unpack = INDEX_VALUE.unpack
            make = Loc._make
            for g in gidxs:
                v = get(key(g) + f, db=db)
                out.append(None if v is None else make(unpack(v)))
            return out
        finally:
            if own:
                txn.abort()

    def lookup_array(self, gidxs: Sequence[int], field: str, txn=None,
                     key_heads: Optional[Sequence[bytes]] = None) -> Optional[np.ndarray]:
        """Locations of ``field`` for each gidx as one :data:`LOC_DTYPE` array (one native
        multi-get); None when some gidx has no entry (use :meth:`lookup` to see which).
        ``key_heads`` may give the packed gidxs (``INDEX_KEY_HEAD``) when reading many fields."""
        f = field.encode()
        if key_heads is None:
            key = INDEX_KEY_HEAD.pack
            keys = [key(g) + f for g in gidxs]
        else:
            keys = [h + f for h in key_heads]
        own = txn is None
        txn = txn or self.env.begin()
        try:
            pairs = txn.cursor(self.db_loc).getmulti(keys)
        finally:
            if own:
                txn.abort()
        if len(pairs) != len(keys):
            return None
        return np.frombuffer(b"".join([v for _k, v in pairs]), LOC_DTYPE)

    def read_uniform_mapped(self, locs: np.ndarray, gidxs: np.ndarray, template: Tuple[bytes, bytes],
                            payload_start: int, payload_len: int, out: np.ndarray, rows: np.ndarray, *,
                            verify: bool = True) -> bool:
        """Copy the payloads of frames of one length and one expected head into ``out[rows]``.

        ``locs`` is a :data:`LOC_DTYPE` array, ``gidxs`` u64 and ``rows`` i64 arrays, ``out``
        a writable C-contiguous ``(n, payload_len)`` uint8 array.  Works on the segment mmaps:
        one :func:`~tqstore._format.frame.gather_run` per segment checks every frame (head
        against ``template``, gidx, trailer, index CRC, padding, CRC32C) and copies its payload,
        in one native pass.  Returns False when a head differs from ``template`` (read the frames
        with :meth:`read_small`).

        Raises:
            CorruptionError: a frame is truncated, torn or fails its CRC32C.
        """
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

    def _map_to(self, seg: int, end: int):
        try:
            return self.maps.get(seg, end)
        except (FileNotFoundError, EOFError) as e:
            raise CorruptionError(f"segment missing or truncated: {e}", path=self._seg_path(seg)) from e

    def _map(self, loc: Loc):
        try:
            return self.maps.get(loc.seg, loc.offset + loc.length)
        except (FileNotFoundError, EOFError) as e:
            raise CorruptionError(f"segment missing or truncated: {e}", path=self._seg_path(loc.seg),
                                  offset=loc.offset) from e

    def read_frame(self, loc: Loc, *, verify: bool = True) -> Frame:
        """The verified frame at ``loc``; its payload is a zero-copy view of the mmapped segment."""
        m = self._map(loc)
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

    def read_heads(self, locs: Sequence[Loc]) -> List[FrameHead]:
        """Parse the head of each frame with a small positional read (no mapping of payloads)."""
        out = []
        fds: Dict[int, int] = {}
        try:
            for loc in locs:
                fd = self._fd(fds, loc.seg)
                raw = os.pread(fd, min(loc.length, HEAD_READ_BYTES), loc.offset)
                out.append(parse_head(raw, 0, loc.length if len(raw) == min(loc.length, HEAD_READ_BYTES) else None,
                                      path=self._seg_path(loc.seg)) if len(raw) >= PREFIX_SIZE else
                           _raise_truncated(self._seg_path(loc.seg), loc.offset))
        finally:
            for fd in fds.values():
                os.close(fd)
        return out

    def read_head_raw(self, loc: Loc) -> Tuple[FrameHead, bytes]:
        """The parsed head of the frame at ``loc`` and its bytes up to the payload start."""
        (h,) = self.read_heads([loc])
        fds: Dict[int, int] = {}
        try:
            raw = os.pread(self._fd(fds, loc.seg), h.payload_start, loc.offset)
        finally:
            for fd in fds.values():
                os.close(fd)
        if len(raw) != h.payload_start:
            _raise_truncated(self._seg_path(loc.seg), loc.offset)
        return h, raw

    def _fd(self, fds: Dict[int, int], seg: int) -> int:
        fd = fds.get(seg)
        if fd is None:
            try:
                fd = fds[seg] = os.open(self._seg_path(seg), os.O_RDONLY)
            except FileNotFoundError as e:
                raise CorruptionError("segment file missing", path=self._seg_path(seg)) from e
        return fd

    def read_into(self, locs: Sequence[Loc], heads: Sequence[FrameHead], dests: Sequence, *,
                  verify: bool = True) -> None:
        """Read each raw frame's payload straight into the writable buffer ``dests[i]``.

        One ``preadv`` per frame (head, destination, trailer); the CRC32C is checked over
        what landed.  Compressed frames are decompressed into the destination.
        Raises CorruptionError on any mismatch (the destination content is then undefined).
        """
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
                if (end + TRAILER.size + ALIGN - 1) & ~(ALIGN - 1) != loc.length:
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

    def read_small(self, locs: Sequence[Loc], gidxs: Sequence[int], *, verify: bool = True) -> List[Tuple[FrameHead, object]]:
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

    def read_uniform_into(self, locs: np.ndarray, gidxs: np.ndarray, template: Tuple[bytes, bytes],
                          payload_start: int, payload_len: int, out: np.ndarray, rows: np.ndarray, *,
                          verify: bool = True) -> bool:
        """Read raw frames of one length and one expected head straight into ``out[rows]``.

        ``locs`` is a :data:`LOC_DTYPE` array, ``out`` a C-contiguous writable
        ``(n, payload_len)`` uint8 array.  Frames adjacent on disk are read with one
        vectored read (heads and trailers into a scratch buffer, payloads into ``out``),
        then checked (vectorised) against ``template`` (see
        :func:`~tqstore._format.frame.head_template`), the index and their CRC32C.
        Returns False when a frame's head differs from the template (another shape or
        dtype with the same length): read those rows with :meth:`read_heads` and
        :meth:`read_into` instead.

        Raises:
            CorruptionError: a frame is truncated, torn or fails its CRC32C.
        """
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

    def verify(self) -> List[str]:
        """Check every indexed frame and segment header; returns one line per problem."""
        problems = []
        segs = self._load_segs()
        for s in segs:
            p = self.path / segment_name(s)
            try:
                with open(p, "rb") as f:
                    decode_segment_header(f.read(SEGMENT_HEADER_SIZE), path=str(p))
            except (OSError, CorruptionError) as e:
                problems.append(str(e))
        with self.env.begin() as txn:
            for k, v in txn.cursor(self.db_loc):
                loc = Loc.unpack(v)
                try:
                    self.read_frame(loc)
                except CorruptionError as e:
                    problems.append(str(e))
        return problems

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        with self._lock:
            if self._writer is not None:
                self._writer.close()
                self._writer = None
            self.maps.clear()
            self.env.close()
