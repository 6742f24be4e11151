"""tqstore on a Ray cluster (docs: DESIGN.md §5b): units and the controller as actors that
implement the same ports as the embedded objects.

What is here so far is the port layer: :mod:`tqstore.ray.port_actor` hosts units and
controllers in an actor (:func:`start_host`) and reaches them as
:class:`~tqstore.ports.UnitPort` / :class:`~tqstore.ports.ControllerPort` from any process
of the cluster (:class:`ActorUnit`, :class:`ActorController`).  ``init({"backend": "ray"})``
(the store placed over such actors, owner-distributed checkpoints) builds on it and is not
here yet.

Ray is an optional dependency (``pip install 'tqstore[ray]'``): this package imports it
only when a function here is called, and raises ConfigError when it is not installed.
"""
from __future__ import annotations

from .port_actor import ActorController, ActorPort, ActorUnit, start_host

__all__ = ["ActorController", "ActorPort", "ActorUnit", "start_host"]
