"""A unit's shard of a selective dump (:meth:`Unit.export_rows`; docs/FORMAT.md, "Dump directory").

Owner-side I/O: the unit resolves the dumped rows' frames in its snapshot's index, checks
each with the frame-check kernel where it lies (the mapped sealed segment: structure,
exact extent, gidx, end magic, padding, CRC32C and the CRC its index recorded), and writes
them byte for byte, in segment order, with vectored writes straight from the mapping into
the new shard file (one native call per segment, without the GIL:
:class:`tqstore._io.files.Ranges`), then the table, then the file is fsynced.  The shard's CRC32C is not
computed by reading the file back: it is the header's CRC combined with each checked
frame's (from its trailer CRC, which covers all of the frame but its trailer and padding:
:func:`tqstore._native.crc32c_frames`) and the table's.  The asked frames' locations come
from the unit's location cache when it holds them all and is exact for the snapshot's
commit (:mod:`tqstore.unit_locs`), else
from the index: their keys built per field and fetched with one ``getmulti`` (what it gives
is kept in the cache), one unit of the process at a time (:mod:`tqstore._io.gilturn`).  No
frame is decoded or encoded again, and no payload leaves the unit: it answers a
:class:`~tqstore.ports.ShardInfo`.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import _native
from ._format import dump_records as D
from ._format import unit_records as UR
from ._format.frame import DTYPE_AT, _raise_first, check_run
from ._format.index import INDEX_KEY_HEAD, LOC_DTYPE, decode_index_key
from ._io.gilturn import bulk_index
from ._io import files
from ._io.lmdbenv import wrap_errors
from .errors import CorruptionError, InvalidInputError
from .ports import ShardInfo

log = logging.getLogger("tqstore")

#: a shard of at most WRITEBACK_MAX_SHARD bytes is written in groups of about WRITEBACK_BYTES,
#: each group's writeback started at once, so the fsync at the end finds little left (A/B on
#: a 2 GiB store of 4 units, alternating rounds: 10 % of the keys, 55 MB shards, median dump
#: 0.19 s against 0.24 s; 50 %, 270 MB shards, 0.83 s against 1.01 s); a larger shard is
#: written whole, then fsynced (all keys, 520 MB shards: early writeback took 2.3 to 2.6 s
#: against 1.7 to 2.0 s, whatever the group size, with the file preallocated too); the limit
#: sits below the largest shard measured faster, as the turn lies somewhere between the two
WRITEBACK_BYTES = 8 << 20
WRITEBACK_MAX_SHARD = 256 << 20


def export_rows(unit, view, gidxs: Sequence[int], fields: Sequence[Optional[Sequence[str]]], dest: Path, *,
                num_units: int, put_token: int = 0) -> ShardInfo:
    """Write the shard of rows ``gidxs`` (fields ``fields[i]`` of row ``i``; None: every field
    the unit holds for it at the snapshot) as the new file ``dest``.

    Raises:
        InvalidInputError: a gidx that does not live on this unit, or arguments of unequal length.
        CorruptionError: a frame the index names is missing or does not verify (names the
            segment file and offset), or a row lacks a field it was asked for.
        StorageIOError / OSError: the shard could not be written (the caller removes it).
    """
    if len(gidxs) != len(fields):
        raise InvalidInputError(f"unit {unit.unit_id}: export_rows got {len(gidxs)} rows and {len(fields)} field lists")
    bad = [g for g in gidxs if int(g) % num_units != unit.unit_id]
    if bad:
        raise InvalidInputError(f"unit {unit.unit_id} of {num_units}: rows {bad[:5]} do not live here")
    with wrap_errors(f"unit {unit.unit_id} dump", unit.path), bulk_index:  # (one unit of the process at a time)
        locs, gs, names, fids = _resolve(unit, view, gidxs, fields, put_token)
    order = np.lexsort((locs["offset"], locs["seg"]))
    locs, gs, fids = locs[order], gs[order], fids[order]
    table = D.encode_shard_table(gs, locs["length"], locs["crc"], fids, names)
    nbytes = int(locs["length"].astype(np.int64).sum())
    header = D.encode_shard_header(unit.unit_id, num_units, len(locs), nbytes, table)
    bufs: List = [header]
    crc = _native.crc32c(header)  # the shard's CRC32C, as its bytes are laid out
    dtypes = np.zeros(len(locs), np.uint8)  # each frame's dtype code (byte DTYPE_AT of its header)
    try:
        for seg in np.unique(locs["seg"]).tolist():
            sel = locs["seg"] == seg
            ls, ggs = locs[sel], gs[sel]
            m = unit._map_to(seg, int((ls["offset"] + ls["length"]).max()))
            path = unit._seg_path(seg)
            res = check_run(m, ls, ggs)
            _raise_first(m, ls, res, ggs, path=path)
            dtypes[sel] = _bytes_at(m, ls["offset"].astype(np.int64) + DTYPE_AT)
            # (checked: each trailer holds its covered bytes' CRC32C, so only the tails are read)
            crc = _native.crc32c_frames(m, ls["offset"].astype(np.int64), ls["length"].astype(np.int64), crc)
            starts, ends = _runs(ls)
            bufs.append(files.Ranges(m, starts, ends - starts))  # (written without the GIL, no view per frame)
        bufs.append(table)
        crc = _native.crc32c(table, crc)
        want = len(header) + nbytes + len(table)
        early = WRITEBACK_BYTES if want <= WRITEBACK_MAX_SHARD else 0
        size = files.write_buffers(dest, bufs, fsync=False, writeback_bytes=early)
    finally:
        del bufs  # (however this ends: an error's traceback must not pin a mapping)
        m = None  # noqa: F841 - (nor its last mapping: a live mmap holds the segment's file open)
    if size != want:
        raise CorruptionError(f"dump shard holds {size} bytes, {want} were to be written", path=str(dest))
    files.fsync_file(dest)
    rows = len(set(gs.tolist()))
    log.debug("unit %d: dumped %d frames of %d rows (%d bytes) into %s", unit.unit_id, len(locs), rows, nbytes, dest)
    seen = {names[int(f)]: tuple(np.unique(dtypes[fids == f]).tolist()) for f in np.unique(fids).tolist()}
    return ShardInfo(unit.unit_id, str(dest), size, crc, len(locs), rows, nbytes, seen)


def _bytes_at(m, offsets: np.ndarray) -> np.ndarray:
    """The bytes of mapping ``m`` at ``offsets`` (a copy: no view of the mapping outlives the call)."""
    return np.frombuffer(m, np.uint8)[offsets]


def _resolve(unit, view, gidxs, fields, put_token: int):
    """The locations of the asked frames at the snapshot (an unsettled overwriting put's
    replaced entry where the controller never committed it), their gidxs, the field names
    and each frame's name id."""
    txn = view.txn
    put_back: Dict[bytes, bytes] = {}
    for k, v in txn.cursor(db=unit.db_undo):
        tok, ik = UR.decode_undo_key(k)
        if tok > put_token:
            put_back[ik] = bytes(v)
    per: Dict[str, List[int]] = {}  # field -> the rows asked for it, in order
    cur = txn.cursor(db=unit.db_loc)
    for g, fs in zip(gidxs, fields):
        if fs is None:  # every field the unit holds for the row
            g = int(g)
            head = INDEX_KEY_HEAD.pack(g)
            if cur.set_range(head):
                for k, _v in cur:
                    if bytes(k[:8]) != head:
                        break
                    per.setdefault(decode_index_key(bytes(k))[1], []).append(g)
            continue
        for f in fs:
            gl = per.get(f)
            if gl is None:
                gl = per[f] = []
            gl.append(g)
    names = list(per)
    if not put_back:
        cached = _from_cache(unit, txn, per, names)
        if cached is not None:
            return cached
    parts, gparts, fparts = [], [], []
    for fid, f in enumerate(names):
        ga = np.asarray(per[f], dtype=np.uint64)
        keys = _index_keys(ga, f.encode())
        got = cur.getmulti(keys)  # (key, location) of every key found, in the order asked
        if put_back or len(got) != len(keys):
            found = dict(got)
            vals = []
            for ik, g in zip(keys, ga.tolist()):
                v = put_back.get(ik) if put_back else None
                if v is None:
                    v = found.get(ik)
                if v is None:
                    raise CorruptionError(f"unit {unit.unit_id} holds no frame of field {f!r} of row {g}, which "
                                          f"the controller records as produced; run verify on the store",
                                          path=str(unit.path))
                vals.append(v)
        else:
            vals = [v for _k, v in got]
        part = b"".join(vals)
        if not put_back:  # the index's entries at the snapshot: kept for the next dump
            unit.locs.populate(txn.id(), ga, {f: np.frombuffer(part, LOC_DTYPE)})
        parts.append(part)
        gparts.append(ga)
        fparts.append(np.full(len(ga), fid, np.uint32))
    if not parts:
        return np.zeros(0, LOC_DTYPE), np.zeros(0, np.uint64), [], np.zeros(0, np.uint32)
    return (np.frombuffer(b"".join(parts), LOC_DTYPE), np.concatenate(gparts), names, np.concatenate(fparts))


