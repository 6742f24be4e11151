"""Checkpoint operations of the crash matrix: save (blocking, background, replacing, copy
mode), generations (save with prune, prune, restore), load and reshard load.

Invariants after every crash (a published checkpoint is what ``verify_checkpoint``
resolves at its path):

* no torn checkpoint is ever visible: whatever resolves verifies, and loads to exactly
  the state of a save that was started (``verify`` agrees with ``load``);
* an acknowledged save (or an earlier one, when the new one was not acknowledged) is
  there; for generations, the newest acknowledged one (or a newer complete one) restores;
* a load either fully happened or did not: the live store is the state before or the
  checkpoint's, and the checkpoint's when acknowledged;
* the live store reopens, with the invariants of :func:`scenarios.check_store`.
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Dict, List, Optional

from tqstore.checkpoint import CheckpointManager, verify_checkpoint
from tqstore.errors import CheckpointNotFoundError, TqstoreError
from tqstore.store import Store
from tqstore.testing import lmdb_policy

from .harness import Outcome, Scenario, copy_tree
from .model import diff_states, row_values_allowed, store_state
from .scenarios import SEG, batch, open_store, picture

DUR = "checkpoint"  # the usual setting: checkpoints are the durable copies


# ---------------------------------------------------------------------------- reading checkpoints
def scratch_store(base: Path, num_units: int = 2) -> Store:
    p = base / "_scratch"
    if p.exists():
        shutil.rmtree(p)
    return Store(p, num_units=num_units, durability="checkpoint", segment_bytes=SEG, max_workers=1)


def load_picture(base: Path, ck: Path, num_units: int = 2) -> dict:
    s = scratch_store(base, num_units)
    try:
        s.load_checkpoint(ck)
        return store_state(s)
    finally:
        s.close()
        shutil.rmtree(base / "_scratch", ignore_errors=True)


def check_checkpoint(base: Path, ck: Path, *, must_exist: bool, allowed: List[dict], label: str) -> List[str]:
    """``ck`` is absent (allowed unless ``must_exist``) or verifies and loads to a state in
    ``allowed``; a checkpoint that resolves but does not verify is torn."""
    try:
        report = verify_checkpoint(ck, raise_on_error=False)
    except CheckpointNotFoundError:
        return [f"{label}: acknowledged checkpoint {ck.name} is missing"] if must_exist else []
    except TqstoreError as e:
        return [f"{label}: visible checkpoint {ck.name} is unreadable: {type(e).__name__}: {e}"]
    if not report.ok:
        return [f"{label}: torn checkpoint {ck.name} visible: {[str(p) for p in report.problems[:2]]}"]
    try:
        got = load_picture(base, ck)
    except Exception as e:  # noqa: BLE001 - verify passed, so any load failure is the violation
        return [f"{label}: {ck.name} verifies but does not load: {type(e).__name__}: {e}"]
    if got not in allowed:
        return [f"{label}: {ck.name} loads to a state no save produced: "
                + " / ".join(diff_states(got, a) for a in allowed)]
    return []


def check_live(base: Path, out: Outcome, *, before: dict, after: dict, durability: str,
               strict: Optional[bool] = None, num_units: Optional[int] = None) -> List[str]:
    """The live store reopens and holds ``before`` or ``after`` (``after`` when acknowledged);
    without per-commit durability a power loss may only lose rows, never return wrong ones."""
    try:
        with Store(base / "store", num_units=num_units, durability=durability, segment_bytes=SEG,
                   max_workers=1) as s:
            got = store_state(s)
    except Exception as e:  # noqa: BLE001
        return [f"live store does not reopen: {type(e).__name__}: {e}"]
    if strict is None:
        strict = out.mode == "kill" or durability == "commit"
    if not strict:
        return row_values_allowed(got, [before, after], allow_errors=True)
    if out.acked and got != after:
        return [f"live store lost the acknowledged operation: {diff_states(got, after)}"]
    if got != before and got != after:
        return [f"live store torn: vs before {diff_states(got, before)}; vs after {diff_states(got, after)}"]
    return []


def generations_check(base: Path, root: Path, *, newest_at_least: int, allowed: Dict[int, dict],
                      label: str = "generations") -> List[str]:
    """Every listed generation verifies; the newest one is at least ``newest_at_least``; a
    restore through the manager gives the newest generation's state."""
    v: List[str] = []
    mgr = CheckpointManager(root)
    steps = mgr.steps()
    if not steps or steps[-1] < newest_at_least:
        return [f"{label}: newest generation {steps[-1] if steps else None} < acknowledged {newest_at_least}"]
    for st in steps:
        v += check_checkpoint(base, mgr.path(st), must_exist=True, allowed=[allowed[st]] if st in allowed else [],
                              label=f"{label} step {st}")
    s = scratch_store(base)
    try:
        restored = CheckpointManager(root, store=s).restore()
        got = store_state(s)
    except Exception as e:  # noqa: BLE001
        v.append(f"{label}: restore failed: {type(e).__name__}: {e}")
        return v
    finally:
        s.close()
        shutil.rmtree(base / "_scratch", ignore_errors=True)
    if restored != steps[-1]:
        v.append(f"{label}: restore picked step {restored}, newest is {steps[-1]}")
    elif got != allowed.get(restored):
        v.append(f"{label}: step {restored} restores to the wrong state: {diff_states(got, allowed.get(restored, {}))}")
    return v


