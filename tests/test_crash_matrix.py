"""Crash matrix: every operation crashed at its I/O steps (process kill and simulated power
loss) leaves a store and checkpoints that a restarted process finds consistent, with
nothing acknowledged lost.  A small slice runs in ``make test``; ``-m crash`` runs every
point with extra seeds (``tests/crash/run_matrix.py`` runs every point with the default
ones).  The planted-bug tests show the matrix catches a missing fsync."""
from __future__ import annotations

import pytest

from crash.harness import Matrix
from crash.scenarios import all_scenarios, planted_bug_scenarios

SCENARIOS = {sc.name: sc for sc in all_scenarios()}
EXTRA_SEEDS = (4, 5)


@pytest.fixture(scope="module")
def matrix():
    with Matrix() as m:
        yield m


def _assert_clean(results):
    bad = [f"[{r.label}] {v}" for r in results for v in r.violations]
    assert not bad, f"{len(bad)} violations:\n" + "\n".join(b[:600] for b in bad[:10])


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_crash_slice_keeps_invariants(matrix, name):
    """A spread of crash points per operation, kill plus one power-loss seed: every other
    operation drops all unsynced writes (seed 0), the rest keep a random part of them (seed 2)."""
    seed = (0, 2)[sorted(SCENARIOS).index(name) % 2]
    _assert_clean(matrix.run_scenario(SCENARIOS[name], max_points=3, seeds=(seed,)))


@pytest.mark.crash
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_crash_every_point_keeps_invariants(matrix, name):
    _assert_clean(matrix.run_scenario(SCENARIOS[name], seeds=EXTRA_SEEDS))


@pytest.mark.parametrize("bug", sorted(planted_bug_scenarios()))
def test_matrix_catches_planted_bug(matrix, bug):
    """With a durability step removed from the engine (in this test only), the matrix
    reports violations: it would notice such a regression."""
    sc, patch = planted_bug_scenarios()[bug]
    with patch():
        results = matrix.run_scenario(sc, seeds=(0, 2, 3), kill=False, max_points=0)
    assert sum(len(r.violations) for r in results) > 0, f"planted bug {bug!r} went unnoticed"


def test_a_kill_point_the_operation_no_longer_reaches_is_a_violation_naming_both_counts(tmp_path):
    """An operation whose I/O differs from the recording run (here: two fsyncs the first time,
    one after) leaves a kill point unreached: the matrix reports it, with the count of this
    run and of the recording, instead of passing a point it never crashed."""
    from crash.harness import Scenario
    from tqstore._io import files

    counter = tmp_path / "ran-before"

    def setup(base):
        (base / "f").write_bytes(b"x")
        return {}

    def op(base, ctx):
        for _ in range(1 if counter.exists() else 2):
            files.fsync_file(base / "f")
        counter.touch()

    sc = Scenario("varying_io", setup, op, observe=lambda base, ctx: None, check=lambda base, ctx, out: [],
                  power=False)
    with Matrix(tmp_path / "work") as m:
        results = m.run_scenario(sc)
    bad = [(r.label, v) for r in results for v in r.violations]
    assert len(bad) == 1 and "fsync_file" in bad[0][0], bad
    assert "not reached: this run had 1 fsync_file event(s), the recording 2" in bad[0][1]
