"""A store's controller and units opened as Ray actors: :class:`RayParts`, the ``parts``
of a :class:`~tqstore.store.Store` (``Store(path, parts=RayParts())``).

Each part gets a :class:`~tqstore.ray.port_actor.PortHost` of its own, placed on a node of
the cluster when the part is first opened (round robin over ``nodes``, default every alive
node, in the order Ray lists them; hard node affinity), and opens its directory there: a
unit's files are on the disk of the node its actor runs on.  The part keeps that actor for
the store's life: a load opens the new state's unit ``i`` in unit ``i``'s actor (no actor
starts, nothing moves to another node), and the store's close ends them all
(:meth:`RayParts.close`).  One RayParts serves one store.  The store itself
(``STORE.json``, ``CURRENT``, its lock, the write lock that serialises puts, and the
checks of a checkpoint's files) stays with the process that opened it, so that process
drives the store; its directory and the checkpoint directories must be reachable by the
same path from every node the parts run on (one machine, or a shared file system): the
open checks that each part's node reads the store's ``STORE.json`` as the opener does, and
raises ConfigError otherwise.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

from ..embedded import open_parts
from ..errors import ConfigError, DistributedError
from ..ports import ControllerPort, UnitPort
from .._format.store_files import STORE_FILE
from .port_actor import ActorController, ActorUnit, _ray, answer, send, start_host


def check_nodes(nodes: Optional[Sequence[str]]) -> None:
    """ConfigError unless each of ``nodes`` is the id of an alive node of this process's Ray
    cluster (``ray.nodes()``); None (every alive node) passes."""
    if nodes is None:
        return
    alive = {n["NodeID"] for n in _ray().nodes() if n.get("Alive")}
    bad = [n for n in nodes if n not in alive]
    if bad:
        raise ConfigError(f"ray.nodes: {bad[:5]!r} {'is not the id' if len(bad) == 1 else 'are not ids'} of an "
                          f"alive node of this Ray cluster (alive: {sorted(alive)[:8]!r}; see ray.nodes())")


class RayParts:
    """Opens a store's parts as Ray actors (see the module docstring).  ``host_options`` go
    to :func:`~tqstore.ray.port_actor.start_host` (Ray actor options) for every part."""

    name = "ray"
    #: the parts answer from other processes: a call costs a round trip, not this process's CPU,
    #: so a read calls the units and reads the fields at once (:func:`tqstore.reader.read_fields`)
    remote = True

    def __init__(self, *, nodes: Optional[Sequence[str]] = None, **host_options: Any) -> None:
        self._nodes = list(nodes) if nodes else None
        self._host_options = host_options
        self._hosts: Dict[str, Any] = {}  # part ("controller", "unit 3") -> its host actor
        self._placed: Dict[str, str] = {}  # part -> the node its host was placed on
        self._dead: Set[str] = set()  # nodes a host could not start on (died before Ray marked them dead)

    def _host(self, part: str) -> Any:
        """The host of ``part``: the one it had, or a new one on the next node."""
        host = self._hosts.get(part)
        if host is None:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            ray = _ray()
            nodes = self._nodes or [n["NodeID"] for n in ray.nodes()
                                    if n.get("Alive") and n["NodeID"] not in self._dead]
            if not nodes:
                raise DistributedError(f"{part}: no alive node of this Ray cluster to place it on (nodes its actor "
                                       f"could not start on: {sorted(self._dead)[:5]!r})",
                                       outcomes={part: "unreachable: no node"})
            node = nodes[len(self._hosts) % len(nodes)]  # (the parts placed so far)
            host = self._hosts[part] = start_host(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node, soft=False), **self._host_options)
            self._placed[part] = node
        return host

    def _start(self, parts: List[str]) -> None:
        """Start the hosts of ``parts`` not started yet and wait until each answers.  A host whose
        node died before Ray marked it dead (Ray lists a lost node as alive until its health
        checks fail, some seconds: a reopen right after a node loss placed a part there, and it
        never started) is placed again on another alive node, unless ``nodes`` were given; then,
        or when no node is left, DistributedError names the part, its node and what to do."""
        new = [p for p in parts if p not in self._hosts]
        last: Optional[DistributedError] = None
        while new:
            for p in new:
                try:
                    self._host(p)
                except DistributedError as e:
                    if last is None:
                        raise
                    raise DistributedError(f"{e}; the last start failed with: {last}", outcomes=e.outcomes) from last
            refs = {p: send(p, lambda h=self._hosts[p]: h.where.remote()) for p in new}  # (all at once)
            failed: Dict[str, DistributedError] = {}
            for p, ref in refs.items():
                try:
                    answer(ref, p)
                except DistributedError as e:
                    failed[p] = e
            for p in failed:
                _ray().kill(self._hosts.pop(p))
                self._dead.add(self._placed.pop(p))
            if failed and self._nodes is not None:
                e = next(iter(failed.values()))
                raise DistributedError(
                    f"{', '.join(failed)} could not start on node(s) {sorted(self._dead)[:5]!r} named in ray.nodes "
                    f"({e}); a node that died stays listed as alive until Ray's health checks fail: open the store "
                    f"again once ray.nodes() shows it dead, or name alive nodes", outcomes=e.outcomes) from e
            new = list(failed)
            last = next(iter(failed.values()), None)

    def open_controller(self, controller_dir: Path, *, num_units: int, durability: str,
                        map_bytes: Optional[int]) -> ControllerPort:
        return ActorController(self._host("controller"), str(controller_dir), num_units, durability=durability,
                               map_bytes=map_bytes)

    def open_unit(self, unit_dir: Path, unit_id: int, **kwargs: Any) -> UnitPort:
        return ActorUnit(self._host(f"unit {unit_id}"), str(unit_dir), unit_id, **kwargs)

    def open_parts(self, controller_dir: Path, unit_dirs: List[Path], *, durability: str, segment_bytes: int,
                   compress, map_bytes: Optional[int], controller: Optional[ControllerPort] = None
                   ) -> Tuple[ControllerPort, List[UnitPort]]:
        """As :func:`tqstore.embedded.open_parts`, each part an actor.  The actors of the parts
        not started yet start first, all at once (a start returns before its process has
        booted), in the order the parts open, so they are placed as one by one."""
        if not self._hosts:
            check_nodes(self._nodes)
        self._start(["controller", *[f"unit {i}" for i in range(len(unit_dirs))]])
        self._check_shared(Path(controller_dir).parent.parent)
        return open_parts(controller_dir, unit_dirs, durability=durability, segment_bytes=segment_bytes,
                          compress=compress, map_bytes=map_bytes, controller=controller,
                          unit_opener=self.open_unit, controller_opener=self.open_controller)

    def _check_shared(self, root: Path) -> None:
        """ConfigError unless every part's node sees the store directory ``root`` as this
        process does (its ``STORE.json``, which holds the store's creation time, byte for
        byte): a node-local directory of the same path would open an empty store there (a
        reopen with the parts on other nodes showed an empty store, and every save failed
        with "No such file")."""
        mine = root / STORE_FILE
        try:
            want = mine.read_bytes()
        except OSError:
            return  # (no store directory here: nothing to compare)
        parts = list(self._hosts)
        refs = [send(p, lambda h=self._hosts[p]: h.read_small.remote(str(mine))) for p in parts]  # (all at once)
        bad = [p for p, ref in zip(parts, refs) if answer(ref, p) != want]
        if bad:
            where = [answer(send(p, lambda h=self._hosts[p]: h.where.remote()), p)[0] for p in bad]
            raise ConfigError(f"{', '.join(bad)} of store {root} run on node(s) {sorted(set(where))} that do not see "
                              f"{mine} as this process does (missing or another store's): the store's directory must "
                              f"be on a file system every node of its parts shares, by the same path")

    def close(self) -> None:
        """End every part's actor (after the store closed its parts; idempotent)."""
        ray = _ray()
        hosts, self._hosts, self._placed = list(self._hosts.values()), {}, {}
        for host in hosts:
            ray.kill(host)


__all__ = ["RayParts"]
