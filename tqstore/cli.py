"""``python -m tqstore``: look at checkpoints and stores from the shell.

Subcommands (``--json`` for machine-readable output on stdout):

* ``verify PATH``  — check a checkpoint (or every generation under a CheckpointManager
  root): exit 0 when clean, 1 when damaged (one line per problem), 2 when PATH is not a
  checkpoint or a generation root;
* ``inspect PATH`` — what a checkpoint, generation root or store directory holds (exit 1
  when its manifest or descriptor is unreadable, 2 when PATH is none of these);
* ``ls PATH``      — the generations under a root, the files of a checkpoint, or the
  partitions of a store (rows and keys of each);
* ``demo``         — a short put → save_checkpoint → verify → clear → load → get
  walk-through, then three CheckpointManager generations (keep_last=2) and a restore.

Errors are printed as one line (no traceback).  A progress bar is drawn on stderr only
when it is a terminal (tqdm when installed).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, TextIO

from ._version import __version__
from .errors import CheckpointNotFoundError, CorruptionError, TqstoreError

EXIT_OK = 0
EXIT_DAMAGED = 1
EXIT_USAGE = 2


# ---------------------------------------------------------------------------- helpers
def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def _when(t: Optional[float]) -> str:
    return "?" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


class _Progress:
    """A byte-count progress bar on stderr, only when stderr is a terminal."""

    def __init__(self, total: int, label: str, stream: TextIO) -> None:
        self.total = max(1, int(total))
        self.done = 0
        self.stream = stream
        self.label = label
        self._bar = None
        self._last = 0.0
        self.enabled = bool(getattr(stream, "isatty", lambda: False)())
        if self.enabled:
            try:
                from tqdm import tqdm  # optional dependency
            except ImportError:
                tqdm = None
            if tqdm is not None:
                self._bar = tqdm(total=self.total, unit="B", unit_scale=True, unit_divisor=1024, desc=label,
                                 file=stream, leave=False)

    def __call__(self, n: int) -> None:
        if not self.enabled:
            return
        self.done += n
        if self._bar is not None:
            self._bar.update(n)
            return
        now = time.monotonic()
        if now - self._last >= 0.1 or self.done >= self.total:
            self._last = now
            frac = min(1.0, self.done / self.total)
            width = 30
            fill = int(frac * width)
            self.stream.write(f"\r{self.label} [{'#' * fill}{'.' * (width - fill)}] {frac * 100:5.1f}% "
                              f"{_human(self.done)}")
            self.stream.flush()

    def close(self) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.close()
        else:
            self.stream.write("\r" + " " * 79 + "\r")
            self.stream.flush()


def _kind(path: Path) -> str:
    """``checkpoint`` | ``root`` | ``store`` | ``missing`` | ``other``."""
    from .checkpoint.manager import _STEP
    from .checkpoint.manifest import MANIFEST_NAME

    if (path / MANIFEST_NAME).is_file():
        return "checkpoint"
    if not path.exists():
        old = path.with_name(path.name + ".old")
        return "checkpoint" if (old / MANIFEST_NAME).is_file() else "missing"
    if not path.is_dir():
        return "other"
    if (path / "STORE.json").is_file():
        return "store"
    if any(_STEP.match(n) for n in os.listdir(path)):
        return "root"
    return "other"


def _not_checkpoint(path: Path, kind: str) -> str:
    if kind == "missing":
        return f"{path} does not exist"
    if kind == "store":
        return f"{path} is a store directory, not a checkpoint"
    return f"{path} is neither a checkpoint (no MANIFEST.json) nor a directory of checkpoint generations"


# ---------------------------------------------------------------------------- dumps (tqstore.dump does the work)
def _is_dump(path: Path) -> bool:
    from .checkpoint.target import is_dump_dir

    return is_dump_dir(path) or (not path.exists() and is_dump_dir(path.with_name(path.name + ".old")))


def _dump_command(path: Path, args, out: TextIO, err: TextIO, *, verify: bool) -> int:
    from .dump import describe_dump, verify_dump

    try:
        doc = describe_dump(path)
        problems = verify_dump(path, deep=not args.quick) if verify else []
    except (CorruptionError, CheckpointNotFoundError) as e:
        if not verify:
            err.write(f"error: {e}\n")
            return EXIT_DAMAGED
        doc, problems = {"path": str(path), "kind": "dump"}, [str(e)]
    if args.json:
        out.write(json.dumps(dict(doc, ok=not problems, problems=problems) if verify else doc, indent=1) + "\n")
    elif verify:
        if problems:
            out.write(f"BAD {path}: {len(problems)} problem(s)\n" + "".join(f"    {p}\n" for p in problems))
        else:
            out.write(f"ok  {path}: dump of {doc['rows']} rows ({doc['rows_with_data']} with data), "
                      f"{doc['frames']} frames, {len(doc['shards'])} shards, {_human(doc['bytes'])} checked\n")
    else:
        out.write(f"dump {doc['path']}\n  format version {doc['format_version']} (written by tqstore "
                  f"{doc['tqstore_version']}) on {_when(doc['created_unix'])}\n  partition {doc['partition_id']!r}: "
                  f"{doc['rows']} rows ({doc['rows_with_data']} with data), {doc['frames']} frames, "
                  f"{_human(doc['payload_bytes'])} of payload, from {doc['num_units']} units\n")
        for sh in doc["shards"]:
            out.write(f"  {sh['path']}: unit {sh['unit']}, {sh['rows']} rows, {sh['frames']} frames, "
                      f"{_human(sh['size'])}\n")
    return EXIT_DAMAGED if problems else EXIT_OK


# ---------------------------------------------------------------------------- verify
def _verify_one(path: Path, out: TextIO, err: TextIO, as_json: bool, quick: bool):
    from .checkpoint.verify import read_manifest, verify_checkpoint

    try:
        total = read_manifest(path).total_bytes
    except (CorruptionError, CheckpointNotFoundError):
        total = 0
    bar = _Progress(total, f"verify {path.name}", err)
    try:
        rep = verify_checkpoint(path, deep=not quick, raise_on_error=False, progress=bar)
    finally:
        bar.close()
    return rep


def cmd_verify(args, out: TextIO, err: TextIO) -> int:
    from .checkpoint.manager import CheckpointManager

    path = Path(args.path).absolute()
    if _is_dump(path):
        return _dump_command(path, args, out, err, verify=True)
    kind = _kind(path)
    if kind == "checkpoint":
        targets = [(None, path)]
    elif kind == "root":
        m = CheckpointManager(path)
        targets = [(s, m.path(s)) for s in m.steps()]
        torn = m._torn_steps()
        if not targets and not torn:
            err.write(f"error: no published generations under {path}\n")
            return EXIT_USAGE
    else:
        err.write(f"error: {_not_checkpoint(path, kind)}\n")
        return EXIT_USAGE
    reports = []
    for step, p in targets:
        rep = _verify_one(p, out, err, args.json, args.quick)
        reports.append((step, rep))
    if kind == "root":
        from .checkpoint.verify import CheckpointReport, Problem

        for step in torn:
            p = m.path(step)
            reports.append((step, CheckpointReport(p, problems=[Problem(str(p / "MANIFEST.json"), "generation "
                                                                        "directory has no MANIFEST.json (torn)")])))
        reports.sort(key=lambda x: x[0])
    bad = [r for _, r in reports if not r.ok]
    if args.json:
        doc: Dict[str, Any] = {"path": str(path), "ok": not bad,
                               "checkpoints": [dict(r.to_dict(), step=s) for s, r in reports]}
        out.write(json.dumps(doc, indent=1) + "\n")
    else:
        for step, r in reports:
            name = r.path if step is None else f"step {step} ({r.path.name})"
            if r.ok:
                out.write(f"ok  {name}: {r.files} files, {_human(r.bytes_checked)} checked, "
                          f"{r.frames_checked} frames, {r.rows} rows, {r.num_units} units ({r.elapsed_s:.2f} s)\n")
            else:
                out.write(f"BAD {name}: {len(r.problems)} problem(s)\n")
                for p in r.problems:
                    out.write(f"    {p}\n")
    return EXIT_DAMAGED if bad else EXIT_OK


# ---------------------------------------------------------------------------- inspect
def _partitions(ckpt: Path) -> Optional[List[Dict[str, Any]]]:
    """Partitions of a checkpoint's controller copy with their row counts (read only)."""
    from .checkpoint.verify import controller_partitions

    return controller_partitions(ckpt)


