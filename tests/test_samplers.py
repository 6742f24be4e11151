"""Samplers behind get_meta(mode="fetch"): sequential, GRPO group-of-N, rank-aware, seeded
random, and a user-defined one; their state lives in the controller and survives reopen.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import tqstore as tq
from tqstore import (
    BaseSampler, ConfigError, GRPOGroupNSampler, InvalidInputError, RandomSampler, RankAwareSampler,
    SequentialSampler, StoreClosedError,
)
from tqstore.samplers import make_sampler


def _open(path, sampler=None):
    s = tq.open(path, num_units=2)
    if sampler is not None:
        s.set_sampler(sampler)
    return s


def _put(s, n, pid="p", start=0, field="x"):
    return s.put({field: torch.arange(start, start + n).reshape(n, 1)}, partition_id=pid)


def _values(s, meta, field="x"):
    return s.get_data(meta)[field].reshape(-1).tolist()


# ---------------------------------------------------------------------------------- sequential

def test_sequential_hands_out_rows_in_insertion_order_even_when_indexes_are_reused(tmp_path):
    with _open(tmp_path / "s") as s:
        assert isinstance(s.sampler, SequentialSampler)
        other = _put(s, 4, pid="other")
        first = _put(s, 2, start=0)
        s.clear_samples(other[1:3])  # frees two indexes lower than first's
        second = _put(s, 2, start=2)  # newer rows, lower global indexes
        assert max(second.global_indexes) < min(first.global_indexes)
        got = []
        for _ in range(4):
            got += _values(s, s.get_meta(["x"], 1, "p", task_name="t"))
        assert got == [0, 1, 2, 3]


# ---------------------------------------------------------------------------------- GRPO

def test_grpo_only_hands_out_whole_groups_of_consecutive_rows(tmp_path):
    with _open(tmp_path / "s", GRPOGroupNSampler(n_samples_per_prompt=3)) as s:
        ins = s.get_meta(["resp"], 9, "p", mode="insert")  # 3 prompts x 3 responses
        s.put({"resp": torch.arange(3).reshape(3, 1)}, ins[0:3])  # group 0 complete
        s.put({"resp": torch.arange(3, 5).reshape(2, 1)}, ins[3:5])  # group 1 missing one
        s.put({"resp": torch.arange(6, 9).reshape(3, 1)}, ins[6:9])  # group 2 complete
        assert s.get_meta(["resp"], 9, "p", task_name="t").size == 0
        first = s.get_meta(["resp"], 6, "p", task_name="t")
        assert _values(s, first, "resp") == [0, 1, 2, 6, 7, 8]
        assert s.get_meta(["resp"], 3, "p", task_name="t").size == 0  # group 1 still incomplete
        s.put({"resp": torch.tensor([[5]])}, ins[5:6])
        assert _values(s, s.get_meta(["resp"], 3, "p", task_name="t"), "resp") == [3, 4, 5]


def test_grpo_groups_follow_insertion_order_not_global_indexes(tmp_path):
    with _open(tmp_path / "s", GRPOGroupNSampler(n_samples_per_prompt=2)) as s:
        _put(s, 1, pid="other")  # p's rows start at global index 1: groups straddle index pairs
        m = _put(s, 4)
        assert m.global_indexes == [1, 2, 3, 4]
        assert _values(s, s.get_meta(["x"], 4, "p", task_name="t")) == [0, 1, 2, 3]


@pytest.mark.parametrize("n", [37, 41, 512])
def test_grpo_groups_of_any_size_start_at_the_partitions_first_row_and_survive_a_reopen(tmp_path, n):
    """Group sizes whose primes or powers no partition's first sequence number is a multiple
    of (its start is random) grouped rows of two prompts together; after a reopen the rows of a
    group begun before it are completed by the rows put after it."""
    groups = 3
    with _open(tmp_path / "s", GRPOGroupNSampler(n_samples_per_prompt=n)) as s:
        _put(s, n + n // 2)  # group 0 and half of group 1
    with _open(tmp_path / "s", GRPOGroupNSampler(n_samples_per_prompt=n)) as s:
        _put(s, groups * n - (n + n // 2), start=n + n // 2)
        got = [_values(s, s.get_meta(["x"], n, "p", task_name="t")) for _ in range(groups)]
        assert got == [list(range(k * n, k * n + n)) for k in range(groups)]


def test_set_sampler_takes_the_seqlen_balanced_sampler_by_name_as_init_does(tmp_path):
    with _open(tmp_path / "s") as s:
        for spec in ({"name": "seqlen_balanced", "n_samples_per_prompt": 2, "dp_size": 2}, "SeqlenBalancedSampler"):
            assert isinstance(s.set_sampler(spec), tq.SeqlenBalancedSampler)
        with pytest.raises(ConfigError, match="seqlen_balanced"):
            s.set_sampler("no_such_sampler")


def test_grpo_with_a_dp_rank_needs_a_batch_index(tmp_path):
    """A dp_rank without a batch_index cached the rank's first group under batch index None and
    handed it out again at every fetch (a consumer never got further); as RankAwareSampler."""
    with _open(tmp_path / "s", GRPOGroupNSampler(n_samples_per_prompt=2)) as s:
        _put(s, 4)
        with pytest.raises(InvalidInputError, match="batch_index"):
            s.get_meta(["x"], 2, "p", task_name="t", sampling_config={"dp_rank": 0})
        _, consumed = s.get_consumption_status("t", "p")
        assert consumed.sum().item() == 0
        assert _values(s, s.get_meta(["x"], 2, "p", task_name="t")) == [0, 1]


def test_grpo_rejects_a_batch_size_that_is_not_a_multiple_of_the_group(tmp_path):
    with _open(tmp_path / "s", GRPOGroupNSampler(n_samples_per_prompt=4)) as s:
        _put(s, 8)
        with pytest.raises(InvalidInputError):
            s.get_meta(["x"], 6, "p", task_name="t")
        _, consumed = s.get_consumption_status("t", "p")
        assert consumed.sum().item() == 0


def test_grpo_groups_by_gidx_when_used_without_a_store():
    sampler = GRPOGroupNSampler(n_samples_per_prompt=3)
    assert sampler([0, 1, 3, 4, 5, 6, 7, 9, 10, 11], 6) == ([3, 4, 5, 9, 10, 11], [3, 4, 5, 9, 10, 11])
    assert sampler([0, 1, 3, 4, 6, 7], 6) == ([], [])


def test_grpo_rank_cache_survives_reopen(tmp_path):
    path = tmp_path / "s"
    cfg = {"dp_rank": 0, "batch_index": 0}
    with _open(path, GRPOGroupNSampler(2)) as s:
        _put(s, 4)
        first = s.get_meta(["x"], 2, "p", task_name="t", sampling_config=cfg)
    with _open(path, GRPOGroupNSampler(2)) as s:
        again = s.get_meta(["x"], 2, "p", task_name="t", sampling_config=cfg)
        assert again.global_indexes == first.global_indexes


# ---------------------------------------------------------------------------------- rank-aware

def test_rank_aware_gives_every_rank_of_a_group_the_same_rows_and_groups_disjoint_rows(tmp_path):
    with _open(tmp_path / "s", "rank_aware") as s:
        _put(s, 8)
        get = lambda rank, b: s.get_meta(["x"], 2, "p", task_name="t",  # noqa: E731
                                         sampling_config={"dp_rank": rank, "batch_index": b})
        r0 = get(0, 0)
        r1 = get(1, 0)
        assert get(0, 0).global_indexes == r0.global_indexes  # tensor-parallel peer of rank 0
        assert get(1, 0).global_indexes == r1.global_indexes
        assert set(r0.global_indexes).isdisjoint(r1.global_indexes)
        assert set(get(0, 1).global_indexes).isdisjoint(r0.global_indexes + r1.global_indexes)


def test_rank_aware_cache_survives_reopen(tmp_path):
    path = tmp_path / "s"
    with _open(path, RankAwareSampler()) as s:
        _put(s, 4)
        first = s.get_meta(["x"], 2, "p", task_name="t", sampling_config={"dp_rank": 3, "batch_index": 7})
    with _open(path, RankAwareSampler()) as s:
        peer = s.get_meta(["x"], 2, "p", task_name="t", sampling_config={"dp_rank": 3, "batch_index": 7})
        assert peer.global_indexes == first.global_indexes
        other = s.get_meta(["x"], 2, "p", task_name="t", sampling_config={"dp_rank": 4, "batch_index": 7})
        assert set(other.global_indexes).isdisjoint(first.global_indexes)


def test_rank_aware_needs_dp_rank_and_batch_index(tmp_path):
    with _open(tmp_path / "s", RankAwareSampler()) as s:
        _put(s, 2)
        with pytest.raises(InvalidInputError):
            s.get_meta(["x"], 1, "p", task_name="t")
        with pytest.raises(InvalidInputError):
            s.get_meta(["x"], 1, "p", task_name="t", sampling_config={"dp_rank": 0})


def test_rank_aware_with_replicas_drops_a_result_after_every_replica_got_it(tmp_path):
    with _open(tmp_path / "s", RankAwareSampler(replicas=2)) as s:
        _put(s, 4)
        cfg = {"dp_rank": 0, "batch_index": 0}
        a = s.get_meta(["x"], 2, "p", task_name="t", sampling_config=cfg)
        b = s.get_meta(["x"], 2, "p", task_name="t", sampling_config=cfg)
        assert a.global_indexes == b.global_indexes
        assert s.sampler._states["p"]["t"]["cache"] == {}
        c = s.get_meta(["x"], 2, "p", task_name="t", sampling_config=cfg)  # a third caller: fresh rows
        assert set(c.global_indexes).isdisjoint(a.global_indexes)


def test_cleared_rows_are_never_served_from_a_cached_result(tmp_path):
    with _open(tmp_path / "s", RankAwareSampler()) as s:
        m = _put(s, 2)
        cfg = {"dp_rank": 0, "batch_index": 0}
        s.get_meta(["x"], 2, "p", task_name="t", sampling_config=cfg)
        s.clear_samples(m)
        _put(s, 2, start=10)  # reuses the freed global indexes
        again = s.get_meta(["x"], 2, "p", task_name="t", sampling_config=cfg)
        assert _values(s, again) == [10, 11]  # freshly sampled, not the stale cached rows


def test_clear_partition_and_reset_consumption_drop_the_sampler_state(tmp_path):
    path = tmp_path / "s"
    cfg = {"dp_rank": 0, "batch_index": 0}
    with _open(path, RankAwareSampler()) as s:
        _put(s, 2)
        s.get_meta(["x"], 2, "p", task_name="t", sampling_config=cfg)
        s.clear_partition("p")
        assert s.controller.sampler_state("p") is None
        _put(s, 2, start=5)
        assert _values(s, s.get_meta(["x"], 2, "p", task_name="t", sampling_config=cfg)) == [5, 6]
        s.reset_consumption("p", "t")
    with _open(path, RankAwareSampler()) as s:
        assert s.get_meta(["x"], 2, "p", task_name="t", sampling_config={"dp_rank": 0, "batch_index": 0}).size == 2
        assert s.sampler._states["p"]["t"]["cache"]["0"]["0"][2] == 1  # sampled afresh after the reset


# ---------------------------------------------------------------------------------- random

def _draws(s, n):
    return [s.get_meta(["x"], 3, "p", task_name="t").global_indexes for _ in range(n)]


def test_random_sampler_is_reproducible_and_continues_after_reopen(tmp_path):
    with _open(tmp_path / "a", RandomSampler(seed=7)) as s:
        _put(s, 30)
        straight = _draws(s, 4)
    with _open(tmp_path / "b", RandomSampler(seed=7)) as s:
        _put(s, 30)
        resumed = _draws(s, 2)
    with _open(tmp_path / "b", RandomSampler(seed=7)) as s:
        resumed += _draws(s, 2)
    assert resumed == straight
    assert sorted(sum(straight, [])) == sorted(set(sum(straight, [])))  # without replacement
    assert straight[0] != sorted(straight[0]) or straight[1] != sorted(straight[1])  # not just in order
    with _open(tmp_path / "c", RandomSampler(seed=8)) as s:
        _put(s, 30)
        assert _draws(s, 4) != straight


def test_random_sampler_draws_another_order_after_each_reset_and_reproducibly(tmp_path):
    """reset_consumption (a new epoch) started the draws over: every epoch had the first
    epoch's batches in the first epoch's order."""
    def epochs(path, k):
        out = []
        with _open(path, RandomSampler(seed=3)) as s:
            _put(s, 8)
            for e in range(k):
                out.append([s.get_meta(["x"], 2, "p", task_name="t").global_indexes for _ in range(4)])
                assert sorted(sum(out[-1], [])) == list(range(8)), "an epoch hands out every row once"
                assert s.reset_consumption("p", "t")
        return out

    with _open(tmp_path / "c", RandomSampler(seed=3)) as s:  # a cleared partition leaves no state behind
        for i in range(3):
            _put(s, 4, pid=f"step{i}")
            s.get_meta(["x"], 2, f"step{i}", task_name="t")
            s.reset_consumption(f"step{i}", "t")
            s.clear_partition(f"step{i}")
        assert s.sampler._states == {}
    a = epochs(tmp_path / "a", 3)
    assert a[0] != a[1] and a[1] != a[2] and a[0] != a[2]
    assert epochs(tmp_path / "b", 3) == a, "reproducible"
    with _open(tmp_path / "a", RandomSampler(seed=3)) as s:  # the reset count is persisted
        assert [s.get_meta(["x"], 2, "p", task_name="t").global_indexes for _ in range(4)] not in a


def test_state_saved_by_another_sampler_kind_is_ignored(tmp_path):
    path = tmp_path / "s"
    with _open(path, RandomSampler(seed=1)) as s:
        _put(s, 6)
        _draws(s, 1)
    with _open(path, RankAwareSampler()) as s:
        meta = s.get_meta(["x"], 1, "p", task_name="t", sampling_config={"dp_rank": 0, "batch_index": 0})
        assert meta.size == 1 and "draws" not in str(s.sampler._states)


# ---------------------------------------------------------------------------------- pluggable

class NewestFirst(BaseSampler):
    """Hands out the newest ready rows and counts its calls in persisted state."""

    name = "newest_first"

    def sample(self, ready_indexes, batch_size, *, partition_id="", task_name="", **kw):
        if len(ready_indexes) < batch_size:
            return [], []
        st = self._task_state(partition_id, task_name)
        st["calls"] = st.get("calls", 0) + 1
        out = list(reversed(ready_indexes))[:batch_size]
        return out, out


def test_a_user_sampler_plugs_in_and_its_state_survives_reopen(tmp_path):
    path = tmp_path / "s"
    with _open(path, NewestFirst) as s:
        _put(s, 5)
        assert _values(s, s.get_meta(["x"], 2, "p", task_name="t")) == [4, 3]
    with _open(path, NewestFirst()) as s:
        assert _values(s, s.get_meta(["x"], 2, "p", task_name="t")) == [2, 1]
        assert s.sampler._states["p"]["t"]["calls"] == 2


class Liar(BaseSampler):
    name = "liar"

    def sample(self, ready_indexes, batch_size, **kw):
        return [10_000], [10_000]


def test_a_sampler_returning_unknown_rows_is_rejected_and_nothing_consumed(tmp_path):
    with _open(tmp_path / "s", Liar()) as s:
        _put(s, 2)
        with pytest.raises(InvalidInputError):
            s.get_meta(["x"], 1, "p", task_name="t")
        assert s.get_consumption_status("t", "p")[1].tolist() == [0, 0]


# ---------------------------------------------------------------------------------- configuration

@pytest.mark.parametrize("spec, cls", [
    (None, SequentialSampler), ("sequential", SequentialSampler), ("SequentialSampler", SequentialSampler),
    ("GRPOGroupNSampler", GRPOGroupNSampler), ("rank_aware", RankAwareSampler), (RandomSampler, RandomSampler),
    ({"name": "grpo_group_n", "n_samples_per_prompt": 4}, GRPOGroupNSampler),
])
def test_make_sampler_accepts_names_classes_and_mappings(spec, cls):
    assert type(make_sampler(spec)) is cls


@pytest.mark.parametrize("spec", ["nope", 3, {"name": "random", "seed": -1}, {"name": "grpo_group_n", "bad": 1},
                                  {"name": "rank_aware", "replicas": 0}])
def test_make_sampler_rejects_bad_specs_with_config_error(spec):
    with pytest.raises(ConfigError):
        make_sampler(spec)


def test_init_honours_the_sampler_config_key(tmp_path):
    tq.close()
    try:
        s = tq.init({"path": str(tmp_path / "s"), "sampler": {"name": "grpo_group_n", "n_samples_per_prompt": 2}})
        assert isinstance(s.sampler, GRPOGroupNSampler) and s.sampler.n_samples_per_prompt == 2
        tq.close()
        with pytest.raises(ConfigError):
            tq.init({"path": str(tmp_path / "t"), "sampler": "no-such-sampler"})
        with pytest.raises(StoreClosedError):
            tq.current_store()
        assert not (tmp_path / "t").exists()
    finally:
        tq.close()


# ---------------------------------------------------------------------------------- TransferQueue's hooks

class StrictTQSampler(BaseSampler):
    """Written as for TransferQueue: raises on too few rows, caches per (dp_rank, batch_index) in its layout."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def sample(self, ready_indexes, batch_size, *args, dp_rank=None, batch_index=None, partition_id="",
               task_name="", **kwargs):
        self.calls += 1
        if dp_rank is not None and self.has_cached_result(partition_id, task_name,
                                                          {"dp_rank": dp_rank, "batch_index": batch_index}):
            return list(self._states[partition_id][task_name][dp_rank][batch_index]), []
        if len(ready_indexes) < batch_size:
            raise ValueError("Not enough ready indexes to sample from.")
        out = list(ready_indexes[:batch_size])
        if dp_rank is not None:
            self._states.setdefault(partition_id, {}).setdefault(task_name, {}).setdefault(dp_rank, {})[
                batch_index] = out
        return out, list(out)


