"""The embedded backend: a store's parts as objects in this process, and readers of the
parts' own files that answer values.

The one module through which the engine over the ports reaches the implementations
(docs: DESIGN.md §1): :func:`open_parts` constructs the :class:`~tqstore.controller.Controller`
and the :class:`~tqstore.unit.Unit` objects that :class:`~tqstore.store.Store` then uses only
through :class:`~tqstore.ports.ControllerPort` and :class:`~tqstore.ports.UnitPort`; the
readers decode the LMDB indexes of a checkpoint (or of a store's state directory) with the
parts' own decoders and answer plain values, for checkpoint verification and the CLI.
Nothing here decides policy.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from ._format.lmdb_pages import LmdbPageError
from ._io.lmdbenv import check_env_pages
from .controller import Controller
from .controller_export import partition_counts, read_controller, read_controller_counts
from .ports import ControllerPort, UnitPort
from .unit import DEFAULT_SEGMENT_BYTES, Unit, check_index_format
from .unit_import import read_unit_index
from .unit_recover import recovery_losses  # noqa: F401 - re-exported (the CLI's check before an open)


def open_controller(controller_dir: Path, *, num_units: int, durability: str,
                    map_bytes: Optional[int]) -> ControllerPort:
    """Open (or create) the controller in ``controller_dir`` (every entry decoded and checked).

    Raises CorruptionError / FormatVersionError for a damaged or foreign index; a failed open
    leaves nothing open."""
    return Controller(controller_dir, num_units=num_units, sync=durability == "commit", map_bytes=map_bytes)


def open_unit(unit_dir: Path, unit_id: int, *, durability: str = "checkpoint", segment_bytes: int = DEFAULT_SEGMENT_BYTES,
              compress=None, map_bytes: Optional[int] = None, stride: int = 1) -> UnitPort:
    """Open (or create) unit ``unit_id`` in ``unit_dir`` (:class:`~tqstore.unit.Unit`: its
    index recovered, its segments' torn tails cut).  Raises what the open raises."""
    return Unit(unit_dir, unit_id, durability=durability, segment_bytes=segment_bytes, compress=compress,
                map_bytes=map_bytes, stride=stride)


def open_parts(controller_dir: Path, unit_dirs: List[Path], *, durability: str, segment_bytes: int, compress,
               map_bytes: Optional[int], controller: Optional[ControllerPort] = None,
               unit_opener: Callable[..., UnitPort] = open_unit,
               controller_opener: Callable[..., ControllerPort] = open_controller
               ) -> Tuple[ControllerPort, List[UnitPort]]:
    """Open (or create) the controller in ``controller_dir`` and unit ``i`` in ``unit_dirs[i]``
    (by ``controller_opener`` and ``unit_opener``, which take the arguments of
    :func:`open_controller` and :func:`open_unit`: another backend's openers).

    ``controller``: one already opened on ``controller_dir`` (:func:`open_controller`), used
    as it is; on a failure it stays open (its opener closes it).  Raises ConfigError when the
    controller records another unit count; a failed open leaves nothing it opened open."""
    from .errors import ConfigError

    given = controller is not None
    if controller is None:
        controller = controller_opener(controller_dir, num_units=len(unit_dirs), durability=durability,
                                       map_bytes=map_bytes)
    units: List[UnitPort] = []
    try:
        if controller.num_units != len(unit_dirs):
            raise ConfigError(f"controller of {Path(controller_dir).parent} says {controller.num_units} units, "
                              f"STORE.json says {len(unit_dirs)}")
        for i, d in enumerate(unit_dirs):
            units.append(unit_opener(d, i, durability=durability, segment_bytes=segment_bytes, compress=compress,
                                     map_bytes=map_bytes, stride=len(unit_dirs)))
    except BaseException:
        for u in units:
            u.close()
        if not given:
            controller.close()
        raise
    return controller, list(units)


class EmbeddedParts:
    """How a :class:`~tqstore.store.Store` opens its parts by default: as objects in this
    process (:func:`open_controller`, :func:`open_parts`).  Another backend gives the store an
    object with the same methods (``tqstore.ray.RayParts``: the parts as Ray actors); the
    store calls ``close()`` after it closed its parts."""

    name = "embedded"

    @staticmethod
    def open_controller(controller_dir: Path, *, num_units: int, durability: str,
                        map_bytes: Optional[int]) -> ControllerPort:
        return open_controller(controller_dir, num_units=num_units, durability=durability, map_bytes=map_bytes)

    @staticmethod
    def open_parts(controller_dir: Path, unit_dirs: List[Path], *, durability: str, segment_bytes: int, compress,
                   map_bytes: Optional[int], controller: Optional[ControllerPort] = None
                   ) -> Tuple[ControllerPort, List[UnitPort]]:
        return open_parts(controller_dir, unit_dirs, durability=durability, segment_bytes=segment_bytes,
                          compress=compress, map_bytes=map_bytes, controller=controller)

    @staticmethod
    def close() -> None:
        """Nothing outlives the parts in this process."""


def index_unchecked(env_dir: Path, schema: str) -> Optional[str]:
    """Why the LMDB file of ``env_dir`` (a checkpoint's controller or unit index, ``schema``
    ``"controller"`` or ``"unit_index"``) may not be mapped yet, or None when every page LMDB
    can reach in it read checked and every entry has the shape its schema requires
    (:func:`tqstore._io.lmdbenv.check_env_pages`: this process's own read-only map, never
    LMDB's), so that this process may open it.  A reason means: walk it out of process first
    (another layout, a free list that is not empty, damage).  Raises nothing."""
    try:
        check_env_pages(env_dir, schema)
    except (LmdbPageError, OSError) as e:
        return str(e) or type(e).__name__
    return None


def unit_index_entries(env_dir: Path) -> Tuple[Any, bytes, Dict[int, int]]:
    """A checkpoint's unit index copy (checked first, in process or by a walk): ``(keys, concatenated
    LOC values, {segment: recorded size})``.  Raises FormatVersionError, or a TqstoreError /
    ValueError / KeyError / TypeError when it cannot be read (see
    :func:`tqstore.unit_import.read_unit_index`)."""
    return read_unit_index(env_dir, check_format=check_index_format)


def controller_summary(ctrl_dir: Path, *, shared: bool = False) -> Dict[str, Any]:
    """Every entry of a controller index decoded and checked; its summary (see
    :func:`tqstore.controller_export.read_controller`)."""
    return read_controller(ctrl_dir, shared=shared)


def controller_counts(ctrl_dir: Path) -> Dict[str, int]:
    """A controller index's unit and row counts, its entries not decoded (see
    :func:`tqstore.controller_export.read_controller_counts`)."""
    return read_controller_counts(ctrl_dir)


def controller_partition_counts(ctrl_dir: Path) -> Optional[Dict[str, int]]:
    """Rows per partition, read leniently; None when unreadable."""
    return partition_counts(ctrl_dir)


__all__ = ["DEFAULT_SEGMENT_BYTES", "open_parts", "open_controller", "index_unchecked", "unit_index_entries",
           "recovery_losses",
           "controller_summary", "controller_counts", "controller_partition_counts"]
