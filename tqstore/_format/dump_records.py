"""The selective dump directory's files, format version 1 (docs/FORMAT.md, "Dump directory"):
``MANIFEST.json``, the row index ``rows.json`` and the shards ``shard-NNN.tqd``.

Bytes in, objects out: no I/O.  Every ``decode_*`` is strict: it checks magic or format name
first, then the version (an unknown one raises :class:`~tqstore.errors.FormatVersionError`
naming the version found and the one read), then sizes, ranges and types, and raises
:class:`~tqstore.errors.CorruptionError` naming the file (``path``) for anything else.  No
pickle: the manifest and the row index are JSON, a shard's table is fixed-size records.
"""
from __future__ import annotations

import functools
import json
import re
import struct
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from .. import _native
from .._version import __version__
from ..errors import CorruptionError, FormatVersionError, InvalidInputError
from .columns import KIND_NAMES
from .dtypes import DTYPE_NAMES, SCHEMA_MIXED
from .layout import ALIGN
from .store_files import MAX_UNITS
from .names import check_field_name, check_key, check_name, max_key_bytes
from .values import dumps as _dumps, dumps_each as _dumps_each, loads as _loads

_json_str_ascii = json.encoder.encode_basestring_ascii  # (a str as JSON text, non-ASCII escaped: C)

MANIFEST_NAME = "MANIFEST.json"
ROW_INDEX_NAME = "rows.json"
MANIFEST_FORMAT = "tqstore dump"
ROW_INDEX_FORMAT = "tqstore dump row index"
DUMP_VERSION = 1  # the manifest, the row index and the shard header share it
MAX_JSON_BYTES = 1 << 30
SHARD_MAGIC = b"TQDS"
SHARD_HEADER = struct.Struct("<4sHHIIQQQI16sI")  # magic version flags unit num_units frames toff tlen tcrc rsv hcrc
SHARD_HEADER_SIZE = 64
ENTRY_DTYPE = np.dtype([("gidx", "<u8"), ("offset", "<u8"), ("length", "<u4"), ("crc", "<u4"),
                        ("field", "<u4"), ("reserved", "<u4")])
MIN_FRAME_BYTES = 64
MAX_NAME_BYTES = 65536 * 257  # the field names of a table: at most 65,536 names of at most 255 bytes (+ 2)
_SHARD_RE = re.compile(r"^shard-(\d{3,})\.tqd$")
_KIND_CODES = {v: k for k, v in KIND_NAMES.items()}
#: a schema's dtype name in ``rows.json``: a frame dtype's name, or "mixed" (a tensor or ndarray
#: field whose rows hold several dtypes: each frame's is in its header)
_SCHEMA_DTYPE_NAMES = {**DTYPE_NAMES, SCHEMA_MIXED: "mixed"}
_DTYPE_CODES = {v: k for k, v in _SCHEMA_DTYPE_NAMES.items()}
assert SHARD_HEADER.size == SHARD_HEADER_SIZE and ENTRY_DTYPE.itemsize == 32


def schema_dtype_name(code: int) -> str:
    """The name ``rows.json`` gives a schema's dtype code (a frame dtype's name, or "mixed")."""
    return _SCHEMA_DTYPE_NAMES[code]


def shard_name(unit: int) -> str:
    """The file name of source unit ``unit``'s shard: ``shard-NNN.tqd`` (at least 3 digits)."""
    return f"shard-{int(unit):03d}.tqd"


def _bad(what: str, msg: str, path: Optional[str], offset: Optional[int] = None) -> CorruptionError:
    return CorruptionError(f"{what}: {msg}", path=path, offset=offset)


def _version(what: str, v: Any, path: Optional[str]) -> None:
    if type(v) is not int or v != DUMP_VERSION:
        raise FormatVersionError(f"{what} version {_brief(v)} is not supported (this tqstore reads version "
                                 f"{DUMP_VERSION})", path=path)


# ---------------------------------------------------------------------------- shards
@dataclass(frozen=True)
class ShardHeader:
    """The 64-byte header of a shard."""

    unit: int
    num_units: int
    frames: int
    table_offset: int
    table_len: int
    table_crc: int

    @property
    def size(self) -> int:
        """The shard's exact file size."""
        return self.table_offset + self.table_len


@dataclass(frozen=True)
class ShardTable:
    """A shard's table: ``entries`` (``ENTRY_DTYPE``, by offset) and the field ``names``."""

    entries: np.ndarray
    names: Tuple[str, ...]

    def fields(self) -> List[str]:
        """The field name of every entry."""
        return [self.names[i] for i in self.entries["field"].tolist()]


