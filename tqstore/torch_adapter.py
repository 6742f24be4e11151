"""The torch adapter: the one module that knows torch, nested tensors and TensorDict.

The engine below works on numpy arrays, lists of values and bytes (:mod:`tqstore.edge`).
This module is its :class:`~tqstore.edge.Edge` for torch users, the default edge: ``import
tqstore`` registers a factory that imports this module (and torch) when the first store
opens without an ``edge``:

* inputs: a torch tensor, a nested tensor (jagged or strided), a list of per-row tensors or
  a TensorDict (with ``NonTensorData`` / ``NonTensorStack`` entries, numpy text, bytes and
  object arrays included) becomes the engine's :class:`~tqstore._format.columns.Column`
  rows, as zero-copy uint8 views of the tensors' memory;
* outputs: :class:`TorchAllocator` allocates the read path's outputs as tensors (one batch
  tensor, or one buffer under a jagged nested tensor) and hands the reader numpy views of
  their memory, so each byte is copied once, into the tensor returned;
* results: with ``result_type="tensordict"`` (the default, as TransferQueue) a read is a
  ``TensorDict`` with ``batch_size``: tensors as they are, numpy arrays as tensors over the
  same memory, jagged fields as nested tensors, non-tensor fields as ``NonTensorStack``;
  with ``"dict"`` a plain ``{field: value}`` (non-tensor fields as lists, numpy fields as
  numpy arrays);
* status arrays become tensors over the numpy arrays the controller answers.
"""
from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
# tensordict is imported when a store that returns TensorDicts opens (TorchEdge), not here: its
# import takes seconds on a loaded machine, which then lands neither in ``import tqstore`` nor in
# the first get of a trainer (see to_tensordict)

from . import edge as _edge
from ._format import dtypes
from ._format.columns import (
    NUMPY, Column, check_row_size, flat_column, rows_column, to_column as _core_column, values_column,
)
from ._format.layout import KIND_NDARRAY, KIND_TENSOR
from ._format.names import check_field_name
from .errors import ConfigError, InvalidInputError, UnsupportedTypeError

TORCH_TO_CODE: Dict[torch.dtype, int] = {}
for _code, _name in dtypes.DTYPE_NAMES.items():
    _t = getattr(torch, _name, None)
    if isinstance(_t, torch.dtype):
        TORCH_TO_CODE[_t] = _code
CODE_TO_TORCH: Dict[int, torch.dtype] = {c: t for t, c in TORCH_TO_CODE.items()}

try:  # the public nested_tensor_from_jagged logs an fx-tracing warning on every process's first call
    from torch.nested._internal.nested_tensor import nested_view_from_values_offsets as _nested_view
except ImportError:  # pragma: no cover - other torch versions
    _nested_view = None


def _is_tensordict(x: Any) -> bool:
    return type(x).__module__.split(".")[0] == "tensordict" and hasattr(x, "batch_size")


def _is_non_tensor(x: Any) -> bool:
    return type(x).__name__ in ("NonTensorStack", "NonTensorData") and _is_tensordict(x)


def _non_tensor_rows(x: Any) -> Any:
    """A ``NonTensorStack`` / ``NonTensorData`` as its per-row values (a numpy array or a list).

    Raises TypeError for one without a batch dimension (``NonTensorData("text")``: its
    ``tolist()`` is the value itself, whose characters or items were taken for rows)."""
    if not tuple(x.batch_size):
        raise TypeError(f"a {type(x).__name__} without a batch dimension (batch_size []) holds one value, not rows")
    if type(x).__name__ == "NonTensorData":
        data = x.data
        if isinstance(data, (np.ndarray, list, tuple)) and tuple(x.batch_size)[:1] == (len(data),):
            return data
    return list(x.tolist())


# ---------------------------------------------------------------------------- inputs
def plain_tensor(field: str, t: torch.Tensor) -> torch.Tensor:
    """``t`` detached, as a strided tensor whose memory holds its values (conjugate and negative
    views resolved); UnsupportedTypeError for sparse, quantized or meta tensors."""
    if t.layout != torch.strided:
        raise UnsupportedTypeError(f"field {field!r}: a {t.layout} tensor is not supported; store t.to_dense(), or "
                                   f"its indices and values as separate fields")
    if t.device.type == "meta":
        raise UnsupportedTypeError(f"field {field!r}: a tensor on the meta device has no data to store")
    t = t.detach()
    if t.is_conj() or t.is_neg():  # lazy views: their memory is not their values
        t = t.resolve_conj().resolve_neg()
    return t