def test_a_transferqueue_sampler_is_not_called_with_too_few_ready_rows(tmp_path):
    sampler = StrictTQSampler()
    with _open(tmp_path / "s", sampler) as s:
        _put(s, 2)
        assert s.get_meta(["x"], 3, "p", task_name="t").size == 0  # no ValueError: not called
        assert sampler.calls == 0
        assert _values(s, s.get_meta(["x"], 2, "p", task_name="t")) == [0, 1]
        assert sampler.calls == 1


def test_a_transferqueue_sampler_with_a_cached_result_is_called_although_rows_are_short(tmp_path):
    sampler = StrictTQSampler()
    cfg = {"dp_rank": 0, "batch_index": 0}
    with _open(tmp_path / "s", sampler) as s:
        _put(s, 2)
        first = s.get_meta(["x"], 2, "p", task_name="t", sampling_config=cfg)
        assert sampler.has_cached_result("p", "t", cfg) and not sampler.has_cached_result("p", "t", {"dp_rank": 1})
        again = s.get_meta(["x"], 2, "p", task_name="t", sampling_config=cfg)  # 0 ready rows, cached result
        assert again.global_indexes == first.global_indexes


def test_has_cached_result_reads_tqstores_rank_cache(tmp_path):
    cfg = {"dp_rank": 1, "batch_index": 4}
    with _open(tmp_path / "s", RankAwareSampler()) as s:
        _put(s, 2)
        assert not s.sampler.has_cached_result("p", "t", cfg)
        s.get_meta(["x"], 2, "p", task_name="t", sampling_config=cfg)
        assert s.sampler.has_cached_result("p", "t", cfg)
        assert not s.sampler.has_cached_result("p", "t", {"dp_rank": 1, "batch_index": 5})
        assert not s.sampler.has_cached_result("p", "t", None)  # no dp_rank: False, as TransferQueue
        assert not s.sampler.has_cached_result("other", "t", cfg)


