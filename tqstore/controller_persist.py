"""The controller's persisted mirror: written at a clean close, read on the next open in
place of the decode of the LMDB index (docs/FORMAT.md, "Controller mirror").

A decode walks every row and key entry of the index (two million LMDB entries for a
million keyed rows); the mirror file holds the columnar arrays that decode produces, so an
open reads one file and makes Python objects only for the keys and tags.

Guarantees:

* The mirror is used only when the clean-close marker ``meta/clean`` *names* it: the
  marker's commit counter is the last commit but the marker's own (nothing changed the index
  since), the file's header records that same counter, and the marker's digest is
  :func:`~tqstore._format.mirror_records.bound_digest` of the units' digest, size and header
  CRC32C the file's header holds.  A mirror of an earlier close, one left after an open by
  a build that does not know mirrors (its close records a digest of the units alone and
  advances the counter), or a damaged file never matches.
* Every section's CRC32C, every count and range, and the cross-partition rules (a global
  index is one row or free, never both nor twice) are checked before anything is used.
* Anything else -- no marker, a stale or malformed one, no file, another version, a bad
  CRC, a check that fails -- is never an error: the open decodes the index as before, and
  says which and why at INFO.  A mirror that cannot be written at close is logged and the
  marker then records the units' digest alone (the next open decodes).
"""
from __future__ import annotations

import logging
import time
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Optional, Tuple

import numpy as np

from ._format import controller_records as R
from ._format.mirror_records import (
    MIRROR_FILE, MirrorImage, PartImage, bound_digest, decode_header, decode_mirror, encode_mirror,
)
from ._format.records import RecordError
from ._io import files
from ._io.heap import trim_heap
from ._io.lmdbenv import sync_env, wrap_errors
from .controller_decode import CONTROLLER_FORMAT, ControllerState
from .controller_mirror import GidxMap, Partition
from .errors import CorruptionError, InvalidInputError, TqstoreError

if TYPE_CHECKING:  # pragma: no cover
    from .controller import Controller

log = logging.getLogger("tqstore")
MAX_MIRROR_BYTES = 1 << 40


def _utf8_first(kv: Tuple[str, Any]) -> bytes:
    return kv[0].encode("utf-8")


def mirror_path(c: "Controller") -> Path:
    return Path(c.path) / MIRROR_FILE


# ---------------------------------------------------------------------------- close
def save(c: "Controller", units_digest: int, commit: int) -> int:
    """Write the mirror of ``c``'s state (``commit``: the index's commit counter now, the
    marker's transaction not yet begun) atomically, and return the digest the clean-close
    marker records: the binding of ``units_digest`` to the file, or ``units_digest`` itself
    when the file could not be written (logged; the next open decodes the index).  Call it
    under the controller's lock with no write in flight."""
    c.mirror_binding = None
    t0 = time.perf_counter()
    try:
        bufs, size, hcrc = encode_mirror(image(c), commit=commit, units_digest=units_digest)
        files.write_buffers_atomic(mirror_path(c), bufs)
    except (OSError, ValueError, TypeError, TqstoreError) as e:
        log.warning("controller %s: could not write its mirror (%s); the next open decodes the index", c.path, e)
        return units_digest
    digest = bound_digest(units_digest, size, hcrc)
    c.mirror_binding = (digest, units_digest)
    log.debug("controller %s: mirror written (%d bytes, %.3f s)", c.path, size, time.perf_counter() - t0)
    return digest


