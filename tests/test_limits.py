"""Limits of the record format are enforced before anything is written."""
import pytest
import torch

import tqstore
from tqstore._format import columns
from tqstore.errors import CapacityError, InvalidInputError


def test_row_larger_than_a_frame_can_hold_is_rejected_before_writing(tmp_path, monkeypatch):
    monkeypatch.setattr(columns, "MAX_ROW_BYTES", 1024)
    with tqstore.open(tmp_path / "s") as s:
        s.kv_batch_put(["a"], "p", fields={"x": torch.zeros(1, 16)})
        before = s.kv_list()
        with pytest.raises(CapacityError, match="row size|limit"):
            s.kv_batch_put(["b", "c"], "p", fields={"x": torch.zeros(2, 512)})
        assert s.kv_list() == before


def test_field_name_with_nul_is_rejected(tmp_path):
    with tqstore.open(tmp_path / "s") as s:
        with pytest.raises(InvalidInputError, match="NUL"):
            s.kv_batch_put(["a"], "p", fields={"x\0y": torch.zeros(1, 2)})
        assert s.kv_list() == {}


def test_partition_and_task_names_with_nul_are_rejected_and_reopen_works(tmp_path):
    with tqstore.open(tmp_path / "s") as s:
        with pytest.raises(InvalidInputError, match="NUL"):
            s.kv_batch_put(["a"], "p\0q", fields={"x": torch.zeros(1, 2)})
        s.kv_batch_put(["a"], "p", fields={"x": torch.zeros(1, 2)})
        with pytest.raises(InvalidInputError, match="NUL"):
            s.get_meta(["x"], 1, "p", task_name="t\0u")
    with tqstore.open(tmp_path / "s") as s:
        assert s.get_partition_list() == ["p"]
        assert s.get_meta(["x"], 1, "p", task_name="t").size == 1
