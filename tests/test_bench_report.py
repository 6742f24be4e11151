"""bench/report.py turns the JSON files of bench/run_all.py into results.md (one table of
figures, same-run baselines and ratios) and the PNG charts (when matplotlib is installed)."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _report():
    spec = importlib.util.spec_from_file_location("bench_report", ROOT / "bench" / "report.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _write(d: Path, name: str, figures: dict, load: float = 9.0) -> None:
    doc = {"bench": name, "date_utc": "2026-12-01T12:00:00Z", "args": ["--quick"], "seconds": 1.0, "returncode": 0,
           "machine": {"cpus": 2, "cpu_model": "test", "mem_gib": 24, "load_avg": load, "load_avg_after": load,
                       "record_path": "native"}, "figures": figures}
    (d / f"{name}.json").write_text(json.dumps(doc))


def test_report_builds_the_table_and_the_charts(tmp_path):
    _write(tmp_path, "bench_checkpoint", {"save_gib_s": 1.4, "raw_write_gib_s": 0.35, "load_gib_s": 1.3,
                                          "raw_read_gib_s": 1.7, "v1_save_speedup": 9.2, "v1_load_speedup": 7.1,
                                          "save_stall_ms": 0.4, "rows": 111616})
    _write(tmp_path, "bench_stall", {"memcpy_gib_s": 5.0, "sizes": [
        {"gib": 0.25, "rows": 4096, "stall_ms_median": 0.2, "stall_ms_max": 0.5, "copy_stall_ms": 50.0},
        {"gib": 8, "rows": 131072, "stall_ms_median": 0.6, "stall_ms_max": 8.0, "copy_stall_ms": 1600.0}],
        "dump": [{"fraction": 0.1, "keys": 10, "dump_s": 0.1, "full_save_s": 1.0, "dump_vs_full_save": 0.1}]})
    _write(tmp_path, "bench_new", {"some_figure": 3.0, "nested": {"x": [1, 2, 3]}})
    assert _report().main(["--results", str(tmp_path)]) == 0
    md = (tmp_path / "results.md").read_text()
    assert "| bench_checkpoint | durable save (copy mode) | 1.4 GiB/s | write+fsync loop 0.35 GiB/s | 4.00x |" in md
    assert "| bench_stall | stall at 8 GiB (131,072 rows) | 0.6 ms | copying snapshot 1,600 ms | 2,667x shorter |" in md
    assert "| bench_new | some_figure | 3 |" in md and "| bench_new | nested.x | 2 |" in md  # unknown benches too
    assert "Measured under load" in md and "2026-12-01T12:00:00Z" in md
    if importlib.util.find_spec("matplotlib") is not None:
        for png in ("save_load.png", "stall.png", "dump_fraction.png"):
            assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert "tq_putget.png left out" in md


def test_report_without_results_says_so(tmp_path, capsys):
    assert _report().main(["--results", str(tmp_path)]) == 1
    assert "no bench results" in capsys.readouterr().out
