"""What both halves of the port conformance suite share (see :mod:`tqstore.testing.conformance`)."""
from __future__ import annotations

import contextlib
from typing import Any, ContextManager, Dict, Iterator, List, Optional

from .._io import failpoints
from ..errors import TqstoreError


class _LazyPytest:
    """``pytest``, imported on first use: the module imports without it."""

    def __getattr__(self, name: str) -> Any:
        import pytest as real
        return getattr(real, name)


pytest = _LazyPytest()


@contextlib.contextmanager
def inprocess_failpoint(point: str) -> Iterator[None]:
    """Every commit at ``point`` (``unit_commit``, ``controller_commit``) fails with EIO
    inside the block (the I/O layer's failpoints: in this process only)."""
    failpoints.arm(point, "eio", repeat=True)
    try:
        yield
    finally:
        failpoints.disarm(point)


class _PortTests:
    """What both suites share: ports opened by a test are closed after it."""

    def setup_method(self, method: Any) -> None:
        self._opened: List[Any] = []
        self._args: Dict[int, tuple] = {}

    def teardown_method(self, method: Any) -> None:
        for port in reversed(self._opened):
            try:
                port.close()
            except TqstoreError:
                pass

    def _track(self, port: Any, make: Any, args: tuple) -> Any:
        self._opened.append(port)
        self._args[id(port)] = (make, args)
        return port

    def reopen(self, port: Any) -> Any:
        """Close ``port`` and open the same implementation on the same path (override when a
        reopen is more than that, e.g. restarting an actor)."""
        make, args = self._args[id(port)]
        port.close()
        return self._track(make(*args[0], **args[1]), make, args)

    def failing(self, point: str) -> Optional[ContextManager[None]]:
        """A context manager inside which the implementation's commits at ``point`` fail with
        an I/O error; None when the implementation cannot inject one (those tests skip)."""
        return inprocess_failpoint(point)

    def _failing(self, point: str) -> ContextManager[None]:
        ctx = self.failing(point)
        if ctx is None:
            pytest.skip(f"{type(self).__name__} cannot inject a failure at {point!r}")
        return ctx

    @staticmethod
    def _needs(port: Any, method: str) -> None:
        if not callable(getattr(port, method, None)):
            pytest.skip(f"{type(port).__name__} has no {method}() yet")


__all__ = ["_PortTests", "inprocess_failpoint", "pytest"]
