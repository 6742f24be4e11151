"""Sequence numbers (each row's insertion number in its partition; docs/FORMAT.md): a store has
room for tens of millions of partition drops and checkpoint loads, reopens whatever numbers
it gave out, and says so clearly should they ever run out."""
from __future__ import annotations

import textwrap

import pytest
import torch

import tqstore as tq
from tqstore import CapacityError
from tqstore._format.controller_records import SEQ_ALIGN


def _open(path):
    return tq.open(path, num_units=2)


def _put(s, n, pid="p", start=0, tags=False):
    return s.kv_batch_put([f"k{i}" for i in range(start, start + n)], pid, {"x": torch.arange(start, start + n).reshape(n, 1)},
                          tags=[{"i": i} for i in range(n)] if tags else None)


def _values(s, meta):
    return s.get_data(meta)["x"].reshape(-1).tolist()


def test_a_partition_dropped_every_step_leaves_room_for_tens_of_millions_of_steps(tmp_path):
    """A partition per step, dropped after it is consumed: each drop moved the sequence numbers
    of the partitions created after it one SEQ_ALIGN block up, and at SEQ_ALIGN ~1.2e15 a store
    ran out of them (a raw OverflowError at every later put) after 4,000 to 8,000 steps."""
    with _open(tmp_path / "s") as s:
        c = s.controller
        before = c.seq_high()
        for i in range(20):
            _put(s, 4, pid=f"step-{i}")
            s.clear_partition(f"step-{i}")
        per_drop = (c.seq_high() - before) / 20
        assert (2**63 - 1 - c.seq_high()) / per_drop > 10**7


def test_a_store_whose_sequence_numbers_ran_out_refuses_with_a_clear_error_and_writes_nothing(tmp_path):
    with _open(tmp_path / "s") as s:
        _put(s, 2, pid="p")
        with pytest.raises(CapacityError, match="sequence numbers"):
            s.controller.raise_seq_floor(2**63 - 10)
        s.controller.raise_seq_floor(2**63 - 2**63 % SEQ_ALIGN)  # the last whole block
        _put(s, 2, pid="p", start=2)  # p goes on in it
        assert _values(s, s.get_meta(["x"], 4, "p", task_name="t")) == [0, 1, 2, 3]
        s.clear_partition("p")  # the next partition would start past the limit
        with pytest.raises(CapacityError, match="sequence numbers"):
            _put(s, 2, pid="q")
        assert "q" not in s.kv_list()
    with _open(tmp_path / "s") as s:
        assert "q" not in s.kv_list()



@pytest.mark.parametrize("tags", [False, True])
def test_rows_numbered_past_2_to_the_62_reopen_after_a_kill(tmp_path, forkrun, tags):
    """A store's numbers start at a random point below 2**62 and grow with each drop: rows numbered
    past 2**62 were refused as damaged metadata by the open after a kill (untagged rows)."""
    code = textwrap.dedent(f"""
        import os, torch, tqstore as tq
        s = tq.open({str(tmp_path / "s")!r}, num_units=2)
        s.controller.raise_seq_floor(2**62 + 5)
        s.kv_batch_put(["k0", "k1", "k2", "k3"], "p", {{"x": torch.arange(4).reshape(4, 1)}},
                       tags=[{{"i": i}} for i in range(4)] if {tags} else None)
        os._exit(0)  # no close: the open decodes the index
    """)
    r = forkrun.run("code", code, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    with _open(tmp_path / "s") as s:
        assert _values(s, s.get_meta(["x"], 4, "p", task_name="t")) == [0, 1, 2, 3]
        _put(s, 2, start=4, tags=tags)
        assert _values(s, s.get_meta(["x"], 2, "p", task_name="t")) == [4, 5]
