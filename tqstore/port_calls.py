"""Calls of a port across a process boundary: what may cross it and how a call is bound.

A unit or the controller in another process (a Ray actor, or the pickling proxy of the
tests) is reached through :class:`RemotePort`: it exposes only the port protocol's methods
and declared attributes (a missing one is missing, so ``hasattr`` answers as for the object
behind it), binds every call against the protocol's signature (an implementation-specific
argument is refused with ``TypeError`` before anything is sent), and drops the
destinations the caller's memory would receive (``into``, ``rows``: the implementation then
returns its values, as :func:`tqstore.ports.fill_or_copy` lets it).  On the far side,
:func:`portable` turns what cannot leave a process (views of a mapped segment) into bytes.

How the bound call travels is the subclass's: :meth:`RemotePort._send` (a method) and
:meth:`RemotePort._fetch` (an attribute).  An error raised by the implementation reaches the
caller as an error of its own type (a :class:`~tqstore.errors.TqstoreError` stays one).
"""
from __future__ import annotations

import inspect
from collections import deque
from typing import Any, Callable, Deque, Dict, FrozenSet, List, Tuple

#: How many method names :attr:`RemotePort.calls` keeps.
CALLS_KEPT = 256

#: Parameters a process boundary drops: the caller's memory cannot be filled from there.
DESTINATION_PARAMS = ("into", "rows")


def port_methods(port: type) -> FrozenSet[str]:
    """The public method names a port protocol declares."""
    return frozenset(n for n, v in vars(port).items() if callable(v) and not n.startswith("_"))


def port_attributes(port: type) -> FrozenSet[str]:
    """The public data attributes a port protocol declares (``unit_id``, ``num_units``, ...)."""
    return frozenset(n for n in getattr(port, "__annotations__", {}) if not n.startswith("_"))


def portable(obj: Any) -> Any:
    """What a far side sends back for ``obj``: views of mapped segments become bytes (in
    lists, dicts and plain tuples; named tuples and arrays travel as they are)."""
    if isinstance(obj, memoryview):
        return obj.tobytes()
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(portable(x) for x in obj)
    if isinstance(obj, list):
        return [portable(x) for x in obj]
    if isinstance(obj, dict):
        return {k: portable(v) for k, v in obj.items()}
    return obj


class RemotePort:
    """A port protocol's surface over a transport (see the module docstring).

    ``calls`` lists the names of the last :data:`CALLS_KEPT` methods called, in order (a
    bounded log: a store's ports live as long as the store)."""

    def __init__(self, port: type) -> None:
        self._port = port
        self._methods = port_methods(port)
        self._attributes = port_attributes(port)
        self._signatures: Dict[str, inspect.Signature] = {}
        self.calls: Deque[str] = deque(maxlen=CALLS_KEPT)

    # the transport -------------------------------------------------------------
    def _has(self, name: str) -> bool:
        """Whether the implementation behind has the method ``name``."""
        raise NotImplementedError

    def _send(self, name: str, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        """Call the method ``name`` there with the bound arguments; its result (portable)."""
        raise NotImplementedError

    def _fetch(self, name: str) -> Any:
        """The attribute ``name`` there, now."""
        raise NotImplementedError

    # the surface ----------------------------------------------------------------
    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if name in self._attributes:
            return self._fetch(name)
        if name not in self._methods:
            raise AttributeError(f"{name!r} is not a {self._port.__name__} method")
        if not self._has(name):
            raise AttributeError(f"{name!r}: the {self._port.__name__} behind this proxy has no such method")
        return self._method(name)

    def bind(self, name: str, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Tuple[Tuple[Any, ...], Dict[str, Any]]:
        """``args`` and ``kwargs`` bound to the protocol's signature of ``name``, destinations
        dropped.  Raises TypeError for arguments the protocol does not take."""
        sig = self._signatures.get(name)
        if sig is None:
            sig = self._signatures[name] = inspect.signature(getattr(self._port, name))
        bound = sig.bind(None, *args, **kwargs)  # None for self: only the port's parameters pass
        for p in DESTINATION_PARAMS:
            if p in bound.arguments:
                bound.arguments[p] = None
        return bound.args[1:], bound.kwargs

    def _method(self, name: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            a, k = self.bind(name, args, kwargs)
            return self._send(name, a, k)

        call.__name__ = call.__qualname__ = name
        call.__doc__ = getattr(self._port, name).__doc__
        return call


__all__ = ["RemotePort", "DESTINATION_PARAMS", "port_methods", "port_attributes", "portable"]