def test_save_checkpoint_and_load_checkpoint_round_trip_the_states_as_transferqueue():
    a = RankAwareSampler()
    a._states["p"] = {"t": {"cache": {"0": {"0": [[1], [1], 1]}}}}
    saved = a.save_checkpoint()
    assert saved == {"_states": a._states}
    b = RankAwareSampler()
    b.load_checkpoint(saved)
    assert b.has_cached_result("p", "t", {"dp_rank": 0, "batch_index": 0})
    with pytest.raises(InvalidInputError):
        b.load_checkpoint({"states": {}})


def test_seqlen_sampler_keeps_grpo_groups_whole_when_a_rank_runs_ahead_past_an_unfinished_group(tmp_path):
    """Rows of another rank's pending share are left out of the next global batch; the group
    of each remaining row is still told by its own sequence number (they were paired with the
    sequence numbers of the rows before them, so rows of two prompts made one "group")."""
    with tq.open(tmp_path / "s", num_units=1) as s:
        s.set_sampler(tq.SeqlenBalancedSampler(n_samples_per_prompt=2, dp_size=2))
        meta = s.get_meta(["x"], 10, "p", mode="insert")  # groups {0,1} {2,3} {4,5} {6,7} {8,9}
        done = [i for i in range(10) if i != 7]  # the second response of prompt 3 is not finished
        s.put({"x": torch.arange(9).view(9, 1)}, metadata=meta.select_samples(done))

        def fetch(rank, bi):
            return s.get_meta(["x"], 2, "p", task_name="t",
                              sampling_config={"dp_rank": rank, "batch_index": bi}).global_indexes

        first = fetch(0, 0)  # the global batch {0,1} {2,3}, one group for each rank
        ahead = fetch(0, 1)  # rank 1 has not fetched its share of batch 0 yet
        other = fetch(1, 0)
        assert sorted(first + other) == [0, 1, 2, 3]
        for share in (first, other, ahead):
            assert len(share) == 2 and share[0] // 2 == share[1] // 2, f"{share} is not one prompt's group"
        assert ahead in ([4, 5], [8, 9])


