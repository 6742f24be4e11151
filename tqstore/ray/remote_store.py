"""The client side of a store served by a named Ray actor (:mod:`tqstore.ray.store_host`):
what ``tq.init({"backend": "ray"})`` returns in every process of the cluster.

:func:`connect` finds the store host of a name (namespace ``tqstore``) or, when there is
none, starts it and opens the store in it; the process that started it owns it.  Every
other process (a task, an actor, another driver of the cluster) that calls it with the same
name attaches to the same store: its puts are seen by the others' gets, its checkpoint is
the store's.

:class:`RemoteStore` has the store methods the module API and the clients use
(:data:`~tqstore.ray.store_host.STORE_CALLS`), each one call of the host; their errors
reach the caller as themselves (a ``KeyNotFoundError`` is caught as one), and a host that
is gone (closed by its owner, or dead) raises :class:`~tqstore.errors.DistributedError`.
``close()`` in the owner closes the store and ends the host and the parts' actors; in any
other process it only detaches.  A copy of a RemoteStore (pickled: a Ray task's argument, say)
is attached, never the owner, so its ``close()`` or ``with`` exit leaves the store running.
"""
from __future__ import annotations

import logging
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..call_checks import check_wait
from ..errors import ConfigError, DistributedError, StoreClosedError, UnsupportedTypeError, WaitTimeoutError
from .parts import check_nodes
from .port_actor import _ray, answer, send
from .store_host import (STORE_CALLS, HandleRef, HostInfo, Warned, find_store_host, sampler_description,
                         start_store_host)

log = logging.getLogger("tqstore")

#: seconds an attaching process waits for the open of a host another process just started
ATTACH_WAIT_S = 120.0
#: seconds the owner's close waits for the ended host to give up its name
CLOSE_WAIT_S = 30.0
#: a client's waits (a fetch waiting for producers, a save's handle) ask the host again after this many
#: seconds, growing to POLL_MAX_S: a wait never holds one of the host's threads (a host runs a bounded
#: number of calls at once, and waiting consumers must not keep the producers' puts out)
POLL_S = 0.01
POLL_MAX_S = 0.1


def _poll(ready: Any, timeout: Optional[float]) -> bool:
    """Call ``ready()`` until it is true or ``timeout`` seconds (None: no limit) have passed,
    sleeping between calls (POLL_S growing to POLL_MAX_S); its last answer."""
    deadline = None if timeout is None else time.monotonic() + max(0.0, float(timeout))
    delay = POLL_S
    while True:
        if ready():
            return True
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            return False
        time.sleep(delay if left is None else min(delay, left))
        delay = min(POLL_MAX_S, delay * 1.5)


