"""Turn a batched field value into per-row payloads, and rows back into a batched value.

This is the torch/numpy edge of the format: everything else sees only ``Column`` objects
(kind, dtype code, per-row shapes, per-row byte buffers).  Row payloads are views into
the caller's memory: nothing is copied here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np
import torch

from ..errors import CapacityError, InvalidInputError, UnsupportedTypeError
from .names import check_field_name
from . import dtypes
from .layout import KIND_NDARRAY, KIND_TENSOR, KIND_VALUE
from .values import decode_value, encode_value

# a frame's length is a u32 in the unit index: payload + header + padding + trailer must fit
MAX_ROW_BYTES = (1 << 32) - 4096

KIND_NAMES = {KIND_TENSOR: "tensor", KIND_NDARRAY: "ndarray", KIND_VALUE: "value"}


@dataclass
class Column:
    """One field of a batch, split into rows.

    ``payloads[i]`` is a bytes-like view of row ``i``; ``shapes[i]`` its shape.
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
    if t.dtype not in dtypes.TORCH_TO_CODE:
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
    if t.dtype not in dtypes.TORCH_TO_CODE:
        raise UnsupportedTypeError(f"field {field!r}: tensor dtype {t.dtype} is not supported")
    t = plain_tensor(field, t).cpu().contiguous()
    raw = _tensor_bytes(t, field)
    row_shape = tuple(t.shape[1:])
    per = raw.nbytes // n if n else 0
    payloads = [raw[i * per:(i + 1) * per] for i in range(n)]
    return Column(field, KIND_TENSOR, dtypes.TORCH_TO_CODE[t.dtype], [row_shape] * n, payloads, row_shape, t)


def _ndarray_column(field: str, a: np.ndarray, n: int) -> Column:
    if a.dtype.kind == "V":
        raise UnsupportedTypeError(f"field {field!r}: numpy dtype {a.dtype} (structured or void) is not supported; "
                                   f"store each member as its own field")
    if a.dtype.kind in "OUS":
        return _values_column(field, a.tolist(), n)
    if a.dtype not in dtypes.NUMPY_TO_CODE:
        raise UnsupportedTypeError(f"field {field!r}: numpy dtype {a.dtype} is not supported")
    if a.ndim == 0 or a.shape[0] != n:
        raise InvalidInputError(
            f"field {field!r}: batch dimension is {a.shape[0] if a.ndim else 'missing'}, expected {n} rows")
    a = np.ascontiguousarray(a)
    raw = a.reshape(-1).view(np.uint8) if a.size else np.empty(0, np.uint8)
    row_shape = tuple(a.shape[1:])
    per = raw.nbytes // n if n else 0
    payloads = [raw[i * per:(i + 1) * per] for i in range(n)]
    return Column(field, KIND_NDARRAY, dtypes.NUMPY_TO_CODE[a.dtype], [row_shape] * n, payloads, row_shape, a)


def _rows_column(field: str, rows: Sequence[Any], n: int) -> Column:
    """A list of per-row tensors or arrays (jagged allowed)."""
    if len(rows) != n:
        raise InvalidInputError(f"field {field!r}: {len(rows)} rows given, expected {n}")
    first = rows[0]
    kind = KIND_TENSOR if isinstance(first, torch.Tensor) else KIND_NDARRAY
    shapes, payloads, keep = [], [], []
    code = None
    for r in rows:
        if kind == KIND_TENSOR:
            if not isinstance(r, torch.Tensor):
                raise InvalidInputError(f"field {field!r}: mixes tensors and {type(r).__name__} rows")
            c = dtypes.TORCH_TO_CODE.get(r.dtype)
            if c is None:
                raise UnsupportedTypeError(f"field {field!r}: tensor dtype {r.dtype} is not supported")
            raw = _tensor_bytes(r, field)
        else:
            if not isinstance(r, np.ndarray):
                raise InvalidInputError(f"field {field!r}: mixes arrays and {type(r).__name__} rows")
            c = dtypes.NUMPY_TO_CODE.get(r.dtype)
            if c is None:
                raise UnsupportedTypeError(f"field {field!r}: numpy dtype {r.dtype} is not supported")
            raw = np.ascontiguousarray(r).reshape(-1).view(np.uint8)
        if code is None:
            code = c
        elif c != code:
            raise InvalidInputError(f"field {field!r}: rows mix dtypes {dtypes.DTYPE_NAMES[code]} and "
                                    f"{dtypes.DTYPE_NAMES[c]}")
        shapes.append(tuple(r.shape))
        payloads.append(raw)
        keep.append(raw)
    uniform = shapes[0] if all(s == shapes[0] for s in shapes) else None
    return Column(field, kind, code, shapes, payloads, uniform, keep)


