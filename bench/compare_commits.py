"""Run the benches of two (or more) builds alternately and print each figure for every build
with its ratio to the first build (medians over rounds).

    python bench/compare_commits.py --tree old=/work/wt-old --tree new=. --rounds 3
    python bench/compare_commits.py --tree old=../wt-old --tree new=. --tree new-dict=. \\
        --only new-dict=dataplane --args new-dict:dataplane="--result-type dict"

Each ``--tree LABEL=DIR`` is a checkout with its own ``DIR/.venv`` (``make install`` there);
its own ``bench/bench_*.py`` run with its own interpreter, so each build is measured as a
user gets it.  In every round the builds run one after the other for each bench, and the
order is reversed every other round, so a drift of the machine's load hits every build
alike.  On a shared machine the absolute figures move with the load: read the ratios
(``LABEL/first``; higher is better for throughputs, lower for the figures marked so).  ``--quick`` (the
default) passes ``--quick`` to every bench.

``--scripts-from LABEL`` makes every build run LABEL's bench scripts instead of its own (each from a
scratch directory whose ``tqstore`` links to that build's package, still with the build's own
interpreter), so that a method changed between the builds cannot pass for a change of speed: with
``--scripts-from old`` both builds are measured the way the old one was.

Figures taken: bench_engine's ``--json`` (medians of its repetitions: bulk put/get,
memcpy and page-cache baselines, durability, zstd, small rows native and pure),
bench_dataplane's printed lines, and bench_checkpoint's last JSON line (its numeric keys).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Tuple

BENCHES = ("engine", "dataplane", "checkpoint")
GiB = float(1 << 30)

# rates and ratios of ours to a baseline are higher-is-better; times, stalls, peaks lower-is-better
HIGHER_IS_BETTER = re.compile(r"(gib_s|rows_s|MBps|bps$|speedup|_vs_)")
LOWER_IS_BETTER = re.compile(r"(_s$|_ms$|stall|peak|incremental_ratio)")


def _lower_is_better(name: str) -> bool:
    return not HIGHER_IS_BETTER.search(name) and bool(LOWER_IS_BETTER.search(name))


def _med(xs: List[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def parse_engine(js: dict) -> Dict[str, float]:
    big, dur, zs, small = js["big"], js["durability"], js["zstd"], js["small"]
    out = {
        "big_put_gib_s": _med(big["put"]) / GiB,
        "big_get_gib_s": _med(big["get"]) / GiB,
        "big_memcpy_gib_s": _med(big["memcpy"]) / GiB,
        "big_pcwrite_gib_s": _med(big["pcwrite"]) / GiB,
        "big_put_vs_pcwrite": _med(big["put"]) / _med(big["pcwrite"]),
        "big_get_vs_memcpy": _med(big["get"]) / _med(big["memcpy"]),
        "durability_checkpoint_gib_s": _med(dur["checkpoint"]) / GiB,
        "durability_commit_gib_s": _med(dur["commit"]) / GiB,
    }
    for kind, z in zs.items():
        short = kind.split()[0].lower()
        out[f"zstd_{short}_put_MBps"] = z["put_MBps"]
        out[f"zstd_{short}_get_MBps"] = z["get_MBps"]
    for impl, d in small.items():
        out[f"small_{impl}_put_rows_s"] = _med(d["put_rows_s"])
        out[f"small_{impl}_get_rows_s"] = _med(d["get_rows_s"])
    return out


_DP = [
    ("kv_batch_put_gib_s", r"^kv_batch_put\s+([\d.]+) GiB/s"),
    ("engine_write_gib_s", r"^kv_batch_put.*engine Store\.write\s+([\d.]+) GiB/s"),
    ("kv_batch_get_gib_s", r"^kv_batch_get\s+([\d.]+) GiB/s"),
    ("engine_read_gib_s", r"^kv_batch_get.*engine Store\.read\s+([\d.]+) GiB/s"),
    ("stream_live_bps", r"^stream get_meta\+get_data\s+([\d.]+) batches/s"),
    ("stream_consumer_bps", r"^stream consumer loop alone\s+([\d.]+) batches/s"),
    ("engine_read_bps", r"^stream consumer loop alone.*engine Store\.read ([\d.]+) batches/s"),
    ("get_meta_ms", r"^get_meta \(force_fetch.*?\)\s+([\d.]+) ms/call"),
]


def parse_dataplane(text: str) -> Dict[str, float]:
    out = {}
    for name, pat in _DP:
        for line in text.splitlines():
            m = re.search(pat, line)
            if m:
                out[name] = float(m.group(1))
                break
    return out


def parse_checkpoint(text: str) -> Dict[str, float]:
    js = json.loads(text.strip().splitlines()[-1])
    return {k: float(v) for k, v in js.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)
            and k not in ("units", "cpus", "rows", "payload_gib_target", "lmdb_walk_entries")}


def script_home(tree: Path, scripts_tree: Path, work: Path) -> Path:
    """A directory whose ``bench/`` holds ``scripts_tree``'s bench scripts and whose ``tqstore``
    links to ``tree``'s package: the scripts put their parent's parent first on ``sys.path``."""
    if tree == scripts_tree:
        return tree
    home = work / f"scripts-{abs(hash((str(tree), str(scripts_tree))))}"
    if not home.exists():
        (home / "bench").mkdir(parents=True)
        for f in (scripts_tree / "bench").glob("*.py"):
            (home / "bench" / f.name).write_bytes(f.read_bytes())
        (home / "tqstore").symlink_to(tree / "tqstore", target_is_directory=True)
    return home


def run_one(label: str, tree: Path, bench: str, quick: bool, extra: List[str], work: Path,
            scripts_tree: Path = None) -> Dict[str, float]:
    py = tree / ".venv" / "bin" / "python"
    script = script_home(tree, scripts_tree or tree, work) / "bench" / f"bench_{bench}.py"
    cmd = [str(py), str(script)] + (["--quick"] if quick else []) + extra
    jpath = None
    if bench == "engine":
        jpath = work / f"engine-{label}-{time.monotonic_ns()}.json"
        cmd += ["--json", str(jpath)]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=str(tree), check=False)
    dt = time.perf_counter() - t0
    if r.returncode:
        raise SystemExit(f"{label} bench_{bench} failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}")
    if bench == "engine":
        figs = parse_engine(json.loads(jpath.read_text()))
        jpath.unlink()
    elif bench == "dataplane":
        figs = parse_dataplane(r.stdout)
    else:
        figs = parse_checkpoint(r.stdout)
    print(f"  [{label} bench_{bench} {dt:.0f} s, load {os.getloadavg()[0]:.2f}]", file=sys.stderr, flush=True)
    return figs


def report(figs: Dict[str, Dict[str, Dict[str, List[float]]]], labels: List[str], benches: List[str],
           rounds: int) -> None:
    """Print each bench's figures: the median for every build and its ratio to the first."""
    ref = labels[0]
    for b in benches:
        print(f"\nbench_{b} (median of {rounds} alternating rounds; ratio = build / {ref}):")
        names = list(figs[b][ref])
        ran = [lb for lb in labels if figs[b].get(lb)]
        print("  " + f"{'figure':34s}" + "".join(f"{lb:>12s}" for lb in ran)
              + "".join(f"{lb + '/' + ref:>14s}" for lb in ran[1:]))
        for name in names:
            vals = [_med(figs[b][lb].get(name, [])) for lb in ran]
            rat = [v / vals[0] if vals[0] else float("nan") for v in vals[1:]]
            flag = " (lower is better)" if _lower_is_better(name) else ""
            print("  " + f"{name:34s}" + "".join(f"{v:12.4g}" for v in vals) + "".join(f"{r:14.3f}" for r in rat)
                  + flag)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tree", action="append", default=[], metavar="LABEL=DIR",
                    help="a build to measure (repeat; the first is the reference of the ratios)")
    ap.add_argument("--bench", action="append", choices=BENCHES, help="benches to run (default all three)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--full", action="store_true", help="run the benches at their default sizes, not --quick")
    ap.add_argument("--args", action="append", default=[], metavar="LABEL:BENCH=ARGS",
                    help='extra arguments for one build\'s bench, e.g. new-dict:dataplane="--result-type dict"')
    ap.add_argument("--only", action="append", default=[], metavar="LABEL=BENCH[,BENCH]",
                    help="run only these benches for one build (e.g. new-dict=dataplane)")
    ap.add_argument("--scripts-from", default=None, metavar="LABEL",
                    help="every build runs this build's bench scripts (the same method for all)")
    ap.add_argument("--json", default=None, help="also write every round's figures to this file")
    ap.add_argument("--from-json", default=None, help="print the report of an earlier run's --json file")
    args = ap.parse_args(argv)
    if args.from_json:
        figs = json.loads(Path(args.from_json).read_text())
        labels = list(next(iter(figs.values())))
        rounds = max(len(v) for b in figs.values() for lb in b.values() if lb for v in lb.values())
        report(figs, labels, list(figs), rounds)
        return 0
    if not args.tree:
        ap.error("give at least one --tree LABEL=DIR")
    trees: List[Tuple[str, Path]] = []
    for t in args.tree:
        label, _, d = t.partition("=")
        trees.append((label, Path(d).resolve()))
    extra: Dict[Tuple[str, str], List[str]] = {}
    for a in args.args:
        lb, _, rest = a.partition(":")
        bench, _, xs = rest.partition("=")
        extra[(lb, bench)] = shlex.split(xs)
    benches = args.bench or list(BENCHES)
    scripts_tree = None
    if args.scripts_from:
        homes = dict(trees)
        if args.scripts_from not in homes:
            ap.error(f"--scripts-from {args.scripts_from!r} is not one of the --tree labels")
        scripts_tree = homes[args.scripts_from]
    only = {lb: set(bs.split(",")) for lb, _, bs in (o.partition("=") for o in args.only)}
    figs: Dict[str, Dict[str, Dict[str, List[float]]]] = {b: {lb: {} for lb, _ in trees} for b in benches}
    work = Path(tempfile.mkdtemp(prefix="tq-compare-"))
    print(f"compare: {', '.join(f'{lb}={d}' for lb, d in trees)}; {args.rounds} round(s), "
          f"{'full' if args.full else '--quick'} sizes, "
          f"{'scripts of ' + args.scripts_from if args.scripts_from else 'each build its own scripts'}, builds alternating (order reversed every other round); "
          f"load average {os.getloadavg()[0]:.2f} at start", flush=True)
    for rnd in range(args.rounds):
        order = trees if rnd % 2 == 0 else trees[::-1]
        for b in benches:
            for lb, d in order:
                if lb in only and b not in only[lb]:
                    continue
                got = run_one(lb, d, b, not args.full, extra.get((lb, b), []), work, scripts_tree)
                for k, v in got.items():
                    figs[b][lb].setdefault(k, []).append(v)
    report(figs, [lb for lb, _ in trees], benches, args.rounds)
    print(f"\nload average {os.getloadavg()[0]:.2f} at the end", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(figs, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
