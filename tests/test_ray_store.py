"""A whole store over Ray actors (``Store(path, parts=RayParts())``): the data plane,
checkpoints and dumps run unchanged through the ports, each unit and the controller in an
actor of its own, and what they write is the embedded backend's format: checkpoints and
dumps move between the backends both ways.  Skipped when ray is not installed."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ray = pytest.importorskip("ray")

import tqstore  # noqa: E402
from tqstore.checkpoint import read_manifest, verify_checkpoint  # noqa: E402
from tqstore.errors import DistributedError  # noqa: E402
from tqstore.ray import ActorController, ActorUnit, RayParts  # noqa: E402

from checkpoint_helpers import canon, fill  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.ray, pytest.mark.slow]  # (an actor per part, each importing tqstore: minutes; make test-ray)


@pytest.fixture(scope="module", autouse=True)
def ray_cluster():
    ray.init(address="local", num_cpus=8, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


def _ray_store(path, **kw):
    return tqstore.open(path, parts=RayParts(), result_type="dict", **kw)


def _picture(s, pids=("train", "eval")):
    """What a user sees of ``pids``, through the public calls and the controller port only."""
    out = {"kv_list": s.kv_list(), "partitions": sorted(s.controller.partitions())}
    for pid in pids:
        keys = list(s.kv_list(pid).get(pid, {}))
        if not keys:
            continue
        got = s.kv_batch_get(keys, pid)
        rb = s.controller.first_rows(pid)
        out[pid] = ({f: canon(v) for f, v in sorted(got.items())}, rb.gidxs, rb.keys, rb.tags,
                    [sorted(f) for f in rb.fields], sorted(s.controller.partition_info(pid).schema.items()))
    return out


def _entries(ck):
    return sorted((e.path, e.size, e.crc32c) for e in read_manifest(ck).files)


def _fill_both(s):
    fill(s, "train", 30)
    fill(s, "eval", 7, prefix="e", seed=3)
    s.kv_clear(["k4", "k5"], "train")
    meta = s.get_meta(["input_ids", "text"], batch_size=6, partition_id="train", task_name="actor")
    s.get_data(meta)  # six rows consumed by "actor"


def _ended(host, within_s: float) -> bool:
    """True once a call of ``host`` raises RayActorError (the actor is gone), within ``within_s``."""
    import time

    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            ray.get(host.where.remote(), timeout=within_s)
        except ray.exceptions.RayActorError:
            return True
        time.sleep(0.1)
    return False


def test_a_store_over_ray_actors_is_the_embedded_store_and_each_part_runs_in_its_actor(tmp_path):
    with tqstore.open(tmp_path / "local", num_units=3, result_type="dict") as local:
        _fill_both(local)
        want = _picture(local)
    with _ray_store(tmp_path / "r", num_units=3) as s:
        assert all(isinstance(u, ActorUnit) for u in s.units) and isinstance(s.controller, ActorController)
        where = [ray.get(p._host.where.remote()) for p in [*s.units, s.controller]]
        assert len({pid for _node, pid in where}) == 4 and os.getpid() not in {pid for _n, pid in where}
        _fill_both(s)
        assert _picture(s) == want
        hosts = [p._host for p in [*s.units, s.controller]]
    for h in hosts:  # closing the store ended its actors (ray.kill is asynchronous: a call may still slip in first)
        assert _ended(h, within_s=60)
    with _ray_store(tmp_path / "r") as s:  # reopened: the same
        assert _picture(s) == want


def test_a_relative_store_path_is_the_callers_for_every_part_actor(tmp_path, monkeypatch):
    """The part actors run in the Ray worker's directory: a store opened by a relative path
    still has all its parts under the caller's directory."""
    (tmp_path / "job").mkdir()
    monkeypatch.chdir(tmp_path / "job")
    with _ray_store("run/s", num_units=2) as s:
        s.kv_batch_put(["a", "b"], "p", {"x": torch.ones(2, 3)})
        s.dump_data_by_key("run/d", ["a"], "p")
        s.kv_clear(["a"], "p")
        assert s.load_data_by_key("run/d")["keys"] == 1
    with tqstore.open(tmp_path / "job" / "run" / "s", result_type="dict") as s:  # the same store, in process
        assert s.kv_batch_get(["a", "b"], "p")["x"].tolist() == [[1.0] * 3] * 2 and s.verify() == []


