"""A store over actors on a Ray cluster of three nodes (``ray.cluster_utils.Cluster``: each
node its own raylet and resources on this machine): RayParts spreads the parts over the
nodes, each part's actor runs where it was placed, and the store works across them (puts,
gets, a checkpoint written by the units on their nodes, a load onto another unit count, a
dump by key loaded onto parts on other nodes).
Skipped when ray is not installed."""
from __future__ import annotations

import pytest

ray = pytest.importorskip("ray")

import tqstore  # noqa: E402
from tqstore.checkpoint import verify_checkpoint  # noqa: E402
from tqstore.ray import RayParts  # noqa: E402

from checkpoint_helpers import canon, fill  # noqa: E402
from ray_helpers import three_node_cluster  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster():
    for c, _workers in three_node_cluster():
        yield c


def _nodes():
    return [n["NodeID"] for n in ray.nodes() if n.get("Alive")]


def test_parts_spread_over_the_nodes_and_the_store_works_across_them(tmp_path, cluster):
    nodes = _nodes()
    assert len(nodes) == 3
    with tqstore.open(tmp_path / "s", num_units=4, parts=RayParts(), result_type="dict") as s:
        placed = [ray.get(p._host.where.remote())[0] for p in [s.controller, *s.units]]
        assert placed == [nodes[i % 3] for i in range(5)]  # round robin, in Ray's order of the nodes
        keys = fill(s, "train", 24)
        want = {f: canon(v) for f, v in s.kv_batch_get(keys, "train").items()}
        s.save_checkpoint(tmp_path / "ck")
    assert verify_checkpoint(tmp_path / "ck").ok
    only = nodes[1:]
    with tqstore.open(tmp_path / "t", num_units=3, parts=RayParts(nodes=only), result_type="dict") as t:
        assert {ray.get(p._host.where.remote())[0] for p in [t.controller, *t.units]} <= set(only)
        assert t.load_checkpoint(tmp_path / "ck").mode == "reshard"
        assert {ray.get(p._host.where.remote())[0] for p in [t.controller, *t.units]} <= set(only)  # the new parts too
        assert {f: canon(v) for f, v in t.kv_batch_get(keys, "train").items()} == want


def test_a_dump_by_key_written_by_units_on_their_nodes_loads_onto_parts_elsewhere(tmp_path, cluster):
    """Each owning unit writes its shard of the dump from the node it runs on; the dump loads
    into a running store whose parts run on other nodes (another unit count), where its rows
    join the bystanders, and back into the first store as an overwrite of the same keys."""
    nodes = _nodes()
    with tqstore.open(tmp_path / "s", num_units=3, parts=RayParts(), result_type="dict") as s:
        keys = fill(s, "train", 18)
        chosen = keys[2:14:2]
        rep = s.dump_data_by_key(tmp_path / "dump", chosen, "train")
        assert rep["keys"] == len(chosen) and rep["shards"] == 3  # every unit owns some of them
        want = {f: canon(v) for f, v in s.kv_batch_get(chosen, "train").items()}
        index = tqstore.read_row_index(tmp_path / "dump")
        assert list(index["rows"]) == chosen
    with tqstore.open(tmp_path / "t", num_units=2, parts=RayParts(nodes=nodes[1:]), result_type="dict") as t:
        fill(t, "train", 3, start=100, seed=7)  # bystanders
        bystanders = {f: canon(v) for f, v in t.kv_batch_get(["k100", "k101", "k102"], "train").items()}
        got = t.load_data_by_key(tmp_path / "dump")
        assert got["keys"] == got["new_keys"] == len(chosen) and t.controller.restores() == []
        assert {f: canon(v) for f, v in t.kv_batch_get(chosen, "train").items()} == want
        assert {f: canon(v) for f, v in t.kv_batch_get(["k100", "k101", "k102"], "train").items()} == bystanders
        assert {ray.get(p._host.where.remote())[0] for p in [t.controller, *t.units]} <= set(nodes[1:])
    with tqstore.open(tmp_path / "s", parts=RayParts(), result_type="dict") as s:
        assert s.load_data_by_key(tmp_path / "dump")["existing_keys"] == len(chosen)
        assert {f: canon(v) for f, v in s.kv_batch_get(chosen, "train").items()} == want


def _attach_and_put(name, node_rows):
    """On another node: attach to the store by name, put rows, read them back; the node id."""
    import ray as r
    import torch

    import tqstore as tq

    tq.init({"backend": "ray", "ray": {"name": name}})
    try:
        keys = [f"w{i}" for i in range(node_rows)]
        tq.kv_batch_put(keys, "train", {"x": torch.arange(node_rows * 3, dtype=torch.float32).reshape(-1, 3)})
        back = tq.kv_batch_get(keys, "train", select_fields=["x"])["x"]
        return r.get_runtime_context().get_node_id(), back.tolist()
    finally:
        tq.close()


def test_a_store_started_by_init_on_one_node_is_attached_to_from_another(tmp_path, cluster):
    """``tq.init({"backend": "ray"})`` in the driver (the store's actor on the driver's node), the
    parts on two nodes; a task placed
    on the third node attaches by name and writes; the driver reads it and saves a
    checkpoint that verifies."""
    import sys

    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the task travels by value
    nodes = _nodes()
    store = tqstore.init({"backend": "ray", "path": str(tmp_path / "s"), "num_units": 2, "result_type": "dict",
                          "ray": {"name": "across", "nodes": nodes[1:]}})
    try:
        task = ray.remote(_attach_and_put).options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=nodes[2], soft=False))
        node, back = ray.get(task.remote("across", 5))
        assert node == nodes[2] and store.owner
        assert store.host_node == ray.get_runtime_context().get_node_id()  # the store's actor: on the owner's node
        assert back == [[float(3 * i + j) for j in range(3)] for i in range(5)]
        got = tqstore.kv_batch_get([f"w{i}" for i in range(5)], "train")
        assert got["x"].tolist() == back
        tqstore.save_checkpoint(tmp_path / "ck")
    finally:
        tqstore.close()
    assert verify_checkpoint(tmp_path / "ck").ok
