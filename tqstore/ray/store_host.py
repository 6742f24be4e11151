"""A whole store served by a named Ray actor: what ``tq.init({"backend": "ray"})`` starts or
finds (the client side is :mod:`tqstore.ray.remote_store`).

:class:`StoreHost` opens ``Store(path, parts=RayParts(), ...)`` in its own process: the
store's lock, its write lock, its controller and the checkpoint machinery live there, and
its units and controller are actors of their own (:class:`~tqstore.ray.parts.RayParts`,
spread over the cluster's nodes; actors this host starts, so they end with it).  It is
named ``store_name(name)`` in the namespace :data:`NAMESPACE`, so every process of the
cluster (driver, task or actor) finds it by name; it is threaded (calls of different
clients run side by side, as the store's own threads allow) and asks for no CPU.

A call is a store method of :data:`STORE_CALLS`, its arguments and answer pickled by Ray
(batches, TensorDicts, ``BatchMeta``), the framework's tensors as numpy arrays of their
bytes on the way (the store's edge: ``to_wire`` / ``from_wire``, about ten times cheaper
than pickling a batch of small tensors).  A checkpoint save or dump started with
``blocking=False`` stays in the host; the caller gets a :class:`HandleRef` and asks the
host about it (:meth:`StoreHost.handle`).  The payload of a put or get passes through this
host on its way to or from the unit actors (one hop more than an embedded store).
"""
from __future__ import annotations

import itertools
import logging
import os
import threading
import warnings
from dataclasses import dataclass
from typing import Any, Dict, Optional, Sequence, Tuple

from ..checkpoint.writer import SaveHandle
from ..edge import default_edge
from ..errors import ConfigError, InvalidInputError, StoreClosedError
from ..samplers import describe_sampler as sampler_description
from ..store import Store
from .parts import RayParts

log = logging.getLogger("tqstore")

#: the Ray namespace of every store host
NAMESPACE = "tqstore"
#: calls of one host running side by side (Ray's ``max_concurrency``)
STORE_HOST_CONCURRENCY = 32
#: the store methods a host answers: the data plane (every call the module API and a client
#: forward, ``tqstore.client.FORWARDED``) and what they add (checkpoints, dumps, tag writes)
STORE_CALLS = frozenset({
    "get_meta", "put", "get_data", "clear_partition", "clear_samples", "get_consumption_status",
    "get_production_status", "check_consumption_status", "check_production_status", "reset_consumption",
    "get_partition_list", "kv_put", "kv_batch_put", "kv_batch_get", "kv_batch_get_by_meta", "kv_list", "kv_clear",
    "write", "save_checkpoint", "load_checkpoint", "dump_data_by_key", "load_data_by_key", "recover_data_load",
    "set_sampler", "set_custom_meta", "kv_retrieve_meta", "kv_retrieve_keys", "verify", "compact",
    "first_batch_index", "rows_per_fetch",
})
#: the methods of a non-blocking save's or dump's handle a caller may ask for
HANDLE_CALLS = frozenset({"done", "wait", "result", "exception", "claim"})
#: the methods of a CheckpointManager that run in the host, beside its store (the others only read the root)
MANAGER_CALLS = frozenset({"save", "restore", "wait_until_finished"})
#: finished save and dump handles a host keeps for its callers to ask about (the oldest are dropped first)
FINISHED_HANDLES_KEPT = 256


def store_defaults() -> Dict[str, Any]:
    """The keyword arguments of :class:`~tqstore.store.Store` with their defaults (what a store
    opened without one of them uses)."""
    import inspect

    return {k: p.default for k, p in inspect.signature(Store.__init__).parameters.items()
            if p.default is not inspect.Parameter.empty and k not in ("path", "parts", "edge")}


def _import_edge(result_type: Optional[str]) -> None:
    try:
        default_edge(result_type)
    except Exception:  # noqa: BLE001 - the store's open makes it again and raises what fails
        log.debug("importing the default edge ahead of the open failed", exc_info=True)


def store_name(name: str) -> str:
    """The actor name of the store host called ``name``."""
    if not isinstance(name, str) or not name or len(name) > 200:
        raise ConfigError(f"the name of a Ray store must be a non-empty str of at most 200 characters, got {name!r}")
    return f"store:{name}"


