"""The controller's sampler: which ready rows a fetch hands out, on the controller's side of
the port.

A fetch is one step under the controller's lock: the ready rows of ``(task, fields)`` (an
incremental view, O(ready)), the sampler's choice, the consumption marks and the sampler's
new state in one controller transaction.  So concurrent consumers of one task never get
the same row, and with the Ray backend (the controller an actor) a fetch is one call.

The sampler gets values only: the ready rows' global indexes and, parallel to them, their
insertion sequence numbers (``ready_seqs``), never the partition object.  Its state per
partition is loaded from the controller on first use and saved in the transaction of the
change (fetch, clear, reset); a failed transaction puts the committed state back.
"""
from __future__ import annotations

import json
import logging
from collections.abc import Sequence as SequenceABC
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Set, Tuple

from .controller_mirror import copy_value, row_batch
from .controller_sampler_store import EntryName, SamplerWrite
from .errors import InvalidInputError
from .ports import RowBatch
from .samplers import BaseSampler, GRPOGroupNSampler, RankAwareSampler, SequentialSampler, make_sampler

if TYPE_CHECKING:  # pragma: no cover
    from .controller import Controller

log = logging.getLogger("tqstore")


def _snapshot(sampler: BaseSampler, pid: str) -> str:
    """The state of ``pid`` but its cached results (tracked one by one: ``take_changes``), as
    text to compare: small for tqstore's samplers, whatever the number of results cached."""
    return json.dumps(sampler.state_without_cache(pid), sort_keys=True)


class ReadyTags(SequenceABC):
    """The tags of the ready rows, parallel to them, each copied when it is read: a sampler
    that reads a few (a cached result, the rows it chose) pays for those only.  Valid for the
    sampler's call (the controller's lock is held)."""

    __slots__ = ("_tags", "_rows")

    def __init__(self, tags: Mapping[int, Any], rows: Sequence[int]) -> None:
        self._tags, self._rows = tags, rows

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [copy_value(self._tags.get(g)) for g in self._rows[i]]
        return copy_value(self._tags.get(self._rows[i]))


#: samplers (these classes exactly, not subclasses) that read only the oldest ``batch_size``
#: ready rows and whether there are that many
_OLDEST_ONLY = (SequentialSampler, RankAwareSampler)
#: samplers (exactly) that take the oldest whole groups of ready rows in sequence order: asked
#: first with the oldest FRONT_ROWS_PER_ROW * batch_size rows (a group whole among them is one
#: the whole list holds, and every group whole in the list but not among them is newer), and
#: with every ready row only when those hold too few whole groups
_OLDEST_GROUPS = (GRPOGroupNSampler,)
FRONT_ROWS_PER_ROW = 4


def _may_sample(sampler: BaseSampler, ready: Sequence[int], batch_size: int, pid: str, task: str,
                cfg: Dict[str, Any]) -> bool:
    """TransferQueue's rule for its samplers: call one only with ``batch_size`` ready rows or a
    cached result (``has_cached_result``); tqstore's own samplers (``sees_short_ready``) decide."""
    if sampler.sees_short_ready or len(ready) >= batch_size:
        return True
    try:
        return bool(sampler.has_cached_result(pid, task, cfg))
    except Exception as e:  # noqa: BLE001 - a foreign hook that fails means: no cached result
        log.debug("sampler %r: has_cached_result raised %s: %s", sampler, type(e).__name__, e)
        return False


def _set_aside(entry: Any) -> bool:
    """A cached result ``[sampled, consumed, fetches]`` its rank has not fetched yet."""
    return isinstance(entry, list) and len(entry) == 3 and entry[2] == 0