@pytest.mark.parametrize("rank", [2, -1, "0", 1.0, True])
def test_seqlen_sampler_refuses_a_rank_past_its_dp_size_at_once_and_sets_nothing_aside(tmp_path, rank):
    """A rank past dp_size (dp_size left at 1, say) got an empty batch at every fetch, so it
    waited forever, and each fetch set rows aside that reordered the real ranks' batches."""
    with tq.open(tmp_path / "s", num_units=1) as s:
        s.set_sampler(tq.SeqlenBalancedSampler(n_samples_per_prompt=2, dp_size=2))
        s.put({"x": torch.arange(8).view(8, 1)}, partition_id="p")
        with pytest.raises(tq.InvalidInputError, match=r"dp_rank must be an int in \[0, 2\)"):
            s.get_meta(["x"], 2, "p", task_name="t", sampling_config={"dp_rank": rank, "batch_index": 0})
        got = s.get_meta(["x"], 2, "p", task_name="t", sampling_config={"dp_rank": 0, "batch_index": 0})
        assert len(got.global_indexes) == 2 and int(s.get_consumption_status("t", "p")[1].sum()) == 2
    sampler = tq.SeqlenBalancedSampler(dp_size=2)
    assert sampler.check_rank(np.int64(1)) == 1
    # called on its own (as TransferQueue's tests do): an empty result, nothing set aside
    assert sampler.sample([0, 1, 2, 3], 2, partition_id="p", task_name="t", dp_rank=5, batch_index=0) == ([], [])
    assert sampler.cached_names("p") == []


