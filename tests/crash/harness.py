"""The crash matrix: run an operation, crash it at every I/O step, check the invariants.

A :class:`Scenario` builds a starting state (``setup``), performs one operation (``op``)
and checks what a restarted process finds (``check``).  :class:`Matrix` runs it:

1. ``setup`` runs once in ``<work>/run``; the tree is kept as a template;
2. a *recording run* (forked child) performs ``op`` with every I/O event recorded; it
   gives the crash points — each event ``k`` is the ``n``-th occurrence of failpoint
   ``name`` — and the picture of the completed operation (``after``);
3. for every point, from a fresh copy of the template:
   * **kill**: a child runs ``op`` with ``name=kill@n`` armed and dies there (the page
     cache survives, as after ``kill -9``);
   * **power**, for each seed: a child runs ``op`` under :class:`~tqstore.testing.PowerLoss`
     crashing before event ``k``; the simulated disk replaces the tree;
   plus the **end** point: power lost right after ``op`` returned (it was acknowledged);
4. ``check(base, ctx, outcome)`` returns violations (strings); any is a failure.

Stores are opened with ``max_workers=1`` so the event sequence is deterministic.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import torch

from tqstore.testing import PowerLoss, SimulatedCrash, default_policy, run_forked

torch.set_num_threads(1)  # forked children must not inherit a busy OpenMP pool

DEFAULT_SEEDS = (0, 1, 2, 3)


@dataclass
class Outcome:
    """What happened at one crash point, handed to ``Scenario.check``."""

    mode: str  # "kill" | "power"
    point: Tuple[str, int]  # (failpoint name, occurrence); ("end", 0) after the operation returned
    seed: Optional[int]
    acked: bool  # the operation returned before the crash
    after: Any  # the recording run's picture of the completed operation
    op_error: Optional[str] = None  # the operation raised (not a crash) before the crash point

    def label(self) -> str:
        s = f"{self.mode} {self.point[0]}#{self.point[1]}"
        return s + (f" seed={self.seed}" if self.seed is not None else "")


@dataclass
class Scenario:
    """One operation of the matrix. ``setup``/``op`` get the base directory; ``check`` runs
    in the parent on the tree a restarted process would find."""

    name: str
    setup: Callable[[Path], dict]
    op: Callable[[Path, dict], Any]
    observe: Callable[[Path, dict], Any]
    check: Callable[[Path, dict, Outcome], List[str]]
    policy: Callable[[str], str] = default_policy
    kill_names: Optional[Sequence[str]] = None  # restrict kill points to these failpoints
    power: bool = True
    ops: str = ""  # the operation family, for the report ("put batch", "save", ...)


@dataclass
class PointResult:
    scenario: str
    label: str
    violations: List[str]
    seconds: float


@dataclass
class Prepared:
    scenario: Scenario
    ctx: dict
    events: List[Tuple[str, int]]  # per event index-1: (name, occurrence)
    counts: Dict[str, int]
    after: Any


class MatrixError(RuntimeError):
    """The harness itself could not run a scenario (not an engine violation)."""


def copy_tree(src: Path, dst: Path) -> None:
    """Copy a tree preserving hard links (checkpoint generations share segment files)."""
    seen: Dict[Tuple[int, int], str] = {}
    for dirpath, dirnames, filenames in os.walk(src):
        rel = os.path.relpath(dirpath, src)
        out = os.path.normpath(os.path.join(dst, rel))
        os.makedirs(out, exist_ok=True)
        for name in filenames:
            s = os.path.join(dirpath, name)
            d = os.path.join(out, name)
            st = os.lstat(s)
            key = (st.st_dev, st.st_ino)
            if st.st_nlink > 1 and key in seen:
                os.link(seen[key], d)
                continue
            shutil.copyfile(s, d)
            seen[key] = d


def work_root() -> Path:
    parent = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix="tq-crash-", dir=parent))


class Matrix:
    """Runs scenarios at their crash points. ``work``: a scratch directory (tmpfs preferred)."""

    def __init__(self, work: Optional[Path] = None, *, seeds: Sequence[int] = DEFAULT_SEEDS,
                 timeout_s: float = 120.0) -> None:
        self.work = Path(work) if work is not None else work_root()
        self._own_work = work is None
        self.seeds = tuple(seeds)
        self.timeout_s = timeout_s
        self.results: List[PointResult] = []
        self.points: set = set()  # distinct (scenario, name, occurrence)

    def close(self) -> None:
        if self._own_work:
            shutil.rmtree(self.work, ignore_errors=True)

    def __enter__(self) -> "Matrix":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ preparation
    def _dirs(self, sc: Scenario) -> Tuple[Path, Path, Path]:
        d = self.work / sc.name
        return d / "run", d / "tmpl", d / "img"

    def _reset(self, sc: Scenario) -> Path:
        run, tmpl, _ = self._dirs(sc)
        if run.exists():
            shutil.rmtree(run)
        copy_tree(tmpl, run)
        return run

    def prepare(self, sc: Scenario) -> Prepared:
        run, tmpl, img = self._dirs(sc)
        for p in (run, tmpl, img):
            if p.exists():
                shutil.rmtree(p)
        run.mkdir(parents=True)
        res = run_forked(lambda: sc.setup(run), timeout_s=self.timeout_s)
        if not res.ok:
            raise MatrixError(f"{sc.name}: setup failed (exit {res.exitcode}):\n{res.error}")
        ctx = res.value or {}
        copy_tree(run, tmpl)

        def record():
            sim = PowerLoss(run, img, seed=0, policy=sc.policy)
            with sim:
                sc.op(run, ctx)
            if sim.errors:
                raise MatrixError(f"power-loss simulator errors: {sim.errors}")
            return {"events": [e.name for e in sim.events], "after": sc.observe(run, ctx)}

        self._reset(sc)
        rec = run_forked(record, timeout_s=self.timeout_s)
        if not rec.ok:
            raise MatrixError(f"{sc.name}: recording run failed (exit {rec.exitcode}):\n{rec.error}")
        seen: Counter = Counter()
        events = []
        for name in rec.value["events"]:
            seen[name] += 1
            events.append((name, seen[name]))
        return Prepared(sc, ctx, events, dict(seen), rec.value["after"])

    # ------------------------------------------------------------------ single points
    def _check(self, sc: Scenario, base: Path, ctx: dict, out: Outcome) -> List[str]:
        try:
            return list(sc.check(base, ctx, out))
        except Exception:  # noqa: BLE001 - an exception in a check is a violation, reported with context
            return [f"check raised: {traceback.format_exc(limit=6)}"]

    def run_kill(self, prep: Prepared, name: str, n: int) -> PointResult:
        sc, t0 = prep.scenario, time.monotonic()
        run = self._reset(sc)
        res = run_forked(lambda: sc.op(run, prep.ctx), failpoints=[(name, "kill", n)], count=True,
                         timeout_s=self.timeout_s)
        out = Outcome("kill", (name, n), None, acked=res.ok, after=prep.after)
        v: List[str] = []
        if res.timed_out:
            v.append("operation hung")
        elif res.ok:
            had = ((res.value or {}).get("counts") or {}).get(name, 0)
            v.append(f"kill point not reached: this run had {had} {name} event(s), the recording "
                     f"{prep.counts.get(name, 0)} (the operation's I/O is not deterministic)")
        elif not res.killed:
            v.append(f"operation failed instead of being killed: {res.error}")
        v += self._check(sc, run, prep.ctx, out)
        self.points.add((sc.name, name, n))
        r = PointResult(sc.name, out.label(), v, time.monotonic() - t0)
        self.results.append(r)
        return r

    def run_power(self, prep: Prepared, k: Optional[int], seed: int) -> PointResult:
        """Power loss before event ``k`` (1-based), or after the operation when ``k`` is None."""
        sc, t0 = prep.scenario, time.monotonic()
        run, _, img = self._dirs(sc)
        self._reset(sc)
        if img.exists():
            shutil.rmtree(img)

        def child():
            sim = PowerLoss(run, img, seed=seed, crash_at=k, policy=sc.policy)
            op_error = None
            sim.start()
            try:
                sc.op(run, prep.ctx)
            except SimulatedCrash:
                pass
            except BaseException:  # noqa: BLE001 - reported below unless it is the crash unwinding
                if not sim.crashed:
                    op_error = traceback.format_exc(limit=8)
            acked = not sim.crashed
            if not sim.crashed:
                sim.crash_now()
            sim.stop()
            ev = sim.crash_event
            occurrence = 1 + sum(1 for e in sim.events if ev is not None and e.name == ev.name)
            return {"acked": acked and op_error is None, "op_error": op_error, "errors": sim.errors,
                    "crash_event": [ev.name, occurrence] if ev is not None else None}

        res = run_forked(child, timeout_s=self.timeout_s)
        point = prep.events[k - 1] if k is not None else ("end", 0)
        if res.ok and res.value.get("crash_event"):
            # with parallel writers (one thread per unit) the k-th event may be another step
            # than in the recording run: the crash is as valid, and named after what it hit
            point = tuple(res.value["crash_event"])
        v: List[str] = []
        if not res.ok:
            v.append(f"power-loss child failed (exit {res.exitcode}, timed out {res.timed_out}): {res.error}")
            r = PointResult(sc.name, f"power {point[0]}#{point[1]} seed={seed}", v, time.monotonic() - t0)
            self.results.append(r)
            return r
        info = res.value
        if info["errors"]:
            v.append(f"simulator errors: {info['errors']}")
        out = Outcome("power", point, seed, acked=info["acked"], after=prep.after, op_error=info["op_error"])
        if info["op_error"]:
            v.append(f"operation failed before the crash point: {info['op_error']}")
        shutil.rmtree(run)
        os.rename(img, run)
        v += self._check(sc, run, prep.ctx, out)
        if k is not None:
            self.points.add((sc.name, point[0], point[1]))
        r = PointResult(sc.name, out.label(), v, time.monotonic() - t0)
        self.results.append(r)
        return r

    # ------------------------------------------------------------------ whole scenarios
    def plan(self, prep: Prepared, *, max_points: Optional[int] = None) -> List[int]:
        """Event indexes to crash at: every one, or an evenly spread ``max_points`` of them."""
        idx = list(range(1, len(prep.events) + 1))
        if prep.scenario.kill_names is not None:
            idx = [i for i in idx if prep.events[i - 1][0] in prep.scenario.kill_names]
        if max_points == 0:
            return []  # only the end point (power lost after the operation returned)
        if max_points is not None and len(idx) > max_points:
            step = len(idx) / max_points
            idx = sorted({idx[int(i * step)] for i in range(max_points)} | {idx[-1]})
        return idx

    def run_scenario(self, sc: Scenario, *, max_points: Optional[int] = None, seeds: Optional[Sequence[int]] = None,
                     kill: bool = True, power: Optional[bool] = None) -> List[PointResult]:
        seeds = self.seeds if seeds is None else tuple(seeds)
        power = sc.power if power is None else power
        prep = self.prepare(sc)
        out: List[PointResult] = []
        for k in self.plan(prep, max_points=max_points):
            name, n = prep.events[k - 1]
            if kill:
                out.append(self.run_kill(prep, name, n))
            if power:
                for s in seeds:
                    out.append(self.run_power(prep, k, s))
        if power:
            for s in seeds:
                out.append(self.run_power(prep, None, s))
        return out

    def violations(self) -> List[str]:
        return [f"{r.scenario} [{r.label}]: {v}" for r in self.results for v in r.violations]

    def summary_line(self) -> str:
        return (f"crash-matrix: {len(self.points)} points x {len(self.seeds)} seeds, "
                f"{sum(len(r.violations) for r in self.results)} violations")
