"""The operations of the crash matrix and the invariants checked after each crash.

Layout under a scenario's base directory: ``store/`` (the live store) and, for
checkpoint operations, ``ckpt/`` (a checkpoint root).  Every function here runs either
in a forked child (``setup``, ``op``, ``observe``) or in the parent (``check``).
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from unittest import mock
from typing import Any, Dict, List, Optional

import numpy as np
import torch

from tqstore import layout_dirs as L
from tqstore._io import files
from tqstore._io.segfile import SegmentWriter
from tqstore.store import Store
from tqstore.testing import lmdb_policy, run_forked

from .harness import Outcome, Scenario, copy_tree
from .model import diff_states, row_values_allowed, store_state

SEG = 1 << 16  # the smallest segment size: puts of a few rows roll segments over


# ---------------------------------------------------------------------------- data
def batch(keys: List[str], *, salt: int = 0, big: bool = False) -> Dict[str, Any]:
    """Deterministic fields for ``keys``: a float tensor, non-tensor values, a numpy array,
    and with ``big`` a 70 KB tensor per row (the large-frame path, rolls segments over)."""
    n = len(keys)
    g = torch.Generator().manual_seed(1000 + salt + n)
    out: Dict[str, Any] = {
        "t": torch.randn(n, 8, generator=g),
        "v": [{"k": k, "salt": salt, "i": i} for i, k in enumerate(keys)],
        "a": np.arange(n * 3, dtype=np.int16).reshape(n, 3) + salt,
    }
    if big:
        out["big"] = torch.randint(0, 255, (n, 70_000), dtype=torch.uint8, generator=g)
    return out


def open_store(base: Path, durability: str = "commit", num_units: Optional[int] = 2) -> Store:
    return Store(base / "store", num_units=num_units, durability=durability, segment_bytes=SEG, max_workers=1)


def picture(base: Path, durability: str = "commit") -> dict:
    with open_store(base, durability, None) as s:
        return store_state(s)


# ---------------------------------------------------------------------------- checks
def check_store(base: Path, ctx: dict, out: Outcome, *, durability: str) -> List[str]:
    """After a crash: the store reopens; a kill (or a power loss with per-commit durability)
    leaves exactly the state before or after the operation (after it, when acknowledged),
    and every frame verifies; a power loss without it returns only values that were written.
    A second reopen sees the same as the first (recovery is idempotent)."""
    before, after = ctx["before"], out.after
    try:
        with open_store(base, durability, None) as s:
            got = store_state(s)
            problems = s.verify()
    except Exception as e:  # noqa: BLE001 - any failure to reopen is the violation
        return [f"store does not reopen: {type(e).__name__}: {e}"]
    v: List[str] = []
    strict = out.mode == "kill" or durability == "commit"
    if strict:
        if problems:
            v.append(f"verify finds {len(problems)} problems: {problems[:2]}")
        if out.acked and got != after:
            v.append(f"acknowledged operation lost: {diff_states(got, after)}")
        elif got != before and got != after:
            v.append(f"torn state: neither before ({diff_states(got, before)}) nor after "
                     f"({diff_states(got, after)})")
    else:
        v += row_values_allowed(got, [before, after], allow_errors=True)
    try:
        with open_store(base, durability, None) as s:
            again = store_state(s)
        if again != got:
            v.append(f"second reopen differs from the first: {diff_states(again, got)}")
    except Exception as e:  # noqa: BLE001
        v.append(f"store does not reopen a second time: {type(e).__name__}: {e}")
    return v


def store_scenario(name: str, setup, op, *, durability: str = "commit", ops: str, **kw) -> Scenario:
    def observe(base: Path, ctx: dict) -> dict:
        return picture(base, durability)

    def check(base: Path, ctx: dict, out: Outcome) -> List[str]:
        return check_store(base, ctx, out, durability=durability)

    def setup_and_picture(base: Path) -> dict:
        ctx = setup(base) or {}
        if not (base / "store").exists():
            ctx["before"] = {}
            return ctx
        # the picture is taken on a copy: opening may recover, and the template must keep its debris
        copy_tree(base / "store", base / "_pic" / "store")
        ctx["before"] = picture(base / "_pic", durability)
        shutil.rmtree(base / "_pic")
        return ctx

    return Scenario(name, setup_and_picture, op, observe, check,
                    policy=lmdb_policy("store", synced=durability == "commit"), ops=ops, **kw)


# ---------------------------------------------------------------------------- store operations
def _setup_rows(durability: str):
    def setup(base: Path) -> dict:
        with open_store(base, durability) as s:
            s.write("q", batch(["q0", "q1"], salt=5), keys=["q0", "q1"])
            # leaves the active segments past SEG: the next put seals them and starts new ones
            s.write("p", batch([f"k{i}" for i in range(4)], big=True), keys=[f"k{i}" for i in range(4)])
        return {}
    return setup


def _put_new(durability: str):
    def op(base: Path, ctx: dict) -> None:
        keys = [f"n{i}" for i in range(4)]
        with open_store(base, durability) as s:
            s.write("p", batch(keys, salt=1, big=True), keys=keys)
    return op


def _put_overwrite(base: Path, ctx: dict) -> None:
    keys = ["k0", "k1", "x0"]
    with open_store(base) as s:
        s.write("p", batch(keys, salt=2), keys=keys)


def _clear_rows(base: Path, ctx: dict) -> None:
    with open_store(base) as s:
        s.delete_rows("p", [0, 1, 2])  # k0..k2: empties whole sealed segments, which get unlinked


def _drop_partition(base: Path, ctx: dict) -> None:
    with open_store(base) as s:
        s.drop_partition("p")


def _setup_compact(base: Path) -> dict:
    with open_store(base) as s:
        keys = [f"c{i}" for i in range(6)]
        s.write("p", batch(keys, big=True), keys=keys)
        s.write("p", batch(["tail"], salt=3), keys=["tail"])  # seals the big segments
        s.delete_rows("p", [s.controller.parts["p"].keys[k] for k in keys[:4]])
    return {}


def _compact(base: Path, ctx: dict) -> None:
    with open_store(base) as s:
        s.compact(live_ratio=0.9)


def _setup_merge(base: Path) -> dict:
    """Each unit one small sealed segment short of the merge (tqstore.unit_compact.MERGE_AT)."""
    from tqstore.unit_compact import MERGE_AT

    with open_store(base) as s:
        for i in range(MERGE_AT):
            keys = [f"m{i}-{j}" for j in range(4)]
            s.write("p", batch(keys, salt=i), keys=keys)
            if i < MERGE_AT - 1:
                with s._write_lock:
                    cut = s.snapshot()
                cut.release()
    return {}


def _merge(base: Path, ctx: dict) -> None:
    """A cut and its release (as a save or a dump ends): the release merges the small segments."""
    with open_store(base) as s:
        with s._write_lock:
            cut = s.snapshot()
        cut.release()


def _setup_debris(base: Path) -> dict:
    """A store left by a process killed mid-put: unit entries and frames no controller row
    claims, a torn segment tail."""
    _setup_rows("commit")(base)

    def killed_put():
        with open_store(base) as s:
            s.write("p", batch(["d0", "d1", "d2"], salt=4, big=True), keys=["d0", "d1", "d2"])

    res = run_forked(killed_put, failpoints=[("controller_commit", "kill", 1)])
    assert res.killed, res

    def torn():
        with open_store(base) as s:
            s.write("p", batch(["d3", "d4"], salt=6), keys=["d3", "d4"])

    res = run_forked(torn, failpoints=[("unit_commit", "kill", 1)])  # frames written, index not
    assert res.killed, res
    return {}


def _reopen(base: Path, ctx: dict) -> None:
    with open_store(base, "commit", None) as s:
        s.write("p", batch(["r0"], salt=7), keys=["r0"])  # and the store is usable


def _setup_install(base: Path) -> dict:
    _setup_rows("commit")(base)
    donor = Store(base / "donor", num_units=2, durability="commit", segment_bytes=SEG, max_workers=1)
    with donor:
        keys = [f"dn{i}" for i in range(5)]
        donor.write("p", batch(keys, salt=9, big=True), keys=keys)
        donor.write("z", batch(["z0"], salt=10), keys=["z0"])
    return {}


def _install_state(base: Path, ctx: dict) -> None:
    donor = base / "donor" / L.read_current(base / "donor")

    def build(new_dir: Path) -> None:
        for dirpath, dirnames, filenames in os.walk(donor):
            rel = os.path.relpath(dirpath, donor)
            out = new_dir / rel if rel != "." else new_dir
            for d in sorted(dirnames):
                files.mkdir(out / d)
            for f in sorted(filenames):
                if f != "lock.mdb":
                    files.copy_file(Path(dirpath) / f, out / f, fsync=False)

    with open_store(base) as s:
        s.install_state(build)


def _create_and_put(base: Path, ctx: dict) -> None:
    with open_store(base) as s:
        s.write("p", batch(["c0", "c1", "c2"], big=True), keys=["c0", "c1", "c2"])


def store_scenarios() -> List[Scenario]:
    return [
        store_scenario("create_and_put", lambda base: {}, _create_and_put, ops="put batch"),
        store_scenario("put_new_commit", _setup_rows("commit"), _put_new("commit"), ops="put batch"),
        store_scenario("put_new_checkpoint", _setup_rows("checkpoint"), _put_new("checkpoint"),
                       durability="checkpoint", ops="put batch"),
        store_scenario("put_overwrite", _setup_rows("commit"), _put_overwrite, ops="put batch"),
        store_scenario("clear_rows", _setup_rows("commit"), _clear_rows, ops="clear"),
        store_scenario("drop_partition", _setup_rows("commit"), _drop_partition, ops="clear"),
        store_scenario("compact", _setup_compact, _compact, ops="compact"),
        store_scenario("merge_small_segments", _setup_merge, _merge, ops="compact"),
        store_scenario("reopen_after_kill", _setup_debris, _reopen, ops="reopen"),
        store_scenario("install_state", _setup_install, _install_state, ops="install state"),
    ]


# ---------------------------------------------------------------------------- planted bugs
def _skip_fsync_dir(match):
    """A patch that turns ``files.fsync_dir`` into a no-op for paths ``match`` accepts."""
    real = files.fsync_dir

    def fsync_dir(path):
        if match(Path(path)):
            return None
        return real(path)

    return mock.patch.object(files, "fsync_dir", fsync_dir)


def planted_bug_scenarios() -> Dict[str, tuple]:
    """``{bug: (scenario, patch)}``: an engine durability step removed by a context manager
    (applied in the test only; forked children inherit it)."""
    from .ckpt_scenarios import planted_checkpoint_bugs
    from .dump_scenarios import planted_dump_bugs

    by_name = {sc.name: sc for sc in store_scenarios()}
    return {
        **planted_checkpoint_bugs(),
        **planted_dump_bugs(),
        "unit_dir_fsync_removed": (by_name["put_new_commit"],
                                   lambda: _skip_fsync_dir(lambda p: p.name.startswith("unit-"))),
        "segment_fsync_removed": (by_name["put_new_commit"],
                                  lambda: mock.patch.object(SegmentWriter, "fsync", lambda self: None)),
        "pointer_dir_fsync_removed": (by_name["install_state"],
                                      lambda: _skip_fsync_dir(lambda p: p.name == "store")),
    }


def all_scenarios() -> List[Scenario]:
    from .ckpt_scenarios import checkpoint_scenarios
    from .dump_scenarios import dump_scenarios
    from .restore_scenarios import restore_scenarios

    return store_scenarios() + checkpoint_scenarios() + dump_scenarios() + restore_scenarios()
