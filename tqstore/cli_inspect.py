"""``verify``, ``inspect`` and ``ls`` of ``python -m tqstore``: read-only looks at a
checkpoint, a generation root, a store directory or a selective dump.

Each command returns an exit status (``EXIT_OK`` clean, ``EXIT_DAMAGED`` damaged or
unreadable, ``EXIT_USAGE`` when the path is none of the kinds the command works on) and
writes its report to ``out`` (JSON with ``--json``) and one-line errors to ``err``.
Nothing here writes, except that ``verify STORE`` opens the store like any open does
(its crash recovery runs) before checking every frame.
"""
from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any, Dict, List, Optional, TextIO, Tuple

from .cli_util import (EXIT_DAMAGED, EXIT_OK, EXIT_USAGE, LOSS_HINT, Progress, dump_function, human, kind_of,
                       note_interrupted, open_store, refuse, to_json, walk_store_indexes, when)
from .errors import CheckpointNotFoundError, CorruptionError, TqstoreError


# ---------------------------------------------------------------------------- verify
def verify_one(path: Path, err: TextIO, quick: bool):
    """:func:`verify_checkpoint` of one checkpoint with a progress bar on a terminal; a report
    (never raises for damage)."""
    from .checkpoint.verify import read_manifest, verify_checkpoint

    try:
        total = read_manifest(path).total_bytes
    except (CorruptionError, CheckpointNotFoundError):
        total = 0
    bar = Progress(total, f"verify {path.name}", err)
    try:
        return verify_checkpoint(path, deep=not quick, raise_on_error=False, progress=bar)
    finally:
        bar.close()


def generation_reports(path: Path, err: TextIO, quick: bool) -> List[Tuple[int, Any]]:
    """``(step, report)`` of every generation under the root ``path``, ascending; a generation
    directory without a manifest is reported as torn."""
    from .checkpoint.manager import CheckpointManager
    from .checkpoint.verify import CheckpointReport, Problem

    m = CheckpointManager.for_reading(path)
    left = sorted(n for n in os.listdir(path) if ".tmp-" in n or n.startswith(".deleting-"))
    if left:
        err.write(f"note: {len(left)} temporary director(ies) under {path} ({', '.join(left[:3])}"
                  f"{', ...' if len(left) > 3 else ''}): no generation; a save running now, or leftovers of "
                  f"interrupted saves or prunes, which the next save or prune removes\n")
    reports = []
    for s in m.steps():
        try:
            rep = verify_one(m.path(s), err, quick)
        except CheckpointNotFoundError:
            if _gone(m, s):
                continue
            raise
        if rep.ok or not _gone(m, s):  # (a generation a trainer pruned meanwhile is not damaged: left out)
            reports.append((s, rep))
    for step in m._torn_steps():
        p = m.path(step)
        reports.append((step, CheckpointReport(p, problems=[Problem(str(p / "MANIFEST.json"),
                                                                    "generation directory has no MANIFEST.json "
                                                                    "(torn)")])))
    reports.sort(key=lambda x: x[0])
    return reports


def _gone(m: Any, step: int) -> bool:
    """Generation ``step`` of manager ``m``'s root is no longer there (a save's prune deleted it
    while the root was being listed: neither ``step-N`` nor ``step-N.old`` is left)."""
    p = m.path(step)
    return not os.path.lexists(p) and not os.path.lexists(str(p) + ".old")


