"""tqstore on a Ray cluster (docs: DESIGN.md §5b): units and the controller as actors that
implement the same ports as the embedded objects, and a whole store served to the cluster.

* :mod:`tqstore.ray.port_actor` hosts units and controllers in an actor
  (:func:`start_host`) and reaches them as :class:`~tqstore.ports.UnitPort` /
  :class:`~tqstore.ports.ControllerPort` from any process of the cluster
  (:class:`ActorUnit`, :class:`ActorController`).
* :class:`RayParts` (:mod:`tqstore.ray.parts`) opens a store's parts that way, one actor
  each, spread over the nodes: ``Store(path, parts=RayParts())`` runs the whole engine (data
  plane, checkpoints whose files each unit writes itself, loads, dumps) over actors, driven
  by the process that opened it.
* ``tq.init({"backend": "ray"})`` (:func:`tqstore.ray.remote_store.connect`) serves such a
  store from a named actor (:mod:`tqstore.ray.store_host`) that the first process starts
  and every other process of the cluster attaches to by name.  The payload of a put or get
  passes through that actor on its way to the units; writes from clients straight to the
  units, the cut and a load's decision in the controller actor, and node-local unit
  directories are not built yet: the store's paths must be the same on every node its
  actors run on (one machine, or a shared file system).

Ray is an optional dependency (``pip install 'tqstore[ray]'``): this package imports it
only when a function here is called, and raises ConfigError when it is not installed.
"""
from __future__ import annotations

from .parts import RayParts
from .port_actor import ActorController, ActorPort, ActorUnit, start_host
from .remote_store import RemoteStore, connect

__all__ = ["ActorController", "ActorPort", "ActorUnit", "RayParts", "RemoteStore", "connect", "start_host"]
