"""The out-of-process walk's schema checks (:mod:`tqstore._io._lmdbwalk_child`), run in
this process on entries read in bulk by the checked page reader
(:mod:`tqstore._format.lmdb_pages`).

A checkpoint's LMDB file whose every reachable page reads checked and whose every entry
passes these checks is as good, for a process about to map it, as one the child walked
cleanly: the pages LMDB can reach were all read with bounds checks, and each entry has the
shape the walk would have demanded (the same per-entry checker for the small databases;
the large ones, millions of entries, by array operations with the same verdicts).  A file
that fails either is handed to the walk, which decides (and names the problem).
"""
from __future__ import annotations

from typing import Dict

import numpy as np

from .._format.lmdb_pages import Columns, DbRecord, LmdbPageError, Packed, PageFile
from ._lmdbwalk_child import SCHEMAS, EntryProblem, check_entry, json_object

#: the checker names whose entries are checked by array operations here
_BULK = ("loc", "gidx_value", "rows", "undo", "gidx_empty", "cons")


class SchemaMismatch(LmdbPageError):
    """An entry (or a database) the schema does not allow: the walk decides and names it."""


def check_schema(pf: PageFile, dbs: Dict[bytes, DbRecord], schema: str) -> int:
    """Every named database of ``dbs`` (from ``pf.databases()``) read through ``pf`` and its
    entries checked as the walk of ``schema`` (a key of :data:`SCHEMAS`) checks them: no
    database the schema does not name, every entry of the shape its database requires.
    Returns the entries seen.  Raises SchemaMismatch, LmdbPageError (pages that do not read;
    IndexError for a gather past the end of the file, as ``pf`` raises it)."""
    allowed = SCHEMAS[schema]
    total = 0
    for name, rec in dbs.items():
        kind = allowed.get(name)
        if kind is None:
            raise SchemaMismatch(f"unexpected entry {name[:40]!r} in the main database")
        c = pf.columns(rec)
        try:
            check_columns(kind, c, f"database {name.decode('utf-8', 'replace')}")
        except EntryProblem as e:
            raise SchemaMismatch(str(e)) from None
        total += len(c)
    return total


def check_columns(kind: str, c: Columns, what: str) -> None:
    """The entries ``c`` of one database of checker ``kind``, checked in bulk where the
    database may hold millions of them; raises EntryProblem with the walk's message."""
    n = len(c)
    if not n or kind == "any":
        return
    kl, vl = c.key_lens, c.value_lens
    if kind not in _BULK:  # a few entries: one by one, with the walk's own checker
        for k, v in zip(Packed(c.keys, kl), Packed(c.values, vl)):
            check_entry(kind, k, v, what)
        return
    if kind == "loc":
        if (vl != 20).any():
            raise EntryProblem(f"{what}: a value is not 20 bytes")
    elif kind == "gidx_value":
        if (vl != 8).any():
            raise EntryProblem(f"{what}: value is not a global index")
    elif kind == "rows":  # (controller format 2: binary, >= 24 bytes; 1: JSON objects)
        short = np.flatnonzero(vl < 24)
        if len(short):
            vals = Packed(c.values, vl)
            for i in short.tolist():
                json_object(vals[i], what)
    elif kind == "undo":
        if ((kl < 17) | (vl != 20)).any():
            raise EntryProblem(f"{what}: entry is not an undo record")
    elif kind == "gidx_empty":
        if ((kl != 8) | (vl != 0)).any():
            raise EntryProblem(f"{what}: entry is not a free global index")
    elif kind == "cons":  # no value; a key of at least 10 bytes with two NULs before its last 8
        if (vl != 0).any() or (kl < 10).any():
            raise EntryProblem(f"{what}: entry is not a consumption mark")
        starts = c.key_starts
        nul = (c.keys[:int(kl.sum())] == 0).view(np.uint8)
        whole = np.add.reduceat(nul, starts, dtype=np.int64)
        tail = nul[(starts + kl - 8)[:, None] + np.arange(8)].sum(axis=1, dtype=np.int64)
        if (whole - tail < 2).any():
            raise EntryProblem(f"{what}: entry is not a consumption mark")
