"""Small-row get benchmark (issue 12's get aim): rows of two fields, 16 int64 + 1 float32,
read back in batches of 8,192 by ``kv_batch_get`` (by key) and ``get_data`` (a BatchMeta of
``get_meta(mode="force_fetch")``), next to a same-run baseline: numpy gathering the same
rows from arrays in memory (``np.take`` of the batch's rows into new arrays: the copy any
get must do), and one Python dict lookup per key (``[d[k] for k in batch]``: the cost of a
single Python step per row, the scale a per-row loop anywhere in a get is measured in).

    python bench/bench_get.py                 # 262,144 rows, 1 and 4 units, 5 repetitions
    python bench/bench_get.py --quick         # 65,536 rows, 2 repetitions

Each figure is rows/s, best of the repetitions with the median beside it, over every batch
of the store; results are checked bit-identical.  On a shared machine compare the ratio
to the baseline, not the absolute figure.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import tqstore  # noqa: E402

BATCH = 8192


def _rates(fn, rows: int, reps: int):
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(rows / (time.perf_counter() - t0))
    return max(out), statistics.median(out)


def run(n: int, units: int, reps: int, result_type) -> dict:
    g = torch.Generator().manual_seed(12)
    ids = torch.randint(0, 1 << 62, (n, 16), dtype=torch.int64, generator=g)
    r = torch.randn(n, generator=g)
    keys = [f"sample-{i}" for i in range(n)]
    base = Path(tempfile.mkdtemp(prefix="tq-bench-get-"))
    opts = {} if result_type is None else {"result_type": result_type}
    try:
        with tqstore.open(base / "s", num_units=units, **opts) as s:
            for a in range(0, n, BATCH):
                s.kv_batch_put(keys[a:a + BATCH], "p", {"ids": ids[a:a + BATCH], "r": r[a:a + BATCH]})
            client = tqstore.get_client(s)
            metas = []
            all_meta = client.get_meta(["ids", "r"], n, "p", mode="force_fetch")
            for a in range(0, n, BATCH):
                metas.append(all_meta.select_samples(list(range(a, min(a + BATCH, n))))
                             if hasattr(all_meta, "select_samples") else all_meta[a:a + BATCH])
            out: dict = {}
            got = [s.kv_batch_get(keys[a:a + BATCH], "p") for a in range(0, n, BATCH)]
            assert torch.equal(torch.cat([x["ids"] for x in got]), ids) and torch.equal(
                torch.cat([x["r"] for x in got]), r)
            got = [client.get_data(m) for m in metas]
            assert torch.equal(torch.cat([x["ids"] for x in got]), ids)
            del got
            out["kv_batch_get"] = _rates(lambda: [s.kv_batch_get(keys[a:a + BATCH], "p") for a in range(0, n, BATCH)],
                                         n, reps)
            out["get_data"] = _rates(lambda: [client.get_data(m) for m in metas], n, reps)
            ids_np, r_np = ids.numpy(), r.numpy()
            perm = [np.arange(a, min(a + BATCH, n)) for a in range(0, n, BATCH)]
            out["numpy_take"] = _rates(lambda: [(np.take(ids_np, p, axis=0), np.take(r_np, p)) for p in perm], n, reps)
            d = {k: i for i, k in enumerate(keys)}
            out["dict_lookup"] = _rates(lambda: [[d[k] for k in keys[a:a + BATCH]] for a in range(0, n, BATCH)], n, reps)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="65,536 rows, 2 repetitions")
    ap.add_argument("--rows", type=int, default=None)
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--units", type=int, action="append", default=None, help="unit counts (default 1 and 4)")
    ap.add_argument("--result-type", default=None, choices=("tensordict", "dict"))
    args = ap.parse_args(argv)
    n = args.rows or (65536 if args.quick else 262144)
    reps = args.reps or (2 if args.quick else 5)
    print(f"small-row get: {n} rows x (16 int64 + 1 float32), batches of {BATCH}, best of {reps} (median); "
          f"result_type {args.result_type or 'default'}; load average {os.getloadavg()[0]:.2f}")
    for units in args.units or [1, 4]:
        res = run(n, units, reps, args.result_type)
        take, look = res["numpy_take"][0], res["dict_lookup"][0]
        for name in ("kv_batch_get", "get_data"):
            best, med = res[name]
            print(f"  {units} unit(s) {name:13s} {best:11,.0f} rows/s (median {med:11,.0f})   = {best / look:.3f}x one "
                  f"dict lookup per key ({look:,.0f} rows/s), {best / take:.4f}x numpy take ({take:,.0f} rows/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