def _checkpoint_doc(path: Path) -> Dict[str, Any]:
    from .checkpoint.manifest import ROLE_CONTROLLER, ROLE_SEGMENT
    from .checkpoint.verify import file_problem, lmdb_walk, read_manifest, resolve_checkpoint_dir, walk_problems

    src = resolve_checkpoint_dir(path)
    man = read_manifest(src)
    segs = man.by_role(ROLE_SEGMENT)
    ctrl = man.by_role(ROLE_CONTROLLER)[0]
    # the controller copy is only mapped once it is a regular file that walks cleanly out of process
    readable = file_problem(src, ctrl) is None and not walk_problems(lmdb_walk(src, [ctrl], first_only=True))
    return {
        "kind": "checkpoint", "path": str(src), "format_version": man.version,
        "tqstore_version": man.tqstore_version, "created_unix": man.created_unix,
        "include_storage": man.include_storage, "num_units": man.num_units, "snapshot": man.snapshot,
        "metadata": man.metadata, "files": len(man.files) + 1, "total_bytes": man.total_bytes,
        "segment_bytes": sum(e.size for e in segs), "segments": len(segs),
        "partitions": _partitions(src) if readable else None,
    }


def _store_doc(path: Path) -> Dict[str, Any]:
    from . import layout_dirs as L

    d = L.read_store_file(path) or {}
    cur = L.read_current(path)
    doc: Dict[str, Any] = {"kind": "store", "path": str(path), "num_units": d.get("num_units"),
                           "created_unix": d.get("created"), "state": cur, "units": []}
    if cur:
        state = path / cur
        for i in range(int(d.get("num_units") or 0)):
            u = L.unit_dir(state, i)
            seg_files = [n for n in sorted(os.listdir(u)) if n.endswith(".tqs")] if u.is_dir() else []
            doc["units"].append({"unit": i, "segments": len(seg_files),
                                 "segment_bytes": sum(os.stat(u / n).st_size for n in seg_files)})
        doc["partitions"] = _partitions(state)
    return doc