def encode_shard_table(gidxs: Sequence[int], lengths: Sequence[int], crcs: Sequence[int],
                       field_ids: Sequence[int], names: Sequence[str]) -> bytes:
    """The table of a shard whose frames are laid back to back from offset 64 in this order."""
    n = len(gidxs)
    e = np.zeros(n, ENTRY_DTYPE)
    e["gidx"] = np.asarray(gidxs, dtype=np.uint64)
    e["length"] = np.asarray(lengths, dtype=np.uint32)
    e["crc"] = np.asarray(crcs, dtype=np.uint32)
    e["field"] = np.asarray(field_ids, dtype=np.uint32)
    if n:
        e["offset"][0] = SHARD_HEADER_SIZE
        e["offset"][1:] = SHARD_HEADER_SIZE + np.cumsum(e["length"][:-1].astype(np.uint64))
    out = [e.tobytes(), struct.pack("<I", len(names))]
    for name in names:
        b = name.encode("utf-8")
        out.append(struct.pack("<H", len(b)) + b)
    return b"".join(out)


def encode_shard_header(unit: int, num_units: int, frames: int, frame_bytes: int, table: bytes) -> bytes:
    """The 64-byte header (its own CRC32C in the last 4 bytes)."""
    head = SHARD_HEADER.pack(SHARD_MAGIC, DUMP_VERSION, 0, unit, num_units, frames, SHARD_HEADER_SIZE + frame_bytes,
                             len(table), _native.crc32c(table), bytes(16), 0)
    return head[:60] + struct.pack("<I", _native.crc32c(head[:60]))


def decode_shard_header(raw: Any, *, path: Optional[str] = None, file_size: Optional[int] = None) -> ShardHeader:
    """Check and decode a shard's first 64 bytes (``file_size``: the file's size, which must
    be exactly the header's ``table_offset + table_len``).

    Raises:
        FormatVersionError: a shard of another version.
        CorruptionError: not a shard, a bad header CRC, or sizes that do not add up.
    """
    b = bytes(raw[:SHARD_HEADER_SIZE])
    what = "dump shard header"
    if len(b) < SHARD_HEADER_SIZE:
        raise _bad(what, f"{len(b)} bytes, a shard starts with {SHARD_HEADER_SIZE}", path, len(b))
    magic, ver, flags, unit, nu, n, toff, tlen, tcrc, rsv, hcrc = SHARD_HEADER.unpack(b)
    if magic != SHARD_MAGIC:
        raise _bad(what, f"magic {magic!r} is not {SHARD_MAGIC!r} (not a tqstore dump shard)", path, 0)
    _version("dump shard", ver, path)
    got = _native.crc32c(b[:60])
    if got != hcrc:
        raise CorruptionError(f"{what}: CRC32C mismatch", path=path, offset=0, expected_crc=hcrc, actual_crc=got)
    if flags or rsv != bytes(16):
        raise _bad(what, "reserved bits are set", path, 6)
    if nu < 1 or unit >= nu:
        raise _bad(what, f"unit {unit} of {nu} units", path, 8)
    base = n * ENTRY_DTYPE.itemsize + 4
    if toff < SHARD_HEADER_SIZE or toff % ALIGN or not base <= tlen <= base + MAX_NAME_BYTES \
            or toff - SHARD_HEADER_SIZE < n * MIN_FRAME_BYTES or (n == 0) != (toff == SHARD_HEADER_SIZE):
        raise _bad(what, f"table at {toff} of {tlen} bytes cannot hold {n} frames", path, 24)
    if file_size is not None and file_size != toff + tlen:
        raise _bad(what, f"the file holds {file_size} bytes, its header says {toff + tlen}", path,
                   min(file_size, toff + tlen))
    return ShardHeader(unit, nu, n, toff, tlen, tcrc)


