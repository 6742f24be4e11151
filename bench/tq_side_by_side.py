"""tqstore beside TransferQueue 0.1.11 on the same rows, in the same run: saving and restoring
the chosen keys of a buffer (partial rollout's resume path, issue 10) and a full checkpoint.

Usage (``make bench-tq``: a virtualenv of its own, ``.venv-tq``, with ``transferqueue==0.1.11``
beside tqstore, so the test environment never holds TransferQueue and its dependencies):

    .venv-tq/bin/python bench/tq_side_by_side.py [--quick] [--gib N] [--units 4] [--frac 0.1] [--rounds N]

TransferQueue 0.1.11 has no selective dump: the path a TransferQueue user has for chosen keys
is the client-side one ("V1": ``kv_batch_get`` of the keys in batches of 256 and their raw bytes
written into one file, fsynced; back: the file read and ``kv_batch_put``), the baseline of the
published owner-side dump design (3.3x).  Both stores get the same rows (``bench_checkpoint``'s
realistic rows: jagged int64 token ids and float32 logprobs of 512..2047 tokens, response text,
a tag), ``--units`` storage units each (TransferQueue's ``num_data_storage_units``, Ray actors
on this machine, ``ray.init(num_cpus=8)``); the V1 files written from both are compared byte
for byte (outside the clock) so both hold the same data.  Alternating rounds, best of each:

* ``dump_s``: tqstore ``dump_data_by_key`` (blocking, durable, published);
  ``tq_v1_dump_s``: the V1 dump from TransferQueue; ``v1_dump_s``: the same V1 dump from tqstore;
  ``dump_vs_tq_v1`` = TransferQueue V1 time / tqstore dump time;
* ``load_s``: tqstore ``load_data_by_key`` of the dump (files cold) into a new store of as many
  units; ``tq_v1_load_s``: the V1 file read (cold) and ``kv_batch_put`` into a new partition
  of TransferQueue (its ``TensorDict`` made of the file's bytes: jagged fields as nested
  tensors); ``load_vs_tq_v1`` = TransferQueue V1 load time / tqstore load time;
* ``full_save_s``: tqstore ``save_checkpoint`` (copy mode, fsynced) of the whole buffer;
  ``tq_full_save_s``: TransferQueue's ``save_checkpoint`` of the whole buffer (it does not
  fsync; ``tq_full_save_durable_s`` adds an fsync of each file it wrote, the durable figure).

Progress goes to stderr; the last line of stdout is one JSON object.  TransferQueue's
figures move with Ray's and its actors' share of the 2 cores: compare same-run ratios.
"""
from __future__ import annotations

import argparse
import filecmp
import json
import logging
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import tqstore  # noqa: E402
from bench_checkpoint import BATCH, GiB, drop_caches, files_under, log, make_batch, text_pool  # noqa: E402
from bench_dump import measure_load, v1_dump, v1_layout, v1_read  # noqa: E402

TQ_VERSION = "0.1.11"


def start_transferqueue(units: int) -> Any:
    """Ray (8 logical CPUs on this 2-core machine, or actors wait for CPUs) and TransferQueue
    with ``units`` storage units; the ``transfer_queue`` module."""
    import ray

    ray.init(num_cpus=8, include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False)
    import transfer_queue

    transfer_queue.init({"backend": {"SimpleStorage": {"num_data_storage_units": units}}})
    for name in list(logging.root.manager.loggerDict):  # (its modules log a WARNING per call on a 2-core machine)
        if name.startswith("transfer_queue"):
            logging.getLogger(name).setLevel(logging.ERROR)
    return transfer_queue


def tq_put(tq: Any, partition: str) -> Any:
    """``put(keys, fields, tags)`` into TransferQueue's ``partition``: the fields as the
    TensorDict it takes (jagged rows as nested tensors, text as a list)."""
    from tensordict import TensorDict

    def put(keys: List[str], fields: Dict[str, Any], tags: List[Dict[str, Any]]) -> None:
        td = TensorDict({f: torch.nested.as_nested_tensor(v, layout=torch.jagged)
                         if isinstance(v, list) and v and isinstance(v[0], torch.Tensor) else v
                         for f, v in fields.items()}, batch_size=len(keys))
        tq.kv_batch_put(keys, partition, td, tags=tags)

    return put


