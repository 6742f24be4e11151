"""Comparable, JSON-encodable pictures of a store's content, for the crash checks.

``store_state(store)`` → ``{partition: {row: [gidx, tag, {field: digest}]}}`` where a row
is its key (or ``#<gidx>`` when unkeyed) and a digest names dtype, shape and bytes of a
tensor/array, or the JSON of a non-tensor value.  A field that cannot be read is
``"ERR:<error class>"``.  Two pictures are equal exactly when the stores hold the same
rows with bit-identical fields.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any, Dict, List, Optional

import numpy as np
import torch

from tqstore.errors import TqstoreError

ERR = "ERR:"


def digest(v: Any) -> str:
    h = hashlib.sha1()
    if isinstance(v, torch.Tensor):
        t = v.detach().cpu().contiguous()
        h.update(f"torch|{t.dtype}|{tuple(t.shape)}|".encode())
        if t.numel():
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    elif isinstance(v, np.ndarray):
        a = np.ascontiguousarray(v)
        h.update(f"numpy|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes())
    else:
        h.update(b"value|" + json.dumps(v, sort_keys=True, default=repr).encode())
    return h.hexdigest()[:16]


def _row_name(key: Optional[str], gidx: int) -> str:
    return key if key is not None else f"#{gidx}"


def store_state(store, *, fields_only: bool = False) -> Dict[str, Dict[str, list]]:
    """The picture of every row of every partition of an open :class:`~tqstore.store.Store`."""
    out: Dict[str, Dict[str, list]] = {}
    for pid in sorted(store.controller.parts):
        p = store.controller.parts[pid]
        rows: Dict[str, list] = {}
        for g in sorted(p.rows):
            r = p.rows[g]
            fields = {}
            for f in sorted(r.fields):
                try:
                    batch = store.read(pid, [g], [f])[f]
                    fields[f] = digest(batch[0])
                except TqstoreError as e:
                    fields[f] = ERR + type(e).__name__
            rows[_row_name(r.key, g)] = [g, r.tag, fields]
        out[pid] = rows
    return out


def consumption_state(store) -> Dict[str, List[int]]:
    return {f"{pid}|{task}": sorted(gs) for (pid, task), gs in sorted(store.controller.consumed.items()) if gs}


def diff_states(got: dict, want: dict, *, limit: int = 3) -> str:
    """A short human description of how two pictures differ."""
    lines = []
    for pid in sorted(set(got) | set(want)):
        a, b = got.get(pid), want.get(pid)
        if a is None or b is None:
            lines.append(f"partition {pid!r}: {'missing' if a is None else 'unexpected'}")
            continue
        for k in sorted(set(a) | set(b)):
            if a.get(k) != b.get(k):
                lines.append(f"{pid}/{k}: got {a.get(k)} want {b.get(k)}")
                if len(lines) >= limit:
                    return "; ".join(lines) + " ..."
    return "; ".join(lines)


def row_values_allowed(got: dict, allowed: List[dict], *, allow_errors: bool) -> List[str]:
    """Rows of ``got`` whose fields match none of the ``allowed`` pictures (per row, per field).

    Used after a power loss without per-commit durability: rows may be missing and fields
    may be forgotten, but every value returned must be one that was written.
    """
    bad = []
    for pid, rows in got.items():
        for k, (g, tag, fields) in rows.items():
            cands = [a[pid][k] for a in allowed if pid in a and k in a[pid]]
            if not cands:
                bad.append(f"{pid}/{k}: row was never written")
                continue
            for f, d in fields.items():
                if d.startswith(ERR):
                    if not allow_errors:
                        bad.append(f"{pid}/{k}.{f}: unreadable ({d})")
                    continue
                if not any(c[2].get(f) == d for c in cands):
                    bad.append(f"{pid}/{k}.{f}: value {d} was never written")
    return bad