def _tensor_bytes(t: torch.Tensor, field: str = "?") -> np.ndarray:
    """A uint8 numpy view of a contiguous CPU tensor's memory (no copy)."""
    t = plain_tensor(field, t)
    if t.device.type != "cpu":
        t = t.cpu()
    if not t.is_contiguous():
        t = t.contiguous()
    if t.dtype not in TORCH_TO_CODE:
        raise UnsupportedTypeError(f"tensor dtype {t.dtype} is not supported")
    flat = t.reshape(-1)
    if flat.numel() == 0:
        return np.empty(0, dtype=np.uint8)
    return flat.view(torch.uint8).numpy()


def _tensor_column(field: str, t: torch.Tensor, n: int) -> Column:
    if t.is_nested:
        return _rows_column(field, list(t.unbind()), n)
    if t.dim() == 0 or t.shape[0] != n:
        raise InvalidInputError(
            f"field {field!r}: batch dimension is {t.shape[0] if t.dim() else 'missing'}, expected {n} rows")
    if t.dtype not in TORCH_TO_CODE:
        raise UnsupportedTypeError(f"field {field!r}: tensor dtype {t.dtype} is not supported")
    t = plain_tensor(field, t).cpu().contiguous()
    return flat_column(field, KIND_TENSOR, TORCH_TO_CODE[t.dtype], _tensor_bytes(t, field), n, tuple(t.shape[1:]), t)


def _rows_column(field: str, rows: Sequence[Any], n: int) -> Column:
    """A list of per-row tensors (jagged allowed)."""
    if len(rows) != n:
        raise InvalidInputError(f"field {field!r}: {len(rows)} rows given, expected {n}")
    out = []
    for r in rows:
        if not isinstance(r, torch.Tensor):
            raise InvalidInputError(f"field {field!r}: mixes tensors and {type(r).__name__} rows")
        c = TORCH_TO_CODE.get(r.dtype)
        if c is None:
            raise UnsupportedTypeError(f"field {field!r}: tensor dtype {r.dtype} is not supported")
        out.append((c, tuple(r.shape), _tensor_bytes(r, field)))
    return rows_column(field, KIND_TENSOR, out)


def to_column(field: str, value: Any, n: int) -> Column:
    """Split the batched ``value`` of ``field`` into ``n`` rows: a tensor, a nested tensor, a list of
    per-row tensors, a TensorDict non-tensor entry, or what :func:`tqstore._format.columns.to_column`
    takes (numpy arrays, lists of values).

    Raises:
        InvalidInputError: the value does not have ``n`` rows, or mixes row types.
        UnsupportedTypeError: a dtype or Python type that cannot be stored safely.
    """
    if isinstance(value, torch.Tensor):
        check_field_name(field)
        return check_row_size(_tensor_column(field, value, n))
    if isinstance(value, (list, tuple)) and n and len(value) == n and all(isinstance(v, torch.Tensor) for v in value):
        check_field_name(field)
        return check_row_size(_rows_column(field, value, n))
    if _is_non_tensor(value):
        try:
            value = _non_tensor_rows(value)
        except TypeError as e:
            raise InvalidInputError(f"field {field!r} has no batch dimension: {e}") from None
        if isinstance(value, list) and not (n and len(value) == n and all(isinstance(v, np.ndarray) for v in value)):
            check_field_name(field)
            return check_row_size(values_column(field, value, n))
    if _is_tensordict(value):
        raise UnsupportedTypeError(f"field {field!r}: a nested TensorDict is not supported; store its entries as "
                                   f"fields of their own")
    return _core_column(field, value, n)


# ---------------------------------------------------------------------------- outputs
def _empty(dtype: int, shape: Tuple[int, ...]) -> Tuple[torch.Tensor, np.ndarray]:
    obj = torch.empty(tuple(shape), dtype=CODE_TO_TORCH[dtype])
    raw = obj.reshape(-1).view(torch.uint8).numpy() if obj.numel() else np.empty(0, np.uint8)
    return obj, raw


def _from_numpy(a: np.ndarray) -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # read-only views are intended
        return torch.from_numpy(a)