def fill_both(store: Any, tq: Any, target_bytes: int) -> int:
    """The same realistic rows (``bench_checkpoint.make_batch``) into both; the row count."""
    g = torch.Generator().manual_seed(0)
    pool = text_pool()
    rows = max(BATCH, (target_bytes // (15 * 1280)) // BATCH * BATCH)
    put = tq_put(tq, "train")
    for first in range(0, rows, BATCH):
        keys, fields, tags = make_batch(g, first, BATCH, pool)
        store.kv_batch_put(keys, "train", fields, tags=tags)
        put(keys, fields, tags)
    return rows


def tq_full_save(tq: Any, path: Path) -> tuple:
    """Seconds of TransferQueue's ``save_checkpoint(path)``, and with an fsync of each file it
    wrote and of its directories added (it does not fsync)."""
    t0 = time.perf_counter()
    tq.save_checkpoint(str(path))
    plain = time.perf_counter() - t0
    for p in [*files_under(path), *sorted(d for d in path.rglob("*") if d.is_dir()), path, path.parent]:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return plain, time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="about 256 MiB of payload")
    ap.add_argument("--gib", type=float, default=None, help="payload size (default 2, --quick 0.25)")
    ap.add_argument("--units", type=int, default=4, help="storage units of each store")
    ap.add_argument("--frac", type=float, default=0.1, help="fraction of the keys saved and restored")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds (best of)")
    ap.add_argument("--dir", default=None, help="work directory (default: a temporary one, removed after)")
    args = ap.parse_args(argv)
    try:
        import transfer_queue  # noqa: F401
    except ImportError:
        log(f"transfer_queue is not installed here: `make bench-tq` runs this in .venv-tq, with "
            f"transferqueue=={TQ_VERSION}")
        return 2
    gib = args.gib if args.gib is not None else (0.25 if args.quick else 2.0)
    base = Path(args.dir or tempfile.mkdtemp(prefix="tqstore-bench-tq-"))
    base.mkdir(parents=True, exist_ok=True)
    try:
        return run(base, gib, args.units, args.frac, max(1, args.rounds))
    finally:
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)


