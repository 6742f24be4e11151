"""A storage unit's location cache: its index's ``loc`` values in memory, so that a read of the
latest state finds its rows' frames without LMDB.

Never stale, by construction:

* every location it holds equals the ``loc`` entry of one index state, the LMDB commit
  ``txnid`` it is *exact for*; a row or field it does not hold is unknown (a miss), never
  "absent";
* a lookup uses it only when ``txnid`` is the index's last commit, read from the environment
  at every lookup: a commit the cache was not told about (by any writer: restores, recovery,
  compaction, a settle that puts entries back) turns it off until the next write of the unit
  resets it, and a lookup that misses reads the index as before;
* the unit tells it, after each of its commits and before the call returns: the locations
  the commit put (:meth:`LocCache.committed` with ``sets``), the rows whose entries it dropped
  (``drops``: forgotten), or that it changed no location (no arguments: the cache moves on to
  the new commit).  Readers of older states (snapshots) never use it.

Layout: per field, a :data:`~tqstore._format.index.LOC_DTYPE` array indexed by ``gidx //
stride`` (the unit's rows are the gidxs ``≡ residue (mod stride)``; others are never held);
``length == 0`` marks a slot not held (a frame is never empty).  20 bytes per row and field,
grown by doubling, at most ``max_bytes`` per unit: rows beyond it are simply not held.
"""
from __future__ import annotations

import logging
import threading
from operator import itemgetter
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from ._format.index import INDEX_KEY_HEAD, LOC_DTYPE

#: the most memory one unit's cache takes (its arrays); rows beyond it are read from the index
LOC_CACHE_MAX_BYTES = 256 << 20

log = logging.getLogger("tqstore")
_value = itemgetter(1)
_RAW = np.dtype(f"V{LOC_DTYPE.itemsize}")  # a location as one opaque record: copied in bulk (no per-member work)


class LocCache:
    """The location cache of one unit (module docstring).  Thread-safe (one lock, held for
    array work only, never for I/O)."""

    def __init__(self, last_txnid: Callable[[], int], *, stride: int = 1, residue: int = 0,
                 max_bytes: int = LOC_CACHE_MAX_BYTES) -> None:
        self._last = last_txnid
        self.stride = max(1, int(stride))
        self.residue = int(residue) % self.stride
        self.max_bytes = int(max_bytes)
        self._lock = threading.Lock()
        self.txnid = -1  # the commit every held location is exact for (-1: none, holds nothing)
        self._arrays: Dict[str, np.ndarray] = {}

    # ---------------------------------------------------------------- reads
    def get(self, gidxs: Sequence[int], fields: Sequence[str], *, at: Optional[int] = None
            ) -> Optional[Dict[str, np.ndarray]]:
        """Each field's locations of rows ``gidxs`` (LOC_DTYPE arrays in their order), as of the
        index's last commit, or with ``at`` as of the commit ``at`` (the ``txn.id()`` of a read
        transaction, e.g. a snapshot's: what the cache holds is exact for one commit, so it
        answers for that commit whatever was committed since); None unless every one is held
        and the cache is exact for that commit."""
        if not len(gidxs) or not fields:
            return None
        pos, top, which = self._positions(gidxs)
        if which is not None:
            return None
        with self._lock:
            if self.txnid < 0 or not self._arrays or self.txnid != (self._last() if at is None else at):
                return None
            out = {}
            for f in fields:
                a = self._arrays.get(f)
                if a is None or top >= len(a):
                    return None
                locs = np.take(a.view(_RAW), pos).view(LOC_DTYPE)
                if not locs["length"].all():
                    return None
                out[f] = locs
        return out

    def _positions(self, gidxs: Sequence[int]) -> Tuple[np.ndarray, int, Optional[np.ndarray]]:
        """``(slots, the largest slot, which)`` of ``gidxs``: ``which`` is None when every one is a
        row this cache can hold, else the mask of those that are (``slots`` has only them)."""
        g = np.asarray(gidxs)
        if g.dtype != np.int64:
            g = g.astype(np.int64)
        g = g.reshape(-1)
        which = None
        if self.stride > 1:
            which = g % self.stride == self.residue
            if bool(which.all()):
                which = None
            else:
                g = g[which]
            g = g // self.stride
        return g, (int(g.max()) if g.size else -1), which

    # ---------------------------------------------------------------- the unit's commits
    def committed(self, wid: int, sets: Callable[[], Iterable[Tuple[str, Sequence[int], np.ndarray]]] = tuple,
                  drops: Optional[Tuple[Sequence[int], Optional[Sequence[str]]]] = None) -> None:
        """After the unit's write transaction ``wid`` (its ``txn.id()``) committed: ``sets()``
        gives the ``(field, gidxs, LOC_DTYPE locations)`` it put, ``drops`` ``(gidxs, fields or
        None for all)`` whose entries it deleted or replaced by values not given.  Call before
        the unit's call returns, under the unit's lock.  Never raises: the commit is done, so a
        failure here (out of memory) only empties the cache."""
        try:
            self._committed(wid, sets, drops)
        except Exception:  # noqa: BLE001 - see the docstring
            log.exception("location cache: dropped after a failure")
            self.clear()

    def _committed(self, wid: int, sets, drops) -> None:
        with self._lock:
            if drops is not None:
                self._forget(*drops)
            last = self._last()
            if last == wid - 1:  # an empty transaction: LMDB committed nothing, the state is the same
                return
            if last != wid or self.txnid != wid - 1:
                # a commit it was not told of came before (or after) this one: start again from this one
                self._arrays.clear()
                if last != wid:
                    self.txnid = -1
                    return
            seen: Dict[int, tuple] = {}
            for field, gidxs, locs in sets():
                got = seen.get(id(gidxs))
                if got is None:
                    got = seen[id(gidxs)] = (gidxs, self._positions(gidxs))
                self._put(field, gidxs, locs, got[1])
            self.txnid = wid

    def populate(self, rid: int, gidxs: Sequence[int], found: Dict[str, Optional[np.ndarray]]) -> None:
        """Hold what a lookup read from the index in read transaction ``rid`` (``txn.id()``): kept
        when ``rid`` is the state the cache is exact for, or a newer one that is the index's
        last commit (the cache then starts again from it).  Never raises (a failure empties it)."""
        try:
            with self._lock:
                if rid != self.txnid:
                    if rid < self.txnid or rid != self._last():
                        return
                    self._arrays.clear()
                    self.txnid = rid
                for f, locs in found.items():
                    if locs is not None:
                        self._put(f, gidxs, locs)
        except Exception:  # noqa: BLE001 - the lookup has its answer; the cache is only dropped
            log.exception("location cache: dropped after a failure")
            self.clear()

    def clear(self) -> None:
        with self._lock:
            self._arrays.clear()
            self.txnid = -1

    def nbytes(self) -> int:
        with self._lock:
            return sum(a.nbytes for a in self._arrays.values())

    # ---------------------------------------------------------------- arrays (lock held)
    def _put(self, field: str, gidxs: Sequence[int], locs: np.ndarray, positions=None) -> None:
        pos, top, which = self._positions(gidxs) if positions is None else positions
        if which is not None:  # (rows it cannot hold stay unknown)
            locs = np.asarray(locs)[which]
        if top < 0:
            return
        a = self._arrays.get(field)
        size = 0 if a is None else len(a)
        if top >= size:
            want = max(top + 1, 2 * size, 1024)
            others = sum(x.nbytes for f, x in self._arrays.items() if f != field)
            fit = (self.max_bytes - others) // LOC_DTYPE.itemsize
            want = min(want, fit)
            if want > size:
                b = np.zeros(want, LOC_DTYPE)
                if a is not None:
                    b.view(_RAW)[:size] = a.view(_RAW)
                a = self._arrays[field] = b
                size = want
        if a is None:
            return
        locs = np.ascontiguousarray(locs, dtype=LOC_DTYPE)
        if top >= size:
            keep = pos < size
            pos, locs = pos[keep], locs[keep]
        a.view(_RAW)[pos] = locs.view(_RAW)

    def _forget(self, gidxs: Sequence[int], fields: Optional[Sequence[str]]) -> None:
        pos, top, _which = self._positions(gidxs)
        if top < 0:
            return
        for f in (list(self._arrays) if fields is None else fields):
            a = self._arrays.get(f)
            if a is not None:
                a["length"][pos[pos < len(a)]] = 0


