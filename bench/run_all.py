"""Run every benchmark in bench/ and keep its figures: what ``make bench`` runs.

    python bench/run_all.py            # every bench/bench_*.py, full size
    python bench/run_all.py --quick    # each with --quick
    python bench/run_all.py --only bench_stall,bench_checkpoint

For each ``bench/bench_*.py`` (in name order) it runs the script in a subprocess, shows its
output as it comes, and writes into ``bench/results/``:

* ``NAME.txt``: the script's whole stdout and stderr;
* ``NAME.json``: ``{"bench", "date_utc", "machine", "args", "seconds", "returncode",
  "figures"}`` where ``figures`` is the JSON object the script printed as its last stdout
  line (every bench here ends that way; ``bench_engine.py`` writes its figures to a file
  given with ``--json``), and ``machine`` says what and how loaded the machine was (CPU
  count and model, memory, load average before and after, kernel, Python, the record path).

Then ``bench/report.py`` builds ``results.md`` and the PNG charts from the JSON files.
Exit status 1 when a bench failed (the others still run).  Figures on a shared machine
move with its load: each bench prints its own same-run baselines; compare ratios.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
RESULTS = BENCH / "results"
# scripts that write their figures to a file instead of a last JSON line
JSON_FILE_FLAG = {"bench_engine": "--json"}


def machine() -> Dict[str, Any]:
    """What this machine is and how busy it is now."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) * 1024
    except OSError:
        pass
    sys.path.insert(0, str(ROOT))
    try:
        from tqstore import _native

        impl = _native.IMPLEMENTATION
    except Exception:  # noqa: BLE001 - informative only
        impl = "?"
    return {"cpus": os.cpu_count(), "cpu_model": model, "mem_gib": round(mem / 2**30, 1),
            "kernel": platform.release(), "python": platform.python_version(), "record_path": impl,
            "load_avg": os.getloadavg()[0]}


def last_json(text: str) -> Optional[Dict[str, Any]]:
    """The last line of ``text`` that parses as a JSON object."""
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if isinstance(doc, dict):
                return doc
    return None


def run_one(script: Path, quick: bool) -> Dict[str, Any]:
    name = script.stem
    args: List[str] = ["--quick"] if quick else []
    json_file = None
    if name in JSON_FILE_FLAG:
        json_file = RESULTS / f".{name}.raw.json"
        args += [JSON_FILE_FLAG[name], str(json_file)]
    before = machine()
    t0 = time.time()
    proc = subprocess.Popen([sys.executable, str(script), *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, cwd=ROOT, bufsize=1)
    lines = []
    assert proc.stdout is not None
    for line in proc.stdout:
        sys.stdout.write(line)
        sys.stdout.flush()
        lines.append(line)
    rc = proc.wait()
    text = "".join(lines)
    (RESULTS / f"{name}.txt").write_text(text)
    figures = None
    if json_file is not None and json_file.exists():
        figures = json.loads(json_file.read_text())
        json_file.unlink()
    elif json_file is None:
        figures = last_json(text)
    before["load_avg_after"] = os.getloadavg()[0]
    doc = {"bench": name, "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t0)), "machine": before,
           "args": args if json_file is None else ["--quick"] * quick, "seconds": round(time.time() - t0, 1),
           "returncode": rc, "figures": figures}
    (RESULTS / f"{name}.json").write_text(json.dumps(doc, indent=1) + "\n")
    return doc


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="run each bench with --quick")
    ap.add_argument("--only", default="", help="comma-separated bench names (default: every bench/bench_*.py)")
    args = ap.parse_args(argv)
    RESULTS.mkdir(exist_ok=True)
    only = {n for n in args.only.split(",") if n}
    failed = []
    for script in sorted(BENCH.glob("bench_*.py")):
        if only and script.stem not in only:
            continue
        print(f"==> {script.name}{' --quick' if args.quick else ''}", flush=True)
        doc = run_one(script, args.quick)
        if doc["returncode"] != 0 or doc["figures"] is None:
            failed.append(script.stem)
            print(f"==> {script.name} FAILED (exit {doc['returncode']}, figures {'found' if doc['figures'] else 'none'})",
                  flush=True)
    rc = subprocess.call([sys.executable, str(BENCH / "report.py")], cwd=ROOT)
    if failed:
        print(f"failed: {', '.join(failed)}")
    return 1 if failed or rc else 0


if __name__ == "__main__":
    sys.exit(main())
