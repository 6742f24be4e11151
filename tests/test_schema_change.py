"""A field's dtype may change between puts (TransferQueue's behaviour; its tutorial 02 puts
attention_mask as float32 for one key and int64 for others), unless ``strict_schema=True``.

A get over rows of one dtype is unchanged (a dense tensor of that dtype); a get over rows of
several dtypes gives the field as a list of per-row tensors (arrays), each bit-identical in
its own dtype.  The partition's schema records the field as mixed, durably: across reopen,
checkpoints and loads onto another unit count.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import tqstore as tq
from tqstore import SchemaError
from tqstore._format import controller_records as R
from tqstore._format.dtypes import SCHEMA_MIXED
from tqstore._format.layout import KIND_TENSOR, KIND_VALUE
from tqstore._format.records import RecordError


def _mixed(s, pid="p"):
    s.kv_batch_put(["a"], pid, {"m": torch.tensor([[0.5, 1.5, 2.5]])})
    s.kv_batch_put(["b", "c"], pid, {"m": torch.tensor([[1, 2, 3], [2**40, -1, 0]])})


def _check_mixed_get(s, pid="p"):
    out = s.kv_batch_get(["a", "b", "c"], pid)["m"]
    rows = list(out)
    assert [r.dtype for r in rows] == [torch.float32, torch.int64, torch.int64]
    assert torch.equal(rows[0], torch.tensor([0.5, 1.5, 2.5]))
    assert torch.equal(rows[2], torch.tensor([2**40, -1, 0]))  # no promotion to float: bit-identical
    same = s.kv_batch_get(["b", "c"], pid)["m"]  # rows of one dtype: one dense tensor, as before
    assert isinstance(same, torch.Tensor) and same.dtype == torch.int64 and same.shape == (2, 3)


def test_a_dtype_change_is_accepted_and_a_mixed_get_gives_per_row_tensors(tmp_path):
    with tq.open(tmp_path / "s", num_units=2) as s:
        _mixed(s)
        _check_mixed_get(s)
        assert s.controller.partition_info("p").schema["m"] == (KIND_TENSOR, SCHEMA_MIXED)
        s.kv_batch_put(["d"], "p", {"m": torch.ones(1, 3, dtype=torch.bfloat16)})  # any dtype from then on
        assert s.kv_batch_get(["d"], "p")["m"].dtype == torch.bfloat16


def test_streaming_get_data_over_mixed_rows_and_the_schema_of_get_meta(tmp_path):
    with tq.open(tmp_path / "s", num_units=2) as s:
        first = s.put({"m": torch.zeros(2, 2)}, partition_id="p")
        s.put({"m": torch.ones(2, 2, dtype=torch.int32)}, partition_id="p")
        meta = s.get_meta(["m"], 4, "p", task_name="t")
        assert meta.field_schema["m"]["dtype"] is None  # the partition's rows hold several dtypes
        rows = list(s.get_data(meta)["m"])
        assert [r.dtype for r in rows] == [torch.float32] * 2 + [torch.int32] * 2
        assert isinstance(s.get_data(first)["m"], torch.Tensor)


def test_a_mixed_get_in_a_plain_dict_is_a_list(tmp_path):
    with tq.open(tmp_path / "s", result_type="dict") as s:
        s.kv_batch_put(["a"], "p", {"n": np.zeros((1, 2), np.float32)})
        s.kv_batch_put(["b"], "p", {"n": np.ones((1, 2), np.int16)})
        out = s.kv_batch_get(["a", "b"], "p")["n"]
        assert isinstance(out, list) and [r.dtype for r in out] == [np.float32, np.int16]


def test_strict_schema_rejects_a_dtype_change_before_anything_is_written(tmp_path):
    tq.init({"path": str(tmp_path / "s"), "strict_schema": True})
    try:
        tq.kv_batch_put(["a"], "p", {"m": torch.ones(1, 3)})
        before = tq.kv_list()
        with pytest.raises(SchemaError, match="strict_schema"):
            tq.kv_batch_put(["b", "c"], "p", {"m": torch.ones(2, 3, dtype=torch.int64)})
        assert tq.kv_list() == before
    finally:
        tq.close()
    with tq.open(tmp_path / "s", strict_schema=True) as s:
        assert s.controller.partition_info("p").schema["m"][1] != SCHEMA_MIXED


def test_a_kind_change_is_rejected_in_both_modes(tmp_path):
    with tq.open(tmp_path / "s") as s:
        s.kv_batch_put(["a"], "p", {"m": torch.ones(1, 3)})
        with pytest.raises(SchemaError):
            s.kv_batch_put(["b"], "p", {"m": ["text"]})
        with pytest.raises(SchemaError):
            s.kv_batch_put(["b"], "p", {"m": np.ones((1, 3), np.float32)})
        assert list(s.kv_list("p")["p"]) == ["a"]


def test_the_mixed_schema_survives_reopen_and_strict_mode_then_names_it(tmp_path):
    with tq.open(tmp_path / "s", num_units=2) as s:
        _mixed(s)
    with tq.open(tmp_path / "s") as s:
        _check_mixed_get(s)
        s.kv_batch_put(["d"], "p", {"m": torch.ones(1, 3, dtype=torch.float64)})
    with tq.open(tmp_path / "s", strict_schema=True) as s:
        with pytest.raises(SchemaError, match="several dtypes"):
            s.kv_batch_put(["e"], "p", {"m": torch.ones(1, 3)})


@pytest.mark.parametrize("units", [2, 3])
def test_a_mixed_field_round_trips_through_a_checkpoint_onto_any_unit_count(tmp_path, units):
    with tq.open(tmp_path / "s", num_units=2) as s:
        _mixed(s)
        s.save_checkpoint(tmp_path / "ckpt")
        assert tq.verify_checkpoint(tmp_path / "ckpt").ok
    with tq.open(tmp_path / "t", num_units=units) as t:
        t.load_checkpoint(tmp_path / "ckpt")
        _check_mixed_get(t)
        assert t.controller.partition_info("p").schema["m"] == (KIND_TENSOR, SCHEMA_MIXED)


def test_schema_records_old_and_mixed_decode_and_a_mixed_value_field_is_rejected():
    assert R.decode_schema(R.encode_schema(KIND_TENSOR, 9)) == (KIND_TENSOR, 9)  # as version 1 always wrote
    assert R.decode_schema(R.encode_schema(KIND_TENSOR, SCHEMA_MIXED)) == (KIND_TENSOR, SCHEMA_MIXED)
    with pytest.raises(RecordError):
        R.decode_schema(R.encode_schema(KIND_VALUE, SCHEMA_MIXED))
    with pytest.raises(RecordError):
        R.decode_schema(R.encode_schema(KIND_TENSOR, 254))