class GidxArrays:
    """Lists of gidxs as int64 arrays, each list converted once (by identity: the columns of one
    write share their list)."""

    def __init__(self) -> None:
        self._of: Dict[int, Tuple[Sequence[int], np.ndarray]] = {}

    def of(self, g: Sequence[int]) -> np.ndarray:
        got = self._of.get(id(g))
        if got is None:
            got = self._of[id(g)] = (g, np.fromiter(g, np.int64, len(g)))  # (g kept: its id stays its own)
        return got[1]


def write_sets(bulk: List[Tuple[bytes, List[int], List[Tuple[bytes, bytes]], Optional[np.ndarray]]],
               others: List[Tuple[bytes, bytes]], arrays: Optional[GidxArrays] = None
               ) -> List[Tuple[str, np.ndarray, np.ndarray]]:
    """The ``sets`` of a unit write (:meth:`LocCache.committed`): its bulk encodes (``(field bytes,
    gidxs, items, locations or None)``: the locations computed in bulk, else the items' values
    joined) and the other items one by one; each list of gidxs becomes one array."""
    arr = (arrays or GidxArrays()).of
    out = [(f.decode(), arr(g), locs if locs is not None else np.frombuffer(b"".join(map(_value, its)), LOC_DTYPE))
           for f, g, its, locs in bulk]
    if others:
        by: Dict[bytes, Tuple[List[int], List[bytes]]] = {}
        head = INDEX_KEY_HEAD.size
        for k, v in others:
            g, vs = by.setdefault(k[head:], ([], []))
            g.append(INDEX_KEY_HEAD.unpack_from(k)[0])
            vs.append(v)
        out += [(f.decode(), arr(g), np.frombuffer(b"".join(vs), LOC_DTYPE)) for f, (g, vs) in by.items()]
    return out


__all__ = ["GidxArrays", "LocCache", "LOC_CACHE_MAX_BYTES", "write_sets"]