def test_every_dtype_and_jagged_rows_reach_the_unit_actors_bit_identical(tmp_path):
    """Each unit actor gets its share of a put (uint16 and float8 tensors among them, which
    torch itself does not unpickle: the share travels as its rows' bytes alone)."""
    from tqstore.torch_adapter import TORCH_TO_CODE

    with _ray_store(tmp_path / "r", num_units=3) as s:
        keys = [f"k{i}" for i in range(6)]
        for dtype in sorted(TORCH_TO_CODE, key=str):
            t = torch.arange(6 * 4, dtype=torch.uint8).reshape(6, 4)
            t = t.view(dtype) if torch.empty((), dtype=dtype).element_size() == 1 else t.to(torch.int64).to(dtype)
            s.kv_batch_put(keys, "p", {f"x_{str(dtype).rpartition('.')[2]}": t})
            got = s.kv_batch_get(keys, "p", select_fields=[f"x_{str(dtype).rpartition('.')[2]}"])
            out = next(iter(got.values()))
            assert out.dtype == dtype and torch.equal(out.view(torch.uint8), t.view(torch.uint8)), dtype
        rows = [torch.arange(i + 1).to(torch.uint16) for i in range(6)]
        s.kv_batch_put(keys, "p", {"jagged": rows})
        back = s.kv_batch_get(keys, "p", select_fields=["jagged"])["jagged"]
        assert [r.tolist() for r in back.unbind()] == [r.tolist() for r in rows]


@pytest.mark.parametrize("load_units", [3, 2])
def test_checkpoints_are_one_format_on_both_backends(tmp_path, load_units):
    with _ray_store(tmp_path / "r", num_units=3) as s:
        _fill_both(s)
        want = _picture(s)
        s.save_checkpoint(tmp_path / "from-ray")  # each unit actor writes its own files
    assert verify_checkpoint(tmp_path / "from-ray").ok
    with tqstore.open(tmp_path / "local", num_units=load_units, result_type="dict") as local:
        info = local.load_checkpoint(tmp_path / "from-ray")
        assert info.mode == ("same" if load_units == 3 else "reshard")
        assert _picture(local) == want
        fill(local, "train", 3, start=100, seed=9)  # the embedded side changes it, saves it
        want2 = _picture(local)
        local.save_checkpoint(tmp_path / "from-local")
    with _ray_store(tmp_path / "r2", num_units=2) as s:
        fill(s, "other", 4)  # replaced by the load
        s.load_checkpoint(tmp_path / "from-local")
        assert _picture(s) == want2 and "other" not in s.controller.partitions()
    with _ray_store(tmp_path / "r2") as s:
        assert _picture(s) == want2


def test_dump_and_load_by_key_between_the_backends(tmp_path):
    with _ray_store(tmp_path / "r", num_units=3) as s:
        keys = fill(s, "train", 20)
        chosen = keys[3:11]
        report = s.dump_data_by_key(tmp_path / "dump", chosen, "train")
        assert report["keys"] == len(chosen)
        want = s.kv_batch_get(chosen, "train")
    with tqstore.open(tmp_path / "local", num_units=2, result_type="dict") as local:
        fill(local, "train", 2, start=500, seed=4)  # a bystander
        local.load_data_by_key(tmp_path / "dump")
        assert sorted(local.kv_list("train")["train"]) == sorted(chosen + ["k500", "k501"])
        got = local.kv_batch_get(chosen, "train")
        assert {f: canon(v) for f, v in got.items()} == {f: canon(v) for f, v in want.items()}
        local.dump_data_by_key(tmp_path / "dump2", ["k500"], "train")
    with _ray_store(tmp_path / "r") as s:  # and back into the store over actors
        s.load_data_by_key(tmp_path / "dump2")
        assert "k500" in s.kv_list("train")["train"] and len(s.kv_list("train")["train"]) == 21


