"""Turn a batched field value into per-row payloads, and rows back into a batched value.

Framework-free: this module sees numpy arrays, lists of per-row values and bytes, and
builds ``Column`` objects (kind, dtype code, per-row shapes, per-row byte buffers) that
the engine writes.  Row payloads are views into the caller's memory, except rows of a
contiguous batch smaller than :data:`COPY_ROW_BYTES`: those are one ``bytes`` each, made
at C speed (faster than a numpy view per row, and not much larger: a view object alone
takes over 100 bytes).  Torch tensors, nested tensors and TensorDicts are turned into the same Columns by
the torch adapter (:mod:`tqstore.torch_adapter`), through :func:`flat_column` and
:func:`rows_column`.

The read path allocates its outputs through an :class:`Allocator`: it receives writable
numpy uint8 views to fill and an opaque ``finish`` callable that gives the final object
(:class:`NumpyAllocator` here; the torch adapter's allocator gives tensors over the same
memory, so the single copy into the final object stays).
"""
from __future__ import annotations

import operator
from collections import abc
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ..errors import CapacityError, InvalidInputError, SchemaError, UnsupportedTypeError
from .names import check_field_name
from . import dtypes
from .layout import KIND_NDARRAY, KIND_TENSOR, KIND_VALUE, MAX_NDIM
from .values import decode_value, encode_value

try:  # Python 3.8+: typing.Protocol
    from typing import Protocol
except ImportError:  # pragma: no cover
    from typing_extensions import Protocol  # type: ignore

# a frame's length is a u32 in the unit index: payload + header + padding + trailer must fit
MAX_ROW_BYTES = (1 << 32) - 4096

KIND_NAMES = {KIND_TENSOR: "tensor", KIND_NDARRAY: "ndarray", KIND_VALUE: "value"}


def take_rows(items: Sequence[Any], positions: Sequence[int]) -> Sequence[Any]:
    """``[items[p] for p in positions]`` at C speed: a slice when the positions step evenly (the
    store's split of a put over its units), else one itemgetter call."""
    n = len(positions)
    if n == 1:
        return [items[positions[0]]]
    if n and isinstance(positions, list):
        step = positions[1] - positions[0]
        if step > 0 and positions == list(range(positions[0], positions[-1] + 1, step)):
            return items[positions[0]:positions[-1] + 1:step]
    return list(operator.itemgetter(*positions)(items)) if n else []


@dataclass
class Column:
    """One field of a batch, split into rows.

    ``payloads[i]`` is row ``i`` as a bytes-like object (a view, or ``bytes`` for small rows of a
    contiguous batch: :func:`flat_column`, whose payloads are a :class:`FlatRows`); ``shapes[i]``
    its shape.
    ``uniform_shape`` is set when every row has the same shape.
    """

    field: str
    kind: int
    dtype: int
    shapes: List[Tuple[int, ...]]
    payloads: List[Any]
    uniform_shape: Optional[Tuple[int, ...]]
    keepalive: Any = None  # holds the contiguous source memory the payloads point into

    @property
    def nbytes(self) -> int:
        return sum(memoryview(p).nbytes for p in self.payloads)

    def __getstate__(self) -> Dict[str, Any]:
        """Pickled without ``keepalive``: the payloads pickle as copies of their own bytes, so
        a process that receives a column (a unit actor given its share of a put) needs nothing
        else; the source batch would travel whole with every share, and some tensors (uint16,
        float8) do not even unpickle."""
        state = dict(self.__dict__)
        state["keepalive"] = None
        return state

    def take(self, idx: Sequence[int]) -> "Column":
        """The rows at positions ``idx`` (views, no copy)."""
        idx = list(idx)
        return Column(self.field, self.kind, self.dtype, take_rows(self.shapes, idx), take_rows(self.payloads, idx),
                      self.uniform_shape, self.keepalive)


#: rows of a contiguous batch below this many bytes become ``bytes`` copies (see the module docstring)
COPY_ROW_BYTES = 256