def image(c: "Controller") -> MirrorImage:
    """The controller's state as a :class:`MirrorImage` (partitions in the index's key order,
    rows in seq order, free indexes sorted)."""
    parts = []
    for pid in sorted(c.parts, key=lambda x: x.encode("utf-8")):
        p = c.parts[pid]
        sl = p.live_slots()
        keys = p.s_key if len(sl) == p.n else [p.s_key[s] for s in sl.tolist()]
        schema = [(f, kind, dt, p.bits[f]) for f, (kind, dt) in sorted(p.schema.items(), key=_utf8_first)]
        tg = np.fromiter(p.tags.keys(), dtype=np.int64, count=len(p.tags))
        tags = list(p.tags.values())
        order = np.argsort(tg, kind="stable")  # ascending, as a decode installs them
        if len(tg) and not (order[1:] > order[:-1]).all():
            tg, tags = tg[order], [tags[i] for i in order.tolist()]
        parts.append(PartImage(pid, p.num, p.next_seq, dict(p.meta), schema, [sorted(f) for f in p.fsets],
                               p.s_gidx[sl], p.s_seq[sl], p.s_fs[sl], keys, tg, tags))
    consumed = [(pid, task, np.fromiter(g, dtype=np.int64, count=len(g)))  # in the order of the cons keys
                for (pid, task), g in sorted(c.consumed.items(), key=lambda kv: (kv[0][1].encode(), kv[0][0].encode()))
                if g and pid in c.parts]
    return MirrorImage(c.num_units, c.next_gidx, c.put_token, np.asarray(sorted(c.free), dtype=np.int64), parts,
                       consumed)


# ---------------------------------------------------------------------------- open
def load(c: "Controller") -> Optional[ControllerState]:
    """The state of ``c``'s index read from its mirror, when the clean-close marker names
    the mirror (see the module docstring); None (the reason logged at INFO) otherwise.
    Removes nothing and writes nothing; never raises for what it finds on disk."""
    c.mirror_binding = None
    t0 = time.perf_counter()
    path = mirror_path(c)
    try:
        st, why = _load(c, path)
    except (OSError, CorruptionError, RecordError) as e:
        st, why = None, f"{type(e).__name__}: {e}"
    if st is None:
        if why is not None:
            log.info("controller %s: decoding the index, its mirror is not used: %s", c.path, why)
        return None
    rows = sum(p.live for p in st.parts.values())
    log.info("controller %s: state read from its mirror (%d rows, %.3f s)", c.path, rows, time.perf_counter() - t0)
    return st


def _load(c: "Controller", path: Path) -> Tuple[Optional[ControllerState], Optional[str]]:
    with c.env.begin() as txn:
        raw = txn.get(R.META_CLEAN, db=c.db["meta"])
        fmt = txn.get(R.META_FORMAT, db=c.db["meta"])
        last = c.env.info()["last_txnid"]
    if raw is None:
        return None, ("no clean-close marker (the store was not closed cleanly since the mirror was written)"
                      if path.exists() else None)
    try:
        digest, commit = R.decode_clean(raw)
    except RecordError as e:
        return None, f"malformed clean-close marker ({e})"
    if commit + 1 != last:
        return None, "the index changed after its clean-close marker"
    if fmt is None or bytes(fmt) != R.encode_decimal(CONTROLLER_FORMAT):
        return None, f"controller index format {fmt!r} is not {CONTROLLER_FORMAT}"
    buf = files.read_regular(path, max_bytes=MAX_MIRROR_BYTES)
    if buf is None:
        return None, "no mirror file"
    h = decode_header(buf, file_size=len(buf), path=str(path))
    if h.commit != commit or bound_digest(h.units_digest, h.size, h.crc) != digest:
        return None, "the clean-close marker does not name this mirror (it is of another close)"
    c.mirror_binding = (digest, h.units_digest)  # the marker vouches for the units' digest the mirror names
    img = decode_mirror(buf, h, path=str(path))
    del buf
    st = state(img, str(path))
    del img
    trim_heap()  # the file's buffer and the arrays' copies leave the process
    return st, None