def _root_doc(path: Path) -> Dict[str, Any]:
    from .checkpoint.manager import CheckpointManager
    from .checkpoint.verify import read_manifest

    m = CheckpointManager(path)
    gens = []
    for s in m.steps():
        g: Dict[str, Any] = {"step": s, "path": str(m.path(s))}
        try:
            man = read_manifest(m.path(s))
            g.update(created_unix=man.created_unix, rows=man.rows, num_units=man.num_units,
                     total_bytes=man.total_bytes, metadata=man.metadata, manifest_ok=True)
        except (CorruptionError, CheckpointNotFoundError) as e:
            g.update(manifest_ok=False, error=str(e))
        gens.append(g)
    return {"kind": "root", "path": str(path), "generations": gens}


def cmd_inspect(args, out: TextIO, err: TextIO) -> int:
    path = Path(args.path).absolute()
    if _is_dump(path):
        return _dump_command(path, args, out, err, verify=False)
    kind = _kind(path)
    try:
        if kind == "checkpoint":
            doc = _checkpoint_doc(path)
        elif kind == "store":
            doc = _store_doc(path)
        elif kind == "root":
            doc = _root_doc(path)
        else:
            err.write(f"error: {_not_checkpoint(path, kind)}\n")
            return EXIT_USAGE
    except (CorruptionError, CheckpointNotFoundError) as e:
        err.write(f"error: {e}\n")
        return EXIT_DAMAGED
    if args.json:
        out.write(json.dumps(doc, indent=1) + "\n")
        return EXIT_OK
    w = out.write
    if doc["kind"] == "checkpoint":
        w(f"checkpoint {doc['path']}\n")
        w(f"  format version {doc['format_version']} (written by tqstore {doc['tqstore_version']}) on "
          f"{_when(doc['created_unix'])}\n")
        snap = doc["snapshot"]
        w(f"  {snap.get('rows', '?')} rows in {snap.get('partitions', '?')} partitions, {doc['num_units']} units, "
          f"next global index {snap.get('next_gidx', '?')}\n")
        if doc["include_storage"]:
            w(f"  {snap.get('frames', '?')} frames, {_human(snap.get('payload_bytes', 0))} of payload in "
              f"{doc['segments']} segments ({_human(doc['segment_bytes'])})\n")
        else:
            w("  metadata only (saved with include_storage=False)\n")
        w(f"  {doc['files']} files, {_human(doc['total_bytes'])}\n")
        if doc["metadata"]:
            w(f"  metadata: {json.dumps(doc['metadata'], sort_keys=True)}\n")
        for p in doc["partitions"] or []:
            w(f"  partition {p['partition']!r}: {p['rows']} rows\n")
    elif doc["kind"] == "store":
        w(f"store {doc['path']}: {doc['num_units']} units, state {doc['state']}, created "
          f"{_when(doc['created_unix'])}\n")
        for u in doc["units"]:
            w(f"  unit {u['unit']}: {u['segments']} segments, {_human(u['segment_bytes'])}\n")
        for p in doc.get("partitions") or []:
            w(f"  partition {p['partition']!r}: {p['rows']} rows\n")
    else:
        w(f"checkpoint generations under {doc['path']}: {len(doc['generations'])}\n")
        for g in doc["generations"]:
            if g["manifest_ok"]:
                w(f"  step {g['step']}: {g['rows']} rows, {g['num_units']} units, {_human(g['total_bytes'])}, "
                  f"{_when(g['created_unix'])}\n")
            else:
                w(f"  step {g['step']}: unreadable manifest ({g['error']})\n")
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
    ctrl = L.controller_dir(path / cur)
    if not (ctrl / "data.mdb").is_file():
        return []  # created, never opened past its descriptor
    st = controller_summary(ctrl, shared=True)  # a reader slot: safe while the store is open elsewhere
    return [{"partition": pid, "rows": q["rows"], "keys": q["keys"]} for pid, q in st["partitions"].items()]


