"""A call whose controller stops answering at its commit point (a store over Ray whose
controller actor dies: DistributedError) has an unknown outcome: the store must not undo the
units' side on a guess.  Whichever way the controller decided, the reopened store holds the
whole call or none of it (docs/GUARANTEES.md, invariants 1 and 8).  Here the controller is
the embedded one, made to raise DistributedError right after (or right before) its commit."""
from __future__ import annotations

import numpy as np
import pytest

import tqstore
from tqstore.errors import DistributedError


def _dead_after(obj, name, *, commit: bool, also=()):
    """``obj.name`` commits (or not) and then raises DistributedError, as a controller actor
    that died at that moment would; every method in ``also`` raises it too from then on."""
    dead = []

    def unreachable():
        return DistributedError("controller: its actor is unreachable (simulated)")

    def dying(real):
        def call(*args, **kwargs):
            if commit:
                real(*args, **kwargs)
            dead.append(True)
            raise unreachable()
        return call

    def gone_after(real):
        def call(*args, **kwargs):
            if dead:
                raise unreachable()
            return real(*args, **kwargs)
        return call

    setattr(obj, name, dying(getattr(obj, name)))
    for other in also:
        setattr(obj, other, gone_after(getattr(obj, other)))


def _values(s, keys):
    got = s.kv_batch_get(keys, "train")
    return {k: float(np.asarray(got["x"][i]).reshape(-1)[0]) for i, k in enumerate(keys)}


@pytest.mark.parametrize("committed", [True, False])
def test_an_overwriting_put_whose_controller_dies_at_its_commit_is_whole_or_absent_after_reopen(tmp_path,
                                                                                                committed):
    keys = [f"k{i}" for i in range(6)]
    with tqstore.open(tmp_path / "s", num_units=2) as s:
        s.kv_batch_put(keys, "train", {"x": np.zeros((6, 3), np.float32)}, tags=[{"v": 0}] * 6)
        _dead_after(s.controller, "commit_put", commit=committed)
        with pytest.raises(DistributedError):  # 6 rows overwritten, 2 new
            s.kv_batch_put(keys + ["k6", "k7"], "train", {"x": np.ones((8, 3), np.float32)}, tags=[{"v": 1}] * 8)
        del s.controller.commit_put
    with tqstore.open(tmp_path / "s") as s:
        listed = s.kv_list("train")["train"]
        if committed:
            assert sorted(listed) == keys + ["k6", "k7"] and all(t == {"v": 1} for t in listed.values())
            assert set(_values(s, keys + ["k6", "k7"]).values()) == {1.0}  # (the old values came back)
        else:
            assert sorted(listed) == keys and all(t == {"v": 0} for t in listed.values())
            assert set(_values(s, keys).values()) == {0.0}


@pytest.mark.parametrize("committed", [True, False])
def test_a_load_by_key_whose_controller_dies_at_its_finish_is_whole_or_absent_after_reopen(tmp_path, committed):
    """The load's finish committed (or not) and the controller stopped answering: the units
    keep what they published (they unpublished it on a guess: the committed restore's new keys
    then held no data and its existing keys their old values, and nothing could recover it)."""
    with tqstore.open(tmp_path / "src", num_units=3) as src:
        src.kv_batch_put(["a", "b", "c", "d"], "train", {"x": np.ones((4, 3), np.float32)}, tags=[{"v": 1}] * 4)
        src.dump_data_by_key(tmp_path / "dump", ["a", "b", "c", "d"], "train")
    with tqstore.open(tmp_path / "s", num_units=2) as s:
        s.kv_batch_put(["a", "b"], "train", {"x": np.zeros((2, 3), np.float32)}, tags=[{"v": 0}] * 2)
        _dead_after(s.controller, "finish_restore", commit=committed, also=("restore",))
        with pytest.raises(DistributedError):
            s.load_data_by_key(tmp_path / "dump")
        del s.controller.finish_restore, s.controller.restore
    with tqstore.open(tmp_path / "s") as s:
        s.recover_data_load(tmp_path / "dump", cancel=True)  # (a restore left pending: cancelled)
        listed = s.kv_list("train")["train"]
        if committed:
            assert sorted(listed) == ["a", "b", "c", "d"]
            assert _values(s, ["a", "b", "c", "d"]) == dict.fromkeys("abcd", 1.0)
        else:
            assert sorted(listed) == ["a", "b"] and _values(s, ["a", "b"]) == dict.fromkeys("ab", 0.0)
        assert s.verify() == []
