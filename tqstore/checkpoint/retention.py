"""Retention policies of a :class:`~tqstore.checkpoint.CheckpointManager`: small pure objects.

A policy's :meth:`keep` receives every published step (ascending) and returns the steps to
keep; the manager deletes the others, and only after a newer generation is durable.
Policies compose with :class:`KeepAny`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import FrozenSet, Sequence, Tuple

from .._format.names import as_int
from ..errors import InvalidInputError


class RetentionPolicy:
    """Base class: decide which generations to keep."""

    def keep(self, steps: Sequence[int]) -> FrozenSet[int]:  # pragma: no cover - interface
        raise NotImplementedError


@dataclass(frozen=True)
class KeepAll(RetentionPolicy):
    """Never delete a generation."""

    def keep(self, steps: Sequence[int]) -> FrozenSet[int]:
        return frozenset(steps)


@dataclass(frozen=True)
class KeepLast(RetentionPolicy):
    """Keep the ``n`` newest (highest) steps."""

    n: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "n", _count("keep_last", self.n))

    def keep(self, steps: Sequence[int]) -> FrozenSet[int]:
        return frozenset(sorted(steps)[-self.n:])


@dataclass(frozen=True)
class KeepEvery(RetentionPolicy):
    """Keep every step that is a multiple of ``every`` (e.g. a permanent one per epoch)."""

    every: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "every", _count("every", self.every))

    def keep(self, steps: Sequence[int]) -> FrozenSet[int]:
        return frozenset(s for s in steps if s % self.every == 0)


@dataclass(frozen=True)
class KeepAny(RetentionPolicy):
    """Keep a step if any of ``policies`` keeps it: ``KeepAny(KeepLast(3), KeepEvery(1000))``."""

    policies: Tuple[RetentionPolicy, ...]

    def __init__(self, *policies: RetentionPolicy) -> None:
        for p in policies:
            check_policy(p)
        object.__setattr__(self, "policies", tuple(policies))

    def keep(self, steps: Sequence[int]) -> FrozenSet[int]:
        out: FrozenSet[int] = frozenset()
        for p in self.policies:
            out |= kept_steps(p, steps)
        return out


@dataclass(frozen=True)
class KeepSteps(RetentionPolicy):
    """Keep exactly the given steps when present (e.g. the newest generation that verifies,
    composed with another policy: ``KeepAny(KeepLast(2), KeepSteps({newest_valid}))``)."""

    steps: FrozenSet[int]

    def __init__(self, steps) -> None:
        try:
            kept = frozenset(_step(s) for s in steps)
        except TypeError:
            raise InvalidInputError(f"KeepSteps takes an iterable of steps (ints >= 0), got {steps!r:.80}") from None
        object.__setattr__(self, "steps", kept)

    def keep(self, steps: Sequence[int]) -> FrozenSet[int]:
        return frozenset(s for s in steps if s in self.steps)


def _count(name: str, n) -> int:
    """``n`` as an int >= 1 (a numpy integer taken as the int), else InvalidInputError."""
    return _int_at_least(name, n, 1)


def _step(s) -> int:
    """A step given to a policy: an int >= 0 (a numpy integer taken as the int), else
    InvalidInputError (2.7 became 2, True 1; a str raised a bare ValueError)."""
    return _int_at_least("a step", s, 0)


def _int_at_least(what: str, value, least: int) -> int:
    v = as_int(value)
    if v is None or v < least:
        raise InvalidInputError(f"{what} must be an int >= {least}, got {value!r:.60}")
    return v


def check_policy(policy) -> RetentionPolicy:
    """``policy`` if it is a retention policy object (a class passed instead of an instance, or
    anything without a ``keep`` method, is refused: its prune failed at every save, logged only,
    and no generation was ever deleted); InvalidInputError otherwise."""
    if isinstance(policy, type) or not callable(getattr(policy, "keep", None)):
        hint = f" (an instance: {policy.__name__}(...))" if isinstance(policy, type) else ""
        raise InvalidInputError(f"policy must be a RetentionPolicy object (KeepLast(3), KeepEvery(1000), KeepAny(...), "
                                f"...){hint}, got {policy!r:.80}")
    return policy


def kept_steps(policy, steps: Sequence[int]) -> FrozenSet[int]:
    """``policy.keep(steps)`` as a frozenset (a policy of the user's may return any iterable of
    steps); InvalidInputError when it returns something else."""
    got = policy.keep(steps)
    try:
        return frozenset(got)
    except TypeError:
        raise InvalidInputError(f"{policy!r:.80}.keep(steps) must return the steps to keep (a set of ints), got "
                                f"{got!r:.80}") from None
