"""Reading a dump for a load: every check made before anything is written, and the plan of
what each target unit imports (docs/FORMAT.md, "Dump directory", "Selective restores").

:func:`read_dump` checks the manifest (format, version, checksum), ``rows.json`` (its size
and CRC32C as the manifest records them, then its contents), every shard's size, header
(its CRC32C) and table (its CRC32C), the shards' frames against the row index (each
``(gidx, field)`` a produced field of a dumped row on that shard's unit, and every produced
field present), and that every frame lies inside its shard.  The frames themselves (the
bytes between header and table) are read and checked by the target units as they import
them (the frame-check kernel with the CRC32C the table records, and the frame's field name):
with the header's and the table's CRC32C that covers every byte of the shard, so the
whole-file CRC32C of the manifest is not computed again.

:func:`plan_imports` is pure: the frames routed to target unit ``gidx % M`` (gidx the store's,
from the restore's key mapping), as :class:`~tqstore.ports.RestoreImport` values.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from .. import _native
from .._format import dump_records as D
from .._io import files
from ..errors import CheckpointNotFoundError, CorruptionError, StorageIOError
from ..ports import RestoreImport, RestoreInfo

#: bytes of a source file a target unit reads, checks and appends at a time (x units in
#: parallel, at most 8: the memory a load adds stays well under 256 MiB)
BATCH_BYTES = 4 << 20
#: bytes of a dump's shards the loader asks the kernel to read ahead at the start of a load
PREFETCH_BYTES = 1 << 30


@dataclass
class Shard:
    """One checked shard: its path relative to the dump, size, header and table."""

    unit: int
    path: str
    size: int
    header: D.ShardHeader
    table: D.ShardTable


@dataclass
class Dump:
    """A checked dump directory (nothing of the payload read yet)."""

    path: Path
    manifest: Dict
    rows: D.RowIndex
    shards: List[Shard]
    used: Optional[frozenset] = None  # the fields some dumped row produced (None: not known yet)

    @property
    def partition_id(self) -> str:
        return self.rows.partition_id

    @property
    def frames(self) -> int:
        return sum(s.header.frames for s in self.shards)

    @property
    def payload_bytes(self) -> int:
        return sum(int(s.table.entries["length"].sum()) for s in self.shards)

    def restore_rows(self) -> List[Tuple[str, int, object, List[str]]]:
        """``(key, source gidx, tag, produced fields)`` in dump order (begin_restore's rows)."""
        ri = self.rows
        return list(zip(ri.keys, ri.gidxs, ri.tags, ri.fields))

    def schema(self) -> Dict[str, Tuple[int, int]]:
        """The schemas of the fields some dumped row produced (the only ones a load merges)."""
        used = self.used if self.used is not None else {f for fs in self.rows.fields for f in fs}
        return {f: kd for f, kd in self.rows.schemas.items() if f in used}


def _read(path: Path, under: Path, offset: int, size: int, *, what: str) -> bytes:
    with _reading(path, what):
        fd = files.open_regular(path, under=under)
        try:
            buf = bytearray(size)
            got = files.preadv_all(fd, [buf], offset)
        finally:
            os.close(fd)
    if got != size:
        raise CorruptionError(f"{what} is truncated", path=str(path), offset=offset + got)
    return bytes(buf)


def _size(path: Path, under: Path, *, what: str) -> int:
    with _reading(path, what):
        return files.check_regular(path, under=under).st_size


@contextlib.contextmanager
def _reading(path: Path, what: str) -> Iterator[None]:
    """The errors of reading ``path`` (``what`` of a dump) as tqstore's: missing or not a
    regular file, CorruptionError; any other failure (no permission, an I/O error),
    StorageIOError naming the file."""
    try:
        yield
    except FileNotFoundError as e:
        raise CorruptionError(f"{what} listed in the dump's MANIFEST.json is missing", path=str(path)) from e
    except files.NotRegularFile as e:
        raise CorruptionError(f"{what}: {e.strerror}", path=str(e.filename or path)) from e
    except OSError as e:
        raise StorageIOError(f"{what} {path} cannot be read: {e.strerror or e}") from e


def read_dump(path) -> Dump:
    """Check the dump at ``path`` (see the module docstring); reads no frame.

    Raises:
        CheckpointNotFoundError: no directory or no MANIFEST.json (a FileNotFoundError).
        FormatVersionError: a manifest, row index or shard of another version.
        CorruptionError: anything else that does not check (names the file, and the offset
            where known): a missing or truncated shard or row index, a CRC32C mismatch, a shard
            whose frames are not the row index's produced fields.
        StorageIOError: a file of the dump cannot be read (no permission, an I/O error).
    """
    d = Path(path)
    mp = d / D.MANIFEST_NAME
    try:
        msize = files.check_regular(mp, under=d).st_size
    except FileNotFoundError as e:
        raise CheckpointNotFoundError(f"no dump at {d}: {D.MANIFEST_NAME} is missing") from e
    except NotADirectoryError as e:
        raise CheckpointNotFoundError(f"no dump at {d}: it is not a directory") from e
    except files.NotRegularFile as e:
        raise CorruptionError(f"dump {D.MANIFEST_NAME}: not a regular file", path=str(mp)) from e
    except OSError as e:
        raise StorageIOError(f"dump {mp} cannot be read: {e.strerror or e}") from e
    if msize > D.MAX_JSON_BYTES:
        raise CorruptionError(f"dump {D.MANIFEST_NAME} is {msize} bytes (at most {D.MAX_JSON_BYTES})", path=str(mp))
    man = D.decode_manifest(_read(mp, d, 0, msize, what="dump MANIFEST.json"), path=str(mp))
    ri = man["row_index"]
    rp = d / D.ROW_INDEX_NAME
    rsize = _size(rp, d, what="dump row index")
    if rsize > D.MAX_JSON_BYTES:
        raise CorruptionError(f"dump row index is {rsize} bytes (at most {D.MAX_JSON_BYTES})", path=str(rp))
    if rsize != ri["size"]:
        raise CorruptionError(f"dump row index holds {rsize} bytes, the manifest says {ri['size']}", path=str(rp),
                              offset=min(rsize, ri["size"]))
    raw = _read(rp, d, 0, rsize, what="dump row index")
    crc = _native.crc32c(raw)
    if crc != ri["crc32c"]:
        raise CorruptionError("dump row index: CRC32C mismatch", path=str(rp), expected_crc=ri["crc32c"],
                              actual_crc=crc)
    rows = D.decode_row_index(raw, path=str(rp))
    nu = man["num_units"]
    if rows.partition_id != man["partition_id"] or rows.num_units != nu:
        raise CorruptionError("dump row index names another partition or unit count than its manifest", path=str(rp))
    code = {f: i for i, f in enumerate(rows.schemas)}  # every produced field has a schema (decode_row_index)
    by_fields: Dict[tuple, List[int]] = {}  # a row's produced fields -> the rows (gidx) that have them
    for g, fs in zip(rows.gidxs, rows.fields):
        if fs:
            by_fields.setdefault(tuple(fs), []).append(g)
    want = _frames_wanted(by_fields, code, nu)  # source unit -> the (gidx, field code) of its frames
    shards: List[Shard] = []
    listed = {s["unit"] for s in man["shards"]}
    lacking = sorted(set(want) - listed)
    if lacking:
        raise CorruptionError(f"dump lists no shard of source units {lacking[:5]}, which hold dumped rows' fields",
                              path=str(mp))
    for s in man["shards"]:
        sp = d / s["path"]
        size = _size(sp, d, what="dump shard")
        if size != s["size"]:
            raise CorruptionError(f"dump shard holds {size} bytes, the manifest says {s['size']} (truncated?)",
                                  path=str(sp), offset=min(size, s["size"]))
        head = D.decode_shard_header(_read(sp, d, 0, D.SHARD_HEADER_SIZE, what="dump shard"), path=str(sp),
                                     file_size=size)
        if head.unit != s["unit"] or head.num_units != nu or head.frames != s["frames"]:
            raise CorruptionError("dump shard header disagrees with the manifest (unit, unit count or frames)",
                                  path=str(sp), offset=0)
        if head.frames != len(want.get(head.unit, ([],))[0]):  # (before its table is read: it may claim any size)
            raise CorruptionError(f"dump shard holds {head.frames} frames, the row index's rows on its unit "
                                  f"{len(want.get(head.unit, ([],))[0])}", path=str(sp), offset=0)
        table = D.decode_shard_table(_read(sp, d, head.table_offset, head.table_len, what="dump shard"), head,
                                     path=str(sp))
        if not _same_frames(want.get(head.unit, ([], [])), table, code):
            raise CorruptionError("dump shard's frames are not the produced fields of the row index's rows on its "
                                  "unit", path=str(sp), offset=head.table_offset)
        shards.append(Shard(head.unit, s["path"], size, head, table))
    return Dump(d, man, rows, shards, frozenset(f for fs in by_fields for f in fs))


def _frames_wanted(by_fields: Mapping[tuple, List[int]], code: Mapping[str, int],
                   nu: int) -> Dict[int, Tuple[np.ndarray, np.ndarray]]:
    """Per source unit (``gidx % nu``), the ``(gidx, field code)`` pairs of the frames the row
    index says its shard holds, as two arrays (in no particular order)."""
    gs, cs = [np.zeros(0, np.uint64)], [np.zeros(0, np.int64)]
    for fs, rows_ in by_fields.items():
        g = np.asarray(rows_, np.uint64)
        c = np.asarray([code[f] for f in fs], np.int64)
        gs.append(np.repeat(g, len(c)))
        cs.append(np.tile(c, len(g)))
    g, c = np.concatenate(gs), np.concatenate(cs)
    unit = (g % np.uint64(nu)).astype(np.int64)
    return {int(u): (g[unit == u], c[unit == u]) for u in np.unique(unit).tolist()}


def prefetch(path, *, max_bytes: int = PREFETCH_BYTES) -> None:
    """Start reading the shard files of the dump at ``path`` into the page cache (a hint, see
    :func:`tqstore._io.files.prefetch`), at most ``max_bytes`` of them (the same share of each,
    from its start): the loader runs it as a load starts, beside the checks of the dump and
    the controller's begin, so the target units find the bytes read or on their way (every
    frame of a dump is loaded by some unit).  Nothing is checked here (the units check what
    they read); raises nothing."""
    d = Path(path)
    try:
        names = [n for n in files.listdir(d) if n.startswith("shard-") and n.endswith(".tqd") and
                 n[6:-4].isdigit() and D.shard_name(int(n[6:-4])) == n]
        sizes = [files.check_regular(d / n, under=d).st_size for n in names]
    except (OSError, ValueError):
        return
    total = sum(sizes)
    share = min(1.0, max_bytes / total) if total else 0.0
    for n, size in zip(names, sizes):
        files.prefetch(d / n, [(0, int(size * share))], under=d)


def _same_frames(want: Tuple[np.ndarray, np.ndarray], table: D.ShardTable, code: Mapping[str, int]) -> bool:
    """Whether the shard's table holds exactly the ``(gidx, field code)`` pairs ``want`` (each
    pair at most once on either side: the row index and the table decoders refuse repeats)."""
    e = table.entries
    if len(e) != len(want[0]):
        return False
    if not len(e):
        return True
    names = np.array([code.get(n, -1) for n in table.names], np.int64)
    gf = names[e["field"].astype(np.int64)]
    if (gf < 0).any():  # a field the row index has no schema for
        return False
    gg = e["gidx"].astype(np.uint64)
    wg, wf = np.asarray(want[0], np.uint64), np.asarray(want[1], np.int64)
    a, b = np.lexsort((gf, gg)), np.lexsort((wf, wg))
    return bool(np.array_equal(gg[a], wg[b]) and np.array_equal(gf[a], wf[b]))


def plan_imports(dump: Dump, mapping: Tuple[np.ndarray, np.ndarray], num_units: int, *,
                 batch_bytes: int = BATCH_BYTES) -> List[RestoreImport]:
    """The frames each target unit ``0..num_units-1`` imports: a frame of source gidx ``g`` goes
    to unit ``G % num_units``, ``G`` the store's gidx of ``g`` (``mapping``: the source gidxs,
    sorted, and the store's gidxs in the same order, as :func:`mapping_of` gives them).  Pure.

    Raises CorruptionError if a frame's source gidx is not in the mapping."""
    files_ = {s.unit: s.path for s in dump.shards}
    sizes = {s.unit: s.size for s in dump.shards}
    msrc, mdst = mapping
    cols: List[Tuple[np.ndarray, ...]] = []
    fields: List[bytes] = []
    for s in dump.shards:
        e = s.table.entries
        src = e["gidx"].astype(np.uint64)
        dst = np.zeros(0, np.uint64)
        if len(src):
            at = np.searchsorted(msrc, src)
            if (at >= len(msrc)).any() or not np.array_equal(msrc[at], src):
                raise CorruptionError("dump shard holds a frame of a row the restore does not name",
                                      path=str(dump.path / s.path))
            dst = mdst[at]
        cols.append((np.full(len(e), s.unit, np.int64), e["offset"].astype(np.int64), e["length"].astype(np.int64),
                     e["crc"].astype(np.uint32), src, dst))
        names = [n.encode("utf-8") for n in s.table.names]
        fields.extend(map(names.__getitem__, e["field"].tolist()))
    if cols:
        fid, off, ln, crc, src, dst = (np.concatenate([c[i] for c in cols]) for i in range(6))
    else:
        fid = off = ln = np.zeros(0, np.int64)
        crc = np.zeros(0, np.uint32)
        src = dst = np.zeros(0, np.uint64)
    target = (dst % np.uint64(num_units)).astype(np.int64) if len(dst) else np.zeros(0, np.int64)
    schemas = {f.encode("utf-8"): kd for f, kd in dump.rows.schemas.items()}
    out = []
    for u in range(num_units):
        sel = np.flatnonzero(target == u)
        out.append(RestoreImport(str(dump.path), files_, sizes, fid[sel], off[sel], ln[sel], crc[sel], src[sel],
                                 dst[sel], list(map(fields.__getitem__, sel.tolist())), batch_bytes, schemas))
    return out


def mapping_of(info: RestoreInfo, dump: Dump) -> Tuple[np.ndarray, np.ndarray]:
    """Source gidx -> the store's gidx of a restore (``info`` with its rows: keys, store gidxs
    and source gidxs), as two arrays: the source gidxs sorted and the store's in that order.

    Raises CorruptionError when the dump's rows are not the restore's (it changed since)."""
    ri = dump.rows
    keys, srcs = info.keys or (), info.srcs or ()
    same_order = list(keys) == ri.keys and list(srcs) == ri.gidxs  # (begun from this dump: its rows in order)
    if not same_order and (len(keys) != len(ri) or
                           any(ri.rows.get(k, _NO_ROW)["gidx"] != g for k, g in zip(keys, srcs))):
        raise CorruptionError("the dump's keys are not those of the restore begun from it (was it replaced?)",
                              path=str(dump.path / D.ROW_INDEX_NAME))
    src = np.asarray(srcs, np.uint64)
    order = np.argsort(src, kind="stable")
    return src[order], np.asarray(info.gidxs or (), np.uint64)[order]


_NO_ROW = {"gidx": None}


__all__ = ["BATCH_BYTES", "Shard", "Dump", "read_dump", "prefetch", "plan_imports", "mapping_of"]
