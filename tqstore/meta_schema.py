"""Field schemas of batch metadata (TransferQueue-shaped): what :class:`~tqstore.meta.BatchMeta`
records about each field, from the values of a batch (``add_fields``) or from the stored rows'
shapes (``get_meta``), and small helpers the metadata classes share.

Framework-free: tensors are recognised by their attributes (``is_nested``, ``dtype``,
``shape``, ``unbind``), never by importing torch.
"""
from __future__ import annotations

import copy
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .errors import InvalidInputError


def _is_tensor(x: Any) -> bool:
    """A torch tensor (or anything shaped like one), by duck typing."""
    return hasattr(x, "is_nested") and hasattr(x, "dtype") and hasattr(x, "unbind") and hasattr(x, "shape")


def shapes_entry(entry: Dict[str, Any], shapes: Sequence[Optional[Tuple[int, ...]]]) -> None:
    """Fill ``shape`` / ``is_nested`` / ``per_sample_shapes`` of a tensor field's schema ``entry`` from
    its rows' stored shapes (None: the row has not produced the field), as TransferQueue's controller
    records them: one shape when every produced row has it, else nested with per-row shapes."""
    known = [tuple(s) for s in shapes if s is not None]
    if not known:
        return
    if all(s == known[0] for s in known):
        entry["shape"], entry["is_nested"] = known[0], False
        entry.pop("per_sample_shapes", None)
    else:
        entry["shape"], entry["is_nested"] = None, True
        entry["per_sample_shapes"] = [None if s is None else tuple(s) for s in shapes]


def schema_of_value(name: str, value: Any, batch_size: int) -> Dict[str, Any]:
    """TransferQueue's field schema of one batched value: dtype, per-row shape, is_nested, is_non_tensor
    (and ``per_sample_shapes`` for jagged fields).  Tensors are recognised by what they have
    (``is_nested``, ``dtype``, ``shape``, ``unbind``): no framework is imported here."""
    if _is_tensor(value):
        if value.is_nested:
            rows = value.unbind()
            if len(rows) != batch_size:
                raise InvalidInputError(f"Inconsistent batch dimension for field {name!r}: expected batch_size[0]="
                                        f"{batch_size}, got nested tensor composed of {len(rows)} tensors")
            shapes = [tuple(t.shape) for t in rows]
            return {"dtype": value.dtype, "shape": rows[0].shape if shapes else None, "is_nested": True,
                    "is_non_tensor": False, "per_sample_shapes": shapes}
        if value.ndim == 0 or value.shape[0] != batch_size:
            raise InvalidInputError(f"Inconsistent batch dimension for field {name!r}: expected batch_size[0]="
                                    f"{batch_size}, got value.shape[0]={tuple(value.shape)[:1]}")
        shape = value.shape[1:] if value.ndim > 1 else type(value.shape)([1])  # TQ unsqueezes 1-D fields
        return {"dtype": value.dtype, "shape": shape, "is_nested": False, "is_non_tensor": False}
    if isinstance(value, np.ndarray) and value.dtype.kind not in "OUSV" and value.ndim >= 1:
        return {"dtype": value.dtype, "shape": tuple(value.shape[1:]), "is_nested": False, "is_non_tensor": False}
    rows = list(value) if not isinstance(value, (str, bytes)) else [value]
    if len(rows) != batch_size:
        raise InvalidInputError(f"Inconsistent batch dimension for field {name!r}: expected batch_size[0]="
                                f"{batch_size}, got len(value)={len(rows)}")
    if rows and all(_is_tensor(r) for r in rows):  # a list of per-row tensors: jagged
        shapes = [tuple(r.shape) for r in rows]
        return {"dtype": rows[0].dtype, "shape": None if len(set(shapes)) > 1 else rows[0].shape,
                "is_nested": len(set(shapes)) > 1, "is_non_tensor": False, "per_sample_shapes": shapes}
    return {"dtype": None, "shape": None, "is_nested": False, "is_non_tensor": True}


def extract_field_schema(data: Any) -> Dict[str, Dict[str, Any]]:
    """Field schema of a batch (a TensorDict or a mapping of field → batched value), TransferQueue's shape."""
    if hasattr(data, "batch_size") and len(tuple(data.batch_size)) >= 1:
        n = int(tuple(data.batch_size)[0])
    else:
        n = None
    out: Dict[str, Dict[str, Any]] = {}
    for name in data.keys():
        value = data[name]
        if n is None:
            n = batch_len_of(value)
        if n == 0:
            return {}
        out[str(name)] = schema_of_value(str(name), plain(value), n)
    return out


def plain(value: Any) -> Any:
    """A TensorDict ``NonTensorStack`` / ``NonTensorData`` as a list; anything else unchanged."""
    if type(value).__module__.split(".")[0] == "tensordict" and hasattr(value, "tolist"):
        try:
            return value.tolist()
        except Exception:  # noqa: BLE001 - not a non-tensor stack after all
            return value
    return value


def batch_len_of(value: Any) -> int:
    if _is_tensor(value):
        return value.size(0) if value.is_nested else (value.shape[0] if value.ndim else 1)
    if isinstance(value, np.ndarray):
        return value.shape[0] if value.ndim else 1
    return len(plain(value))


def normalise_schema(schema: Optional[Dict[str, Dict[str, Any]]]) -> Dict[str, Dict[str, Any]]:
    """Copy a field schema; every entry gets ``shape`` and ``is_nested`` (None: not known to this meta)."""
    out = {}
    for k, v in (schema or {}).items():
        entry = copy.deepcopy(dict(v))
        entry.setdefault("shape", None)
        entry.setdefault("is_nested", None)
        out[k] = entry
    return out


def equal(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray):
        return bool(np.array_equal(a, b))
    if _is_tensor(a):
        return bool(a.equal(b))
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - incomparable values are different
        return False


def merge_extra(infos: Sequence[Dict[str, Any]], what: str) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for info in infos:
        for k, v in (info or {}).items():
            if k in out and not equal(out[k], v):
                raise InvalidInputError(f"{what}: extra_info key {k!r} has conflicting values across chunks")
            out.setdefault(k, v)
    return out


def chunk_bounds(size: int, chunks: int) -> List[Tuple[int, int]]:
    """``(start, end)`` of ``chunks`` near-equal parts of ``range(size)``, earlier parts one larger."""
    if chunks < 1:
        raise InvalidInputError(f"chunks must be >= 1, got {chunks}")
    base, rem = divmod(size, chunks)
    bounds, start = [], 0
    for i in range(chunks):
        end = start + base + (1 if i < rem else 0)
        bounds.append((start, end))
        start = end
    return bounds


__all__ = ["schema_of_value", "extract_field_schema", "shapes_entry", "normalise_schema", "plain", "batch_len_of",
           "equal", "merge_extra", "chunk_bounds"]
