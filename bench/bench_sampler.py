"""Fetch cost with a rank-aware sampler as its cached results pile up, beside the sequential
sampler in the same run.

Usage: python bench/bench_sampler.py [--batches N] [--batch-size B] [--ranks R] [--window W]

Rank-aware sampling (``RankAwareSampler``, ``GRPOGroupNSampler`` with ``dp_rank``,
``SeqlenBalancedSampler``, here with ``dp_size`` = ``--ranks``) keeps each ``(task, dp_rank, batch_index)`` result for the other
ranks of a data-parallel group, by default for the life of the partition, and the store saves
the sampler's state in the transaction of every fetch.  This prints, for each sampler, the
median milliseconds per ``get_meta(mode="fetch")`` over the first ``--window`` fetches and
over the last ``--window`` of ``--batches`` (``--ranks`` ranks taking turns, one store of
2 units, rows of one int64), and the ratio last / first: a fetch whose cost follows the
number of results cached before it shows a ratio that grows with ``--batches``; one that
writes only what it changed stays near 1, like the sequential sampler (which caches nothing).

The last line of stdout is one JSON object: ``{"<sampler>": {"first_ms", "last_ms",
"last_over_first", "cached_results"}, ..., "batches"}``.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import tqstore  # noqa: E402


def run(sampler: str, batches: int, batch_size: int, ranks: int, window: int) -> dict:
    with tempfile.TemporaryDirectory() as d, tqstore.open(Path(d) / "s", num_units=2) as s:
        s.set_sampler(tqstore.SeqlenBalancedSampler(n_samples_per_prompt=1, dp_size=ranks)
                      if sampler == "seqlen_balanced" else sampler)
        rows = batches * batch_size
        for i in range(0, rows, 100_000):
            n = min(100_000, rows - i)
            s.put({"x": np.arange(i, i + n, dtype=np.int64).reshape(n, 1)}, partition_id="p")
        times = []
        for b in range(batches):
            t0 = time.perf_counter()
            m = s.get_meta(["x"], batch_size, "p", task_name="t",
                           sampling_config={"dp_rank": b % ranks, "batch_index": b // ranks})
            times.append(time.perf_counter() - t0)
            if m.size != batch_size:
                raise SystemExit(f"{sampler}: batch {b} got {m.size} rows")
        saved = s.controller.sampler_state("p")
        cache = saved["state"].get("t", {}).get("cache", {}) if saved else {}
        cached = sum(len(per) for per in cache.values())
    first = statistics.median(times[:window]) * 1e3
    last = statistics.median(times[-window:]) * 1e3
    return {"first_ms": round(first, 3), "last_ms": round(last, 3), "last_over_first": round(last / first, 2),
            "cached_results": cached}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int, default=20_000, help="fetches per sampler (default 20000)")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--ranks", type=int, default=4, help="data-parallel ranks taking turns (default 4)")
    ap.add_argument("--window", type=int, default=500, help="fetches in the first and last window (default 500)")
    a = ap.parse_args(argv)
    out = {"batches": a.batches}
    for sampler in ("sequential", "rank_aware", "seqlen_balanced"):
        r = run(sampler, a.batches, a.batch_size, a.ranks, min(a.window, a.batches // 2))
        out[sampler] = r
        print(f"{sampler}: {r['first_ms']:.3f} ms per fetch over the first {a.window}, {r['last_ms']:.3f} ms over "
              f"the last {a.window} of {a.batches} (last/first {r['last_over_first']:.2f}; "
              f"{r['cached_results']} results cached)", file=sys.stderr, flush=True)
    for name in ("rank_aware", "seqlen_balanced"):
        print(f"{name}: last/first {out[name]['last_over_first']:.2f} (sequential "
              f"{out['sequential']['last_over_first']:.2f}); {name}/sequential over the last window "
              f"{out[name]['last_ms'] / out['sequential']['last_ms']:.2f}")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
