"""Per-step calls at a million rows: what a trainer calls every step, on a small and a large
partition of the same store, and the ratio of the two.

    python bench/bench_steps.py            # 100,000 and 1,000,000 rows
    python bench/bench_steps.py --quick    # 10,000 and 100,000 rows
    python bench/bench_steps.py --reps 25  # medians of 25 calls (default 15)

One store (2 units, ``result_type="dict"``) holds two partitions of keyed small rows
(``input_ids`` 4 int64, ``reward`` float32, a tag dict on every tenth row), built with large
``kv_batch_put`` batches.  Every call works on 64 rows; each figure is the median of
``--reps`` calls, the two partitions alternating call by call (the machine is shared: the
same-run baseline of a figure is the same call on the small partition).  A ratio near 1
means the call costs what its batch costs; a ratio near the size ratio (10) means it does
work per row of the partition.  Calls whose answer covers the whole partition (``kv_list``,
status queries) are printed apart: they scale by definition.

Also measured, on each partition: a sequential fetch after the task consumed 90 % of it,
and the fetch right after insert-mode reservations were filled out of order (rows becoming
ready after newer ones, as partial rollouts finishing do).

The last line is JSON: ``{"bench": "bench_steps", "small_rows", "large_rows", "calls":
{name: {"small_ms", "large_ms", "ratio"}}}``.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

import tqstore as tq  # noqa: E402

F = ["input_ids", "reward"]
B = 64
BUILD_BATCH = 50_000


def _data(n: int = B) -> dict:
    return {"input_ids": np.arange(4 * n, dtype=np.int64).reshape(n, 4), "reward": np.random.rand(n).astype(np.float32)}


def _build(store, pid: str, n: int) -> None:
    for lo in range(0, n, BUILD_BATCH):
        m = min(BUILD_BATCH, n - lo)
        store.kv_batch_put([f"{pid}-k{i}" for i in range(lo, lo + m)], pid, _data(m),
                           tags=[{"g": i // 8} if i % 10 == 0 else None for i in range(lo, lo + m)])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="10,000 and 100,000 rows")
    ap.add_argument("--reps", type=int, default=15, help="calls per figure (median)")
    args = ap.parse_args(argv)
    sizes = {"small": 10_000, "large": 100_000} if args.quick else {"small": 100_000, "large": 1_000_000}
    rng = random.Random(0)
    calls: dict = {}
    with tempfile.TemporaryDirectory(prefix="bench_steps_") as d:
        store = tq.open(Path(d) / "s", num_units=2, result_type="dict")
        client = tq.get_client(store)
        try:
            t0 = time.perf_counter()
            for pid, n in sizes.items():
                _build(store, pid, n)
            print(f"built {sizes['small']:,} + {sizes['large']:,} rows in {time.perf_counter() - t0:.1f} s", flush=True)
            fresh = {"n": 0}

            def new_keys(pid):
                fresh["n"] += 1
                return [f"{pid}-new{fresh['n']}-{i}" for i in range(B)]

            def old_keys(pid):  # (of the newer half: the clear_samples figure clears the oldest rows)
                return [f"{pid}-k{i}" for i in rng.sample(range(sizes[pid] // 2, sizes[pid]), B)]

            def tagged(pid):
                m = store.get_meta(F, B, pid, task_name="tagger")
                m.update_custom_meta([{"score": i} for i in range(m.size)])
                return m

            def bench(name, fn, setup=None, reps=args.reps):
                times = {"small": [], "large": []}
                for r in range(reps + 2):
                    for pid in (("small", "large") if r % 2 == 0 else ("large", "small")):
                        arg = setup(pid) if setup else None
                        t = time.perf_counter()
                        fn(pid, arg)
                        if r >= 2:  # (two warm-up rounds)
                            times[pid].append(time.perf_counter() - t)
                small, large = (statistics.median(times[p]) * 1e3 for p in ("small", "large"))
                calls[name] = {"small_ms": round(small, 3), "large_ms": round(large, 3), "ratio": round(large / small, 2)}
                print(f"{name:44s} {sizes['small']:>9,} rows {small:9.3f} ms  {sizes['large']:>9,} rows "
                      f"{large:9.3f} ms  ratio {large / small:6.2f}", flush=True)

            print("per-step calls, 64 rows each:")
            bench("put 64 new rows", lambda p, a: store.put(_data(), partition_id=p))
            bench("get_meta insert 64", lambda p, a: store.get_meta(F, B, p, mode="insert"))
            bench("put(metadata=insert meta)", lambda p, m: store.put(_data(), metadata=m),
                  setup=lambda p: store.get_meta(F, B, p, mode="insert"))
            bench("get_meta fetch (sequential)", lambda p, a: store.get_meta(F, B, p, task_name="actor"))
            bench("get_data(fetched meta)", lambda p, m: store.get_data(m),
                  setup=lambda p: store.get_meta(F, B, p, task_name="reader"))
            bench("get_meta force_fetch 64", lambda p, a: store.get_meta(F, B, p, mode="force_fetch"))
            bench("set_custom_meta", lambda p, m: client.set_custom_meta(m), setup=tagged)
            bench("clear_samples", lambda p, m: store.clear_samples(m),
                  setup=lambda p: store.get_meta(F, B, p, task_name="clear"))
            bench("kv_batch_put 64 new keys", lambda p, k: store.kv_batch_put(k, p, _data()), setup=new_keys)
            bench("kv_batch_put 64 existing keys", lambda p, k: store.kv_batch_put(k, p, _data()), setup=old_keys)
            bench("kv_batch_get 64 keys", lambda p, k: store.kv_batch_get(k, p), setup=old_keys)
            bench("kv_retrieve_meta 64 keys", lambda p, k: client.kv_retrieve_meta(k, p), setup=old_keys)
            bench("kv_retrieve_keys 64 indexes", lambda p, g: client.kv_retrieve_keys(g, p),
                  setup=lambda p: store.get_meta(F, B, p, task_name="keys").global_indexes)
            bench("check_consumption_status", lambda p, a: store.check_consumption_status("actor", p), reps=5)

            def consumed_90(pid):
                task = f"late-{pid}-{fresh['n']}"
                fresh["n"] += 1
                store.get_meta(F, int(store.controller.partition_info(pid).rows * 0.9), pid, task_name=task)
                return task

            bench("fetch after the task consumed 90 %", lambda p, task: store.get_meta(F, B, p, task_name=task),
                  setup=consumed_90, reps=5)

            def out_of_order(pid):
                a = store.get_meta(F, B, pid, mode="insert")
                b = store.get_meta(F, B, pid, mode="insert")
                store.put(_data(), metadata=b)  # the newer reservation is ready first
                store.put(_data(), metadata=a)

            bench("fetch after an out-of-order fill", lambda p, a: store.get_meta(F, B, p, task_name="actor"),
                  setup=out_of_order)
            store.set_sampler({"name": "grpo_group_n", "n_samples_per_prompt": 8})
            bench("get_meta fetch (GRPO, groups of 8)", lambda p, a: store.get_meta(F, B, p, task_name="grpo"))
            store.set_sampler("sequential")
            print("answers covering the whole partition (scale by definition):")
            bench("[whole partition] kv_list", lambda p, a: store.kv_list(p), reps=3)
            bench("[whole partition] get_consumption_status", lambda p, a: store.get_consumption_status("actor", p),
                  reps=5)
            bench("[whole partition] get_production_status", lambda p, a: store.get_production_status(F, p), reps=5)
        finally:
            store.close()
    print(json.dumps({"bench": "bench_steps", "small_rows": sizes["small"], "large_rows": sizes["large"],
                      "calls": calls}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