class RemoteHandle:
    """A non-blocking save or dump running in the store host, with the methods of its
    handle (:class:`~tqstore.checkpoint.writer.SaveHandle`): ``done``, ``wait``,
    ``result``, ``exception``; ``path`` and ``stall_s`` as it said when it started."""

    def __init__(self, store: "RemoteStore", ref: HandleRef) -> None:
        self._store, self._ref = store, ref
        self.path = Path(ref.path)
        self.stall_s = ref.stall_s

    def _ask(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return self._store._ask(send(self._store._part,
                                     lambda: self._store._host.handle.remote(self._ref.hid, name, args, kwargs)))

    def done(self) -> bool:
        return self._ask("done")

    def wait(self, timeout: Optional[float] = None) -> bool:
        """True once the save or dump has finished; False if ``timeout`` seconds passed first
        (waited here, asking the host, which runs no call meanwhile)."""
        return _poll(self.done, check_wait(timeout))

    def result(self, timeout: Optional[float] = None) -> Any:
        """The handle's result (raises its error); WaitTimeoutError after ``timeout`` seconds.
        The error is this caller's from the start of the wait (see SaveHandle)."""
        self._ask("claim")
        self._wait_or_raise(timeout)
        return self._ask("result", 0.0)

    def exception(self, timeout: Optional[float] = None) -> Optional[BaseException]:
        """The handle's error, or None; WaitTimeoutError after ``timeout`` seconds."""
        self._ask("claim")
        self._wait_or_raise(timeout)
        return self._ask("exception", 0.0)

    def _wait_or_raise(self, timeout: Optional[float]) -> None:
        if not self.wait(timeout):
            what = "dump" if self._ref.kind.lower().startswith("dump") else "checkpoint save"
            raise WaitTimeoutError.still_running(what, self.path, timeout)

    def __del__(self) -> None:  # pragma: no cover - best effort: the host drops it once finished
        try:
            if not self._store._closed:
                self._store._host.forget.remote(self._ref.hid)
        except Exception:  # noqa: BLE001 - Ray shut down, interpreter exiting
            pass

    def __repr__(self) -> str:
        return f"<{self._ref.kind} {self.path} in Ray store {self._store.name!r}>"


class RemoteStore:
    """A store served by a named Ray actor (see the module docstring).

    Attributes:
        name: the store's name in the cluster.
        owner: True in the process that started the host (its ``close()`` ends the store).
        root, num_units: the store's directory (on the host's node) and unit count.
    """

    def __init__(self, host: Any, name: str, info: HostInfo, *, owner: bool) -> None:
        from ..edge import default_edge

        self._host, self.name, self.owner = host, name, owner
        self._closed = False
        self._edge = default_edge("dict")  # (its to_wire / from_wire: the framework's values across the boundary)
        self.root = None if info.root is None else Path(info.root)
        self.num_units = info.num_units
        self.host_node, self.host_pid = info.node, info.pid

    @property
    def _part(self) -> str:
        return _part_name(self.name)

    def _ask(self, ref: Any) -> Any:
        return answer(ref, self._part)

    def _call(self, name: str, args: Any, kwargs: Dict[str, Any]) -> Any:
        if self._closed:
            raise StoreClosedError(f"{self._part} is closed in this process")
        if name in PATH_ARGS:
            args, kwargs = _absolute_path_arg(PATH_ARGS[name], args, kwargs)
        wire = self._edge.to_wire
        args, kwargs = wire(tuple(args)), wire(dict(kwargs))
        try:
            ref = send(self._part, lambda: self._host.call.remote(name, args, kwargs))
        except TypeError:  # Ray could not pickle an argument (nothing was sent)
            raise _unsendable(name, args, kwargs, self._part) from None
        out = self._ask(ref)
        return RemoteHandle(self, out) if isinstance(out, HandleRef) else self._edge.from_wire(out)

    def _put(self, args: Any, kwargs: Dict[str, Any]) -> Any:
        """``put``; with a ``metadata`` the caller's BatchMeta is updated in place from the
        host's answer (new fields, production status, tags), as the embedded store's put does,
        and returned."""
        out = self._call("put", args, kwargs)
        meta = args[1] if len(args) > 1 else kwargs.get("metadata")
        if meta is None or meta is out or type(out) is not type(meta):
            return out
        meta.__setstate__(out.__getstate__())
        return meta

    def _get_meta(self, args: Any, kwargs: Dict[str, Any]) -> Any:
        """``get_meta``; a fetch that may wait for producers (``timeout_s``) waits here, asking
        the host again (each ask a fetch that does not wait); other modes never wait."""
        timeout = kwargs.get("timeout_s", 0.0)
        mode = args[3] if len(args) > 3 else kwargs.get("mode", "fetch")
        if mode != "fetch" or not isinstance(timeout, (int, float)) or isinstance(timeout, bool) \
                or not timeout > 0:
            return self._call("get_meta", args, kwargs)  # (the host checks the value)
        once = dict(kwargs, timeout_s=0.0)
        got: List[Any] = []

        def ready() -> bool:
            got[:] = [self._call("get_meta", args, once)]
            return len(got[0]) > 0

        _poll(ready, timeout)
        return got[0]

    def run_checkpoint_manager(self, root: str, options: Dict[str, Any], name: str, args: Tuple[Any, ...],
                               kwargs: Dict[str, Any]) -> Any:
        """A :class:`~tqstore.checkpoint.manager.CheckpointManager` call that needs the store in
        process (``save``, ``restore``, ``wait_until_finished``), run by the host beside its store."""
        if self._closed:
            raise StoreClosedError(f"{self._part} is closed in this process")
        out = self._ask(send(self._part, lambda: self._host.checkpoint_manager.remote(root, options, name, args,
                                                                                    kwargs)))
        if isinstance(out, Warned):  # raised again here, where the caller sees them
            for category, message in out.warnings:
                warnings.warn(message, category, stacklevel=3)
            out = out.value
        return RemoteHandle(self, out) if isinstance(out, HandleRef) else out

    def __getattr__(self, name: str) -> Any:
        if name not in STORE_CALLS:
            raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

        def call(*args: Any, **kwargs: Any) -> Any:
            if name == "get_meta":
                return self._get_meta(args, kwargs)
            if name == "put":
                return self._put(args, kwargs)
            return self._call(name, args, kwargs)

        call.__name__ = call.__qualname__ = name
        return call

    @property
    def closed(self) -> bool:
        return self._closed

    def serving(self) -> bool:
        """True while the host this handle attached to still serves the store's name: False
        once this process closed it or shut Ray down, or the host ended (the owner closed the
        store, perhaps starting another of the same name since: this handle's calls would fail)."""
        if self._closed or not _ray().is_initialized():  # (Ray shut down: never start one here)
            return False
        host = find_store_host(self.name)
        return host is not None and host._actor_id == self._host._actor_id

    def close(self) -> None:
        """Detach (idempotent); in the owner, close the store and end its actors first, and
        return once the name is free again (an ``init`` of it starts a new store).  A host
        that is gone already is logged, not raised: nothing is left to close (the store's
        next open reconciles its files, as after a kill); so is a Ray this process shut down
        (nothing of Ray is started again)."""
        if self._closed:
            return
        self._closed = True
        if not self.owner:
            return
        ray = _ray()
        if not ray.is_initialized():  # (this process shut Ray down: a call here would start a new Ray)
            log.warning("%s: Ray was shut down before the store's close; nothing is closed from here", self._part)
            return
        try:
            self._ask(send(self._part, lambda: self._host.close.remote()))
        except DistributedError as e:
            log.warning("%s was gone before its close: %s", self._part, e)
        finally:
            try:
                ray.kill(self._host)
            except Exception:  # noqa: BLE001 - gone already
                log.debug("%s: its actor was gone at close", self._part)
            # ray.kill is asynchronous: wait until the name is free, so that an init of the same name
            # right after starts a new store rather than attach to this one as it dies
            if not _poll(lambda: find_store_host(self.name) is None, CLOSE_WAIT_S):
                log.warning("%s: its actor still holds its name %.0f s after the close", self._part, CLOSE_WAIT_S)

    def __reduce__(self) -> Tuple[Any, Tuple[Any, ...]]:
        """A copy is attached: only the process that started the host ends the store."""
        info = HostInfo(None if self.root is None else str(self.root), self.num_units, {}, "", self.host_node,
                        self.host_pid)
        return (_attached_copy, (self._host, self.name, info))

    def __enter__(self) -> "RemoteStore":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        role = "owner" if self.owner else "attached"
        return f"<RemoteStore {self.name!r} {self.root} ({self.num_units} units, {role}, {state})>"


def _attached_copy(host: Any, name: str, info: HostInfo) -> RemoteStore:
    """An unpickled :class:`RemoteStore`: attached (see :meth:`RemoteStore.__reduce__`)."""
    return RemoteStore(host, name, info, owner=False)


#: the store calls that take a path, and its parameter's name (first positional): made absolute in
#: the caller's directory before the call goes to the host, whose working directory is the Ray
#: worker's (a relative path would name another directory than the caller's)
PATH_ARGS = {"save_checkpoint": "checkpoint_dir", "load_checkpoint": "checkpoint_dir",
             "dump_data_by_key": "dump_dir", "load_data_by_key": "dump_dir", "recover_data_load": "dump_dir"}


def absolute_path(path: Any) -> Any:
    """``path`` (a str or path-like) as an absolute path string in this process's working
    directory, as :class:`~tqstore.store.Store` takes its root (symbolic links kept); any
    other value as it is (the store raises its error)."""
    if isinstance(path, (str, os.PathLike)):
        try:
            return str(Path(path).absolute())
        except (TypeError, ValueError, OSError):
            return path
    return path


def _absolute_path_arg(param: str, args: Tuple[Any, ...],
                       kwargs: Dict[str, Any]) -> Tuple[Tuple[Any, ...], Dict[str, Any]]:
    if args:
        return (absolute_path(args[0]),) + tuple(args[1:]), kwargs
    if param in kwargs:
        return args, dict(kwargs, **{param: absolute_path(kwargs[param])})
    return args, kwargs


def _unsendable(call: str, args: Tuple[Any, ...], kwargs: Dict[str, Any], part: str) -> Exception:
    """The UnsupportedTypeError for a call whose arguments Ray cannot pickle, naming the first
    argument that does not pickle (a generator, a lock, ...) by position or keyword."""
    from ray import cloudpickle

    named = [(f"argument {i + 1}", a) for i, a in enumerate(args)] + [(f"argument {k}=", v) for k, v in kwargs.items()]
    for label, value in named:
        try:
            cloudpickle.dumps(value)
        except Exception:  # noqa: BLE001 - any failure: this one cannot travel
            return UnsupportedTypeError(f"{call}: {label} ({type(value).__name__}) cannot be sent to {part}: it does "
                                        f"not pickle (pass lists, tensors, arrays and JSON values); nothing was "
                                        f"written")
    return UnsupportedTypeError(f"{call}: its arguments cannot be sent to {part} (they do not pickle); nothing was "
                                f"written")


def _part_name(name: str) -> str:
    """How errors name the store ``name`` (a :class:`~tqstore.errors.DistributedError`'s part)."""
    return f"Ray store {name!r}"


def _check_attach(name: str, info: HostInfo, path: Optional[str], options: Dict[str, Any], sampler: Any) -> None:
    """An attaching init's settings must be the store's: ConfigError naming each that differs."""
    diff = []
    if path is not None and (info.root is None or Path(absolute_path(path)).resolve() != Path(info.root).resolve()):
        diff.append(f"path {str(path)!r} (the store's: {info.root!r})")
    for k, v in sorted(options.items()):
        have = info.num_units if k == "num_units" else info.options.get(k)
        if v != have:
            diff.append(f"{k}={v!r} (the store's: {have!r})")
    asked = None if sampler is None else sampler_description(sampler)
    if asked is not None and asked != info.sampler:
        diff.append(f"sampler {asked} (the store's: {info.sampler})")
    if diff:
        raise ConfigError(f"{_part_name(name)} is open with other settings: {'; '.join(diff)}; attach with the "
                          f"same settings or none, or use another name")


def in_ray_worker() -> bool:
    """True in a Ray task or actor (a worker process of a cluster), False in a driver or
    without Ray; never imports ray (a worker has it imported)."""
    ray = sys.modules.get("ray")
    if ray is None:
        return False
    try:
        return bool(ray.is_initialized()) and ray.get_runtime_context().worker.mode == ray.WORKER_MODE
    except Exception:  # noqa: BLE001 - a partial or foreign "ray" module: not a worker
        return False


def connect(name: str = "default", path: Optional[str] = None, options: Optional[Dict[str, Any]] = None,
            sampler: Any = None, nodes: Optional[Sequence[str]] = None, *, attach_only: bool = False) -> RemoteStore:
    """The store called ``name`` on the Ray cluster of this process (``ray.init()`` first
    when Ray is not initialised): attached when its host runs, else started and opened with
    ``path``, ``options`` (:class:`~tqstore.store.Store`'s keyword arguments), ``sampler``
    and the parts placed on ``nodes`` (default: every alive node).  With ``attach_only``,
    a store that is not running is an error, never started here.

    Raises:
        ConfigError: ray is not installed; the running store was opened with other
            settings than those given (a store's settings are its starting process's);
            ``attach_only`` and no store of that name runs.
        What the store's open raises (the host is ended then).
    """
    ray = _ray()
    options = dict(options or {})
    if not ray.is_initialized():
        ray.init()
    host = find_store_host(name)
    if host is None and attach_only:
        raise ConfigError(
            f"no tqstore store is served on this Ray cluster under the name {name!r}, and this process is a Ray "
            f"task or actor: tq.init() here attaches to the store the driver serves. Start it first in the driver "
            f"with tq.init({{'backend': 'ray', ...}}), or pass {{'backend': 'embedded'}} for a store private to "
            f"this process")
    if host is None:
        check_nodes(nodes)  # (ConfigError before a host starts)
        try:
            host = start_store_host(name)
        except ValueError:  # another process started it meanwhile
            host = find_store_host(name)
        else:
            try:
                info = answer(host.open.remote(None if path is None else absolute_path(path), options, sampler,
                                               None if nodes is None else list(nodes)), _part_name(name))
            except BaseException:
                ray.kill(host)  # asynchronous: wait for the name to be free, as close() does, so that an
                # init of the same name right after starts a new store rather than find this dying one
                if not _poll(lambda: find_store_host(name) is None, CLOSE_WAIT_S):
                    log.warning("%s: its actor still holds its name %.0f s after a failed open", _part_name(name),
                                CLOSE_WAIT_S)
                raise
            log.info("started Ray store %r at %s (%d units) on node %s", name, info.root, info.num_units, info.node)
            return RemoteStore(host, name, info, owner=True)
    if host is None:
        raise StoreClosedError(f"{_part_name(name)} ended while this process attached to it")
    t0 = time.monotonic()
    info = answer(host.info.remote(ATTACH_WAIT_S), _part_name(name))
    _check_attach(name, info, path, options, sampler)
    log.info("attached to Ray store %r at %s (%.3f s)", name, info.root, time.monotonic() - t0)
    return RemoteStore(host, name, info, owner=False)


__all__ = ["RemoteStore", "RemoteHandle", "connect", "in_ray_worker", "ATTACH_WAIT_S"]
