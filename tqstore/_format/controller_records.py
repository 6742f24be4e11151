"""Keys and values of the controller's LMDB index, format version 3 (and the version-1 row
values it still reads; docs/FORMAT.md, "Controller index"): the one definition of their bytes
(the ``sampler`` database's records of cached results: :mod:`tqstore._format.sampler_records`).

Every writer and reader of the controller index (the controller, its decoder, checkpoint
loading and verification, the CLI) encodes and decodes through these functions.  Bytes
in, objects out: no I/O, no LMDB.  Names are UTF-8, ``\\0`` separates the parts of a
composite key, a *gidx key* is a global index as u64 big-endian:

==========  ==================================  =====================================================
db          key                                 value
==========  ==================================  =====================================================
``meta``    ``format`` ``num_units``            ASCII decimal (:func:`encode_decimal`)
            ``next_gidx`` ``put_token``
``free``    gidx key (:func:`gidx_key`)         empty
``parts``   partition id (:func:`parts_key`)    :func:`encode_partition` (JSON, default separators)
``keys``    :func:`keys_key` (pid ``\\0`` key)   gidx key
``rows``    gidx key                            :func:`encode_row2` (binary; v1: :func:`encode_row`, JSON)
``cons``    :func:`cons_key`                    empty
            (task ``\\0`` pid ``\\0`` gidx key)
``schema``  :func:`schema_key` (pid ``\\0`` f)   :func:`encode_schema` (JSON, default separators)
``sampler`` partition id                        :func:`encode_sampler` (JSON, default separators)
            pid ``\\0`` u64 number                  a cached result (:mod:`~tqstore._format.sampler_records`)
``restores`` :func:`restore_key` (restore id)    :func:`encode_restore` (compact ASCII JSON)
            :func:`restore_chunk_key`           :func:`encode_restore_rows` (compact ASCII JSON)
            (id ``\\0`` chunk u32)
==========  ==================================  =====================================================

Every ``decode_*`` raises :class:`~tqstore._format.records.RecordError` (a ``ValueError``)
and nothing else for malformed input; callers name the file and entry in a
``CorruptionError``.  Consistency across entries (a row's partition exists, a key is
claimed once) is the caller's: these functions see one entry at a time.
"""
from __future__ import annotations

import json
import struct
from typing import Any, AbstractSet, Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from ..errors import CapacityError
from .dtypes import DTYPE_NAMES, SCHEMA_MIXED
from .layout import KIND_VALUE, KINDS
from .records import (
    RecordError, decode_decimal, decode_json_object, decode_optional_decimal, decode_utf8, encode_decimal, is_uint,
    member,
)
from .values import dumps as _dumps_value, dumps_each, loads as _loads_value

#: the controller index format version this code writes (``meta/format``)
CONTROLLER_FORMAT = 3
#: the versions it reads (1 and 2 are migrated to 3 when a store opens them for writing; 2 differs
#: from 3 only in keeping a partition's cached sampler results inside its ``sampler`` record)
CONTROLLER_FORMATS_READ = (1, 2, 3)

#: the named databases of the controller index (``restores``: unresolved selective restores)
CONTROLLER_DBS = ("meta", "free", "parts", "keys", "rows", "cons", "schema", "sampler", "restores")

