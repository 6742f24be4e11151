"""MANIFEST.json of a checkpoint directory (docs/FORMAT.md, "MANIFEST.json").

Bytes in, objects out: this module builds, serialises, parses and validates manifests and
never touches the file system.  The manifest is plain JSON (no pickle, nothing that
executes): the format name and version, the snapshot's summary, the user's metadata and,
for every other file of the checkpoint, its relative path, size and CRC32C.  A
``manifest_crc32c`` member protects the manifest itself.
"""
from __future__ import annotations

import json
import math
import posixpath
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple

from .. import _native
from .._format.values import check_str
from .._version import __version__
from ..errors import CorruptionError, FormatVersionError, InvalidInputError

MANIFEST_NAME = "MANIFEST.json"
FORMAT_NAME = "tqstore-checkpoint"
FORMAT_VERSION = 1
MAX_MANIFEST_BYTES = 256 << 20

ROLE_CONTROLLER = "controller"
ROLE_UNIT_INDEX = "unit_index"
ROLE_SEGMENT = "segment"
ROLES = (ROLE_CONTROLLER, ROLE_UNIT_INDEX, ROLE_SEGMENT)

#: block size of the per-block CRCs kept for index files (to name the damaged offset)
INDEX_BLOCK_BYTES = 1 << 20

CONTROLLER_FILE = "controller/data.mdb"


def unit_dir_name(unit: int) -> str:
    return f"unit-{unit:03d}"


def unit_index_file(unit: int) -> str:
    return f"{unit_dir_name(unit)}/index/data.mdb"


def segment_file(unit: int, seg: int) -> str:
    return f"{unit_dir_name(unit)}/seg-{seg:08d}.tqs"


@dataclass(frozen=True)
class FileEntry:
    """One file of a checkpoint. ``path`` is relative, POSIX, inside the checkpoint."""

    path: str
    role: str
    size: int
    crc32c: int
    unit: Optional[int] = None
    seg: Optional[int] = None
    frames: Optional[int] = None  # segments: indexed frames it holds
    live_bytes: Optional[int] = None  # segments: bytes of those frames
    origin: Optional[str] = None  # segments: identity of the store file it was saved from
    block_crc32c: Optional[Tuple[int, ...]] = None  # index files: CRC of each INDEX_BLOCK_BYTES block

    def to_json(self) -> Dict[str, Any]:
        d: Dict[str, Any] = {"path": self.path, "role": self.role, "size": self.size, "crc32c": self.crc32c}
        for k in ("unit", "seg", "frames", "live_bytes", "origin"):
            v = getattr(self, k)
            if v is not None:
                d[k] = v
        if self.block_crc32c is not None:
            d["block_crc32c"] = list(self.block_crc32c)
        return d


@dataclass(frozen=True)
class Manifest:
    """A parsed, validated manifest."""

    version: int
    created_unix: float
    tqstore_version: str
    include_storage: bool
    num_units: int
    snapshot: Dict[str, Any]
    metadata: Dict[str, Any]
    files: Tuple[FileEntry, ...]
    raw: Dict[str, Any] = field(repr=False, compare=False, default_factory=dict)

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def rows(self) -> int:
        return int(self.snapshot.get("rows", 0))

    def by_role(self, role: str) -> List[FileEntry]:
        return [f for f in self.files if f.role == role]

    def segments(self, unit: int) -> Dict[int, FileEntry]:
        return {f.seg: f for f in self.files if f.role == ROLE_SEGMENT and f.unit == unit}

    def find(self, path: str) -> Optional[FileEntry]:
        for f in self.files:
            if f.path == path:
                return f
        return None


_JSON_INT_DIGITS = 4300  # (Python's default int_max_str_digits: what json reads and writes)
_JSON_INT_LIMIT = 10 ** _JSON_INT_DIGITS


