"""Data-plane benchmark: the TransferQueue-shaped API against the engine under it.

    python bench/bench_dataplane.py            # 4 rounds x 8 producer batches, 3 repetitions
    python bench/bench_dataplane.py --quick    # 1 round, 2 repetitions

Workload: 8 producers each put a batch of 256 rows x 4096 tokens (int64, 8 MiB per
batch) per round; one consumer reads them.  Every repetition uses a fresh store and
measures, on the same bytes:

* ``kv_batch_put`` / ``kv_batch_get`` (by key, 256 keys per call) next to the engine's
  ``Store.write(new_rows=True)`` / ``Store.read`` on the same batches;
* a streaming loop: 8 producer threads ``put`` while one consumer loops
  ``get_meta(mode="fetch", batch_size=256)`` + ``get_data`` until it has every batch
  (batches/s from the first put to the last get), and the same consumer loop alone on a
  pre-filled partition, next to the engine's ``Store.read`` of the same batches.

Figures are medians over repetitions.  GiB = 2**30 bytes.
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import tqstore  # noqa: E402

GiB = float(1 << 30)
PRODUCERS = 8
ROWS = 256
TOKENS = 4096


def _batches(rounds: int):
    g = torch.Generator().manual_seed(0)
    return [torch.randint(0, 150_000, (ROWS, TOKENS), dtype=torch.int64, generator=g)
            for _ in range(PRODUCERS * rounds)]


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def one_repetition(root: Path, batches, units: int, result_type=None) -> dict:
    nbytes = sum(b.numel() * b.element_size() for b in batches)
    out = {}
    opts = {} if result_type is None else {"result_type": result_type}
    with tqstore.open(root / "store", num_units=units, **opts) as s:
        # engine: Store.write / Store.read
        gidx = []
        out["engine_write"] = nbytes / _timed(
            lambda: gidx.extend(s.write("engine", {"input_ids": b}, new_rows=True) for b in batches)) / GiB
        got = []
        out["engine_read"] = nbytes / _timed(
            lambda: got.extend(s.read("engine", g, ["input_ids"])["input_ids"] for g in gidx)) / GiB
        assert torch.equal(got[-1], batches[-1])

        # KV API
        keys = [[f"b{i}-r{j}" for j in range(ROWS)] for i in range(len(batches))]
        out["kv_batch_put"] = nbytes / _timed(
            lambda: [s.kv_batch_put(k, "kv", {"input_ids": b}) for k, b in zip(keys, batches)]) / GiB
        got = []
        out["kv_batch_get"] = nbytes / _timed(
            lambda: got.extend(s.kv_batch_get(k, "kv", "input_ids")["input_ids"] for k in keys)) / GiB
        assert torch.equal(got[0], batches[0])

        # streaming: 8 producer threads put, one consumer fetches
        client = tqstore.get_client(s)
        per_producer = [batches[i::PRODUCERS] for i in range(PRODUCERS)]
        consumed = []

        def produce(mine):
            for b in mine:
                client.put({"input_ids": b}, partition_id="stream")

        def consume():
            while len(consumed) < len(batches):
                meta = client.get_meta(["input_ids"], ROWS, "stream", task_name="train", timeout_s=30.0)
                if meta.size == 0:
                    raise RuntimeError("consumer timed out waiting for producers")
                consumed.append(client.get_data(meta)["input_ids"])

        threads = [threading.Thread(target=produce, args=(m,)) for m in per_producer]
        threads.append(threading.Thread(target=consume))
        t0 = time.perf_counter()
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        dt = time.perf_counter() - t0
        assert len(consumed) == len(batches)
        assert sorted(int(c[0, 0]) for c in consumed) == sorted(int(b[0, 0]) for b in batches)
        out["stream_live_bps"] = len(batches) / dt

        # the consumer loop alone, on a pre-filled partition (a second task re-reads it)
        n = [0]

        def drain():
            while True:
                meta = client.get_meta(["input_ids"], ROWS, "stream", task_name="eval")
                if meta.size == 0:
                    return
                client.get_data(meta)
                n[0] += 1

        dt = _timed(drain)
        assert n[0] == len(batches)
        out["stream_consumer_bps"] = n[0] / dt
        t_meta = _timed(lambda: [client.get_meta(["input_ids"], ROWS, "stream", mode="force_fetch")
                                 for _ in range(len(batches))])
        out["get_meta_ms"] = t_meta / len(batches) * 1e3
        out["engine_read_bps"] = out["engine_read"] * GiB / (nbytes / len(batches))
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="1 round, 2 repetitions")
    ap.add_argument("--rounds", type=int, default=None, help="rounds of 8 producer batches (default 4)")
    ap.add_argument("--reps", type=int, default=None, help="repetitions, each in a fresh store (default 3)")
    ap.add_argument("--units", type=int, default=2, help="storage units (default 2)")
    ap.add_argument("--dir", default=None, help="directory for the stores (default: a temporary one)")
    ap.add_argument("--result-type", default=None, choices=("tensordict", "dict"),
                    help="what kv_batch_get / get_data return (default: the store's default, a TensorDict)")
    args = ap.parse_args(argv)
    rounds = args.rounds or (1 if args.quick else 4)
    reps = args.reps or (2 if args.quick else 3)
    batches = _batches(rounds)
    batch_mib = ROWS * TOKENS * 8 / (1 << 20)
    print(f"data plane: {PRODUCERS} producers x {rounds} round(s) x {ROWS} rows x {TOKENS} int64 tokens "
          f"({batch_mib:.0f} MiB/batch, {len(batches)} batches), {args.units} unit(s), {reps} repetition(s), "
          f"torch {torch.__version__}, result_type {args.result_type or 'default'}")
    results = []
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="tqstore-bench-dp-"))
    try:
        for r in range(reps):
            root = base / f"rep{r}"
            results.append(one_repetition(root, batches, args.units, args.result_type))
            shutil.rmtree(root, ignore_errors=True)
    finally:
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)
    med = {k: statistics.median(r[k] for r in results) for k in results[0]}
    gib_per_batch = batch_mib / 1024
    print(f"kv_batch_put                 {med['kv_batch_put']:7.2f} GiB/s   "
          f"(engine Store.write      {med['engine_write']:7.2f} GiB/s)")
    print(f"kv_batch_get                 {med['kv_batch_get']:7.2f} GiB/s   "
          f"(engine Store.read       {med['engine_read']:7.2f} GiB/s)")
    print(f"stream get_meta+get_data     {med['stream_live_bps']:7.1f} batches/s "
          f"({med['stream_live_bps'] * gib_per_batch:.2f} GiB/s, {PRODUCERS} producer threads putting meanwhile)")
    print(f"stream consumer loop alone   {med['stream_consumer_bps']:7.1f} batches/s "
          f"({med['stream_consumer_bps'] * gib_per_batch:.2f} GiB/s; engine Store.read "
          f"{med['engine_read_bps']:.1f} batches/s)")
    print(f"get_meta (force_fetch, {len(batches) * ROWS} rows)   {med['get_meta_ms']:7.2f} ms/call")


if __name__ == "__main__":
    main()
