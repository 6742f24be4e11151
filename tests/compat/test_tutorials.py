"""TransferQueue's tutorials 02 (KV interface), 03 (metadata concepts) and 05 (custom sampler), copied
into tests/compat/tutorials/ with only their imports changed, run as scripts on tqstore.
(01 and 06 start Ray workers; they wait for the Ray backend.)
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

TUTORIALS = [
    "t02_kv_interface.py",  # puts attention_mask as float32 for one key, int64 for four others
    "t03_metadata_concepts.py",
    "t05_custom_sampler.py",
]


@pytest.mark.parametrize("script", TUTORIALS)
def test_tutorial_runs_with_only_the_import_changed(script, tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), env_path()]) if env_path() else str(HERE))
    proc = subprocess.run([sys.executable, str(HERE / "tutorials" / script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{script} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


def env_path() -> str:
    return os.environ.get("PYTHONPATH", "")
