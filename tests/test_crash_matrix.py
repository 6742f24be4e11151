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
    """A spread of crash points per operation, kill plus two power-loss seeds (drop all, mixed)."""
    _assert_clean(matrix.run_scenario(SCENARIOS[name], max_points=3, seeds=(0, 2)))


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
