"""Port proxies that simulate a process boundary, for tests.

:class:`PickledPort` stands in for a unit or the controller across a process (as a Ray
actor is): it exposes only the port's methods and attributes (a missing one is missing,
so ``hasattr`` answers as for the object behind it), binds every call against the port's
signature (an implementation-specific argument is refused), sends arguments and results
through :func:`pickle.dumps` / :func:`pickle.loads`, ignores ``into`` destinations (the
implementation then returns its values; ``rows`` goes with ``into``), turns buffers that
cannot leave a process (views of a mapped segment) into bytes, and raises a pickled copy
of any error.  A caller that works through such a proxy works through an actor layer.

:class:`PickledUnit` and :class:`PickledController` fix the port.  They are what
``tests/test_conformance.py`` runs :mod:`tqstore.testing.conformance` against, beside
the local objects.
"""
from __future__ import annotations

import inspect
import pickle
from typing import Any, Callable, Dict, FrozenSet, List, Tuple

from ..ports import ControllerPort, UnitPort

#: Parameters a process boundary drops: the caller's memory cannot be filled from there.
DESTINATION_PARAMS = ("into", "rows")


def port_methods(port: type) -> FrozenSet[str]:
    """The public method names a port protocol declares."""
    return frozenset(n for n, v in vars(port).items() if callable(v) and not n.startswith("_"))


def port_attributes(port: type) -> FrozenSet[str]:
    """The public data attributes a port protocol declares (``unit_id``, ``num_units``, ...)."""
    return frozenset(n for n in getattr(port, "__annotations__", {}) if not n.startswith("_"))


def portable(obj: Any) -> Any:
    """What an actor layer sends back for ``obj``: views of mapped segments become bytes
    (in lists, dicts and plain tuples; named tuples and arrays pickle as they are)."""
    if isinstance(obj, memoryview):
        return obj.tobytes()
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(portable(x) for x in obj)
    if isinstance(obj, list):
        return [portable(x) for x in obj]
    if isinstance(obj, dict):
        return {k: portable(v) for k, v in obj.items()}
    return obj


def through_pickle(obj: Any) -> Any:
    """``obj`` after a trip through pickle: a copy, as a process boundary makes one."""
    return pickle.loads(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


class PickledPort:
    """The object ``target`` reached through pickled calls of ``port``'s methods only.

    ``calls`` lists the method names called, in order."""

    def __init__(self, target: Any, port: type) -> None:
        self._target = target
        self._port = port
        self._methods = port_methods(port)
        self._attributes = port_attributes(port)
        self._signatures: Dict[str, inspect.Signature] = {}
        self.calls: List[str] = []

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._port.__name__} of {self._target!r}>"

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if name in self._attributes:
            return through_pickle(getattr(self._target, name))
        if name not in self._methods:
            raise AttributeError(f"{name!r} is not a {self._port.__name__} method")
        method = getattr(self._target, name)  # AttributeError when the implementation lacks it
        return self._remote(name, method)

    def _bind(self, name: str, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Tuple[Tuple[Any, ...], Dict[str, Any]]:
        sig = self._signatures.get(name)
        if sig is None:
            sig = self._signatures[name] = inspect.signature(getattr(self._port, name))
        bound = sig.bind(None, *args, **kwargs)  # None for self: only the port's parameters pass
        for p in DESTINATION_PARAMS:
            if p in bound.arguments:
                bound.arguments[p] = None
        return bound.args[1:], bound.kwargs

    def _remote(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            args, kwargs = through_pickle(self._bind(name, args, kwargs))
            try:
                result = method(*args, **kwargs)
            except Exception as e:
                raise through_pickle(e) from e
            return through_pickle(portable(result))

        call.__name__ = call.__qualname__ = name
        call.__doc__ = getattr(self._port, name).__doc__
        return call


class PickledUnit(PickledPort):
    """A unit reached as :class:`~tqstore.ports.UnitPort` across a (simulated) process boundary."""

    def __init__(self, unit: Any) -> None:
        super().__init__(unit, UnitPort)


class PickledController(PickledPort):
    """The controller reached as :class:`~tqstore.ports.ControllerPort` across a (simulated)
    process boundary."""

    def __init__(self, controller: Any) -> None:
        super().__init__(controller, ControllerPort)


__all__ = ["PickledPort", "PickledUnit", "PickledController", "port_methods", "port_attributes", "portable",
           "through_pickle", "DESTINATION_PARAMS"]
