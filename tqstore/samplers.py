"""Samplers: which ready rows a ``get_meta(mode="fetch")`` call hands out.

A sampler gets the rows that are *ready* for a task (every requested field produced,
not yet consumed by that task), in insertion order, with their insertion sequence numbers
(``ready_seqs``, values: a sampler never sees the controller's partition object; it runs
beside the controller, in its process), and returns
``(sampled_indexes, consumed_indexes)``: the global indexes to return and those to mark
consumed.  Returning ``([], [])`` means "not enough data yet".

State: each sampler keeps JSON-safe state per partition in ``self._states[partition_id]``
(``{task_name: {...}}``).  The store saves it in the controller, in the same transaction
that marks the rows consumed, so it survives close/reopen and a process kill; it is
dropped with the partition.  Write a custom sampler by subclassing :class:`BaseSampler`
and implementing :meth:`BaseSampler.sample`; keep anything that must survive a reopen
in ``self._states`` (JSON-safe: str keys, lists, numbers).

Same names and call shape as TransferQueue's samplers (``SequentialSampler``,
``GRPOGroupNSampler``, ``RankAwareSampler``), plus a seeded ``RandomSampler``.  A sampler
written for TransferQueue plugs in unchanged: :class:`BaseSampler` has its
``has_cached_result``, ``clear_cache``, ``save_checkpoint`` and ``load_checkpoint``, and, as
TransferQueue's controller, the store calls such a sampler only when ``batch_size`` rows
are ready or :meth:`BaseSampler.has_cached_result` says a cached result exists (see
:attr:`BaseSampler.sees_short_ready`).
"""
from __future__ import annotations

import json
import logging
import zlib
from abc import ABC, abstractmethod
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple, Type, Union

import numpy as np

from .errors import ConfigError, InvalidInputError

log = logging.getLogger("tqstore")

SampleResult = Tuple[List[int], List[int]]


