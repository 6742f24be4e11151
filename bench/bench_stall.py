"""Stall against buffer size: what ``save_checkpoint(blocking=False)`` blocks the trainer
for, as the buffer grows from 256 MiB to 8 GiB; and, when this build has the selective
dump, the time to dump a fraction of the keys against a full save of the same store.

    python bench/bench_stall.py                 # 0.25, 0.5, 1, 2, 4, 8 GiB (sizes that fit the disk)
    python bench/bench_stall.py --quick         # 0.25, 0.5, 1 GiB
    python bench/bench_stall.py --max-gib 2     # stop at 2 GiB

One store (4 units, ``durability="checkpoint"``) grows through the sizes: rows of 64 KiB
(8,192 int64 token ids, a float reward, a short text), put in batches of 512.  At each
size the stall is the median (and max) of 5 ``save_checkpoint(blocking=False)`` calls,
each waited for (``handle.result()``) and deleted before the next.  The same-run
baseline is what a snapshot that copies the buffer would stall: the buffer's bytes at
the memcpy rate measured in this run (a copy of 256 MiB into a new buffer).  A size is
skipped, and said so, when the disk has less than 1.5 times it free.

Dump sweep (only with ``dump_data_by_key``): at 1 GiB (``--quick``: 256 MiB), dump 1, 5,
10, 25, 50 and 100 % of the keys (blocking) and, in the same run, save the whole store
(blocking, copy mode: the bytes are written); ``dump_vs_full_save`` is the ratio.

Progress goes to stderr; the last line of stdout is one JSON object: ``sizes`` (a list of
``{"gib", "rows", "stall_ms_median", "stall_ms_max", "copy_stall_ms"}``), ``memcpy_gib_s``,
``skipped_gib`` and ``dump`` (a list of ``{"fraction", "keys", "dump_s", "full_save_s",
"dump_vs_full_save"}``, empty without the dump).  GiB = 2**30 bytes.
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

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import tqstore  # noqa: E402

GiB = 1 << 30
TOKENS = 8192
BATCH = 512
ROW_BYTES = TOKENS * 8


def log(msg: str) -> None:
    sys.stderr.write(msg + "\n")
    sys.stderr.flush()


def memcpy_gib_s(nbytes: int = 256 << 20, reps: int = 3) -> float:
    src = np.ones(nbytes, dtype=np.uint8)
    best = 0.0
    for _ in range(reps):
        t = time.perf_counter()
        dst = src.copy()
        best = max(best, nbytes / (time.perf_counter() - t) / GiB)
        del dst
    return best


def grow(store, have_rows: int, want_rows: int, batch: np.ndarray) -> int:
    while have_rows < want_rows:
        n = min(BATCH, want_rows - have_rows)
        keys = [f"k{have_rows + i:09d}" for i in range(n)]
        store.kv_batch_put(keys, "train", fields={"input_ids": batch[:n],
                                                  "reward": np.full(n, 0.5, dtype=np.float32),
                                                  "text": [f"response {have_rows + i}" for i in range(n)]})
        have_rows += n
    return have_rows


def stall_at(store, work: Path, reps: int = 5):
    stalls = []
    for r in range(reps):
        path = work / f"ckpt-{r}"
        h = store.save_checkpoint(path, blocking=False)
        stalls.append(h.stall_s)
        h.result()
        shutil.rmtree(path)
    return statistics.median(stalls) * 1e3, max(stalls) * 1e3


def dump_sweep(store, work: Path, rows: int):
    dump = getattr(store, "dump_data_by_key", None)
    if dump is None:
        log("dump sweep: this build has no dump_data_by_key; skipped")
        return []
    t = time.perf_counter()
    store.save_checkpoint(work / "full", copy_segments=True)
    full_s = time.perf_counter() - t
    shutil.rmtree(work / "full")
    keys = [f"k{i:09d}" for i in range(rows)]
    rng = np.random.default_rng(0)
    out = []
    for frac in (0.01, 0.05, 0.10, 0.25, 0.50, 1.00):
        sel = sorted(rng.choice(rows, max(1, int(rows * frac)), replace=False).tolist())
        t = time.perf_counter()
        dump(work / "dump", [keys[i] for i in sel], "train")
        dump_s = time.perf_counter() - t
        shutil.rmtree(work / "dump")
        for leftover in work.glob("dump.*"):
            if leftover.is_file():
                leftover.unlink()
        out.append({"fraction": frac, "keys": len(sel), "dump_s": dump_s, "full_save_s": full_s,
                    "dump_vs_full_save": dump_s / full_s})
        log(f"dump {frac * 100:5.1f} % ({len(sel)} keys): {dump_s * 1e3:8.1f} ms   full save {full_s * 1e3:8.1f} ms "
            f"({dump_s / full_s:.2f}x)")
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="0.25 to 1 GiB")
    ap.add_argument("--max-gib", type=float, default=None, help="largest buffer size (default 8, --quick 1)")
    ap.add_argument("--units", type=int, default=4)
    ap.add_argument("--dir", default=None, help="work directory (default: a temporary one, removed after)")
    args = ap.parse_args(argv)
    top = args.max_gib or (1.0 if args.quick else 8.0)
    sizes = [g for g in (0.25, 0.5, 1, 2, 4, 8) if g <= top]
    work = Path(tempfile.mkdtemp(prefix="tqstore-bench-stall-", dir=args.dir))
    out = {"sizes": [], "skipped_gib": [], "dump": [], "units": args.units, "row_bytes": ROW_BYTES,
           "load_avg_before": os.getloadavg()[0]}
    try:
        out["memcpy_gib_s"] = memcpy_gib_s()
        log(f"memcpy {out['memcpy_gib_s']:.2f} GiB/s (the copying-snapshot baseline); load average "
            f"{out['load_avg_before']:.1f}")
        batch = np.arange(BATCH * TOKENS, dtype=np.int64).reshape(BATCH, TOKENS)
        rows = 0
        dump_gib = 0.25 if args.quick else 1.0
        with tqstore.open(work / "store", num_units=args.units, result_type="dict") as s:
            for gib in sizes:
                need = int(gib * GiB * 1.5)
                if shutil.disk_usage(work).free < need - rows * ROW_BYTES:
                    log(f"{gib} GiB: skipped, the disk has {shutil.disk_usage(work).free / GiB:.1f} GiB free")
                    out["skipped_gib"].append(gib)
                    continue
                t = time.perf_counter()
                rows = grow(s, rows, int(gib * GiB) // ROW_BYTES, batch)
                put_s = time.perf_counter() - t
                med, mx = stall_at(s, work)
                copy_ms = gib / out["memcpy_gib_s"] * 1e3
                out["sizes"].append({"gib": gib, "rows": rows, "stall_ms_median": med, "stall_ms_max": mx,
                                     "copy_stall_ms": copy_ms})
                log(f"{gib:5.2f} GiB {rows:8d} rows: stall median {med:7.2f} ms, max {mx:7.2f} ms; a copying "
                    f"snapshot {copy_ms:8.1f} ms ({copy_ms / med:,.0f}x); grown in {put_s:.1f} s")
                if gib == dump_gib:
                    out["dump"] = dump_sweep(s, work, rows)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out["load_avg_after"] = os.getloadavg()[0]
    for r in out["sizes"]:
        print(f"stall at {r['gib']:5.2f} GiB ({r['rows']} rows): {r['stall_ms_median']:.2f} ms median, "
              f"{r['stall_ms_max']:.2f} ms max; copying snapshot {r['copy_stall_ms']:.1f} ms "
              f"(ratio {r['copy_stall_ms'] / r['stall_ms_median']:,.0f}x)")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
