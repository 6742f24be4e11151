"""Reading a dump directory: its index (manifest and ``rows.json``, no payload), a
description, and verification (docs/FORMAT.md, "Dump directory").

Every file is opened with :func:`tqstore._io.files.open_regular` relative to the dump (no
symbolic link, FIFO or device is followed), its size checked against the manifest before
it is read, and its bytes decoded by the strict codec (:mod:`tqstore._format.dump_records`).
A shard is read in bounded chunks (:data:`CHUNK_BYTES`, or one frame when larger), never
mapped.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Set, Tuple

import numpy as np

from .. import _native
from .._format import dump_records as D
from .._format.columns import KIND_NAMES, describe_kind_dtype
from .._format.dtypes import SCHEMA_MIXED
from .._format.frame import DTYPE_AT, KIND_AT, NAME_AT, NAME_LEN_AT, check_run, first_fault
from .._format.index import LOC_DTYPE
from .._format.values import check_value
from .._io import files
from ..errors import CheckpointNotFoundError, CorruptionError, StorageIOError, TqstoreError
from . import publish as P

PathLike = Any
CHUNK_BYTES = 8 << 20


@dataclass(frozen=True)
class DumpIndex:
    """A dump's manifest and row index, checked against each other (no payload read)."""

    dir: Path
    manifest: Dict[str, Any]
    rows: D.RowIndex

    def shard_entries(self) -> Dict[int, Dict[str, Any]]:
        """Manifest shard entries by source unit."""
        return {s["unit"]: s for s in self.manifest["shards"]}


def read_file(d: Path, name: str, *, limit: int = D.MAX_JSON_BYTES, size: Optional[int] = None) -> bytes:
    """The bytes of the regular file ``d/name`` (``size``: the size it must have).

    Raises CorruptionError (missing, not a regular file, of another size, over ``limit``),
    StorageIOError (it cannot be opened otherwise: no permission, an I/O error)."""
    p = d / name
    try:
        fd = files.open_regular(p, under=d)
    except FileNotFoundError as e:
        raise CorruptionError(f"dump file {name} is missing", path=str(p)) from e
    except files.NotRegularFile as e:
        raise CorruptionError(f"dump file {name} cannot be opened: {e}", path=str(p)) from e
    except OSError as e:
        raise StorageIOError(f"dump file {p} cannot be opened: {e.strerror or e}") from e
    try:
        n = os.fstat(fd).st_size
        if size is not None and n != size:
            raise CorruptionError(f"dump file {name} holds {n} bytes, the manifest says {size}", path=str(p),
                                  offset=min(n, size))
        if n > limit:
            raise CorruptionError(f"dump file {name} holds {n} bytes, more than {limit}", path=str(p))
        buf = bytearray(n)
        got = files.preadv_all(fd, [buf], 0)
        if got != n:
            raise CorruptionError(f"dump file {name} is shorter than it was a moment ago", path=str(p), offset=got)
        return bytes(buf)
    finally:
        os.close(fd)


def open_dump(final: Path, *, path: Optional[PathLike] = None) -> DumpIndex:
    """Read and check the index of the dump at ``final`` (resolved; caller holds the lock or
    reads without it): ``<dir>``, or ``<dir>.old`` when ``<dir>`` is missing.

    Raises:
        CheckpointNotFoundError: no dump there (a FileNotFoundError).
        FormatVersionError, CorruptionError: a damaged, foreign or newer manifest or row index."""
    d = P.readable_dir(final)
    if d is None or not os.path.lexists(d / D.MANIFEST_NAME):
        raise _not_found(final, path)
    m = D.decode_manifest(read_file(d, D.MANIFEST_NAME), path=str(d / D.MANIFEST_NAME))
    ri_entry = m["row_index"]
    raw = read_file(d, D.ROW_INDEX_NAME, size=ri_entry["size"])
    got = _native.crc32c(raw)
    if got != ri_entry["crc32c"]:
        raise CorruptionError("dump row index: CRC32C mismatch", path=str(d / D.ROW_INDEX_NAME),
                              expected_crc=ri_entry["crc32c"], actual_crc=got)
    ri = D.decode_row_index(raw, path=str(d / D.ROW_INDEX_NAME))
    with_data = sum(1 for r in ri.rows.values() if r["fields"])
    if ri.partition_id != m["partition_id"] or ri.num_units != m["num_units"] or \
            len(ri.rows) != m["summary"]["keys"] or with_data != m["summary"]["rows_with_data"]:
        raise CorruptionError("dump row index does not match MANIFEST.json (partition, unit count or row counts)",
                              path=str(d / D.ROW_INDEX_NAME))
    per_unit: Dict[int, int] = {}
    for r in ri.rows.values():
        if r["fields"]:
            u = r["gidx"] % ri.num_units
            per_unit[u] = per_unit.get(u, 0) + len(r["fields"])
    have = {s["unit"]: s["frames"] for s in m["shards"]}
    if per_unit != have:
        raise CorruptionError(f"dump shards do not hold the row index's frames (frames per unit: index {per_unit}, "
                              f"manifest {have})", path=str(d / D.MANIFEST_NAME))
    return DumpIndex(d, m, ri)