def describe_sampler(sampler: Any) -> str:
    """A sampler as its class and constructor arguments (``GRPOGroupNSampler(n_samples_per_prompt=4)``):
    what an attaching process's sampler must match."""
    import inspect

    try:
        params = [p for p in inspect.signature(type(sampler).__init__).parameters.values()
                  if p.name != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    except (TypeError, ValueError):
        params = []
    args = ", ".join(f"{p.name}={getattr(sampler, p.name, '?')!r}" for p in params)
    return f"{type(sampler).__name__}({args})"


class BaseSampler(ABC):
    """Base class of samplers. Subclasses implement :meth:`sample`.

    ``self._states`` maps partition id → task name → JSON-safe state.  The helpers
    :meth:`_cached` / :meth:`_remember` implement the per ``(task, dp_rank, batch_index)``
    result cache used by rank-aware sampling.
    """

    #: name written beside the persisted state; state saved by another sampler is ignored
    name: str = "base"
    #: whether :meth:`sample` reads ``ready_seqs`` (False spares a fetch a copy of them)
    uses_seqs: bool = True
    #: whether :meth:`sample` reads ``ready_tags`` (each ready row's tag, a copy; off by
    #: default: a fetch then copies no tags)
    uses_tags: bool = False
    #: whether :meth:`sample` is called when fewer than ``batch_size`` rows are ready and
    #: :meth:`has_cached_result` is False.  False (the default, TransferQueue's contract: its
    #: samplers may raise on too few rows): the fetch then returns no rows without calling
    #: the sampler.  tqstore's samplers set True: they decide themselves (and return
    #: ``([], [])`` when not enough).
    sees_short_ready: bool = False

    def __init__(self) -> None:
        self._states: Dict[str, Dict[str, Any]] = {}
        #: per partition, the cached results (task, rank, batch index) changed, added or dropped
        #: since the store last saved them (:meth:`take_changes`)
        self._changed: Dict[str, Set[Tuple[str, str, str]]] = {}

    @abstractmethod
    def sample(self, ready_indexes: List[int], batch_size: int, *, partition_id: str = "", task_name: str = "",
               ready_seqs: Optional[Sequence[int]] = None, **sampling_config: Any) -> SampleResult:
        """Choose rows from ``ready_indexes`` (global indexes, insertion order).

        Args:
            ready_indexes: rows whose requested fields are produced and that ``task_name``
                has not consumed, oldest first.
            batch_size: rows requested.
            partition_id, task_name: what is being sampled, for keeping state.
            ready_seqs: the partition-local insertion sequence number of each ready row
                (a store counts a partition's rows from 0, its first row put), parallel to
                ``ready_indexes`` (None when called without a store, or when the class sets
                ``uses_seqs = False``).
            ready_tags: (only for a class that sets ``uses_tags = True``) each ready row's
                tag, parallel to ``ready_indexes``: a sequence (``len``, indexing, slicing,
                iteration; ``list(ready_tags)`` for a list) whose items are copies made as
                they are read, valid during the call.
            **sampling_config: the ``sampling_config`` given to ``get_meta``.

        Returns:
            ``(sampled_indexes, consumed_indexes)``; ``([], [])`` when not enough rows.
        """

    def __call__(self, ready_indexes: List[int], batch_size: int, **kwargs: Any) -> SampleResult:
        return self.sample(ready_indexes, batch_size, **kwargs)

    def rows_per_fetch(self, batch_size: int) -> int:
        """The ready rows a fetch of ``batch_size`` needs before it answers (a whole batch;
        a sampler that fetches for every data-parallel rank at once needs all their rows)."""
        return batch_size

    # ------------------------------------------------------------------ state
    def _task_state(self, partition_id: str, task_name: str) -> Dict[str, Any]:
        return self._states.setdefault(partition_id, {}).setdefault(task_name, {})

    def state_dict(self, partition_id: str) -> Dict[str, Any]:
        """The JSON-safe state of one partition, as persisted by the store."""
        return {"sampler": self.name, "state": self._states.get(partition_id, {})}

    def state_without_cache(self, partition_id: str) -> Dict[str, Any]:
        """:meth:`state_dict` without the cached rank results (each task's ``"cache"``), which the
        store saves one by one as they change (:meth:`take_changes`)."""
        tasks = self._states.get(partition_id, {})
        return {"sampler": self.name, "state": {t: ({k: v for k, v in st.items() if k != "cache"}
                                                    if isinstance(st, dict) and "cache" in st else st)
                                                for t, st in tasks.items()}}

    def cached_entry(self, partition_id: str, name: Tuple[str, str, str]) -> Optional[List[Any]]:
        """The cached result ``[sampled, consumed, fetches]`` of ``name`` = (task, rank, batch
        index), or None."""
        task, rank, bi = name
        st = self._states.get(partition_id, {}).get(task)
        cache = st.get("cache") if isinstance(st, dict) else None
        return cache.get(rank, {}).get(bi) if isinstance(cache, dict) else None

    def cached_names(self, partition_id: str, task_name: Optional[str] = None) -> List[Tuple[str, str, str]]:
        """The (task, rank, batch index) of every cached result of a partition (of one task)."""
        out = []
        for task, st in self._states.get(partition_id, {}).items():
            if task_name is not None and task != task_name:
                continue
            cache = st.get("cache") if isinstance(st, dict) else None
            if isinstance(cache, dict):
                out.extend((task, rank, bi) for rank, per in cache.items() for bi in (per or {}))
        return out

    def take_changes(self, partition_id: str) -> Set[Tuple[str, str, str]]:
        """The cached results of a partition changed since the last call (the store saves
        them); the record of changes starts empty again."""
        return self._change_log().pop(partition_id, set())

    def _change_log(self) -> Dict[str, Set[Tuple[str, str, str]]]:
        # (created here too: a subclass may not have called BaseSampler.__init__)
        return self.__dict__.setdefault("_changed", {})

    def track_changes(self) -> None:
        """Record from now on which cached results change (:meth:`take_changes`); a store
        turns this on for the sampler it uses (a sampler used alone records nothing)."""
        self.__dict__["_tracks_changes"] = True

    def _touch(self, partition_id: str, task_name: str, dp_rank: Any, batch_index: Any) -> None:
        if self.__dict__.get("_tracks_changes"):
            self._change_log().setdefault(partition_id, set()).add((task_name, str(dp_rank), str(batch_index)))

    def load_state_dict(self, partition_id: str, saved: Optional[Mapping[str, Any]]) -> None:
        """Restore one partition's state saved by :meth:`state_dict` (None: start empty)."""
        self._states.pop(partition_id, None)
        self._change_log().pop(partition_id, None)
        if not saved:
            return
        if saved.get("sampler") != self.name:
            log.info("ignoring sampler state of partition %r saved by sampler %r (this store uses %r)",
                     partition_id, saved.get("sampler"), self.name)
            return
        self._states[partition_id] = json.loads(json.dumps(saved.get("state") or {}))

    def has_cached_result(self, partition_id: str, task_name: str,
                          sampling_config: Optional[Mapping[str, Any]] = None) -> bool:
        """TransferQueue's hook: whether a result for ``sampling_config``'s ``dp_rank`` /
        ``batch_index`` is cached for ``(partition_id, task_name)``, so a fetch with too few
        ready rows still hands it out.

        Looks in tqstore's cache (``_states[pid][task]["cache"][str(rank)][str(batch_index)]``,
        what :class:`RankAwareSampler` and :class:`GRPOGroupNSampler` keep) and in
        TransferQueue's layout (``_states[pid][task][dp_rank][batch_index]``, what samplers
        written for it keep).  False when ``dp_rank`` is not given.  Never raises.
        """
        cfg = sampling_config or {}
        dp_rank, batch_index = cfg.get("dp_rank"), cfg.get("batch_index")
        if dp_rank is None:
            return False
        task = self._states.get(partition_id, {}).get(task_name, {})
        if not isinstance(task, Mapping):
            return False
        cache = task.get("cache")
        if isinstance(cache, Mapping) and str(batch_index) in (cache.get(str(dp_rank)) or {}):
            return True
        per_rank = task.get(dp_rank)
        try:
            return per_rank is not None and batch_index in per_rank
        except TypeError:
            return False

    def save_checkpoint(self) -> Dict[str, Any]:
        """TransferQueue's hook: the sampler's state as ``{"_states": ...}`` (the live mapping).

        tqstore itself does not need it: the store persists each partition's state
        (:meth:`state_dict`) in the controller, in the transaction of the change, so it is in
        every checkpoint and survives a reopen.  Kept so that code written for TransferQueue
        that calls it (or overrides it) keeps working.
        """
        return {"_states": self._states}

    def load_checkpoint(self, state: Mapping[str, Any]) -> None:
        """TransferQueue's hook: restore what :meth:`save_checkpoint` returned.

        Raises:
            InvalidInputError: ``state`` is not a mapping with ``"_states"``.
        """
        if not isinstance(state, Mapping) or not isinstance(state.get("_states"), dict):
            raise InvalidInputError("load_checkpoint takes the mapping save_checkpoint returned ({'_states': {...}})")
        for new in (False, True):  # every cached result, old (dropped) and new, is saved again
            if new:
                self._states = state["_states"]
            for pid in self._states:
                for name in self.cached_names(pid):
                    self._touch(pid, *name)

    def forget_partition(self, partition_id: str) -> None:
        """The partition is gone: all its state goes (:meth:`clear_cache` may keep counters
        for the next epoch, a subclass's)."""
        self.clear_cache(partition_id)
        self._states.pop(partition_id, None)

    def clear_cache(self, partition_id: str, task_name: Optional[str] = None) -> None:
        """Forget the state of a partition (or of one task in it)."""
        for name in self.cached_names(partition_id, task_name):
            self._touch(partition_id, *name)
        if task_name is None:
            self._states.pop(partition_id, None)
        else:
            self._states.get(partition_id, {}).pop(task_name, None)

    def forget_rows(self, partition_id: str, gidxs: Iterable[int]) -> None:
        """Rows were cleared: drop cached results that mention any of them.

        Their global indexes may be reused by new rows, which must never be served from an
        old cached result.
        """
        gone = set(int(g) for g in gidxs)
        for task_name, task in self._states.get(partition_id, {}).items():
            cache = task.get("cache")
            if not cache:
                continue
            for rank in list(cache):
                for bi in list(cache[rank]):
                    sampled, consumed = cache[rank][bi][:2]
                    if gone.intersection(sampled) or gone.intersection(consumed):
                        del cache[rank][bi]
                        self._touch(partition_id, task_name, rank, bi)
                if not cache[rank]:
                    del cache[rank]

    # ------------------------------------------------------------------ rank cache
    def _cached(self, partition_id: str, task_name: str, dp_rank: Any, batch_index: Any,
                replicas: Optional[int] = None) -> Optional[SampleResult]:
        cache = self._states.get(partition_id, {}).get(task_name, {}).get("cache", {})
        entry = cache.get(str(dp_rank), {}).get(str(batch_index))
        if entry is None:
            return None
        sampled, consumed, fetches = entry
        fetches += 1
        self._touch(partition_id, task_name, dp_rank, batch_index)
        if replicas is not None and fetches >= replicas:
            del cache[str(dp_rank)][str(batch_index)]
            if not cache[str(dp_rank)]:
                del cache[str(dp_rank)]
        else:
            entry[2] = fetches
        return list(sampled), list(consumed)

    def _remember(self, partition_id: str, task_name: str, dp_rank: Any, batch_index: Any,
                  result: SampleResult, replicas: Optional[int] = None) -> None:
        if replicas is not None and replicas <= 1:
            return
        cache = self._task_state(partition_id, task_name).setdefault("cache", {})
        cache.setdefault(str(dp_rank), {})[str(batch_index)] = [list(result[0]), list(result[1]), 1]
        self._touch(partition_id, task_name, dp_rank, batch_index)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class SequentialSampler(BaseSampler):
    """The oldest ``batch_size`` ready rows; consumed as they are returned."""

    name = "sequential"
    uses_seqs = False
    sees_short_ready = True

    def sample(self, ready_indexes, batch_size, **kwargs) -> SampleResult:
        if len(ready_indexes) < batch_size:
            return [], []
        out = list(ready_indexes[:batch_size])
        return out, list(out)


class RankAwareSampler(BaseSampler):
    """Rank-aware sequential sampling for data-parallel groups.

    ``sampling_config`` must carry ``dp_rank`` and ``batch_index``.  The first caller for a
    ``(task, dp_rank, batch_index)`` samples the oldest ready rows and caches the result;
    every later caller with the same triple (the other ranks of that data-parallel group)
    gets the same rows.  Different ``dp_rank`` values get disjoint rows.

    Args:
        replicas: callers per ``dp_rank`` (ranks in one data-parallel group).  When given,
            a cached result is dropped after that many calls, bounding the state; when
            None (default) results stay cached until the partition is cleared or its
            consumption reset.
    """

    name = "rank_aware"
    uses_seqs = False
    sees_short_ready = True

    def __init__(self, replicas: Optional[int] = None) -> None:
        super().__init__()
        if replicas is not None and (not isinstance(replicas, int) or replicas < 1):
            raise ConfigError(f"replicas must be a positive int or None, got {replicas!r}")
        self.replicas = replicas

    def sample(self, ready_indexes, batch_size, *, partition_id="", task_name="", dp_rank=None, batch_index=None,
               **kwargs) -> SampleResult:
        if dp_rank is None or batch_index is None:
            raise InvalidInputError("RankAwareSampler needs sampling_config={'dp_rank': ..., 'batch_index': ...}")
        if isinstance(dp_rank, int) and dp_rank < 0:
            raise InvalidInputError(f"dp_rank must be greater than or equal to 0, got {dp_rank}")
        hit = self._cached(partition_id, task_name, dp_rank, batch_index, self.replicas)
        if hit is not None:
            return hit
        if len(ready_indexes) < batch_size:
            return [], []
        out = list(ready_indexes[:batch_size])
        self._remember(partition_id, task_name, dp_rank, batch_index, (out, out), self.replicas)
        return out, list(out)

    def __repr__(self) -> str:
        return f"RankAwareSampler(replicas={self.replicas})"


class GRPOGroupNSampler(BaseSampler):
    """Whole groups of ``n_samples_per_prompt`` consecutive rows, or nothing.

    Rows are grouped by insertion order within the partition: the rows with sequence
    numbers ``k*n .. k*n+n-1`` form group ``k`` (a store numbers a partition's rows from 0:
    put each prompt's ``n`` responses together, in whole groups).  A group is handed out only when all its rows are ready;
    ``batch_size`` must be a multiple of ``n``.  ``sampling_config`` may override
    ``n_samples_per_prompt``; with ``dp_rank`` and ``batch_index`` results are cached per
    rank like :class:`RankAwareSampler`.
    """

    name = "grpo_group_n"
    sees_short_ready = True

    def __init__(self, n_samples_per_prompt: int = 1) -> None:
        super().__init__()
        if not isinstance(n_samples_per_prompt, int) or n_samples_per_prompt < 1:
            raise ConfigError(f"n_samples_per_prompt must be positive (an int >= 1), got {n_samples_per_prompt!r}")
        self.n_samples_per_prompt = n_samples_per_prompt

    def sample(self, ready_indexes, batch_size, *, partition_id="", task_name="", ready_seqs=None, dp_rank=None,
               batch_index=None, n_samples_per_prompt=None, **kwargs) -> SampleResult:
        if dp_rank is not None:
            if batch_index is None:  # (every fetch would be handed the rank's first cached group again)
                raise InvalidInputError("GRPOGroupNSampler with a dp_rank needs a batch_index in sampling_config "
                                        "(the rank's replicas share the result cached under it)")
            hit = self._cached(partition_id, task_name, dp_rank, batch_index)
            if hit is not None:
                return hit
        seqs = ready_indexes if ready_seqs is None else ready_seqs  # without a store: gidx order
        out = self._whole_groups(zip(ready_indexes, seqs), batch_size, n_samples_per_prompt,
                                 in_order=isinstance(ready_seqs, SeqsInOrder))
        if not out:
            return [], []
        if dp_rank is not None:
            self._remember(partition_id, task_name, dp_rank, batch_index, (out, out))
        return out, list(out)

    def check_batch_size(self, batch_size: int, cfg: Dict[str, Any]) -> None:
        """Raise InvalidInputError when ``batch_size`` is not a multiple of the group size
        (``cfg``'s ``n_samples_per_prompt``, else the sampler's): a fetch checks it before it
        looks for rows, so a misconfigured consumer fails at once instead of waiting out its
        timeout while the partition is empty or missing.  (A subclass with a ``sample`` of
        its own decides for itself: nothing is checked here unless it overrides this too.)"""
        if type(self).sample is not GRPOGroupNSampler.sample:
            return
        self._check_group_multiple(batch_size, cfg)

    def _check_group_multiple(self, batch_size: int, cfg: Dict[str, Any]) -> None:
        _check_multiple(batch_size, self._group_n(cfg.get("n_samples_per_prompt")))

    def _group_n(self, n_samples_per_prompt: Optional[int]) -> int:
        """The group size: a call's ``n_samples_per_prompt`` (checked), else the sampler's."""
        return self.n_samples_per_prompt if n_samples_per_prompt is None else _group_size(n_samples_per_prompt)

    def _whole_groups(self, pairs: Iterable[Tuple[int, int]], batch_size: int,
                      n_samples_per_prompt: Optional[int] = None, *, in_order: bool = False) -> List[int]:
        """``batch_size`` rows of the oldest whole groups among ``pairs`` of (row, sequence
        number; ``in_order``: ascending sequence numbers), or [] when there are not enough.
        Raises InvalidInputError when ``batch_size`` is not a multiple of the group size."""
        n = self._group_n(n_samples_per_prompt)
        if batch_size <= 0:
            return []  # nothing asked: nothing handed out (as TransferQueue)
        _check_multiple(batch_size, n)
        out = _first_whole_groups(pairs, n, batch_size, in_order)
        return out if len(out) == batch_size else []

    def __repr__(self) -> str:
        return f"GRPOGroupNSampler(n_samples_per_prompt={self.n_samples_per_prompt})"


def _check_multiple(batch_size: int, n: int) -> None:
    """InvalidInputError unless ``batch_size`` (> 0) is a multiple of the group size ``n``."""
    if batch_size > 0 and batch_size % n:
        raise InvalidInputError(f"batch_size {batch_size} must be a multiple of n_samples_per_prompt {n}")


class SeqsInOrder(list):
    """Sequence numbers in ascending order: what a store passes as ``ready_seqs`` (its ready
    rows are oldest first), which lets grouping stop at the groups it needs."""

    __slots__ = ()


def _first_whole_groups(pairs: Iterable[Tuple[int, int]], n: int, batch_size: int, in_order: bool) -> List[int]:
    """The rows of the oldest whole groups (``n`` rows with sequence numbers ``k*n .. k*n+n-1``)
    among ``pairs`` of (row, sequence number), oldest group first, each group's rows in
    sequence order, up to ``batch_size`` rows.  Pairs known to be ``in_order`` of sequence
    number (as a store gives them) are read only as far as the groups taken; others are all
    grouped first."""
    if not in_order:
        return _whole_groups_any_order(pairs, n, batch_size)
    out: List[int] = []
    run: List[int] = []
    gid = None
    for g, sq in pairs:
        if sq // n != gid:
            if len(run) == n:
                out.extend(run)
                if len(out) == batch_size:
                    return out
            run, gid = [], sq // n
        run.append(g)
    if len(run) == n and len(out) < batch_size:
        out.extend(run)
    return out


def _whole_groups_any_order(pairs: Iterable[Tuple[int, int]], n: int, batch_size: int) -> List[int]:
    members: Dict[int, List[Tuple[int, int]]] = {}
    for g, sq in pairs:
        members.setdefault(sq // n, []).append((sq, g))
    out: List[int] = []
    for gid in sorted(members):
        grp = members[gid]
        if len(grp) == n:
            out.extend(g for _, g in sorted(grp))
            if len(out) == batch_size:
                break
    return out


class RandomSampler(BaseSampler):
    """``batch_size`` ready rows drawn uniformly without replacement, reproducibly.

    Draw ``i`` of a task uses a generator seeded from ``(seed, partition, task, i)``, and
    after the ``r``-th reset of the task's consumption from ``(seed, partition, task, i, r)``
    (each epoch another order; it was the first epoch's again); the counters are persisted,
    so a reopened store continues the same sequence.
    """

    name = "random"
    uses_seqs = False
    sees_short_ready = True

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        if not isinstance(seed, int) or seed < 0:
            raise ConfigError(f"seed must be a non-negative int, got {seed!r}")
        self.seed = seed

    def sample(self, ready_indexes, batch_size, *, partition_id="", task_name="", **kwargs) -> SampleResult:
        if len(ready_indexes) < batch_size:
            return [], []
        st = self._task_state(partition_id, task_name)
        draw, resets = int(st.get("draws", 0)), int(st.get("resets", 0))
        rng = np.random.default_rng([self.seed, zlib.crc32(partition_id.encode()), zlib.crc32(task_name.encode()),
                                     draw] + ([resets] if resets else []))
        pick = rng.choice(len(ready_indexes), size=batch_size, replace=False)
        st["draws"] = draw + 1
        out = [int(ready_indexes[i]) for i in pick]
        return out, list(out)

    def clear_cache(self, partition_id: str, task_name: Optional[str] = None) -> None:
        """As :meth:`BaseSampler.clear_cache`, but each task's count of resets is kept (one
        more): the next epoch draws another order."""
        resets = {t: int(st.get("resets", 0)) + 1 for t, st in self._states.get(partition_id, {}).items()
                  if task_name is None or t == task_name}
        super().clear_cache(partition_id, task_name)
        for t, r in resets.items():
            self._task_state(partition_id, t)["resets"] = r

    def __repr__(self) -> str:
        return f"RandomSampler(seed={self.seed})"


_REGISTRY: Dict[str, Type[BaseSampler]] = {}
for _cls in (SequentialSampler, RankAwareSampler, GRPOGroupNSampler, RandomSampler):
    _REGISTRY[_cls.name] = _cls
    _REGISTRY[_cls.__name__.lower()] = _cls


def register_sampler(cls: Type[BaseSampler]) -> None:
    """Let :func:`make_sampler` build ``cls`` by its ``name`` and its class name (a sampler
    module built on this one registers its class so: tqstore.seqlen_sampler)."""
    _REGISTRY[cls.name] = cls
    _REGISTRY[cls.__name__.lower()] = cls


def _group_size(n: Any) -> int:
    """A per-call ``sampling_config["n_samples_per_prompt"]``: a positive int (a numpy integer
    too).  Raises InvalidInputError for anything else (-2 gave no rows at every fetch, "2" and
    2.5 were taken as 2, 0 as the sampler's own)."""
    t = type(n)
    if t is bool or (t.__module__ == "numpy" and t.__name__ in ("bool", "bool_")) or not isinstance(n, (int, np.integer)) \
            or n < 1:
        raise InvalidInputError(f"sampling_config n_samples_per_prompt must be a positive int, got {n!r:.40}")
    return int(n)


def make_sampler(spec: Union[None, str, BaseSampler, Type[BaseSampler], Mapping[str, Any]]) -> BaseSampler:
    """Build a sampler from a config value.

    Accepts None (:class:`SequentialSampler`), an instance, a subclass, a name
    (``"sequential"``, ``"rank_aware"``, ``"grpo_group_n"``, ``"random"``, ``"seqlen_balanced"``
    or the class name, any case) or a mapping ``{"name": ..., **constructor_kwargs}``.

    Raises:
        ConfigError: unknown name, wrong type or bad constructor arguments.
    """
    if spec is None:
        return SequentialSampler()
    if isinstance(spec, BaseSampler):
        return spec
    if isinstance(spec, type) and issubclass(spec, BaseSampler):
        try:
            return spec()
        except TypeError as e:
            raise ConfigError(f"cannot construct sampler {spec.__name__} without arguments: {e}") from e
    kwargs: Dict[str, Any] = {}
    if isinstance(spec, Mapping):
        kwargs = dict(spec)
        spec = kwargs.pop("name", kwargs.pop("type", None))
    if isinstance(spec, str):
        cls = _REGISTRY.get(spec.lower())
        if cls is None:
            raise ConfigError(f"unknown sampler {spec!r}; known: {sorted(set(c.name for c in _REGISTRY.values()))}")
        try:
            return cls(**kwargs)
        except TypeError as e:
            raise ConfigError(f"bad arguments for sampler {spec!r}: {e}") from e
    raise ConfigError(f"sampler must be a name, a BaseSampler instance or subclass, or a mapping; got {spec!r}")


__all__ = ["SeqsInOrder", "BaseSampler", "SequentialSampler", "RankAwareSampler", "GRPOGroupNSampler", "RandomSampler",
           "make_sampler"]