class FlatRows(abc.Sequence):
    """The rows of a contiguous batch as a sequence, each made when asked for: row ``i`` is
    ``flat[i * row_bytes:(i + 1) * row_bytes]``, a ``bytes`` copy below :data:`COPY_ROW_BYTES`,
    else a view.  ``flat`` (1-D C-contiguous uint8) and ``row_bytes`` let a bulk encoder read the
    rows with no object per row (``_native.encode_rows``)."""

    __slots__ = ("flat", "row_bytes", "_n")

    def __init__(self, flat: np.ndarray, row_bytes: int, n: int) -> None:
        self.flat, self.row_bytes, self._n = flat, row_bytes, n

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return self._rows(*i.indices(self._n))
        i = operator.index(i)
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError("row index out of range")
        p = self.row_bytes
        row = self.flat[i * p:(i + 1) * p]
        return row.tobytes() if p < COPY_ROW_BYTES else row

    def _rows(self, start: int, stop: int, step: int) -> List[Any]:
        p = self.row_bytes
        m = self.flat.reshape(self._n, p)[start:stop:step]
        if p < COPY_ROW_BYTES:  # (a void element's .tolist() is its bytes)
            return np.ascontiguousarray(m).view(f"V{p}").reshape(-1).tolist()
        return list(m)  # row views, made at C speed

    def __iter__(self) -> Iterator[Any]:
        return iter(self._rows(0, self._n, 1))


def flat_column(field: str, kind: int, code: int, raw: np.ndarray, n: int, row_shape: Tuple[int, ...],
                keepalive: Any) -> Column:
    """A Column of ``n`` rows of ``row_shape`` over ``raw``, the flat uint8 view of a contiguous
    batch (row ``i`` is the ``i``-th equal slice): :class:`FlatRows` (``bytes`` rows below
    :data:`COPY_ROW_BYTES`, else views, each made when asked for)."""
    per = raw.nbytes // n if n else 0
    if per > 0 and raw.ndim == 1 and raw.flags.c_contiguous:
        payloads: Sequence[Any] = FlatRows(raw[:n * per], per, n)
    else:
        payloads = list(raw[:n * per].reshape(n, per)) if n else []  # row views, made at C speed
    return Column(field, kind, code, [row_shape] * n, payloads, row_shape, keepalive)


def rows_column(field: str, kind: int, rows: Sequence[Tuple[int, Tuple[int, ...], Any]]) -> Column:
    """A Column of per-row ``(dtype code, shape, uint8 payload view)`` (jagged allowed); every row
    must have one dtype."""
    code = None
    shapes, payloads = [], []
    for c, shape, raw in rows:
        if code is None:
            code = c
        elif c != code:
            raise InvalidInputError(f"field {field!r}: rows mix dtypes {dtypes.DTYPE_NAMES[code]} and "
                                    f"{dtypes.DTYPE_NAMES[c]}")
        shapes.append(tuple(shape))
        payloads.append(raw)
    uniform = shapes[0] if shapes and all(s == shapes[0] for s in shapes) else None
    return Column(field, kind, code if code is not None else 0, shapes, payloads, uniform, payloads)


def describe_kind_dtype(kd: Tuple[int, int]) -> str:
    """``(kind code, dtype code)`` in words, e.g. "tensor float32" or "ndarray of several
    dtypes" (code 255); unknown codes by number."""
    if kd[0] == KIND_VALUE:  # (its dtype code says nothing: "value none" read oddly)
        return "non-tensor values"
    kind = KIND_NAMES.get(kd[0], f"kind {kd[0]}")
    return f"{kind} of several dtypes" if kd[1] == dtypes.SCHEMA_MIXED else \
        f"{kind} {dtypes.DTYPE_NAMES.get(kd[1], f'dtype {kd[1]}')}"


