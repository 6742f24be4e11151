"""The controller's persisted mirror, ``controller/mirror.tqm``, format version 1
(docs/FORMAT.md, "Controller mirror"): the columnar state a decode of the controller index
produces, written at a clean close and read on the next open instead of walking LMDB.

Bytes in, objects out: no I/O.  A file is a 64-byte header (magic ``TQMR``, version, the
controller commit counter and units digest it is bound to, sizes, the directory's CRC32C,
the header's own CRC32C), a JSON directory, and arrays, each at a multiple of 64 bytes
and each with its own CRC32C in the directory.  :func:`encode_mirror` gives the buffers
to write back to back; :func:`decode_header` and :func:`decode_mirror` check everything
they read and raise :class:`~tqstore.errors.CorruptionError` naming the file and offset
(:class:`~tqstore.errors.FormatVersionError` for another version), never a bare
``ValueError``.  The marker binding is :func:`bound_digest`.
"""
from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .. import _native
from ..errors import CorruptionError, FormatVersionError
from .dtypes import DTYPE_NAMES, SCHEMA_MIXED
from .layout import ALIGN, KIND_VALUE, KINDS
from .values import dumps as _dumps, loads as _loads

MIRROR_FILE = "mirror.tqm"
MIRROR_MAGIC = b"TQMR"
MIRROR_VERSION = 1
MIRROR_VERSIONS_READ = (1,)
#: magic, version, flags, commit, units digest, file size, directory offset, directory length,
#: directory CRC32C, reserved (8 zero bytes), header CRC32C (of bytes 0..59)
HEADER = struct.Struct("<4sHHQQQQQI8sI")
HEADER_SIZE = 64
MAX_DIRECTORY_BYTES = 1 << 30
_I8, _I4 = np.dtype("<i8"), np.dtype("<i4")


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def bound_digest(units_digest: int, file_size: int, header_crc: int) -> int:
    """The clean-close marker's digest when a mirror is bound to it: the first 8 bytes of
    BLAKE2b (digest size 8) of the ASCII text ``<units digest>;mirror,<file size>,<header
    CRC32C>``, big-endian, shifted right by one bit (below 2**63, as the units' digest)."""
    text = f"{int(units_digest)};mirror,{int(file_size)},{int(header_crc)}".encode("ascii")
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "big") >> 1


@dataclass
class PartImage:
    """One partition as the mirror holds it: rows in seq order (``gidx``, ``seq`` int64,
    ``fs`` int32: an index into ``fsets``), ``keys`` per row (None: unkeyed), the tagged
    rows' gidxs and tags."""

    pid: str
    num: int
    next_seq: int
    meta: Dict[str, Any]
    schema: List[Tuple[str, int, int, int]]  # (field, kind, dtype, bit)
    fsets: List[List[str]]
    gidx: np.ndarray
    seq: np.ndarray
    fs: np.ndarray
    keys: List[Optional[str]]
    tag_gidx: np.ndarray
    tags: List[Any]


@dataclass
class MirrorImage:
    """The whole controller state of a mirror file (sampler state and restores are not in it:
    the first is read from the index on use, the second never exists at a clean close)."""

    num_units: int
    next_gidx: int
    put_token: int
    free: np.ndarray
    parts: List[PartImage] = field(default_factory=list)
    consumed: List[Tuple[str, str, np.ndarray]] = field(default_factory=list)  # (pid, task, gidxs)


@dataclass(frozen=True)
class MirrorHeader:
    version: int
    commit: int  # the controller index's commit counter the mirror describes
    units_digest: int
    size: int
    dir_offset: int
    dir_len: int
    dir_crc: int
    crc: int  # the header's own CRC32C: with ``size``, the identity the marker names


# ---------------------------------------------------------------------------- writing
class _Arrays:
    """Array sections laid out after the directory; refs are ``[offset, length, crc32c]``."""

    def __init__(self) -> None:
        self.blobs: List[bytes] = []

    def add(self, data: Any) -> List[int]:
        b = data.tobytes() if isinstance(data, np.ndarray) else bytes(data)
        self.blobs.append(b)
        return [len(self.blobs) - 1, len(b), _native.crc32c(b)]  # offset fixed in place by layout()


