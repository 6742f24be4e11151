"""Small-batch buffer loop with and without ``total_storage_size``, and against another build.

    python bench/bench_capacity.py                      # 5 alternating repetitions
    python bench/bench_capacity.py --compare-with /work/main

Workload (one repetition, a fresh 2-unit store): 300 cycles of an RL buffer's small
steps: ``put`` 64 rows (``input_ids`` int64 64x128, ``reward`` float32), ``get_meta``
(fetch 64 for a task), ``get_data``, ``clear_samples``.  Figures: cycles/s (wall clock) and CPU
ms per cycle (the process's CPU time: steadier on a shared machine).

Variants, run alternately in separate processes, the order rotated each repetition (so
machine noise hits them alike):

* ``this, no limit``: this build, ``total_storage_size=None``;
* ``this, limit``: this build, ``total_storage_size=10**6`` (every put counted and checked);
* ``other, no limit``: the build at ``--compare-with`` (its tqstore imported from there).

Printed: the median of each, and the ratios to ``this, no limit`` from the same run.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CYCLES = 300
ROWS = 64


def _worker(limit: int) -> None:
    import torch

    import tqstore as tq

    kwargs = {} if limit <= 0 else {"total_storage_size": limit}
    with tempfile.TemporaryDirectory() as d:
        with tq.open(Path(d) / "s", num_units=2, **kwargs) as s:
            batch = {"input_ids": torch.randint(0, 32000, (ROWS, 128)), "reward": torch.rand(ROWS)}
            for _ in range(20):  # warm-up
                s.clear_samples(s.put(batch, partition_id="p"))
            t0, c0 = time.perf_counter(), time.process_time()
            for _ in range(CYCLES):
                s.put(batch, partition_id="p")
                meta = s.get_meta(["input_ids", "reward"], ROWS, "p", task_name="train")
                s.get_data(meta)
                s.clear_samples(meta)
            dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(json.dumps({"cycles_per_s": CYCLES / dt, "cpu_ms_per_cycle": 1000 * cpu / CYCLES}))


def _run(tree: Path, limit: int) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker", str(limit)], env=env, cwd=tree,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--compare-with", default=None, help="source tree of another build (its tqstore/ is imported)")
    ap.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker is not None:
        _worker(args.worker)
        return
    variants = [("this, no limit", ROOT, 0), ("this, limit", ROOT, 10 ** 6)]
    if args.compare_with:
        variants.append(("other, no limit", Path(args.compare_with).resolve(), 0))
    got = {name: [] for name, _, _ in variants}
    for rep in range(args.reps):  # alternating, the order rotated each repetition
        for name, tree, limit in variants[rep % len(variants):] + variants[:rep % len(variants)]:
            got[name].append(_run(tree, limit))
    print(f"bench_capacity: {CYCLES} cycles of put {ROWS} rows + fetch + get_data + clear, 2 units, "
          f"{args.reps} alternating repetitions (medians; CPU ms per cycle is the steadier figure on a loaded machine)")
    for key, unit in (("cycles_per_s", "cycles/s"), ("cpu_ms_per_cycle", "CPU ms/cycle")):
        base = statistics.median(r[key] for r in got["this, no limit"])
        for name, _, _ in variants:
            vals = [r[key] for r in got[name]]
            m = statistics.median(vals)
            print(f"  {name:16s} {m:8.2f} {unit:13s} ratio to 'this, no limit': {m / base:.3f}   "
                  f"(all: {', '.join(f'{v:.2f}' for v in vals)})")

if __name__ == "__main__":
    main()
