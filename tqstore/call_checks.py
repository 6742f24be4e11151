"""Argument checks of the data plane's calls (:mod:`tqstore.streaming`, :mod:`tqstore.kv`):
partition ids and task names, a BatchMeta's ``custom_meta``, a batch's row counts.  Each
raises InvalidInputError before anything is read or written."""
from __future__ import annotations

from typing import Any, List, Sequence

from .errors import InvalidInputError
from .meta import BatchMeta

GIDX_END = 1 << 63  # (global indexes are int64)
NO_ROW: Any = object()  # a meta's row whose index no row can have


def check_pid(pid: Any) -> str:
    if not isinstance(pid, str) or not pid:
        raise InvalidInputError(f"partition_id must be a non-empty str, got {pid!r}")
    return pid


def check_task(task: Any) -> str:
    if not isinstance(task, str) or not task:
        raise InvalidInputError(f"task_name must be a non-empty str, got {task!r:.80}")
    return task


def checked_custom_meta(meta: BatchMeta) -> List[Any]:
    """``meta.custom_meta``: a list of one entry per row (a tuple becomes a list).

    Raises InvalidInputError (before anything is written) for anything else: a str, a
    dict, a list of another length."""
    cm = meta.custom_meta
    if isinstance(cm, tuple):
        cm = meta.custom_meta = list(cm)
    if not isinstance(cm, list) or len(cm) != meta.size:
        got = f"a list of {len(cm)}" if isinstance(cm, list) else f"a {type(cm).__name__}"
        raise InvalidInputError(f"BatchMeta.custom_meta must be a list of {meta.size} entries (one per row), "
                                f"got {got}")
    return cm


def no_rows(edge: Any, data: Any, names: Sequence[str]) -> bool:
    """Whether every field of ``data`` has 0 rows (a field without a batch dimension: False,
    the write names it)."""
    try:
        return all(edge.batch_len(data[f]) == 0 for f in names)
    except TypeError:
        return False


def check_rows(edge: Any, data: Any, names: Sequence[str], n: int) -> None:
    """Every field of ``data`` has ``n`` rows (a put through a meta of several partitions,
    split by row before the writes). Raises InvalidInputError naming the first that has not."""
    for f in names:
        try:
            got = edge.batch_len(data[f])
        except TypeError:
            raise InvalidInputError(f"field {f!r} has no batch dimension") from None
        if got != n:
            raise InvalidInputError(f"field {f!r} has {got} rows, the BatchMeta {n}")


__all__ = ["check_pid", "check_task", "checked_custom_meta", "no_rows", "check_rows", "GIDX_END", "NO_ROW"]
