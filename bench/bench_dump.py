"""Selective dump benchmark (issue 10): dump 10 % of the keys of a store against the
client-side path a user would write otherwise (V1) and a full checkpoint save, in the same
run, alternating, so the figures are ratios of same-run measurements.

Usage: python bench/bench_dump.py [--quick] [--gib N] [--units 4] [--frac 0.1] [--rounds N] [--dir DIR]

``--quick`` ≈ 256 MiB of payload, default ≈ 2 GiB, 4 units; rows as ``bench_checkpoint.py``
(int64 token ids and float32 logprobs of 512..2047 tokens, jagged; response text; a tag
with the reward).  Progress goes to stderr; the last line of stdout is one JSON object:

* ``dump_stall_ms``: what ``dump_data_by_key(blocking=False)`` blocks the caller (the cut; the
  keys are checked after it, in the cut's snapshot, by the background job; median of 5);
* ``dump_s`` / ``dump_gib_s``: a blocking dump (durable: every shard fsynced, published),
  best of the rounds, dump bytes / wall time;
* ``v1_dump_s``, ``v1_dump_speedup``: ``kv_batch_get`` of the same keys (batches of 256) and
  the values' raw bytes written into one file (``os.writev``, no pickle) and fsynced; the
  speedup is V1 time ÷ dump time;
* ``full_save_s``, ``dump_vs_full_save``: a full copy-mode ``save_checkpoint`` of the same
  store; the ratio is dump time ÷ full save time;
* ``raw_write_s``, ``dump_vs_raw_write``: a plain copy of the dump's files (read from the cache,
  written and fsynced one after another; after each dump), the disk's floor for a dump: the
  faster of the plain loop (``raw_write_plain_s``) and the same loop starting each 8 MiB
  chunk's writeback as soon as it is written (``raw_write_writeback_s``, as the dump does);
  the ratio is dump time ÷ that copy's;
* ``raw_read_gib_s``: a plain read (cold cache) of the dump's files, the baseline of a load;
* ``load_gib_s``: ``load_data_by_key`` of the dump into a new store of as many units (the
  dump's files cold), dump bytes / wall time; ``v1_load_speedup``: the V1 load (the V1 file
  read cold, its batches cut from its bytes and ``kv_batch_put``) ÷ our load;
  ``load_vs_raw_read``: our GiB/s ÷ the plain read's.  Raw read, load and V1 load alternate
  over the rounds; best of each;
* ``load_peak_anon_mib``: the most resident anonymous memory (``RssAnon``, sampled every
  millisecond) a load added, the largest over the rounds (the issue's bound: under 256 MiB
  whatever the dump's size; the page cache and mapped files are not in it);
  ``dump_peak_anon_mib`` the same of the blocking dumps;
* ``raw_cache_copy_s``: a plain copy of the dump's files into the page cache (read from the
  cache, written, no fsync), after each plain read;
* ``*_ceiling`` / ``*_floor``: the best this disk allows, from the same run's plain I/O: a dump
  writes its files durably, so ``v1_dump_speedup_ceiling`` = V1 dump ÷ the plain durable copy
  and ``dump_vs_full_save_floor`` = that copy ÷ the full save; a load (the store's default
  durability, "checkpoint": no fsync) reads the bytes and writes them into the units'
  segments in the page cache, so it takes at least the slower of the cold read and the page
  cache copy: ``v1_load_speedup_ceiling`` = V1 load ÷ that, ``load_vs_raw_read_ceiling`` = the
  cold read ÷ that.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import tqstore  # noqa: E402
from bench_checkpoint import BATCH, GiB, drop_caches, fill, files_under, log, raw_read, raw_write  # noqa: E402
from bench_scale import rss_anon  # noqa: E402


def _buffers(batch: Any) -> List[memoryview]:
    """The raw bytes of a kv_batch_get result, field by field (no pickle, no copy where possible)."""
    out = []
    for f in sorted(batch.keys()):
        v = batch[f]
        if isinstance(v, torch.Tensor):
            t = v.values() if v.is_nested else v
            out.append(memoryview(t.contiguous().view(-1).view(torch.uint8).numpy()))
        else:
            out.append(memoryview("\0".join(map(str, list(v))).encode()))
    return out


def v1_dump(store, keys: List[str], path: Path) -> float:
    """V1: kv_batch_get of ``keys`` in batches + one file of the raw bytes, fsynced.  ``store``:
    anything with ``kv_list(partition)`` and ``kv_batch_get(keys, partition)`` (a tqstore store,
    or the ``transfer_queue`` module)."""
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        tags = store.kv_list("train")["train"]
        meta = json.dumps({k: tags[k] for k in keys}).encode()
        os.write(fd, meta)
        for i in range(0, len(keys), BATCH):
            bufs = _buffers(store.kv_batch_get(keys[i:i + BATCH], "train"))
            while bufs:
                os.writev(fd, bufs[:1024])
                bufs = bufs[1024:]
        os.fsync(fd)
    finally:
        os.close(fd)
    return time.perf_counter() - t0


def _rss_anon() -> Optional[int]:
    """:func:`bench_scale.rss_anon`, None where ``/proc/self/status`` cannot be read (not Linux)."""
    try:
        return rss_anon()
    except OSError:
        return None


class AnonPeak:
    """The most resident anonymous memory added over a block (sampled every millisecond by a
    thread, so a peak shorter than that may be missed); ``added`` in bytes, None off Linux."""

    def __enter__(self) -> "AnonPeak":
        self.before = _rss_anon()
        self.peak = self.before
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._sample, daemon=True)
        self._t.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.001):
            now = _rss_anon()
            if now is not None and self.peak is not None:
                self.peak = max(self.peak, now)

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._t.join()
        now = _rss_anon()
        if now is not None and self.peak is not None:
            self.peak = max(self.peak, now)

    @property
    def added(self) -> Optional[int]:
        return None if self.before is None or self.peak is None else self.peak - self.before


def measure_load(store_path: Path, dump_dir: Path, units: int, peaks: Optional[List[int]] = None) -> Optional[float]:
    """Seconds of ``load_data_by_key(dump_dir)`` into a new store of ``units`` units (the
    dump's files cold; the store opened before the clock starts); the anonymous memory the
    load added at its peak is appended to ``peaks`` (Linux)."""
    if store_path.exists():
        shutil.rmtree(store_path)
    with tqstore.open(store_path, num_units=units) as s:
        drop_caches(files_under(dump_dir))
        with AnonPeak() as mem:
            t0 = time.perf_counter()
            rep = s.load_data_by_key(dump_dir)
            dt = time.perf_counter() - t0
        if peaks is not None and mem.added is not None:
            peaks.append(mem.added)
        log(f"  load: {rep['keys']} keys, {rep['frames']} frames, {rep['bytes'] / GiB:.3f} GiB in {dt:.3f} s ("
            + ", ".join(f"{k} {v:.3f}" for k, v in rep["phases_s"].items())
            + (f"; anonymous memory added at the peak {mem.added / 2**20:.1f} MiB" if mem.added is not None else "")
            + ")")
    shutil.rmtree(store_path)
    return dt


def v1_layout(store_path: Path, keys: List[str]) -> List[List[tuple]]:
    """What a V1 reader must know to cut the V1 file back into batches (the writer of
    :func:`v1_dump` put none of it in the file): per batch, per field (sorted), its kind and
    the per-row element counts or the number of text bytes.  Computed outside the clock."""
    out = []
    with tqstore.open(store_path) as s:
        for i in range(0, len(keys), BATCH):
            b = s.kv_batch_get(keys[i:i + BATCH], "train")
            fields = []
            for f in sorted(b.keys()):
                v = b[f]
                if isinstance(v, torch.Tensor):
                    rows = [t.numel() for t in v.unbind()] if v.is_nested else None
                    fields.append((f, "tensor", v.dtype, rows if rows is not None else tuple(v.shape),
                                   v.element_size() * (sum(rows) if rows is not None else v.numel())))
                else:
                    fields.append((f, "text", None, len(v), len("\0".join(map(str, list(v))).encode())))
            out.append(fields)
    return out


def measure_v1_load(store_path: Path, v1_file: Path, keys: List[str], units: int, layout=None,
                    meta_len: int = 0) -> Optional[float]:
    """Seconds of the V1 load: read the V1 file (cold) and ``kv_batch_put`` its batches (tensors
    cut from the file's bytes without copies, jagged rows split, text decoded) into a new store."""
    if layout is None:
        return None
    if store_path.exists():
        shutil.rmtree(store_path)
    with tqstore.open(store_path, num_units=units) as s:
        drop_caches([v1_file])
        t0 = time.perf_counter()
        v1_read(v1_file, keys, layout, meta_len, lambda ks, batch, tags: s.kv_batch_put(ks, "train", batch, tags=tags))
        dt = time.perf_counter() - t0
    shutil.rmtree(store_path)
    return dt


def v1_read(v1_file: Path, keys: List[str], layout: List[List[tuple]], meta_len: int,
            put: Callable[[List[str], Dict[str, Any], List[Dict[str, Any]]], Any]) -> None:
    """The V1 reader: the file read at once, cut into :func:`v1_layout`'s batches (tensors from
    the file's bytes without copies, jagged rows split, text decoded), each given to
    ``put(keys, fields, tags)``."""
    with open(v1_file, "rb") as f:
        data = bytearray(f.read())
    tags = json.loads(bytes(data[:meta_len]))
    pos = meta_len
    for n, fields in enumerate(layout):
        ks = keys[n * BATCH:(n + 1) * BATCH]
        batch: Dict[str, Any] = {}
        for f, kind, dtype, rows, nbytes in fields:
            raw = memoryview(data)[pos:pos + nbytes]
            pos += nbytes
            if kind == "text":
                batch[f] = bytes(raw).decode().split("\0")
            elif isinstance(rows, list):
                flat = torch.frombuffer(raw, dtype=dtype) if nbytes else torch.zeros(0, dtype=dtype)
                batch[f] = list(torch.split(flat, rows))
            else:
                batch[f] = torch.frombuffer(raw, dtype=dtype).view(rows)
        put(ks, batch, [tags[k] for k in ks])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="about 256 MiB of payload")
    ap.add_argument("--gib", type=float, default=None, help="payload size (default 2, --quick 0.25)")
    ap.add_argument("--units", type=int, default=4)
    ap.add_argument("--frac", type=float, default=0.1, help="fraction of the keys dumped")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds (best of)")
    ap.add_argument("--dir", default=None, help="work directory (default: a temporary one, removed after)")
    args = ap.parse_args(argv)
    gib = args.gib if args.gib is not None else (0.25 if args.quick else 2.0)
    base = Path(args.dir or tempfile.mkdtemp(prefix="tqstore-bench-dump-"))
    base.mkdir(parents=True, exist_ok=True)
    try:
        return run(base, gib, args.units, args.frac, args.rounds)
    finally:
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)


