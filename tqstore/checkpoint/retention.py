"""Retention policies of a :class:`~tqstore.checkpoint.CheckpointManager`: small pure objects.

A policy's :meth:`keep` receives every published step (ascending) and returns the steps to
keep; the manager deletes the others, and only after a newer generation is durable.
Policies compose with :class:`KeepAny`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import FrozenSet, Sequence, Tuple

import numpy as np

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
        n = self.n
        if isinstance(n, np.integer) and not isinstance(n, bool):  # (a numpy integer: taken as the int)
            n = int(n)
            object.__setattr__(self, "n", n)
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise InvalidInputError(f"keep_last must be an int >= 1, got {self.n!r}")

    def keep(self, steps: Sequence[int]) -> FrozenSet[int]:
        return frozenset(sorted(steps)[-self.n:])


@dataclass(frozen=True)
class KeepEvery(RetentionPolicy):
    """Keep every step that is a multiple of ``every`` (e.g. a permanent one per epoch)."""

    every: int

    def __post_init__(self) -> None:
        if not isinstance(self.every, int) or isinstance(self.every, bool) or self.every < 1:
            raise InvalidInputError(f"every must be an int >= 1, got {self.every!r}")

    def keep(self, steps: Sequence[int]) -> FrozenSet[int]:
        return frozenset(s for s in steps if s % self.every == 0)


@dataclass(frozen=True)
class KeepAny(RetentionPolicy):
    """Keep a step if any of ``policies`` keeps it: ``KeepAny(KeepLast(3), KeepEvery(1000))``."""

    policies: Tuple[RetentionPolicy, ...]

    def __init__(self, *policies: RetentionPolicy) -> None:
        object.__setattr__(self, "policies", tuple(policies))

    def keep(self, steps: Sequence[int]) -> FrozenSet[int]:
        out: FrozenSet[int] = frozenset()
        for p in self.policies:
            out |= p.keep(steps)
        return out


@dataclass(frozen=True)
class KeepSteps(RetentionPolicy):
    """Keep exactly the given steps when present (e.g. the newest generation that verifies,
    composed with another policy: ``KeepAny(KeepLast(2), KeepSteps({newest_valid}))``)."""

    steps: FrozenSet[int]

    def __init__(self, steps) -> None:
        object.__setattr__(self, "steps", frozenset(int(s) for s in steps))

    def keep(self, steps: Sequence[int]) -> FrozenSet[int]:
        return frozenset(s for s in steps if s in self.steps)
