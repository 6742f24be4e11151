"""Build bench/results/results.md and the PNG charts from the bench/results/*.json files
that ``bench/run_all.py`` (``make bench``) wrote.

    python bench/report.py [--results DIR]

``results.md`` is one table: every bench's headline figures next to their same-run
baselines and the ratio, then the other numbers each bench reported; a header says when,
on what machine and under what load they were measured.  Charts (matplotlib, the
``bench`` extra; without it only the table is written):

* ``save_load.png``: checkpoint save and load GiB/s against the raw-disk lines (a plain
  write+fsync loop, a plain cold read of the same bytes) and the V1 client path
  (``kv_batch_get`` + ``torch.save`` / ``torch.load`` + ``kv_batch_put``), from bench_checkpoint;
* ``stall.png``: the stall of ``save_checkpoint(blocking=False)`` against buffer size,
  with what a copying snapshot would stall, from bench_stall;
* ``dump_fraction.png``: dump time against the fraction of keys selected, with the full
  save of the same store, from bench_stall's dump sweep (and bench_dump's point);
* ``tq_putget.png``: put/get GiB/s against TransferQueue, when a bench measured it
  (figures ``tq_put_gib_s`` / ``tq_get_gib_s``).

A chart whose figures no bench reported is left out, and results.md says so.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

RESULTS = Path(__file__).resolve().parent / "results"
GiB = 2**30

Row = Tuple[str, str, str, str, str]  # bench, figure, value, baseline, ratio


def load(results: Path) -> Dict[str, Dict[str, Any]]:
    out = {}
    for p in sorted(results.glob("bench_*.json")):
        try:
            doc = json.loads(p.read_text())
        except ValueError:
            continue
        if isinstance(doc, dict) and isinstance(doc.get("figures"), dict):
            out[doc.get("bench", p.stem)] = doc
    return out


def _num(v: Any) -> Optional[float]:
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, list) and v and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
        return float(statistics.median(v))
    return None


def _fmt(v: Optional[float], unit: str = "") -> str:
    if v is None:
        return ""
    a = abs(v)
    s = f"{v:,.0f}" if a >= 1000 else f"{v:.3g}" if a >= 0.01 else f"{v:.2e}"
    return f"{s} {unit}".strip()


def flatten(d: Any, prefix: str = "") -> Iterator[Tuple[str, float]]:
    """Numeric leaves of a JSON document as ``(dotted.key, value)`` (lists of numbers as their median)."""
    if isinstance(d, dict):
        for k, v in d.items():
            yield from flatten(v, f"{prefix}{k}.")
    else:
        n = _num(d)
        if n is not None:
            yield prefix[:-1], n


def _pair(b: str, f: Dict[str, Any], label: str, key: str, base_key: Optional[str], base_label: str = "",
          unit: str = "GiB/s", scale: float = 1.0) -> Optional[Row]:
    v = _num(f.get(key))
    if v is None:
        return None
    base = _num(f.get(base_key)) if base_key else None
    ratio = f"{v / base:.2f}x" if base else ""
    return (b, label, _fmt(v * scale, unit), f"{base_label} {_fmt(base * scale, unit)}" if base is not None else "",
            ratio)


def headline_rows(docs: Dict[str, Dict[str, Any]]) -> List[Row]:
    rows: List[Optional[Row]] = []
    f = docs.get("bench_checkpoint", {}).get("figures", {})
    if f:
        b = "bench_checkpoint"
        rows += [_pair(b, f, "durable save (copy mode)", "save_gib_s", "raw_write_gib_s", "write+fsync loop"),
                 _pair(b, f, "CRC-verified load (cold)", "load_gib_s", "raw_read_gib_s", "cold read loop"),
                 _pair(b, f, "reshard load", "reshard_load_gib_s", "raw_read_gib_s", "cold read loop"),
                 _pair(b, f, "stall of blocking=False save", "save_stall_ms", None, unit="ms"),
                 _pair(b, f, "save vs V1 (kv_batch_get + torch.save)", "v1_save_speedup", None, unit="x faster"),
                 _pair(b, f, "load vs V1 (torch.load + kv_batch_put)", "v1_load_speedup", None, unit="x faster"),
                 _pair(b, f, "incremental save / first save", "incremental_ratio", None, unit="")]
    e = docs.get("bench_engine", {}).get("figures", {})
    if e.get("big"):
        big = e["big"]
        gb = {k: (_num(big.get(k)) or 0) / GiB for k in ("put", "get", "pcwrite", "memcpy")}
        rows.append(("bench_engine", "put", _fmt(gb["put"], "GiB/s"), f"page-cache write {_fmt(gb['pcwrite'], 'GiB/s')}",
                     f"{gb['put'] / gb['pcwrite']:.2f}x" if gb["pcwrite"] else ""))
        rows.append(("bench_engine", "get (CRC-verified)", _fmt(gb["get"], "GiB/s"),
                     f"memcpy {_fmt(gb['memcpy'], 'GiB/s')}", f"{gb['get'] / gb['memcpy']:.2f}x" if gb["memcpy"] else ""))
    d = docs.get("bench_dataplane", {}).get("figures", {})
    if d:
        b = "bench_dataplane"
        rows += [_pair(b, d, "kv_batch_put", "kv_batch_put", "engine_write", "Store.write"),
                 _pair(b, d, "kv_batch_get", "kv_batch_get", "engine_read", "Store.read"),
                 _pair(b, d, "streaming consumer, producers putting", "stream_live_bps", None, unit="batches/s")]
    s = docs.get("bench_stall", {}).get("figures", {})
    for r in s.get("sizes", []):
        rows.append(("bench_stall", f"stall at {r['gib']:g} GiB ({r['rows']:,} rows)",
                     _fmt(r["stall_ms_median"], "ms"), f"copying snapshot {_fmt(r['copy_stall_ms'], 'ms')}",
                     f"{r['copy_stall_ms'] / r['stall_ms_median']:,.0f}x shorter"))
    for r in s.get("dump", []):
        rows.append(("bench_stall", f"dump {r['fraction'] * 100:g} % of keys", _fmt(r["dump_s"] * 1e3, "ms"),
                     f"full save {_fmt(r['full_save_s'] * 1e3, 'ms')}", f"{r['dump_vs_full_save']:.2f}x"))
    dm = docs.get("bench_dump", {}).get("figures", {})
    if dm:
        b = "bench_dump"
        rows += [_pair(b, dm, "dump stall (blocking=False)", "dump_stall_ms", None, unit="ms"),
                 _pair(b, dm, "dump", "dump_gib_s", None),
                 _pair(b, dm, "dump vs V1", "v1_dump_speedup", None, unit="x faster"),
                 _pair(b, dm, "dump / full save", "dump_vs_full_save", None, unit=""),
                 _pair(b, dm, "load by key", "load_gib_s", None),
                 _pair(b, dm, "load vs V1", "v1_load_speedup", None, unit="x faster")]
    for name, doc in docs.items():
        g = doc["figures"]
        if "tq_put_gib_s" in g:
            rows += [_pair(name, g, "put vs TransferQueue", "put_gib_s", "tq_put_gib_s", "TransferQueue"),
                     _pair(name, g, "get vs TransferQueue", "get_gib_s", "tq_get_gib_s", "TransferQueue")]
    return [r for r in rows if r is not None]


def other_rows(docs: Dict[str, Dict[str, Any]], shown: set) -> List[Row]:
    rows = []
    for name, doc in docs.items():
        if name in ("bench_stall",):
            continue
        for k, v in flatten(doc["figures"]):
            if (name, k) not in shown and not k.startswith("load_avg"):
                rows.append((name, k, _fmt(v), "", ""))
    return rows


def table(docs: Dict[str, Dict[str, Any]], notes: List[str]) -> str:
    lines = ["# Benchmark results", ""]
    for name, doc in docs.items():
        m = doc.get("machine", {})
        lines.append(f"- `{name}` ({' '.join(doc.get('args') or []) or 'full size'}): {doc.get('date_utc', '?')}, {m.get('cpus', '?')} "
                     f"CPUs ({m.get('cpu_model', '?')}), {m.get('mem_gib', '?')} GiB, load average "
                     f"{m.get('load_avg', 0):.1f} before / {m.get('load_avg_after', 0):.1f} after, record path "
                     f"{m.get('record_path', '?')}, {doc.get('seconds', '?')} s")
    busy = [n for n, d in docs.items() if d.get("machine", {}).get("load_avg", 0) > (d["machine"].get("cpus") or 1)]
    if busy:
        lines += ["", f"Measured under load (load average above the CPU count for {', '.join(busy)}): absolute "
                      "figures are low and noisy; the ratios to same-run baselines are what to compare."]
    lines += ["", "| bench | figure | value | same-run baseline | ratio |", "|---|---|---|---|---|"]
    head = headline_rows(docs)
    lines += [f"| {' | '.join(r)} |" for r in head]
    keys_used = {"save_gib_s", "raw_write_gib_s", "load_gib_s", "raw_read_gib_s", "reshard_load_gib_s", "save_stall_ms",
                 "v1_save_speedup", "v1_load_speedup", "incremental_ratio", "kv_batch_put", "engine_write",
                 "kv_batch_get", "engine_read", "stream_live_bps", "dump_stall_ms", "dump_gib_s", "v1_dump_speedup",
                 "dump_vs_full_save"}
    shown = {(n, k) for n in docs for k in keys_used}
    lines += [f"| {' | '.join(r)} |" for r in other_rows(docs, shown)]
    if notes:
        lines += [""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------ charts
def charts(docs: Dict[str, Dict[str, Any]], results: Path) -> List[str]:
    """Write the PNG charts; returns notes on what was left out."""
    notes: List[str] = []
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return ["no charts: matplotlib is not installed (pip install -e '.[bench]')"]

    def when(name: str) -> str:
        d = docs[name]
        return f"{d.get('date_utc', '')[:10]}, load avg {d.get('machine', {}).get('load_avg', 0):.1f}"

    f = docs.get("bench_checkpoint", {}).get("figures", {})
    if _num(f.get("save_gib_s")) and _num(f.get("load_gib_s")):
        labels, vals, colors = [], [], []
        for lab, v, c in (("tqstore save", f.get("save_gib_s"), "C0"), ("write+fsync loop", f.get("raw_write_gib_s"), "C7"),
                          ("V1 save", (_num(f.get("save_gib_s")) or 0) / (_num(f.get("v1_save_speedup")) or float("inf")),
                           "C3"),
                          ("tqstore load", f.get("load_gib_s"), "C0"), ("cold read loop", f.get("raw_read_gib_s"), "C7"),
                          ("V1 load", (_num(f.get("load_gib_s")) or 0) / (_num(f.get("v1_load_speedup")) or float("inf")),
                           "C3"),
                          ("reshard load", f.get("reshard_load_gib_s"), "C1")):
            n = _num(v)
            if n:
                labels.append(lab)
                vals.append(n)
                colors.append(c)
        fig, ax = plt.subplots(figsize=(8, 4))
        ax.bar(labels, vals, color=colors)
        for i, v in enumerate(vals):
            ax.text(i, v, f"{v:.2f}", ha="center", va="bottom", fontsize=8)
        ax.set_ylabel("GiB/s")
        ax.set_title(f"checkpoint save and load vs raw disk and V1 ({when('bench_checkpoint')})", fontsize=9)
        plt.setp(ax.get_xticklabels(), rotation=20, ha="right", fontsize=8)
        fig.tight_layout()
        fig.savefig(results / "save_load.png", dpi=110)
        plt.close(fig)
    else:
        notes.append("save_load.png left out: no bench_checkpoint figures")

    s = docs.get("bench_stall", {}).get("figures", {})
    if s.get("sizes"):
        x = [r["gib"] for r in s["sizes"]]
        fig, ax = plt.subplots(figsize=(7, 4))
        ax.plot(x, [r["stall_ms_median"] for r in s["sizes"]], "o-", label="blocking=False save: stall (median)")
        ax.plot(x, [r["stall_ms_max"] for r in s["sizes"]], "x--", label="stall (max of 5)")
        ax.plot(x, [r["copy_stall_ms"] for r in s["sizes"]], "s:", color="C3",
                label=f"a copying snapshot (memcpy {s.get('memcpy_gib_s', 0):.1f} GiB/s)")
        ax.set_xscale("log", base=2)
        ax.set_xticks(x)
        ax.set_xticklabels([f"{g:g}" for g in x])
        ax.set_yscale("log")
        ax.set_xlabel("buffer size (GiB)")
        ax.set_ylabel("trainer stall (ms)")
        ax.set_title(f"stall against buffer size ({when('bench_stall')})", fontsize=9)
        ax.legend(fontsize=8)
        ax.grid(True, which="both", alpha=0.3)
        fig.tight_layout()
        fig.savefig(results / "stall.png", dpi=110)
        plt.close(fig)
    else:
        notes.append("stall.png left out: no bench_stall figures")

    dump = s.get("dump") or []
    dm = docs.get("bench_dump", {}).get("figures", {})
    if dump:
        fig, ax = plt.subplots(figsize=(7, 4))
        ax.plot([r["fraction"] * 100 for r in dump], [r["dump_s"] * 1e3 for r in dump], "o-", label="dump_data_by_key")
        ax.axhline(dump[0]["full_save_s"] * 1e3, color="C3", ls="--", label="full save of the same store")
        ax.set_xlabel("keys selected (%)")
        ax.set_ylabel("time (ms)")
        ax.set_title(f"dump time against selected fraction ({when('bench_stall')})", fontsize=9)
        ax.legend(fontsize=8)
        ax.grid(True, alpha=0.3)
        fig.tight_layout()
        fig.savefig(results / "dump_fraction.png", dpi=110)
        plt.close(fig)
    else:
        notes.append("dump_fraction.png left out: no dump sweep (this build has no dump_data_by_key)"
                     + ("" if not dm else "; bench_dump's figures are in the table"))

    tq = [(n, d["figures"]) for n, d in docs.items() if "tq_put_gib_s" in d["figures"]]
    if tq:
        name, g = tq[0]
        fig, ax = plt.subplots(figsize=(6, 4))
        labels = ["put", "get"]
        ours = [_num(g.get("put_gib_s")) or 0, _num(g.get("get_gib_s")) or 0]
        theirs = [_num(g.get("tq_put_gib_s")) or 0, _num(g.get("tq_get_gib_s")) or 0]
        xs = range(len(labels))
        ax.bar([i - 0.2 for i in xs], ours, 0.4, label="tqstore")
        ax.bar([i + 0.2 for i in xs], theirs, 0.4, label="TransferQueue", color="C3")
        ax.set_xticks(list(xs))
        ax.set_xticklabels(labels)
        ax.set_ylabel("GiB/s")
        ax.set_title(f"put/get against TransferQueue ({when(name)})", fontsize=9)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(results / "tq_putget.png", dpi=110)
        plt.close(fig)
    else:
        notes.append("tq_putget.png left out: no bench measured TransferQueue")
    return notes


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", default=str(RESULTS), help="directory of the bench JSON files")
    args = ap.parse_args(argv)
    results = Path(args.results)
    docs = load(results)
    if not docs:
        print(f"no bench results in {results} (run `make bench`)")
        return 1
    notes = charts(docs, results)
    (results / "results.md").write_text(table(docs, notes))
    print(f"wrote {results / 'results.md'} ({len(docs)} benches)" + "".join(f"\n  {n}" for n in notes))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