def schema_changes(pid: str, schema: Mapping[str, Tuple[int, int]], columns: Sequence[Column], *,
                   strict: bool = True) -> Dict[str, Tuple[int, int]]:
    """The partition schema entries a put of ``columns`` adds or changes: ``{field: (kind, dtype)}``.

    A field's kind (tensor, ndarray, value) is fixed by its first put.  Its dtype too when
    ``strict``; otherwise a put of another dtype turns the entry into ``(kind, SCHEMA_MIXED)``
    (the rows hold several dtypes; each row's dtype is in its frame), which accepts any dtype
    of that kind from then on.

    Raises:
        SchemaError: a kind clash; with ``strict``, a dtype clash (also against a mixed entry).
    """
    out: Dict[str, Tuple[int, int]] = {}
    for col in columns:
        want = (col.kind, col.dtype)
        have = schema.get(col.field)
        if have is None:
            out[col.field] = want
        elif have != want:
            if have[0] != want[0] or strict:
                hint = "" if have[0] != want[0] else " (strict_schema=True; the default False lets a dtype change)"
                raise SchemaError(f"field {col.field!r} of partition {pid!r} holds {describe_kind_dtype(have)}, got "
                                  f"{describe_kind_dtype(want)}{hint}")
            if have[1] != dtypes.SCHEMA_MIXED:
                out[col.field] = (have[0], dtypes.SCHEMA_MIXED)
    return out


def approx_bytes(cols: Sequence[Column]) -> int:
    """Payload bytes of a batch, estimated from its first row where rows share a shape."""
    return sum(len(c.payloads) * memoryview(c.payloads[0]).nbytes
               if c.uniform_shape is not None and c.kind != KIND_VALUE and c.payloads else c.nbytes
               for c in cols)  # (a scalar row's shape () is uniform too: not summed row by row)


def _array_bytes(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8) if a.size else np.empty(0, np.uint8)


def _refuse_masked(field: str, a: np.ndarray) -> None:
    """A masked array would be stored as its data, its mask lost: refused."""
    if isinstance(a, np.ma.MaskedArray):
        raise UnsupportedTypeError(f"field {field!r}: a numpy masked array is not supported (its mask would be "
                                   f"lost); store a.filled(...) and np.ma.getmaskarray(a) as two fields")


def _ndarray_column(field: str, a: np.ndarray, n: int) -> Column:
    _refuse_masked(field, a)
    if a.dtype.kind == "V":
        raise UnsupportedTypeError(f"field {field!r}: numpy dtype {a.dtype} (structured or void) is not supported; "
                                   f"store each member as its own field")
    if a.dtype.kind in "OUS":  # text, bytes and objects: one value per row
        if a.ndim == 0 or a.shape[0] != n:
            raise InvalidInputError(
                f"field {field!r}: batch dimension is {a.shape[0] if a.ndim else 'missing'}, expected {n} rows")
        if a.dtype.kind == "O" and a.ndim == 1 and n and \
                all(isinstance(v, np.ndarray) and v.dtype.kind not in "OUSV" for v in a):
            return _array_rows_column(field, list(a), n)  # an object array of per-row arrays: a numpy field
        return values_column(field, a.tolist(), n)
    if a.dtype not in dtypes.NUMPY_TO_CODE:
        raise UnsupportedTypeError(f"field {field!r}: numpy dtype {a.dtype} is not supported")
    if a.ndim == 0 or a.shape[0] != n:
        raise InvalidInputError(
            f"field {field!r}: batch dimension is {a.shape[0] if a.ndim else 'missing'}, expected {n} rows")
    a = np.ascontiguousarray(a)
    return flat_column(field, KIND_NDARRAY, dtypes.NUMPY_TO_CODE[a.dtype], _array_bytes(a), n, tuple(a.shape[1:]), a)


def _array_rows_column(field: str, rows: Sequence[Any], n: int) -> Column:
    """A list of per-row numpy arrays (jagged allowed)."""
    if len(rows) != n:
        raise InvalidInputError(f"field {field!r}: {len(rows)} rows given, expected {n}")
    out = []
    for r in rows:
        if not isinstance(r, np.ndarray):
            raise InvalidInputError(f"field {field!r}: mixes arrays and {type(r).__name__} rows")
        _refuse_masked(field, r)
        c = dtypes.NUMPY_TO_CODE.get(r.dtype)
        if c is None:
            raise UnsupportedTypeError(f"field {field!r}: numpy dtype {r.dtype} is not supported")
        out.append((c, tuple(r.shape), _array_bytes(r)))
    return rows_column(field, KIND_NDARRAY, out)


def values_column(field: str, values: Sequence[Any], n: int) -> Column:
    """A Column of non-tensor values, one per row (JSON, or bytes as a whole row)."""
    if len(values) != n:
        raise InvalidInputError(f"field {field!r}: {len(values)} values given, expected {n}")
    try:
        payloads = [encode_value(v) for v in values]
    except InvalidInputError as e:  # UnsupportedTypeError included
        raise type(e)(_mixed_rows(field, values) or f"field {field!r}: {e}") from None
    return Column(field, KIND_VALUE, 0, [()] * n, payloads, (), None)