def test_seqlen_sampler_balances_the_groups_of_a_per_call_group_size(tmp_path):
    """``sampling_config``'s ``n_samples_per_prompt`` chose the groups but the sampler's own n
    cut them for balancing: groups of 4 were split across the ranks (n=2 built in)."""
    with tq.open(tmp_path / "s", num_units=1) as s:
        s.set_sampler(tq.SeqlenBalancedSampler(n_samples_per_prompt=2, dp_size=2))
        lengths = [1, 1000, 1, 1, 1000, 1000, 1, 1000, 1, 1, 1, 1000, 1000, 1, 1, 1]
        for g in range(4):
            m = s.get_meta(["x"], 4, "p", mode="insert")
            for j in range(4):
                m.custom_meta[j] = {"total_lengths": lengths[4 * g + j]}
            s.put({"x": torch.full((4, 1), g)}, metadata=m)
        shares = [_values(s, s.get_meta(["x"], 8, "p", task_name="t", sampling_config={
            "dp_rank": r, "batch_index": 0, "n_samples_per_prompt": 4})) for r in range(2)]
        assert sorted(shares[0] + shares[1]) == [0] * 4 + [1] * 4 + [2] * 4 + [3] * 4
        for share in shares:
            assert share[:4] == [share[0]] * 4 and share[4:] == [share[4]] * 4, f"{shares}: a group was split"


