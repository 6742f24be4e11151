"""The line between the engine and the framework its users hold (torch, TensorDict).

The engine works on numpy arrays, lists of values and bytes.  Everything that knows a
framework is behind one :class:`Edge` object that the store is given: it turns a user's
batch into :class:`~tqstore._format.columns.Column` inputs, allocates the read path's
outputs (it is the reader's :class:`~tqstore._format.columns.Allocator`), wraps results
and status arrays in the user's types, and names dtypes in schemas.

:class:`NumpyEdge` is the framework-free edge (numpy in, numpy and lists out, plain dicts).
``import tqstore`` registers the default edge factory with :func:`set_default_factory`: it
imports the torch adapter (:mod:`tqstore.torch_adapter`) on first use; a ``Store`` opened
without an ``edge`` takes ``default_edge(result_type)``.  The engine never imports the adapter.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ._format import dtypes
from ._format.columns import NUMPY, Column, NumpyAllocator, to_column
from ._format.layout import KIND_VALUE
from .errors import ConfigError, InvalidInputError

try:  # Python 3.8+: typing.Protocol
    from typing import Protocol
except ImportError:  # pragma: no cover
    from typing_extensions import Protocol  # type: ignore

#: result types a store may give: "tensordict" (TransferQueue's), "dict" (a plain mapping)
RESULT_TYPES = ("tensordict", "dict")


class Edge(Protocol):
    """What the engine needs from the framework adapter (see the module docstring).

    ``alloc`` is the reader's allocator; the other methods convert inputs and outputs."""

    alloc: Any
    result_type: str

    def items(self, data: Any) -> List[Tuple[Any, Any]]:
        """``(name, batched value)`` of a user batch (a mapping; InvalidInputError otherwise)."""

    def batch_len(self, value: Any) -> int:
        """Rows of one batched value (TypeError when it has no batch dimension)."""

    def to_column(self, field: str, value: Any, n: int) -> Column:
        """``value``'s ``n`` rows as a Column (views of the caller's memory)."""

    def single_row(self, name: str, value: Any) -> Any:
        """One row's value (``kv_put``) as a batch of one row."""

    def is_batch(self, value: Any) -> bool:
        """True for a framework batch object (a TensorDict) taken whole, without a batch-of-one wrap."""

    def take(self, value: Any, idx: List[int]) -> Any:
        """Rows ``idx`` of a batched value (a put split across partitions)."""

    def result(self, data: Dict[str, Any], n: int) -> Any:
        """A read's ``{field: batched value}`` of ``n`` rows in the result type."""

    def status(self, array: np.ndarray) -> Any:
        """A status array (global indexes, consumed or produced flags) in the user's tensor type."""

    def dtype(self, kind: int, code: int) -> Any:
        """The dtype a schema names for a field of ``kind`` and dtype ``code`` (None for values)."""

    def to_wire(self, value: Any) -> Any:
        """``value`` (a call's arguments or answer, crossing a process boundary) with the
        framework's objects replaced by plain ones that pickle cheaply (numpy arrays of their
        bytes); :meth:`from_wire` gives them back, equal in dtype, shape and values."""

    def from_wire(self, value: Any) -> Any:
        """The inverse of :meth:`to_wire` (what it did not replace is returned as it is)."""


def take_rows(value: Any, idx: List[int]) -> Any:
    """Rows ``idx`` of a numpy array or a list; anything else is returned as it is (the column
    conversion rejects it with a clear error)."""
    if isinstance(value, np.ndarray):
        return value[idx]
    if isinstance(value, (list, tuple)):
        return [value[i] for i in idx]
    return value


class NumpyEdge:
    """The framework-free edge: numpy arrays and lists in, numpy arrays, lists and dicts out."""

    alloc: NumpyAllocator = NUMPY

    def __init__(self, result_type: str = "dict") -> None:
        if result_type != "dict":
            raise ConfigError(f"the numpy edge gives plain dicts only, got result_type={result_type!r}")
        self.result_type = result_type

    def items(self, data: Any) -> List[Tuple[Any, Any]]:
        if data is None:
            return []
        if hasattr(data, "items") and callable(data.items):
            return list(data.items())
        raise InvalidInputError(f"fields must be a mapping of field name to batched value, got {type(data).__name__}")

    def batch_len(self, value: Any) -> int:
        return len(value)

    def to_column(self, field: str, value: Any, n: int) -> Column:
        return to_column(field, value, n)

    def single_row(self, name: str, value: Any) -> Any:
        if isinstance(value, np.ndarray) and value.dtype.kind not in "OUSV":
            return value[None]
        return [value]

    def is_batch(self, value: Any) -> bool:
        return False

    def take(self, value: Any, idx: List[int]) -> Any:
        return take_rows(value, idx)

    def result(self, data: Dict[str, Any], n: int) -> Any:
        return data

    def status(self, array: np.ndarray) -> Any:
        return array

    def dtype(self, kind: int, code: int) -> Any:
        if kind == KIND_VALUE:
            return None
        return dtypes.CODE_TO_NUMPY.get(code, dtypes.DTYPE_NAMES.get(code))

    def to_wire(self, value: Any) -> Any:
        return value  # numpy arrays pickle cheaply as they are

    def from_wire(self, value: Any) -> Any:
        return value