def cmd_ls(args, out: TextIO, err: TextIO) -> int:
    from .checkpoint.verify import read_manifest, resolve_checkpoint_dir

    path = Path(args.path).absolute()
    kind = _kind(path)
    if kind == "store":
        try:
            parts = _store_partitions(path)
        except CorruptionError as e:
            err.write(f"error: {e}\n")
            return EXIT_DAMAGED
        if args.json:
            out.write(json.dumps(parts, indent=1) + "\n")
        else:
            for p in parts:
                out.write(f"{p['rows']:>10} rows  {p['keys']:>10} keys  {p['partition']}\n")
        return EXIT_OK
    if kind == "root":
        doc = _root_doc(path)
        if args.json:
            out.write(json.dumps(doc["generations"], indent=1) + "\n")
        else:
            for g in doc["generations"]:
                size = _human(g["total_bytes"]) if g["manifest_ok"] else "?"
                out.write(f"{g['step']:>12}  {size:>10}  {_when(g.get('created_unix'))}  {Path(g['path']).name}\n")
        return EXIT_OK
    if kind != "checkpoint":
        err.write(f"error: {_not_checkpoint(path, kind)}\n")
        return EXIT_USAGE
    try:
        src = resolve_checkpoint_dir(path)
        man = read_manifest(src)
    except (CorruptionError, CheckpointNotFoundError) as e:
        err.write(f"error: {e}\n")
        return EXIT_DAMAGED
    rows = [{"path": e.path, "role": e.role, "size": e.size, "crc32c": f"{e.crc32c:08x}"} for e in man.files]
    if args.json:
        out.write(json.dumps(rows, indent=1) + "\n")
    else:
        for r in rows:
            out.write(f"{r['size']:>14}  {r['crc32c']}  {r['role']:<10}  {r['path']}\n")
    return EXIT_OK