def test_grpo_sampler_takes_the_oldest_whole_groups_in_any_row_order():
    from tqstore.samplers import GRPOGroupNSampler
    g = GRPOGroupNSampler(n_samples_per_prompt=2)
    rows, seqs = [10, 11, 12, 14, 15, 16, 17], [0, 1, 2, 4, 5, 6, 7]
    assert g.sample(rows, 4, ready_seqs=seqs) == ([10, 11, 14, 15], [10, 11, 14, 15])
    shuffled = [3, 0, 6, 5, 1, 4, 2]
    got = g.sample([rows[i] for i in shuffled], 4, ready_seqs=[seqs[i] for i in shuffled])
    assert got == ([10, 11, 14, 15], [10, 11, 14, 15]), "the same groups, each in sequence order"
    assert g.sample(rows, 8, ready_seqs=seqs) == ([], [])


def test_grpo_sampler_given_sequence_numbers_out_of_order_still_takes_the_oldest_groups():
    from tqstore.samplers import GRPOGroupNSampler
    g = GRPOGroupNSampler(n_samples_per_prompt=2)
    assert g.sample([10, 11, 12, 0, 1], 2, ready_seqs=[2, 3, 4, 0, 1]) == ([0, 1], [0, 1])
    assert g.sample([12, 13, 0, 1], 2) == ([0, 1], [0, 1]), "without sequence numbers: gidx order"


@pytest.mark.parametrize("sampler", ["sequential", "rank_aware"])
def test_a_fetch_hands_out_the_oldest_ready_rows_when_older_rows_become_ready_later(tmp_path, sampler):
    """The sequential and rank-aware samplers are given only the oldest rows of the ready view:
    rows produced out of insertion order must still come out oldest first."""
    with tq.open(tmp_path / "s", num_units=1) as s:
        s.set_sampler(sampler)
        meta = s.get_meta(["x"], 8, "p", mode="insert")
        s.put({"x": torch.zeros(4, 1)}, metadata=meta.select_samples([4, 5, 6, 7]))
        cfg = {"dp_rank": 0, "batch_index": 0}
        assert s.get_meta(["x"], 2, "p", task_name="t", sampling_config=cfg).global_indexes == [4, 5]
        s.put({"x": torch.zeros(4, 1)}, metadata=meta.select_samples([0, 1, 2, 3]))  # older rows, ready now
        got = [s.get_meta(["x"], 2, "p", task_name="t", sampling_config={"dp_rank": 0, "batch_index": b})
               .global_indexes for b in (1, 2, 3)]
        assert got == [[0, 1], [2, 3], [6, 7]]
        assert s.get_meta(["x"], 2, "p", task_name="t", sampling_config={"dp_rank": 0, "batch_index": 4}).size == 0


def test_a_grpo_batch_size_no_group_fits_is_refused_before_any_row_exists(tmp_path):
    """batch_size 6 with groups of 4: refused at the fetch's first ask, also of a partition
    that is empty or missing (it waited out its timeout and returned nothing, and raised only
    once rows existed); the seqlen sampler checks the batch of all its ranks."""
    import time

    with tq.open(tmp_path / "s", num_units=1) as s:
        s.set_sampler(tq.GRPOGroupNSampler(n_samples_per_prompt=4))
        t0 = time.monotonic()
        with pytest.raises(InvalidInputError, match="multiple of n_samples_per_prompt 4"):
            s.get_meta(["x"], 6, "missing", task_name="t", timeout_s=5)
        assert time.monotonic() - t0 < 2.5
        with pytest.raises(InvalidInputError, match="multiple of n_samples_per_prompt 2"):
            s.get_meta(["x"], 3, "missing", task_name="t", sampling_config={"n_samples_per_prompt": 2})
        assert s.get_meta(["x"], 8, "missing", task_name="t").size == 0
        s.set_sampler(tq.SeqlenBalancedSampler(n_samples_per_prompt=4, dp_size=2))
        cfg = {"dp_rank": 0, "batch_index": 0}
        assert s.get_meta(["x"], 4, "missing", task_name="t", sampling_config=cfg).size == 0
        for per_rank in (2, 3, 6):  # each rank gets whole groups: a group split across ranks before
            with pytest.raises(InvalidInputError, match=f"per-rank batch_size {per_rank} must be a multiple of "
                                                        f"n_samples_per_prompt 4"):
                s.get_meta(["x"], per_rank, "missing", task_name="t", sampling_config=cfg)


