"""Sequence-length balanced sampling across data-parallel ranks (TransferQueue's ``SeqlenBalancedSampler``).

:func:`get_seqlen_balanced_partitions` is the Karmarkar-Karp largest-differencing split
(verl's ``seqlen_balancing``, same results as TransferQueue's copy): pure, no state.
:class:`SeqlenBalancedSampler` picks whole GRPO groups for the global batch
(``batch_size * dp_size``), then splits them across ranks so each rank's total of the
rows' ``total_lengths`` tag is near equal, keeping groups whole.
"""
from __future__ import annotations

import heapq
import logging
import math
import numbers
import operator
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from .errors import ConfigError, InvalidInputError
from .samplers import GRPOGroupNSampler, SampleResult, SeqsInOrder, register_sampler

log = logging.getLogger("tqstore")


class _Set:
    __slots__ = ("sum", "items")

    def __init__(self) -> None:
        self.sum = 0
        self.items: List[Tuple[int, int]] = []

    def add(self, idx: int, val: int) -> None:
        self.items.append((idx, val))
        self.sum += val

    def merge(self, other: "_Set") -> None:
        for idx, val in other.items:
            self.add(idx, val)

    def __lt__(self, other: "_Set") -> bool:
        if self.sum != other.sum:
            return self.sum < other.sum
        if len(self.items) != len(other.items):
            return len(self.items) < len(other.items)
        return self.items < other.items


class _State:
    __slots__ = ("k", "sets")

    def __init__(self, items: Sequence[Tuple[int, int]], k: int) -> None:
        self.k = k
        self.sets = [_Set() for _ in range(k)]
        for i, (idx, val) in enumerate(items):
            self.sets[i].add(idx, val)
        self.sets.sort(reverse=True)

    def merge(self, other: "_State") -> None:
        for i in range(self.k):
            self.sets[i].merge(other.sets[self.k - 1 - i])
        self.sets.sort(reverse=True)

    @property
    def spread(self) -> int:
        return self.sets[0].sum - self.sets[-1].sum

    def __lt__(self, other: "_State") -> bool:  # the largest spread pops first
        if self.spread != other.spread:
            return self.spread > other.spread
        return self.sets[0] > other.sets[0]


def karmarkar_karp(seqlen_list: Sequence[int], k_partitions: int, equal_size: bool) -> List[List[int]]:
    """k-way largest differencing: ``k_partitions`` lists of indexes into ``seqlen_list``."""
    ordered = sorted((v, i) for i, v in enumerate(seqlen_list))
    heap: List[_State] = []
    if equal_size:
        if len(seqlen_list) % k_partitions:
            raise AssertionError(f"{len(seqlen_list)} % {k_partitions} != 0")
        for off in range(0, len(ordered), k_partitions):
            heapq.heappush(heap, _State([(i, v) for v, i in ordered[off:off + k_partitions]], k_partitions))
    else:
        for v, i in ordered:
            heapq.heappush(heap, _State([(i, v)], k_partitions))
    while len(heap) > 1:
        a, b = heapq.heappop(heap), heapq.heappop(heap)
        a.merge(b)
        heapq.heappush(heap, a)
    return [[i for i, _ in s.items] for s in heap[0].sets]


def get_seqlen_balanced_partitions(seqlen_list: Sequence[int], k_partitions: int,
                                   equal_size: bool) -> List[List[int]]:
    """Split item indexes into ``k_partitions`` non-empty groups with near-equal sums of ``seqlen_list``.

    With ``equal_size`` every group has the same number of items (``len % k == 0``).
    Each group is sorted.  Raises AssertionError (as TransferQueue's) when there are fewer
    items than partitions or sizes do not divide.
    """
    if len(seqlen_list) < k_partitions:
        raise AssertionError(f"number of items:[{len(seqlen_list)}] < k_partitions:[{k_partitions}]")
    parts = karmarkar_karp(seqlen_list, k_partitions, equal_size)
    if len(parts) != k_partitions:
        raise AssertionError(f"{len(parts)} != {k_partitions}")
    seen = set()
    for i, p in enumerate(parts):
        if not p:
            raise AssertionError(f"the {i}-th partition is empty")
        if equal_size and len(p) * k_partitions != len(seqlen_list):
            raise AssertionError(f"{len(p)} * {k_partitions} != {len(seqlen_list)}")
        seen.update(p)
    if seen != set(range(len(seqlen_list))):
        raise AssertionError("partitions do not cover every item once")
    return [sorted(p) for p in parts]