# ---------------------------------------------------------------------------- demo
def cmd_demo(args, out: TextIO, err: TextIO) -> int:
    import numpy as np

    import tqstore as tq

    from . import layout_dirs as L

    def say(s: str = "") -> None:
        out.write(s + "\n")
        out.flush()

    base = Path(args.dir).absolute() if args.dir else L.scratch_dir("tqstore-demo-")
    keep = bool(args.dir)
    try:
        store_dir, ckpt, root = base / "store", base / "ckpt", base / "generations"
        say(f"tqstore {__version__} demo, working in {base}")
        say()
        say(f">>> tq.init({{'path': '{store_dir}', 'num_units': 2}})")
        tq.init({"path": str(store_dir), "num_units": 2})
        try:
            keys = [f"prompt-{i}" for i in range(8)]
            rng = np.random.default_rng(0)  # numpy in; torch tensors come back (tensors go in the same way)
            lens = [3 + i for i in range(8)]
            fields = {
                "input_ids": rng.integers(0, 32000, (8, 16), dtype=np.int64),
                "logprobs": [rng.standard_normal(n, dtype=np.float32) for n in lens],
                "text": [f"answer {i}: " + "x" * i for i in range(8)],
            }
            say(">>> tq.kv_batch_put(keys, 'train', fields={input_ids: int64[8, 16], logprobs: 8 jagged float32 "
                "rows, text: 8 strings}, tags=[{'reward': ...}, ...])")
            tq.kv_batch_put(keys, "train", fields=fields, tags=[{"reward": i / 8} for i in range(8)])
            before = tq.kv_batch_get(keys, "train")
            say(f"    kv_list() -> {len(tq.kv_list()['train'])} keys in partition 'train'")
            say()
            say(f">>> tq.save_checkpoint('{ckpt}', metadata={{'step': 100}})")
            info = tq.save_checkpoint(str(ckpt), metadata={"step": 100})
            say(f"    {info.rows} rows, {info.num_units} units, {info.files} files, {_human(info.total_bytes)}; "
                f"stall {info.stall_s * 1e3:.2f} ms, written in {info.write_s * 1e3:.1f} ms")
            say(f">>> tq.verify_checkpoint('{ckpt}')")
            rep = tq.verify_checkpoint(str(ckpt))
            say(f"    ok: {rep.files} files, {rep.frames_checked} frames checked against their CRC32C")
            say()
            say(">>> tq.kv_clear(keys, 'train')")
            tq.kv_clear(keys, "train")
            say(f"    kv_list() -> {tq.kv_list()}")
            say()
            say(f">>> tq.load_checkpoint('{ckpt}')")
            li = tq.load_checkpoint(str(ckpt))
            say(f"    {li.rows} rows back ({li.mode} load, {_human(li.read_bytes)} verified), metadata "
                f"{li.metadata}")
            after = tq.kv_batch_get(keys, "train")
            same = (np.array_equal(np.asarray(before["input_ids"]), np.asarray(after["input_ids"]))
                    and list(before["text"]) == list(after["text"])
                    and len(before["logprobs"]) == len(after["logprobs"])
                    and all(np.array_equal(np.asarray(a), np.asarray(b))
                            for a, b in zip(before["logprobs"], after["logprobs"])))
            say(f">>> tq.kv_batch_get(keys, 'train') -> identical to what was put: {same}")
            say()
            say(f">>> m = tq.CheckpointManager('{root}', keep_last=2)")
            m = tq.CheckpointManager(str(root), keep_last=2)
            for step in (1, 2, 3):
                tq.kv_put(f"extra-{step}", "train", fields={"text": f"step {step}"})
                m.save(step, metadata={"step": step})
                say(f"    m.save({step}) -> m.steps() = {m.steps()}")
            say(f">>> m.restore() -> step {m.restore()} (the newest that verifies)")
            if not same:
                err.write("error: the loaded rows differ from the saved ones\n")
                return EXIT_DAMAGED
        finally:
            tq.close()
        say()
        if keep:
            say(f"try: python -m tqstore inspect {ckpt}")
            say(f"     python -m tqstore verify {root}")
        else:
            say("(the temporary files are removed; run `python -m tqstore demo --dir DIR` to keep them, then "
                "`python -m tqstore inspect DIR/ckpt` or `verify DIR/generations`)")
        return EXIT_OK
    finally:
        if not keep:
            L.remove_tree(base, ignore_errors=True)