def encode_mirror(img: MirrorImage, *, commit: int, units_digest: int) -> Tuple[List[bytes], int, int]:
    """The buffers of a mirror file of ``img`` (to write back to back), its size and its
    header CRC32C.  ``commit``: the controller index's commit counter it describes;
    ``units_digest``: the units' digest of the same close (below 2**63)."""
    arr = _Arrays()
    refs: List[List[int]] = []

    def ref(data: Any) -> List[int]:
        r = arr.add(data)
        refs.append(r)
        return r

    parts = []
    for p in img.parts:
        n = len(p.gidx)
        keyed = [k for k in p.keys if k is not None]
        slots = None if len(keyed) == n else np.flatnonzero(
            np.fromiter((k is not None for k in p.keys), dtype=bool, count=n)).astype(_I8)
        parts.append({"pid": p.pid, "num": p.num, "next_seq": p.next_seq, "meta": p.meta,
                      "schema": [list(s) for s in p.schema], "fsets": [sorted(f) for f in p.fsets], "rows": n,
                      "gidx": ref(np.asarray(p.gidx, _I8)), "seq": ref(np.asarray(p.seq, _I8)),
                      "fs": ref(np.asarray(p.fs, _I4)), "keyed": len(keyed),
                      "keyslots": None if slots is None else ref(slots),
                      "keys": ref("\0".join(keyed).encode("utf-8")), "tagged": len(p.tags),
                      "tag_gidx": ref(np.asarray(p.tag_gidx, _I8)),
                      "tags": ref(_dumps(list(p.tags), ensure_ascii=True).encode("ascii"))})
    directory = {"num_units": img.num_units, "next_gidx": img.next_gidx, "put_token": img.put_token,
                 "free": ref(np.asarray(img.free, _I8)), "parts": parts,
                 "consumed": [[pid, task, ref(np.asarray(g, _I8))] for pid, task, g in img.consumed]}
    # lay out: the directory's length depends on the offsets written into it, so fix offsets
    # from a directory with every offset at its widest, then pad the real one to that length
    for r in refs:
        r[0] = 10 ** 19 - 1
    wide = len(json.dumps(directory, ensure_ascii=True, separators=(",", ":")).encode("ascii"))
    at = _align(HEADER_SIZE + wide)
    offsets = []
    for b in arr.blobs:
        offsets.append(at)
        at = _align(at + len(b))
    for r, off in zip(refs, offsets):
        r[0] = off
    text = json.dumps(directory, ensure_ascii=True, separators=(",", ":")).encode("ascii")
    text += b" " * (wide - len(text))  # JSON allows trailing whitespace
    size = at
    head = HEADER.pack(MIRROR_MAGIC, MIRROR_VERSION, 0, commit, units_digest, size, HEADER_SIZE, len(text),
                       _native.crc32c(text), bytes(8), 0)
    hcrc = _native.crc32c(head[:60])
    out = [head[:60] + struct.pack("<I", hcrc), text]
    pos = HEADER_SIZE + len(text)
    for b, off in zip(arr.blobs, offsets):
        out.append(bytes(off - pos))
        out.append(b)
        pos = off + len(b)
    out.append(bytes(size - pos))
    return [b for b in out if b], size, hcrc


# ---------------------------------------------------------------------------- reading
def _bad(what: str, path: Optional[str], offset: int) -> CorruptionError:
    return CorruptionError(f"controller mirror: {what}", path=path, offset=offset)


def decode_header(raw: Any, *, file_size: int, path: Optional[str] = None) -> MirrorHeader:
    """Check and decode a mirror file's first 64 bytes (``file_size``: the file's size, which
    the header must state).  Raises FormatVersionError (another version), CorruptionError
    (not a mirror, a bad CRC, sizes that do not add up, reserved bits set)."""
    b = bytes(raw[:HEADER_SIZE])
    if len(b) < HEADER_SIZE:
        raise _bad(f"{len(b)} bytes, a mirror starts with a {HEADER_SIZE}-byte header", path, 0)
    magic, ver, flags, commit, ud, size, doff, dlen, dcrc, rsv, hcrc = HEADER.unpack(b)
    if magic != MIRROR_MAGIC:
        raise _bad(f"magic {magic!r} is not {MIRROR_MAGIC!r}", path, 0)
    if ver not in MIRROR_VERSIONS_READ:
        raise FormatVersionError(f"controller mirror version {ver} is not supported (reads "
                                 f"{', '.join(map(str, MIRROR_VERSIONS_READ))})", path=path)
    got = _native.crc32c(b[:60])
    if got != hcrc:
        raise CorruptionError("controller mirror header: CRC32C mismatch", path=path, offset=0, expected_crc=hcrc,
                              actual_crc=got)
    if flags or rsv != bytes(8) or ud >> 63:
        raise _bad("reserved bits of the header are set", path, 6)
    if size != file_size or doff != HEADER_SIZE or dlen > MAX_DIRECTORY_BYTES or doff + dlen > size \
            or size % ALIGN:
        raise _bad(f"the header says {size} bytes with a directory of {dlen} at {doff}; the file holds "
                   f"{file_size}", path, 24)
    return MirrorHeader(ver, commit, ud, size, doff, dlen, dcrc, hcrc)


