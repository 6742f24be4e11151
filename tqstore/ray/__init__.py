"""tqstore on a Ray cluster (docs: DESIGN.md §5b): units and the controller as actors that
implement the same ports as the embedded objects.

What is here so far: the port layer, :mod:`tqstore.ray.port_actor`, hosts units and
controllers in an actor (:func:`start_host`) and reaches them as
:class:`~tqstore.ports.UnitPort` / :class:`~tqstore.ports.ControllerPort` from any process
of the cluster (:class:`ActorUnit`, :class:`ActorController`); :class:`RayParts`
(:mod:`tqstore.ray.parts`) opens a store's parts that way, one actor each, spread over the
nodes, so that ``Store(path, parts=RayParts())`` runs the whole engine (data plane,
checkpoints whose files each unit writes itself, loads, dumps) over actors, driven by the
one process that opened it.  ``init({"backend": "ray"})`` (clients attaching from any
process, the cut and the load's decision in the controller actor) builds on it and is not
here yet.

Ray is an optional dependency (``pip install 'tqstore[ray]'``): this package imports it
only when a function here is called, and raises ConfigError when it is not installed.
"""
from __future__ import annotations

from .parts import RayParts
from .port_actor import ActorController, ActorPort, ActorUnit, start_host

__all__ = ["ActorController", "ActorPort", "ActorUnit", "RayParts", "start_host"]
