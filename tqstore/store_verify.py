"""What :meth:`tqstore.Store.verify` reports: the controller's index problems, then each
unit's, a frame that does not check named by its row's partition and key (or global index,
for a row without a key) and field, so that an operator can tell which samples are hit.
"""
from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

from .ports import ControllerPort, FrameProblem


def verify_parts(controller: ControllerPort, units: Sequence[Any], pool: Any) -> List[str]:
    """One line per problem of ``controller`` and ``units`` (their ports; the units checked
    on ``pool``, an executor), empty when clean."""
    out: List[str] = list(controller.verify_index())
    for probs in pool.map(lambda u: u.verify(), units):
        out.extend(probs)
    return name_rows(out, controller)


def name_rows(problems: List[str], controller: ControllerPort) -> List[str]:
    """``problems`` with each :class:`~tqstore.ports.FrameProblem` saying which partition and
    key its row is (a row no partition holds any more, say cleared meanwhile, says so)."""
    gidxs = sorted({p.gidx for p in problems if isinstance(p, FrameProblem)})
    if not gidxs:
        return problems
    rows: Dict[int, Tuple[str, Any]] = {}
    for pid in controller.partitions():
        for g, info in zip(gidxs, controller.row_infos(pid, gidxs)):
            if info is not None:
                rows[g] = (pid, info.key)
    out = []
    for p in problems:
        if not isinstance(p, FrameProblem):
            out.append(p)
            continue
        where = rows.get(p.gidx)
        if where is None:
            what = f"row {p.gidx}, which no partition holds"
        elif where[1] is None:
            what = f"partition {where[0]!r}, row {p.gidx} (no key)"
        else:
            what = f"partition {where[0]!r}, key {where[1]!r}, row {p.gidx}"
        out.append(f"{p.message} ({what}, field {p.field!r})")
    return out


__all__ = ["verify_parts", "name_rows"]