@dataclass(frozen=True)
class HandleRef:
    """A non-blocking save or dump running in a host: its id there, and what its handle
    says at once (``kind``: ``"SaveHandle"`` or ``"DumpHandle"``; ``path``; ``stall_s``)."""

    hid: int
    kind: str
    path: str
    stall_s: float


@dataclass(frozen=True)
class Warned:
    """A host call's answer with the warnings it raised there (``(category, message)`` each),
    for the caller to raise again in its own process."""

    value: Any
    warnings: Tuple[Tuple[type, str], ...]


@dataclass(frozen=True)
class HostInfo:
    """What a client checks and shows of a host: its store's directory, unit count and
    options (every keyword of :class:`~tqstore.store.Store`: those it was opened with, the
    defaults for the others), its sampler (:func:`sampler_description`), and the node and
    process it runs in."""

    root: Optional[str]
    num_units: int
    options: Dict[str, Any]
    sampler: str
    node: str
    pid: int


class StoreHost:
    """One store, served to the cluster (see the module docstring).  ``path`` and
    ``options`` are :class:`~tqstore.store.Store`'s (``parts`` excepted: the parts are
    :class:`~tqstore.ray.parts.RayParts` with ``nodes``); ``sampler``, if given, is set."""

    def __init__(self) -> None:
        self._store: Optional[Store] = None
        self._options: Dict[str, Any] = {}
        self._handles: Dict[int, SaveHandle] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._tried = threading.Event()  # set once open() has succeeded or failed

    def open(self, path: Optional[str], options: Dict[str, Any], sampler: Any = None,
             nodes: Optional[Sequence[str]] = None) -> HostInfo:
        """Open the store (once; a separate call from the actor's start, so that what the
        open raises reaches the caller as itself); its :class:`HostInfo`."""
        with self._lock:
            if self._store is not None or self._tried.is_set():
                raise ConfigError("this store host has opened its store already")
            try:
                if "parts" in options:
                    raise ConfigError("a Ray store host opens its own parts (RayParts); 'parts' cannot be given")
                # the store makes its edge (importing torch, and tensordict for its result type: seconds)
                # once its parts are open: imported meanwhile, while the parts' actors start.  Only what
                # that edge imports, so nothing is left importing beside the store's first calls.
                threading.Thread(target=_import_edge, args=(options.get("result_type"),), daemon=True,
                                 name="tqstore-import").start()
                store = Store(path, parts=RayParts(nodes=nodes), **options)
                try:
                    if sampler is not None:
                        store.set_sampler(sampler)
                except BaseException:
                    store.close()
                    raise
                self._store, self._options = store, {**store_defaults(), **options}
            finally:
                self._tried.set()
        return self.info()

    def _opened(self) -> Store:
        if self._store is None:
            raise StoreClosedError("this store host has not opened a store (its open failed or has not run)")
        return self._store

    def info(self, wait_s: float = 0.0) -> HostInfo:
        """The :class:`HostInfo`, once the store is open (waiting up to ``wait_s`` seconds
        for the open that started the host).  StoreClosedError when it is not open."""
        if not self._tried.wait(wait_s):
            raise StoreClosedError(f"this store host has not finished opening its store after {wait_s:g} s (its "
                                   f"owner's open is still running)")
        store = self._opened()
        try:
            import ray

            node = ray.get_runtime_context().get_node_id()
        except Exception:  # noqa: BLE001 - not in a Ray worker (tests of the host's own logic)
            node = ""
        root = None if store.root is None else str(store.root)
        return HostInfo(root, store.num_units, dict(self._options), sampler_description(store.sampler), node,
                        os.getpid())

    def call(self, name: str, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        """``store.<name>(*args, **kwargs)`` for a name of :data:`STORE_CALLS`; a save or
        dump handle comes back as a :class:`HandleRef`.  InvalidInputError for another name."""
        if name not in STORE_CALLS:
            raise InvalidInputError(f"{name!r} is not a call a Ray store answers (one of {sorted(STORE_CALLS)})")
        store = self._opened()
        edge = store.edge
        out = getattr(store, name)(*edge.from_wire(args), **edge.from_wire(kwargs))
        return self._ref(out) if isinstance(out, SaveHandle) else edge.to_wire(out)

    def checkpoint_manager(self, root: str, options: Dict[str, Any], name: str, args: Tuple[Any, ...],
                           kwargs: Dict[str, Any]) -> Any:
        """``CheckpointManager(root, store=<this store>, **options).<name>(*args, **kwargs)`` for a
        name of :data:`MANAGER_CALLS` (the calls that need the store in process: a save's cut, a
        background save's wait, a restore's loads); a save handle comes back as a :class:`HandleRef`,
        and an answer whose call warned as a :class:`Warned`."""
        if name not in MANAGER_CALLS:
            raise InvalidInputError(f"{name!r} is not a CheckpointManager call a Ray store runs "
                                    f"(one of {sorted(MANAGER_CALLS)})")
        from ..checkpoint.manager import CheckpointManager

        with warnings.catch_warnings(record=True) as seen:  # (e.g. a restore's CheckpointFallbackWarning)
            warnings.simplefilter("always")
            out = getattr(CheckpointManager(root, store=self._opened(), **options), name)(*args, **kwargs)
        out = self._ref(out) if isinstance(out, SaveHandle) else out
        return Warned(out, tuple((w.category, str(w.message)) for w in seen)) if seen else out

    def _ref(self, h: SaveHandle) -> HandleRef:
        """Keep ``h`` for its callers' questions; finished handles beyond FINISHED_HANDLES_KEPT
        are dropped, oldest first (a running one never is)."""
        with self._lock:
            hid = next(self._ids)
            self._handles[hid] = h
            finished = [k for k, v in self._handles.items() if v.done()]
            for k in finished[:max(0, len(finished) - FINISHED_HANDLES_KEPT)]:
                del self._handles[k]
        return HandleRef(hid, type(h).__name__, str(h.path), float(h.stall_s))

    def handle(self, hid: int, name: str, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        """``handle.<name>(...)`` of the save or dump ``hid`` (:data:`HANDLE_CALLS`)."""
        if name not in HANDLE_CALLS:
            raise InvalidInputError(f"{name!r} is not a method of a save or dump handle")
        h = self._handles.get(hid)
        if h is None:
            raise InvalidInputError(f"no save or dump {hid} in this store host (unknown, or finished and dropped "
                                    f"after {FINISHED_HANDLES_KEPT} later ones)")
        return getattr(h, name)(*args, **kwargs)

    def forget(self, hid: int) -> None:
        """Drop the handle ``hid`` once finished (its caller's handle is gone)."""
        with self._lock:
            h = self._handles.get(hid)
            if h is not None and h.done():
                del self._handles[hid]

    def close(self) -> None:
        """Close the store (idempotent): a running save or dump ends first, then the parts'
        actors."""
        if self._store is not None:
            self._store.close()


def start_store_host(name: str) -> Any:
    """Start the named host of store ``name``, with no store open yet (:meth:`StoreHost.open`
    opens it), on the caller's node (the store's own files are there, where the caller's
    paths point; the parts go to ``ray.nodes``).  The caller owns it: it ends with the
    caller's process, or with ``ray.kill``.  Raises ValueError when a host of that name
    exists already (Ray's error)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=False)
    actor = ray.remote(StoreHost).options(name=store_name(name), namespace=NAMESPACE, num_cpus=0,
                                          max_concurrency=STORE_HOST_CONCURRENCY,  # (store_name: ConfigError first)
                                          scheduling_strategy=here)
    return actor.remote()


def find_store_host(name: str) -> Any:
    """The host of store ``name``, or None when there is none."""
    import ray

    actor = store_name(name)  # (its ConfigError is not "no such actor")
    try:
        return ray.get_actor(actor, namespace=NAMESPACE)
    except ValueError:
        return None


__all__ = ["StoreHost", "HandleRef", "HostInfo", "NAMESPACE", "STORE_CALLS", "HANDLE_CALLS", "MANAGER_CALLS",
           "store_name", "sampler_description", "store_defaults", "start_store_host", "find_store_host"]
