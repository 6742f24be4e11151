"""What crosses a process boundary of a port, without Ray: the answers a caller gets are its
own to edit (tqstore.ray.port_actor.writable copies only the read-only arrays Ray hands out,
wherever they sit, and returns everything else as it is)."""
from __future__ import annotations

import dataclasses
from collections import namedtuple

import numpy as np
import pytest

from tqstore.ray.port_actor import writable


@dataclasses.dataclass
class _Head:
    a: object
    b: int = 1


_NT = namedtuple("_NT", "x y")


def _ro(n=3):
    a = np.arange(n)
    a.flags.writeable = False
    return a


def test_read_only_arrays_are_copied_wherever_they_sit_and_nothing_else_is():
    plain = [1, "s", b"b", None, _Head(2), {"k": 1}, (1, 2), np.arange(2)]
    assert writable(plain) is plain and all(x is y for x, y in zip(writable(plain), plain))
    ro = _ro()
    out = writable([_Head(ro), _NT(ro, 2), {"k": ro, "j": 1}, (ro,), ro, 7])
    arrays = [out[0].a, out[1].x, out[2]["k"], out[3][0], out[4]]
    assert all(a.flags.writeable and a is not ro and a.tolist() == [0, 1, 2] for a in arrays)
    assert type(out[1]) is _NT and out[1].y == 2 and out[2]["j"] == 1 and out[5] == 7
    assert not ro.flags.writeable  # the original is left as it was


@pytest.mark.parametrize("lost", ["ObjectLostError", "OwnerDiedError", "ObjectReconstructionFailedError",
                                  "RaySystemError"])
def test_an_answer_lost_with_its_node_is_a_distributed_error(monkeypatch, lost):
    """The answer of a part's call lost with its node (or Ray's system failing) leaves the
    outcome unknown, as an actor's death does: DistributedError naming the part, not Ray's
    own error."""
    ray = pytest.importorskip("ray")
    from tqstore.errors import DistributedError
    from tqstore.ray.port_actor import answer

    cls = getattr(ray.exceptions, lost)
    err = cls("boom") if lost == "RaySystemError" else cls("ab" * 14, None, "")

    def get(ref):
        raise err

    monkeypatch.setattr(ray, "get", get)
    with pytest.raises(DistributedError, match="unit 1: its actor is unreachable") as e:
        answer(object(), "unit 1")
    assert e.value.outcomes == {"unit 1": f"unreachable: {lost}"}
