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

import pickle
from typing import Any, Dict, Tuple

from ..port_calls import DESTINATION_PARAMS, RemotePort, port_attributes, port_methods, portable
from ..ports import ControllerPort, UnitPort


def through_pickle(obj: Any) -> Any:
    """``obj`` after a trip through pickle: a copy, as a process boundary makes one."""
    return pickle.loads(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


class PickledPort(RemotePort):
    """The object ``target`` reached through pickled calls of ``port``'s methods only
    (:class:`~tqstore.port_calls.RemotePort`: its surface and binding).

    ``calls`` lists the method names called, in order."""

    def __init__(self, target: Any, port: type) -> None:
        super().__init__(port)
        self._target = target

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._port.__name__} of {self._target!r}>"

    def _has(self, name: str) -> bool:
        return callable(getattr(self._target, name, None))

    def _fetch(self, name: str) -> Any:
        return through_pickle(getattr(self._target, name))

    def _send(self, name: str, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        args, kwargs = through_pickle((args, kwargs))
        try:
            result = getattr(self._target, name)(*args, **kwargs)
        except Exception as e:
            raise through_pickle(e) from e
        return through_pickle(portable(result))


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