class LostDataWarnings(logging.Handler):
    """The messages of the tqstore logger that report data an open's crash recovery dropped
    (marked ``tqstore_lost_data``), from this thread, while it is attached."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: List[str] = []
        self._thread = threading.get_ident()

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "tqstore_lost_data", False) and record.thread == self._thread:
            self.lines.append(record.getMessage())


def _verify_store(path: Path, out: TextIO, as_json: bool, repair: bool = False) -> int:
    """Verify a store.  Files its open would take for lost (a missing unit directory or
    segment file, a truncated segment: :func:`~tqstore.store_check.data_problems`) are
    reported without opening it, nothing changed, unless ``repair``; then the open's crash
    recovery drops what it cannot read and what it dropped counts as problems too (verify
    must not then call the store clean)."""
    from .store_check import data_problems

    walk_store_indexes(path, units=True)
    lost = [] if repair else data_problems(path)
    if lost:
        return _store_report(out, as_json, path, None, lost, hint=f"nothing was changed. {LOSS_HINT}")
    seen, logger = LostDataWarnings(), logging.getLogger("tqstore")
    logger.addHandler(seen)
    try:
        with open_store(path, "verify", repair=True, walked=True) as s:
            opened = [f"at open: {m}" for m in seen.lines]
            problems = opened + s.verify()
            units = len(s.units)
    finally:
        logger.removeHandler(seen)
    return _store_report(out, as_json, path, units, problems)


def _store_report(out: TextIO, as_json: bool, path: Path, units: Optional[int], problems: List[str],
                  hint: Optional[str] = None) -> int:
    if as_json:
        doc = {"path": str(path), "kind": "store", "ok": not problems, "num_units": units, "problems": problems}
        if hint:
            doc["hint"] = hint
        out.write(to_json(doc, indent=1) + "\n")
    elif problems:
        out.write(f"BAD {path}: {len(problems)} problem(s)\n")
        for p in problems:
            out.write(f"    {p}\n")
        if hint:
            out.write(f"{hint}\n")
    else:
        out.write(f"ok  {path}: store with {units} units, every stored frame checked against its CRC32C, its "
                  f"controller index decoded\n")
    return EXIT_DAMAGED if problems else EXIT_OK


def _verify_dump(path: Path, out: TextIO, as_json: bool, quick: bool) -> int:
    from .cli_dumps import check_dump, verdict

    doc, problems = check_dump(path, quick)
    if as_json:
        out.write(to_json(dict(doc, ok=not problems, problems=problems), indent=1, default=str) + "\n")
    else:
        out.write(verdict(str(path), doc, problems))
    return EXIT_DAMAGED if problems else EXIT_OK


def cmd_verify(args, out: TextIO, err: TextIO) -> int:
    """Check a checkpoint, every generation of a root, a store or a dump: 0 clean, 1 damaged."""
    path = Path(args.path).absolute()
    kind = kind_of(path)
    note_interrupted(path, err)
    if kind == "store":
        return _verify_store(path, out, args.json, repair=args.repair)
    if kind == "dump":
        return _verify_dump(path, out, args.json, args.quick)
    if kind == "dumps":
        from .cli_dumps import verify_dumps

        return verify_dumps(path, out, args.json, args.quick)
    if kind == "checkpoint":
        reports = [(None, verify_one(path, err, args.quick))]
    elif kind == "root":
        reports = generation_reports(path, err, args.quick)  # (none: a root not saved to yet, nothing to verify)
    else:
        return refuse(path, kind, err)
    bad = [r for _, r in reports if not r.ok]
    if args.json:
        doc: Dict[str, Any] = {"path": str(path), "kind": kind, "ok": not bad,
                               "checkpoints": [dict(r.to_dict(), step=s) for s, r in reports]}
        out.write(to_json(doc, indent=1) + "\n")
    else:
        if not reports:
            out.write(f"no generations under {path}: nothing to verify\n")
        for step, r in reports:
            name = r.path if step is None else f"step {step} ({r.path.name})"
            if r.ok:
                out.write(f"ok  {name}: {r.files} files, {human(r.bytes_checked)} checked, "
                          f"{r.frames_checked} frames, {r.rows} rows, {r.num_units} units ({r.elapsed_s:.2f} s)\n")
            else:
                out.write(f"BAD {name}: {len(r.problems)} problem(s)\n")
                for p in r.problems:
                    out.write(f"    {p}\n")
    return EXIT_DAMAGED if bad else EXIT_OK


# ---------------------------------------------------------------------------- inspect
def _checkpoint_doc(path: Path) -> Dict[str, Any]:
    from .checkpoint.manifest import ROLE_CONTROLLER, ROLE_SEGMENT
    from .checkpoint.verify import controller_partitions, file_problem, lmdb_problems, read_manifest, \
        resolve_checkpoint_dir

    src = resolve_checkpoint_dir(path)
    man = read_manifest(src)
    segs = man.by_role(ROLE_SEGMENT)
    ctrl = man.by_role(ROLE_CONTROLLER)[0]
    # the controller copy is only mapped once it is a regular file that reads checked (in process, else walked)
    readable = file_problem(src, ctrl) is None and not lmdb_problems(src, [ctrl], first_only=True)
    return {
        "kind": "checkpoint", "path": str(src), "format_version": man.version,
        "tqstore_version": man.tqstore_version, "created_unix": man.created_unix,
        "include_storage": man.include_storage, "num_units": man.num_units, "snapshot": man.snapshot,
        "metadata": man.metadata, "files": len(man.files) + 1, "total_bytes": man.total_bytes,
        "segment_bytes": sum(e.size for e in segs), "segments": len(segs),
        "partitions": controller_partitions(src) if readable else None,
    }


def store_units(path: Path) -> List[Dict[str, Any]]:
    """Per unit of the store at ``path``: its segment files and their bytes (file sizes only)."""
    from . import layout_dirs as L

    d = L.read_store_file(path) or {}
    cur = L.read_current(path)
    units = []
    if cur:
        for i in range(int(d.get("num_units") or 0)):
            u = L.unit_dir(path / cur, i)
            seg_files = [n for n in sorted(os.listdir(u)) if n.endswith(".tqs")] if u.is_dir() else []
            units.append({"unit": i, "segments": len(seg_files),
                          "segment_bytes": sum(os.stat(u / n).st_size for n in seg_files)})
    return units


def _store_doc(path: Path) -> Dict[str, Any]:
    from . import layout_dirs as L

    d = L.read_store_file(path) or {}
    cur = L.read_current(path)
    doc: Dict[str, Any] = {"kind": "store", "path": str(path), "format_version": d.get("version"),
                           "num_units": d.get("num_units"),
                           "created_unix": d.get("created"), "state": cur, "units": store_units(path),
                           "partitions": _store_partitions(path)}  # checked decoder: damage raises
    doc["rows"] = sum(p["rows"] for p in doc["partitions"])
    doc["total_bytes"] = sum(u["segment_bytes"] for u in doc["units"])
    return doc


def root_doc(path: Path) -> Dict[str, Any]:
    """The generations under a root as their manifests say (nothing verified)."""
    from .checkpoint.manager import CheckpointManager
    from .checkpoint.verify import read_manifest

    m = CheckpointManager.for_reading(path)
    gens = []
    for s in m.steps():
        g: Dict[str, Any] = {"step": s, "path": str(m.path(s))}
        try:
            man = read_manifest(m.path(s))
            g.update(created_unix=man.created_unix, rows=man.rows, num_units=man.num_units,
                     total_bytes=man.total_bytes, format_version=man.version, metadata=man.metadata,
                     manifest_ok=True)
        except (CorruptionError, CheckpointNotFoundError) as e:
            if _gone(m, s):  # pruned meanwhile by a trainer's save
                continue
            g.update(manifest_ok=False, error=str(e))
        gens.append(g)
    for s in m._torn_steps():
        gens.append({"step": s, "path": str(m.path(s)), "manifest_ok": False, "error": "no MANIFEST.json (torn)"})
    gens.sort(key=lambda g: g["step"])
    return {"kind": "root", "path": str(path), "generations": gens}


def _dump_doc(path: Path) -> Dict[str, Any]:
    describe = dump_function("describe_dump")
    if describe is None:
        raise TqstoreError(f"{path} is a selective dump, and this build of tqstore cannot read dumps")
    doc = dict(describe(path))
    doc.setdefault("path", str(path))
    doc["kind"] = "dump"
    return doc


def _write_inspect(doc: Dict[str, Any], w) -> None:
    if doc["kind"] == "dumps":
        from .cli_dumps import write_dumps_doc

        write_dumps_doc(doc, w)
    elif doc["kind"] == "checkpoint":
        w(f"checkpoint {doc['path']}\n")
        w(f"  format version {doc['format_version']} (written by tqstore {doc['tqstore_version']}) on "
          f"{when(doc['created_unix'])}\n")
        snap = doc["snapshot"]
        w(f"  {snap.get('rows', '?')} rows in {snap.get('partitions', '?')} partitions, {doc['num_units']} units, "
          f"next global index {snap.get('next_gidx', '?')}\n")
        if doc["include_storage"]:
            w(f"  {snap.get('frames', '?')} frames, {human(snap.get('payload_bytes', 0))} of payload in "
              f"{doc['segments']} segments ({human(doc['segment_bytes'])})\n")
        else:
            w("  metadata only (saved with include_storage=False)\n")
        w(f"  {doc['files']} files, {human(doc['total_bytes'])}\n")
        if doc["metadata"]:
            w(f"  metadata: {to_json(doc['metadata'], sort_keys=True)}\n")
        for p in doc["partitions"] or []:
            w(f"  partition {p['partition']!r}: {p['rows']} rows\n")
    elif doc["kind"] == "store":
        w(f"store {doc['path']}: {doc['num_units']} units, {doc['rows']} rows, {human(doc['total_bytes'])} of "
          f"segments, format version {doc['format_version']}, state {doc['state']}, created "
          f"{when(doc['created_unix'])}\n")
        for u in doc["units"]:
            w(f"  unit {u['unit']}: {u['segments']} segments, {human(u['segment_bytes'])}\n")
        for p in doc["partitions"]:
            w(f"  partition {p['partition']!r}: {p['rows']} rows\n")
    elif doc["kind"] == "dump":
        w(f"dump {doc['path']}\n  format version {doc['format_version']} (written by tqstore "
          f"{doc['tqstore_version']}) on {when(doc['created_unix'])}\n  partition {doc['partition_id']!r}: "
          f"{doc['rows']} rows ({doc['rows_with_data']} with data), {doc['frames']} frames, "
          f"{human(doc['payload_bytes'])} of payload, from {doc['num_units']} units\n")
        for sh in doc["shards"]:
            w(f"  {sh['path']}: unit {sh['unit']}, {sh['rows']} rows, {sh['frames']} frames, {human(sh['size'])}\n")
    else:
        w(f"checkpoint generations under {doc['path']}: {len(doc['generations'])}\n")
        for g in doc["generations"]:
            if g["manifest_ok"]:
                w(f"  step {g['step']}: {g['rows']} rows, {g['num_units']} units, {human(g['total_bytes'])}, "
                  f"format version {g['format_version']}, {when(g['created_unix'])}\n")
            else:
                w(f"  step {g['step']}: unreadable ({g['error']})\n")


def cmd_inspect(args, out: TextIO, err: TextIO) -> int:
    """Summarise a checkpoint, a root, a store or a dump (reads only, verifies nothing)."""
    path = Path(args.path).absolute()
    kind = kind_of(path)
    note_interrupted(path, err)
    from .cli_dumps import dumps_doc

    builders = {"checkpoint": _checkpoint_doc, "store": _store_doc, "root": root_doc, "dump": _dump_doc,
                "dumps": dumps_doc}
    if kind not in builders:
        return refuse(path, kind, err)
    try:
        doc = builders[kind](path)
    except (CorruptionError, CheckpointNotFoundError) as e:
        err.write(f"error: {e}\n")
        return EXIT_DAMAGED
    if args.json:
        out.write(to_json(doc, indent=1, default=str) + "\n")
    else:
        _write_inspect(doc, out.write)
    if kind == "root" and not all(g["manifest_ok"] for g in doc["generations"]):
        return EXIT_DAMAGED  # (listed all the same: a generation whose manifest does not read)
    if kind == "dumps" and any("error" in d for d in doc["dumps"]):
        return EXIT_DAMAGED
    return EXIT_OK


# ---------------------------------------------------------------------------- ls
def _store_partitions(path: Path) -> List[Dict[str, Any]]:
    """Partitions of the store at ``path`` with their row and key counts, decoded (and checked)
    by the store's own controller decoder; reads only.  Raises CorruptionError on damage."""
    from . import layout_dirs as L
    from .checkpoint.verify import controller_summary

    L.read_store_file(path)
    cur = L.read_current(path)
    if cur is None:
        raise CorruptionError(f"store has no {L.CURRENT_FILE} pointer", path=str(path / L.CURRENT_FILE))
    if not (path / cur).is_dir():
        raise CorruptionError(f"{L.CURRENT_FILE} names the state directory {cur}, which does not exist",
                              path=str(path / L.CURRENT_FILE))
    ctrl = L.controller_dir(path / cur)
    if not (ctrl / "data.mdb").is_file():
        if any(u["segments"] for u in store_units(path)):  # (as the store's open refuses it)
            raise CorruptionError("the controller index is missing while the units hold segment files",
                                  path=str(ctrl / "data.mdb"))
        return []  # created, never opened past its descriptor
    walk_store_indexes(path, units=False)  # (a damaged page must not kill this process)
    st = controller_summary(ctrl, shared=True)  # a reader slot: safe while the store is open elsewhere
    return [{"partition": pid, "rows": q["rows"], "keys": q["keys"]} for pid, q in st["partitions"].items()]