def _not_found(final: Path, path: Optional[PathLike]) -> CheckpointNotFoundError:
    kind = P.other_kind(final) if os.path.isdir(final) else None
    return CheckpointNotFoundError(f"no tqstore dump at {os.fspath(path or final)} "
                                   f"({f'it is {kind}' if kind else f'no {D.MANIFEST_NAME}'})")


def _lock_for_reading(final: Path, path: PathLike):
    """The path's exclusive lock for a reader (:func:`publish.locked`, ``shared_ok``);
    CheckpointNotFoundError, creating nothing, when nothing of a dump is there (a dump
    published after this check is not read without the lock)."""
    if not P.present(final):
        raise _not_found(final, path)
    return P.locked(final, shared_ok=True)


def read_index(path: PathLike) -> DumpIndex:
    """:func:`open_dump` under the path's exclusive lock, after :func:`publish.repair` (a
    reader that cannot take the lock reads without repairing)."""
    final = P.resolve(path)
    with _lock_for_reading(final, path) as held:
        if held:
            P.repair(final)
        return open_dump(final, path=path)


def row_index_dict(ix: DumpIndex) -> Dict[str, Any]:
    """The public shape of ``read_row_index``."""
    ri = ix.rows
    return {"partition_id": ri.partition_id, "format_version": ix.manifest["version"], "num_units": ri.num_units,
            "rows": {k: {"tag": {} if r["tag"] is None else r["tag"], "fields": list(r["fields"]), "gidx": r["gidx"]}
                     for k, r in ri.rows.items()},  # (an untagged key's tag as kv_list gives it: {})
            "schemas": {f: {"kind": KIND_NAMES[k], "dtype": D.schema_dtype_name(dt)}
                        for f, (k, dt) in ri.schemas.items()}}


# ---------------------------------------------------------------------------- shards
def read_shard_table(d: Path, entry: Dict[str, Any], fd: int) -> Tuple[D.ShardHeader, D.ShardTable]:
    """Header and table of the open shard ``fd`` (its manifest ``entry``), checked against
    each other, the file's size and the manifest entry.  Raises CorruptionError."""
    p = str(d / entry["path"])
    size = os.fstat(fd).st_size
    if size != entry["size"]:
        raise CorruptionError(f"dump shard holds {size} bytes, the manifest says {entry['size']}", path=p,
                              offset=min(size, entry["size"]))
    head = bytearray(D.SHARD_HEADER_SIZE)
    files.preadv_all(fd, [head], 0)
    h = D.decode_shard_header(head, path=p, file_size=size)
    if h.unit != entry["unit"] or h.frames != entry["frames"]:
        raise CorruptionError(f"dump shard header says unit {h.unit} with {h.frames} frames, the manifest unit "
                              f"{entry['unit']} with {entry['frames']}", path=p, offset=8)
    raw = bytearray(h.table_len)
    files.preadv_all(fd, [raw], h.table_offset)
    return h, D.decode_shard_table(raw, h, path=p)