def _from_cache(unit, txn, per: Dict[str, List[int]], names: List[str]):
    """:func:`_resolve`'s answer from the unit's location cache, when it holds every asked frame
    and is exact for the snapshot's commit (``txn.id()``; see :mod:`tqstore.unit_locs`), else None."""
    at = txn.id()
    locs, gparts, fparts = [], [], []
    for fid, f in enumerate(names):
        ga = np.asarray(per[f], dtype=np.int64)
        got = unit.locs.get(ga, [f], at=at)
        if got is None:
            return None
        locs.append(got[f])
        gparts.append(ga.astype(np.uint64))
        fparts.append(np.full(len(ga), fid, np.uint32))
    if not locs:
        return None
    return np.concatenate(locs), np.concatenate(gparts), names, np.concatenate(fparts)


def _index_keys(gidxs: np.ndarray, name: bytes) -> List[bytes]:
    """The index keys ``(gidx, name)`` of many gidxs (u64 big-endian, then the name)."""
    n, w = len(gidxs), 8 + len(name)
    m = np.empty((n, w), np.uint8)
    m[:, :8] = gidxs.astype(">u8").view(np.uint8).reshape(n, 8)
    m[:, 8:] = np.frombuffer(name, np.uint8)
    blob = m.tobytes()
    return [blob[i:i + w] for i in range(0, n * w, w)]


def _runs(locs: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """``(starts, ends)`` (i64 arrays) of the byte ranges of the frames (sorted by offset),
    adjacent frames merged."""
    starts = locs["offset"].astype(np.int64)
    ends = starts + locs["length"].astype(np.int64)
    if not len(locs):
        return starts, ends
    brk = np.flatnonzero(starts[1:] != ends[:-1]) + 1
    first = np.concatenate(([0], brk))
    last = np.concatenate((brk - 1, [len(locs) - 1]))
    return starts[first], ends[last]
