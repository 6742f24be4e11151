"""Field kinds: every tensor dtype (bf16 and float8 included), jagged rows, numpy arrays,
non-tensor values; they come back bit-identical, through the KV path and the streaming
path, and after a reopen.  Uniform rows come back as a tensor, jagged rows as a nested
tensor, numpy as numpy, non-tensor values as a list.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tqstore
from tqstore import SchemaError, UnsupportedTypeError
from tqstore.torch_adapter import TORCH_TO_CODE

ALL_TORCH_DTYPES = sorted(TORCH_TO_CODE, key=str)


@pytest.fixture
def store(tmp_path):
    with tqstore.open(tmp_path / "store", num_units=3) as s:
        yield s


def _random_bits(dtype: torch.dtype, shape) -> torch.Tensor:
    """A tensor of ``dtype`` with random bit patterns (NaN payloads, negative zeros, ...)."""
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, dtype=torch.uint8).bool()
    size = torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, tuple(shape[:-1]) + (shape[-1] * size,), dtype=torch.uint8)
    return raw.view(dtype)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def test_every_torch_dtype_the_format_knows_is_covered():
    for name in ("bfloat16", "float16", "float32", "float64", "int8", "int64", "uint8", "bool", "complex64",
                 "float8_e4m3fn", "float8_e5m2"):
        assert getattr(torch, name) in TORCH_TO_CODE


@pytest.mark.parametrize("dtype", ALL_TORCH_DTYPES, ids=str)
def test_tensor_of_every_dtype_round_trips_bit_identical(store, dtype):
    t = _random_bits(dtype, (5, 3, 4))
    keys = [f"k{i}" for i in range(5)]
    store.kv_batch_put(keys, "p", {"x": t})
    out = store.kv_batch_get(keys, "p")["x"]
    assert out.dtype == dtype and out.shape == t.shape and not out.is_nested
    assert torch.equal(_bits(out), _bits(t))


@pytest.mark.parametrize("dtype", ALL_TORCH_DTYPES, ids=str)
def test_a_units_share_of_a_put_pickles_as_its_own_rows_alone(dtype):
    """What a put sends to one unit of several (a unit actor's share) pickles as that share's
    bytes, not with the whole batch, and comes back whole for every dtype (torch does not
    unpickle uint16 or float8 tensors: none travels)."""
    import pickle

    from tqstore.torch_adapter import to_column

    t = _random_bits(dtype, (64, 512))
    share = to_column("x", t, 64).take(range(0, 64, 4))  # unit 0 of 4
    want = [bytes(memoryview(p)) for p in share.payloads]
    blob = pickle.dumps(share, protocol=5)
    assert len(blob) < sum(map(len, want)) * 1.25 + 4096, len(blob)  # (the batch is 4 times the share)
    back = pickle.loads(blob)
    assert [bytes(memoryview(p)) for p in back.payloads] == want and back.shapes == share.shapes
    jagged = to_column("j", [_random_bits(dtype, (i + 1, 64)) for i in range(8)], 8).take([0, 2])
    back = pickle.loads(pickle.dumps(jagged))
    assert [bytes(memoryview(p)) for p in back.payloads] == [bytes(memoryview(p)) for p in jagged.payloads]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn, torch.int64], ids=str)
def test_tensor_round_trips_bit_identical_through_put_and_get_data_and_after_reopen(tmp_path, dtype):
    path = tmp_path / "s"
    t = _random_bits(dtype, (6, 7))
    with tqstore.open(path, num_units=2) as s:
        meta = s.put({"x": t}, partition_id="p")
        assert meta.field_schema["x"]["dtype"] == dtype
        assert torch.equal(_bits(s.get_data(meta)["x"]), _bits(t))
    with tqstore.open(path) as s:
        meta = s.get_meta(["x"], 6, "p", task_name="train")
        assert torch.equal(_bits(s.get_data(meta)["x"]), _bits(t))


def test_non_contiguous_and_scalar_rows_round_trip(store):
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    store.kv_batch_put(list("abcdef"), "p", {"t": base.t(), "s": torch.arange(6, dtype=torch.int16),
                                              "e": torch.empty(6, 0)})
    out = store.kv_batch_get(list("abcdef"), "p")
    assert torch.equal(out["t"], base.t())
    assert torch.equal(out["s"], torch.arange(6, dtype=torch.int16))
    assert out["e"].shape == (6, 0)


def test_rows_of_one_shape_come_back_as_one_tensor(store):
    store.kv_batch_put(["a", "b"], "p", {"x": [torch.ones(3), torch.zeros(3)]})
    out = store.kv_batch_get(["a", "b"], "p")["x"]
    assert isinstance(out, torch.Tensor) and not out.is_nested and out.shape == (2, 3)


def test_jagged_list_of_tensors_comes_back_as_a_jagged_nested_tensor(store):
    rows = [torch.arange(n, dtype=torch.int64) for n in (3, 1, 5)]
    store.kv_batch_put(["a", "b", "c"], "p", {"tokens": rows})
    out = store.kv_batch_get(["a", "b", "c"], "p")["tokens"]
    assert out.is_nested and out.layout == torch.jagged
    assert [r.tolist() for r in out.unbind()] == [r.tolist() for r in rows]


def test_jagged_nested_tensor_input_round_trips_row_by_row(store):
    rows = [_random_bits(torch.bfloat16, (n, 4)) for n in (2, 7, 1)]
    nt = torch.nested.nested_tensor(rows, layout=torch.jagged)
    store.kv_batch_put(["a", "b", "c"], "p", {"h": nt})
    out = store.kv_batch_get(["c", "a"], "p")["h"]
    assert out.is_nested and out.dtype == torch.bfloat16
    got = out.unbind()
    assert torch.equal(_bits(got[0]), _bits(rows[2])) and torch.equal(_bits(got[1]), _bits(rows[0]))


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")  # strided nested: torch's warning
def test_rows_jagged_in_an_inner_dimension_round_trip(store):
    rows = [torch.rand(2, 3), torch.rand(2, 5)]
    store.kv_batch_put(["a", "b"], "p", {"m": rows})
    out = store.kv_batch_get(["a", "b"], "p")["m"]
    assert out.is_nested
    assert all(torch.equal(x, y) for x, y in zip(out.unbind(), rows))


def test_jagged_rows_survive_the_streaming_path_across_two_partitions(store):
    a = [torch.arange(n) for n in (1, 2)]
    b = [torch.arange(n) for n in (3,)]
    m1 = store.put({"t": a}, partition_id="p1")
    m2 = store.put({"t": b}, partition_id="p2")
    out = store.get_data(tqstore.BatchMeta.concat([m2, m1]))["t"]
    assert [r.tolist() for r in out.unbind()] == [[0, 1, 2], [0], [0, 1]]


@pytest.mark.parametrize("result_type", ["dict", "tensordict"])
def test_a_numpy_field_of_scalar_rows_read_across_two_partitions_is_one_array(tmp_path, result_type):
    """Rewards put as a 1-D numpy array came back from a meta of two partitions as a list of
    numpy scalars (a one-partition read: an array; 2-D rows and tensors joined fine)."""
    with tqstore.open(tmp_path / "s", num_units=2, result_type=result_type) as s:
        metas = [s.put({"reward": np.array([0.5, 1.0], np.float32) + k, "vec": np.full((2, 3), k, np.int16)},
                       partition_id=pid) for k, pid in enumerate(("A", "B"))]
        both = s.get_data(tqstore.BatchMeta.concat(metas))
        want = np.array([0.5, 1.0, 1.5, 2.0], np.float32)
        r = both["reward"]
        if result_type == "dict":
            assert isinstance(r, np.ndarray) and r.dtype == np.float32 and np.array_equal(r, want)
        else:
            assert isinstance(r, torch.Tensor) and r.dtype == torch.float32 and r.tolist() == want.tolist()
        assert tuple(both["vec"].shape) == (4, 3)


@pytest.mark.parametrize("dtype", ["bool", "uint8", "int32", "int64", "float16", "float32", "float64", "complex128",
                                   "uint64"])
def test_numpy_arrays_come_back_as_numpy_with_the_same_dtype_and_bits(tmp_path, dtype):
    rng = np.random.default_rng(1)
    a = rng.integers(0, 256, size=(4, 3 * np.dtype(dtype).itemsize), dtype=np.uint8).view(dtype)
    if dtype == "bool":
        a = rng.integers(0, 2, size=(4, 3)).astype(bool)
    with tqstore.open(tmp_path / "store", num_units=3, result_type="dict") as store:
        store.kv_batch_put(list("abcd"), "p", {"a": a})
        out = store.kv_batch_get(list("abcd"), "p")["a"]
        assert isinstance(out, np.ndarray) and out.dtype == a.dtype
        assert out.tobytes() == a.tobytes()
    with tqstore.open(tmp_path / "store") as store:  # a TensorDict holds it as a tensor over the same bits
        out = store.kv_batch_get(list("abcd"), "p")["a"]
        assert isinstance(out, torch.Tensor) and out.numpy().dtype == a.dtype and out.numpy().tobytes() == a.tobytes()


def test_jagged_numpy_rows_come_back_as_a_list_of_arrays(store):
    rows = [np.arange(2, dtype=np.int32), np.arange(5, dtype=np.int32)]
    store.kv_batch_put(["a", "b"], "p", {"a": rows})
    out = store.kv_batch_get(["a", "b"], "p")["a"]
    assert isinstance(out, list) and all(isinstance(r, np.ndarray) for r in out)
    assert [r.tolist() for r in out] == [r.tolist() for r in rows]


def test_non_tensor_values_come_back_as_a_list(store):
    values = ["text", 7, -2.5, True, None, [1, "two", [3.0]], {"a": {"b": [None, False]}}, float("inf"), ""]
    keys = [f"k{i}" for i in range(len(values))]
    store.kv_batch_put(keys, "p", {"v": values})
    assert store.kv_batch_get(keys, "p")["v"] == values


def test_nan_tuples_and_numpy_scalars_are_stored_as_plain_values(store):
    store.kv_batch_put(["a", "b", "c"], "p", {"v": [float("nan"), (1, 2), np.int64(5)],
                                              "s": np.array(["x", "yy", "zzz"])})
    out = store.kv_batch_get(["a", "b", "c"], "p")
    assert math.isnan(out["v"][0]) and out["v"][1:] == [[1, 2], 5] and type(out["v"][2]) is int
    assert out["s"] == ["x", "yy", "zzz"]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**62, 2**62) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.lists(json_values, min_size=1, max_size=4))
def test_any_json_safe_value_round_trips(store, values):
    keys = [f"h{i}" for i in range(len(values))]
    store.kv_batch_put(keys, "hyp", {"v": values})
    assert store.kv_batch_get(keys, "hyp")["v"] == values


def test_rows_may_hold_different_field_subsets(store):
    store.kv_batch_put(["a"], "p", {"prompt": torch.ones(1, 2)})
    store.kv_batch_put(["b"], "p", {"prompt": torch.zeros(1, 2), "reward": [1.0]})
    assert store.kv_batch_get(["a", "b"], "p").keys() == {"prompt"}
    assert store.kv_batch_get("b", "p", select_fields=["reward"])["reward"] == [1.0]
    meta = store.get_meta(["reward"], 1, "p", task_name="t")
    assert meta.keys == ["b"]


def test_a_field_keeps_its_kind_and_dtype_per_partition(store):
    store.strict_schema = True
    store.kv_batch_put(["a"], "p1", {"x": torch.ones(1, 1)})
    with pytest.raises(SchemaError):
        store.kv_batch_put(["b"], "p1", {"x": torch.ones(1, 1, dtype=torch.bfloat16)})
    store.kv_batch_put(["a"], "p2", {"x": torch.ones(1, 1, dtype=torch.bfloat16)})  # other partition: fine
    assert store.kv_batch_get("a", "p2")["x"].dtype == torch.bfloat16


def test_unsupported_types_are_rejected_with_an_unsupported_type_error(store):
    for bad in ({1, 2}, object(), 3.5, np.array([object()], dtype=object)):
        with pytest.raises(UnsupportedTypeError):
            store.kv_batch_put(["a"], "p", {"x": bad})
    assert issubclass(UnsupportedTypeError, TypeError)
    assert store.kv_list() == {}


def test_tensordict_batches_are_accepted_when_tensordict_is_installed(store):
    tensordict = pytest.importorskip("tensordict")
    td = tensordict.TensorDict({"x": torch.arange(6).reshape(2, 3)}, batch_size=[2])
    meta = store.kv_batch_put(["a", "b"], "p", td)
    assert meta.fields == ["x"]
    assert torch.equal(store.kv_batch_get(["a", "b"], "p")["x"], td["x"])
    meta = store.put(td, partition_id="s")
    assert torch.equal(store.get_data(meta)["x"], td["x"])


@pytest.mark.parametrize("width", [3, 64, 100])  # rows of 12, 256 and 400 bytes: copies below 256, views above
def test_a_contiguous_batchs_rows_read_like_a_list_of_its_rows(width):
    from tqstore._format.columns import to_column

    a = np.arange(10 * width, dtype=np.int32).reshape(10, width)
    col = to_column("x", a, 10)
    rows = [a[i].tobytes() for i in range(10)]
    got = col.payloads
    assert len(got) == 10 and [bytes(memoryview(r)) for r in got] == rows
    assert bytes(memoryview(got[-1])) == rows[-1] and bytes(memoryview(got[3])) == rows[3]
    assert [bytes(memoryview(r)) for r in got[1:9:3]] == rows[1:9:3]
    assert [bytes(memoryview(r)) for r in col.take([7, 2, 7]).payloads] == [rows[7], rows[2], rows[7]]
    with pytest.raises(IndexError):
        got[10]
    assert col.nbytes == a.nbytes
