"""Ray benchmark: a store whose parts are Ray actors (``tqstore.ray.RayParts``) against the
embedded store, on the same rows, in the same run.

Usage: python bench/bench_ray.py [--quick] [--gib N] [--units 2] [--rounds 3] [--dir DIR]

Rows are bench_checkpoint's realistic RL samples (int64 token ids and float32 logprobs of
512..2047 tokens, jagged; the response text; a tag), about 256 MiB of payload by default
(``--quick`` 64 MiB), made once and put into every store.  Each round runs every backend
back to back (each one first in its turn: a backend's save and load otherwise meet the
writeback of the one before), each on a new store of ``--units`` units on a local Ray
(``num_cpus=8``):

* ``open_s``: opening the new store (Ray: an actor per part starts and imports tqstore);
* ``put_gib_s``: ``kv_batch_put`` of every row, batches of 256, payload bytes / wall time;
* ``get_gib_s``: ``kv_batch_get`` of every key, batches of 256;
* ``save_gib_s``: a blocking ``save_checkpoint`` (each unit writes its own files);
* ``load_gib_s``: ``load_checkpoint`` of it into the reopened store.

Three backends: ``embedded``; ``ray``, the store in this process over part actors
(``RayParts``); ``served``, the store in a named actor of its own over part actors, this
process a client of it (``tq.init({"backend": "ray"})``, :func:`tqstore.ray.connect`: the
payload passes through the store's actor).

Every figure is the median of the rounds; ``ray_vs_embedded_<figure>`` is ray ÷ embedded
for the rates (higher is better) and embedded ÷ ray for ``open`` (the same sense);
``served_vs_embedded_<figure>`` likewise.  Progress
goes to stderr; the last line of stdout is one JSON object (``{"skipped": ...}`` when ray
is not installed: the ``ray`` extra).
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_checkpoint import BATCH, GiB, log, make_batch, size_args, text_pool  # noqa: E402

warnings.filterwarnings("ignore", message=".*nested.*")
FIGURES = ("open_s", "put_gib_s", "get_gib_s", "save_gib_s", "load_gib_s")


def rows_of(target_bytes: int):
    """Batches ``(keys, fields, tags)`` of about ``target_bytes`` of payload, and its bytes."""
    g = torch.Generator().manual_seed(0)
    pool = text_pool()
    batches, nbytes, first = [], 0, 0
    while nbytes < target_bytes:
        keys, fields, tags = make_batch(g, first, BATCH, pool)
        nbytes += sum(t.numel() * t.element_size() for t in fields["input_ids"] + fields["old_logprobs"])
        nbytes += sum(len(s.encode()) for s in fields["response"])
        batches.append((keys, fields, tags))
        first += BATCH
    return batches, nbytes


def one(open_store, path: Path, units: int, batches, nbytes: int) -> dict:
    """One backend's figures on a new store in ``path`` (``open_store(path, num_units)``
    opens it: a ``num_units`` of None reopens it)."""
    out = {}
    t0 = time.perf_counter()
    s = open_store(path / "store", units)
    out["open_s"] = time.perf_counter() - t0
    try:
        t0 = time.perf_counter()
        for keys, fields, tags in batches:
            s.kv_batch_put(keys, "train", fields, tags=tags)
        out["put_gib_s"] = nbytes / GiB / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        for keys, _f, _t in batches:
            s.kv_batch_get(keys, "train")
        out["get_gib_s"] = nbytes / GiB / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        s.save_checkpoint(path / "ck")
        out["save_gib_s"] = nbytes / GiB / (time.perf_counter() - t0)
    finally:
        s.close()
    with open_store(path / "store", None) as s:
        t0 = time.perf_counter()
        s.load_checkpoint(path / "ck")
        out["load_gib_s"] = nbytes / GiB / (time.perf_counter() - t0)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    size_args(ap, default_gib=0.25, quick_gib=0.0625, units=2)
    args = ap.parse_args(argv)
    try:
        import ray
    except ImportError:
        print(json.dumps({"skipped": "ray is not installed (pip install 'tqstore[ray]')"}))
        return 0
    import tqstore
    from tqstore.ray import RayParts, connect

    def opener(name: str, rnd: int):
        parts = RayParts() if name == "ray" else None

        def open_store(path: Path, units):
            kw = {"result_type": "dict", **({"num_units": units} if units else {})}
            if name == "served":  # tq.init({"backend": "ray"}): the store in a named actor, this process a client
                return connect(f"bench-{rnd}", str(path), kw)
            return tqstore.open(path, parts=parts, **kw)

        return open_store

    gib = args.gib if args.gib is not None else (0.0625 if args.quick else 0.25)
    batches, nbytes = rows_of(int(gib * GiB))
    log(f"{sum(len(b[0]) for b in batches)} rows, {nbytes / GiB:.3f} GiB of payload, {args.units} units")
    ray.init(address="local", num_cpus=8, include_dashboard=False, log_to_driver=False, configure_logging=False)
    base = Path(args.dir or tempfile.mkdtemp(prefix="tqstore-bench-ray-"))
    got = {"embedded": [], "ray": [], "served": []}
    try:
        names = list(got)
        for rnd in range(args.rounds):
            for name in names[rnd % len(names):] + names[:rnd % len(names)]:  # each backend first in turn
                work = base / f"{name}-{rnd}"
                work.mkdir(parents=True)
                got[name].append(one(opener(name, rnd), work, args.units, batches, nbytes))
                shutil.rmtree(work)
                log(f"round {rnd} {name}: " + ", ".join(f"{k} {v:.3f}" for k, v in got[name][-1].items()))
    finally:
        ray.shutdown()
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)
    med = {name: {k: statistics.median(r[k] for r in rs) for k in FIGURES} for name, rs in got.items()}
    res = {"payload_gib": round(nbytes / GiB, 4), "units": args.units, "rounds": args.rounds}
    for name in med:
        for k, v in med[name].items():
            res[f"{name}_{k}"] = round(v, 4)
    for k in FIGURES:
        e = med["embedded"][k]
        unit = "s" if k == "open_s" else "GiB/s"
        for name in ("ray", "served"):
            r = med[name][k]
            res[f"{name}_vs_embedded_{k}"] = round(e / r if k == "open_s" else r / e, 3)
            log(f"{k[:-2] if k == 'open_s' else k[:-6]:5s} {name:6s} {r:.3f} {unit}, embedded {e:.3f} {unit}: "
                f"{name} {res[f'{name}_vs_embedded_{k}']:.2f}x the embedded store")
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