class _Reader:
    def __init__(self, buf: Any, h: MirrorHeader, path: Optional[str]) -> None:
        self.buf, self.h, self.path = memoryview(buf).cast("B"), h, path
        self.end_dir = h.dir_offset + h.dir_len

    def section(self, r: Any, what: str) -> memoryview:
        if type(r) is not list or len(r) != 3 or not all(type(x) is int and x >= 0 for x in r):
            raise _bad(f"{what}: not a section reference [offset, length, crc32c]", self.path, self.h.dir_offset)
        off, n, crc = r
        if off % ALIGN or off < self.end_dir or off + n > self.h.size:
            raise _bad(f"{what}: section of {n} bytes at {off} is outside the arrays", self.path, self.h.dir_offset)
        b = self.buf[off:off + n]
        got = _native.crc32c(b)
        if got != crc:
            raise CorruptionError(f"controller mirror: {what}: CRC32C mismatch", path=self.path, offset=off,
                                  expected_crc=crc, actual_crc=got)
        return b

    def array(self, r: Any, dt: np.dtype, count: Optional[int], what: str) -> np.ndarray:
        b = self.section(r, what)
        if b.nbytes % dt.itemsize or (count is not None and b.nbytes != count * dt.itemsize):
            raise _bad(f"{what}: {b.nbytes} bytes, expected {count} values of {dt.itemsize} bytes", self.path, r[0])
        return np.frombuffer(b, dtype=dt).astype(np.int64 if dt.kind == "i" and dt.itemsize == 8 else dt)


def _need(d: Any, key: str, kind: Any, what: str, path: Optional[str]) -> Any:
    v = d.get(key) if type(d) is dict else None
    if kind is int:
        ok = type(v) is int and v >= 0
    else:
        ok = type(v) is kind
    if not ok:
        raise _bad(f"{what}: member {key!r} missing or not a {getattr(kind, '__name__', kind)}", path, HEADER_SIZE)
    return v