def _values_column(field: str, values: Sequence[Any], n: int) -> Column:
    if len(values) != n:
        raise InvalidInputError(f"field {field!r}: {len(values)} values given, expected {n}")
    try:
        payloads = [encode_value(v) for v in values]
    except InvalidInputError as e:  # UnsupportedTypeError included
        raise type(e)(f"field {field!r}: {e}") from None
    return Column(field, KIND_VALUE, 0, [()] * n, payloads, (), None)


def to_column(field: str, value: Any, n: int) -> Column:
    """Split the batched ``value`` of ``field`` into ``n`` rows.

    Raises:
        InvalidInputError: the value does not have ``n`` rows, or mixes row types.
        UnsupportedTypeError: a dtype or Python type that cannot be stored safely.
    """
    check_field_name(field)
    col = _to_column(field, value, n)
    big = max((memoryview(p).nbytes for p in col.payloads), default=0)
    if big > MAX_ROW_BYTES:
        raise CapacityError(f"field {field!r}: a row of {big} bytes exceeds the {MAX_ROW_BYTES}-byte limit of a "
                            f"record frame; split the row into several fields", setting="row size")
    return col


def _to_column(field: str, value: Any, n: int) -> Column:
    if isinstance(value, torch.Tensor):
        return _tensor_column(field, value, n)
    if isinstance(value, np.ndarray):
        return _ndarray_column(field, value, n)
    if isinstance(value, (list, tuple)):
        if n and len(value) == n and all(isinstance(v, torch.Tensor) for v in value):
            return _rows_column(field, value, n)
        if n and len(value) == n and all(isinstance(v, np.ndarray) and v.dtype.kind not in "OUSV" for v in value):
            return _rows_column(field, value, n)
        return _values_column(field, value, n)
    type_name = type(value).__name__
    if type_name == "NonTensorStack" or type_name == "NonTensorData":  # tensordict wrappers
        return _values_column(field, list(value.tolist()), n)
    raise UnsupportedTypeError(
        f"field {field!r}: a batch value must be a tensor, numpy array, nested tensor or a list of "
        f"per-row values, got {type_name}")


# ---------------------------------------------------------------------------------- decoding

def row_to_object(kind: int, dtype: int, shape: Tuple[int, ...], payload, *, copy: bool = True) -> Any:
    """Decode one row payload. With ``copy=False`` tensors are read-only views of ``payload``."""
    if kind == KIND_VALUE:
        return decode_value(payload)
    if kind == KIND_NDARRAY:
        arr = np.frombuffer(payload, dtype=dtypes.CODE_TO_NUMPY[dtype]).reshape(shape)
        return arr.copy() if copy else arr
    t_dtype = dtypes.CODE_TO_TORCH[dtype]
    buf = np.frombuffer(payload, dtype=np.uint8)
    if copy:
        buf = buf.copy()
    if buf.size == 0:
        return torch.empty(shape, dtype=t_dtype)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # read-only views are intended when copy=False
        t = torch.from_numpy(buf)
    return t.view(t_dtype).reshape(shape)