def test_a_unit_actor_that_dies_raises_distributed_error_and_nothing_acknowledged_is_lost(tmp_path):
    # unit 1's actor dies in the middle of a save (its process exits at the export's first
    # mkdir): the save raises DistributedError with each part's outcome and publishes nothing;
    # later calls raise it too; the close closes the rest; a reopen has every acknowledged row
    s = _ray_store(tmp_path / "r", num_units=2)
    try:
        keys = fill(s, "train", 10)
        want = {f: canon(v) for f, v in s.kv_batch_get(keys, "train").items()}
        s.save_checkpoint(tmp_path / "ck")
        ck_before = _entries(tmp_path / "ck")
        fill(s, "train", 4, start=10, seed=2)
        want_keys = keys + [f"k{i}" for i in range(10, 14)]
        ray.get(s.units[1]._host.failpoint.remote("mkdir", "kill"))
        with pytest.raises(DistributedError) as e:
            s.save_checkpoint(tmp_path / "ck")
        assert e.value.outcomes["unit 0"] == e.value.outcomes["controller"] == "exported"
        assert e.value.outcomes["unit 1"].startswith("failed: DistributedError")
        assert verify_checkpoint(tmp_path / "ck").ok and _entries(tmp_path / "ck") == ck_before
        with pytest.raises(DistributedError) as e:
            s.kv_batch_get(keys, "train")
        assert "unit 1" in str(e.value) and set(e.value.outcomes) == {"unit 1"}
    finally:
        with pytest.raises(DistributedError):
            s.close()  # every other part closed, the store's lock released
    with _ray_store(tmp_path / "r") as s:  # reopened: every acknowledged row is there
        assert sorted(s.kv_list("train")["train"]) == sorted(want_keys)
        assert {f: canon(v) for f, v in s.kv_batch_get(keys, "train").items()} == want
        s.kv_batch_put(["new"], "train", {"input_ids": torch.zeros((1, 16), dtype=torch.int64)})
        assert "new" in s.kv_list("train")["train"]


def test_a_background_save_over_actors_holds_exactly_the_cut_while_writers_go_on(tmp_path):
    # save_checkpoint(blocking=False) returns after the cut; puts, overwrites and clears made
    # while the unit actors write their files never reach the checkpoint
    with _ray_store(tmp_path / "r", num_units=2) as s:
        keys = fill(s, "train", 16)
        want = _picture(s, ("train",))
        h = s.save_checkpoint(tmp_path / "ck", blocking=False)
        fill(s, "train", 4, start=100, seed=7)  # new rows
        fill(s, "train", 3, start=0, seed=8)  # k0..k2 overwritten
        s.kv_clear(keys[5:8], "train")
        h.result(timeout=300)
        after = _picture(s, ("train",))
    assert verify_checkpoint(tmp_path / "ck").ok
    with tqstore.open(tmp_path / "local", num_units=3, result_type="dict") as local:
        local.load_checkpoint(tmp_path / "ck")
        assert _picture(local, ("train",)) == want != after


def test_a_load_by_key_whose_unit_actor_dies_says_how_to_settle_it_and_settles_after_a_reopen(tmp_path):
    # unit 1's actor dies while it imports the dump's frames: the load raises DistributedError;
    # its cancel cannot reach unit 1 either, so the restore stays pending and the error's note
    # says to reopen the store and call recover_data_load (that call on the store as it was
    # would meet the same unreachable part); after a reopen nothing is pending once it was
    # called, and the load succeeds
    s = _ray_store(tmp_path / "r", num_units=2)
    try:
        keys = fill(s, "train", 8)
        want = {f: canon(v) for f, v in s.kv_batch_get(keys, "train").items()}
        s.dump_data_by_key(tmp_path / "d", keys, "train")
        ray.get(s.units[1]._host.failpoint.remote("write", "kill"))
        with pytest.raises(DistributedError) as e:
            s.load_data_by_key(tmp_path / "d")
        note = " ".join(getattr(e.value, "__notes__", []))
        assert "recover_data_load" in note and "close the store and open it again" in note, note
    finally:
        with pytest.raises(DistributedError):
            s.close()
    with _ray_store(tmp_path / "r") as s:
        s.recover_data_load(tmp_path / "d", cancel=True)  # (True, or False when the open settled a decided cancel)
        assert s.controller.restores() == []
        assert s.load_data_by_key(tmp_path / "d")["keys"] == len(keys)
        assert {f: canon(v) for f, v in s.kv_batch_get(keys, "train").items()} == want


def test_a_temporary_store_over_actors_left_open_is_removed_when_the_script_ends(tmp_path):
    # Ray registers ray.shutdown to run at exit after the store's exit hook was registered (at
    # tqstore's import), so Ray ended first: the close failed ("ActorHandle objects are not valid
    # across Ray sessions"), a WARNING was printed and the temporary directory stayed
    script = (f"import sys\nsys.path.insert(0, {str(ROOT)!r})\nimport numpy as np, tqstore\nimport ray\n"
              "from tqstore.ray import RayParts\n"
              f"ray.init(address={ray.get_runtime_context().gcs_address!r}, log_to_driver=False, "
              "configure_logging=False)\n"
              "s = tqstore.open(num_units=2, parts=RayParts())\n"
              "s.kv_batch_put(['a'], 'p', {'x': np.ones((1, 4))})\nprint(s.root, flush=True)\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "TMPDIR": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    root = Path(r.stdout.split()[-1])
    assert root.parent == tmp_path and not root.exists(), r.stderr
    assert "could not remove" not in r.stderr
