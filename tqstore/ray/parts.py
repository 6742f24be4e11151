"""A store's controller and units opened as Ray actors: :class:`RayParts`, the ``parts``
of a :class:`~tqstore.store.Store` (``Store(path, parts=RayParts())``).

Each part gets a :class:`~tqstore.ray.port_actor.PortHost` of its own, placed on a node of
the cluster (round robin over ``nodes``, default every alive node, in the order Ray lists
them; hard node affinity), and opens its directory there: a unit's files are on the disk
of the node its actor runs on.  Closing a part's port ends its actor.  The store itself
(``STORE.json``, ``CURRENT``, its lock, the write lock that serialises puts, and the
checks of a checkpoint's files) stays with the process that opened it, so that process
drives the store; its directory and the checkpoint directories must be reachable by the
same path from every node the parts run on (one machine, or a shared file system).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, List, Optional, Sequence, Tuple

from ..embedded import open_parts
from ..ports import ControllerPort, UnitPort
from .port_actor import ActorController, ActorUnit, _ray, start_host


class RayParts:
    """Opens a store's parts as Ray actors (see the module docstring).  ``host_options`` go
    to :func:`~tqstore.ray.port_actor.start_host` (Ray actor options) for every part."""

    name = "ray"

    def __init__(self, *, nodes: Optional[Sequence[str]] = None, **host_options: Any) -> None:
        self._nodes = list(nodes) if nodes else None
        self._host_options = host_options
        self._next = 0

    def _placed(self, make):
        """``make(host)`` with a new host on the next node; the host ends if ``make`` fails."""
        ray = _ray()
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        nodes = self._nodes or [n["NodeID"] for n in ray.nodes() if n.get("Alive")]
        node = nodes[self._next % len(nodes)]
        self._next += 1
        host = start_host(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node, soft=False),
                          **self._host_options)
        try:
            return make(host)
        except BaseException:
            ray.kill(host)
            raise

    def open_controller(self, controller_dir: Path, *, num_units: int, durability: str,
                        map_bytes: Optional[int]) -> ControllerPort:
        return self._placed(lambda h: ActorController(h, str(controller_dir), num_units, owns_host=True,
                                                      durability=durability, map_bytes=map_bytes))

    def open_unit(self, unit_dir: Path, unit_id: int, **kwargs: Any) -> UnitPort:
        return self._placed(lambda h: ActorUnit(h, str(unit_dir), unit_id, owns_host=True, **kwargs))

    def open_parts(self, controller_dir: Path, unit_dirs: List[Path], *, durability: str, segment_bytes: int,
                   compress, map_bytes: Optional[int], controller: Optional[ControllerPort] = None
                   ) -> Tuple[ControllerPort, List[UnitPort]]:
        """As :func:`tqstore.embedded.open_parts`, each part an actor."""
        return open_parts(controller_dir, unit_dirs, durability=durability, segment_bytes=segment_bytes,
                          compress=compress, map_bytes=map_bytes, controller=controller,
                          unit_opener=self.open_unit, controller_opener=self.open_controller)


__all__ = ["RayParts"]