def state(img: MirrorImage, path: str) -> ControllerState:
    """The controller state (as :func:`~tqstore.controller_decode.decode_controller` makes
    it) of a decoded mirror.  Raises RecordError when the partitions disagree: a global index
    twice, both free and a row, past ``next_gidx`` in total; a field set twice; a tag of no
    row of its partition."""
    gmap = GidxMap()
    parts: Dict[str, Partition] = {}
    total = 0
    for q in img.parts:
        if q.pid in parts:
            raise RecordError(f"partition {q.pid[:40]!r} twice")
        p = Partition(q.pid, q.num, gmap, next_seq=q.next_seq, meta=q.meta)
        for f, kind, dt, bit in q.schema:
            p.add_field(f, kind, dt, bit)
        for i, fs in enumerate(q.fsets):
            if p.fs_id(frozenset(fs)) != i:
                raise RecordError(f"partition {q.pid[:40]!r}: a field set twice")
        n = len(q.gidx)
        p.s_gidx, p.s_seq, p.s_fs, p.s_key = q.gidx, q.seq, q.fs, q.keys
        p.n = p.live = n
        gmap.set(q.gidx, q.num, np.arange(n, dtype=np.int64))
        p.keys = None  # built from s_key on first use, as after a decode
        parts[q.pid] = p
        total += n
    if int((gmap.part >= 0).sum()) != total:
        raise RecordError("a global index is a row twice")
    free = img.free
    if len(free) and (np.unique(free).size != len(free) or (gmap.part[free[free < len(gmap.part)]] >= 0).any()):
        raise RecordError("a free index twice, or both free and a row")
    if len(free) + total > img.next_gidx:
        raise RecordError("more rows and free indexes than next_gidx")
    for q in img.parts:
        tg = q.tag_gidx
        if len(tg) and (int(tg.max()) >= len(gmap.part) or (gmap.part[tg] != q.num).any()):
            raise RecordError(f"partition {q.pid[:40]!r}: a tag of no row of it")
        parts[q.pid].tags = dict(zip(tg.tolist(), q.tags))
    consumed: Dict[Tuple[str, str], Any] = defaultdict(set)
    for pid, task, g in img.consumed:
        consumed[(pid, task)].update(g.tolist())
    return ControllerState(img.num_units, img.next_gidx, img.put_token, free.tolist(), parts, gmap, consumed,
                           CONTROLLER_FORMAT)


def mark_clean(c: "Controller", digest: int) -> None:
    """:meth:`Controller.mark_clean`: write the mirror, then commit ``meta/clean`` naming it
    (or the units' ``digest`` alone when it could not be written) and flush the index.
    Raises InvalidInputError (``digest`` not an int in [0, 2**63)), StorageIOError."""
    if not isinstance(digest, int) or isinstance(digest, bool) or not 0 <= digest < 1 << 63:
        raise InvalidInputError(f"mark_clean: digest must be an int in [0, 2**63), got {digest!r}")
    with wrap_errors("mark clean", c.path):
        commit = c.env.info()["last_txnid"]
        raw = R.encode_clean(save(c, digest, commit), commit)
        with c.env.begin(write=True) as txn:
            txn.put(R.META_CLEAN, raw, db=c.db["meta"])
        sync_env(c.env)


def take_clean(c: "Controller") -> Optional[int]:
    """:meth:`Controller.take_clean`: remove ``meta/clean`` durably; the units' digest it
    vouches for (:func:`unwrap`) when no commit came after it, else None (none, stale,
    malformed: logged).  Raises StorageIOError."""
    with wrap_errors("take clean", c.path):
        last = c.env.info()["last_txnid"]
        with c.env.begin(write=True) as txn:
            raw = txn.pop(R.META_CLEAN, db=c.db["meta"])
        if raw is None:
            return None
        sync_env(c.env)
    try:
        digest, commit = R.decode_clean(raw)
    except RecordError as e:
        log.warning("controller index %s: ignoring a malformed clean-close marker: %s", c.path, e)
        return None
    return unwrap(c, digest) if commit + 1 == last else None


def unwrap(c: "Controller", digest: int) -> int:
    """The units' digest a clean-close marker of ``digest`` vouches for: the one of the
    mirror it names (checked when the controller opened, or recorded at its close), else
    ``digest`` itself (a marker without a mirror)."""
    b = c.mirror_binding
    return b[1] if b is not None and b[0] == digest else digest


__all__ = ["save", "image", "load", "state", "mark_clean", "take_clean", "unwrap", "mirror_path", "MAX_MIRROR_BYTES"]