def _ls_root(path: Path, out: TextIO, err: TextIO, as_json: bool, deep: bool) -> int:
    doc = root_doc(path)
    reports = dict(generation_reports(path, err, quick=not deep))
    doc["generations"] = [g for g in doc["generations"]  # (one pruned since it was listed is left out)
                          if g["step"] in reports or os.path.lexists(g["path"]) or os.path.lexists(g["path"] + ".old")]
    for g in doc["generations"]:
        rep = reports.get(g["step"])
        g["valid"] = bool(rep is not None and rep.ok)
        g["problems"] = [str(p) for p in rep.problems] if rep is not None else []
    if as_json:
        out.write(to_json(doc["generations"], indent=1) + "\n")
    else:
        for g in doc["generations"]:
            size = human(g["total_bytes"]) if g["manifest_ok"] else "?"
            valid = "yes" if g["valid"] else "NO"
            out.write(f"{g['step']:>12}  {size:>10}  {when(g.get('created_unix')):<19}  {valid:<5}  "
                      f"{Path(g['path']).name}\n")
    return EXIT_OK if all(g["valid"] for g in doc["generations"]) else EXIT_DAMAGED


def cmd_ls(args, out: TextIO, err: TextIO) -> int:
    """List a root's generations (valid or not), a checkpoint's files, a store's partitions or
    a dump's keys."""
    from .checkpoint.verify import read_manifest, resolve_checkpoint_dir

    path = Path(args.path).absolute()
    kind = kind_of(path)
    note_interrupted(path, err)
    try:
        if kind == "store":
            parts = _store_partitions(path)
            if args.json:
                out.write(to_json(parts, indent=1) + "\n")
            else:
                for p in parts:
                    out.write(f"{p['rows']:>10} rows  {p['keys']:>10} keys  {shown_name(p['partition'])}\n")
            return EXIT_OK
        if kind == "root":
            return _ls_root(path, out, err, args.json, getattr(args, "deep", False))
        if kind == "dump":
            return _ls_dump(path, out, args.json)
        if kind == "dumps":
            from .cli_dumps import ls_dumps

            return ls_dumps(path, out, args.json)
        if kind != "checkpoint":
            return refuse(path, kind, err)
        src = resolve_checkpoint_dir(path)
        man = read_manifest(src)
    except (CorruptionError, CheckpointNotFoundError) as e:
        err.write(f"error: {e}\n")
        return EXIT_DAMAGED
    rows = [{"path": e.path, "role": e.role, "size": e.size, "crc32c": f"{e.crc32c:08x}"} for e in man.files]
    if args.json:
        out.write(to_json(rows, indent=1) + "\n")
    else:
        for r in rows:
            out.write(f"{r['size']:>14}  {r['crc32c']}  {r['role']:<10}  {r['path']}\n")
    return EXIT_OK


