"""Selective restore operations of the crash matrix: ``load_data_by_key`` (a dump of 3
source units onto the 2-unit live store, new keys and existing ones), and
``recover_data_load`` completing or cancelling a load a killed process left pending.

Invariants after every crash (on copies of what a restarted process finds):

* the store reopens and every frame verifies;
* if no restore is pending, the rows are exactly those before the operation or after it
  (after it when it was acknowledged);
* if one is pending, the live rows are those before the load (nothing of it visible), its
  partition refuses clears with RestorePendingError, and ``recover_data_load`` settles it:
  completing gives exactly the rows of the completed load, cancelling exactly those before
  it (and a second call answers False); a reopen after that sees the same.
"""
from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path
from typing import List

from tqstore.errors import RestorePendingError
from tqstore.store import Store

from .harness import Outcome, Scenario, copy_tree
from .model import diff_states, row_values_allowed, store_state
from .scenarios import SEG, batch, open_store, store_scenario

KEYS = ["a0", "a2", "a3", "bare", "n0", "n1"]  # a0, a2: existing keys of the live store; the rest new
DURABILITY = "commit"


def _setup(base: Path) -> dict:
    with Store(base / "src", num_units=3, durability="checkpoint", segment_bytes=SEG, max_workers=1) as src:
        keys = [f"a{i}" for i in range(4)] + ["n0", "n1"]
        src.write("p", batch(keys, salt=7, big=True), keys=keys)
        src.kv_put("bare", "p", tag={"no": "fields"})
        src.dump_data_by_key(base / "dump", KEYS, "p")
    with open_store(base, DURABILITY) as s:
        s.write("p", batch(["a0", "a2", "x0"], salt=1), keys=["a0", "a2", "x0"])
        s.write("q", batch(["q0"], salt=2), keys=["q0"])
    return {}


def _load(base: Path, ctx: dict) -> None:
    with open_store(base, DURABILITY, None) as s:
        s.load_data_by_key(base / "dump")


def _pending_setup(base: Path) -> dict:
    """A load killed (SIGKILL) after its first unit completed: the restore is pending."""
    from tqstore.testing import run_forked

    ctx = _setup(base)

    def killed_load():
        with open_store(base, DURABILITY, None) as s:
            real = s.controller.complete_restore

            def complete(rid, u, attempt):
                real(rid, u, attempt)
                os.kill(os.getpid(), signal.SIGKILL)
            s.controller.complete_restore = complete
            s.load_data_by_key(base / "dump")

    res = run_forked(killed_load)
    assert res.exitcode == -signal.SIGKILL, res
    return ctx


def _recover(cancel: bool):
    def op(base: Path, ctx: dict) -> None:
        with open_store(base, DURABILITY, None) as s:
            s.recover_data_load(base / "dump", cancel=cancel)
    return op


def _settled_picture(src: Path, work: Path, dump: Path, *, cancel: bool) -> dict:
    copy_tree(src / "store", work / "store")
    with open_store(work, DURABILITY, None) as s:
        if not s.recover_data_load(dump, cancel=cancel):
            raise AssertionError("recover_data_load found no pending restore")
        if s.recover_data_load(dump, cancel=cancel):
            raise AssertionError("a second recover_data_load settled something again")
    with open_store(work, DURABILITY, None) as s:
        return store_state(s)


def check_restore(base: Path, ctx: dict, out: Outcome, *, complete: dict, before: dict) -> List[str]:
    """See the module docstring; ``complete``: the rows after the load completed."""
    v: List[str] = []
    work = base / "_check"
    try:
        copy_tree(base / "store", work / "store")
        with open_store(work, DURABILITY, None) as s:
            got = store_state(s)
            problems = s.verify()
            pending = s.controller.restores()
            blocked = None
            if pending:
                try:
                    s.delete_rows("p", [])
                except RestorePendingError as e:
                    blocked = e
    except Exception as e:  # noqa: BLE001 - any failure to reopen is the violation
        return [f"store does not reopen: {type(e).__name__}: {e}"]
    strict = out.mode == "kill" or DURABILITY == "commit"
    if problems:
        v.append(f"verify finds {len(problems)} problems: {problems[:2]}")
    if not strict:
        return v + row_values_allowed(got, [before, complete], allow_errors=True)
    if not pending:
        if out.acked and got != out.after:
            v.append(f"acknowledged operation lost: {diff_states(got, out.after)}")
        elif got != before and got != out.after:
            v.append(f"torn state: vs before {diff_states(got, before)}; vs after {diff_states(got, out.after)}")
        return v
    if got != before:
        v.append(f"a pending restore is visible: {diff_states(got, before)}")
    if blocked is None:
        v.append("a pending restore does not block clears of its partition")
    for cancel, want in ((False, complete), (True, before)):
        try:
            settled = _settled_picture(work, base / f"_settle{int(cancel)}", base / "dump", cancel=cancel)
        except Exception as e:  # noqa: BLE001
            v.append(f"recover_data_load(cancel={cancel}) fails: {type(e).__name__}: {e}")
            continue
        if settled != want:
            v.append(f"recover_data_load(cancel={cancel}) gives {diff_states(settled, want)}")
    return v


def _scenario(name: str, setup, op, *, ops: str, complete_key: str) -> Scenario:
    sc = store_scenario(name, setup, op, durability=DURABILITY, ops=ops)
    with_before = sc.setup  # setup, then the picture of the live store (ctx["before"])

    def setup_and_pictures(base: Path) -> dict:
        ctx = with_before(base)
        work = base / "_pic"
        copy_tree(base / "store", work / "store")
        with open_store(work, DURABILITY, None) as s:
            if complete_key == "load":
                s.load_data_by_key(base / "dump")
            else:
                s.recover_data_load(base / "dump")
            ctx["complete"] = store_state(s)
        shutil.rmtree(work)
        if complete_key != "load":  # the rows before the killed load: a cancel gives them back
            work = base / "_pic0"
            copy_tree(base / "store", work / "store")
            with open_store(work, DURABILITY, None) as s:
                s.recover_data_load(base / "dump", cancel=True)
                ctx["before_load"] = store_state(s)
            shutil.rmtree(work)
        return ctx

    def check(base: Path, ctx: dict, out: Outcome) -> List[str]:
        return check_restore(base, ctx, out, complete=ctx["complete"], before=ctx.get("before_load", ctx["before"]))

    sc.setup, sc.check = setup_and_pictures, check
    return sc


def restore_scenarios() -> List[Scenario]:
    return [
        _scenario("load_by_key", _setup, _load, ops="load by key", complete_key="load"),
        _scenario("recover_load_complete", _pending_setup, _recover(False), ops="recover load", complete_key="recover"),
        _scenario("recover_load_cancel", _pending_setup, _recover(True), ops="recover load", complete_key="recover"),
    ]