def ckpt_scenario(name: str, setup, op, check, *, ops: str, durability: str = DUR) -> Scenario:
    """``setup(base) -> ctx``; ``check(base, ctx, out) -> violations`` (ctx["before"] is the
    live store's picture after setup)."""

    def setup_and_picture(base: Path) -> dict:
        ctx = setup(base) or {}
        copy_tree(base / "store", base / "_pic" / "store")
        ctx["before"] = picture(base / "_pic", durability)
        shutil.rmtree(base / "_pic")
        return ctx

    def observe(base: Path, ctx: dict) -> dict:
        return picture(base, durability)

    return Scenario(name, setup_and_picture, op, observe, check,
                    policy=lmdb_policy("store", synced=durability == "commit"), ops=ops)


# ---------------------------------------------------------------------------- setups
def _fill(s: Store, prefix: str, n: int, salt: int, *, big: bool = True) -> None:
    keys = [f"{prefix}{i}" for i in range(n)]
    s.write("p", batch(keys, salt=salt, big=big), keys=keys)


def _setup_live(base: Path, *, num_units: int = 2) -> dict:
    with open_store(base, DUR, num_units) as s:
        _fill(s, "a", 4, 1)
        s.write("q", batch(["q0", "q1"], salt=2), keys=["q0", "q1"])
    return {}


def _setup_with_ck(base: Path) -> dict:
    """A checkpoint ``ck`` of state A, then the live store moved on to state B."""
    with open_store(base, DUR) as s:
        _fill(s, "a", 4, 1)
        s.save_checkpoint(base / "ck")
        a = store_state(s)
        _fill(s, "b", 3, 2)
        s.delete_rows("p", [s.controller.parts["p"].keys["a0"]])
    return {"A": a}


def _setup_generations(base: Path, n: int = 2, keep_last: Optional[int] = 2) -> dict:
    states = {}
    with open_store(base, DUR) as s:
        mgr = CheckpointManager(base / "gens", keep_last=keep_last, store=s)
        for step in range(1, n + 1):
            _fill(s, f"g{step}_", 3, 10 + step, big=step % 2 == 1)
            mgr.save(step)
            states[step] = store_state(s)
        _fill(s, "live", 2, 30)
        states["live"] = store_state(s)
    return {"states": {str(k): v for k, v in states.items()}}


def _states(ctx: dict) -> Dict[int, dict]:
    return {int(k): v for k, v in ctx["states"].items() if k.isdigit()}


# ---------------------------------------------------------------------------- save
def _save(blocking: bool, copy_segments: bool = False):
    def op(base: Path, ctx: dict) -> None:
        with open_store(base, DUR, None) as s:
            h = s.save_checkpoint(base / "ck", blocking=blocking, copy_segments=copy_segments)
            if not blocking:
                _fill(s, "during", 2, 40, big=False)  # after the cut: must not reach the checkpoint
                h.result()
    return op


def _check_save(base: Path, ctx: dict, out: Outcome) -> List[str]:
    cut = ctx["before"]
    v = check_checkpoint(base, base / "ck", must_exist=out.acked, allowed=[cut], label="save")
    return v + check_live(base, out, before=cut, after=out.after, durability=DUR)


def _save_replace(base: Path, ctx: dict) -> None:
    with open_store(base, DUR) as s:
        s.save_checkpoint(base / "ck")


def _check_save_replace(base: Path, ctx: dict, out: Outcome) -> List[str]:
    allowed = [ctx["before"]] if out.acked else [ctx["A"], ctx["before"]]
    v = check_checkpoint(base, base / "ck", must_exist=True, allowed=allowed, label="replacing save")
    return v + check_live(base, out, before=ctx["before"], after=out.after, durability=DUR)


# ---------------------------------------------------------------------------- generations
def _gen_save(base: Path, ctx: dict) -> None:
    with open_store(base, DUR) as s:
        CheckpointManager(base / "gens", keep_last=2, store=s).save(3)


def _check_gen_save(base: Path, ctx: dict, out: Outcome) -> List[str]:
    st = _states(ctx)
    st[3] = ctx["states"]["live"]
    v = generations_check(base, base / "gens", newest_at_least=3 if out.acked else 2, allowed=st)
    return v + check_live(base, out, before=ctx["before"], after=out.after, durability=DUR)