def decode_shard_table(raw: Any, header: ShardHeader, *, path: Optional[str] = None) -> ShardTable:
    """Check and decode a shard's table (the ``header.table_len`` bytes at ``table_offset``).

    Checks: its CRC32C; frames back to back from offset 64 to the table, each at least 64
    bytes and a multiple of 64; field ids below the name count; names UTF-8, 1 to 255 bytes,
    distinct; every gidx on the header's unit (``gidx % num_units == unit``); no
    ``(gidx, field)`` twice.  Raises CorruptionError naming ``path`` and the table offset.
    """
    what, at = "dump shard table", header.table_offset
    b = memoryview(raw).cast("B")
    if b.nbytes != header.table_len:
        raise _bad(what, f"{b.nbytes} bytes, the header says {header.table_len}", path, at)
    got = _native.crc32c(b)
    if got != header.table_crc:
        raise CorruptionError(f"{what}: CRC32C mismatch", path=path, offset=at, expected_crc=header.table_crc,
                              actual_crc=got)
    n = header.frames
    e = np.frombuffer(b[:n * ENTRY_DTYPE.itemsize], ENTRY_DTYPE).copy()
    pos = n * ENTRY_DTYPE.itemsize
    (count,) = struct.unpack_from("<I", b, pos)
    pos += 4
    if count > 65536:
        raise _bad(what, f"{count} field names (at most 65536)", path, at + pos - 4)
    names: List[str] = []
    for _ in range(count):
        if pos + 2 > b.nbytes:
            raise _bad(what, "field names run past its end", path, at + pos)
        (ln,) = struct.unpack_from("<H", b, pos)
        if not 1 <= ln <= 255 or pos + 2 + ln > b.nbytes:
            raise _bad(what, f"a field name of {ln} bytes", path, at + pos)
        try:
            names.append(bytes(b[pos + 2:pos + 2 + ln]).decode("utf-8"))
        except UnicodeDecodeError:
            raise _bad(what, "a field name is not UTF-8", path, at + pos) from None
        pos += 2 + ln
    if pos != b.nbytes or len(set(names)) != len(names):
        raise _bad(what, "trailing bytes after the field names, or a name twice", path, at + pos)
    if n:
        ln = e["length"].astype(np.uint64)
        want = SHARD_HEADER_SIZE + np.concatenate(([0], np.cumsum(ln)[:-1])).astype(np.uint64)
        if (ln < MIN_FRAME_BYTES).any() or (ln % ALIGN).any() or (e["offset"] != want).any() \
                or int(want[-1] + ln[-1]) != header.table_offset:
            raise _bad(what, "frames are not laid back to back from offset 64 to the table", path, at)
        if (e["field"] >= len(names)).any() or e["reserved"].any():
            raise _bad(what, "a field id past the names, or reserved bits set", path, at)
        if (e["gidx"] % np.uint64(header.num_units) != header.unit).any():
            raise _bad(what, f"a global index that does not live on unit {header.unit}", path, at)
        o = np.lexsort((e["field"], e["gidx"]))  # (np.unique over pair columns sorts ~10x slower)
        g, f = e["gidx"][o], e["field"][o]
        if ((g[1:] == g[:-1]) & (f[1:] == f[:-1])).any():
            raise _bad(what, "a (global index, field) pair twice", path, at)
    return ShardTable(e, tuple(names))