def assemble(rows: List[Any]) -> Any:
    """Rows of one tensor field: stacked when shapes agree, nested when jagged, else the list."""
    if not rows:
        return torch.empty((0,))
    if not all(isinstance(r, torch.Tensor) for r in rows):
        return rows
    if all(r.shape == rows[0].shape and r.dtype == rows[0].dtype for r in rows):
        return torch.stack(rows)
    if all(r.dtype == rows[0].dtype for r in rows) and all(r.dim() == rows[0].dim() and r.dim() >= 1 for r in rows):
        if all(r.shape[1:] == rows[0].shape[1:] for r in rows):
            return torch.nested.nested_tensor(rows, layout=torch.jagged)
        return torch.nested.nested_tensor(rows)
    return rows


class TorchAllocator:
    """The read path's allocator for torch users: tensor fields as tensors (a batch, a jagged nested
    tensor over one buffer, or per-row tensors assembled), numpy fields as numpy arrays."""

    def rows(self, kind, dtype, n, row_shape):
        if kind == KIND_NDARRAY:
            return NUMPY.rows(kind, dtype, n, row_shape)
        obj, raw = _empty(dtype, (n,) + tuple(row_shape))
        return (lambda: obj), raw.reshape(n, raw.nbytes // n if n else 0)

    def jagged(self, kind, dtype, shapes):
        if kind == KIND_NDARRAY:
            return NUMPY.jagged(kind, dtype, shapes)
        rest = tuple(shapes[0][1:])
        lens = [s[0] for s in shapes]
        values, raw = _empty(dtype, (sum(lens),) + rest)
        per = values.element_size() * int(np.prod(rest, dtype=np.int64)) if rest else values.element_size()
        offsets = [0]
        for k in lens:
            offsets.append(offsets[-1] + k)
        views = [raw[offsets[i] * per:offsets[i + 1] * per] for i in range(len(lens))]

        def finish():
            off = torch.tensor(offsets, dtype=torch.int64)
            if _nested_view is not None:  # what torch.nested.nested_tensor(rows, layout=torch.jagged) ends with
                return _nested_view(values, off)
            return torch.nested.nested_tensor_from_jagged(values, offsets=off)

        return finish, views

    def each(self, kind, dtypes_, shapes):
        if kind == KIND_NDARRAY:
            return NUMPY.each(kind, dtypes_, shapes)
        objs = [_empty(d, s) for d, s in zip(dtypes_, shapes)]
        return (lambda: assemble([o for o, _ in objs])), [r for _, r in objs]

    def values(self, rows):
        return rows

    def empty(self, kind):
        return NUMPY.empty(kind) if kind != KIND_TENSOR else torch.empty((0,))

    def split(self, value):
        if isinstance(value, torch.Tensor):
            return list(value.unbind()) if value.is_nested else list(value.unbind(0))
        return list(value)

    def join(self, kind, rows):
        if kind == KIND_TENSOR:
            return assemble(rows)
        return NUMPY.join(kind, rows)


ALLOCATOR = TorchAllocator()


def to_tensordict(data: Any, batch_size: Optional[int] = None) -> Any:
    """A mapping of field → batched value as a ``TensorDict`` of ``batch_size`` rows (a TensorDict
    unchanged): tensors and nested tensors as they are, numeric numpy arrays as tensors over the
    same memory, anything else (lists of values, text, bytes, lists of arrays) as a ``NonTensorStack``."""
    if _is_tensordict(data):
        return data
    # imported here, not at module level: tensordict pulls in about a thousand modules
    # (torch.distributed, sympy, ...), seconds of ``import tqstore`` and some 140,000 objects
    # that every full garbage collection of the user's process would walk, for users who
    # never build a TensorDict (``result_type="dict"``).  A store whose result type is
    # "tensordict" (the default) imports it when it opens (TorchEdge), so no read pays it.
    from tensordict import NonTensorStack, TensorDict
    out = {}
    n = batch_size
    for name, value in dict(data).items():
        if isinstance(value, torch.Tensor):
            out[name] = value
            n = value.size(0) if n is None else n
        elif isinstance(value, np.ndarray) and value.dtype.kind not in "OUSV":
            out[name] = _from_numpy(np.ascontiguousarray(value))
            n = value.shape[0] if n is None else n
        else:
            rows = list(value)
            out[name] = NonTensorStack(*rows) if rows else NonTensorStack()
            n = len(rows) if n is None else n
    return TensorDict(out, batch_size=[n or 0])


# ---------------------------------------------------------------------------- across processes
@dataclasses.dataclass
class WireTensor:
    """A dense CPU tensor as the numpy array of its bytes (pickles without torch's per-tensor
    storage pickling: about 10x cheaper for a batch of small tensors)."""

    data: np.ndarray  # uint8, the tensor's bytes in C order
    dtype: str  # the torch dtype's name ("float32", "bfloat16", ...)
    shape: Tuple[int, ...]


@dataclasses.dataclass
class WireNested:
    """A jagged nested tensor as its values and offsets."""

    values: WireTensor
    offsets: WireTensor


@dataclasses.dataclass
class WireTensorDict:
    """A TensorDict as its entries (a ``NonTensorStack`` as :class:`WireNonTensorStack`) and batch size."""

    entries: Dict[str, Any]
    batch_size: List[int]


@dataclasses.dataclass
class WireNonTensorStack:
    """A TensorDict's ``NonTensorStack`` entry as its rows."""

    rows: List[Any]


def _writable_rows(rows: List[Any]) -> List[Any]:
    """The rows, a read-only numpy array among them copied (a zero-copy deserialiser hands
    them out read-only: what a get returns is the caller's to edit)."""
    return [r.copy() if isinstance(r, np.ndarray) and not r.flags.writeable else r for r in rows]


def _wire_tensor(t: torch.Tensor) -> Any:
    if t.is_nested:
        if t.layout == torch.jagged and getattr(t, "_lengths", None) is None and getattr(t, "_ragged_idx", 1) == 1:
            return WireNested(_wire_tensor(t.values()), _wire_tensor(t.offsets()))
        return t
    if t.layout != torch.strided or t.device.type != "cpu" or t.is_quantized:
        return t  # pickled by torch, as it is
    flat = t.detach().resolve_conj().resolve_neg().contiguous().reshape(-1)  # (a lazy view: its values)
    raw = flat.view(torch.uint8).numpy() if flat.numel() else np.empty(0, np.uint8)
    return WireTensor(raw, str(t.dtype).rpartition(".")[2], tuple(t.shape))


def _unwire_tensor(w: WireTensor) -> torch.Tensor:
    dtype = getattr(torch, w.dtype)
    if w.data.size == 0:
        return torch.empty(w.shape, dtype=dtype)
    data = w.data if w.data.flags.writeable else w.data.copy()
    return torch.from_numpy(data).view(dtype).reshape(w.shape)


def to_wire(value: Any) -> Any:
    """:meth:`TorchEdge.to_wire`: tensors (dense CPU, jagged nested) and TensorDicts, also
    inside plain dicts, lists and tuples, as :class:`WireTensor` / :class:`WireNested` /
    :class:`WireTensorDict`; anything else as it is."""
    if isinstance(value, torch.Tensor):
        return _wire_tensor(value)
    if _is_tensordict(value) and not _is_non_tensor(value):
        return WireTensorDict({k: to_wire(value.get(k)) for k in value.keys()}, list(value.batch_size))
    if type(value).__name__ == "NonTensorStack" and _is_tensordict(value):
        return WireNonTensorStack(list(_non_tensor_rows(value)))
    return _map_items(value, to_wire)


def from_wire(value: Any) -> Any:
    """The inverse of :func:`to_wire`."""
    t = type(value)
    if t is WireTensor:
        return _unwire_tensor(value)
    if t is WireNested:
        values, offsets = _unwire_tensor(value.values), _unwire_tensor(value.offsets)
        if _nested_view is not None:
            return _nested_view(values, offsets)
        return torch.nested.nested_tensor_from_jagged(values, offsets=offsets)  # pragma: no cover
    if t is WireTensorDict:
        from tensordict import TensorDict

        return TensorDict({k: from_wire(v) for k, v in value.entries.items()}, batch_size=value.batch_size)
    if t is WireNonTensorStack:
        from tensordict import NonTensorStack

        rows = _writable_rows(value.rows)
        return NonTensorStack(*rows) if rows else NonTensorStack()
    return _map_items(value, from_wire)


def _map_items(value: Any, fn: Any) -> Any:
    """A plain dict, list or tuple with ``fn`` applied to each item (a dict's values); anything
    else as it is."""
    t = type(value)
    if t is dict:
        return {k: fn(v) for k, v in value.items()}
    if t is list:
        return [fn(v) for v in value]
    if t is tuple:
        return tuple(fn(v) for v in value)
    return value


class TorchEdge:
    """The engine's :class:`~tqstore.edge.Edge` for torch users (module docstring).

    Args:
        result_type: ``"tensordict"`` (default) or ``"dict"``.
    """

    alloc = ALLOCATOR

    def __init__(self, result_type: str = "tensordict") -> None:
        if result_type not in _edge.RESULT_TYPES:
            raise ConfigError(f"result_type must be one of {_edge.RESULT_TYPES}, got {result_type!r}")
        self.result_type = result_type
        if result_type == "tensordict":
            import tensordict  # noqa: F401  (here, at open, not on the store's first read; see to_tensordict)

    # ---------------------------------------------------------------- inputs
    def items(self, data: Any) -> List[Tuple[Any, Any]]:
        if data is None:
            return []
        if _is_tensordict(data):  # (get, not []: [] unwraps a non-tensor entry to its one shared value)
            return [(k, data.get(k)) for k in data.keys()]
        if hasattr(data, "items") and callable(data.items):
            return list(data.items())
        raise InvalidInputError(f"fields must be a mapping of field name to batched value, got {type(data).__name__}")

    def batch_len(self, value: Any) -> int:
        if isinstance(value, torch.Tensor):
            if value.is_nested:
                return value.size(0)
            if value.dim() == 0:
                raise TypeError("a 0-d tensor has no batch dimension")
            return value.shape[0]
        if _is_non_tensor(value):
            return len(_non_tensor_rows(value))
        return len(value)

    def to_column(self, field: str, value: Any, n: int) -> Column:
        return to_column(field, value, n)

    def single_row(self, name: str, value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            if value.is_nested:
                raise InvalidInputError(f"field {name!r}: a nested tensor is a batch; use kv_batch_put")
            return plain_tensor(str(name), value).unsqueeze(0)
        if isinstance(value, np.ndarray) and value.dtype.kind not in "OUSV":
            return value[None]
        return [value]

    def is_batch(self, value: Any) -> bool:
        return _is_tensordict(value)

    def take(self, value: Any, idx: List[int]) -> Any:
        if isinstance(value, torch.Tensor):
            if value.is_nested:
                rows = value.unbind()
                return [rows[i] for i in idx]
            return value[torch.as_tensor(idx, dtype=torch.long)]
        if _is_non_tensor(value):
            value = _non_tensor_rows(value)
        return _edge.take_rows(value, idx)

    # ---------------------------------------------------------------- outputs
    def result(self, data: Dict[str, Any], n: int) -> Any:
        if self.result_type == "dict":
            return data
        return to_tensordict(data, n)

    def status(self, array: np.ndarray) -> Any:
        return _from_numpy(array)

    def dtype(self, kind: int, code: int) -> Any:
        if kind == KIND_TENSOR:
            return CODE_TO_TORCH.get(code)
        if kind == KIND_NDARRAY:
            return dtypes.CODE_TO_NUMPY.get(code)
        return None

    def to_wire(self, value: Any) -> Any:
        return to_wire(value)

    def from_wire(self, value: Any) -> Any:
        return from_wire(value)


def row_to_object(kind: int, dtype: int, shape: Tuple[int, ...], payload, *, copy: bool = True) -> Any:
    """Decode one row payload; tensor rows as tensors (``copy=False``: read-only views of ``payload``)."""
    from ._format.columns import row_to_object as core
    if kind != KIND_TENSOR:
        return core(kind, dtype, shape, payload, copy=copy)
    buf = np.frombuffer(payload, dtype=np.uint8)
    if copy:
        buf = buf.copy()
    if buf.size == 0:
        return torch.empty(shape, dtype=CODE_TO_TORCH[dtype])
    return _from_numpy(buf).view(CODE_TO_TORCH[dtype]).reshape(shape)


__all__ = ["TorchEdge", "TorchAllocator", "to_column", "to_tensordict", "plain_tensor", "row_to_object",
           "TORCH_TO_CODE", "CODE_TO_TORCH", "assemble", "to_wire", "from_wire", "WireTensor", "WireNested",
           "WireTensorDict"]
