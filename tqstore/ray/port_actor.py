"""Units and controllers hosted in a Ray actor, reached through their ports.

:func:`start_host` starts a :class:`PortHost` actor (threaded: calls of different callers
run side by side; the units and the controller are thread-safe by themselves).  The host
opens units and controllers on its own node's file system (``open_unit`` /
``open_controller``, each an ``oid``) and answers port calls on them.  :class:`ActorUnit`
and :class:`ActorController` are the proxies any process of the cluster holds: the port's
surface and binding of :class:`~tqstore.port_calls.RemotePort` (only the protocol's methods
and attributes; ``into`` / ``rows`` destinations dropped, so the implementation returns its
values; views of mapped segments sent as bytes), each call one actor task, its answer the
caller's own (arrays Ray hands out read-only are copied: :func:`writable`).

Errors: an error the implementation raises reaches the caller as itself (its type and
message: a :class:`~tqstore.errors.KeyNotFoundError` is caught as one).  A host that died or
cannot be reached raises :class:`~tqstore.errors.DistributedError` naming the part, with
``outcomes`` ``{part: "unreachable: ..."}``; what a call that was under way when it died
committed is what the part's files say when it is opened again.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import threading
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Tuple

import numpy as np

from .._io import failpoints
from ..embedded import open_controller, open_unit
from ..errors import ConfigError, DistributedError, StoreClosedError, UnsupportedTypeError
from ..port_calls import RemotePort, portable
from ..ports import ControllerPort, UnitPort

log = logging.getLogger("tqstore")

#: Calls a host runs side by side (Ray's ``max_concurrency`` of the threaded actor).
HOST_CONCURRENCY = 16


_LEAVES = (int, float, str, bytes, bool, type(None))


def writable(obj: Any) -> Any:
    """``obj`` with every read-only numpy array in it (Ray hands out arrays of its object store
    read-only, zero-copy) replaced by a copy, in lists, dicts, tuples (named ones included)
    and dataclasses: a port's answers are the caller's to edit.  What holds no such array is
    returned as it is (no copy of a list of a thousand frame heads)."""
    if isinstance(obj, _LEAVES):
        return obj
    if isinstance(obj, np.ndarray):
        return obj if obj.flags.writeable else obj.copy()
    if isinstance(obj, list):
        out = None
        for i, x in enumerate(obj):
            if isinstance(x, _LEAVES):
                continue
            y = writable(x)
            if y is not x:
                if out is None:
                    out = list(obj)
                out[i] = y
        return obj if out is None else out
    if isinstance(obj, dict):
        changed = {k: y for k, v in obj.items() if not isinstance(v, _LEAVES) and (y := writable(v)) is not v}
        return {**obj, **changed} if changed else obj
    if isinstance(obj, tuple):
        items = [writable(x) for x in obj]
        if all(y is x for x, y in zip(items, obj)):
            return obj
        return type(obj)(*items) if hasattr(obj, "_fields") else tuple(items)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        changed = {f.name: y for f in dataclasses.fields(obj) if f.init
                   and (y := writable(v := getattr(obj, f.name))) is not v}
        return dataclasses.replace(obj, **changed) if changed else obj
    return obj


def _ray():
    try:
        import ray
    except ImportError as e:  # pragma: no cover - depends on the installation
        raise ConfigError("the Ray backend needs ray: pip install 'tqstore[ray]'") from e
    return ray


def answer(ref: Any, part: str) -> Any:
    """The value of the actor task ``ref`` (a call on ``part``), the caller's own
    (:func:`writable`).  An error the task raised is raised as itself; an actor that died or
    cannot be reached raises :class:`~tqstore.errors.DistributedError` naming ``part``, with
    ``outcomes`` ``{part: "unreachable: ..."}``.  An argument the actor could not read (its
    class is not importable there: a module only the caller's node has) raises
    :class:`~tqstore.errors.UnsupportedTypeError`; the call did not run."""
    ray = _ray()
    try:
        return writable(ray.get(ref))
    except ray.exceptions.RayTaskError as e:
        cause = getattr(e, "cause", None)
        if isinstance(cause, ray.exceptions.RaySystemError) and _unreadable_argument(cause):
            raise UnsupportedTypeError(
                f"{part}: an argument of this call cannot be read there ({cause.client_exc!r}: its class is not "
                f"importable in the store's actors); pass lists, tensors, arrays and JSON values; nothing was "
                f"written") from None
        if isinstance(cause, Exception):
            raise cause from None
        raise
    except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError, ray.exceptions.RaySystemError,
            ray.exceptions.ObjectLostError) as e:  # (an answer lost with its node: the outcome is unknown too)
        raise DistributedError(f"{part}: its actor is unreachable ({type(e).__name__}: {e})",
                               outcomes={part: f"unreachable: {type(e).__name__}"}) from e


def send(part: str, submit: Callable[[], Any]) -> Any:
    """``submit()`` (an actor method's ``.remote(...)``): its object ref.  Ray refusing to
    submit the call (the actor is gone, or this process's Ray was shut down, or started again:
    "Failed to submit task to actor ...") raises :class:`~tqstore.errors.DistributedError`
    naming ``part``; the call did not run.  A TypeError (an argument Ray cannot pickle) is
    the caller's to raise."""
    try:
        return submit()
    except TypeError:
        raise
    except Exception as e:  # noqa: BLE001 - Ray raises plain Exception here
        raise DistributedError(f"{part}: the call could not be sent ({type(e).__name__}: {e})",
                               outcomes={part: f"unreachable: {type(e).__name__}"}) from e


def _unreadable_argument(err: Any) -> bool:
    """Whether a task's RaySystemError is its arguments' deserialization failing (an import or
    a lookup of a class that process does not have)."""
    exc = getattr(err, "client_exc", None)
    return isinstance(exc, (ImportError, AttributeError)) and "deserializ" in str(getattr(err, "traceback_str", ""))


class PortHost:
    """Units and controllers opened in this (actor) process, by ``oid``; see the module
    docstring.  Runs as a Ray actor; a plain object in tests of its own logic."""

    def __init__(self) -> None:
        self._ports: Dict[int, Any] = {}
        self._next = 1
        self._lock = threading.Lock()

    def _add(self, port: Any) -> int:
        with self._lock:
            oid, self._next = self._next, self._next + 1
            self._ports[oid] = port
        return oid

    def _get(self, oid: int) -> Any:
        port = self._ports.get(oid)
        if port is None:
            raise StoreClosedError(f"port {oid} of this host is closed or was never opened")
        return port

    def read_small(self, path: str, limit: int = 1 << 16) -> Optional[bytes]:
        """The bytes of the regular file ``path`` as this host's node sees it (at most
        ``limit``), or None when it is missing or not readable there: the store's
        ``STORE.json``, compared with the opener's (:meth:`~tqstore.ray.RayParts.open_parts`)."""
        try:
            with open(path, "rb") as f:
                return f.read(limit)
        except OSError:
            return None

    def where(self) -> Tuple[str, int]:
        """``(node id, pid)`` of the host's process."""
        try:
            import ray
            node = ray.get_runtime_context().get_node_id()
        except Exception:  # noqa: BLE001 - not in a Ray worker
            node = ""
        return node, os.getpid()

    def open_unit(self, path: str, unit_id: int, kwargs: Dict[str, Any]) -> int:
        """Open (or create) the unit ``unit_id`` in ``path`` on this host's node
        (``kwargs``: the options of :func:`tqstore.embedded.open_unit`); its ``oid``."""
        return self._add(open_unit(Path(path), unit_id, **kwargs))

    def open_controller(self, path: str, num_units: int, kwargs: Dict[str, Any]) -> int:
        """Open (or create) the controller in ``path`` on this host's node (``kwargs``:
        ``durability``, ``map_bytes``); its ``oid``."""
        kw = {"durability": "checkpoint", "map_bytes": None, **kwargs}
        return self._add(open_controller(Path(path), num_units=num_units, **kw))

    def has(self, oid: int, name: str) -> bool:
        return callable(getattr(self._get(oid), name, None))

    def call(self, oid: int, name: str, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        """The port method ``name`` of ``oid`` called with the (bound) arguments; its result,
        portable."""
        return portable(getattr(self._get(oid), name)(*args, **kwargs))

    def attr(self, oid: int, name: str) -> Any:
        return getattr(self._get(oid), name)

    def close(self, oid: int) -> None:
        """Close the port ``oid`` (idempotent)."""
        with self._lock:
            port = self._ports.pop(oid, None)
        if port is not None:
            port.close()

    def open_ports(self) -> int:
        return len(self._ports)

    def failpoint(self, name: str, action: Optional[str]) -> None:
        """Arm the I/O layer's failpoint ``name`` in this process (``action`` as
        :func:`tqstore._io.failpoints.arm`, every occurrence), or disarm it (``None``): fault
        injection for tests of what callers see when a part's commits fail."""
        if action is None:
            failpoints.disarm(name)
        else:
            failpoints.arm(name, action, repeat=True)


def start_host(**options: Any) -> Any:
    """Start a :class:`PortHost` actor and return its handle.  ``options`` go to Ray's
    ``.options()`` (``name``, ``namespace``, ``lifetime``, ``scheduling_strategy`` to place it
    on a node, ...); it asks for no CPU unless ``num_cpus`` is given.  Raises ConfigError
    when ray is not installed."""
    ray = _ray()
    opts = {"num_cpus": 0, "max_concurrency": HOST_CONCURRENCY, **options}
    return ray.remote(PortHost).options(**opts).remote()


class ActorPort(RemotePort):
    """A port opened in a :class:`PortHost` actor (see the module docstring)."""

    def __init__(self, host: Any, oid: int, port: type, part: str) -> None:
        super().__init__(port)
        self._host, self._oid, self._part = host, oid, part
        self._closed = False
        self._known: Dict[str, bool] = {}  # method name -> the implementation has it

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._part} (port {self._oid} of {self._host!r})>"

    def _get(self, ref: Any) -> Any:
        return answer(ref, self._part)

    def _has(self, name: str) -> bool:
        if name == "close":  # (every port has it; a closed one answers it too)
            return True
        has = self._known.get(name)
        if has is None:
            has = self._known[name] = self._get(send(self._part, lambda: self._host.has.remote(self._oid, name)))
        return has

    def _fetch(self, name: str) -> Any:
        return self._get(send(self._part, lambda: self._host.attr.remote(self._oid, name)))

    def _send(self, name: str, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        if name == "close":
            return self._close()
        return self._get(send(self._part, lambda: self._host.call.remote(self._oid, name, args, kwargs)))

    def _close(self) -> None:
        if self._closed:
            return
        try:
            self._get(send(self._part, lambda: self._host.close.remote(self._oid)))
        finally:
            self._closed = True


class ActorUnit(ActorPort):
    """Unit ``unit_id`` in ``path`` on the node of ``host``, as a
    :class:`~tqstore.ports.UnitPort` (``kwargs``: the options of :func:`tqstore.embedded.open_unit`)."""

    def __init__(self, host: Any, path: str, unit_id: int, **kwargs: Any) -> None:
        super().__init__(host, 0, UnitPort, f"unit {unit_id}")
        self._oid = self._get(host.open_unit.remote(str(path), unit_id, kwargs))


class ActorController(ActorPort):
    """The controller in ``path`` on the node of ``host``, as a
    :class:`~tqstore.ports.ControllerPort` (``kwargs``: ``durability``, ``map_bytes``)."""

    def __init__(self, host: Any, path: str, num_units: int, **kwargs: Any) -> None:
        super().__init__(host, 0, ControllerPort, "controller")
        self._oid = self._get(host.open_controller.remote(str(path), num_units, kwargs))


__all__ = ["PortHost", "start_host", "ActorPort", "ActorUnit", "ActorController", "HOST_CONCURRENCY", "answer"]
