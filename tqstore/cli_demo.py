"""``python -m tqstore demo``: a training loop killed with SIGKILL and resumed, checked.

The loop (:mod:`tqstore.cli_demo_loop`) runs in a child process; the demo kills it at a
random step after its first generation save, starts it again with ``resume``, lets it
finish, and then checks, from the loop's event log and the generation it restored, that

* every sample acknowledged before the restored generation's cut came back: consumed
  before the cut, or pending in the restored store in its last acknowledged version
  (partial rollouts as partial), and
* over the effective history (the first run up to the restored step, then the second run)
  every prompt's group was consumed exactly once (the trainer checked each consumed
  sample bit for bit against what was put), and nothing is left over.

It prints the loop's per-step lines, then a summary (steps, samples resumed, stall per
save, save and restore GiB/s, the check) and exits 0 when the check passes, 1 when not.
"""
from __future__ import annotations

import json
import contextlib
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, Dict, List, Optional, TextIO

from .cli_util import EXIT_DAMAGED, EXIT_OK, EXIT_USAGE


#: how long the demo waits for the loop's first generation before the step it kills in
PUBLISH_WAIT_S = 300.0


def _child(cfg: Dict[str, Any], out: TextIO, events: List[str], kill_after: Optional[int], delay_s: float):
    """Run one loop process, forwarding its lines to ``out`` and collecting its event lines in
    ``events``.  With ``kill_after``, the loop waits for a go on its stdin after each step
    (``cfg["lockstep"]``): after the line of step ``kill_after``, the go comes once a
    generation is published (a background save may still be writing it: the loop could
    otherwise finish before it is, and never be killed), and the loop is SIGKILLed ``delay_s``
    later, during step ``kill_after + 1``.  Returns (returncode, the step during which it was
    killed or 0, stderr text)."""
    import threading

    from .cli_demo_loop import EVENT

    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    cfg = dict(cfg, lockstep=kill_after is not None)
    proc = subprocess.Popen([sys.executable, "-m", "tqstore", "_demo-loop", json.dumps(cfg)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.PIPE if cfg["lockstep"] else None, text=True,
                            env=env, bufsize=1)
    errs: List[str] = []
    drain = threading.Thread(target=lambda: errs.append(proc.stderr.read()), daemon=True)  # type: ignore[union-attr]
    drain.start()
    killed = 0  # the step during which the loop was killed
    base = Path(cfg["dir"])
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith(EVENT):
            events.append(line)
            continue
        out.write(line)
        out.flush()
        if kill_after is None or not line.startswith("step "):
            continue
        kill = int(line[5:].split(":")[0]) == kill_after and _wait_published(base, cfg["mode"])
        try:
            proc.stdin.write("go\n")  # type: ignore[union-attr]
            proc.stdin.flush()  # type: ignore[union-attr]
        except BrokenPipeError:  # (the loop ended)
            pass
        if kill:
            time.sleep(delay_s)
            os.kill(proc.pid, signal.SIGKILL)
            out.write(f"*** SIGKILL to the training loop (pid {proc.pid}) during step {kill_after + 1}\n")
            out.flush()
            killed = kill_after + 1
            break
    if killed:  # what the loop wrote before it died is still in the pipe
        events.extend(ln for ln in proc.stdout if ln.startswith(EVENT))
    proc.stdout.close()
    if proc.stdin is not None:
        with contextlib.suppress(BrokenPipeError):
            proc.stdin.close()
    rc = proc.wait()
    drain.join()
    return rc, killed, "".join(errs)


def _wait_published(base: Path, mode: str) -> bool:
    """Wait (at most :data:`PUBLISH_WAIT_S`) until :func:`_published`; whether it is."""
    end = time.monotonic() + PUBLISH_WAIT_S
    while not _published(base, mode):
        if time.monotonic() > end:
            return False
        time.sleep(0.01)
    return True


_GENERATION = re.compile(r"step-\d+")  # (not a save's temporary step-N.tmp-XXXXXXXX)


def _published(base: Path, mode: str) -> bool:
    """Whether the loop in ``base`` published a generation it can resume from: a generation
    directory ``generations/step-N`` holding its MANIFEST.json (renamed in whole: not a
    save's temporary directory) and, in pending mode, the dump of that step's pending
    samples, ``pending/step-N``, holding its own (the loop resumes only from both)."""
    root = base / "generations"
    if not root.is_dir():
        return False
    for d in root.iterdir():
        if _GENERATION.fullmatch(d.name) and (d / "MANIFEST.json").is_file() and \
                (mode == "full" or (base / "pending" / d.name / "MANIFEST.json").is_file()):
            return True
    return False


def check(events: List[Dict[str, Any]], total_prompts: int, group: int) -> Dict[str, Any]:
    """The demo's check over the loop's events (see the module docstring): a report with
    ``ok`` and the numbers and problems behind it."""
    problems: List[str] = []
    runs = sorted({e["run"] for e in events})
    effective: List[Dict[str, Any]] = []
    resumed = 0
    restored_doc = None
    for r in runs:
        evs = [e for e in events if e["run"] == r]
        first = next((e for e in evs if e["ev"] == "restored"), None)
        if first is not None and not first.get("fresh"):
            restored_doc = first
            cut_acked, cut_step, src = first["acked"], first["step"], first["from_run"]
            before = [e for e in effective if e["run"] == src and not (
                (e["ev"] == "ack" and e["seq"] >= cut_acked) or (e["ev"] == "consumed" and e["step"] > cut_step))]
            last: Dict[int, str] = {}
            consumed = set()
            for e in before:
                if e["ev"] == "ack":
                    last[e["prompt"]] = e["version"]
                elif e["ev"] == "consumed":
                    consumed.update(e["keys"])
            pending = set(first["pending"])
            partial = set(first["partial"])
            for p, version in last.items():
                keys = {f"p{p:06d}-s{j}" for j in range(group)}
                if keys <= consumed:
                    continue
                if not keys <= pending:
                    problems.append(f"prompt {p}: acknowledged ({version}) before the cut, not back after restore")
                elif (version == "partial") != (p in partial):
                    problems.append(f"prompt {p}: acknowledged {version} before the cut, restored otherwise")
            resumed = len(pending)
            effective = before
        elif first is not None:
            effective = []
        effective.extend(evs)
    counts = Counter(k for e in effective if e["ev"] == "consumed" for k in e["keys"])
    twice = sorted(k for k, n in counts.items() if n > 1)
    want = {f"p{p:06d}-s{j}" for p in range(total_prompts) for j in range(group)}
    missing = sorted(want - set(counts))
    done = [e for e in events if e["ev"] == "done"]
    if twice:
        problems.append(f"{len(twice)} samples consumed twice, e.g. {twice[:3]}")
    if missing:
        problems.append(f"{len(missing)} samples never consumed, e.g. {missing[:3]}")
    if not done:
        problems.append("the loop did not finish")
    elif done[-1]["left"]:
        problems.append(f"{len(done[-1]['left'])} samples left in the buffer")
    return {"ok": not problems, "problems": problems, "consumed": sum(counts.values()), "expected": len(want),
            "twice": len(twice), "missing": len(missing), "resumed": resumed, "restored": restored_doc}


def _gib_s(nbytes: float, secs: float) -> Optional[float]:
    return nbytes / secs / 2**30 if secs > 0 else None


def summarize(events: List[Dict[str, Any]], cfg: Dict[str, Any], kill_step: Optional[int]) -> Dict[str, Any]:
    """The summary figures of a finished demo (check included)."""
    total_prompts = cfg["steps"] * (cfg["rows"] // cfg["group"])
    rep = check(events, total_prompts, cfg["group"])
    cuts = [e["stall_s"] for e in events if e["ev"] == "cut"]
    saved = [e for e in events if e["ev"] == "saved"]
    rest = rep["restored"]
    restore_stats = next((e for e in events if e["ev"] == "restore_stats"), None)
    doc = {
        "steps": cfg["steps"], "samples_per_step": cfg["rows"], "group": cfg["group"], "seed": cfg["seed"],
        "killed_during_step": kill_step, "restored_step": rest["step"] if rest else None,
        "samples_resumed": rep["resumed"], "partial_groups_resumed": len(rest["partial"]) if rest else 0,
        "saves": len(cuts), "stall_ms_median": statistics.median(cuts) * 1e3 if cuts else None,
        "stall_ms_max": max(cuts) * 1e3 if cuts else None,
        "save_gib_s": _gib_s(sum(e["bytes"] for e in saved), sum(e["write_s"] for e in saved)) if saved else None,
        "save_bytes": sum(e["bytes"] for e in saved),
        "restore_gib_s": _gib_s(restore_stats["bytes"], restore_stats["restore_s"]) if restore_stats else None,
        "restore_bytes": restore_stats["bytes"] if restore_stats else None,
        "mode": next((e["mode"] for e in events if e["ev"] == "start"), "full"),
        "cut_ms_median": statistics.median(e["cut_s"] for e in events if e["ev"] == "cut") * 1e3 if cuts else None,
        "check": rep,
    }
    return doc


def _print_summary(doc: Dict[str, Any], w) -> None:
    rep = doc["check"]
    fmt = (lambda v, spec: "n/a" if v is None else format(v, spec))
    w("\nsummary\n")
    w(f"  steps:            {doc['steps']} x {doc['samples_per_step']} samples (groups of {doc['group']}), "
      f"seed {doc['seed']}\n")
    if doc["killed_during_step"] is not None:
        restored = doc["restored_step"]
        w(f"  killed:           SIGKILL during step {doc['killed_during_step']}; "
          + (f"restored generation {restored}\n" if restored else "no generation restored (started over)\n"))
        w(f"  samples resumed:  {doc['samples_resumed']} pending samples came back "
          f"({doc['partial_groups_resumed']} partial groups finished after the restart),"
          + (" from the dump of pending samples beside the generation\n" if doc["mode"] == "pending" else
             " from the generation (full mode: it holds the whole buffer)\n"))
    else:
        w("  killed:           no (--no-kill): one run, nothing restored\n")
    what = ("the cut of a blocking=False save" if doc["mode"] == "full" else
            "a metadata-only generation, then the cut of a blocking=False dump")
    w(f"  stall per save:   median {fmt(doc['stall_ms_median'], '.2f')} ms, max {fmt(doc['stall_ms_max'], '.2f')} ms "
      f"over {doc['saves']} saves (the trainer waits for {what}; the cut alone {fmt(doc['cut_ms_median'], '.2f')} "
      f"ms)\n")
    w(f"  save:             {fmt(doc['save_gib_s'], '.3f')} GiB/s ({doc['save_bytes'] / 2**20:.1f} MiB written, "
      f"fsync included)\n")
    if doc["restore_bytes"] is not None:
        w(f"  restore:          {fmt(doc['restore_gib_s'], '.3f')} GiB/s ({doc['restore_bytes'] / 2**20:.1f} MiB, "
          f"every frame verified)\n")
    verdict = "PASS" if rep["ok"] else "FAIL"
    w(f"  check:            {verdict}: {rep['consumed']} of {rep['expected']} samples consumed, {rep['missing']} "
      f"missing, {rep['twice']} twice"
      + ("; every sample acknowledged before the cut came back\n" if doc["killed_during_step"] is not None else "\n")
      if rep["ok"] else f"  check:            {verdict}\n")
    for p in rep["problems"]:
        w(f"    {p}\n")


def cmd_demo(args, out: TextIO, err: TextIO) -> int:
    """Run the demo (see the module docstring); 0 when its check passes."""
    import random

    from . import layout_dirs as L

    if args.steps < 2 or args.group < 1 or args.rows < args.group or args.rows % args.group or args.save_every < 1 \
            or args.tokens < 4 or args.save_every >= args.steps:
        err.write("error: need --steps >= 2, --save-every in [1, steps), --group >= 1, --rows a positive multiple "
                  "of --group, --tokens >= 4\n")
        return EXIT_USAGE
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
    rng = random.Random(seed)
    base = Path(args.dir).absolute() if args.dir else L.scratch_dir("tqstore-demo-")
    keep = bool(args.dir)
    step_out = err if args.json else out
    try:
        if base.exists() and (not base.is_dir() or any(base.iterdir())):
            why = "not empty" if base.is_dir() else "not a directory"
            err.write(f"error: {base} is {why} (the demo needs a new or empty directory)\n")
            return EXIT_USAGE
        from .cli_demo_loop import dump_api

        import tqstore

        have_dump = len(dump_api(tqstore)) == 2
        if args.mode == "pending" and not have_dump:
            err.write("error: --mode pending needs dump_data_by_key and load_data_by_key, which this build lacks\n")
            return EXIT_USAGE
        cfg = {"mode": args.mode or ("pending" if have_dump else "full"), "dir": str(base), "steps": args.steps, "rows": args.rows, "group": args.group, "tokens": args.tokens,
               "save_every": args.save_every, "seed": seed, "run": 1, "resume": False}
        # after the first generation's save, before the last step (later if none is published by then)
        kill_step = None if args.no_kill else rng.randint(args.save_every + 1, args.steps)
        step_out.write(f"tqstore demo in {base}: {args.steps} steps of {args.rows} samples, a generation every "
                       f"{args.save_every} steps ({cfg['mode']} mode), seed {seed}"
                       + ("" if kill_step is None else f"; the loop will be killed during step {kill_step}") + "\n")
        events: List[str] = []
        rc, killed, stderr = _child(cfg, step_out, events, None if kill_step is None else kill_step - 1,
                                    rng.uniform(0.0, 0.05))
        if not killed and rc != 0:
            err.write(f"error: the training loop failed (exit {rc}):\n{stderr[-2000:]}")
            return EXIT_DAMAGED
        if kill_step is not None and not killed:  # (not a PASS of a demo that never killed its loop)
            err.write(f"error: the training loop published no generation within {PUBLISH_WAIT_S:.0f} s of step "
                      f"{kill_step - 1}, so it was not killed\n")
            return EXIT_DAMAGED
        if killed:
            step_out.write("*** restarting the training loop: restore the newest valid generation and go on\n")
            rc, _, stderr = _child(dict(cfg, run=2, resume=True), step_out, events, None, 0.0)
            if rc != 0:
                err.write(f"error: the resumed training loop failed (exit {rc}):\n{stderr[-2000:]}")
                return EXIT_DAMAGED
        from .cli_demo_loop import read_events

        doc = summarize(read_events(events), cfg, kill_step if killed else None)
        if args.json:
            out.write(json.dumps(doc, indent=1, default=str) + "\n")
        else:
            _print_summary(doc, out.write)
            if keep:
                out.write(f"\ntry: python -m tqstore ls {shlex.quote(str(base / 'generations'))}\n"
                          f"     python -m tqstore inspect {shlex.quote(str(base / 'store'))}\n")
        return EXIT_OK if doc["check"]["ok"] else EXIT_DAMAGED
    finally:
        if not keep:
            L.remove_tree(base, ignore_errors=True)


def cmd_demo_loop(args, out: TextIO, err: TextIO) -> int:
    """The demo's child process: run the loop with the settings in ``args.config``."""
    from .cli_demo_loop import run_loop

    cfg = json.loads(args.config)
    try:
        run_loop(cfg, out)
    except AssertionError as e:
        err.write(f"error: {e}\n")
        return EXIT_DAMAGED
    return EXIT_OK
