"""tqstore.policy: Young/Daly checkpoint intervals."""
from __future__ import annotations

import math

import pytest

from tqstore import InvalidInputError
from tqstore.policy import checkpoint_interval, expected_overhead, young_interval

MIN = 60.0


def test_daly_matches_the_figures_of_his_paper():
    # Daly (2006), figs. 3 and 5: dump time 5 min, restart 10 min
    assert checkpoint_interval(5 * MIN, 24 * 60 * MIN, 10 * MIN) / MIN == pytest.approx(117, abs=0.5)
    assert checkpoint_interval(5 * MIN, 15 * MIN, 10 * MIN) / MIN == pytest.approx(9.1, abs=0.05)


def test_young_is_the_first_order_term():
    assert young_interval(2.0, 3600.0) == pytest.approx(math.sqrt(2 * 2 * 3600))
    c, m = 0.01, 1e6  # tiny cost: Daly tends to Young
    assert checkpoint_interval(c, m) == pytest.approx(young_interval(c, m), rel=1e-3)


def test_edges():
    assert checkpoint_interval(0, 3600) == 0.0
    assert checkpoint_interval(10_000, 3600) == 3600  # a save longer than 2 MTBF: once per MTBF
    assert checkpoint_interval(5, 3600, 0) == checkpoint_interval(5, 3600, 600)  # restart does not move it


def test_the_interval_minimises_daly_s_expected_overhead():
    c, m, r = 0.05, 4 * 3600.0, 120.0
    tau = checkpoint_interval(c, m, r)
    best = expected_overhead(tau, c, m, r)
    for f in (0.5, 0.8, 1.25, 2.0):
        assert expected_overhead(tau * f, c, m, r) > best


@pytest.mark.parametrize("args", [(-1, 10), (1, 0), (1, -5), (1, float("inf")), (float("nan"), 10), ("a", 10),
                                  (1, 10, -1), ("2.5", 3600), (2.5, "3600"), (True, 3600), (1, 3600, b"1"),
                                  (10 ** 400, 10), (1, 10 ** 5000)])
def test_bad_arguments_raise_value_errors(args):
    with pytest.raises(InvalidInputError):
        checkpoint_interval(*args)
    assert issubclass(InvalidInputError, ValueError)


def test_young_and_the_overhead_refuse_text_and_bools_too():
    """float() took "  2.5e0 " and True (1) as numbers: the README says non-numeric raises."""
    with pytest.raises(InvalidInputError):
        young_interval(True, 3600.0)
    with pytest.raises(InvalidInputError):
        expected_overhead(60.0, 1.0, True)


def test_an_interval_far_past_the_mtbf_has_an_infinite_overhead_and_an_int_past_floats_is_refused():
    assert expected_overhead(1e5, 1.0, 1.0) == float("inf")
    assert expected_overhead(1e5, 1.0, 1.0, restart_s=1e5) == float("inf")
    with pytest.raises(InvalidInputError, match="mtbf_s"):
        young_interval(1, 10 ** 400)
    with pytest.raises(InvalidInputError, match="interval_s"):
        expected_overhead(10 ** 400, 1, 1)