# ---------------------------------------------------------------------------- JSON documents
def _canonical(body: Mapping[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode("ascii")


def _brief(v: Any, most: int = 80) -> str:
    """``repr(v)`` cut to ``most`` characters, for a message about damage: a value holding an
    integer too long for Python to convert (``sys.get_int_max_str_digits()``) is named by
    its type, so the message itself never raises."""
    try:
        return repr(v)[:most]
    except ValueError:
        return f"<{type(v).__name__} holding an integer too long to show>"


def _load_json(raw: Any, what: str, path: Optional[str], *, big_ints: bool = True) -> Dict[str, Any]:
    """The JSON object ``raw`` holds.  ``big_ints`` False: an integer of more digits than
    Python converts by default (``sys.get_int_max_str_digits()``) is damage, not parsed (a
    manifest holds sizes, CRCs and counts only; a huge one would cost minutes of CPU)."""
    b = bytes(raw)
    if len(b) > MAX_JSON_BYTES:
        raise _bad(what, f"{len(b)} bytes, more than {MAX_JSON_BYTES}", path)
    try:
        doc = _loads(b) if big_ints else json.loads(b.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise _bad(what, f"not UTF-8 JSON ({e})", path) from None
    if not isinstance(doc, dict):
        raise _bad(what, "not a JSON object", path)
    return doc


def _uint(d: Mapping[str, Any], k: str, what: str, path: Optional[str], least: int = 0,
          most: int = (1 << 64) - 1) -> int:
    v = d.get(k)
    if type(v) is not int or not least <= v <= most:
        raise _bad(what, f"member {k!r} must be an int from {least} to {most}, got {_brief(v, 40)}", path)
    return v


def _str(d: Mapping[str, Any], k: str, what: str, path: Optional[str]) -> str:
    v = d.get(k)
    if type(v) is not str or not v:
        raise _bad(what, f"member {k!r} must be a non-empty string, got {type(v).__name__}", path)
    return v


def encode_row_index(pid: str, num_units: int, schemas: Mapping[str, Tuple[int, int]],
                     rows: Sequence[Tuple[str, int, Any, Sequence[str]]]) -> bytes:
    """``rows.json``: the dumped rows ``(key, source gidx, tag, produced fields)`` in dump
    order and the partition's field schemas ``field -> (kind code, dtype code)``.

    The text is that of one compact ASCII JSON document (:func:`encode_row_index_doc`), put
    together row by row from texts made in bulk (the keys' by the C string encoder, the
    tags' by one C encoder, one text per distinct field list): no object per row, which
    halves the time of a dump's row index of thousands of rows."""
    head = _dumps(_row_index_doc(pid, num_units, schemas, []), ensure_ascii=True)
    if not head.endswith('"rows":[]}'):  # (the rows last: the document's member order)
        raise AssertionError("row index head out of order")  # pragma: no cover
    keys, gidxs, tags, fields = (list(c) for c in zip(*rows)) if rows else ([], [], [], [])
    by_fields: Dict[Any, str] = {}
    field_texts = []
    for fs in fields:
        fk = fs if isinstance(fs, frozenset) else tuple(fs)
        t = by_fields.get(fk)
        if t is None:
            t = by_fields[fk] = _dumps(sorted(fs), ensure_ascii=True)
        field_texts.append(t)
    body = ",".join([f'{{"key":{k},"gidx":{int(g)},"tag":{t},"fields":{f}}}' for k, g, t, f in
                     zip(map(_json_str_ascii, keys), gidxs, _dumps_each(tags, ensure_ascii=True), field_texts)])
    return (head[:-2] + body + "]}\n").encode("ascii")


def encode_row_index_doc(pid: str, num_units: int, schemas: Mapping[str, Tuple[int, int]],
                         rows: Sequence[Tuple[str, int, Any, Sequence[str]]]) -> bytes:
    """:func:`encode_row_index` by way of one document object (the reference its text must
    equal, byte for byte)."""
    return (_dumps(_row_index_doc(pid, num_units, schemas, rows), ensure_ascii=True) + "\n").encode("ascii")


def _row_index_doc(pid: str, num_units: int, schemas: Mapping[str, Tuple[int, int]],
                   rows: Sequence[Tuple[str, int, Any, Sequence[str]]]) -> Dict[str, Any]:
    return {"format": ROW_INDEX_FORMAT, "version": DUMP_VERSION, "partition_id": pid, "num_units": int(num_units),
            "schemas": {f: {"kind": KIND_NAMES[k], "dtype": schema_dtype_name(d)}
                        for f, (k, d) in sorted(schemas.items())},
            "rows": [{"key": k, "gidx": int(g), "tag": t, "fields": sorted(fs)} for k, g, t, fs in rows]}


@dataclass(frozen=True)
class RowIndex:
    """A decoded ``rows.json``: the rows in dump order as columns (``keys``, source ``gidxs``,
    ``tags``, produced ``fields``: one entry per row) and schemas ``field -> (kind code, dtype
    code)``; :attr:`rows` is the same as ``key -> {"gidx", "tag", "fields"}``."""

    partition_id: str
    num_units: int
    schemas: Dict[str, Tuple[int, int]]
    keys: List[str]
    gidxs: List[int]
    tags: List[Any]
    fields: List[List[str]]

    def __len__(self) -> int:
        return len(self.keys)

    @functools.cached_property
    def rows(self) -> Dict[str, Dict[str, Any]]:
        """``key -> {"gidx", "tag", "fields"}`` in dump order (built on first use)."""
        return {k: {"gidx": g, "tag": t, "fields": fs}
                for k, g, t, fs in zip(self.keys, self.gidxs, self.tags, self.fields)}


def _row_columns(rows_in: List[Any], schemas: Mapping[str, Tuple[int, int]]) -> Optional[Tuple[list, ...]]:
    """``(keys, gidxs, tags, fields)`` of well-formed rows, checked column by column (types,
    gidx range, keys and gidxs distinct, every field list valid and without repeats); None
    when something does not check (:func:`_check_rows` then names it)."""
    try:
        keys = [r["key"] for r in rows_in]
        gidxs = [r["gidx"] for r in rows_in]
        fields = [r["fields"] for r in rows_in]
        tags = [r["tag"] for r in rows_in]
    except (TypeError, KeyError):  # a row that is not an object, or lacks a member
        return None
    n = len(keys)
    if not set(map(type, rows_in)) <= {dict} or not set(map(type, keys)) <= {str} \
            or not set(map(type, gidxs)) <= {int} or not set(map(type, fields)) <= {list}:
        return None
    if n and (min(gidxs) < 0 or max(gidxs) >= 1 << 64) or len(set(keys)) != n or len(set(gidxs)) != n:
        return None
    try:
        lists = set(map(tuple, fields))
    except TypeError:  # an unhashable field name
        return None
    for fs in lists:
        if not all(type(f) is str and f in schemas for f in fs) or len(set(fs)) != len(fs):
            return None
    return keys, gidxs, tags, fields


def _check_rows(rows_in: List[Any], schemas: Mapping[str, Tuple[int, int]], what: str, path: Optional[str]) -> None:
    """Raise the CorruptionError naming the first row that does not check (see :func:`_row_columns`)."""
    keys = set()
    seen = set()
    for r in rows_in:
        key, g, fs = (r.get("key"), r.get("gidx"), r.get("fields")) if type(r) is dict else (None, None, None)
        ok = type(key) is str and type(g) is int and 0 <= g < 1 << 64 and type(fs) is list and "tag" in r
        if ok:
            try:
                ok = all(type(f) is str and f in schemas for f in fs)
                distinct = len(set(fs)) == len(fs)
            except TypeError:  # an unhashable field name
                ok = False
        if not ok:
            raise _bad(what, f"malformed row {_brief(r)}", path)
        if key in keys or g in seen or not distinct:
            raise _bad(what, f"key {key[:40]!r}, its global index or a field appears twice", path)
        keys.add(key)
        seen.add(g)
    raise AssertionError("rows that do not check as columns checked one by one")  # pragma: no cover


def decode_row_index(raw: Any, *, path: Optional[str] = None) -> RowIndex:
    """Check and decode ``rows.json``: format name, version, types; keys distinct; gidxs
    distinct; every produced field has a schema.  Raises FormatVersionError / CorruptionError."""
    what = "dump row index"
    d = _load_json(raw, what, path)
    if d.get("format") != ROW_INDEX_FORMAT:
        raise _bad(what, f"format {_brief(d.get('format'))} is not {ROW_INDEX_FORMAT!r}", path)
    _version(what, d.get("version"), path)
    pid = _str(d, "partition_id", what, path)
    nu = _uint(d, "num_units", what, path, 1, MAX_UNITS)
    sch, rows_in = d.get("schemas"), d.get("rows")
    if not isinstance(sch, dict) or not isinstance(rows_in, list):
        raise _bad(what, "schemas must be an object and rows a list", path)
    schemas: Dict[str, Tuple[int, int]] = {}
    for f, s in sch.items():
        if not isinstance(s, dict) or type(s.get("kind")) is not str or type(s.get("dtype")) is not str \
                or s["kind"] not in _KIND_CODES or s["dtype"] not in _DTYPE_CODES \
                or (s["dtype"] == "mixed" and s["kind"] == "value"):
            raise _bad(what, f"schema of field {f[:40]!r} is not a known kind and dtype: {_brief(s)}", path)
        schemas[f] = (_KIND_CODES[s["kind"]], _DTYPE_CODES[s["dtype"]])
    cols = _row_columns(rows_in, schemas)
    if cols is None:
        _check_rows(rows_in, schemas, what, path)
    _check_names(pid, schemas, cols[0], what, path)
    return RowIndex(pid, nu, schemas, *cols)


def _check_names(pid: str, schemas: Mapping[str, Any], keys: List[str], what: str, path: Optional[str]) -> None:
    """The partition id, field names and keys are ones a store accepts (as its puts check
    them: no NUL, valid Unicode, within the byte limits); a dump never holds others, so one
    that does is damaged (CorruptionError).  Short ASCII keys without NUL, the usual ones,
    are checked all at once."""
    try:
        check_name("partition_id", pid)
        for f in schemas:
            check_field_name(f)
        joined = "".join(keys)
        if not (joined.isascii() and "\0" not in joined and max(map(len, keys), default=0) <= max_key_bytes(pid)):
            for k in keys:
                check_key(pid, k)
    except InvalidInputError as e:
        raise _bad(what, str(e), path) from None


def encode_manifest(*, created_unix: float, partition_id: str, num_units: int, summary: Mapping[str, int],
                    row_index: Mapping[str, int], shards: Sequence[Mapping[str, int]]) -> bytes:
    """``MANIFEST.json``: the commit point of a dump, written last."""
    body: Dict[str, Any] = {
        "format": MANIFEST_FORMAT, "version": DUMP_VERSION, "tqstore_version": __version__,
        "created_unix": float(created_unix), "partition_id": partition_id, "num_units": int(num_units),
        "summary": {k: int(v) for k, v in summary.items()},
        "row_index": {"path": ROW_INDEX_NAME, "size": int(row_index["size"]), "crc32c": int(row_index["crc32c"])},
        "shards": [{"path": shard_name(s["unit"]), "unit": int(s["unit"]), "size": int(s["size"]),
                    "crc32c": int(s["crc32c"]), "frames": int(s["frames"]), "rows": int(s["rows"]),
                    "payload_bytes": int(s["payload_bytes"])} for s in sorted(shards, key=lambda s: s["unit"])],
    }
    body["manifest_crc32c"] = _native.crc32c(_canonical(body))
    return (json.dumps(body, sort_keys=True, indent=1, ensure_ascii=True, allow_nan=False) + "\n").encode("ascii")


SUMMARY_KEYS = ("keys", "rows_with_data", "frames", "payload_bytes")


def decode_manifest(raw: Any, *, path: Optional[str] = None) -> Dict[str, Any]:
    """Check and decode a dump's ``MANIFEST.json`` (format, then version, then checksum and
    members; shard paths as :func:`shard_name` of their unit, units distinct and below
    ``num_units``).  Returns the object.  Raises FormatVersionError / CorruptionError."""
    what = "dump MANIFEST.json"
    d = _load_json(raw, what, path, big_ints=False)
    if d.get("format") != MANIFEST_FORMAT:
        raise _bad(what, f"format {_brief(d.get('format'))} is not {MANIFEST_FORMAT!r} (not a tqstore dump)", path)
    _version(what, d.get("version"), path)
    want = d.get("manifest_crc32c")
    body = {k: v for k, v in d.items() if k != "manifest_crc32c"}
    try:
        got = _native.crc32c(_canonical(body))
    except (ValueError, TypeError) as e:
        raise _bad(what, f"cannot be canonicalised ({e})", path) from None
    if want != got:
        raise CorruptionError(f"{what}: checksum mismatch", path=path, expected_crc=want if type(want) is int else 0,
                              actual_crc=got)
    _str(d, "partition_id", what, path)
    nu = _uint(d, "num_units", what, path, 1, MAX_UNITS)
    if not isinstance(d.get("summary"), dict) or not all(type(d["summary"].get(k)) is int for k in SUMMARY_KEYS):
        raise _bad(what, f"summary must hold ints {SUMMARY_KEYS}", path)
    ri = d.get("row_index")
    if not isinstance(ri, dict) or ri.get("path") != ROW_INDEX_NAME:
        raise _bad(what, f"row_index must name {ROW_INDEX_NAME}", path)
    _uint(ri, "size", what, path)
    _uint(ri, "crc32c", what, path)
    shards = d.get("shards")
    if not isinstance(shards, list):
        raise _bad(what, "shards must be a list", path)
    units = set()
    for s in shards:
        if not isinstance(s, dict):
            raise _bad(what, "a shard entry is not an object", path)
        u = _uint(s, "unit", what, path)
        for k in ("size", "crc32c", "frames", "rows", "payload_bytes"):
            _uint(s, k, what, path)
        if u >= nu or u in units or s.get("path") != shard_name(u) or s["size"] < SHARD_HEADER_SIZE:
            raise _bad(what, f"shard entry {str(s)[:80]} (unit twice, past num_units {nu}, or a bad path)", path)
        units.add(u)
    return d


def is_shard_name(name: str) -> bool:
    return bool(_SHARD_RE.match(name))


__all__ = ["MANIFEST_NAME", "ROW_INDEX_NAME", "MANIFEST_FORMAT", "ROW_INDEX_FORMAT", "DUMP_VERSION", "SHARD_MAGIC",
           "SHARD_HEADER_SIZE", "ENTRY_DTYPE", "ShardHeader", "ShardTable", "RowIndex", "shard_name", "is_shard_name",
           "encode_shard_table", "encode_shard_header", "decode_shard_header", "decode_shard_table",
           "encode_row_index", "decode_row_index", "schema_dtype_name", "encode_manifest", "decode_manifest",
           "SUMMARY_KEYS"]
