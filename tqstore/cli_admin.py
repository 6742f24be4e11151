"""``prune`` and ``compact`` of ``python -m tqstore``: the two commands that change files.

* ``prune ROOT --keep N`` deletes the generations of a CheckpointManager root older than the
  newest ``N`` that verify, through :meth:`CheckpointManager.prune` (under the root's
  exclusive lock, deleting nothing if the root no longer looks like a root): the
  generations are verified from the newest down first, until ``N`` verify; newer damaged
  ones are kept too (and named), holding no slot of the ``N``.  With no generation that
  verifies nothing is deleted (exit 1); a root with no generations at all (a manager that
  has not saved yet) has nothing to prune (exit 0).
* ``compact STORE`` opens the store (it must not be open in another process) and rewrites
  the live frames of mostly-dead sealed segments and of small ones, then unlinks them
  (:meth:`Store.compact`).  A store whose open would drop data as lost (a missing unit
  directory or segment file, a truncated segment) is refused first, nothing changed (exit
  1); what the open's crash recovery dropped all the same is reported (exit 1).
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Dict, TextIO

from .checkpoint.target import ROOT_LOCK_NAME
from .cli_inspect import LostDataWarnings, newest_valid_steps, root_doc
from .cli_util import EXIT_DAMAGED, EXIT_OK, EXIT_USAGE, human, kind_of, open_store, refuse, to_json


def cmd_prune(args, out: TextIO, err: TextIO) -> int:
    """Delete the generations older than the ``--keep`` newest that verify (newer damaged ones
    are kept, and named)."""
    from .checkpoint import CheckpointManager, KeepAny, KeepLast, KeepSteps

    path = Path(args.path).absolute()
    kind = kind_of(path)
    if kind != "root":
        return refuse(path, kind, err, "a directory of checkpoint generations")
    if not isinstance(args.keep, int) or args.keep < 1:
        err.write(f"error: --keep must be an integer >= 1, got {args.keep!r}\n")
        return EXIT_USAGE
    before = [g["step"] for g in root_doc(path)["generations"]]
    doc: Dict[str, Any] = {"path": str(path), "keep": args.keep, "newest_valid": None, "dry_run": args.dry_run}
    if not [n for n in os.listdir(path) if n != ROOT_LOCK_NAME]:  # (a manager that has not saved yet)
        doc.update(deleted=[], kept=[], damaged=[], not_tqstore=[], ok=True)
        out.write(to_json(doc, indent=1) + "\n" if args.json else f"no generations under {path}: nothing to prune\n")
        return EXIT_OK
    valid, damaged = newest_valid_steps(path, err, args.keep, quick=args.quick)
    doc["newest_valid"] = valid[0] if valid else None
    doc["damaged"] = damaged
    if not valid:
        doc.update(deleted=[], kept=before, not_tqstore=[], ok=False)
        if args.json:
            out.write(to_json(doc, indent=1) + "\n")
        err.write(f"error: no generation under {path} verifies; nothing deleted\n")
        return EXIT_DAMAGED
    # every generation from the oldest of the --keep newest valid ones up: a damaged one holds no slot
    listed = CheckpointManager.for_reading(path).steps()
    policy = KeepAny(KeepLast(args.keep), KeepSteps(s for s in listed if s >= min(valid)))
    m = CheckpointManager(path, policy=policy)
    doomed, foreign = m.prune_plan()
    deleted = doomed if args.dry_run else m.prune()
    doc.update(deleted=deleted, kept=[s for s in before if s not in deleted], not_tqstore=foreign,
               ok=True)  # (torn ones left: kept)
    if args.json:
        out.write(to_json(doc, indent=1) + "\n")
    else:
        verb = "would delete" if args.dry_run else "deleted"
        out.write(f"{verb} {len(deleted)} generation(s) {deleted}; kept {doc['kept']} (newest valid: step "
                  f"{valid[0]}; {len(valid)} of the kept verify)\n")
        if damaged:
            out.write(f"damaged (kept, holding no slot of --keep; `verify` says why): steps {damaged}\n")
        if foreign:
            out.write(f"left alone (holding what is not a tqstore checkpoint): steps {foreign}\n")
    return EXIT_OK


def cmd_compact(args, out: TextIO, err: TextIO) -> int:
    """Compact the mostly-dead (and merge the small) segments of a store that no other process has open."""
    from .cli_inspect import store_units

    path = Path(args.path).absolute()
    kind = kind_of(path)
    if kind != "store":
        return refuse(path, kind, err, "a store directory")
    if not 0.0 < args.live_ratio <= 1.0:
        err.write(f"error: --live-ratio must be in (0, 1], got {args.live_ratio}\n")
        return EXIT_USAGE
    seen, logger = LostDataWarnings(), logging.getLogger("tqstore")
    logger.addHandler(seen)
    try:  # (files its open would take for lost are refused before it: nothing changed)
        with open_store(path, "compact") as s:
            before = sum(u["segment_bytes"] for u in store_units(path))
            n = s.compact(live_ratio=args.live_ratio)
    finally:
        logger.removeHandler(seen)
    after = sum(u["segment_bytes"] for u in store_units(path))
    lost = [f"at open: {m}" for m in seen.lines]  # (what its crash recovery dropped all the same)
    doc = {"path": str(path), "ok": not lost, "segments_compacted": n, "bytes_before": before, "bytes_after": after,
           "problems": lost}
    if args.json:
        out.write(to_json(doc, indent=1) + "\n")
    else:
        out.write(f"compacted {n} segment(s): {human(before)} -> {human(after)} of segment files\n")
        for m in lost:
            out.write(f"    {m}\n")
    return EXIT_DAMAGED if lost else EXIT_OK