def scan_shard(fd: int, h: D.ShardHeader, t: D.ShardTable, *, path: str, deep: bool = True,
               schemas: Optional[Dict[str, Tuple[int, int]]] = None) -> Tuple[int, List[str]]:
    """Read the shard once in bounded chunks: its whole-file CRC32C and, with ``deep``, every
    frame through the frame-check kernel (with its entry's offset, length, CRC and gidx), its
    header's field name against the entry's and its kind and dtype against ``schemas`` (the
    row index's: field -> (kind, dtype code), 255 any dtype of the kind).  Returns ``(crc,
    problems)``; a frame problem names the file and offset."""
    head = bytearray(D.SHARD_HEADER_SIZE)
    files.preadv_all(fd, [head], 0)
    crc = _native.crc32c(head)
    e = t.entries
    problems: List[str] = []
    i, n = 0, len(e)
    while i < n:
        start = int(e["offset"][i])
        j = i + 1
        while j < n and int(e["offset"][j]) + int(e["length"][j]) - start <= CHUNK_BYTES:
            j += 1
        end = int(e["offset"][j - 1]) + int(e["length"][j - 1])
        buf = bytearray(end - start)
        if files.preadv_all(fd, [buf], start) != len(buf):
            problems.append(str(CorruptionError("dump shard is shorter than its table says", path=path, offset=start)))
            return crc, problems
        crc = _native.crc32c(buf, crc)
        if deep:
            problems.extend(_check_frames(buf, e[i:j], t, start, path, schemas or {}))
        i = j
    raw = bytearray(h.table_len)
    files.preadv_all(fd, [raw], h.table_offset)
    return _native.crc32c(raw, crc), problems


def _check_frames(buf: bytearray, e: np.ndarray, t: D.ShardTable, base: int, path: str,
                  schemas: Dict[str, Tuple[int, int]]) -> List[str]:
    locs = np.zeros(len(e), LOC_DTYPE)
    locs["offset"], locs["length"], locs["crc"] = e["offset"], e["length"], e["crc"]
    gidxs = np.ascontiguousarray(e["gidx"], dtype="<u8")
    res = check_run(buf, locs, gidxs, base=base)
    got = first_fault(buf, locs, res, gidxs, base=base)
    if got is not None:  # the first bad frame of the chunk (its neighbours' heads may not even parse)
        k, fault = got
        return [str(fault.error(path=path, offset=int(locs["offset"][k])))]
    out: List[str] = []
    mv = memoryview(buf)
    for k in range(len(e)):
        f = int(e["offset"][k]) - base
        ln = mv[f + NAME_LEN_AT]
        name = t.names[int(e["field"][k])]
        if bytes(mv[f + NAME_AT:f + NAME_AT + ln]) != name.encode():
            out.append(str(CorruptionError(f"frame of row {int(e['gidx'][k])} holds another field than its table "
                                           f"entry ({name!r})", path=path, offset=int(e["offset"][k]))))
            break
        want = schemas.get(name)
        if want is not None and (mv[f + KIND_AT] != want[0] or (want[1] != SCHEMA_MIXED and mv[f + DTYPE_AT] != want[1])):
            out.append(str(CorruptionError(f"frame of row {int(e['gidx'][k])} (field {name!r}) holds "
                                           f"{describe_kind_dtype((mv[f + KIND_AT], mv[f + DTYPE_AT]))}, the row index declares "
                                           f"{describe_kind_dtype(want)}", path=path, offset=int(e["offset"][k]))))
            break
    return out


# ---------------------------------------------------------------------------- describe, verify
def _locked_read(path: PathLike):
    final = P.resolve(path)
    return final, _lock_for_reading(final, path)


def describe_dump(path: PathLike) -> Dict[str, Any]:
    """What the dump at ``path`` holds, from its manifest and row index (no payload read;
    nothing repaired or written): ``path``, ``kind`` ("dump"), ``format_version``,
    ``partition_id``, ``num_units``, ``created_unix``, ``tqstore_version``, ``rows``,
    ``rows_with_data``, ``frames``, ``payload_bytes``, ``bytes`` (files), ``fields``
    (field -> kind/dtype) and ``shards`` (unit, path, size, frames, rows).

    Raises CheckpointNotFoundError (no dump), FormatVersionError / CorruptionError."""
    final, lock = _locked_read(path)
    with lock:
        ix = open_dump(final, path=path)
    m = ix.manifest
    s = m["summary"]
    return {"path": str(ix.dir), "kind": "dump", "format_version": m["version"], "partition_id": m["partition_id"],
            "num_units": m["num_units"], "created_unix": m.get("created_unix"),
            "tqstore_version": m.get("tqstore_version"), "rows": s["keys"], "rows_with_data": s["rows_with_data"],
            "frames": s["frames"], "payload_bytes": s["payload_bytes"],
            "bytes": sum(e["size"] for e in m["shards"]) + m["row_index"]["size"],
            "fields": row_index_dict(ix)["schemas"],
            "shards": [{k: e[k] for k in ("unit", "path", "size", "frames", "rows")} for e in m["shards"]]}


