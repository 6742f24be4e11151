"""A StreamingDataset made after a restart or a checkpoint restore goes on with the batches not
handed out yet.  The rank-aware and GRPO samplers cache each ``(task, dp_rank, batch_index)``
result for the rank's replicas, and the cache is persisted (it survives reopens and is in
checkpoints); a new dataset counted its batch indexes from 0, so it was handed every batch an
earlier run had trained on again."""
from __future__ import annotations

import threading

import pytest
import torch

import tqstore as tq

N = 4  # GRPO group size


def _cfg(path, sampler):
    spec = {"name": "grpo_group_n", "n_samples_per_prompt": N} if sampler == "grpo" else {"name": "rank_aware"}
    return {"path": str(path), "num_units": 2, "sampler": spec}


def _dataset(dp_rank=0):
    return tq.StreamingDataset(None, batch_size=N, micro_batch_size=N, data_fields=["x"], partition_id="train",
                               task_name="actor", dp_rank=dp_rank)


def _take(ds, k):
    it = iter(tq.StreamingDataLoader(ds))
    return [next(it)[0]["x"].tolist()[0] for _ in range(k)]


@pytest.mark.parametrize("sampler", ["grpo", "rank_aware"])
def test_a_new_dataset_after_a_reopen_goes_on_with_the_batches_not_handed_out(tmp_path, sampler):
    tq.init(_cfg(tmp_path / "s", sampler))
    try:
        tq.put({"x": torch.arange(6).repeat_interleave(N)}, partition_id="train")  # 6 groups of N
        assert _take(_dataset(), 2) == [0, 1]
    finally:
        tq.close()
    tq.init(_cfg(tmp_path / "s", sampler))  # the trainer restarts
    try:
        ds = _dataset()
        assert _take(ds, 2) == [2, 3]
        assert ds.batch_index == 3  # (it counts on from where the earlier run stopped)
        _, consumed = tq.get_client().get_consumption_status("actor", "train")
        assert int(consumed.sum()) == 4 * N
        assert _take(_dataset(dp_rank=1), 1) == [4]  # another rank: its own batches
    finally:
        tq.close()


def test_a_dataset_made_after_a_restore_does_not_train_again_on_what_the_saved_run_consumed(tmp_path):
    tq.init(_cfg(tmp_path / "s", "grpo"))
    try:
        tq.put({"x": torch.arange(8).repeat_interleave(N)}, partition_id="train")
        gens = tq.CheckpointManager(tmp_path / "gens")
        ds = _dataset()
        assert _take(ds, 3) == [0, 1, 2]
        gens.save(1)  # the trainer's checkpoint after 3 batches
        assert _take(ds, 2) == [3, 4]  # trained on, then lost with the model
    finally:
        tq.close()
    tq.init(_cfg(tmp_path / "s2", "grpo"))  # a new process restores the buffer next to the model
    try:
        assert tq.CheckpointManager(tmp_path / "gens").restore() == 1
        assert _take(_dataset(), 3) == [3, 4, 5]  # the batches after the checkpoint, once
    finally:
        tq.close()


