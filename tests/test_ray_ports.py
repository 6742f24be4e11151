"""The port conformance suite (tqstore.testing.conformance) against units and controllers
hosted in a Ray actor (tqstore.ray.port_actor), reached from the test's process as the
Ray backend reaches them: every call an actor task, arguments and results through Ray's
serialisation, errors back as themselves.  Skipped when ray is not installed
(``make test-ray`` installs it).

One host actor serves a whole class (an actor's process start imports tqstore: seconds
on this machine); a reopen closes the port and opens the same path again in it.  Failures
are injected in the host's process (``PortHost.failpoint``)."""
from __future__ import annotations

import contextlib
import os
import signal

import numpy as np
import pytest

ray = pytest.importorskip("ray")

from tqstore._format.columns import to_column  # noqa: E402
from tqstore.errors import DistributedError, PartitionNotFoundError, TqstoreError  # noqa: E402
from tqstore.ray import ActorController, ActorUnit, start_host  # noqa: E402
from tqstore.testing.conformance import ControllerPortTests, UnitPortTests  # noqa: E402

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module", autouse=True)
def ray_cluster():
    ray.init(address="local", num_cpus=8, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


@contextlib.contextmanager
def _failing_in(host, point):
    ray.get(host.failpoint.remote(point, "eio"))
    try:
        yield
    finally:
        ray.get(host.failpoint.remote(point, None))


@pytest.fixture(scope="class")
def host(request):
    h = start_host()
    request.cls.host = h
    yield h
    ray.kill(h)


@pytest.mark.usefixtures("host")
class TestActorUnit(UnitPortTests):
    def make_unit(self, path, unit_id, num_units, *, compress=None):
        return ActorUnit(self.host, str(path), unit_id, compress=compress)

    def failing(self, point):
        return _failing_in(self.host, point)


@pytest.mark.usefixtures("host")
class TestActorController(ControllerPortTests):
    def make_controller(self, path, num_units):
        return ActorController(self.host, str(path), num_units)

    def failing(self, point):
        return _failing_in(self.host, point)


def test_a_host_runs_in_its_own_process_and_errors_come_back_as_themselves(tmp_path):
    h = start_host()
    try:
        node, pid = ray.get(h.where.remote())
        assert pid != os.getpid() and node == ray.get_runtime_context().get_node_id()
        c = ActorController(h, str(tmp_path / "c"), 2)
        with pytest.raises(PartitionNotFoundError) as e:
            c.resolve_keys("nope", ["k"])
        assert isinstance(e.value, ValueError) and "nope" in str(e.value)  # TransferQueue's catch too
        with pytest.raises(TypeError):
            c.partitions(bogus=1)  # bound against the port before anything is sent
        assert not hasattr(c, "env")  # only the port's surface
        c.close()
        c.close()  # idempotent
        assert ray.get(h.open_ports.remote()) == 0
    finally:
        ray.kill(h)


def test_a_unit_whose_host_died_raises_distributed_error_and_its_files_reopen_elsewhere(tmp_path):
    h = start_host()
    u = ActorUnit(h, str(tmp_path / "u"), 0)
    cols = [(to_column("x", np.arange(6, dtype=np.int64).reshape(3, 2), 3), [0, 1, 2], [0, 1, 2])]
    u.write(cols)
    _node, pid = ray.get(h.where.remote())
    os.kill(pid, signal.SIGKILL)  # the host's process dies as a node's would
    with pytest.raises(DistributedError) as e:
        u.keys()
    assert e.value.outcomes == {"unit 0": e.value.outcomes["unit 0"]} and "unreachable" in e.value.outcomes["unit 0"]
    assert isinstance(e.value, TqstoreError)
    h2 = start_host()
    try:
        u2 = ActorUnit(h2, str(tmp_path / "u"), 0)  # what the write committed is in the files
        assert sorted(g for g, _f in u2.keys()) == [0, 1, 2]
        u2.close()
    finally:
        ray.kill(h2)
