"""Every code block of README.md and docs/*.md: each fence names its language, and every
``python`` block runs (in a fresh process, in an empty temporary directory; forked from a
server that imported torch and tqstore: tests/forkrun.py).  Blocks that
must not run are marked by another language (``bash``, ``text``)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
FENCE = re.compile(r"^```(\S*)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)


def blocks(path: Path):
    """``(language, first line number, code)`` of every fenced block of ``path``."""
    text = path.read_text(encoding="utf-8")
    for m in FENCE.finditer(text):
        yield m.group(1), text.count("\n", 0, m.start()) + 1, m.group(2)


PYTHON = [(p, line, code) for p in DOCS for lang, line, code in blocks(p) if lang == "python"]


def test_every_fence_names_its_language():
    bare = [f"{p.relative_to(ROOT)}:{line}" for p in DOCS for lang, line, _ in blocks(p) if not lang]
    assert not bare, f"code blocks without a language (python runs as a test; bash/text do not): {bare}"
    assert len(PYTHON) >= 5


@pytest.mark.parametrize("path,line,code", PYTHON, ids=[f"{p.name}:{line}" for p, line, _ in PYTHON])
def test_python_block_runs(tmp_path, forkrun, path, line, code):
    r = forkrun.run("code", code, cwd=tmp_path, timeout=600, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode == 0, f"{path.name}:{line} failed:\n{r.stderr[-3000:]}"