def _tagged_groups(s, lengths, n, pid="p"):
    """Put ``len(lengths) // n`` groups of ``n`` rows (row value: its group) with tags
    ``{"total_lengths": lengths[i]}``."""
    for g in range(len(lengths) // n):
        m = s.get_meta(["x"], n, pid, mode="insert")
        for j in range(n):
            m.custom_meta[j] = {"total_lengths": lengths[n * g + j]}
        s.put({"x": torch.full((n, 1), g)}, metadata=m)


def test_seqlen_sampler_gives_every_rank_whole_groups_of_the_batch_size_it_asked(tmp_path):
    """A per-rank batch_size that is not a multiple of the group size split groups across the
    ranks and gave the ranks batches of other sizes (one group of 4, two ranks asking 2 each:
    1 row and 3 rows); refused now, before any row is taken; a multiple gives whole groups."""
    with tq.open(tmp_path / "s", num_units=1) as s:
        s.set_sampler(tq.SeqlenBalancedSampler(n_samples_per_prompt=4, dp_size=2))
        _tagged_groups(s, [100, 1, 1, 1, 5, 5, 5, 5, 50, 1, 1, 1, 9, 9, 9, 9], 4)
        for r in range(2):
            with pytest.raises(InvalidInputError, match="per-rank batch_size 2 must be a multiple"):
                s.get_meta(["x"], 2, "p", task_name="t", sampling_config={"dp_rank": r, "batch_index": 0})
        assert int(s.get_consumption_status("t", "p")[1].sum()) == 0, "a refused fetch took rows"
        sampler = tq.SeqlenBalancedSampler(n_samples_per_prompt=4, dp_size=2)
        with pytest.raises(InvalidInputError, match="per-rank batch_size 6"):  # called on its own too
            sampler.sample(list(range(16)), 6, dp_rank=0, batch_index=0)
        shares = [_values(s, s.get_meta(["x"], 4, "p", task_name="t",
                                        sampling_config={"dp_rank": r, "batch_index": 0})) for r in range(2)]
        assert [len(x) for x in shares] == [4, 4]
        assert sorted(shares[0] + shares[1]) == [0] * 4 + [1] * 4
        assert all(x == [x[0]] * 4 for x in shares), f"{shares}: a group was split"


def test_seqlen_sampler_needs_a_batch_index_to_share_and_alone_hands_out_fresh_rows(tmp_path):
    """Without a batch_index every fetch was answered from the share cached under batch 0:
    the same rows at every call (one batch trained on forever, the rest never consumed).  With
    several ranks or a dp_rank it is refused; one rank without either gets fresh rows."""
    with tq.open(tmp_path / "s", num_units=1) as s:
        s.set_sampler(tq.SeqlenBalancedSampler(n_samples_per_prompt=2, dp_size=2))
        _tagged_groups(s, [3] * 8, 2)
        for cfg in (None, {"dp_rank": 0}):
            with pytest.raises(InvalidInputError, match="needs a batch_index"):
                s.get_meta(["x"], 2, "p", task_name="t", sampling_config=cfg)
        s.set_sampler(tq.SeqlenBalancedSampler(n_samples_per_prompt=2, dp_size=1))
        with pytest.raises(InvalidInputError, match="needs a batch_index"):
            s.get_meta(["x"], 2, "p", task_name="t", sampling_config={"dp_rank": 0})
        got = [_values(s, s.get_meta(["x"], 2, "p", task_name="t")) for _ in range(4)]
        assert got == [[0, 0], [1, 1], [2, 2], [3, 3]]
        assert s.get_meta(["x"], 2, "p", task_name="t").size == 0


@pytest.mark.parametrize("bad", [None, [10, 20], "12 tokens", float("nan"), -3, True, float("inf")])
def test_seqlen_sampler_refuses_a_total_lengths_tag_that_is_no_token_count(tmp_path, bad):
    """A tag it cannot weigh raised a bare TypeError or ValueError from inside every fetch;
    now an InvalidInputError naming the row, nothing taken, and the fetch works once the tag
    is set right."""
    with tq.open(tmp_path / "s", num_units=1) as s:
        s.set_sampler(tq.SeqlenBalancedSampler(n_samples_per_prompt=2, dp_size=2))
        _tagged_groups(s, [4, 4, 6, 6], 2)
        m = s.get_meta(["x"], None, "p", mode="force_fetch")
        m.custom_meta[3] = {"total_lengths": bad}
        s.set_custom_meta(m)
        cfg = {"dp_rank": 0, "batch_index": 0}
        with pytest.raises(InvalidInputError, match=f"row {m.global_indexes[3]}'s tag total_lengths"):
            s.get_meta(["x"], 2, "p", task_name="t", sampling_config=cfg)
        assert int(s.get_consumption_status("t", "p")[1].sum()) == 0
        m.custom_meta[3] = {"total_lengths": 6.0}  # (a float count is a count)
        s.set_custom_meta(m)
        shares = [_values(s, s.get_meta(["x"], 2, "p", task_name="t", sampling_config={"dp_rank": r,
                                                                                       "batch_index": 0}))
                  for r in range(2)]
        assert sorted(shares) == [[0, 0], [1, 1]]


@pytest.mark.parametrize("cfg", [{"batch_size": 2}, {"ready_seqs": [0]}, {"ready_tags": None},
                                 {"ready_indexes": [0]}, {0: "rank"}])
def test_sampling_config_naming_the_samplers_own_arguments_is_refused(tmp_path, cfg):
    """These raised a bare TypeError ("got multiple values", "keywords must be strings") from
    inside the controller."""
    with tq.open(tmp_path / "s", num_units=1) as s:
        _put(s, 4)
        for sampler in ("sequential", tq.SeqlenBalancedSampler(dp_size=1)):
            s.set_sampler(sampler)
            with pytest.raises(InvalidInputError, match="sampling_config"):
                s.get_meta(["x"], 2, "p", task_name="t", sampling_config=cfg)
        assert int(s.get_consumption_status("t", "p")[1].sum()) == 0


@pytest.mark.parametrize("n", [3, 5, 6, 7, 12, 24])
def test_grpo_groups_are_counted_from_the_partitions_first_row_whatever_the_stores_start(tmp_path, n):
    """Groups are the first n rows put, the next n, ...: in every new store (each starts its
    sequence numbers at a random point), in a partition dropped and created again, and across
    a checkpoint load that raises the sequence numbers (a group begun before it is completed by
    the rows put after it).  With starts that were multiples of 2**20, n=3 gave [2, 3, 4]."""
    for i in range(4):
        with _open(tmp_path / f"s{i}", GRPOGroupNSampler(n_samples_per_prompt=n)) as s:
            for round_ in range(2):
                _put(s, 2 * n + 1, field="x")  # two whole groups and one row of the third
                got = s.get_meta(["x"], n, "p", task_name="t").global_indexes
                assert _values(s, s.get_meta(["x"], n, "p", task_name="u"), "x") == list(range(n))
                assert len(got) == n
                if round_ == 0:
                    s.clear_partition("p")  # dropped: created again past its sequence numbers
            s.save_checkpoint(tmp_path / f"ck{i}")
            s.load_checkpoint(tmp_path / f"ck{i}")  # (raises the loaded index's numbers)
            _put(s, n - 1, start=2 * n + 1, field="x")  # the third group's other rows
            metas = [s.get_meta(["x"], n, "p", task_name="v") for _ in range(3)]
            assert [_values(s, m, "x") for m in metas] == [list(range(k * n, (k + 1) * n)) for k in range(3)]


@pytest.mark.parametrize("sampler", ["sequential", "grpo_group_n", "rank_aware"])
def test_a_sampling_config_repeating_task_name_and_partition_id_samples_as_without_them(tmp_path, sampler):
    """TransferQueue's StreamingDataset puts task_name and partition_id into sampling_config
    (its samplers read them there); code built that way gets the same rows, not a TypeError."""
    cfg = {"dp_rank": 0, "batch_index": 0} if sampler != "sequential" else {}
    if sampler == "grpo_group_n":
        cfg = {"dp_rank": 0, "batch_index": 0, "n_samples_per_prompt": 2}
    got = []
    for i, extra in enumerate(({}, {"task_name": "t", "partition_id": "p"})):
        with _open(tmp_path / f"s{i}", sampler) as s:
            _put(s, 8)
            got.append(s.get_meta(["x"], 4, "p", task_name="t", sampling_config={**cfg, **extra}).global_indexes)
    assert got[0] == got[1] and len(got[0]) == 4


def test_a_sampling_config_contradicting_the_call_is_refused_before_anything_is_consumed(tmp_path):
    with _open(tmp_path / "s") as s:
        _put(s, 4)
        for bad in ({"task_name": "other"}, {"partition_id": "q"}):
            with pytest.raises(InvalidInputError, match="contradicts get_meta"):
                s.get_meta(["x"], 2, "p", task_name="t", sampling_config=bad)
        assert s.get_consumption_status("t", "p")[1].tolist() == [0, 0, 0, 0]


def test_batch_size_0_gives_an_empty_meta_in_every_mode_and_touches_nothing(tmp_path):
    with _open(tmp_path / "s") as s:
        _put(s, 4)
        for mode in ("fetch", "force_fetch", "insert"):
            meta = s.get_meta(["x"], 0, "p", mode=mode, task_name="t")
            assert meta.size == 0, mode
        assert s.get_consumption_status("t", "p")[1].tolist() == [0, 0, 0, 0]
        assert s.get_meta(["x"], 4, "p", mode="force_fetch").size == 4  # no row reserved by the insert
    tq.close()
    tq.init({"path": str(tmp_path / "w"), "num_units": 1, "polling_mode": False, "get_meta_timeout_s": 5})
    try:  # TransferQueue's waiting mode: nothing asked is no timeout either
        tq.put({"x": torch.ones(2, 1)}, partition_id="p")
        assert tq.get_meta(["x"], 0, "p", task_name="t").size == 0
        with pytest.raises(InvalidInputError, match="batch_size"):
            tq.get_meta(["x"], -1, "p", task_name="t")
    finally:
        tq.close()