#: keys of the ``meta`` database
META_FORMAT = b"format"
META_NUM_UNITS = b"num_units"
META_NEXT_GIDX = b"next_gidx"
META_PUT_TOKEN = b"put_token"
META_RESTORE_TAG = b"restore_tag"  # the last restore tag handed out (absent: none yet)
#: the first sequence number of a new partition: at least the ``next_seq`` of every partition
#: dropped before (absent: 0), so a partition created again under a dropped one's id never
#: repeats its numbers and a stale BatchMeta of the dropped one matches none of its rows
META_SEQ_FLOOR = b"seq_floor"
#: every partition's first sequence number is a multiple of SEQ_ALIGN (2**4 * 7 * 11 * ... * 31,
#: about 1.07e11: the rows one partition can take before it is dropped; a drop moves the next
#: partition's numbers one such block up, so a store has room for more than 4e7 drops), and a
#: raise keeps each partition's next_seq the same modulo it: the residues, which samplers see,
#: count the partition's rows from 0 (GRPO groups of any size are counted from its first row;
#: docs/FORMAT.md).  The value of earlier versions (2**8 * 3**3 * 5**2 * 7 * ... * 31) is a
#: multiple of it: their indexes hold the same residues.
SEQ_ALIGN = 2**4 * 7 * 11 * 13 * 17 * 19 * 23 * 29 * 31
#: sequence numbers are below SEQ_LIMIT (they are int64 in memory)
SEQ_LIMIT = 2**63


def seq_exhausted(what: str) -> CapacityError:
    """The error of a put, drop or raise that would give out a sequence number past
    :data:`SEQ_LIMIT` (more than 4e7 partitions dropped in one store, or 1e11 rows put into one)."""
    return CapacityError(f"{what}: this store's sequence numbers are used up (each dropped partition and each "
                         f"checkpoint load takes a block of {SEQ_ALIGN}); nothing was written: move the rows "
                         f"you need into a new store (dump_data_by_key, then load_data_by_key there)")