# ---------------------------------------------------------------------------- main
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tqstore",
                                description="Verify and inspect tqstore checkpoints, checkpoint generation "
                                            "roots and store directories; run a demo.",
                                epilog="Exit status: 0 ok, 1 damaged or unreadable, 2 not a checkpoint (or usage "
                                       "error). Errors are printed as one line on stderr.")
    p.add_argument("--version", action="version", version=f"tqstore {__version__}")
    sub = p.add_subparsers(dest="command", metavar="{verify,inspect,ls,demo}")
    v = sub.add_parser("verify", help="check a checkpoint, or every generation under a root (exit 1 on damage)",
                       description="Check a checkpoint, or every published generation under a CheckpointManager "
                                   "root (a generation directory without MANIFEST.json counts as damaged), without "
                                   "writing anything: the manifest and its checksum, every listed "
                                   "file's presence, size and CRC32C, no unlisted files, and (unless --quick) the "
                                   "indexes: row and unit counts, every index entry inside a saved segment, every "
                                   "indexed frame against its CRC32C. Prints one line per checkpoint and one per "
                                   "problem (naming file and offset). Exit status: 0 clean, 1 damaged, 2 PATH is "
                                   "not a checkpoint or generation root.")
    v.add_argument("path", help="a checkpoint directory or a CheckpointManager root")
    v.add_argument("--json", action="store_true", help="print a JSON report on stdout")
    v.add_argument("--quick", action="store_true", help="check the manifest and each file's size and whole-file "
                                                        "CRC32C only (do not open the indexes or check frames)")
    i = sub.add_parser("inspect", help="summarise a checkpoint, a generation root or a store directory",
                       description="Summarise a checkpoint (rows, partitions, units, frames, files, metadata), a "
                                   "CheckpointManager root (its generations) or a store directory (units, "
                                   "segments, partitions). Reads only, and checks nothing beyond parsing the "
                                   "manifest (with its checksum); use verify for that. Exit status: 0 ok, 1 "
                                   "unreadable checkpoint manifest or store descriptor, 2 PATH is none of these.")
    i.add_argument("path", help="a checkpoint, a CheckpointManager root or a store directory")
    i.add_argument("--json", action="store_true", help="print a JSON document on stdout")
    ls = sub.add_parser("ls", help="list the generations under a root, the files of a checkpoint, or the "
                                   "partitions of a store",
                        description="List the generations under a CheckpointManager root (step, size, time, "
                                    "directory), the files of a checkpoint (size, CRC32C, role, path) as "
                                    "MANIFEST.json records them, or the partitions of a store directory (rows, "
                                    "keys, partition id; read only). Exit status: 0 ok, 1 unreadable manifest or "
                                    "damaged store metadata, 2 PATH is none of these.")
    ls.add_argument("path", help="a checkpoint directory, a CheckpointManager root or a store directory")
    ls.add_argument("--json", action="store_true", help="print JSON on stdout")
    d = sub.add_parser("demo", help="a walk-through: put, save, clear, load, get, generations",
                       description="Walk through the API on a 2-unit store: kv_batch_put, save_checkpoint, "
                                   "verify_checkpoint, kv_clear, load_checkpoint, kv_batch_get (checked identical), "
                                   "then three CheckpointManager generations with keep_last=2 and a restore. "
                                   "Exit status 1 if the loaded rows differ.")
    d.add_argument("--dir", help="work (and leave the files) in this directory instead of a temporary one")
    return p


COMMANDS: Dict[str, Callable[..., int]] = {"verify": cmd_verify, "inspect": cmd_inspect, "ls": cmd_ls,
                                           "demo": cmd_demo}


def main(argv: Optional[Sequence[str]] = None, *, out: TextIO = None, err: TextIO = None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse already printed the usage line
        return int(e.code or 0) and EXIT_USAGE
    if not args.command:
        parser.print_help(out)
        return EXIT_USAGE
    try:
        return COMMANDS[args.command](args, out, err)
    except KeyboardInterrupt:
        err.write("interrupted\n")
        return 130
    except (TqstoreError, OSError) as e:
        err.write(f"error: {e}\n")
        return EXIT_DAMAGED if isinstance(e, CorruptionError) else EXIT_USAGE
