"""Selective dump operations of the crash matrix: a blocking dump, a background dump with
puts, overwrites and clears after its cut, and a dump replacing an earlier one (publish).

Invariants after every crash (what a restarted process finds at the dump's path, through
``read_row_index``, which repairs an interrupted publication first):

* no torn dump is ever visible: whatever resolves verifies (``verify_dump``) and holds
  exactly the rows and frames of a dump that was started (the cut's, or the previous one);
* an acknowledged dump is there; an unacknowledged one is there whole, or the previous dump
  (or nothing, when there was none); a replaced dump never vanishes;
* after that first access only ``<dir>`` and ``<dir>.lock`` are left (no ``.tmp``, ``.old``);
* the live store reopens with the state before (a dump writes nothing into it) or, for the
  background dump, after the puts that followed the cut.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import List, Optional

from tqstore.dump import verify_dump
from tqstore.errors import CheckpointNotFoundError, TqstoreError

from dump_helpers import dump_picture

from .ckpt_scenarios import DUR, _fill, check_live, ckpt_scenario
from .harness import Outcome, Scenario
from .scenarios import batch, open_store

KEYS = ["a0", "a2", "a3", "bare"]


def _setup(base: Path, *, previous: bool = False) -> dict:
    with open_store(base, DUR) as s:
        _fill(s, "a", 4, 1)
        s.kv_put("bare", "p", tag={"pending": True})
        s.write("q", batch(["q0"], salt=2), keys=["q0"])
        s.dump_data_by_key(base / "_expect", KEYS, "p")
        ctx = {"expect": dump_picture(base / "_expect")}
        if previous:
            s.dump_data_by_key(base / "dump", ["a1", "bare"], "p")
            ctx["previous"] = dump_picture(base / "dump")
    shutil.rmtree(base / "_expect")
    os.unlink(base / "_expect.lock")
    return ctx


def _dump(blocking: bool):
    def op(base: Path, ctx: dict) -> None:
        with open_store(base, DUR, None) as s:
            h = s.dump_data_by_key(base / "dump", KEYS, "p", blocking=blocking)
            if not blocking:  # after the cut: an overwrite and a new key, which must not reach the dump
                s.write("p", batch(["a0", "a9"], salt=50), keys=["a0", "a9"])  # (one acknowledged operation:
                h.result()  # the live store's check allows the state before it or after it; clears: test_dump)
    return op


def check_dump(base: Path, d: Path, *, acked: bool, expect: dict, previous: Optional[dict]) -> List[str]:
    try:
        got = dump_picture(d)
    except CheckpointNotFoundError:
        if acked:
            return ["acknowledged dump is missing"]
        return ["the previous dump vanished"] if previous is not None else []
    except TqstoreError as e:
        return [f"visible dump is unreadable: {type(e).__name__}: {e}"]
    v = [f"visible dump does not verify: {p}" for p in verify_dump(d)[:2]]
    allowed = [expect] if acked or previous is None else [expect, previous]
    if got not in allowed:
        v.append(f"visible dump holds rows {sorted(got['rows'])} of no dump that was started")
    left = sorted(n for n in os.listdir(d.parent) if n.startswith(d.name) and n not in (d.name, d.name + ".lock"))
    if left:
        v.append(f"left beside the dump after an access: {left}")
    return v


def _check(base: Path, ctx: dict, out: Outcome) -> List[str]:
    v = check_dump(base, base / "dump", acked=out.acked, expect=ctx["expect"], previous=ctx.get("previous"))
    return v + check_live(base, out, before=ctx["before"], after=out.after, durability=DUR)


def dump_scenarios() -> List[Scenario]:
    return [
        ckpt_scenario("dump", _setup, _dump(True), _check, ops="dump"),
        ckpt_scenario("dump_async", _setup, _dump(False), _check, ops="async dump"),
        ckpt_scenario("dump_replace", lambda b: _setup(b, previous=True), _dump(True), _check, ops="dump publish"),
    ]


def planted_dump_bugs() -> dict:
    from .ckpt_scenarios import _skip

    by_name = {sc.name: sc for sc in dump_scenarios()}
    return {
        # the dump's directory entries (its shards, rows.json) are not made durable before it is renamed into place
        "dump_dir_fsync_removed": (by_name["dump"], lambda: _skip("fsync_dir", lambda p: p.name.endswith(".tmp"))),
    }