def _allocate_raw(kind: int, dtype: int, n: int, row_shape: Tuple[int, ...]):
    """A new ``(n,) + row_shape`` array or tensor and a flat uint8 array over its memory."""
    if kind == KIND_NDARRAY:
        obj = np.empty((n,) + tuple(row_shape), dtype=dtypes.CODE_TO_NUMPY[dtype])
        raw = obj.reshape(-1).view(np.uint8)
    else:
        obj = torch.empty((n,) + tuple(row_shape), dtype=dtypes.CODE_TO_TORCH[dtype])
        raw = obj.reshape(-1).view(torch.uint8).numpy() if obj.numel() else np.empty(0, np.uint8)
    return obj, raw


def allocate_batch(kind: int, dtype: int, n: int, row_shape: Tuple[int, ...]):
    """Allocate a batch output and return ``(obj, row_views)`` with a writable view per row."""
    obj, raw = _allocate_raw(kind, dtype, n, row_shape)
    per = raw.nbytes // n if n else 0
    return obj, [raw[i * per:(i + 1) * per] for i in range(n)]


def allocate_rows(kind: int, dtype: int, n: int, row_shape: Tuple[int, ...]):
    """Allocate a batch output and return ``(obj, rows)``: ``rows`` is a writable
    ``(n, row_bytes)`` uint8 array over the output's memory (row ``i`` is ``rows[i]``)."""
    obj, raw = _allocate_raw(kind, dtype, n, row_shape)
    return obj, raw.reshape(n, raw.nbytes // n if n else 0)


def assemble(kind: int, rows: List[Any]) -> Any:
    """Combine decoded rows of one field: stacked when shapes agree, nested when jagged."""
    if kind == KIND_VALUE:
        return rows
    if kind == KIND_NDARRAY:
        if rows and all(r.shape == rows[0].shape for r in rows):
            return np.stack(rows) if rows else np.empty((0,))
        return rows
    if not rows:
        return torch.empty((0,))
    if all(r.shape == rows[0].shape for r in rows):
        return torch.stack(rows)
    if all(r.dim() == rows[0].dim() and r.dim() >= 1 for r in rows):
        if all(r.shape[1:] == rows[0].shape[1:] for r in rows):
            return torch.nested.nested_tensor(rows, layout=torch.jagged)
        return torch.nested.nested_tensor(rows)
    return rows


try:  # the public nested_tensor_from_jagged logs an fx-tracing warning on every process's first call
    from torch.nested._internal.nested_tensor import nested_view_from_values_offsets as _nested_view
except ImportError:  # pragma: no cover - other torch versions
    _nested_view = None


def jagged_layout(kind: int, dtype: int, shapes: Sequence[Tuple[int, ...]]) -> bool:
    """True when rows of these shapes form one jagged nested tensor (differ only in dim 0)."""
    if kind != KIND_TENSOR or not shapes or any(len(s) == 0 for s in shapes):
        return False
    rest = shapes[0][1:]
    return all(s[1:] == rest for s in shapes)


def allocate_jagged(dtype: int, shapes: Sequence[Tuple[int, ...]]):
    """One buffer for tensor rows that differ only in dim 0 (see :func:`jagged_layout`).

    Returns ``(finish, row_views)``: fill each writable uint8 view, then ``finish()``
    gives the jagged nested tensor over that buffer (no further copy).
    """
    t_dtype = dtypes.CODE_TO_TORCH[dtype]
    rest = tuple(shapes[0][1:])
    lens = [s[0] for s in shapes]
    values = torch.empty((sum(lens),) + rest, dtype=t_dtype)
    raw = values.reshape(-1).view(torch.uint8).numpy() if values.numel() else np.empty(0, np.uint8)
    per = values.element_size() * int(np.prod(rest, dtype=np.int64)) if rest else values.element_size()
    offsets = [0]
    for n in lens:
        offsets.append(offsets[-1] + n)
    views = [raw[offsets[i] * per:offsets[i + 1] * per] for i in range(len(lens))]

    def finish():
        off = torch.tensor(offsets, dtype=torch.int64)
        if _nested_view is not None:  # what torch.nested.nested_tensor(rows, layout=torch.jagged) ends with
            return _nested_view(values, off)
        return torch.nested.nested_tensor_from_jagged(values, offsets=off)

    return finish, views
