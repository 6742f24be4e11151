"""A Ray cluster of three nodes on this machine for the multi-node tests
(``ray.cluster_utils.Cluster``: each node its own raylet, resources and local directory)."""
from __future__ import annotations

from typing import Iterator, List, Tuple


def three_node_cluster() -> Iterator[Tuple[object, List[object]]]:
    """A head and two worker nodes of 2 CPUs each, this process connected to them; yields
    ``(cluster, worker nodes)``, then disconnects and shuts the cluster down."""
    import ray
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    workers = [c.add_node(num_cpus=2) for _ in range(2)]
    ray.init(address=c.address, log_to_driver=False, configure_logging=False)
    c.wait_for_nodes()
    try:
        yield c, workers
    finally:
        ray.shutdown()
        c.shutdown()