class _TagsOf:
    """``gidx -> tag`` over the ready rows and their tags (parallel sequences): rows are
    indexed from the front as far as a lookup needs (the rows chosen are the oldest ones), and
    only the tags looked up are read."""

    __slots__ = ("_rows", "_tags", "_pos", "_seen")

    def __init__(self, rows: Sequence[int], tags: Sequence[Any]) -> None:
        self._rows, self._tags, self._pos, self._seen = rows, tags, {}, 0

    def get(self, gidx: int, default: Any = None) -> Any:
        i = self._pos.get(gidx)
        while i is None and self._seen < len(self._rows):
            g = self._rows[self._seen]
            self._pos[g] = self._seen
            self._seen += 1
            if g == gidx:
                i = self._seen - 1
        return default if i is None else self._tags[i]


def _lengths(partition: Any, gidxs: Sequence[int]) -> List[float]:
    """Each row's ``total_lengths`` tag entry (1 when absent); ``partition`` is a mapping
    gidx -> tag (what the store hands a sampler that sets ``uses_tags``) or TransferQueue's
    partition object.

    Raises InvalidInputError naming the first row whose entry is not a token count (a
    finite real number >= 0; a bool, None, text, a list or NaN is not): balancing cannot
    weigh it, and a bare TypeError from deep inside a fetch would not say which row."""
    if hasattr(partition, "get_custom_meta"):  # TransferQueue's partition object
        meta = partition.get_custom_meta(list(gidxs))
        tags = [meta.get(g, {}) for g in gidxs]
    else:
        tags = [partition.get(g) or {} for g in gidxs]
    out: List[float] = []
    for g, t in zip(gidxs, tags):
        v = t.get("total_lengths", 1) if isinstance(t, dict) else 1
        if type(v) is not int:
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v) or v < 0:
                raise InvalidInputError(f"SeqlenBalancedSampler: row {g}'s tag total_lengths={v!r:.60} is not a "
                                        f"token count (a number >= 0); set it with set_custom_meta (or kv_put "
                                        f"with a tag) to fetch the row")
            v = int(v) if isinstance(v, numbers.Integral) else float(v)
        elif v < 0:
            raise InvalidInputError(f"SeqlenBalancedSampler: row {g}'s tag total_lengths={v} is negative; set it "
                                    f"with set_custom_meta (or kv_put with a tag) to fetch the row")
        out.append(v)
    return out