def seq_aligned(seq: int) -> int:
    """The first multiple of :data:`SEQ_ALIGN` at or above ``seq``."""
    return -(-int(seq) // SEQ_ALIGN) * SEQ_ALIGN


def seq_raised(next_seq: int, floor: int) -> int:
    """``next_seq`` raised past ``floor - 1`` by a multiple of :data:`SEQ_ALIGN` (unchanged when
    it is there already): a partition's groups go on where they were."""
    return next_seq if next_seq >= floor else next_seq + seq_aligned(floor - next_seq)
META_CLEAN = b"clean"  # the clean-close marker (absent: the store was not closed cleanly; see encode_clean)

GIDX_BYTES = 8


# ---------------------------------------------------------------------------- keys
def gidx_key(gidx: int) -> bytes:
    """Key of ``rows`` and ``free``, value of ``keys``: the global index, u64 big-endian."""
    return gidx.to_bytes(GIDX_BYTES, "big")


def decode_gidx_key(raw: Any) -> int:
    """The global index of a gidx key. Raises RecordError unless it is 8 bytes."""
    if raw is None or len(raw) != GIDX_BYTES:
        raise RecordError(f"not a global index (8 bytes): {None if raw is None else bytes(raw)[:40]!r}")
    return int.from_bytes(raw, "big")


def parts_key(pid: str) -> bytes:
    """Key of ``parts`` and ``sampler``: the partition id (UTF-8)."""
    return pid.encode()


sampler_key = parts_key


def decode_parts_key(raw: Any) -> str:
    """The partition id of a ``parts`` or ``sampler`` key. Raises RecordError (not UTF-8)."""
    return decode_utf8(raw, "partition id")


def keys_key(pid: str, key: str) -> bytes:
    """Key of ``keys``: partition id ``\\0`` key."""
    return pid.encode() + b"\0" + key.encode()


def decode_keys_key(raw: Any) -> Tuple[str, str]:
    """``(partition id, key)`` of a ``keys`` key. Raises RecordError."""
    pid, sep, key = decode_utf8(raw, "keys key").partition("\0")
    if not sep or not pid:
        raise RecordError("not partition NUL key")
    return pid, key


def cons_prefix(task: str, pid: str) -> bytes:
    """The common head of the ``cons`` keys of ``(task, pid)``: task ``\\0`` pid ``\\0``."""
    return task.encode() + b"\0" + pid.encode() + b"\0"


def cons_key(task: str, pid: str, gidx: int) -> bytes:
    """Key of ``cons``: task ``\\0`` partition id ``\\0`` gidx key (the row was consumed)."""
    return cons_prefix(task, pid) + gidx.to_bytes(GIDX_BYTES, "big")


def decode_cons_key(raw: Any) -> Tuple[str, str, int]:
    """``(task, partition id, gidx)`` of a ``cons`` key. Raises RecordError."""
    k = bytes(raw) if raw is not None else b""
    task, sep, pid = decode_utf8(k[:-9], "consumption key").partition("\0")
    if len(k) < 11 or k[-9] != 0 or not sep or not task or not pid:
        raise RecordError("not task NUL partition NUL global index")
    return task, pid, int.from_bytes(k[-8:], "big")


def schema_key(pid: str, field: str) -> bytes:
    """Key of ``schema``: partition id ``\\0`` field name."""
    return (pid + "\0" + field).encode()


def decode_schema_key(raw: Any) -> Tuple[str, str]:
    """``(partition id, field)`` of a ``schema`` key. Raises RecordError."""
    pid, sep, field = decode_utf8(raw, "schema key").partition("\0")
    if not sep or not pid or not field:
        raise RecordError("not partition NUL field")
    return pid, field


# ---------------------------------------------------------------------------- meta values
# ASCII decimals: encode_decimal / decode_decimal / decode_optional_decimal (re-exported)


# ---------------------------------------------------------------------------- rows
class RowRecord(NamedTuple):
    """A ``rows`` value: partition id, key (None: unkeyed), tag (a JSON value; None: no
    tag), produced fields (sorted), partition-local sequence number."""

    pid: str
    key: Optional[str]
    tag: Any
    fields: Tuple[str, ...]
    seq: int


def encode_row(pid: str, key: Optional[str], tag: Any, fields: Iterable[str], seq: int) -> bytes:
    """A ``rows`` value: compact ASCII JSON ``{"p", "k", "t", "f" (sorted), "s"}``; ``tag`` is a
    checked value (:func:`tqstore._format.values.check_value`), integers of any size included."""
    return _dumps_value({"p": pid, "k": key, "t": tag, "f": sorted(fields), "s": seq}, ensure_ascii=True).encode()


def decode_row(raw: Any) -> RowRecord:
    """The :class:`RowRecord` of a ``rows`` value. Raises RecordError."""
    d = decode_json_object(raw, "row")
    p, k, t, f, s = (member(d, m, "row") for m in ("p", "k", "t", "f", "s"))
    if type(p) is not str or not (k is None or type(k) is str) or type(f) is not list \
            or not is_uint(s) or not all(type(x) is str for x in f):
        raise RecordError(f"row members of the wrong type: p {type(p).__name__}, k {type(k).__name__}, "
                          f"f {type(f).__name__}, s {type(s).__name__}")
    return RowRecord(p, k, t, tuple(f), s)


# ---------------------------------------------------------------------------- rows, version 2
#: head of a version-2 ``rows`` value: partition number u32, flags u16, bitmap words u16, seq u64 (LE)
ROW2_HEAD = struct.Struct("<IHHQ")
ROW2_KEYED = 1  # flag: the row has a key (its ``keys`` entry names it)
ROW2_TAGGED = 2  # flag: a tag (compact JSON) follows the bitmap
ROW2_FLAGS = ROW2_KEYED | ROW2_TAGGED
#: the most bitmap words a row value may have (fields of one partition: 64 x this)
ROW2_MAX_WORDS = 1024


def row2_bitmap(mask: int) -> Tuple[int, bytes]:
    """``(words, bytes)`` of a produced-field bitmap (at least one u64 word, little-endian)."""
    words = max(1, (mask.bit_length() + 63) // 64)
    return words, mask.to_bytes(8 * words, "little")


def encode_row2(part: int, keyed: bool, seq: int, mask: int, tag_json: Optional[bytes] = None) -> bytes:
    """A version-2 ``rows`` value: :data:`ROW2_HEAD`, the bitmap of produced fields (bit ``b``:
    the field whose ``schema`` entry has ``"bit": b``), then the tag's compact JSON when tagged."""
    words, bm = row2_bitmap(mask)
    flags = (ROW2_KEYED if keyed else 0) | (ROW2_TAGGED if tag_json is not None else 0)
    head = ROW2_HEAD.pack(part, flags, words, seq) + bm
    return head if tag_json is None else head + tag_json


def _is_not_none(x: Any) -> bool:
    return x is not None


#: a version-2 row value of one bitmap word and no tag, as a numpy structured dtype (24 bytes)
ROW2_DTYPE = np.dtype([("part", "<u4"), ("flags", "<u2"), ("words", "<u2"), ("seq", "<u8"), ("mask", "<u8")])


def encode_rows2(part: int, keyed: np.ndarray, seqs: np.ndarray, masks: Sequence[int],
                 tag_json: Optional[Sequence[Optional[bytes]]] = None) -> List[bytes]:
    """:func:`encode_row2` of many rows of one partition (``keyed``, ``seqs``, ``masks``,
    ``tag_json`` per row): when every mask fits one word, the heads and bitmaps are encoded
    together as one array and each tag appended to its row's."""
    n = len(seqs)
    if not n:
        return []
    if isinstance(masks, np.ndarray) and masks.dtype == np.uint64 or all(0 <= m < 1 << 64 for m in set(masks)):
        a = np.empty(n, dtype=ROW2_DTYPE)
        flags = np.where(keyed, ROW2_KEYED, 0)
        if tag_json is not None:
            flags |= np.fromiter(map(_is_not_none, tag_json), bool, n) * ROW2_TAGGED
        a["part"], a["flags"], a["words"] = part, flags, 1
        a["seq"], a["mask"] = seqs, np.asarray(masks, dtype=np.uint64)
        heads = a.view(f"V{ROW2_DTYPE.itemsize}").tolist()  # bytes per row, made at C speed
        if tag_json is None:
            return heads
        return [h if t is None else h + t for h, t in zip(heads, tag_json)]
    tj = tag_json if tag_json is not None else [None] * n
    ml = masks.tolist() if isinstance(masks, np.ndarray) else masks
    return [encode_row2(part, bool(k), int(q), int(m), t)
            for k, q, m, t in zip(np.asarray(keyed).tolist(), np.asarray(seqs).tolist(), ml, tj)]


def gidx_keys(gidxs: np.ndarray) -> List[bytes]:
    """:func:`gidx_key` of many global indexes."""
    # (a void dtype: .tolist() gives each element's bytes, trailing NULs kept, at C speed)
    return np.ascontiguousarray(gidxs, dtype=">u8").view(f"V{GIDX_BYTES}").reshape(-1).tolist()


def encode_tag(tag: Any) -> Optional[bytes]:
    """The tag part of a version-2 row value (None: no tag): compact ASCII JSON of a checked value."""
    return None if tag is None else _dumps_value(tag, ensure_ascii=True).encode()


def encode_tags(tags: Sequence[Any]) -> List[Optional[bytes]]:
    """:func:`encode_tag` of many tags (one C JSON encoder for them all)."""
    texts = dumps_each(tags, ensure_ascii=True)
    return [None if t is None else x.encode() for t, x in zip(tags, texts)]


class Row2(NamedTuple):
    """A version-2 ``rows`` value decoded: partition number, flags, seq, bitmap, tag (None: none)."""

    part: int
    flags: int
    seq: int
    mask: int
    tag: Any


def decode_row2(raw: Any) -> Row2:
    """A version-2 ``rows`` value. Raises RecordError (short, unknown flags, bitmap words out of
    range, a tag that is not JSON, a tag where the flags say none)."""
    b = bytes(raw) if raw is not None else b""
    if len(b) < ROW2_HEAD.size + 8:
        raise RecordError(f"row value of {len(b)} bytes, expected at least {ROW2_HEAD.size + 8}")
    part, flags, words, seq = ROW2_HEAD.unpack_from(b)
    end = ROW2_HEAD.size + 8 * words
    if flags & ~ROW2_FLAGS or not 1 <= words <= ROW2_MAX_WORDS or len(b) < end:
        raise RecordError(f"row value: flags {flags:#x}, {words} bitmap words, {len(b)} bytes")
    mask = int.from_bytes(b[ROW2_HEAD.size:end], "little")
    tag = None
    if flags & ROW2_TAGGED:
        try:
            tag = _loads_value(b[end:])
        except (ValueError, RecursionError) as e:
            raise RecordError(f"row tag: {e}") from None
        if tag is None:
            raise RecordError("row tag: null where the flags say tagged")
    elif len(b) != end:
        raise RecordError(f"row value: {len(b) - end} bytes after the bitmap of an untagged row")
    return Row2(part, flags, seq, mask, tag)


# ---------------------------------------------------------------------------- parts
def encode_partition(next_seq: int, meta: Optional[Dict[str, Any]] = None, num: Optional[int] = None) -> bytes:
    """A ``parts`` value: JSON ``{"next_seq": int, "meta": {}, "num": int}`` (default separators;
    ``num``, the partition's number in row values, from version 2 on)."""
    d: Dict[str, Any] = {"next_seq": next_seq, "meta": {} if meta is None else meta}
    if num is not None:
        d["num"] = num
    return json.dumps(d).encode()


def decode_partition(raw: Any) -> Tuple[int, Dict[str, Any]]:
    """``(next_seq, meta)`` of a ``parts`` value (``meta`` absent reads as ``{}``). Raises RecordError."""
    return decode_partition2(raw)[:2]


def decode_partition2(raw: Any) -> Tuple[int, Dict[str, Any], Optional[int]]:
    """``(next_seq, meta, num)`` of a ``parts`` value (``num`` None when absent: version 1).
    Raises RecordError."""
    d = decode_json_object(raw, "partition")
    seq, meta, num = member(d, "next_seq", "partition"), d.get("meta", {}), d.get("num")
    if not is_uint(seq) or not isinstance(meta, dict) or not (num is None or (is_uint(num) and num < 1 << 31)):
        raise RecordError("partition: next_seq must be an int >= 0, meta an object and num an int in [0, 2**31)")
    return seq, meta, num


# ---------------------------------------------------------------------------- schema
def encode_schema(kind: int, dtype: int, bit: Optional[int] = None) -> bytes:
    """A ``schema`` value: JSON ``{"kind": int, "dtype": int, "bit": int}`` (default separators;
    ``bit``, the field's bit in row bitmaps, from version 2 on)."""
    d = {"kind": kind, "dtype": dtype}
    if bit is not None:
        d["bit"] = bit
    return json.dumps(d).encode()


def decode_schema(raw: Any) -> Tuple[int, int]:
    """``(kind, dtype code)`` of a ``schema`` value, both known codes (``SCHEMA_MIXED`` for a tensor or
    ndarray field whose rows hold several dtypes). Raises RecordError."""
    return decode_schema2(raw)[:2]


def decode_schema2(raw: Any) -> Tuple[int, int, Optional[int]]:
    """``(kind, dtype code, bit)`` of a ``schema`` value (``bit`` None when absent: version 1);
    the dtype may be ``SCHEMA_MIXED`` for a tensor or ndarray field. Raises RecordError."""
    d = decode_json_object(raw, "schema")
    kind, dt, bit = member(d, "kind", "schema"), member(d, "dtype", "schema"), d.get("bit")
    mixed_ok = dt == SCHEMA_MIXED and kind != KIND_VALUE
    if type(kind) is not int or kind not in KINDS or type(dt) is not int or (dt not in DTYPE_NAMES and not mixed_ok):
        raise RecordError(f"schema: not a known kind and dtype ({kind!r}, {dt!r})")
    if not (bit is None or (is_uint(bit) and bit < 64 * ROW2_MAX_WORDS)):
        raise RecordError(f"schema: bit {bit!r} is not an int in [0, {64 * ROW2_MAX_WORDS})")
    return kind, dt, bit


# ---------------------------------------------------------------------------- sampler
def encode_sampler(state: Any) -> bytes:
    """A ``sampler`` value: the JSON of ``{"sampler": name, "state": {task: state}}`` (default
    separators, ASCII)."""
    return json.dumps(state).encode()


def decode_sampler(raw: Any) -> Dict[str, Any]:
    """A ``sampler`` value: a JSON object. Raises RecordError."""
    return decode_json_object(raw, "sampler state")


# ---------------------------------------------------------------------------- restores
#: states of a restore record: units still importing, decided to keep, decided to drop
RESTORE_STATES = ("running", "committed", "cancelled")
#: per-unit states of a running restore
RESTORE_UNIT_STATES = ("pending", "claimed", "complete")
RESTORE_ID_CHARS = frozenset("0123456789abcdef")


class RestoreRecord(NamedTuple):
    """A ``restores`` header value: the restore's unit-side ``tag`` (u64, never reused), its
    partition, dump directory, state, per-unit state and claim attempt, the global indexes it
    reserved (new keys), the fields it adds to the partition's schema and its row count."""

    tag: int
    pid: str
    dump: str
    state: str
    units: Tuple[str, ...]
    attempts: Tuple[int, ...]
    reserved: Tuple[int, ...]
    schema: Dict[str, Tuple[int, int]]
    rows: int
    created_unix: float
    next_gidx: Tuple[int, int] = (0, 0)  # the allocator's next_gidx before and after begin


class RestoreRow(NamedTuple):
    """One row of a restore: the key, its gidx in the dump (``src``) and in the store
    (``gidx``), the tag and produced fields the restore gives it, and whether the restore
    creates the row (a new key).  Rows are kept in dump order."""

    key: str
    src: int
    gidx: int
    tag: Any
    fields: Tuple[str, ...]
    new: bool


#: rows of a restore per ``restores`` row chunk
RESTORE_CHUNK_ROWS = 4096


def restore_key(rid: str) -> bytes:
    """Key of a restore's header in ``restores``: its id (32 lowercase hex digits)."""
    return rid.encode("ascii")


def restore_chunk_key(rid: str, chunk: int) -> bytes:
    """Key of a chunk of a restore's rows in ``restores``: id ``\\0`` chunk number (u32 big-endian)."""
    return rid.encode("ascii") + b"\0" + int(chunk).to_bytes(4, "big")


def decode_restore_key(raw: Any) -> Tuple[str, Optional[int]]:
    """``(restore id, chunk number or None for the header)`` of a ``restores`` key. Raises RecordError."""
    k = bytes(raw) if raw is not None else b""
    rid, sep, c = k.partition(b"\0")
    if len(rid) != 32 or not set(rid.decode("latin-1")) <= RESTORE_ID_CHARS or (sep and len(c) != 4):
        raise RecordError(f"not a restore key: {k[:48]!r}")
    return rid.decode("ascii"), (int.from_bytes(c, "big") if sep else None)


def encode_restore(r: RestoreRecord) -> bytes:
    """A ``restores`` header: compact ASCII JSON ``{"v": 1, "tag", "pid", "dump", "state", "units",
    "attempts", "reserved", "schema": {field: [kind, dtype]}, "rows", "created_unix", "next": [before, after]}``."""
    d = {"v": 1, "tag": r.tag, "pid": r.pid, "dump": r.dump, "state": r.state, "units": list(r.units),
         "attempts": list(r.attempts), "reserved": list(r.reserved),
         "schema": {f: [k, t] for f, (k, t) in sorted(r.schema.items())}, "rows": r.rows,
         "created_unix": r.created_unix, "next": list(r.next_gidx)}
    return json.dumps(d, separators=(",", ":"), ensure_ascii=True).encode()


def decode_restore(raw: Any) -> RestoreRecord:
    """The :class:`RestoreRecord` of a ``restores`` header. Raises RecordError (also for a
    record version other than 1)."""
    d = decode_json_object(raw, "restore")
    v, tag, pid, dump, state, units, attempts, reserved, schema, rows, created, nxt = (
        member(d, m, "restore") for m in ("v", "tag", "pid", "dump", "state", "units", "attempts", "reserved",
                                          "schema", "rows", "created_unix", "next"))
    if v != 1:
        raise RecordError(f"restore record version {v!r} is not supported (reads 1)")
    if not is_uint(tag) or type(pid) is not str or type(dump) is not str or state not in RESTORE_STATES \
            or type(units) is not list or not all(u in RESTORE_UNIT_STATES for u in units) \
            or type(attempts) is not list or len(attempts) != len(units) or not all(is_uint(a) for a in attempts) \
            or type(reserved) is not list or not all(is_uint(g) for g in reserved) or not is_uint(rows) \
            or type(schema) is not dict or not isinstance(created, (int, float)) \
            or type(nxt) is not list or len(nxt) != 2 or not all(is_uint(x) for x in nxt):
        raise RecordError("restore members of the wrong type")
    sch: Dict[str, Tuple[int, int]] = {}
    for f, kd in schema.items():
        if type(kd) is not list or len(kd) != 2 or kd[0] not in KINDS \
                or not (kd[1] in DTYPE_NAMES or (kd[1] == SCHEMA_MIXED and kd[0] != KIND_VALUE)):
            raise RecordError(f"restore schema of {f[:40]!r}: not [kind, dtype]")
        sch[f] = (kd[0], kd[1])
    return RestoreRecord(tag, pid, dump, state, tuple(units), tuple(attempts), tuple(reserved), sch, rows,
                         float(created), (nxt[0], nxt[1]))


def encode_restore_rows(rows: Sequence[RestoreRow], tag_texts: Optional[Sequence[str]] = None) -> bytes:
    """A chunk of a restore's rows: compact ASCII JSON ``[[key, src, gidx, tag, [fields], new], ...]``
    (tags checked values, integers of any size included).  ``tag_texts``: the tags already
    written as compact ASCII JSON (:func:`restore_tag_texts`, one per row), spliced in as they
    are; the text is the same either way."""
    if tag_texts is None:
        return _dumps_value([[r.key, r.src, r.gidx, r.tag, list(r.fields), r.new] for r in rows],
                            ensure_ascii=True).encode()
    if len(tag_texts) != len(rows):
        raise ValueError(f"{len(tag_texts)} tag texts for {len(rows)} rows")
    keys = dumps_each([r.key for r in rows], ensure_ascii=True)
    fields: Dict[Tuple[str, ...], str] = {}
    for r in rows:
        if r.fields not in fields:
            fields[r.fields] = _dumps_value(list(r.fields), ensure_ascii=True)
    return ("[" + ",".join([f"[{k},{r.src:d},{r.gidx:d},{t},{fields[r.fields]},{'true' if r.new else 'false'}]"
                            for k, r, t in zip(keys, rows, tag_texts)]) + "]").encode()


def restore_tag_texts(tags: Sequence[Any]) -> List[str]:
    """The compact ASCII JSON text of each tag (checked values; ``null`` for None), as
    :func:`encode_restore_rows` and :func:`tag_values` take them (one encoding for both)."""
    return dumps_each(tags, ensure_ascii=True)


def tag_values(texts: Sequence[str]) -> List[Optional[bytes]]:
    """The ``rows`` tag values (:func:`encode_tags`) of tags written by :func:`restore_tag_texts`."""
    return [None if t == "null" else t.encode() for t in texts]


def decode_restore_rows(raw: Any) -> List[RestoreRow]:
    """The rows of a ``restores`` row chunk. Raises RecordError."""
    try:
        d = _loads_value(bytes(raw))
    except (ValueError, TypeError, RecursionError) as e:
        raise RecordError(f"restore rows: not JSON ({e})") from None
    if type(d) is not list:
        raise RecordError("restore rows: not a JSON array")
    out = []
    for r in d:
        if type(r) is not list or len(r) != 6 or type(r[0]) is not str or not is_uint(r[1]) or not is_uint(r[2]) \
                or type(r[4]) is not list or not all(type(f) is str for f in r[4]) or type(r[5]) is not bool:
            raise RecordError(f"restore row of the wrong shape: {str(r)[:80]}")
        out.append(RestoreRow(r[0], r[1], r[2], r[3], tuple(r[4]), r[5]))
    return out


# ---------------------------------------------------------------------------- clean-close marker
_CLEAN_MAX_DIGITS = 40  # (every meta value is at most 40 ASCII digits: docs/FORMAT.md, "LMDB walk")


def units_digest(states: Sequence[Tuple[int, int]]) -> int:
    """The 63-bit digest of the units' index states ``[(entries, commit), ...]`` (unit 0
    first) that a clean-close marker records: BLAKE2b (8-byte digest) of their ASCII
    decimals joined as ``e0,c0;e1,c1;...``, the top bit cleared."""
    import hashlib

    text = ";".join(f"{int(e)},{int(c)}" for e, c in states).encode("ascii")
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "big") >> 1


def encode_clean(digest: int, commit: int) -> bytes:
    """``meta/clean``: ASCII decimal of ``digest * 2**64 + commit`` (``digest``: the units'
    :func:`units_digest`; ``commit``: the controller index's commit counter just before the
    marker's own transaction)."""
    if not (0 <= digest < 1 << 63 and 0 <= commit < 1 << 64):
        raise RecordError("clean marker: digest or commit counter out of range")
    return encode_decimal((digest << 64) | commit)


def decode_clean(raw: Any) -> Tuple[int, int]:
    """``(digest, commit)`` of a ``meta/clean`` value. Raises RecordError (not at most 40
    ASCII digits, or a digest of 64 bits or more)."""
    b = bytes(raw) if raw is not None else b""
    if not b.isdigit() or len(b) > _CLEAN_MAX_DIGITS or int(b) >> 127:
        raise RecordError(f"clean marker {b[:40]!r} is not an ASCII decimal below 2**127")
    n = int(b)
    return n >> 64, n & ((1 << 64) - 1)


__all__ = [
    "CONTROLLER_FORMAT", "CONTROLLER_FORMATS_READ", "CONTROLLER_DBS", "ROW2_HEAD", "ROW2_KEYED", "ROW2_TAGGED",
    "Row2", "ROW2_DTYPE", "row2_bitmap", "encode_row2", "encode_rows2", "gidx_keys", "decode_row2", "encode_tag",
    "encode_tags",
    "decode_partition2", "decode_schema2", "META_FORMAT", "META_NUM_UNITS", "META_NEXT_GIDX", "META_PUT_TOKEN",
    "META_RESTORE_TAG", "META_SEQ_FLOOR", "SEQ_ALIGN", "SEQ_LIMIT", "seq_exhausted", "seq_aligned", "seq_raised", "META_CLEAN", "units_digest", "encode_clean", "decode_clean", "RESTORE_STATES", "RESTORE_UNIT_STATES", "RestoreRecord", "RestoreRow", "restore_key",
    "restore_chunk_key", "decode_restore_key", "encode_restore", "decode_restore", "encode_restore_rows", "restore_tag_texts", "tag_values",
    "decode_restore_rows", "RESTORE_CHUNK_ROWS",
    "RecordError", "RowRecord",
    "gidx_key", "decode_gidx_key", "parts_key", "sampler_key", "decode_parts_key", "keys_key", "decode_keys_key",
    "cons_prefix", "cons_key", "decode_cons_key", "schema_key", "decode_schema_key",
    "encode_decimal", "decode_decimal", "decode_optional_decimal",
    "encode_row", "decode_row", "encode_partition", "decode_partition", "encode_schema", "decode_schema",
    "encode_sampler", "decode_sampler",
]