def _ls_dump(path: Path, out: TextIO, as_json: bool) -> int:
    read_row_index = dump_function("read_row_index")
    if read_row_index is None:
        raise TqstoreError(f"{path} is a selective dump, and this build of tqstore cannot read dumps")
    idx = read_row_index(path)
    rows: List[Dict[str, Any]] = [{"key": k, "gidx": r.get("gidx"), "fields": sorted(r.get("fields") or []),
                                   "tag": r.get("tag")} for k, r in idx["rows"].items()]
    if as_json:
        out.write(to_json({"partition_id": idx.get("partition_id"), "rows": rows}, indent=1, default=str) + "\n")
    else:
        for r in rows:
            out.write(f"{shown_name(r['key'])}  fields={','.join(r['fields'])}  tag={to_json(r['tag'], default=str)}\n")
    return EXIT_OK


def shown_name(name: str) -> str:
    """A key or partition id as one line of a listing: as it is, or as a JSON string when it
    holds a character that is not printable (a newline would split the line), starts
    with a double quote (so that a quoted name is never a name as it is) or is empty (the key
    ``""`` is ``""``, not a blank)."""
    return name if name and name.isprintable() and not name.startswith('"') else to_json(name)


def newest_valid_steps(path: Path, err: TextIO, count: int, quick: bool = False) -> Tuple[List[int], List[int]]:
    """``(valid, damaged)``: the ``count`` newest generations under the root ``path`` that
    verify (deep unless ``quick``), newest first (fewer when fewer do), and the generations
    newer than the last of them that do not; checked from the newest down, stopping at the
    ``count``-th valid one."""
    from .checkpoint.manager import CheckpointManager

    m = CheckpointManager.for_reading(path)
    valid: List[int] = []
    damaged: List[int] = []
    for s in sorted(m.steps(), reverse=True):
        if len(valid) >= count:
            break
        (valid if verify_one(m.path(s), err, quick).ok else damaged).append(s)
    return valid, sorted(damaged)