def verify_dump(path: PathLike, *, deep: bool = True) -> List[str]:
    """Check the dump at ``path`` and return one line per problem (empty: it verifies); writes
    nothing.  Checks: the manifest; ``rows.json`` (size, CRC32C, content, consistency with the
    manifest, every tag one a store holds); no unlisted file; every shard a regular file of
    its size, its header and table, their agreement with the manifest and the row index (the
    shard's ``(gidx, field)`` pairs are exactly the produced fields of the rows on its unit),
    its whole-file CRC32C; with ``deep`` (default) every frame through the frame-check kernel.

    Raises CheckpointNotFoundError when there is no dump at ``path``."""
    final, lock = _locked_read(path)
    with lock:
        try:
            ix = open_dump(final, path=path)
        except CheckpointNotFoundError:
            raise
        except TqstoreError as e:
            return [str(e)]
        problems: List[str] = []
        listed = {D.MANIFEST_NAME, D.ROW_INDEX_NAME} | {s["path"] for s in ix.manifest["shards"]}
        for name in files.listdir(ix.dir):
            if name not in listed:
                problems.append(f"{ix.dir / name}: not listed in {D.MANIFEST_NAME}")
        problems.extend(_unloadable_tags(ix))
        want = _pairs_by_unit(ix.rows)
        for entry in ix.manifest["shards"]:
            problems.extend(_verify_shard(ix.dir, entry, want.get(entry["unit"], set()), deep=deep,
                                          schemas=ix.rows.schemas))
        return problems


def _unloadable_tags(ix: "DumpIndex", most: int = 5) -> List[str]:
    """A line for each of the first ``most`` rows whose tag no store holds (a put refuses it:
    nested deeper than 64 levels, a lone surrogate, ...): a load of the dump refuses it too,
    so the dump is damaged or was not written by tqstore."""
    out: List[str] = []
    for key, r in ix.rows.rows.items():
        try:
            check_value(r["tag"], tag=True)
        except TqstoreError as e:
            out.append(f"{ix.dir / D.ROW_INDEX_NAME}: the tag of key {key[:60]!r} cannot be loaded ({e})")
            if len(out) >= most:
                break
    return out


def _pairs_by_unit(ri: D.RowIndex) -> Dict[int, Set[Tuple[int, str]]]:
    out: Dict[int, Set[Tuple[int, str]]] = {}
    for r in ri.rows.values():
        for f in r["fields"]:
            out.setdefault(r["gidx"] % ri.num_units, set()).add((r["gidx"], f))
    return out


def _verify_shard(d: Path, entry: Dict[str, Any], want: Set[Tuple[int, str]], *, deep: bool,
                  schemas: Optional[Dict[str, Tuple[int, int]]] = None) -> List[str]:
    p = str(d / entry["path"])
    try:
        fd = files.open_regular(d / entry["path"], under=d)
    except FileNotFoundError:
        return [f"{p}: dump shard is missing"]
    except OSError as e:
        return [f"{p}: dump shard cannot be opened: {e}"]
    try:
        try:
            h, t = read_shard_table(d, entry, fd)
        except TqstoreError as e:
            return [str(e)]
        out: List[str] = []
        got = set(zip(t.entries["gidx"].tolist(), t.fields()))
        if got != want:
            out.append(f"{p}: dump shard holds {len(got)} frames, the row index names {len(want)} on unit "
                       f"{entry['unit']} ({len(got - want)} extra, {len(want - got)} missing)")
        if h.table_offset - D.SHARD_HEADER_SIZE != entry["payload_bytes"]:
            out.append(f"{p}: dump shard holds {h.table_offset - D.SHARD_HEADER_SIZE} frame bytes, the manifest "
                       f"says {entry['payload_bytes']}")
        crc, probs = scan_shard(fd, h, t, path=p, deep=deep, schemas=schemas)
        out.extend(probs)
        if crc != entry["crc32c"]:
            out.append(str(CorruptionError("dump shard: CRC32C mismatch", path=p, expected_crc=entry["crc32c"],
                                           actual_crc=crc)))
        return out
    finally:
        os.close(fd)


__all__ = ["DumpIndex", "open_dump", "read_index", "row_index_dict", "read_shard_table", "scan_shard",
           "describe_dump", "verify_dump", "read_file", "CHUNK_BYTES"]
