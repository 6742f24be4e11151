"""A store reopened on a Ray cluster right after one of its nodes died (``ray.cluster_utils.
Cluster``: each node its own raylet on this machine).  Ray lists a lost node as alive until its
health checks fail, some seconds: the reopen placed parts there, they never started, and the
open failed after 8 s with "controller: its actor is unreachable (ActorDiedError ...)", as if the
store were damaged.  Now such a part is placed again on an alive node (the store opens, nothing
lost), or, with ``nodes`` naming the dead node, the error says what happened and what to do.
Skipped when ray is not installed."""
from __future__ import annotations

import pytest

ray = pytest.importorskip("ray")

import tqstore  # noqa: E402
from tqstore.ray import RayParts  # noqa: E402

from checkpoint_helpers import canon, fill  # noqa: E402
from ray_helpers import three_node_cluster  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster():
    yield from three_node_cluster()


def _alive():
    return [n["NodeID"] for n in ray.nodes() if n.get("Alive")]


def test_a_reopen_right_after_a_node_died_places_its_parts_on_alive_nodes(tmp_path, cluster):
    c, workers = cluster
    with tqstore.open(tmp_path / "s", num_units=4, parts=RayParts(), result_type="dict") as s:
        keys = fill(s, "train", 24)
        want = {f: canon(v) for f, v in s.kv_batch_get(keys, "train").items()}
    lost = workers[0].node_id
    c.remove_node(workers[0], allow_graceful=False)
    assert lost in _alive()  # (Ray has not noticed yet: the window this test is about)
    with pytest.raises(tqstore.DistributedError, match="named in ray.nodes") as e:
        tqstore.open(tmp_path / "s", parts=RayParts(nodes=[lost]), result_type="dict")
    assert lost in str(e.value) and "ray.nodes()" in str(e.value)
    with tqstore.open(tmp_path / "s", parts=RayParts(), result_type="dict") as s:
        placed = {ray.get(p._host.where.remote())[0] for p in [s.controller, *s.units]}
        assert lost not in placed
        assert {f: canon(v) for f, v in s.kv_batch_get(keys, "train").items()} == want
