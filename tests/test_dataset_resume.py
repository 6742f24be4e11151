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