class SamplerHost:
    """The sampler of one :class:`~tqstore.controller.Controller`; its methods run under the
    controller's lock (the controller's port methods take it)."""

    def __init__(self, controller: "Controller") -> None:
        self._ctrl = controller
        self.sampler: BaseSampler = make_sampler(None)
        self.sampler.track_changes()
        self._loaded: Set[str] = set()  # partitions whose saved state the sampler holds
        self._numbers: Dict[str, Dict[EntryName, int]] = {}  # per partition: each cached result's record number
        self._next: Dict[str, int] = {}  # per partition: the next record number
        self._purge: Dict[str, List[int]] = {}  # per partition: records of another sampler's results
        self._first: Dict[Tuple[str, str, str], int] = {}  # (pid, task, rank) -> first_batch_index's answer

    def set(self, spec: Any) -> BaseSampler:
        """Use ``spec`` (see make_sampler) from now on; state is loaded per partition as needed."""
        s = make_sampler(spec)  # its own state (e.g. a custom sampler's rng set in __init__) is kept
        s.track_changes()
        self.sampler = s
        self._loaded.clear()
        self._numbers.clear()
        self._next.clear()
        self._purge.clear()
        self._first.clear()
        return s

    def forget_first(self, pid: str, task: Optional[str] = None) -> None:
        """Drop :meth:`first_batch_index`'s answers for ``pid`` (and ``task``; None: every
        task): after a reset of its consumption or a clear of the partition a new dataset
        starts from what is cached then (it was given the old start until the store closed)."""
        for k in [k for k in self._first if k[0] == pid and (task is None or k[1] == task)]:
            del self._first[k]

    def first_batch_index(self, pid: str, task: str, dp_rank: Any) -> int:
        """See ControllerPort.first_batch_index: one past the largest integer batch index cached
        for ``(task, dp_rank)`` and fetched by that rank when first asked, then that answer
        (memoised: a replica asking after another replica's first fetches gets the same start).
        A share another rank's fetch set aside for this rank (the seqlen-balanced sampler's;
        fetched 0 times) does not count: starting past it would leave its rows reserved for a
        fetch that never comes."""
        key = (pid, task, str(dp_rank))
        got = self._first.get(key)
        if got is None:
            rank = str(dp_rank)
            sampler = self._for(pid)
            done = [int(bi) for name in sampler.cached_names(pid, task) for _t, r, bi in (name,)
                    if r == rank and bi.lstrip("-").isdigit() and not _set_aside(sampler.cached_entry(pid, name))]
            got = self._first[key] = max(done, default=-1) + 1
        return got

    def _for(self, pid: str) -> BaseSampler:
        if pid not in self._loaded:
            self.revert(pid)
        return self.sampler

    def revert(self, pid: str) -> None:
        """(Re)load the committed state of ``pid`` (first use, or after a failed transaction)."""
        saved = self._ctrl.sampler_records(pid)
        s = self.sampler
        s.load_state_dict(pid, saved.state)
        numbers = dict(saved.numbers)
        self._purge.pop(pid, None)
        if saved.state is not None and saved.state.get("sampler") != s.name:
            if numbers:  # another sampler's results: deleted by the next write
                self._purge[pid] = sorted(numbers.values())
            numbers = {}
        elif saved.inline:  # a version-2 record: its results get records of their own at the next write
            for name in s.cached_names(pid):
                if name not in numbers:
                    s._touch(pid, *name)
        self._numbers[pid] = numbers
        self._next[pid] = max(saved.numbers.values(), default=-1) + 1
        self._loaded.add(pid)

    def drop(self, pid: str) -> None:
        """The partition is gone (its saved state was deleted with it)."""
        self.sampler.forget_partition(pid)
        self.sampler.take_changes(pid)
        for d in (self._numbers, self._next, self._purge):
            d.pop(pid, None)
        self._loaded.discard(pid)
        self.forget_first(pid)

    def pending_write(self, pid: str, state_changed: bool) -> Optional[SamplerWrite]:
        """What saves the changes of ``pid``'s state since it was last saved: the state record
        (when ``state_changed`` or any cached result changed) and each cached result added,
        changed or dropped; None when nothing changed."""
        s = self.sampler
        names = s.take_changes(pid)
        if not names and not state_changed:
            return None  # (another sampler's saved results stay until this one writes its state)
        numbers = self._numbers.setdefault(pid, {})
        w = SamplerWrite(s.state_without_cache(pid), dels=self._purge.pop(pid, []))
        for name in sorted(names):
            entry = s.cached_entry(pid, name)
            n = numbers.get(name)
            if entry is None:
                if n is not None:
                    w.dels.append(numbers.pop(name))
                continue
            if n is None:
                n = numbers[name] = self._next.get(pid, 0)
                self._next[pid] = n + 1
            w.puts.append((n, name, entry))
        return w

    @contextmanager
    def change(self, pid: str, edit: Optional[Callable[[BaseSampler], Any]]) -> Iterator[Optional[SamplerWrite]]:
        """Apply ``edit(sampler)`` to the in-memory state of ``pid``; yield what the caller
        writes in its transaction (:func:`~tqstore.controller_sampler_store.write`; None:
        unchanged, or no edit).  If the block raises, the committed state is put back."""
        if edit is None:
            yield None
            return
        s = self._for(pid)
        before = _snapshot(s, pid)
        try:
            edit(s)
            yield self.pending_write(pid, _snapshot(s, pid) != before)
        except BaseException:
            self.revert(pid)
            raise

    def fetch(self, pid: str, task: str, fields: Optional[Sequence[str]], batch_size: int,
              cfg: Dict[str, Any]) -> Optional[RowBatch]:
        """See ControllerPort.fetch."""
        c = self._ctrl
        check = getattr(self.sampler, "check_batch_size", None)
        if check is not None:  # a batch the sampler can never give: raised now, not once rows exist
            check(batch_size, cfg)
        p = c.parts.get(pid)
        if p is None:
            return None
        need = frozenset(p.schema if fields is None else fields)
        done = c.consumed.get((pid, task), ())
        sampler = self._for(pid)
        ready: List[int] = []
        seqs: Optional[List[int]] = [] if sampler.uses_seqs else None
        partial = None  # the ready view, when ready (and seqs) are its oldest rows only
        if all(f in p.schema for f in need):
            v = p.ready_view(task, need, done)
            # the sequential and rank-aware samplers read the oldest batch_size rows only (and
            # their count, which the first batch_size + 1 tell): with a large backlog, a fetch
            # then copies a batch, not every ready row
            if type(sampler) in _OLDEST_ONLY:
                ready = v.ordered(batch_size + 1)
            elif type(sampler) in _OLDEST_GROUPS and seqs is not None and batch_size > 0:
                limit = FRONT_ROWS_PER_ROW * batch_size
                ready, seqs = v.front(limit)
                partial = v if len(v) > limit else None
            else:
                ready = v.ordered()
                if seqs is not None:
                    seqs = v.seqs()
        if not _may_sample(sampler, ready, batch_size, pid, task, cfg):
            return row_batch(p, [])
        before = _snapshot(sampler, pid)
        try:
            extra = {"ready_tags": ReadyTags(p.tags, ready)} if sampler.uses_tags else {}
            sampled, consumed = sampler(ready, batch_size, partition_id=pid, task_name=task, ready_seqs=seqs,
                                        **extra, **cfg)
            if partial is not None and not sampled and not consumed:  # too few whole groups among the
                # oldest rows: every ready row (the first call changed nothing: it found no result)
                ready = partial.ordered()
                sampled, consumed = sampler(ready, batch_size, partition_id=pid, task_name=task,
                                            ready_seqs=partial.seqs(), **cfg)
            sampled, consumed = [int(g) for g in sampled], [int(g) for g in consumed]
            both = sampled + consumed
            bad = []
            if both and int(p.slots(both).min()) < 0:  # one vectorised lookup, not one per row
                bad = [g for g in both if not p.has(g)]
            if bad or len(set(sampled)) != len(sampled):
                raise InvalidInputError(f"sampler {sampler!r} returned rows that are not (unique) rows of partition "
                                        f"{pid!r}: {bad[:5] or sampled[:8]}")
            new = [g for g in dict.fromkeys(consumed) if g not in done]
            w = self.pending_write(pid, _snapshot(sampler, pid) != before)
            if new or w is not None:
                c.mark_consumed(pid, task, new, sampler_write=w)
        except BaseException:
            self.revert(pid)  # back to the committed state
            raise
        if sampled:
            log.debug("fetch %d rows of %r for task %r", len(sampled), pid, task)
        return row_batch(p, sampled)


__all__ = ["SamplerHost"]
