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

import functools
import logging
import os
import threading
from collections import defaultdict
from contextlib import contextmanager
from itertools import chain
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import lmdb
import numpy as np
import zstandard

from . import _native
from ._format.columns import Column, FlatRows, take_rows
from ._format.frame import encode_parts, encode_uniform, run_locs
from ._format.index import INDEX_KEY_HEAD, INDEX_VALUE, Loc
from ._format.layout import CODEC_ZSTD, KIND_VALUE
from ._format.segment import parse_segment_name, segment_name
from ._format import unit_records as UR
from ._format.unit_records import SegInfo, UNIT_INDEX_FORMAT  # noqa: F401 - re-exported (checkpoint code)
from ._io import files
from ._io.lmdbenv import lmdb_commit_point, open_env, put_items, wrap_errors
from ._io.segfile import MmapCache, SegmentWriter
from .errors import CorruptionError, InvalidInputError

from .unit_held import HeldBack
from .unit_snapshots import UnitSnapshots
from .unit_locs import GidxArrays, LocCache, write_sets
from .unit_compact import compact as compact_unit
from .unit_gate import ReadGate
from .unit_read import UnitReader, UnitView
from .unit_restore import install_restore_calls, open_restore_db
from .unit_recover import check_index_format, check_index_present, index_state as _index_state, recover, seg_info as _seg_info  # noqa: F401 - check_index_format re-exported

log = logging.getLogger("tqstore")

BULK_FRAME_BYTES = 4 << 10  # payloads below this are framed in bulk (one native call, copied into one buffer);
# larger ones are framed in place and written from the caller's memory (no copy)
DEFAULT_SEGMENT_BYTES = 256 << 20
RUN_LOCS_MIN = 1024  # a bulk encode of at least this many frames gives the location cache its locations in bulk
COMPACT_LIVE_RATIO = 0.5


_seg_key = UR.seg_key
_undo_key = UR.undo_key


def _as_list(xs: Sequence[int]) -> List[int]:
    return xs if type(xs) is list else list(xs)


def _key_order(bulk: List[Tuple[bytes, List[int], List[Tuple[bytes, bytes]], Optional[np.ndarray]]],
               arrays: GidxArrays) -> Optional[List[Tuple[bytes, bytes]]]:
    """The index items of a write made only of bulk encodes (``(field, gidxs, items, ...)``), in
    ascending key order (gidx big-endian, then field name), or None.  Ordered when the encodes
    are of distinct fields over one strictly ascending list of gidxs: interleaved row by row."""
    gidxs = bulk[0][1] if bulk else None
    if not bulk or any(b[1] is not gidxs and b[1] != gidxs for b in bulk) \
            or len({b[0] for b in bulk}) != len(bulk) or not bool((np.diff(arrays.of(gidxs)) > 0).all()):
        return None
    cols = [b[2] for b in sorted(bulk, key=lambda b: b[0])]
    if len(cols) == 1:
        return cols[0]
    out: List = [None] * (len(cols) * len(gidxs))
    for i, c in enumerate(cols):  # row by row: slice assignments at C speed
        out[i::len(cols)] = c
    return out


