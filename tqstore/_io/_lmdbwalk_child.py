"""The child side of :mod:`tqstore._io.lmdbwalk`: run as a script (``python -I -S``), it
imports only the standard library and lmdb, walks the LMDB environments named in its
standard input (a JSON list; or in its first argument, when that is not "-") and writes one
JSON line per step to stdout.  See lmdbwalk for the protocol."""
from __future__ import annotations

import json
from typing import List
import os
import sys

#: schema name -> {database name: checker name}; a database not listed is a problem
SCHEMAS: dict = {
    "unit_index": {b"loc": "loc", b"segs": "segs", b"undo": "undo", b"meta": "meta_format", b"restore": "any"},
    "controller": {b"meta": "meta_decimal", b"free": "gidx_empty", b"parts": "json_object", b"keys": "gidx_value",
                   b"rows": "rows", b"cons": "cons", b"schema": "json_object", b"sampler": "json_object",
                   b"restores": "any"},
}

_MAP_BYTES = 1 << 36  # as tqstore's own readers map it (tqstore._io.lmdbenv.DEFAULT_MAP_BYTES)


class EntryProblem(Exception):
    pass


def json_object(v: bytes, what: str) -> dict:
    try:
        d = json.loads(v.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise EntryProblem(f"{what}: value is not UTF-8 JSON ({e})") from None
    if not isinstance(d, dict):
        raise EntryProblem(f"{what}: value is not a JSON object")
    return d


def _values(txn, db) -> List[bytes]:
    """Every value of ``db``, in one C-level walk (no tuple, no key object per entry).  It
    touches every leaf page, node header and overflow page of the tree, and each value: a
    key lies between its node's header and its value, so it is inside the file too (a
    database of empty values is walked with its keys instead)."""
    return list(txn.cursor(db).iternext(keys=False))


def _check_db(txn, db, name: str, kind: str) -> int:
    """Iterate every entry of one database (values copied out: every page touched)."""
    what = f"database {name}"
    n = 0
    if kind in ("loc", "rows", "gidx_value"):  # millions of entries: the values, checked in bulk
        # (their keys are checked by the decoders that read them: loc keys when a load or a
        # verify reads the index, rows and keys keys by the controller's checked decode)
        vals = _values(txn, db)
        n = len(vals)
        if kind == "loc":
            if n and set(map(len, vals)) != {20}:
                raise EntryProblem(f"{what}: a value is not 20 bytes")
            return n
        if kind == "gidx_value":
            if n and set(map(len, vals)) != {8}:
                raise EntryProblem(f"{what}: value is not a global index")
            return n
        if n and min(map(len, vals)) < 24:  # (controller format 2: binary, >= 24 bytes; 1: JSON)
            for v in vals:
                if len(v) < 24:
                    json_object(v, what)  # version 1 rows are JSON objects
        return n
    for k, v in txn.cursor(db):
        n += 1
        check_entry(kind, k, v, what)
    return n


def check_entry(kind: str, k: bytes, v: bytes, what: str) -> None:
    """Check one entry of a database of ``kind`` (a checker name of :data:`SCHEMAS`, not one
    of the three large kinds, which are checked in bulk); raise ``EntryProblem``.  Shared with the
    in-process check (:mod:`tqstore._io.lmdbschema`)."""
    if kind == "any":
        return
    if kind == "segs":
        d = json_object(v, what)
        if len(k) != 4 or not all(isinstance(d.get(x), int) and not isinstance(d.get(x), bool) and d[x] >= 0
                                  for x in ("size", "live")) or not isinstance(d.get("sealed"), bool):
            raise EntryProblem(f"{what}: entry is not a segment record")
    elif kind == "undo":
        if len(k) < 17 or len(v) != 20:
            raise EntryProblem(f"{what}: entry is not an undo record")
    elif kind in ("meta_format", "meta_decimal"):
        if not v or len(v) > 40 or not v.isdigit():
            raise EntryProblem(f"{what}: value of {k[:40]!r} is not a decimal number")
    elif kind == "gidx_empty":
        if len(k) != 8 or v:
            raise EntryProblem(f"{what}: entry is not a free global index")
    elif kind == "cons":
        if v or len(k) < 10 or k[:-8].count(b"\0") < 2:
            raise EntryProblem(f"{what}: entry is not a consumption mark")
    elif kind == "json_object":
        json_object(v, what)
    else:
        raise EntryProblem(f"{what}: no entry check for kind {kind!r}")


def walk_env(env_dir: str, schema: str) -> int:
    """Walk one LMDB environment directory in *this* process (the child); returns the
    entries seen.  Raises ``EntryProblem`` or ``lmdb.Error`` for a problem."""
    import lmdb

    dbs = SCHEMAS[schema]
    env = lmdb.open(env_dir, readonly=True, lock=False, subdir=True, max_dbs=len(dbs) + 1, map_size=_MAP_BYTES,
                    readahead=False, create=False)
    try:
        total = 0
        with env.begin(buffers=False) as txn:
            names = []
            for k, _v in txn.cursor():
                names.append(k)
            for name in names:
                kind = dbs.get(name)
                if kind is None:
                    raise EntryProblem(f"unexpected entry {name[:40]!r} in the main database")
                db = env.open_db(name, txn=txn, create=False)
                seen = _check_db(txn, db, name.decode(), kind)
                if seen != txn.stat(db)["entries"]:
                    raise EntryProblem(f"database {name.decode()} holds {seen} entries, its record says "
                               f"{txn.stat(db)['entries']}")
                total += seen
        return total
    finally:
        env.close()


def _child_main(argv: List[str]) -> int:
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a crash here is expected: no core file
    except (ImportError, ValueError, OSError):
        pass
    sys.path.insert(0, argv[2])  # where lmdb is installed (the child runs without site)
    if hasattr(sys, "set_int_max_str_digits"):
        sys.set_int_max_str_digits(0)  # values hold integers of any size (docs/FORMAT.md, "Values")
    targets = json.loads(sys.stdin.buffer.read() if argv[1] == "-" else argv[1])  # ("-": the list on stdin)
    out = sys.stdout.fileno()
    for i, (env_dir, schema) in enumerate(targets):
        os.write(out, (json.dumps({"start": i}) + "\n").encode())
        try:
            n = walk_env(env_dir, schema)
            rec = {"done": i, "entries": n}
        except Exception as e:  # noqa: BLE001 - every problem is reported
            msg = str(e) if isinstance(e, EntryProblem) else f"{type(e).__name__}: {e}"
            rec = {"done": i, "error": f"{schema} index: {msg}"[:500]}
        os.write(out, (json.dumps(rec) + "\n").encode())
    return 0


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv))