def _is_torch_tensor(v: Any) -> bool:
    """A torch tensor (a subclass such as a Parameter too), told without importing torch."""
    return any(c.__name__ == "Tensor" and c.__module__.startswith("torch") for c in type(v).__mro__)


def _mixed_rows(field: str, values: Sequence[Any]) -> Optional[str]:
    """The error message for a list of rows of which some are arrays or tensors and others are not (a
    missing row given as None, say), or which mixes numpy arrays and tensors; None otherwise."""
    kinds = ["tensor" if _is_torch_tensor(v) else "numpy array" if isinstance(v, np.ndarray) else None
             for v in values]
    arrays = [i for i, k in enumerate(kinds) if k is not None]
    if not arrays:
        return None
    i = arrays[0]
    j = next((j for j, k in enumerate(kinds) if k != kinds[i]), None)
    if j is None:
        return None
    other = f"a {kinds[j]}" if kinds[j] else "None" if values[j] is None else \
        f"a value of type {type(values[j]).__name__}"
    return (f"field {field!r}: row {i} is a {kinds[i]} and row {j} {other}: a field's rows in one put are all "
            f"tensors, all numpy arrays or all values; leave the keys that have no value for it out of this put "
            f"(a later put can add the field to them)")


def check_row_size(col: Column) -> Column:
    """``col``, or CapacityError when a row exceeds what a record frame can hold, or
    InvalidInputError when a row has more dimensions than a frame records (``MAX_NDIM``)."""
    if col.kind != KIND_VALUE:
        deep = len(col.uniform_shape) if col.uniform_shape is not None else \
            max((len(sh) for sh in col.shapes), default=0)
        if deep > MAX_NDIM:
            raise InvalidInputError(f"field {col.field!r}: a row has {deep} dimensions, a record frame holds at most "
                                    f"{MAX_NDIM}; reshape the rows")
    if col.uniform_shape is not None and col.kind != KIND_VALUE and col.payloads:
        big = memoryview(col.payloads[0]).nbytes  # rows of one shape and dtype: one size
    else:
        big = max((memoryview(p).nbytes for p in col.payloads), default=0)
    if big > MAX_ROW_BYTES:
        raise CapacityError(f"field {col.field!r}: a row of {big} bytes exceeds the {MAX_ROW_BYTES}-byte limit of a "
                            f"record frame; split the row into several fields", setting="row size")
    return col


def to_column(field: str, value: Any, n: int) -> Column:
    """Split the batched ``value`` of ``field`` (a numpy array, a list of per-row numpy arrays,
    or a list of per-row values) into ``n`` rows.  A Column is taken as it is.

    Raises:
        InvalidInputError: the value does not have ``n`` rows, or mixes row types.
        UnsupportedTypeError: a dtype or Python type that cannot be stored safely.
    """
    check_field_name(field)
    if isinstance(value, Column):
        if len(value.payloads) != n:
            raise InvalidInputError(f"field {field!r}: {len(value.payloads)} rows given, expected {n}")
        return check_row_size(value)
    return check_row_size(_to_column(field, value, n))


def _to_column(field: str, value: Any, n: int) -> Column:
    if isinstance(value, np.ndarray):
        return _ndarray_column(field, value, n)
    if isinstance(value, (list, tuple)):
        if n and len(value) == n and all(isinstance(v, np.ndarray) and v.dtype.kind not in "OUSV" for v in value):
            return _array_rows_column(field, value, n)
        return values_column(field, value, n)
    raise UnsupportedTypeError(
        f"field {field!r}: a batch value must be a tensor, numpy array, nested tensor or a list of "
        f"per-row values, got {type(value).__name__}")


# ---------------------------------------------------------------------------------- decoding