def check_metadata(metadata: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    """Validate user metadata: a mapping with str keys of strict JSON values (no NaN/inf).

    Returns a plain-dict copy. Raises InvalidInputError (a ValueError) otherwise.
    """
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        raise InvalidInputError(f"metadata must be a mapping of str to JSON values, got {type(metadata).__name__}")

    def walk(v: Any, where: str, depth: int) -> Any:
        if depth > 64:
            raise InvalidInputError(f"metadata is nested too deeply at {where}")
        if isinstance(v, str):
            return check_str(v, f"metadata value at {where}")
        if v is None or isinstance(v, bool):
            return v
        if isinstance(v, int):
            if v.bit_length() > 14000 and abs(v) >= _JSON_INT_LIMIT:
                raise InvalidInputError(f"metadata value at {where} is an integer of more than {_JSON_INT_DIGITS} "
                                        f"digits, which JSON readers refuse; store it as a str")
            return v
        if isinstance(v, float):
            if not math.isfinite(v):
                raise InvalidInputError(f"metadata value at {where} is {v}; JSON has no NaN or infinity")
            return v
        if isinstance(v, (list, tuple)):
            return [walk(x, f"{where}[{i}]", depth + 1) for i, x in enumerate(v)]
        if isinstance(v, Mapping):
            out = {}
            for k, x in v.items():
                if not isinstance(k, str):
                    raise InvalidInputError(f"metadata key {k!r} at {where} is not a str")
                check_str(k, f"metadata key at {where}")
                out[k] = walk(x, f"{where}.{k}", depth + 1)
            return out
        raise InvalidInputError(f"metadata value at {where} is a {type(v).__name__}; only JSON values (str, int, "
                                f"float, bool, None, lists and dicts with str keys) are stored")

    return walk(metadata, "metadata", 0)


def _canonical(body: Mapping[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False).encode("ascii")


def build(*, created_unix: float, include_storage: bool, num_units: int, snapshot: Mapping[str, Any],
          metadata: Mapping[str, Any], files: List[FileEntry]) -> bytes:
    """Serialise a manifest (pretty JSON with the ``manifest_crc32c`` member)."""
    body: Dict[str, Any] = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "tqstore_version": __version__,
        "created_unix": float(created_unix),
        "include_storage": bool(include_storage),
        "num_units": int(num_units),
        "snapshot": dict(snapshot),
        "metadata": dict(metadata),
        "files": [f.to_json() for f in files],
    }
    body["manifest_crc32c"] = _native.crc32c(_canonical(body))
    return (json.dumps(body, sort_keys=True, indent=1, allow_nan=False) + "\n").encode("ascii")


#: the largest ``created_unix`` a reader takes (the year 5138); the counts of ``snapshot`` that
#: must be ints >= 0 when present
CREATED_MAX = 1e11
SNAPSHOT_COUNTS = ("rows", "partitions", "next_gidx", "frames", "payload_bytes", "segments")


def _bad(msg: str, path: str) -> CorruptionError:
    return CorruptionError(f"{MANIFEST_NAME} is malformed: {msg}", path=path)


def _int(d: Mapping[str, Any], k: str, path: str, *, optional: bool = False, minimum: int = 0) -> Optional[int]:
    v = d.get(k)
    if v is None and optional:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
        raise _bad(f"{k!r} must be an int >= {minimum}, got {v!r}", path)
    return v


def _safe_relpath(p: Any, path: str) -> str:
    if not isinstance(p, str) or not p or p.startswith("/") or "\\" in p or "\0" in p:
        raise _bad(f"file path {p!r} is not a relative POSIX path", path)
    norm = posixpath.normpath(p)
    if norm != p or norm.startswith("..") or norm == "." or norm == MANIFEST_NAME:
        raise _bad(f"file path {p!r} is not a plain path inside the checkpoint", path)
    return p


def _entry(d: Any, path: str) -> FileEntry:
    if not isinstance(d, dict):
        raise _bad("a files entry is not an object", path)
    role = d.get("role")
    if role not in ROLES:
        raise _bad(f"unknown file role {role!r}", path)
    rel = _safe_relpath(d.get("path"), path)
    size = _int(d, "size", path)
    crc = _int(d, "crc32c", path)
    if crc > 0xFFFFFFFF:
        raise _bad(f"crc32c of {rel} is out of range", path)
    unit = _int(d, "unit", path, optional=True)
    seg = _int(d, "seg", path, optional=True)
    blocks = d.get("block_crc32c")
    if blocks is not None:
        if not isinstance(blocks, list) or not all(isinstance(b, int) and not isinstance(b, bool)
                                                   and 0 <= b <= 0xFFFFFFFF for b in blocks):
            raise _bad(f"block_crc32c of {rel} must be a list of CRCs", path)
        if len(blocks) != max(1, math.ceil(size / INDEX_BLOCK_BYTES)):
            raise _bad(f"block_crc32c of {rel} has {len(blocks)} entries for {size} bytes", path)
        blocks = tuple(blocks)
    origin = d.get("origin")
    if origin is not None and not isinstance(origin, str):
        raise _bad(f"origin of {rel} must be a string", path)
    e = FileEntry(rel, role, size, crc, unit, seg, _int(d, "frames", path, optional=True),
                  _int(d, "live_bytes", path, optional=True), origin, blocks)
    if role == ROLE_CONTROLLER and rel != CONTROLLER_FILE:
        raise _bad(f"controller file must be {CONTROLLER_FILE}, got {rel}", path)
    if role == ROLE_UNIT_INDEX and (unit is None or rel != unit_index_file(unit)):
        raise _bad(f"unit index entry {rel} does not match its unit {unit}", path)
    if role == ROLE_SEGMENT and (unit is None or seg is None or rel != segment_file(unit, seg)):
        raise _bad(f"segment entry {rel} does not match its unit {unit} and segment {seg}", path)
    return e


def parse(data: bytes, *, path: str = MANIFEST_NAME) -> Manifest:
    """Parse and validate manifest bytes.

    Raises:
        FormatVersionError: the format version is not one this tqstore reads.
        CorruptionError: not JSON, not a tqstore checkpoint manifest, a bad checksum, or a
            member of the wrong type or shape.
    """
    if len(data) > MAX_MANIFEST_BYTES:
        raise _bad(f"{len(data)} bytes is larger than any manifest tqstore writes", path)
    try:
        d = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:  # (nested too deeply: not ours)
        raise CorruptionError(f"{MANIFEST_NAME} is not valid JSON (torn or foreign file): {e}", path=path) from e
    if not isinstance(d, dict) or d.get("format") != FORMAT_NAME:
        raise CorruptionError(f"not a tqstore checkpoint manifest (format is "
                              f"{d.get('format') if isinstance(d, dict) else type(d).__name__!r})", path=path)
    version = d.get("version")
    if version != FORMAT_VERSION:
        raise FormatVersionError(f"checkpoint format version {version!r} is not supported (this tqstore "
                                 f"{__version__} reads version {FORMAT_VERSION})", path=path)
    crc = d.get("manifest_crc32c")
    body = {k: v for k, v in d.items() if k != "manifest_crc32c"}
    try:
        actual = _native.crc32c(_canonical(body))
    except ValueError as e:
        raise _bad(f"holds a non-JSON number: {e}", path) from e
    if not isinstance(crc, int) or crc != actual:
        raise CorruptionError(f"{MANIFEST_NAME} checksum mismatch (edited or damaged)", path=path,
                              expected_crc=crc if isinstance(crc, int) else None,
                              actual_crc=actual if isinstance(crc, int) else None)
    num_units = _int(d, "num_units", path, minimum=1)
    include_storage = d.get("include_storage")
    if not isinstance(include_storage, bool):
        raise _bad("'include_storage' must be a bool", path)
    snapshot, metadata = d.get("snapshot"), d.get("metadata")
    if not isinstance(snapshot, dict) or not isinstance(metadata, dict):
        raise _bad("'snapshot' and 'metadata' must be objects", path)
    created = d.get("created_unix")
    if not isinstance(created, (int, float)) or isinstance(created, bool) or not 0 <= created < CREATED_MAX:
        raise _bad(f"'created_unix' must be a number of seconds in [0, {CREATED_MAX:.0e}), got {created!r:.40}", path)
    for k in SNAPSHOT_COUNTS:  # (the counts a save records: readers print and sum them)
        if k in snapshot:
            _int(snapshot, k, path)
    flist = d.get("files")
    if not isinstance(flist, list):
        raise _bad("'files' must be a list", path)
    entries = tuple(_entry(x, path) for x in flist)
    seen = set()
    for e in entries:
        if e.path in seen:
            raise _bad(f"file {e.path} is listed twice", path)
        seen.add(e.path)
        if e.unit is not None and e.unit >= num_units:
            raise _bad(f"file {e.path} names unit {e.unit} of a {num_units}-unit checkpoint", path)
    if not any(e.role == ROLE_CONTROLLER for e in entries):
        raise _bad("no controller file is listed", path)
    if include_storage:
        have = {e.unit for e in entries if e.role == ROLE_UNIT_INDEX}
        if have != set(range(num_units)):
            raise _bad(f"unit indexes listed for units {sorted(have)}, expected 0..{num_units - 1}", path)
    tv = d.get("tqstore_version")
    return Manifest(version, float(created), str(tv), include_storage, num_units, snapshot, metadata, entries, d)
