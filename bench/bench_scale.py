"""Scale benchmark: the cost per row of small rows, next to same-run baselines.

    python bench/bench_scale.py                 # 10k, 100k, 1M rows
    python bench/bench_scale.py --quick         # 10k, 100k
    python bench/bench_scale.py --big           # adds 10M
    python bench/bench_scale.py --compare-with /work/main   # the same, alternating with another build
    python bench/bench_scale.py --rounds 5      # medians of 5 rounds (default 3)

Rows are small: two fields, ``ids`` (16 int64) and ``lp`` (1 float32), keyed ``k<i>``, in
one partition of a store of ``--units`` units (default 2), ``result_type="dict"``.  Every
figure of one size and one build comes from one child process (a fresh interpreter, the
build's ``tqstore`` first on ``sys.path``); with ``--compare-with`` the two builds run
alternately, round after round, so that load on the machine hits both alike.  Each size runs
``--rounds`` rounds (default 3), each in fresh child processes on a fresh store; every figure
printed is the median of its rounds (the issue's aims are medians of rounds: this machine is
shared, and one round's put has been seen anywhere from 259k to 513k rows/s within minutes),
and the spread of put, get, open and load across rounds is printed beside them.

Figures (wall time; per-row cost = time / rows):

* ``put``: ``kv_batch_put`` of all rows in batches of 8,192 (new keys), rows/s;
* ``get``: ``kv_batch_get`` of all rows by key in batches of 8,192, rows/s;
* ``kv_list``: ``kv_list("train")`` of the whole partition, seconds;
* ``save``: blocking ``save_checkpoint`` to a new directory, seconds;
* ``close``: closing the store after the save (a build with a persisted controller mirror
  writes it here), seconds;
* ``open``: reopening the cleanly closed store (controller and units; a build with the
  clean-close marker skips the reconciliation's scans), seconds;
* ``open (crash)``: reopening it after a process opened it and exited without closing (as
  a ``kill -9``: the full reconciliation runs), seconds;
* ``load``: ``load_checkpoint`` of that checkpoint into the reopened store, seconds; beside
  it, its floor on this disk: the bytes of the checkpoint's LMDB files (the controller's and
  the units' indexes, which a load copies and fsyncs: LMDB later writes them in place, so
  they cannot be linked like segments) written from memory in one stream with one fsync
  (``load_copy_bytes``, ``load_copy_write_s``);
* ``key``: the first ``kv_batch_get`` of one batch by key after the load (a build that
  builds its key index on first use pays for it here), seconds;
* ``rss``: the controller's share of memory: anonymous RSS (``RssAnon`` of
  ``/proc/self/status``) added by opening the store's ``Controller`` alone in a fresh
  child process, bytes per row; ``rss keyed``: the same after one key lookup (with the
  key index built).

Baselines, same child, same row count:

* ``memcpy``: numpy copy of the same payload bytes, batch by batch (rows/s);
* ``lmdb_put``: raw py-lmdb ``putmulti`` of one 8-byte key + 48-byte value per row, one
  write transaction per 8,192 rows, in a fresh environment (rows/s): the floor of a
  controller that commits one record per row;
* ``lmdb_scan``: a cursor walk of those records (seconds): the floor of an open that
  reads every row's record once.

Beside a busy Python thread (once per build, after the sizes; ``--no-busy`` skips it): put
and get of ``BUSY_ROWS`` rows with another thread of the process running pure Python, with
tqstore's GIL hand-off (``tqstore._gilswitch``) and with it left off, and the same calls on
their own in the same child.  CPython hands its GIL to a waiting thread
only every switch interval (5 ms), and every call that releases the GIL (each item py-lmdb
writes or reads, file writes, numpy and native kernels) waits for it again: the figure shows
what a trainer with a CPU-bound Python thread in the store's process pays.

The last line of stdout is one JSON object: ``{"results": {build: {rows: {figure: value}}}}``
(and ``"busy_thread": {build: {figure: value}}``).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BATCH = 8192
PID = "train"


def rss_anon() -> int:
    """This process's resident anonymous memory in bytes (``RssAnon``, Linux; 0 if not listed)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0


