"""Run the whole crash matrix; ``make crash-test`` calls this after the crash-marked tests.

Every operation of ``tests/crash/scenarios.py`` is crashed before each of its I/O events,
once by process kill and once per power-loss seed, plus power loss right after it
returned.  Violations are printed one per line; the last line is exactly::

    crash-matrix: P points x S seeds, V violations

(P distinct crash points, i.e. (operation, failpoint, occurrence); S power-loss seeds per
point).  Exit status 1 when V > 0.

    python tests/crash/run_matrix.py [--seeds 0,1,2,3] [--only NAME[,NAME]] [--max-points N] [-v]
"""
from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from crash.harness import DEFAULT_SEEDS, Matrix  # noqa: E402
from crash.scenarios import all_scenarios  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default=",".join(map(str, DEFAULT_SEEDS)), help="power-loss seeds")
    ap.add_argument("--only", default="", help="comma-separated scenario names")
    ap.add_argument("--max-points", type=int, default=None, help="crash points per scenario (default all)")
    ap.add_argument("-v", "--verbose", action="store_true", help="one line per scenario")
    args = ap.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    only = {s for s in args.only.split(",") if s}
    scenarios = [sc for sc in all_scenarios() if not only or sc.name in only]
    t0 = time.monotonic()
    per_ops = defaultdict(set)
    with Matrix(seeds=seeds) as m:
        for sc in scenarios:
            t = time.monotonic()
            results = m.run_scenario(sc, max_points=args.max_points)
            pts = {p for p in m.points if p[0] == sc.name}
            per_ops[sc.ops or sc.name] |= pts
            n_bad = sum(len(r.violations) for r in results)
            if args.verbose or n_bad:
                print(f"{sc.name:28s} {len(pts):4d} points {len(results):5d} runs {n_bad:3d} violations "
                      f"{time.monotonic() - t:6.1f}s", flush=True)
        for line in m.violations():
            print(line[:2000])
        if args.verbose:
            print("points per operation: " + ", ".join(f"{k}={len(v)}" for k, v in sorted(per_ops.items())))
            print(f"runs: {len(m.results)} in {time.monotonic() - t0:.1f}s")
        print(m.summary_line(), flush=True)
        return 1 if m.violations() else 0


if __name__ == "__main__":
    sys.exit(main())