_factory: Optional[Callable[[str], Any]] = None
_factory_lock = threading.Lock()


def set_default_factory(factory: Optional[Callable[[str], Any]]) -> None:
    """Make ``factory(result_type)`` the edge of stores opened without one (None: :class:`NumpyEdge`)."""
    global _factory
    with _factory_lock:
        _factory = factory


#: what an :class:`Edge` given to a store must have: the methods a store calls (``to_wire``
#: and ``from_wire`` are the Ray client's, which uses the default edge), then its attributes
EDGE_METHODS = ("items", "batch_len", "to_column", "single_row", "is_batch", "take", "result", "status", "dtype")
EDGE_ATTRIBUTES = ("alloc", "result_type")


def check_edge(edge: Any) -> None:
    """ConfigError unless ``edge`` (not None) has the methods and attributes of :class:`Edge`
    a store uses (:data:`EDGE_METHODS`, :data:`EDGE_ATTRIBUTES`; checked when a store is
    opened with it, before anything is opened)."""
    lacks = [m for m in EDGE_METHODS if not callable(getattr(edge, m, None))]
    lacks += [a for a in EDGE_ATTRIBUTES if not hasattr(edge, a)]
    if lacks:
        raise ConfigError(f"edge must implement tqstore.edge.Edge (or be None for the default); "
                          f"{type(edge).__name__} {edge!r:.60} lacks {', '.join(lacks)}")


def check_result_type(result_type: Optional[str]) -> None:
    """ConfigError unless ``result_type`` is None or one of :data:`RESULT_TYPES`."""
    if result_type is not None and result_type not in RESULT_TYPES:
        raise ConfigError(f"result_type must be one of {RESULT_TYPES}, got {result_type!r}")


def default_edge(result_type: Optional[str] = None) -> Any:
    """The edge of a store opened without one, for ``result_type`` (None: the factory's default)."""
    check_result_type(result_type)
    f = _factory
    if f is None:
        return NumpyEdge(result_type or "dict")
    return f(result_type) if result_type is not None else f()


def join_rows(edge: Any, kind: int, parts: Sequence[Tuple[Sequence[int], Any]], n: int) -> Any:
    """One field of ``n`` rows from reads of several partitions: ``parts`` is ``(positions, batched
    value)`` per partition (the reader's outputs, split and rejoined by the edge's allocator)."""
    rows: List[Any] = [None] * n
    for pos, value in parts:
        for i, v in zip(pos, edge.alloc.split(value)):
            rows[i] = v
    return edge.alloc.join(kind, rows)




def normalise_fields(edge: Any, fields: Any) -> List[Tuple[str, Any]]:
    """A put's fields as ``[(name, batched value)]`` through ``edge``; InvalidInputError for a non-str name."""
    items = edge.items(fields)
    bad = [k for k, _ in items if not isinstance(k, str)]
    if bad:
        raise InvalidInputError(f"field names must be str, got {type(bad[0]).__name__} {bad[0]!r}")
    return items


def batch_len(edge: Any, items: List[Tuple[str, Any]], tags: Optional[Sequence[Any]]) -> int:
    """Rows of a put: the first field's batch dimension, else the number of tags.

    Raises:
        InvalidInputError: no batch dimension, or neither fields nor tags.
    """
    if items:
        v = items[0][1]
        try:
            return edge.batch_len(v)
        except TypeError as e:
            raise InvalidInputError(f"field {items[0][0]!r} has no batch dimension") from e
    if tags is not None:
        return len(tags)
    raise InvalidInputError("cannot infer the batch size: no fields and no tags")


__all__ = ["Edge", "NumpyEdge", "RESULT_TYPES", "check_edge", "set_default_factory", "default_edge", "join_rows",
           "normalise_fields", "batch_len"]