def row_to_object(kind: int, dtype: int, shape: Tuple[int, ...], payload, *, copy: bool = True) -> Any:
    """Decode one row payload as a framework-free object: a value, or a numpy array (tensor rows
    of a dtype numpy lacks, bfloat16 and float8, come back as their bit patterns: uint16/uint8).
    With ``copy=False`` arrays are read-only views of ``payload``."""
    if kind == KIND_VALUE:
        return decode_value(payload)
    arr = np.frombuffer(payload, dtype=numpy_dtype(dtype)).reshape(shape)
    return arr.copy() if copy else arr


def numpy_dtype(code: int) -> np.dtype:
    """The numpy dtype of ``code``; the bit-pattern dtype (uint of the same size) when numpy lacks it."""
    dt = dtypes.CODE_TO_NUMPY.get(code)
    return dt if dt is not None else np.dtype(f"u{dtypes.itemsize(code)}")


def jagged_layout(kind: int, dtype: int, shapes: Sequence[Tuple[int, ...]]) -> bool:
    """True when rows of these shapes form one jagged nested tensor (differ only in dim 0)."""
    if kind != KIND_TENSOR or not shapes or any(len(s) == 0 for s in shapes):
        return False
    rest = shapes[0][1:]
    return all(s[1:] == rest for s in shapes)


class Allocator(Protocol):
    """Where the read path puts its output (module docstring).  Each call returns
    ``(finish, views)``: the reader fills the writable uint8 views, then ``finish()`` gives
    the final object over that memory."""

    def rows(self, kind: int, dtype: int, n: int, row_shape: Tuple[int, ...]
             ) -> Tuple[Callable[[], Any], np.ndarray]:
        """``n`` rows of one shape: views is a writable ``(n, row_bytes)`` uint8 array (row i is views[i])."""

    def jagged(self, kind: int, dtype: int, shapes: Sequence[Tuple[int, ...]]
               ) -> Tuple[Callable[[], Any], List[np.ndarray]]:
        """Rows that differ only in dim 0 (:func:`jagged_layout`): one writable view per row."""

    def each(self, kind: int, dtypes_: Sequence[int], shapes: Sequence[Tuple[int, ...]]
             ) -> Tuple[Callable[[], Any], List[np.ndarray]]:
        """Rows of any shapes and dtypes: one writable view per row."""

    def values(self, rows: List[Any]) -> Any:
        """A non-tensor field's decoded rows as the batched value."""

    def empty(self, kind: int) -> Any:
        """The batched value of no rows."""

    def split(self, value: Any) -> List[Any]:
        """A batched value made by this allocator, as its rows (to merge reads of several partitions)."""

    def join(self, kind: int, rows: List[Any]) -> Any:
        """Rows of one field (from :meth:`split`) as one batched value."""


def _alloc_raw(dtype: int, shape: Tuple[int, ...]) -> Tuple[np.ndarray, np.ndarray]:
    obj = np.empty(tuple(shape), dtype=numpy_dtype(dtype))
    return obj, (obj.reshape(-1).view(np.uint8) if obj.size else np.empty(0, np.uint8))


class NumpyAllocator:
    """The framework-free allocator: numpy arrays (rows of one shape stacked; otherwise a list of
    arrays), lists of values.  Dtypes numpy lacks come back as bit patterns (:func:`numpy_dtype`)."""

    def rows(self, kind, dtype, n, row_shape):
        obj, raw = _alloc_raw(dtype, (n,) + tuple(row_shape))
        return (lambda: obj), raw.reshape(n, raw.nbytes // n if n else 0)

    def jagged(self, kind, dtype, shapes):
        return self.each(kind, [dtype] * len(shapes), shapes)

    def each(self, kind, dtypes_, shapes):
        objs = [_alloc_raw(d, s) for d, s in zip(dtypes_, shapes)]
        return (lambda: [o for o, _ in objs]), [r for _, r in objs]

    def values(self, rows):
        return rows

    def empty(self, kind):
        return [] if kind == KIND_VALUE else np.empty((0,))

    def split(self, value):
        return list(value)

    def join(self, kind, rows):
        # (np.generic too: split of an array of scalar rows gives numpy scalars, not 0-d arrays)
        if kind != KIND_VALUE and rows and all(isinstance(r, (np.ndarray, np.generic)) and r.shape == rows[0].shape
                                               and r.dtype == rows[0].dtype for r in rows):
            return np.stack(rows)
        return list(rows)


NUMPY = NumpyAllocator()
