"""``python -m tqstore demo``: the training loop is killed with SIGKILL, resumed from the
newest valid generation, and its check (every acknowledged sample back, none consumed
twice) passes; the summary carries the figures the README promises."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tqstore.checkpoint import CheckpointManager
from tqstore.cli_demo import _published, check

ROOT = Path(__file__).resolve().parents[1]


def _demo(forkrun, *args, cwd=ROOT):
    """``python -m tqstore demo ARGS`` (forked from tests/forkrun.py's server: no import time)."""
    return forkrun.run("module", "tqstore", ["demo", *map(str, args)], cwd=cwd, timeout=600)


def test_demo_is_killed_resumes_and_its_check_passes(forkrun, tmp_path):
    r = _demo(forkrun, "--steps", 6, "--rows", 16, "--group", 4, "--save-every", 2, "--tokens", 64, "--seed", 7,
              "--dir", tmp_path / "d", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["check"]["ok"], doc["check"]["problems"]
    assert doc["check"]["consumed"] == doc["check"]["expected"] == 6 * 16
    assert doc["check"]["missing"] == doc["check"]["twice"] == 0
    assert doc["mode"] == "pending"  # this build has the selective dump and load
    assert doc["killed_during_step"] is not None and doc["restored_step"] in (2, 4)
    assert doc["saves"] >= 2 and doc["stall_ms_median"] is not None and doc["restore_gib_s"] > 0
    lines = r.stderr.splitlines()  # with --json the step lines go to stderr
    assert any(ln.startswith("*** SIGKILL") for ln in lines) and any(ln.startswith("resume: restored") for ln in lines)
    assert sum(ln.startswith("step ") for ln in lines) >= 6
    assert CheckpointManager(tmp_path / "d" / "generations").steps()  # --dir keeps the files


def test_a_pruned_steps_pending_dump_goes_with_its_lock_file(forkrun, tmp_path):
    """One lock file per step stayed behind for good (pending/step-N.lock) after its dump went."""
    r = _demo(forkrun, "--steps", 9, "--rows", 8, "--group", 2, "--save-every", 1, "--tokens", 16, "--seed", 5,
              "--dir", tmp_path / "d", "--json")
    assert r.returncode == 0, r.stderr
    pend = tmp_path / "d" / "pending"
    dumps = sorted(p.name for p in pend.glob("step-*") if p.is_dir())
    assert sorted(p.name[:-len(".lock")] for p in pend.glob("step-*.lock")) == dumps and 0 < len(dumps) <= 4, \
        sorted(os.listdir(pend))


def test_demo_full_mode_is_killed_resumes_and_its_check_passes(forkrun, tmp_path):
    r = _demo(forkrun, "--steps", 5, "--rows", 8, "--group", 2, "--save-every", 2, "--tokens", 32, "--seed", 3,
              "--mode", "full", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["mode"] == "full" and doc["check"]["ok"] and doc["killed_during_step"] is not None


def test_demo_text_summary(forkrun, tmp_path):
    r = _demo(forkrun, "--steps", 4, "--rows", 8, "--group", 2, "--save-every", 2, "--tokens", 32, "--seed", 1, "--no-kill")
    assert r.returncode == 0, r.stderr
    assert "summary" in r.stdout and "check:            PASS" in r.stdout and "stall per save" in r.stdout
    assert "from the dump of pending samples" not in r.stdout or "pending mode" in r.stdout
    assert "no (--no-kill): one run, nothing restored" in r.stdout and "came back" not in r.stdout
    assert "32 of 32 samples consumed, 0 missing, 0 twice\n" in r.stdout
    assert [ln.split(":")[0] for ln in r.stdout.splitlines() if ln.startswith("step ")] == [
        "step   1", "step   2", "step   3", "step   4"]


def test_the_demo_kills_the_loop_only_once_it_can_resume_from_a_published_generation(tmp_path):
    """A save's temporary directory holds a MANIFEST.json before it is renamed in, and in
    pending mode a generation without its pending samples' dump is not one the loop resumes
    from: killing the loop then made it start over."""
    base = tmp_path / "d"
    gens, pend = base / "generations", base / "pending"
    tmp_gen = gens / "step-0000000002.tmp-0123abcd"
    tmp_gen.mkdir(parents=True)
    (tmp_gen / "MANIFEST.json").write_text("{}")
    assert not _published(base, "full") and not _published(base, "pending")
    gen = gens / "step-0000000002"
    tmp_gen.rename(gen)
    assert _published(base, "full") and not _published(base, "pending")
    (pend / "step-0000000002.tmp").mkdir(parents=True)
    (pend / "step-0000000002.tmp" / "MANIFEST.json").write_text("{}")
    assert not _published(base, "pending")
    (pend / "step-0000000002.tmp").rename(pend / "step-0000000002")
    assert _published(base, "pending")


@pytest.mark.parametrize("seed", [2, 5])
def test_a_killed_demo_always_restores_a_generation(forkrun, tmp_path, seed):
    r = _demo(forkrun, "--steps", 6, "--rows", 16, "--group", 4, "--save-every", 2, "--tokens", 64, "--seed", seed, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["killed_during_step"] is not None and doc["restored_step"], r.stderr
    assert "starting over" not in r.stderr and doc["check"]["ok"]


@pytest.mark.parametrize("seed", [2, 4])
def test_a_short_demo_kills_its_loop_during_the_step_it_announced(forkrun, tmp_path, seed):
    """A loop of a few fast steps finished before its first background save had published: it
    was killed during a later step than announced (or "step 5" of 4), or not at all, and the
    summary then said "no (--no-kill)" and passed.  The loop now waits for the demo's go after
    each step, and the go before the kill step waits for a published generation."""
    r = _demo(forkrun, "--steps", 4, "--rows", 8, "--group", 2, "--save-every", 2, "--tokens", 32, "--seed", seed,
              "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    announced = int(r.stderr.split("the loop will be killed during step ")[1].split()[0])
    assert doc["killed_during_step"] == announced and doc["restored_step"] == 2, r.stderr
    assert f"during step {announced}\n" in r.stderr and doc["check"]["ok"]


def test_demo_rejects_bad_options_with_exit_2(forkrun, tmp_path):
    for args in (("--rows", 7, "--group", 2), ("--steps", 1), ("--save-every", 9, "--steps", 4)):
        r = _demo(forkrun, *args)
        assert r.returncode == 2 and "Traceback" not in r.stderr
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("mine")
    r = _demo(forkrun, "--dir", tmp_path / "full")
    assert r.returncode == 2 and "not empty" in r.stderr and (tmp_path / "full" / "x").read_text() == "mine"
    r = _demo(forkrun, "--dir", tmp_path / "full" / "x")
    assert r.returncode == 2 and "not a directory" in r.stderr and (tmp_path / "full" / "x").read_text() == "mine"


def _ev(run, ev, **kw):
    return dict(run=run, ev=ev, **kw)


def test_check_finds_a_lost_and_a_twice_consumed_sample():
    g = 2
    keys = lambda p: [f"p{p:06d}-s{j}" for j in range(g)]  # noqa: E731
    good = [_ev(1, "ack", seq=0, prompt=0, version="final"), _ev(1, "ack", seq=1, prompt=1, version="partial"),
            _ev(1, "consumed", step=1, keys=keys(0)),
            _ev(2, "restored", step=1, from_run=1, acked=2, pending=keys(1), partial=[1]),
            _ev(2, "ack", seq=0, prompt=1, version="final"), _ev(2, "consumed", step=2, keys=keys(1)),
            _ev(2, "done", left=[])]
    assert check(good, 2, g)["ok"]
    lost = [e if e["ev"] != "restored" else dict(e, pending=[], partial=[]) for e in good]
    rep = check(lost, 2, g)
    assert not rep["ok"] and any("not back after restore" in p for p in rep["problems"])
    twice = good[:-1] + [_ev(2, "consumed", step=3, keys=keys(0)), good[-1]]
    rep = check(twice, 2, g)
    assert not rep["ok"] and rep["twice"] == g


def test_the_summary_median_of_an_even_number_of_saves_is_their_middle():
    """With two saves the "median" stall was the larger one (the max)."""
    from tqstore.cli_demo import summarize

    events = [_ev(1, "cut", step=s, stall_s=st, cut_s=st / 2, pending=0, mode="full")
              for s, st in ((2, 0.001), (4, 0.003))] + [_ev(1, "done", left=[])]
    doc = summarize(events, {"steps": 4, "rows": 2, "group": 2, "seed": 0}, None)
    assert doc["stall_ms_median"] == pytest.approx(2.0) and doc["stall_ms_max"] == pytest.approx(3.0)
    assert doc["cut_ms_median"] == pytest.approx(1.0)
