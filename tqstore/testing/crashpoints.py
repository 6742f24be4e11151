"""Enumerating crash points and running an operation in a forked child.

A *kill point* is ``(failpoint name, occurrence)``: the child process exits with
:data:`~tqstore._io.failpoints.KILL_EXIT_CODE` (like ``kill -9``: the page cache
survives, the process state does not) just before that occurrence performs its step.

The child is forked, not spawned, so a point costs a fork rather than an interpreter
start.  Open stores, LMDB environments and thread pools only inside the child: the
parent should hold none of them open across :func:`run_forked`.
"""
from __future__ import annotations

import json
import os
import select
import signal
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from .._io import failpoints as fp

#: Exit code of a child that finished ``fn`` normally.
OK_EXIT = 0
#: Exit code of a child whose ``fn`` raised (the traceback is in ``ChildResult.error``).
ERROR_EXIT = 3


@dataclass
class ChildResult:
    """How a forked child ended.

    ``killed``: it died at the armed kill point; ``value``: what ``fn`` returned (JSON);
    ``error``: the traceback when ``fn`` raised; ``timed_out``: it hung and was killed.
    """

    exitcode: int
    killed: bool
    value: Any = None
    error: Optional[str] = None
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.exitcode == OK_EXIT and not self.timed_out


def run_forked(fn: Callable[[], Any], *, failpoints: Sequence[Tuple[str, str, int]] = (), count: bool = False,
               timeout_s: float = 120.0) -> ChildResult:
    """Run ``fn()`` in a forked child with ``failpoints`` armed (``(name, action, at)``).

    With ``count=True`` the child counts every failpoint occurrence and returns
    ``{"value": fn(), "counts": {...}}`` as the value.  ``fn`` must return something JSON
    can encode (or None).
    """
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        code = ERROR_EXIT
        try:
            os.close(r)
            fp.set_observer(None)
            fp.disarm()
            for name, action, at in failpoints:
                fp.arm(name, action, at)
            if count:
                fp.start_counting()
            try:
                value = fn()
                if count:
                    value = {"value": value, "counts": fp.stop_counting()}
                payload = {"value": value}
                code = OK_EXIT
            except BaseException:  # noqa: BLE001 - reported to the parent
                payload = {"error": traceback.format_exc()}
            data = json.dumps(payload, default=repr).encode()
            view = memoryview(data)
            while view:
                n = os.write(w, view)
                view = view[n:]
        finally:
            os._exit(code)
    os.close(w)
    chunks: List[bytes] = []
    deadline = time.monotonic() + timeout_s
    timed_out = False
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                os.kill(pid, signal.SIGKILL)
                break
            ready, _, _ = select.select([r], [], [], min(left, 1.0))
            if ready:
                b = os.read(r, 1 << 16)
                if not b:
                    break
                chunks.append(b)
    finally:
        os.close(r)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    payload: Dict[str, Any] = {}
    if chunks:
        try:
            payload = json.loads(b"".join(chunks))
        except ValueError:
            payload = {"error": "unreadable child report"}
    return ChildResult(code, code == fp.KILL_EXIT_CODE, payload.get("value"), payload.get("error"), timed_out)


def count_points(fn: Callable[[], Any], *, timeout_s: float = 120.0) -> Dict[str, int]:
    """Occurrences of every failpoint while ``fn`` runs (in a forked child).

    Raises:
        RuntimeError: ``fn`` failed in the child (its traceback is in the message).
    """
    res = run_forked(fn, count=True, timeout_s=timeout_s)
    if not res.ok:
        raise RuntimeError(f"counting run failed (exit {res.exitcode}):\n{res.error}")
    return dict(res.value["counts"])


def kill_points(counts: Dict[str, int], names: Optional[Iterable[str]] = None) -> List[Tuple[str, int]]:
    """Every ``(name, occurrence)`` of ``counts`` (restricted to ``names``), sorted."""
    keep = set(names) if names is not None else None
    return [(n, i) for n in sorted(counts) if keep is None or n in keep for i in range(1, counts[n] + 1)]


__all__ = ["ChildResult", "run_forked", "count_points", "kill_points", "OK_EXIT", "ERROR_EXIT"]
