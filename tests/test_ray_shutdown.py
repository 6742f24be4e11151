"""A served store whose process's Ray was shut down under it (a user closing things in the
wrong order, a notebook's setup cell run again): calls raise DistributedError, not Ray's
plain ``Exception`` ("Failed to submit task to actor ..."), and the owner's close logs that
the host is gone instead of raising.  Skipped when ray is not installed."""
from __future__ import annotations

import pytest
import torch

ray = pytest.importorskip("ray")

import tqstore as tq  # noqa: E402
from tqstore.errors import DistributedError  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.slow]  # (a store host and its actors: 10-15 s)


def test_calls_after_ray_was_shut_down_raise_distributed_error_and_close_does_not(tmp_path):
    ray.init(address="local", num_cpus=8, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        tq.init({"backend": "ray", "path": str(tmp_path / "s"), "num_units": 2})
        tq.kv_batch_put(["a"], "p", {"x": torch.ones(1, 2)})
        ray.shutdown()
        ray.init(address="local", num_cpus=8, include_dashboard=False, log_to_driver=False, configure_logging=False)
        with pytest.raises(DistributedError, match="could not be sent|unreachable"):
            tq.kv_list()
        tq.close()  # (logged: the host is gone)
    finally:
        ray.shutdown()
    with tq.open(tmp_path / "s") as s:  # nothing acknowledged was lost
        assert list(s.kv_list("p")["p"]) == ["a"]


def test_init_after_ray_was_shut_down_under_a_served_store_opens_the_new_store_without_starting_ray(tmp_path):
    ray.init(address="local", num_cpus=8, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        tq.init({"backend": "ray", "path": str(tmp_path / "s"), "num_units": 2})
        tq.kv_batch_put(["a"], "p", {"x": torch.ones(1, 2)})
    finally:
        ray.shutdown()
    try:
        store = tq.init({"path": str(tmp_path / "local")})  # (the served store's handle is dropped: it is dead)
        assert type(store).__name__ == "Store" and not ray.is_initialized()
    finally:
        tq.close()
    assert not ray.is_initialized()
    with tq.open(tmp_path / "s") as s:  # nothing acknowledged was lost
        assert list(s.kv_list("p")["p"]) == ["a"]