def decode_mirror(buf: Any, h: MirrorHeader, *, path: Optional[str] = None) -> MirrorImage:
    """The state held by the mirror file ``buf`` (all of it; ``h`` its checked header):
    every section's CRC32C checked, every count and range checked (rows, keys and tags of
    each partition agree; field sets name fields of the schema; bits distinct; global
    indexes below ``next_gidx``; seqs increasing below ``next_seq``).  Raises
    CorruptionError naming ``path`` and an offset."""
    rd = _Reader(buf, h, path)
    raw = rd.buf[h.dir_offset:rd.end_dir]
    got = _native.crc32c(raw)
    if got != h.dir_crc:
        raise CorruptionError("controller mirror directory: CRC32C mismatch", path=path, offset=h.dir_offset,
                              expected_crc=h.dir_crc, actual_crc=got)
    try:
        d = json.loads(bytes(raw).decode("ascii"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise _bad(f"directory is not ASCII JSON ({e})", path, h.dir_offset) from None
    nu, nxt = _need(d, "num_units", int, "directory", path), _need(d, "next_gidx", int, "directory", path)
    token = _need(d, "put_token", int, "directory", path)
    if nu < 1:
        raise _bad("num_units is 0", path, h.dir_offset)
    free = rd.array(d.get("free"), _I8, None, "free")
    if len(free) and (int(free.min()) < 0 or int(free.max()) >= nxt):
        raise _bad("a free index outside [0, next_gidx)", path, h.dir_offset)
    img = MirrorImage(nu, nxt, token, free)
    nums = set()
    for i, q in enumerate(_need(d, "parts", list, "directory", path)):
        img.parts.append(_part(rd, q, nxt, f"partition {i}"))
        if img.parts[-1].num in nums:
            raise _bad(f"partition {i}: number {img.parts[-1].num} twice", path, h.dir_offset)
        nums.add(img.parts[-1].num)
    for i, c in enumerate(_need(d, "consumed", list, "directory", path)):
        if type(c) is not list or len(c) != 3 or type(c[0]) is not str or type(c[1]) is not str:
            raise _bad(f"consumed entry {i} is not [partition, task, section]", path, h.dir_offset)
        g = rd.array(c[2], _I8, None, f"consumed entry {i}")
        if len(g) and (int(g.min()) < 0 or int(g.max()) >= nxt):
            raise _bad(f"consumed entry {i}: an index outside [0, next_gidx)", path, h.dir_offset)
        img.consumed.append((c[0], c[1], g))
    return img


def _part(rd: _Reader, q: Any, next_gidx: int, what: str) -> PartImage:
    path = rd.path
    pid = _need(q, "pid", str, what, path)
    num, next_seq, n = (_need(q, k, int, what, path) for k in ("num", "next_seq", "rows"))
    meta, schema, fsets = _need(q, "meta", dict, what, path), _need(q, "schema", list, what, path), \
        _need(q, "fsets", list, what, path)
    n_keyed, n_tagged = _need(q, "keyed", int, what, path), _need(q, "tagged", int, what, path)
    if num >= 1 << 31 or n_keyed > n or n_tagged > n:
        raise _bad(f"{what}: number or counts out of range", path, rd.h.dir_offset)
    fields, bits = set(), set()
    for s in schema:
        if type(s) is not list or len(s) != 4 or type(s[0]) is not str or \
                not all(type(x) is int and x >= 0 for x in s[1:]) or s[0] in fields or s[3] in bits or s[3] >= 65536:
            raise _bad(f"{what}: a schema entry is not [field, kind, dtype, bit] of a new field and bit", path,
                       rd.h.dir_offset)
        if s[1] not in KINDS or (s[2] not in DTYPE_NAMES and not (s[2] == SCHEMA_MIXED and s[1] != KIND_VALUE)):
            raise _bad(f"{what}: field {s[0][:40]!r} of unknown kind or dtype ({s[1]}, {s[2]})", path, rd.h.dir_offset)
        fields.add(s[0])
        bits.add(s[3])
    for f in fsets:
        if type(f) is not list or not all(type(x) is str and x in fields for x in f):
            raise _bad(f"{what}: a field set names a field of no schema entry", path, rd.h.dir_offset)
    g = rd.array(q.get("gidx"), _I8, n, f"{what} gidx")
    seq = rd.array(q.get("seq"), _I8, n, f"{what} seq")
    fs = rd.array(q.get("fs"), _I4, n, f"{what} field sets")
    if n and (int(g.min()) < 0 or int(g.max()) >= next_gidx or int(seq.min()) < 0 or int(seq.max()) >= next_seq
              or not (seq[1:] > seq[:-1]).all() or int(fs.min()) < 0 or int(fs.max()) >= len(fsets)):
        raise _bad(f"{what}: rows out of range or not in seq order", path, rd.h.dir_offset)
    kb = bytes(rd.section(q.get("keys"), f"{what} keys"))
    try:
        keys = kb.decode("utf-8").split("\0") if n_keyed else []
    except UnicodeDecodeError:
        raise _bad(f"{what}: keys are not UTF-8", path, rd.h.dir_offset) from None
    if len(keys) != n_keyed or (not n_keyed and kb):
        raise _bad(f"{what}: {len(keys)} keys for {n_keyed} keyed rows", path, rd.h.dir_offset)
    if n_keyed != n:
        ks = rd.array(q.get("keyslots"), _I8, n_keyed, f"{what} key slots")
        if n_keyed and (int(ks.min()) < 0 or int(ks.max()) >= n or not (ks[1:] > ks[:-1]).all()):
            raise _bad(f"{what}: key slots out of range", path, rd.h.dir_offset)
        row_keys: List[Optional[str]] = [None] * n
        for s, k in zip(ks.tolist(), keys):
            row_keys[s] = k
        keys = row_keys
    elif q.get("keyslots") is not None:
        raise _bad(f"{what}: key slots for a partition whose rows are all keyed", path, rd.h.dir_offset)
    tg = rd.array(q.get("tag_gidx"), _I8, n_tagged, f"{what} tag rows")
    tb = rd.section(q.get("tags"), f"{what} tags")
    try:
        tags = _loads(tb)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise _bad(f"{what}: tags are not a JSON array", path, rd.h.dir_offset) from None
    if type(tags) is not list or len(tags) != n_tagged or None in tags:
        raise _bad(f"{what}: not {n_tagged} tags", path, rd.h.dir_offset)
    return PartImage(pid, num, next_seq, meta, [tuple(s) for s in schema], fsets, g, seq, fs, keys, tg, tags)


__all__ = ["MIRROR_FILE", "MIRROR_MAGIC", "MIRROR_VERSION", "MIRROR_VERSIONS_READ", "HEADER_SIZE", "PartImage",
           "MirrorImage", "MirrorHeader", "bound_digest", "encode_mirror", "decode_header", "decode_mirror"]
