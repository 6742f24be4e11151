"""Consumption marks and the sampler's persisted state, a mixin of
:class:`~tqstore.controller.Controller` (:class:`~tqstore.ports.ControllerPort`:
``mark_consumed``, ``reset_consumption``, ``sampler_state``, ``set_sampler_state``).

Each call is one LMDB transaction under the controller's lock; the mirror's consumption
sets and ready views change only after it commits, so a failed call changes nothing.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from ._format import controller_records as R
from ._format.names import check_name
from ._format.records import RecordError
from . import controller_sampler_store as sampler_store
from ._io.lmdbenv import lmdb_commit_point, wrap_errors
from .controller_sampler_store import SamplerWrite
from .errors import CorruptionError


class ConsumptionCalls:
    """Which rows each task consumed, and the sampler's state (see the module docstring);
    the host class provides ``env``, ``db``, ``path``, ``parts``, ``consumed``, ``_lock`` and
    ``_sampling``."""

    _cons_key = staticmethod(R.cons_key)

    def mark_consumed(self, pid: str, task: str, gidxs: Sequence[int], *, sampler_state=None,
                      sampler_key: Optional[str] = None, sampler_write: Optional[SamplerWrite] = None) -> None:
        """Mark rows consumed by ``task`` and save the sampler's state of ``pid`` in one
        transaction: ``sampler_write`` (its changes, from the fetch), or ``sampler_state`` (the
        whole state, replacing the saved one of ``sampler_key``, default ``pid``)."""
        check_name("task_name", task)
        with self._lock, wrap_errors("mark consumed", self.path):
            with self.env.begin(write=True) as txn:
                if gidxs:
                    prefix = R.cons_prefix(task, pid)  # as R.cons_key
                    raw = np.asarray(gidxs, dtype=">u8").tobytes()  # the gidx keys in bulk (R.gidx_key)
                    txn.cursor(self.db["cons"]).putmulti([(prefix + raw[i:i + 8], b"")
                                                          for i in range(0, len(raw), 8)])
                if sampler_write is not None:
                    sampler_store.write(txn, self.db["sampler"], pid, sampler_write)
                if sampler_state is not None:
                    sampler_store.replace(txn, self.db["sampler"], sampler_key or pid, sampler_state)
                lmdb_commit_point("controller_commit")
            self.consumed[(pid, task)].update(gidxs)
            p = self.parts.get(pid)
            if p is not None and gidxs:
                for v in p.ready.get(task, {}).values():
                    v.remove(gidxs)

    def reset_consumption(self, pid: str, task: Optional[str] = None) -> bool:
        """Forget consumption of ``pid`` by ``task`` (all tasks when None) and the sampler's
        cache of it, in one transaction.  False (nothing done) for an unknown partition."""
        with self._lock, wrap_errors("reset consumption", self.path):
            if pid not in self.parts:
                return False
            tasks = [t for (pp, t) in list(self.consumed) if pp == pid and (task is None or t == task)]
            with self._sampling.change(pid, lambda s: s.clear_cache(pid, task)) as w, \
                    self.env.begin(write=True) as txn:
                if w is not None:
                    sampler_store.write(txn, self.db["sampler"], pid, w)
                for t in tasks:
                    for g in self.consumed[(pid, t)]:
                        txn.delete(self._cons_key(t, pid, g), db=self.db["cons"])
                lmdb_commit_point("controller_commit")
            self._sampling.forget_first(pid, task)
            for t in tasks:
                self.consumed.pop((pid, t), None)
            p = self.parts.get(pid)
            if p is not None:  # rebuilt on the next fetch
                if task is None:
                    p.ready.clear()
                else:
                    p.ready.pop(task, None)
            return True

    def sampler_state(self, key: str) -> Optional[Any]:
        """The saved sampler state of partition ``key`` as ``BaseSampler.state_dict`` gives it
        (cached results under their tasks), or None.  Raises CorruptionError for a malformed record."""
        return self.sampler_records(key).state

    def sampler_records(self, key: str) -> sampler_store.SamplerRecords:
        """The saved sampler state of partition ``key`` with its records' numbers (see
        :func:`tqstore.controller_sampler_store.read`).  Raises CorruptionError."""
        with self.env.begin() as txn:
            try:
                return sampler_store.read(txn, self.db["sampler"], key)
            except RecordError as e:
                raise CorruptionError(f"controller index: malformed sampler entry of {key[:40]!r}: {e}",
                                      path=str(self.path / "data.mdb")) from e

    def set_sampler_state(self, key: str, state: Any) -> None:
        """Replace the saved sampler state of partition ``key`` (as ``state_dict`` gives it)."""
        with self._lock, wrap_errors("save sampler state", self.path):
            with self.env.begin(write=True) as txn:
                sampler_store.replace(txn, self.db["sampler"], key, state)
