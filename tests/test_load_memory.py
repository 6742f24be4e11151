"""A load by key holds a bounded amount of memory whatever the dump's size: each target unit
reads, checks and appends its frames in batches of at most ``BATCH_BYTES`` (issue: memory
added under 256 MiB).  Measured with tracemalloc, which sees the import's buffers (numpy
arrays and bytearrays) and not the mapped LMDB files or the page cache."""
from __future__ import annotations

import tracemalloc

import torch

import tqstore
from tqstore.dump import load as L

MiB = 1 << 20


def test_a_load_holds_batches_not_the_dump(tmp_path):
    rows, row_bytes = 48, MiB  # a 48 MiB dump, 12 times one unit's batch
    g = torch.Generator().manual_seed(0)
    keys = [f"k{i}" for i in range(rows)]
    with tqstore.open(tmp_path / "src", num_units=2) as src:
        for i in range(0, rows, 8):
            src.kv_batch_put(keys[i:i + 8], "train",
                             {"input_ids": torch.randint(0, 1 << 30, (8, row_bytes // 8), generator=g)})
        rep = src.dump_data_by_key(tmp_path / "dump", keys, "train")
    assert rep["bytes"] > 12 * L.BATCH_BYTES
    with tqstore.open(tmp_path / "dst", num_units=2) as dst:
        tracemalloc.start()
        try:
            tracemalloc.reset_peak()
            before = tracemalloc.get_traced_memory()[0]
            dst.load_data_by_key(tmp_path / "dump")
            peak = tracemalloc.get_traced_memory()[1] - before
        finally:
            tracemalloc.stop()
        # two units, each one batch buffer (at least one frame: a row here is one frame of ~1 MiB)
        assert peak < 2 * L.BATCH_BYTES + 8 * MiB, f"the load held {peak / MiB:.1f} MiB"
        got = dst.kv_batch_get(keys[:3], "train", "input_ids")["input_ids"]
        assert got.shape == (3, row_bytes // 8)