def test_replicas_of_a_rank_started_apart_get_the_same_batches(tmp_path):
    """The start is fixed by the first replica to ask: a replica whose first fetch comes after
    another replica's fetches of this run still gets the same batch indexes (and rows)."""
    tq.init(_cfg(tmp_path / "s", "rank_aware"))
    try:
        tq.put({"x": torch.arange(6).repeat_interleave(N)}, partition_id="train")
        assert _take(_dataset(), 1) == [0]
    finally:
        tq.close()
    tq.init(_cfg(tmp_path / "s", "rank_aware"))
    try:
        first, late = _dataset(), _dataset()
        got = _take(first, 2)
        assert got == [1, 2] and _take(late, 2) == got
        out = {}
        ts = [threading.Thread(target=lambda i=i: out.setdefault(i, _take(_dataset(), 3))) for i in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert out[0] == out[1] == [1, 2, 3]
    finally:
        tq.close()


def _seqlen_cfg(path):
    return {"path": str(path), "num_units": 2,
            "sampler": {"name": "seqlen_balanced", "n_samples_per_prompt": 2, "dp_size": 2}}


def _seqlen_dataset(dp_rank, check=False):
    return tq.StreamingDataset(None, batch_size=2, micro_batch_size=2, data_fields=["x"], partition_id="train",
                               task_name="actor", dp_rank=dp_rank, should_check_consumption_status=check)


def _put_seqlen_groups(groups):
    tq.kv_batch_put([f"g{i // 2}/{i % 2}" for i in range(2 * groups)], "train",
                    fields={"x": torch.arange(2 * groups).reshape(-1, 1)},
                    tags=[{"total_lengths": 3}] * (2 * groups))


def test_a_seqlen_rank_made_after_another_ranks_fetch_gets_the_share_set_aside_for_it(tmp_path):
    """The seqlen-balanced sampler splits a batch for every rank at the first rank's fetch; a
    rank whose dataset is made after that fetch started past the share set aside for it: its
    rows were never handed out and a finite iteration never ended."""
    tq.init(_seqlen_cfg(tmp_path / "s"))
    try:
        _put_seqlen_groups(4)
        store = tq.current_store()
        it0 = iter(tq.StreamingDataLoader(_seqlen_dataset(0, check=True)))
        first0 = next(it0)[1].keys  # rank 0 fetches batch 0: rank 1's share of it is set aside
        assert store.first_batch_index("train", "actor", 1) == 0
        late = _seqlen_dataset(1, check=True)
        assert late.batch_index == 0
        got1, done = [], threading.Event()

        def rank1():
            for _, meta in tq.StreamingDataLoader(late):
                got1.extend(meta.keys)
            done.set()

        t = threading.Thread(target=rank1, daemon=True)
        t.start()
        got0 = list(first0) + [k for _, meta in it0 for k in meta.keys]
        assert done.wait(30), "rank 1's finite iteration did not end"
        assert sorted(got0 + got1) == sorted(f"g{i // 2}/{i % 2}" for i in range(8))  # each once
        _, consumed = tq.get_client().get_consumption_status("actor", "train")
        assert bool(consumed.all())
    finally:
        tq.close()


def test_a_seqlen_share_pending_at_a_checkpoint_is_fetched_after_the_restore(tmp_path):
    tq.init(_seqlen_cfg(tmp_path / "s"))
    try:
        _put_seqlen_groups(4)
        store = tq.current_store()
        assert len(_take_keys(_seqlen_dataset(0), 1)) == 2  # rank 0's share of batch 0; rank 1's waits
        store.save_checkpoint(tmp_path / "ck")
    finally:
        tq.close()
    tq.init(_seqlen_cfg(tmp_path / "s2"))
    try:
        store = tq.current_store()
        store.load_checkpoint(tmp_path / "ck")
        assert store.first_batch_index("train", "actor", 0) == 1  # rank 0 fetched batch 0
        assert store.first_batch_index("train", "actor", 1) == 0  # rank 1 never did
        pending = _take_keys(_seqlen_dataset(1), 1)
        _, consumed = tq.get_client().get_consumption_status("actor", "train")
        assert int(consumed.sum()) == 4 and len(pending) == 2
    finally:
        tq.close()


def _take_keys(ds, k):
    it = iter(tq.StreamingDataLoader(ds))
    return [key for _ in range(k) for key in next(it)[1].keys]


def test_a_new_datasets_start_follows_a_reset_or_a_clear_in_the_same_open_store(tmp_path):
    """first_batch_index's answer was remembered for as long as the store stayed open: after
    ``reset_consumption`` or ``clear_partition`` (or a new sampler) a new dataset still started
    at the old index, past batches that had been dropped (its rows fetched as a later batch)."""
    with tq.open(tmp_path / "s", num_units=1) as s:
        s.set_sampler("rank_aware")

        def run(batches):
            for b in range(batches):
                s.get_meta(["x"], 2, "train", task_name="actor", sampling_config={"dp_rank": 0, "batch_index": b})

        s.put({"x": torch.arange(8)}, partition_id="train")
        run(3)
        assert s.first_batch_index("train", "actor", 0) == 3
        assert s.reset_consumption("train", "actor")
        assert s.first_batch_index("train", "actor", 0) == 0
        run(2)
        s.clear_partition("train")
        s.put({"x": torch.arange(8)}, partition_id="train")
        assert s.first_batch_index("train", "actor", 0) == 0
        run(1)
        assert s.first_batch_index("train", "actor", 0) == 0, "a replica's answer holds while the store is open"
        s.set_sampler("rank_aware")
        assert s.first_batch_index("train", "actor", 0) == 1