class Unit(HeldBack, UnitSnapshots, UnitReader):
    """One storage unit. Thread-safe: appends and index updates are serialised by a lock.

    Implements :class:`tqstore.ports.UnitPort` (the checkpoint export and import are in
    :mod:`tqstore.unit_export` and :mod:`tqstore.unit_import`)."""

    def __init__(self, path: Path, unit_id: int, *, durability: str = "checkpoint",
                 segment_bytes: int = DEFAULT_SEGMENT_BYTES, compress=None,
                 map_bytes: Optional[int] = None, stride: int = 1) -> None:
        self.path = Path(path)
        self.unit_id = unit_id
        self._reads = ReadGate(f"unit {unit_id} at {self.path}")  # (close waits for running reads)
        self.sync = durability == "commit"
        self.segment_bytes = int(segment_bytes)
        self.compress = compress  # None | "zstd" | set of field names
        check_index_present(self.path, unit_id)
        files.mkdir(self.path, exist_ok=True, parents=True)
        kw = {"map_bytes": map_bytes} if map_bytes else {}
        self.env = open_env(self.path / "index", max_dbs=8, sync=self.sync, **kw)
        try:  # (creating a database writes: on a full disk a bare lmdb error before)
            with wrap_errors(f"open unit {unit_id}", self.path):
                check_index_format(self.env, self.path / "index", create=True)
                self.db_loc = self.env.open_db(b"loc")
                self.db_segs = self.env.open_db(b"segs")
                # undo records of overwriting puts not yet settled: token (u64 BE) + index key -> replaced loc
                self.db_undo = self.env.open_db(b"undo")
                self.db_restore = open_restore_db(self.env)  # selective restores (tqstore.unit_restore); None: none yet
        except BaseException:
            self.env.close()
            raise
        self._lock = threading.RLock()
        self._pins: Dict[int, int] = defaultdict(int)
        self.maps = MmapCache(self.path)
        self._zc = zstandard.ZstdCompressor(level=3)
        self._writer: Optional[SegmentWriter] = None
        self._paths: Dict[int, str] = {}
        # segments that may have become sealed with no live bytes (checked by _after_change)
        self._maybe_dead: set = set()
        # snapshots (MVCC cuts) by id: resolved by keys/lookup/locate(snapshot=id), ended by release(id)
        self._views: Dict[int, UnitView] = {}
        self._next_snapshot = 1
        # the index's locations in memory (tqstore.unit_locs); this unit's rows are gidx ≡ unit_id mod ``stride``
        self.locs = LocCache(lambda: self.env.info()["last_txnid"], stride=stride, residue=unit_id)
        self.held_back: Dict[int, Dict[bytes, bytes]] = {}  # (see unit_held)
        try:
            with wrap_errors(f"open unit {unit_id}", self.path):
                recover(self)
        except BaseException:
            if self._writer is not None:
                self._writer.close()
            self.env.close()  # a unit that failed to open must not keep its index open
            raise

    # ------------------------------------------------------------------ open / recovery
    def _seg_id(self, k) -> int:
        try:
            return UR.decode_seg_key(k)
        except UR.RecordError as e:
            raise CorruptionError(f"unit index: malformed segs key {bytes(k)[:40]!r}: {e}",
                                  path=str(self.path / "index" / "data.mdb")) from e

    def _load_segs(self, txn=None) -> Dict[int, SegInfo]:
        own = txn is None
        txn = txn or self.env.begin()
        try:
            ids = ((self._seg_id(k), v) for k, v in txn.cursor(self.db_segs))
            return {seg_id: _seg_info(v, seg_id, self.path) for seg_id, v in ids}
        finally:
            if own:
                txn.abort()

    def _get_seg(self, txn, seg_id: int) -> SegInfo:
        return _seg_info(txn.get(_seg_key(seg_id), db=self.db_segs), seg_id, self.path)

    def _put_seg(self, txn, seg_id: int, info: SegInfo) -> None:
        """Write a segment record; one left sealed with no live bytes is noted for :meth:`_after_change`."""
        txn.put(_seg_key(seg_id), info.pack(), db=self.db_segs)
        if info.sealed and info.live == 0:
            self._maybe_dead.add(seg_id)

    def _set_seg(self, seg_id: int, **changes) -> None:
        with self.env.begin(write=True) as txn:
            info = self._get_seg(txn, seg_id)
            for k, v in changes.items():
                setattr(info, k, v)
            self._put_seg(txn, seg_id, info)

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
        segs = {UR.decode_seg_key(k) for k in txn.cursor(self.db_segs).iternext(values=False)}
        on_disk = {parse_segment_name(n) for n in files.listdir(self.path)} - {None}
        seg_id = max(segs | on_disk | {0}) + 1
        w = SegmentWriter(self.path, self.unit_id, seg_id, create=True)
        if self.sync:
            # the new file's directory entry must be durable before an index commit names it
            files.fsync_dir(self.path)
        self._put_seg(txn, seg_id, SegInfo(w.size, 0, False))
        self._writer = w
        return w

    @contextmanager
    def _appending(self):
        """A write transaction that appends frames to the active segment: committed when the
        block ends (failpoint ``unit_commit`` first); on any error aborted, and the writer,
        whose file may hold an unindexed tail, dropped (:meth:`_after_failure`).  Under the
        unit's lock."""
        txn = self.env.begin(write=True)
        try:
            yield txn
            lmdb_commit_point("unit_commit")
            txn.commit()
        except BaseException:
            txn.abort()
            self._after_failure()
            raise

    def _grown(self, txn, seg_id: int, nbytes: int) -> None:
        """Record ``nbytes`` of live frames appended to segment ``seg_id`` (its size and live bytes)."""
        info = self._get_seg(txn, seg_id)
        info.size += nbytes
        info.live += nbytes
        self._put_seg(txn, seg_id, info)

    def _seal_writer(self, txn) -> None:
        w = self._writer
        if w is None:
            return
        if self.sync:
            w.fsync()
        info = self._get_seg(txn, w.seg_id)
        info.sealed = True
        info.size = w.size
        self._put_seg(txn, w.seg_id, info)
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
                others: List[Tuple[bytes, bytes]] = []  # index items not from bulk encodes
                bulk: List[Tuple[bytes, List[int], List[Tuple[bytes, bytes]], Optional[np.ndarray]]] = []
                # (field, gidxs, items, their LOC_DTYPE locations when computed in bulk)
                off = start
                for col, positions, gidxs in columns:
                    fbytes = col.field.encode()
                    comp = self._compressed(col.field)
                    small_pos, small_gidx, large_pos, large_gidx = [], [], [], []
                    rows = zip(positions, gidxs)
                    if not comp and col.uniform_shape is not None and col.kind != KIND_VALUE and len(positions):
                        # rows of one shape and dtype have one size: sort them once, not row by row
                        if memoryview(col.payloads[positions[0]]).nbytes < BULK_FRAME_BYTES:  # (lists: the columns')
                            small_pos, small_gidx = _as_list(positions), _as_list(gidxs)
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
                            others.append((INDEX_KEY_HEAD.pack(g) + fbytes, INDEX_VALUE.pack(w.seg_id, off, flen, crc)))
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
                            others.append((INDEX_KEY_HEAD.pack(g) + fbytes, INDEX_VALUE.pack(w.seg_id, off, flen, crc)))
                            off += flen
                    if large_pos:  # rows of one shape: the head is built once
                        parts, crcs, flen = encode_uniform(fbytes, col.kind, col.dtype, col.uniform_shape, large_gidx,
                                                           [col.payloads[p] for p in large_pos])
                        bufs += parts
                        key, val, seg = INDEX_KEY_HEAD.pack, INDEX_VALUE.pack, w.seg_id
                        for g, c in zip(large_gidx, crcs):
                            others.append((key(g) + fbytes, val(seg, off, flen, c)))
                            off += flen
                    if small_pos:
                        fl = col.payloads
                        if type(fl) is FlatRows and col.uniform_shape is not None:  # framed from the batch's memory
                            blob, its = _native.encode_rows(fbytes, col.kind, col.dtype, small_gidx, col.uniform_shape,
                                                            fl.flat, fl.row_bytes, small_pos, w.seg_id, off)
                        else:
                            if len(small_pos) == len(fl):
                                pl, sh = fl, col.shapes
                            else:
                                pl = take_rows(fl, small_pos)
                                sh = ([col.uniform_shape] * len(small_pos) if col.uniform_shape is not None
                                      else take_rows(col.shapes, small_pos))
                            blob, its = _native.encode_frames(fbytes, col.kind, col.dtype, small_gidx, sh, pl, 0,
                                                              None, w.seg_id, off)
                        bufs.append(blob)
                        m = len(small_gidx)  # (a short run's locations: its items' values, joined)
                        locs = run_locs(blob, m, w.seg_id, off) if m >= RUN_LOCS_MIN else None
                        bulk.append((fbytes, small_gidx, its, locs))
                        off += len(blob)
                w.append(bufs)
                if self.sync:
                    w.fsync()
                arrays = GidxArrays()
                ordered = _key_order(bulk, arrays) if fresh and not others else None
                items = ordered or list(chain(others, *(b[2] for b in bulk)))
                self._index(txn, items, w.seg_id, off - start, fresh, token, ordered=bool(ordered))
                lmdb_commit_point("unit_commit")
                wid = txn.id()
                txn.commit()
            except BaseException:
                txn.abort()
                self._after_failure()
                raise
            self.locs.committed(wid, lambda: write_sets(bulk, others, arrays))
            self._after_change()
            return off - start

    def _after_failure(self) -> None:
        """After an aborted write: drop the writer, cut the unindexed tail it may have left off
        each segment the index calls active (back to the size the index records), remove files
        the index never named, and seal those segments.  Each step is tried on its own: on a
        full disk the seal's commit fails, and the space of the tail and of a segment file
        made for the write was held until a reopen (every retry left one more file).  The
        next write opens a fresh segment; nothing indexed is touched."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        try:
            segs = self._load_segs()
        except Exception:  # noqa: BLE001 - best effort; reopen repairs the same things
            log.exception("unit %d: cleanup after a failed write could not read the index", self.unit_id)
            return
        steps = [(f"cut segment {s}'s unindexed tail", functools.partial(self._cut_tail, s, info.size))
                 for s, info in segs.items() if not info.sealed]
        steps += [("remove segment files the index does not name", functools.partial(self._drop_unnamed, segs)),
                  ("seal the active segments", functools.partial(self._seal_all, segs))]
        for what, step in steps:
            try:
                step()
            except Exception:  # noqa: BLE001 - best effort; reopen repairs the same things
                log.exception("unit %d: cleanup after a failed write: could not %s", self.unit_id, what)

    def _drop_unnamed(self, segs) -> None:
        """Remove the segment files ``segs`` (the index's) does not name, each on its own."""
        for name in files.listdir(self.path):
            sid = parse_segment_name(name)
            if sid is not None and sid not in segs:
                try:
                    files.unlink(self.path / name)
                except OSError:
                    log.exception("unit %d: could not remove %s after a failed write", self.unit_id, name)

    def _cut_tail(self, seg: int, size: int) -> None:
        p = self._seg_path(seg)
        if os.stat(p).st_size > size:
            files.truncate(p, size)

    def _seal_all(self, segs) -> None:
        with self.env.begin(write=True) as txn:
            for s, info in segs.items():
                if not info.sealed:
                    info.sealed = True
                    self._put_seg(txn, s, info)

    def _index(self, txn, items, seg_id: int, added: int, fresh: bool, token: Optional[int] = None, *,
               ordered: bool = False) -> None:
        """Index a write's ``items``; ``ordered`` (ascending keys) ones above the index's last key are appended."""
        dead: Dict[int, int] = defaultdict(int)
        if fresh:
            put_items(txn.cursor(self.db_loc), items, ascending=ordered)
        else:
            for k, v in items:
                old = txn.replace(k, v, db=self.db_loc)
                if old is not None:
                    if token is not None:
                        txn.put(_undo_key(token, k), bytes(old), db=self.db_undo)
                        continue
                    o = Loc.unpack(old)
                    dead[o.seg] += o.length
        info = self._get_seg(txn, seg_id)
        info.size += added
        info.live += added
        self._put_seg(txn, seg_id, info)
        self._apply_dead(txn, dead)

    def _apply_dead(self, txn, dead: Dict[int, int]) -> None:
        for s, n in dead.items():
            raw = txn.get(_seg_key(s), db=self.db_segs)
            if raw is None:
                continue
            info = _seg_info(raw, s, self.path)
            info.live = max(0, info.live - n)
            self._put_seg(txn, s, info)

    def undo_tokens(self) -> List[int]:
        """Tokens of overwriting puts whose undo records are not settled yet."""
        with self.env.begin() as txn:
            try:
                return sorted({UR.decode_undo_key(k)[0] for k in txn.cursor(self.db_undo).iternext(values=False)})
            except UR.RecordError as e:
                raise CorruptionError(f"unit index: malformed undo entry: {e}",
                                      path=str(self.path / "index" / "data.mdb")) from e

    def _settle(self, token: int, *, committed: bool) -> int:
        """:meth:`HeldBack.settle` without its holding back (see :mod:`tqstore.unit_held`)."""
        prefix = UR.undo_prefix(token)
        with self._lock, wrap_errors(f"unit {self.unit_id} settle", self.path):
            with self.env.begin() as rtxn:
                cur = rtxn.cursor(self.db_undo)
                if not cur.set_range(prefix) or not bytes(cur.key()).startswith(prefix):
                    return 0
            dead: Dict[int, int] = defaultdict(int)
            with self.env.begin(write=True) as txn:
                cur = txn.cursor(self.db_undo)
                recs = []
                if cur.set_range(prefix):
                    for k, v in cur:
                        if not bytes(k).startswith(prefix):
                            break
                        recs.append((bytes(k), bytes(v)))
                for k, old in recs:
                    if committed:
                        o = Loc.unpack(old)
                    else:
                        o = txn.replace(UR.decode_undo_key(k)[1], old, db=self.db_loc)
                        o = Loc.unpack(o) if o is not None else None
                    if o is not None:
                        dead[o.seg] += o.length
                    txn.delete(k, db=self.db_undo)
                self._apply_dead(txn, dead)
                lmdb_commit_point("unit_commit")
                wid = txn.id()
            self.locs.committed(wid) if committed else self.locs.clear()  # (entries put back: forget all)
            self._after_change()
            return len(recs)

    def delete(self, gidxs: Iterable[int], fields: Optional[Iterable[str]] = None) -> int:
        """Drop index entries of rows ``gidxs`` (all fields, or only ``fields``). Returns entries dropped."""
        with self._lock, wrap_errors(f"unit {self.unit_id} delete", self.path):
            dropped = 0
            dead: Dict[int, int] = defaultdict(int)
            gidxs = sorted(set(gidxs))
            fields = None if fields is None else list(fields)
            with self.env.begin(write=True) as txn:
                wid = txn.id()
                cur = txn.cursor(self.db_loc)
                for g in gidxs:
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
            self.locs.committed(wid, drops=(gidxs, fields))
            self._after_change()
            return dropped

    # ------------------------------------------------------------------ segment lifecycle
    def _after_change(self) -> None:
        """Unlink sealed segments with no live bytes and no pin.

        Only segments noted since the last call are looked at: those whose record was
        written sealed with no live bytes (:meth:`_put_seg`), those whose last pin went,
        and, after opening, all of them.  A pinned one is noted again when unpinned."""
        with self._lock:
            if not self._maybe_dead:
                return
            cand, self._maybe_dead = self._maybe_dead, set()
            with self.env.begin() as txn:
                dead = []
                for s in sorted(cand):
                    raw = txn.get(_seg_key(s), db=self.db_segs)
                    if raw is None or self._pins.get(s):
                        continue
                    i = _seg_info(raw, s, self.path)
                    if i.sealed and i.live == 0:
                        dead.append(s)
            if dead:
                self._remove_segments(dead)

    def _remove_segments(self, seg_ids: Sequence[int]) -> None:
        with self._lock:
            with self.env.begin(write=True) as txn:
                for s in seg_ids:
                    txn.delete(_seg_key(s), db=self.db_segs)
                wid = txn.id()
            self.locs.committed(wid)  # (no location changed)
            for s in seg_ids:
                self.maps.drop(s)
                files.unlink(self.path / segment_name(s))
                log.debug("unit %d: unlinked dead segment %d", self.unit_id, s)

    # checkpoints: owner-side export and import (tqstore.unit_export, tqstore.unit_import; see UnitPort)
    def export_snapshot(self, snapshot: int, dest_dir, *, link: bool = True, reuse=None, put_token: int = 0,
                        known_crc=None, index_block_bytes: int = 1 << 20):
        from .unit_export import export_unit

        return export_unit(self, self._view(snapshot), Path(dest_dir), link=link, reuse=reuse or {},
                           put_token=put_token, known_crc=known_crc or {}, index_block_bytes=index_block_bytes)

    def export_rows(self, snapshot: int, gidxs, fields, dest_path, *, num_units: int, put_token: int = 0):
        from .unit_dump import export_rows  # a dump's shard (tqstore.unit_dump; see UnitPort)

        return export_rows(self, self._view(snapshot), gidxs, fields, Path(dest_path), num_units=num_units,
                           put_token=put_token)

    def stage_import(self, target_dir, plan) -> int:
        from .unit_import import stage_reshard, stage_same

        if plan.mode not in ("same", "reshard"):
            raise InvalidInputError(f"unit {self.unit_id}: unknown import mode {plan.mode!r}")
        return stage_same(Path(target_dir), plan) if plan.mode == "same" else \
            stage_reshard(Path(target_dir), plan, self.unit_id, self.segment_bytes)

    def verify_import(self, target_dir, plan) -> int:
        from .unit_import import verify_same

        return verify_same(Path(target_dir), plan) if plan.mode == "same" else 0

    def segments(self) -> Dict[int, SegInfo]:
        return self._load_segs()

    def compact(self, *, live_ratio: float = COMPACT_LIVE_RATIO) -> int:
        """Rewrite the live frames of sealed, unpinned segments whose live/size ratio is
        below ``live_ratio``, and of small ones (less live than 1/16 of ``segment_bytes``)
        when there are two or more, into the active segment (byte copies, CRC-checked), then
        unlink them. Returns the number of segments compacted
        (:func:`tqstore.unit_compact.compact`).  Raises CorruptionError (a frame does not
        check; nothing changed), StorageIOError."""
        return compact_unit(self, live_ratio)

    # ------------------------------------------------------------------ lifecycle
    def index_state(self, *, sync: bool = False) -> Tuple[int, int]:
        """``(entries, commit)`` of the index: its ``loc`` entries and its commit counter (see
        :func:`tqstore.unit_recover.index_state`); ``sync`` flushes the index to disk first."""
        with self._lock, wrap_errors(f"unit {self.unit_id} index state", self.path):
            return _index_state(self, sync=sync)

    def close(self) -> None:
        """Close (idempotent), once the reads running on other threads have ended (closing
        the index or a segment mapping under them would crash the process); snapshots still
        held end with it; reads then raise StoreClosedError."""
        self._reads.close()
        with self._lock:
            for v in self._views.values():
                v._released = True
                try:
                    v.txn.abort()
                except lmdb.Error:
                    pass
            self._views.clear()
            if self._writer is not None:
                self._writer.close()
                self._writer = None
            self.maps.clear()
            self.locs.clear()
            self.env.close()


install_restore_calls(Unit)  # UnitPort's selective restores (tqstore.unit_restore)
