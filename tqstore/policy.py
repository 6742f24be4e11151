"""How often to checkpoint: Young's and Daly's optimum interval.

Feed it the measured cost of a checkpoint on the critical path — with
``save_checkpoint(..., blocking=False)`` that is the stall (``SaveHandle.stall_s``), not
the whole write — and the mean time between failures of the job::

    h = store.save_checkpoint(d, blocking=False)
    every_s = checkpoint_interval(h.stall_s, mtbf_s=6 * 3600)

References: J. W. Young, "A first order approximation to the optimum checkpoint
interval", CACM 17(9), 1974; J. T. Daly, "A higher order estimate of the optimum
checkpoint interval for restart dumps", FGCS 22(3), 2006.
"""
from __future__ import annotations

import math

from .errors import InvalidInputError

__all__ = ["checkpoint_interval", "young_interval", "expected_overhead"]


def _positive(name: str, v: float, *, zero_ok: bool = False) -> float:
    if isinstance(v, (str, bytes, bytearray, bool)):  # (float() would parse "2.5", and True is 1)
        raise InvalidInputError(f"{name} must be a number of seconds, got {v!r}")
    try:
        f = float(v)
    except (TypeError, ValueError) as e:
        raise InvalidInputError(f"{name} must be a number of seconds, got {v!r}") from e
    except OverflowError:  # (an int past the float range)
        raise InvalidInputError(f"{name} must be a finite number of seconds, got a {type(v).__name__} past "
                                f"the float range") from None
    if not math.isfinite(f) or f < 0 or (f == 0 and not zero_ok):
        raise InvalidInputError(f"{name} must be a finite number of seconds {'>= 0' if zero_ok else '> 0'}, got {v!r}")
    return f


def young_interval(save_cost_s: float, mtbf_s: float) -> float:
    """Young's first-order optimum: ``sqrt(2 * save_cost_s * mtbf_s)``."""
    c = _positive("save_cost_s", save_cost_s, zero_ok=True)
    m = _positive("mtbf_s", mtbf_s)
    return math.sqrt(2.0 * c * m)


def checkpoint_interval(save_cost_s: float, mtbf_s: float, restart_s: float = 0.0) -> float:
    """The compute time between checkpoints (seconds) that minimises the expected run time.

    Daly's higher-order estimate: with ``C = save_cost_s`` and ``M = mtbf_s``,
    ``sqrt(2CM) * (1 + sqrt(C/2M)/3 + (C/2M)/9) - C`` when ``C < 2M``, else ``M``.
    (``C = 0`` gives 0: free checkpoints may be taken at every step.)

    ``restart_s`` (time to restart and reload after a failure) scales the expected run
    time by ``exp(restart_s / M)`` in Daly's model but does not move the optimum; it is
    validated and used by :func:`expected_overhead`.

    Raises:
        InvalidInputError: a negative, infinite or non-numeric argument, or ``mtbf_s <= 0``.
    """
    c = _positive("save_cost_s", save_cost_s, zero_ok=True)
    m = _positive("mtbf_s", mtbf_s)
    _positive("restart_s", restart_s, zero_ok=True)
    if c >= 2.0 * m:
        return m
    x = c / (2.0 * m)
    return max(0.0, math.sqrt(2.0 * c * m) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - c)


def expected_overhead(interval_s: float, save_cost_s: float, mtbf_s: float, restart_s: float = 0.0) -> float:
    """Expected wall time per unit of useful compute, minus 1, in Daly's model:
    ``M * exp(R/M) * (exp((tau + C)/M) - 1) / tau - 1`` (0 means no overhead; ``inf`` when
    it is past the float range: an interval, save or restart far longer than the MTBF).

    Raises:
        InvalidInputError: as :func:`checkpoint_interval`, and for ``interval_s <= 0``.
    """
    tau = _positive("interval_s", interval_s)
    c = _positive("save_cost_s", save_cost_s, zero_ok=True)
    m = _positive("mtbf_s", mtbf_s)
    r = _positive("restart_s", restart_s, zero_ok=True)
    try:
        return m * math.exp(r / m) * math.expm1((tau + c) / m) / tau - 1.0
    except OverflowError:
        return math.inf
