"""TransferQueue's tutorials 01 (core components), 02 (KV interface), 03 (metadata concepts),
04 (the controller's behaviour) and 05 (custom sampler), copied into tests/compat/tutorials/
with only their imports changed, run as scripts on tqstore; where a tutorial shows behaviour
by printing it rather than asserting it (04's sampling), the printed lines are checked.
(06 is not here: it runs a torch DataLoader with worker processes over the store, and reads
TransferQueue's controller actor by its internal name.)
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

TUTORIALS = [
    "t01_core_components.py",
    "t02_kv_interface.py",  # puts attention_mask as float32 for one key, int64 for four others
    "t03_metadata_concepts.py",
    "t04_understanding_controller.py",
    "t05_custom_sampler.py",
]

#: lines a tutorial prints that show the behaviour it teaches (in this order)
SHOWN = {
    "t01_core_components.py": ["Global indexes: [0, 1, 2, 3]", "Data matches original!"],
    "t04_understanding_controller.py": [
        "global_indexes=[0, 1]) from partition 'train'",  # partitions isolated
        "global_indexes=[2, 3, 4]) for newly put data",  # rows appended
        "field_names=['field1', 'field2', 'field3'], is_ready=True, partitions=['dynamic'], global_indexes=[0, 1])",
        "[Task A, Get 1] Requesting 3 samples...\n  ✓ Got samples: [0, 1, 2]",  # sequential, no duplicates
        "[Task A, Get 2] Requesting 3 more samples...\n  ✓ Got samples: [3, 4, 5]",
        "[Task B, Get 1] Requesting 2 samples...\n  ✓ Got samples: [0, 1]",  # another task: its own consumption
    ],
}


@pytest.mark.parametrize("script", TUTORIALS)
def test_tutorial_runs_with_only_the_import_changed(script, tmp_path, forkrun):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), env_path()]) if env_path() else str(HERE))
    proc = forkrun.run("path", str(HERE / "tutorials" / script), cwd=tmp_path, env=env, timeout=600)
    assert proc.returncode == 0, f"{script} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    at = 0
    for line in SHOWN.get(script, []):
        found = proc.stdout.find(line, at)
        assert found >= 0, f"{script} did not print (after what came before) {line!r}:\n{proc.stdout[-3000:]}"
        at = found + len(line)


def env_path() -> str:
    return os.environ.get("PYTHONPATH", "")