def run(base: Path, gib: float, units: int, frac: float, rounds: int) -> int:
    from tqstore import _native

    res: Dict[str, Any] = {"payload_gib_target": gib, "units": units, "frac": frac, "cpus": os.cpu_count(),
                           "implementation": _native.IMPLEMENTATION}
    store = tqstore.open(base / "store", num_units=units)
    rows, fill_s, _pool = fill(store, int(gib * GiB))
    seg_bytes = sum(p.stat().st_size for p in files_under(store.state_dir, "seg-*.tqs"))
    keys = list(store.kv_list("train")["train"])
    pick = random.Random(0).sample(keys, max(1, int(len(keys) * frac)))
    res.update(rows=rows, segment_gib=round(seg_bytes / GiB, 3), keys_dumped=len(pick), fill_s=round(fill_s, 2))
    log(f"filled {rows} rows, {seg_bytes / GiB:.2f} GiB of segments in {fill_s:.1f} s; dumping {len(pick)} keys")

    stalls = []
    for i in range(5):
        t0 = time.perf_counter()
        h = store.dump_data_by_key(base / f"stall{i}", pick, "train", blocking=False)
        stalls.append(time.perf_counter() - t0)
        h.result()
        shutil.rmtree(base / f"stall{i}")
    dumps, v1s, fulls, raws_w, raws_wb, dump_peaks = [], [], [], [], [], []
    rep: Dict[str, Any] = {}
    for rnd in range(rounds):  # alternating: dump, V1, full save (the machine is shared and noisy)
        order = [0, 1, 2] if rnd % 2 == 0 else [2, 1, 0]
        for what in order:
            os.sync()
            if what == 0:
                with AnonPeak() as mem:
                    t0 = time.perf_counter()
                    rep = store.dump_data_by_key(base / f"dump{rnd}", pick, "train")
                    dumps.append(time.perf_counter() - t0)
                if mem.added is not None:
                    dump_peaks.append(mem.added)
                log(f"  dump phases: " + ", ".join(f"{k} {v:.3f}" for k, v in rep["phases_s"].items()))
                for wb in ((False, True) if rnd % 2 == 0 else (True, False)):
                    os.sync()
                    (raws_wb if wb else raws_w).append(
                        raw_write(files_under(base / f"dump{rnd}"), base / f"raww{rnd}", writeback=wb))
                    shutil.rmtree(base / f"raww{rnd}")
            elif what == 1:
                v1s.append(v1_dump(store, pick, base / f"v1-{rnd}.bin"))
            else:
                t0 = time.perf_counter()
                store.save_checkpoint(base / f"full{rnd}", copy_segments=True)
                fulls.append(time.perf_counter() - t0)
                shutil.rmtree(base / f"full{rnd}")
        log(f"round {rnd}: dump {dumps[-1]:.3f} s, V1 {v1s[-1]:.3f} s, full save {fulls[-1]:.3f} s, "
            f"durable copy of the dump's files {raws_w[-1]:.3f} s (starting writeback early {raws_wb[-1]:.3f} s)")
        if rnd < rounds - 1:
            shutil.rmtree(base / f"dump{rnd}")
            os.unlink(base / f"v1-{rnd}.bin")
    dump_dir = base / f"dump{rounds - 1}"
    v1_file = base / f"v1-{rounds - 1}.bin"
    dump_bytes = int(rep["bytes"])
    dump_s, v1_s, full_s = min(dumps), min(v1s), min(fulls)
    dump_files = files_under(dump_dir)
    _tags = store.kv_list("train")["train"]
    store.close()
    layout = v1_layout(base / "store", pick)
    meta_len = len(json.dumps({k: _tags[k] for k in pick}).encode())
    raws, loads, v1_loads, cache_copies, load_peaks = [], [], [], [], []
    for rnd in range(rounds):  # alternating: plain read, load by key, V1 load (cold files each time)
        for what in ([0, 1, 2] if rnd % 2 == 0 else [2, 1, 0]):
            if what == 0:
                how = drop_caches(dump_files)
                raws.append(raw_read(dump_files))
                cache_copies.append(raw_write(dump_files, base / "cachecopy", durable=False))
                shutil.rmtree(base / "cachecopy")
            elif what == 1:
                loads.append(measure_load(base / "target", dump_dir, units, load_peaks))
            else:
                v1_loads.append(measure_v1_load(base / "target_v1", v1_file, pick, units, layout, meta_len))
        log(f"round {rnd}: raw read {raws[-1]:.3f} s, load {loads[-1]:.3f} s, V1 load {v1_loads[-1]:.3f} s, "
            f"page cache copy {cache_copies[-1]:.3f} s")
    raw_s, load_s, v1_load_s = min(raws), min(loads), min(v1_loads)
    raw_w_s, cache_copy_s = min(raws_w + raws_wb), min(cache_copies)
    load_floor_s = max(raw_s, cache_copy_s)  # a load reads (cold) and writes into the page cache
    load_gib_s = None if load_s is None else round(dump_bytes / GiB / load_s, 3)
    res.update(
        dump_stall_ms=round(statistics.median(stalls) * 1000, 3), dump_s=round(dump_s, 3),
        dump_gib=round(dump_bytes / GiB, 3), dump_gib_s=round(dump_bytes / GiB / dump_s, 3),
        v1_dump_s=round(v1_s, 3), v1_file_gib=round(v1_file.stat().st_size / GiB, 3),
        v1_dump_speedup=round(v1_s / dump_s, 2), full_save_s=round(full_s, 3),
        dump_vs_full_save=round(dump_s / full_s, 3), cache=how, raw_read_gib_s=round(dump_bytes / GiB / raw_s, 3),
        load_gib_s=load_gib_s, v1_load_speedup=None if load_s is None or v1_load_s is None else
        round(v1_load_s / load_s, 2),
        load_vs_raw_read=None if load_s is None else round(raw_s / load_s, 3),
        dump_rounds_s=[round(x, 3) for x in dumps], v1_rounds_s=[round(x, 3) for x in v1s],
        full_save_rounds_s=[round(x, 3) for x in fulls], load_s=round(load_s, 3), v1_load_s=round(v1_load_s, 3),
        raw_read_s=round(raw_s, 3), load_rounds_s=[round(x, 3) for x in loads],
        v1_load_rounds_s=[round(x, 3) for x in v1_loads], raw_read_rounds_s=[round(x, 3) for x in raws],
        raw_write_s=round(raw_w_s, 3), dump_vs_raw_write=round(dump_s / raw_w_s, 3),
        raw_write_plain_s=round(min(raws_w), 3), raw_write_writeback_s=round(min(raws_wb), 3),
        raw_write_rounds_s=[round(x, 3) for x in raws_w], raw_write_writeback_rounds_s=[round(x, 3) for x in raws_wb],
        raw_cache_copy_s=round(cache_copy_s, 3), raw_cache_copy_rounds_s=[round(x, 3) for x in cache_copies],
        # what this disk allows at best: a dump writes its files durably (no faster than the plain
        # durable copy); a load reads the bytes and writes them into the page cache (no faster than
        # the slower of the cold read and the page cache copy)
        v1_dump_speedup_ceiling=round(v1_s / raw_w_s, 2), dump_vs_full_save_floor=round(raw_w_s / full_s, 3),
        v1_load_speedup_ceiling=None if v1_load_s is None else round(v1_load_s / load_floor_s, 2),
        load_vs_raw_read_ceiling=round(raw_s / load_floor_s, 3),
        load_peak_anon_mib=round(max(load_peaks) / 2**20, 1) if load_peaks else None,
        dump_peak_anon_mib=round(max(dump_peaks) / 2**20, 1) if dump_peaks else None,
        load_avg_1m=round(os.getloadavg()[0], 2))
    log(f"dump: stall {res['dump_stall_ms']} ms, {res['dump_gib_s']} GiB/s ({dump_bytes / GiB:.3f} GiB in "
        f"{dump_s:.3f} s); V1 {v1_s:.3f} s ({res['v1_dump_speedup']}x slower); full save {full_s:.3f} s "
        f"(dump/full {res['dump_vs_full_save']}); raw read {res['raw_read_gib_s']} GiB/s; anonymous memory added at the "
        f"peak {res['dump_peak_anon_mib']} MiB")
    log(f"load: {load_gib_s} GiB/s ({load_s:.3f} s); V1 load {v1_load_s:.3f} s ({res['v1_load_speedup']}x slower); "
        f"load / raw read {res['load_vs_raw_read']}; anonymous memory added at the peak {res['load_peak_anon_mib']} MiB")
    log(f"this disk's ceilings (plain durable copy {res['raw_write_s']} s, cold read {res['raw_read_s']} s, page cache "
        f"copy {res['raw_cache_copy_s']} s): dump {res['v1_dump_speedup_ceiling']}x V1 and "
        f"{res['dump_vs_full_save_floor']} of the full save, load {res['v1_load_speedup_ceiling']}x V1 and "
        f"{res['load_vs_raw_read_ceiling']} of the raw read")
    keys_out = ["dump_stall_ms", "dump_gib_s", "v1_dump_speedup", "dump_vs_full_save", "load_gib_s",
                "v1_load_speedup", "load_vs_raw_read"]
    out = {k: res[k] for k in keys_out}
    out.update({k: v for k, v in res.items() if k not in out})
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