def _gen_async_save(base: Path, ctx: dict) -> None:
    with open_store(base, DUR) as s:
        mgr = CheckpointManager(base / "gens", keep_last=2, store=s)
        h = mgr.save(3, blocking=False)
        _fill(s, "during", 2, 41, big=False)
        h.result()


def _prune(base: Path, ctx: dict) -> None:
    CheckpointManager(base / "gens", keep_last=1).prune()


def _check_prune(base: Path, ctx: dict, out: Outcome) -> List[str]:
    return generations_check(base, base / "gens", newest_at_least=3, allowed=_states(ctx))


def _restore(base: Path, ctx: dict) -> None:
    with open_store(base, DUR) as s:
        CheckpointManager(base / "gens", keep_last=2, store=s).restore()


def _check_restore(base: Path, ctx: dict, out: Outcome) -> List[str]:
    st = _states(ctx)
    v = check_live(base, out, before=ctx["before"], after=st[2], durability=DUR, strict=True)
    return v + generations_check(base, base / "gens", newest_at_least=2, allowed=st)


# ---------------------------------------------------------------------------- load
def _load(base: Path, ctx: dict) -> None:
    with open_store(base, DUR, None) as s:
        s.load_checkpoint(base / "ck")


def _check_load(base: Path, ctx: dict, out: Outcome) -> List[str]:
    # a load is installed with every file fsynced: strict even without per-commit durability
    v = check_live(base, out, before=ctx["before"], after=ctx["A"], durability=DUR, strict=True)
    return v + check_checkpoint(base, base / "ck", must_exist=True, allowed=[ctx["A"]], label="loaded checkpoint")


def _setup_reshard(base: Path) -> dict:
    """Checkpoint ``ck`` of a 2-unit store (state A); the live store has 3 units and other rows."""
    with Store(base / "src", num_units=2, durability=DUR, segment_bytes=SEG, max_workers=1) as src:
        _fill(src, "a", 5, 1)
        src.write("q", batch(["q0"], salt=2), keys=["q0"])
        src.save_checkpoint(base / "ck")
        a = store_state(src)
    shutil.rmtree(base / "src")
    with open_store(base, DUR, 3) as s:
        _fill(s, "c", 2, 3, big=False)
    return {"A": a}


def checkpoint_scenarios() -> List[Scenario]:
    return [
        ckpt_scenario("ckpt_save", lambda b: _setup_live(b), _save(True), _check_save, ops="save"),
        ckpt_scenario("ckpt_save_1unit", lambda b: _setup_live(b, num_units=1), _save(True), _check_save,
                      ops="save"),
        ckpt_scenario("ckpt_save_copy", lambda b: _setup_live(b), _save(True, copy_segments=True), _check_save,
                      ops="save"),
        ckpt_scenario("ckpt_async_save", lambda b: _setup_live(b), _save(False), _check_save, ops="async save"),
        ckpt_scenario("ckpt_save_replace", _setup_with_ck, _save_replace, _check_save_replace, ops="publish"),
        ckpt_scenario("ckpt_generation_save", _setup_generations, _gen_save, _check_gen_save, ops="save + prune"),
        ckpt_scenario("ckpt_generation_async", _setup_generations, _gen_async_save, _check_gen_save,
                      ops="async save"),
        ckpt_scenario("ckpt_prune", lambda b: _setup_generations(b, 3, None), _prune, _check_prune, ops="prune"),
        ckpt_scenario("ckpt_restore", _setup_generations, _restore, _check_restore, ops="load"),
        ckpt_scenario("ckpt_load", _setup_with_ck, _load, _check_load, ops="load"),
        ckpt_scenario("ckpt_reshard_load", _setup_reshard, _load, _check_load, ops="reshard load"),
    ]


# ---------------------------------------------------------------------------- planted bugs
def _skip(fn_name: str, match):
    """Patch ``files.<fn_name>`` into a no-op for paths ``match`` accepts (the test's planted bug)."""
    from unittest import mock

    from tqstore._io import files

    real = getattr(files, fn_name)

    def patched(path, *a, **kw):
        if match(Path(path)):
            return None
        return real(path, *a, **kw)

    return mock.patch.object(files, fn_name, patched)


def planted_checkpoint_bugs() -> Dict[str, tuple]:
    by_name = {sc.name: sc for sc in checkpoint_scenarios()}
    return {
        # the temporary directory's entries are not made durable before it is renamed into place
        "checkpoint_dir_fsync_removed": (by_name["ckpt_save"],
                                         lambda: _skip("fsync_dir", lambda p: ".tmp-" in p.name)),
        # the data files are never fsynced: MANIFEST.json is durable (and published) before the data
        "manifest_durable_before_data": (by_name["ckpt_save"], lambda: _skip("fsync_file", lambda p: True)),
        # the rename that publishes a generation is not made durable
        "publish_parent_fsync_removed": (by_name["ckpt_generation_save"],
                                         lambda: _skip("fsync_dir", lambda p: p.name == "gens")),
    }