def _batches(n: int, tags: bool = False):
    """``(keys, fields, tags)`` of each batch; ``tags``: each row a dict tag as a rollout's
    (a status, a reward, a length), else None."""
    import numpy as np

    rng = np.random.default_rng(0)
    for lo in range(0, n, BATCH):
        hi = min(n, lo + BATCH)
        t = None
        if tags:
            t = [{"status": "finished", "reward": round(float(r), 4), "len": int(k)}
                 for r, k in zip(rng.random(hi - lo).tolist(), rng.integers(16, 4096, hi - lo).tolist())]
        yield ([f"k{i}" for i in range(lo, hi)],
               {"ids": rng.integers(0, 150_000, (hi - lo, 16), dtype=np.int64),
                "lp": rng.random(hi - lo, dtype=np.float32)}, t)


def _child(n: int, work: Path, units: int, tags: bool = False) -> dict:
    import numpy as np
    import lmdb
    import tqstore

    out: dict = {"rows": n}
    batches = list(_batches(n, tags))
    path, ck = work / "store", work / "ckpt"
    s = tqstore.open(path, num_units=units, result_type="dict")
    try:
        t0 = time.perf_counter()
        for keys, fields, t in batches:
            s.kv_batch_put(keys, PID, fields, tags=t)
        out["put_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        last = None
        for keys, _, _t in batches:
            last = s.kv_batch_get(keys, PID)
        out["get_s"] = time.perf_counter() - t0
        assert np.array_equal(np.asarray(last["ids"]), batches[-1][1]["ids"])
        t0 = time.perf_counter()
        listed = s.kv_list(PID)
        out["kv_list_s"] = time.perf_counter() - t0
        assert len(listed[PID]) == n
        del listed
        t0 = time.perf_counter()
        s.save_checkpoint(ck)
        out["save_s"] = time.perf_counter() - t0
    finally:
        t0 = time.perf_counter()
        s.close()
        out["close_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    s = tqstore.open(path, result_type="dict")
    out["open_s"] = time.perf_counter() - t0
    try:
        t0 = time.perf_counter()
        s.load_checkpoint(ck)
        out["load_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        got = s.kv_batch_get(batches[0][0], PID)
        out["key_s"] = time.perf_counter() - t0
        assert np.array_equal(np.asarray(got["lp"]), batches[0][1]["lp"])
    finally:
        s.close()
    # the load's floor on disk: it copies the checkpoint's LMDB files (LMDB writes them in place
    # later, so they cannot be linked) and fsyncs the copies; the same bytes written from memory
    # in one stream with one fsync
    copies = [ck / "controller" / "data.mdb"] + sorted(ck.glob("unit-*/index/data.mdb"))
    out["load_copy_bytes"] = nbytes = sum(p.stat().st_size for p in copies)
    chunk = memoryview(np.random.default_rng(1).integers(0, 255, min(nbytes, 64 << 20), dtype=np.uint8))
    t0 = time.perf_counter()
    fd = os.open(work / "copy-floor", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        done = 0
        while done < nbytes:
            done += os.write(fd, chunk[:min(len(chunk), nbytes - done)])
        os.fsync(fd)
    finally:
        os.close(fd)
    out["load_copy_write_s"] = time.perf_counter() - t0
    os.unlink(work / "copy-floor")
    build = os.environ.get("PYTHONPATH", str(ROOT)).split(os.pathsep)[0]
    subprocess.run([sys.executable, "-c", f"import os, sys; sys.path.insert(0, {build!r}); import tqstore; "
                    f"tqstore.open({str(path)!r}); os._exit(0)"], check=True)  # this build opened it, then gone without a close
    t0 = time.perf_counter()
    s = tqstore.open(path, result_type="dict")
    out["open_crash_s"] = time.perf_counter() - t0
    s.close()
    # baselines on the same row count
    t0 = time.perf_counter()
    for _, fields, _t in batches:
        for v in fields.values():
            np.copy(v)
    out["memcpy_s"] = time.perf_counter() - t0
    env = lmdb.open(str(work / "raw"), map_size=1 << 34, sync=False, metasync=False, max_dbs=2)
    val = b"x" * 48
    t0 = time.perf_counter()
    for lo in range(0, n, BATCH):
        with env.begin(write=True) as txn:
            txn.cursor().putmulti([(g.to_bytes(8, "big"), val) for g in range(lo, min(n, lo + BATCH))])
    out["lmdb_put_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    with env.begin() as txn:
        seen = sum(1 for _ in txn.cursor())
    out["lmdb_scan_s"] = time.perf_counter() - t0
    assert seen == n
    env.close()
    return out


#: rows of the busy-thread measurement (two batches: a put beside a busy thread runs at a few thousand rows/s)
BUSY_ROWS = 2 * BATCH


def _child_busy(work: Path, units: int) -> dict:
    """Put and get of BUSY_ROWS rows alone, then beside a thread running pure Python."""
    import threading

    import tqstore

    from tqstore import _gilswitch

    batches = list(_batches(BUSY_ROWS))
    out: dict = {"rows": BUSY_ROWS}
    quick = _gilswitch.INTERVAL_S
    for mode in ("alone", "busy", "busy_off"):
        _gilswitch.INTERVAL_S = None if mode == "busy_off" else quick  # busy_off: the GIL hand-off left off
        stop = threading.Event()

        def spin() -> None:
            x = 0
            while not stop.is_set():
                for _ in range(1000):
                    x += 1

        s = tqstore.open(work / mode, num_units=units, result_type="dict")
        spinner = threading.Thread(target=spin, daemon=True)
        if mode != "alone":
            spinner.start()
        try:
            t0 = time.perf_counter()
            for keys, fields in batches:
                s.kv_batch_put(keys, PID, fields)
            out[f"put_{mode}_s"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            for keys, _ in batches:
                s.kv_batch_get(keys, PID)
            out[f"get_{mode}_s"] = time.perf_counter() - t0
        finally:
            stop.set()
            if mode != "alone":
                spinner.join()
            s.close()
    return out


def _child_rss(work: Path) -> dict:
    import tqstore  # noqa: F401 - its imports are not the controller's share
    from tqstore import layout_dirs as L
    from tqstore.controller import Controller

    state = work / "store" / L.read_current(work / "store")
    gc.collect()
    before = rss_anon()
    c = Controller(L.controller_dir(state), num_units=1)
    gc.collect()
    after = rss_anon()
    rows = sum(c.partition_info(p).rows for p in c.partitions())
    c.resolve_keys("train", ["k0"])
    gc.collect()
    keyed = rss_anon()
    c.close()
    return {"rss_bytes": after - before, "rss_keyed_bytes": keyed - before, "rss_rows": rows}


def _run_child(build: Path, n: int, units: int, work: Path, modes=("main", "rss"), tags: bool = False) -> dict:
    work.mkdir(parents=True)
    env = dict(os.environ, PYTHONPATH=str(build))
    res = {}
    for mode in modes:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", mode, "--rows", str(n),
               "--units", str(units), "--work", str(work)] + (["--tags"] if tags else [])
        p = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if p.returncode != 0:
            raise SystemExit(f"child failed ({build}, {n} rows, {mode}):\n{p.stderr[-4000:]}")
        res.update(json.loads(p.stdout.strip().splitlines()[-1]))
    shutil.rmtree(work, ignore_errors=True)
    return res


def _median_round(rounds: list) -> dict:
    """Each figure's median over ``rounds`` (dicts of one child's figures; a figure an older
    build does not report is left out)."""
    keys = set(rounds[0]).intersection(*rounds[1:])
    return {k: statistics.median(r[k] for r in rounds) for k in keys}


def _spread(n: int, rounds: list) -> str:
    def rng(key: str, rate: bool) -> str:
        vals = sorted(n / r[key] if rate else r[key] for r in rounds)
        return f"{vals[0]:,.0f}-{vals[-1]:,.0f} rows/s" if rate else f"{vals[0]:.3f}-{vals[-1]:.3f} s"
    return (f"  rounds  {len(rounds)} (figures above: medians); spread: put {rng('put_s', True)}, "
            f"get {rng('get_s', True)}, open {rng('open_s', False)}, load {rng('load_s', False)}")


def _fmt_rate(n: int, s: float) -> str:
    return f"{n / s:>12,.0f} rows/s {s / n * 1e6:8.2f} us/row"


def _fmt_secs(n: int, s: float) -> str:
    return f"{s:>12.3f} s      {s / n * 1e6:8.2f} us/row"


def _lines(build: str, r: dict, old: dict = None) -> list:
    n = r["rows"]
    L = []

    def ratio(key, inverse=False):
        if old is None:
            return ""
        a, b = r[key], old[key]
        return f"   new/old speed {b / a:6.2f}x" if not inverse else f"   new/old {a / b:6.2f}x"

    L.append(f"[{build}] {n:,} rows")
    L.append(f"  put     {_fmt_rate(n, r['put_s'])}   memcpy {n / r['memcpy_s']:,.0f} rows/s, "
             f"lmdb putmulti {n / r['lmdb_put_s']:,.0f} rows/s (put / lmdb {r['lmdb_put_s'] / r['put_s']:.2f}){ratio('put_s')}")
    L.append(f"  get     {_fmt_rate(n, r['get_s'])}   memcpy {n / r['memcpy_s']:,.0f} rows/s{ratio('get_s')}")
    L.append(f"  kv_list {_fmt_secs(n, r['kv_list_s'])}{ratio('kv_list_s')}")
    L.append(f"  save    {_fmt_secs(n, r['save_s'])}{ratio('save_s')}")
    if "close_s" in r:
        L.append(f"  close   {_fmt_secs(n, r['close_s'])}{ratio('close_s') if old and 'close_s' in old else ''}")
    L.append(f"  open    {_fmt_secs(n, r['open_s'])}   lmdb scan {r['lmdb_scan_s']:.3f} s "
             f"(open / scan {r['open_s'] / r['lmdb_scan_s']:.1f}){ratio('open_s')}")
    L.append(f"  open(-9){_fmt_secs(n, r['open_crash_s'])}{ratio('open_crash_s')}")
    L.append(f"  load    {_fmt_secs(n, r['load_s'])}   its LMDB copies ({r['load_copy_bytes'] / 1e6:.0f} MB) written "
             f"durably in one stream {r['load_copy_write_s']:.3f} s (load / that "
             f"{r['load_s'] / r['load_copy_write_s']:.2f}){ratio('load_s')}")
    L.append(f"  key     {_fmt_secs(n, r['key_s'])}   (first get by key after the load){ratio('key_s')}")
    L.append(f"  rss     {r['rss_bytes'] / max(1, r['rss_rows']):>12.1f} bytes/row (controller, {r['rss_bytes'] / 2**20:.1f} MiB)"
             f"{ratio('rss_bytes', inverse=True)}")
    L.append(f"  rss+keys{r['rss_keyed_bytes'] / max(1, r['rss_rows']):>12.1f} bytes/row (after a key lookup, "
             f"{r['rss_keyed_bytes'] / 2**20:.1f} MiB){ratio('rss_keyed_bytes', inverse=True)}")
    return L


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="10k and 100k rows only")
    ap.add_argument("--big", action="store_true", help="add 10M rows")
    ap.add_argument("--sizes", type=str, default=None, help="comma-separated row counts (overrides)")
    ap.add_argument("--units", type=int, default=2)
    ap.add_argument("--dir", type=Path, default=None)
    ap.add_argument("--compare-with", type=Path, default=None, help="root of another tqstore build (a worktree)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds per size and build (figures are medians)")
    ap.add_argument("--no-busy", action="store_true", help="skip the put and get beside a busy Python thread")
    ap.add_argument("--tags", action="store_true", help="each row with a dict tag, as a rollout's (status, reward, "
                                                        "length): the controller's share of every figure grows")
    ap.add_argument("--child", choices=("main", "rss", "busy"), help=argparse.SUPPRESS)
    ap.add_argument("--rows", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        sys.path.insert(0, os.environ.get("PYTHONPATH", str(ROOT)).split(os.pathsep)[0])
        res = (_child(a.rows, a.work, a.units, a.tags) if a.child == "main" else _child_rss(a.work) if a.child == "rss"
               else _child_busy(a.work, a.units))
        print(json.dumps(res))
        return
    sizes = [10_000, 100_000] if a.quick else [10_000, 100_000, 1_000_000]
    if a.big:
        sizes.append(10_000_000)
    if a.sizes:
        sizes = [int(x) for x in a.sizes.split(",")]
    builds = {"new": ROOT}
    if a.compare_with:
        builds["old"] = a.compare_with.resolve()
    tmp = Path(tempfile.mkdtemp(prefix="bench-scale-", dir=a.dir))
    results: dict = {b: {} for b in builds}
    rounds: dict = {b: {} for b in builds}
    n_rounds = max(1, a.rounds)
    try:
        turn = 0
        for n in sizes:
            for rnd in range(n_rounds):
                order = list(builds) if turn % 2 == 0 else list(reversed(builds))  # alternate who runs first
                turn += 1
                for b in order:
                    print(f"... {b}: {n:,} rows, round {rnd + 1}/{n_rounds}", file=sys.stderr, flush=True)
                    rounds[b].setdefault(n, []).append(_run_child(builds[b], n, a.units, tmp / f"{b}-{n}-{rnd}",
                                                                  tags=a.tags))
            for b in builds:
                results[b][n] = _median_round(rounds[b][n])
            for b in builds:
                other = results.get("old", {}).get(n) if b == "new" else None
                for line in _lines(f"{b} {builds[b]}", results[b][n], other) + [_spread(n, rounds[b][n])]:
                    print(line, flush=True)
        busy: dict = {}
        for b in ([] if a.no_busy else builds):
            print(f"... {b}: {BUSY_ROWS:,} rows beside a busy Python thread", file=sys.stderr, flush=True)
            r = busy[b] = _run_child(builds[b], BUSY_ROWS, a.units, tmp / f"{b}-busy", modes=("busy",))
            n = r["rows"]
            print(f"[{b} {builds[b]}] {n:,} rows beside a thread running pure Python (the same calls alone)", flush=True)
            for call in ("put", "get"):
                alone = r[f"{call}_alone_s"]
                print(f"  {call:<8}{n / r[f'{call}_busy_s']:>12,.0f} rows/s beside it, {n / alone:,.0f} alone: "
                      f"{alone / r[f'{call}_busy_s']:.3f}x (the GIL hand-off off: {n / r[f'{call}_busy_off_s']:,.0f} "
                      f"rows/s, {alone / r[f'{call}_busy_off_s']:.3f}x)", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    summary = {}
    for b, per in results.items():
        summary[b] = {str(n): {"put_rows_s": n / r["put_s"], "get_rows_s": n / r["get_s"], "open_s": r["open_s"],
                               "load_s": r["load_s"], "save_s": r["save_s"], "kv_list_s": r["kv_list_s"],
                               "open_crash_s": r["open_crash_s"], "key_s": r["key_s"], "close_s": r.get("close_s"),
                               "rss_bytes_per_row": r["rss_bytes"] / max(1, r["rss_rows"]),
                               "rss_keyed_bytes_per_row": r["rss_keyed_bytes"] / max(1, r["rss_rows"]),
                               "memcpy_rows_s": n / r["memcpy_s"], "lmdb_put_rows_s": n / r["lmdb_put_s"],
                               "lmdb_scan_s": r["lmdb_scan_s"],
                               "rounds_put_rows_s": [n / x["put_s"] for x in rounds[b][n]],
                               "rounds_load_s": [x["load_s"] for x in rounds[b][n]],
                               "rounds_open_s": [x["open_s"] for x in rounds[b][n]]} for n, r in per.items()}
    busy_summary = {b: {"rows": r["rows"], **{f"{c}_{m}_rows_s": r["rows"] / r[f"{c}_{m}_s"]
                                               for c in ("put", "get") for m in ("alone", "busy", "busy_off")}}
                    for b, r in busy.items()}
    print(json.dumps({"units": a.units, "batch": BATCH, "rounds": n_rounds, "tags": a.tags, "results": summary,
                      "busy_thread": busy_summary}))


if __name__ == "__main__":
    main()
