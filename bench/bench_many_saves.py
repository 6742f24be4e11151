"""Many saves of a store that keeps its rows: does a save stay as fast at the 300th as at the
10th?  Every save seals each unit's active segment; a unit merges its small segments when
the save releases its cut (``tqstore.unit_compact``).  The same run repeats the loop with
that merge turned off (the baseline: one more segment file per unit and save).

Usage: python bench/bench_many_saves.py [--quick] [--saves 300] [--rows 64] [--units 4] [--dir DIR]

``--quick``: 100 saves.

Each step puts ``--rows`` rows (a 1 KiB float tensor and a tag each) and saves a link-mode
checkpoint (``save_checkpoint``, blocking) over the previous one.  Printed per mode: the
median save time of the first and of the last 10 saves, their ratio (``growth``), and the
segment files per unit at the end; the last line of stdout is one JSON object.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import tqstore  # noqa: E402
from tqstore import unit_compact  # noqa: E402


def run(base: Path, saves: int, rows: int, units: int) -> dict:
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    times = []
    with tqstore.open(base / "store", num_units=units) as s:
        for step in range(saves):
            keys = [f"s{step}-{j}" for j in range(rows)]
            s.kv_batch_put(keys, "train", fields={"x": torch.randn(rows, 256)}, tags=[{"step": step}] * rows)
            t = time.perf_counter()
            s.save_checkpoint(base / "ckpt")
            times.append(time.perf_counter() - t)
            if step % 50 == 0:
                print(f"  step {step}: save {times[-1] * 1e3:.1f} ms", file=sys.stderr, flush=True)
        files = [sum(1 for p in u.path.iterdir() if p.name.endswith(".tqs")) for u in s.units]
    first, last = statistics.median(times[:10]), statistics.median(times[-10:])
    shutil.rmtree(base, ignore_errors=True)
    return {"first_ms": round(first * 1e3, 2), "last_ms": round(last * 1e3, 2), "growth": round(last / first, 2),
            "segment_files_per_unit": max(files)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="100 saves")
    ap.add_argument("--saves", type=int, default=None, help="saves per mode (default 300)")
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--units", type=int, default=4)
    ap.add_argument("--dir", default=None, help="scratch directory (default: a temporary one)")
    args = ap.parse_args()
    args.saves = args.saves or (100 if args.quick else 300)
    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="tq-many-saves-"))
    try:
        print("merging small segments (tqstore as is):", file=sys.stderr)
        ours = run(root / "ours", args.saves, args.rows, args.units)
        print("baseline, the merge turned off:", file=sys.stderr)
        with mock.patch.object(unit_compact, "MERGE_AT", 1 << 30):
            base = run(root / "base", args.saves, args.rows, args.units)
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)
    for name, r in (("merging", ours), ("no merge (baseline)", base)):
        print(f"{name}: save {r['first_ms']} ms (first 10) -> {r['last_ms']} ms (last 10 of {args.saves}), "
              f"growth {r['growth']}x, {r['segment_files_per_unit']} segment files per unit")
    print(f"last saves: merging / no merge {ours['last_ms'] / base['last_ms']:.3f}")
    print(json.dumps({"saves": args.saves, "rows_per_save": args.rows, "units": args.units, "cpus": os.cpu_count(),
                      "merging": ours, "no_merge": base,
                      "last_save_vs_no_merge": round(ours["last_ms"] / base["last_ms"], 3)}))


if __name__ == "__main__":
    main()
