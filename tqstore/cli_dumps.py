"""``verify``, ``inspect`` and ``ls`` of a directory of selective dumps (one dump per step
beside the model's checkpoints, as ``python -m tqstore demo`` writes them): each dump as the
command takes one dump (:mod:`tqstore.cli_inspect`), in name order."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, TextIO

from .cli_util import EXIT_DAMAGED, EXIT_OK, dump_function, dumps_in, human, to_json
from .errors import CheckpointNotFoundError, CorruptionError, TqstoreError


def _functions(path: Path, *names: str):
    found = [dump_function(n) for n in names]
    if any(f is None for f in found):
        raise TqstoreError(f"{path} holds selective dumps, and this build of tqstore cannot read dumps")
    return found


def dumps_doc(path: Path) -> Dict[str, Any]:
    """Each dump's ``describe_dump`` report (nothing verified); one that cannot be read has
    ``error`` instead."""
    (describe,) = _functions(path, "describe_dump")
    out: List[Dict[str, Any]] = []
    for name in dumps_in(path):
        try:
            out.append(dict(describe(path / name), name=name))
        except (CorruptionError, CheckpointNotFoundError) as e:
            out.append({"name": name, "path": str(path / name), "error": str(e)})
    return {"path": str(path), "kind": "dumps", "dumps": out}


def write_dumps_doc(doc: Dict[str, Any], w) -> None:
    w(f"selective dumps under {doc['path']}: {len(doc['dumps'])}\n")
    for d in doc["dumps"]:
        if "error" in d:
            w(f"  {d['name']}: unreadable ({d['error']})\n")
        else:
            w(f"  {d['name']}: partition {d['partition_id']!r}, {d['rows']} rows ({d['rows_with_data']} with data), "
              f"{human(d['bytes'])}\n")


def check_dump(path: Path, quick: bool):
    """``(describe_dump's report, problems)`` of the dump at ``path`` (deep unless ``quick``)."""
    describe, verify_dump = _functions(path, "describe_dump", "verify_dump")
    try:
        return describe(path), list(verify_dump(path, deep=not quick))
    except (CorruptionError, CheckpointNotFoundError) as e:
        return {"path": str(path), "kind": "dump"}, [str(e)]


def verdict(name: str, doc: Dict[str, Any], problems: List[str]) -> str:
    """The lines ``verify`` prints of one dump."""
    if problems:
        return f"BAD {name}: {len(problems)} problem(s)\n" + "".join(f"    {p}\n" for p in problems)
    return (f"ok  {name}: dump of {doc['rows']} rows ({doc['rows_with_data']} with data), {doc['frames']} frames, "
            f"{len(doc['shards'])} shards, {human(doc['bytes'])} checked\n")


def verify_dumps(path: Path, out: TextIO, as_json: bool, quick: bool) -> int:
    """Verify every dump under ``path``: 0 when each is clean, 1 when one is not."""
    reports = [(name, *check_dump(path / name, quick)) for name in dumps_in(path)]
    bad = [r for r in reports if r[2]]
    if as_json:
        out.write(to_json({"path": str(path), "kind": "dumps", "ok": not bad,
                           "dumps": [dict(doc, name=n, ok=not p, problems=p) for n, doc, p in reports]},
                          indent=1, default=str) + "\n")
    else:
        out.write("".join(verdict(name, doc, problems) for name, doc, problems in reports))
    return EXIT_DAMAGED if bad else EXIT_OK


def ls_dumps(path: Path, out: TextIO, as_json: bool) -> int:
    """One line per dump: name, partition, rows, bytes (nothing verified)."""
    doc = dumps_doc(path)
    if as_json:
        out.write(to_json(doc["dumps"], indent=1, default=str) + "\n")
    else:
        for d in doc["dumps"]:
            if "error" in d:
                out.write(f"{d['name']}  unreadable: {d['error']}\n")
            else:
                out.write(f"{d['name']}  {d['rows']:>8} rows  {human(d['bytes']):>10}  {d['partition_id']}\n")
    return EXIT_DAMAGED if any("error" in d for d in doc["dumps"]) else EXIT_OK
