"""Argument checks of the data plane's calls (:mod:`tqstore.streaming`, :mod:`tqstore.kv`):
partition ids and task names, a BatchMeta's ``custom_meta``, a batch's row counts, a fetch's
``timeout_s`` and ``sampling_config``.  Each
raises InvalidInputError before anything is read or written."""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Sequence

import numpy as np

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


#: the sampler's arguments a store fills in itself (``sampling_config`` cannot name them)
RESERVED_SAMPLING_KEYS = frozenset({"ready_indexes", "batch_size", "ready_seqs", "ready_tags"})


def sampling_kwargs(sampling_config: Any, partition_id: str, task_name: Any) -> Dict[str, Any]:
    """``get_meta``'s ``sampling_config`` as the sampler's keyword arguments: a copy, without
    the ``task_name`` and ``partition_id`` TransferQueue's dataset repeats in it (the sampler
    gets the call's own).  Raises InvalidInputError for a config that is not a dict or repeats
    one of them with another value, a key that is not a str, or one of the arguments the
    store gives the sampler itself (:data:`RESERVED_SAMPLING_KEYS`)."""
    if sampling_config is not None and not isinstance(sampling_config, Mapping):
        raise InvalidInputError(f"sampling_config must be a dict, got {type(sampling_config).__name__}")
    cfg = dict(sampling_config or {})
    for k in cfg:
        if type(k) is not str:
            raise InvalidInputError(f"sampling_config keys must be str (the sampler's keyword arguments), got "
                                    f"{type(k).__name__} {k!r:.60}")
        if k in RESERVED_SAMPLING_KEYS:
            raise InvalidInputError(f"sampling_config[{k!r}]: {k} is given to the sampler by the store, not by "
                                    f"sampling_config (pass batch_size to get_meta itself)")
    for name, value in (("task_name", task_name), ("partition_id", partition_id)):
        if name in cfg:
            if cfg[name] != value:
                raise InvalidInputError(f"sampling_config[{name!r}]={cfg[name]!r:.60} contradicts get_meta's "
                                        f"{name}={value!r:.60}")
            del cfg[name]
    return cfg


def check_timeout(timeout_s: Any, what: str = "timeout_s") -> float:
    """``get_meta``'s ``timeout_s`` as seconds to wait: None and anything negative mean 0.

    Raises InvalidInputError for a value that is not a number of seconds (a bool, NaN, text)."""
    if timeout_s is None:
        return 0.0
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float, np.integer, np.floating)) \
            or timeout_s != timeout_s:
        raise InvalidInputError(f"{what} must be a number of seconds, got {timeout_s!r:.60}")
    return max(0.0, float(timeout_s))


def check_wait(timeout: Any) -> Optional[float]:
    """A handle's ``result``/``exception``/``wait`` ``timeout``: None (wait for the end) or
    seconds (anything negative is 0).  Raises InvalidInputError for a value that is not a
    number of seconds (a bool, NaN, text: a bare TypeError from the wait before)."""
    return None if timeout is None else check_timeout(timeout, "timeout")


__all__ = ["check_pid", "check_task", "checked_custom_meta", "no_rows", "check_rows", "check_timeout", "check_wait",
           "sampling_kwargs", "GIDX_END", "NO_ROW"]