class SeqlenBalancedSampler(GRPOGroupNSampler):
    """Whole GRPO groups for ``batch_size * dp_size`` rows, split across ``dp_size`` ranks by token count.

    Each rank calls ``get_meta`` with ``sampling_config={"dp_rank": r, "batch_index": i}`` and its
    per-rank ``batch_size``, a multiple of the group size (each rank gets whole groups; a
    ``batch_index`` is needed with ``dp_size > 1`` or a ``dp_rank``: one rank without either
    is handed fresh rows at every call, nothing cached).  The first call for
    ``(partition, task, batch_index)`` samples and balances for every rank and remembers each rank's share (in the persisted sampler state);
    later calls of the other ranks get theirs, and until a rank has fetched its share no
    other call chooses those rows again (a rank running ahead gets other rows).  Rows' tags should carry
    ``{"total_lengths": <int>}``; rows without it weigh 1.

    Args:
        n_samples_per_prompt: GRPO group size.
        dp_size: data-parallel ranks.
    """

    name = "seqlen_balanced"
    uses_tags = True  # the token counts are in the rows' tags

    def __init__(self, n_samples_per_prompt: int = 1, dp_size: int = 1) -> None:
        if not isinstance(dp_size, int) or dp_size <= 0:
            raise ConfigError(f"dp_size must be positive, got {dp_size}")
        super().__init__(n_samples_per_prompt=n_samples_per_prompt)
        self.dp_size = dp_size

    def rows_per_fetch(self, batch_size: int) -> int:
        """A fetch forms the global batch of every rank: ``batch_size * dp_size`` rows."""
        return batch_size * self.dp_size

    def check_batch_size(self, batch_size: int, cfg: Dict[str, Any]) -> None:
        """Raise InvalidInputError, before a fetch looks for rows, for a call this sampler
        can never answer right: a per-rank ``batch_size`` that is not a multiple of the group
        size (each rank gets whole groups: otherwise a group was split across ranks and the
        ranks got batches of other sizes than asked), a ``dp_rank`` that is not one of the
        ``dp_size`` ranks (:meth:`check_rank`), or no ``batch_index`` where a result is shared
        (:meth:`check_batch_index`)."""
        self.check_rank(cfg.get("dp_rank"))
        self.check_batch_index(cfg.get("dp_rank"), cfg.get("batch_index"))
        self._check_per_rank(batch_size, self._group_n(cfg.get("n_samples_per_prompt")))

    def check_batch_index(self, dp_rank: Any, batch_index: Any) -> None:
        """InvalidInputError when ``batch_index`` is None while ``dp_size > 1`` or a
        ``dp_rank`` is given: the first fetch of a batch caches every rank's share under its
        ``batch_index``, so without one every later fetch was handed that first share again
        (one batch trained on forever)."""
        if batch_index is None and (self.dp_size > 1 or dp_rank is not None):
            raise InvalidInputError(f"SeqlenBalancedSampler(dp_size={self.dp_size}) with a dp_rank or several "
                                    f"ranks needs a batch_index in sampling_config (each rank's share is cached "
                                    f"under it; count batches from 0, as StreamingDataset does)")

    def _check_per_rank(self, batch_size: int, n: int) -> None:
        if batch_size > 0 and batch_size % n:
            raise InvalidInputError(f"SeqlenBalancedSampler: the per-rank batch_size {batch_size} must be a "
                                    f"multiple of n_samples_per_prompt {n} (each rank gets whole groups)")

    def check_rank(self, dp_rank: Any) -> int:
        """``dp_rank`` (None: 0) as an int in ``[0, dp_size)``, else InvalidInputError: a rank
        past ``dp_size`` (``dp_size`` left at its default of 1, say) got an empty batch at every
        fetch, waiting forever, while its fetches set rows aside that no rank then fetched."""
        if dp_rank is None:
            return 0
        try:
            r = operator.index(dp_rank) if not isinstance(dp_rank, bool) else -1
        except TypeError:
            r = -1
        if not 0 <= r < self.dp_size:
            raise InvalidInputError(f"SeqlenBalancedSampler(dp_size={self.dp_size}): dp_rank must be an int in "
                                    f"[0, {self.dp_size}), got {dp_rank!r} (set dp_size to the number of "
                                    f"data-parallel ranks)")
        return r

    def sample(self, ready_indexes, batch_size, *, partition_id="", task_name="", partition=None, dp_rank=None,
               batch_index=None, ready_tags=None, **kwargs) -> SampleResult:
        """Raises InvalidInputError as :meth:`check_batch_size` does (but for a ``dp_rank``
        out of range: an empty result, TransferQueue's answer) and for a ``total_lengths``
        tag that is not a token count."""
        given_rank = dp_rank
        try:
            dp_rank = self.check_rank(dp_rank)
        except InvalidInputError:  # TransferQueue's answer, nothing set aside (a store's fetch refused it first)
            return [], []
        n = self._group_n(kwargs.get("n_samples_per_prompt"))  # (a call's own group size, else the sampler's)
        self._check_per_rank(batch_size, n)
        self.check_batch_index(given_rank, batch_index)
        if batch_index is None:  # one rank, no replicas: nothing to share or balance, nothing cached
            chosen = self._choose(ready_indexes, kwargs.get("ready_seqs"), batch_size, n, partition_id, task_name)
            return chosen, list(chosen)
        hit = self._cached(partition_id, task_name, dp_rank, batch_index)
        if hit is not None:
            self._fetched(partition_id, task_name, str(dp_rank), str(batch_index))
            return hit
        if partition is None and ready_tags is not None:
            partition = _TagsOf(ready_indexes, ready_tags)
        chosen = self._choose(ready_indexes, kwargs.get("ready_seqs"), batch_size * self.dp_size, n, partition_id,
                              task_name)
        if not chosen:
            return [], []
        if partition is None:
            log.warning("SeqlenBalancedSampler: no partition given, splitting equally without balancing")
            size = len(chosen) // self.dp_size  # (whole groups: batch_size is a multiple of n)
            shares = [chosen[r * size:(r + 1) * size] for r in range(self.dp_size)]
        else:  # whole groups, dp_size * batch_size / n of them: the ranks get batch_size / n each
            lengths = _lengths(partition, chosen)
            weights = [sum(lengths[g * n:(g + 1) * n]) for g in range(len(chosen) // n)]
            shares = [[chosen[g * n + s] for g in part for s in range(n)]
                      for part in get_seqlen_balanced_partitions(weights, self.dp_size, equal_size=True)]
        pending = self._pending_of(partition_id, task_name)
        for r in range(self.dp_size):
            self._remember(partition_id, task_name, r, batch_index, (shares[r], shares[r]))
            if r != dp_rank:  # (fetched 0 times: its rows wait for rank r, see _waiting)
                self._task_state(partition_id, task_name)["cache"][str(r)][str(batch_index)][2] = 0
                pending[(str(r), str(batch_index))] = list(shares[r])
        mine = shares[dp_rank] if 0 <= dp_rank < len(shares) else []
        return list(mine), list(mine)

    def _choose(self, ready_indexes, seqs, rows: int, n: int, partition_id: str, task_name: str) -> List[int]:
        """The oldest whole groups of ``n``, ``rows`` rows in all, or []; rows of other ranks'
        shares they have not fetched yet are not chosen again."""
        waiting = self._waiting(partition_id, task_name)
        pairs = zip(ready_indexes, ready_indexes if seqs is None else seqs)
        if waiting:
            pairs = ((g, sq) for g, sq in pairs if g not in waiting)
        return self._whole_groups(pairs, rows, n, in_order=isinstance(seqs, SeqsInOrder))

    def _waiting(self, partition_id: str, task_name: str) -> set:
        """The rows of cached shares their rank has not fetched yet.  Each rank's call marks
        only its own share consumed (TransferQueue's contract), so without this a rank running
        ahead would be handed rows of another rank's pending share a second time."""
        pending = self._pending_of(partition_id, task_name)
        return set().union(*pending.values()) if pending else set()

    def _pending_of(self, partition_id: str, task_name: str) -> Dict[Tuple[str, str], List[int]]:
        """``{(rank, batch index): rows}`` of the shares not fetched yet (kept beside the cache:
        built from it once, then changed with it, so a call does not scan every result cached)."""
        index = self.__dict__.setdefault("_pending", {})
        got = index.get((partition_id, task_name))
        if got is None:
            cache = self._states.get(partition_id, {}).get(task_name, {}).get("cache", {})
            got = index[(partition_id, task_name)] = {
                (rank, bi): list(entry[0]) for rank, per_bi in cache.items() for bi, entry in per_bi.items()
                if entry[2] == 0}
        return got

    def _fetched(self, partition_id: str, task_name: str, rank: str, batch_index: str) -> None:
        got = self.__dict__.get("_pending", {}).get((partition_id, task_name))
        if got is not None:
            got.pop((rank, batch_index), None)

    def _forget_pending(self, partition_id: Optional[str] = None) -> None:
        index = self.__dict__.get("_pending")
        if index:
            for key in [k for k in index if partition_id is None or k[0] == partition_id]:
                del index[key]

    # the cache changes outside sample(): the pending shares are taken from it again
    def load_state_dict(self, partition_id: str, saved: Optional[Mapping[str, Any]]) -> None:
        super().load_state_dict(partition_id, saved)
        self._forget_pending(partition_id)

    def clear_cache(self, partition_id: str, task_name: Optional[str] = None) -> None:
        super().clear_cache(partition_id, task_name)
        self._forget_pending(partition_id)

    def forget_rows(self, partition_id: str, gidxs: Iterable[int]) -> None:
        super().forget_rows(partition_id, gidxs)
        self._forget_pending(partition_id)

    def load_checkpoint(self, state: Mapping[str, Any]) -> None:
        super().load_checkpoint(state)
        self._forget_pending()

    @property
    def _balanced_cache(self) -> Dict[Tuple[str, str, str], Dict[str, List[int]]]:
        """``{(partition, task, batch_index): {dp_rank: rows}}``, read from the persisted state."""
        out: Dict[Tuple[str, str, str], Dict[str, List[int]]] = {}
        for pid, tasks in self._states.items():
            for task, st in tasks.items():
                for rank, per_bi in st.get("cache", {}).items():
                    for bi, entry in per_bi.items():
                        out.setdefault((pid, task, bi), {})[rank] = list(entry[0])
        return out

    def __repr__(self) -> str:
        return f"SeqlenBalancedSampler(n_samples_per_prompt={self.n_samples_per_prompt}, dp_size={self.dp_size})"



register_sampler(SeqlenBalancedSampler)  # (set_sampler and make_sampler take it by name)

__all__ = ["SeqlenBalancedSampler", "get_seqlen_balanced_partitions", "karmarkar_karp"]
