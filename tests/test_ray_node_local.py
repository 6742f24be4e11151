"""A store over Ray actors whose directory is node-local on one of its parts' nodes (a node
of a ``ray.cluster_utils.Cluster`` run in a mount namespace of its own, with a private tmpfs
over the store's parent: what a node-local disk of the same path looks like): the open says
so with ConfigError and leaves no actor (it opened an empty unit there: every save failed
with "No such file", and a reopen with the parts on other nodes showed an empty store).
Root only (a mount namespace); skipped when ray is not installed."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest

ray = pytest.importorskip("ray")

import tqstore  # noqa: E402
from tqstore.errors import ConfigError  # noqa: E402
from tqstore.ray import RayParts  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def test_a_store_directory_a_part_node_does_not_share_is_refused_at_open(tmp_path):
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare (a node with a private mount namespace)")
    from ray.cluster_utils import Cluster

    local = tmp_path / "nl"
    local.mkdir()
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    ray_bin = os.path.join(os.path.dirname(sys.executable), "ray")
    other = subprocess.Popen(
        ["unshare", "-m", "--propagation", "private", "sh", "-c",
         f"mount -t tmpfs tmpfs {local} && exec {ray_bin} start --address={c.address} --num-cpus=2 "
         f"--resources='{{\"nl\": 1}}' --block"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True)
    try:
        ray.init(address=c.address, log_to_driver=False, configure_logging=False)
        deadline = time.monotonic() + 60
        while len([n for n in ray.nodes() if n.get("Alive")]) < 2:
            if time.monotonic() > deadline or other.poll() is not None:
                pytest.skip("the node with its own mount namespace did not join")
            time.sleep(0.5)
        nl = [n["NodeID"] for n in ray.nodes() if n.get("Alive") and "nl" in n["Resources"]][0]
        head = ray.get_runtime_context().get_node_id()
        parts = RayParts(nodes=[head, nl])
        with pytest.raises(ConfigError, match="do not see .*STORE.json") as e:
            tqstore.open(local / "s", num_units=2, parts=parts)
        assert nl in str(e.value) and not parts._hosts  # (the actors it started are ended)
        with tqstore.open(local / "s", num_units=2, parts=RayParts(nodes=[head])) as s:  # shared: fine
            s.kv_batch_put(["a"], "p", {"x": [1.0]})
    finally:
        ray.shutdown()
        os.killpg(other.pid, 15)
        other.wait(30)
        c.shutdown()