def run(base: Path, gib: float, units: int, frac: float, rounds: int) -> int:
    import transfer_queue

    tq = start_transferqueue(units)
    res: Dict[str, Any] = {"payload_gib_target": gib, "units": units, "frac": frac, "cpus": os.cpu_count(),
                           "transferqueue": getattr(transfer_queue, "__version__", TQ_VERSION)}
    store = tqstore.open(base / "store", num_units=units)
    t0 = time.perf_counter()
    rows = fill_both(store, tq, int(gib * GiB))
    keys = list(store.kv_list("train")["train"])
    pick = random.Random(0).sample(keys, max(1, int(len(keys) * frac)))
    res.update(rows=rows, keys_selected=len(pick))
    log(f"filled {rows} rows into both in {time.perf_counter() - t0:.1f} s; saving {len(pick)} keys")

    dumps, tq_v1s, v1s, fulls, tq_fulls, tq_fulls_durable = [], [], [], [], [], []
    rep: Dict[str, Any] = {}
    for rnd in range(rounds):  # alternating (the machine is shared and noisy)
        steps = ["dump", "tq_v1", "v1", "full", "tq_full"]
        for what in (steps if rnd % 2 == 0 else steps[::-1]):
            os.sync()
            if what == "dump":
                t0 = time.perf_counter()
                rep = store.dump_data_by_key(base / f"dump{rnd}", pick, "train")
                dumps.append(time.perf_counter() - t0)
            elif what == "tq_v1":
                tq_v1s.append(v1_dump(tq, pick, base / f"tq-v1-{rnd}.bin"))
            elif what == "v1":
                v1s.append(v1_dump(store, pick, base / f"v1-{rnd}.bin"))
            elif what == "full":
                t0 = time.perf_counter()
                store.save_checkpoint(base / f"full{rnd}", copy_segments=True)
                fulls.append(time.perf_counter() - t0)
                shutil.rmtree(base / f"full{rnd}")
            else:
                plain, durable = tq_full_save(tq, base / f"tq-full{rnd}")
                tq_fulls.append(plain)
                tq_fulls_durable.append(durable)
                shutil.rmtree(base / f"tq-full{rnd}")
        log(f"round {rnd}: tqstore dump {dumps[-1]:.3f} s, TransferQueue V1 {tq_v1s[-1]:.3f} s, tqstore V1 "
            f"{v1s[-1]:.3f} s; full save: tqstore {fulls[-1]:.3f} s, TransferQueue {tq_fulls[-1]:.3f} s "
            f"({tq_fulls_durable[-1]:.3f} s with fsyncs)")
        if rnd < rounds - 1:
            shutil.rmtree(base / f"dump{rnd}")
            os.unlink(base / f"tq-v1-{rnd}.bin")
            os.unlink(base / f"v1-{rnd}.bin")
    last = rounds - 1
    if not filecmp.cmp(base / f"tq-v1-{last}.bin", base / f"v1-{last}.bin", shallow=False):
        raise SystemExit("the V1 files of TransferQueue and tqstore differ: the stores do not hold the same rows")
    dump_dir, tq_v1_file = base / f"dump{last}", base / f"tq-v1-{last}.bin"
    dump_bytes = int(rep["bytes"])
    tags = store.kv_list("train")["train"]
    meta_len = len(json.dumps({k: tags[k] for k in pick}).encode())
    store.close()
    layout = v1_layout(base / "store", pick)

    loads, tq_v1_loads = [], []
    for rnd in range(rounds):
        for what in (["load", "tq_v1"] if rnd % 2 == 0 else ["tq_v1", "load"]):
            if what == "load":
                loads.append(measure_load(base / "target", dump_dir, units))
            else:
                part = f"restored{rnd}"
                drop_caches([tq_v1_file])
                t0 = time.perf_counter()
                v1_read(tq_v1_file, pick, layout, meta_len, tq_put(tq, part))
                tq_v1_loads.append(time.perf_counter() - t0)
                tq.kv_clear(pick, part)
        log(f"round {rnd}: tqstore load by key {loads[-1]:.3f} s, TransferQueue V1 load {tq_v1_loads[-1]:.3f} s")
    tq.close()

    dump_s, tq_v1_s, v1_s, load_s, tq_v1_load_s = min(dumps), min(tq_v1s), min(v1s), min(loads), min(tq_v1_loads)
    full_s, tq_full_s, tq_full_durable_s = min(fulls), min(tq_fulls), min(tq_fulls_durable)
    r3 = lambda x: round(x, 3)  # noqa: E731
    res.update(
        dump_gib=r3(dump_bytes / GiB), dump_s=r3(dump_s), tq_v1_dump_s=r3(tq_v1_s), v1_dump_s=r3(v1_s),
        dump_vs_tq_v1=round(tq_v1_s / dump_s, 2), v1_dump_speedup=round(v1_s / dump_s, 2),
        load_s=r3(load_s), tq_v1_load_s=r3(tq_v1_load_s), load_vs_tq_v1=round(tq_v1_load_s / load_s, 2),
        full_save_s=r3(full_s), tq_full_save_s=r3(tq_full_s), tq_full_save_durable_s=r3(tq_full_durable_s),
        dump_vs_tq_full_save=r3(dump_s / tq_full_durable_s),
        rounds_s={"dump": [r3(x) for x in dumps], "tq_v1_dump": [r3(x) for x in tq_v1s],
                  "v1_dump": [r3(x) for x in v1s], "full_save": [r3(x) for x in fulls],
                  "tq_full_save": [r3(x) for x in tq_fulls], "tq_full_save_durable": [r3(x) for x in tq_fulls_durable],
                  "load": [r3(x) for x in loads], "tq_v1_load": [r3(x) for x in tq_v1_loads]},
        load_avg_1m=round(os.getloadavg()[0], 2))
    log(f"save {len(pick)} keys ({dump_bytes / GiB:.3f} GiB): tqstore dump_data_by_key {dump_s:.3f} s; "
        f"TransferQueue {res['transferqueue']} V1 client path {tq_v1_s:.3f} s (its time / the dump's: "
        f"{res['dump_vs_tq_v1']}); the same V1 path on tqstore {v1_s:.3f} s ({res['v1_dump_speedup']})")
    log(f"restore them: tqstore load_data_by_key {load_s:.3f} s; TransferQueue V1 client path {tq_v1_load_s:.3f} s "
        f"(its time / the load's: {res['load_vs_tq_v1']})")
    log(f"full checkpoint: tqstore save_checkpoint {full_s:.3f} s (copy mode, fsynced); TransferQueue save_checkpoint "
        f"{tq_full_s:.3f} s, {tq_full_durable_s:.3f} s with its files fsynced (the dump takes "
        f"{res['dump_vs_tq_full_save']} of that)")
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
