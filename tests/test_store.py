"""Store: controller plus N units in one directory, on real LMDB and files.

Runs with the C record path and with the pure-Python one (``record_path`` fixture).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import tqstore
from tqstore import Store
from tqstore.torch_adapter import TORCH_TO_CODE
from tqstore._format.layout import CODEC_RAW, CODEC_ZSTD
from tqstore._io import failpoints as fp
from tqstore.errors import (
    ConfigError, CorruptionError, FieldNotFoundError, InvalidInputError, KeyNotFoundError, PartitionNotFoundError, SchemaError,
    StorageIOError, UnsupportedTypeError,
)

pytestmark = pytest.mark.usefixtures("record_path")

ROOT = Path(__file__).resolve().parents[1]


def bits(t: torch.Tensor) -> bytes:
    """The exact bytes of a tensor (NaN payloads and signed zeros included)."""
    t = t.detach().contiguous()
    if t.numel() == 0:
        return b""
    return t.reshape(-1).view(torch.uint8).numpy().tobytes()


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        if not isinstance(b, torch.Tensor) or a.dtype != b.dtype:
            return False
        if a.is_nested or b.is_nested:
            a_rows = list(a.unbind()) if a.is_nested else list(a)
            b_rows = list(b.unbind()) if b.is_nested else list(b)
            return len(a_rows) == len(b_rows) and all(same(x, y) for x, y in zip(a_rows, b_rows))
        return a.shape == b.shape and bits(a) == bits(b)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    if isinstance(a, list) and a and isinstance(a[0], (torch.Tensor, np.ndarray)):
        return isinstance(b, list) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def random_tensor(dtype: torch.dtype, shape, seed=0) -> torch.Tensor:
    """Random bit patterns of ``dtype`` (bf16 and float8 included; bool as 0/1)."""
    g = torch.Generator().manual_seed(seed)
    n = int(np.prod(shape)) if shape else 1
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    size = torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, (n * size,), dtype=torch.uint8, generator=g)
    return raw.view(dtype).reshape(shape)


def store_state(s: Store):
    """What a store holds: controller rows and every unit's index entries and segment sizes."""
    rows = {g: (r.pid, r.key, repr(r.tag), sorted(r.fields)) for g, r in s.controller.rows.items()}
    units = [(sorted(u.keys()), {k: (i.size, i.live) for k, i in u.segments().items()}) for u in s.units]
    return rows, units, {p: dict(v.schema) for p, v in s.controller.parts.items()}, s.controller.next_gidx


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "s", num_units=3)
    yield s
    s.close()


ALL_TORCH = sorted(TORCH_TO_CODE, key=str)


# ---------------------------------------------------------------------------- round trips

@pytest.mark.parametrize("dtype", ALL_TORCH, ids=str)
def test_tensor_round_trip_bit_identical_for_every_dtype(store, dtype):
    small = random_tensor(dtype, (5, 3, 4), 1)
    large = random_tensor(dtype, (5, 70_000), 2)  # over the bulk-framing bound
    g = store.write("p", {"small": small, "large": large}, new_rows=True)
    out = store.read("p", g)
    assert same(out["small"], small) and same(out["large"], large)
    sub = store.read("p", [g[3], g[1]], select_fields=["small"])
    assert same(sub["small"], small[[3, 1]])


@pytest.mark.parametrize("dtype", ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "float32",
                                   "float64", "complex64", "complex128", "uint16", "uint32", "uint64"])
def test_numpy_round_trip_keeps_numpy_type_and_dtype(store, dtype):
    a = np.random.default_rng(0).integers(0, 2, (4, 6)).astype(dtype) if dtype == "bool" else \
        np.frombuffer(np.random.default_rng(0).bytes(4 * 6 * np.dtype(dtype).itemsize), dtype=dtype).reshape(4, 6)
    g = store.write("p", {"a": a}, new_rows=True)
    out = store.read("p", g)["a"]
    assert same(out, a)


def test_scalars_per_row_and_empty_rows_round_trip(store):
    reward = torch.tensor([0.5, -1.0, float("nan"), 2.0])
    empty = torch.empty(4, 0, dtype=torch.int64)
    g = store.write("p", {"reward": reward, "empty": empty}, new_rows=True)
    out = store.read("p", g)
    assert same(out["reward"], reward) and same(out["empty"], empty)


def test_non_tensor_values_round_trip_as_lists(store):
    vals = ["text é ✓", 3, -2.5, float("inf"), True, None, [1, [2, "x"]], {"a": {"b": [None, 1.5]}}]
    g = store.write("p", {"v": vals}, new_rows=True)
    out = store.read("p", g)["v"]
    assert out == vals and isinstance(out, list)
    assert store.read("p", [g[6]])["v"] == [[1, [2, "x"]]]


def test_jagged_rows_round_trip_as_nested_tensor(store):
    rows = [torch.arange(n, dtype=torch.int32) * 7 for n in (3, 1, 0, 40_000, 5)]
    g = store.write("p", {"ids": rows}, new_rows=True)
    out = store.read("p", g)["ids"]
    assert out.is_nested
    assert [bits(r) for r in out.unbind()] == [bits(r) for r in rows]
    nested = torch.nested.nested_tensor([torch.randn(n, 2) for n in (2, 5, 1)], layout=torch.jagged)
    g2 = store.write("q", {"x": nested}, new_rows=True)
    back = store.read("q", g2)["x"]
    assert [bits(r) for r in back.unbind()] == [bits(r) for r in nested.unbind()]


def test_jagged_numpy_rows_round_trip(store):
    rows = [np.arange(n, dtype=np.float64) for n in (1, 4, 2)]
    g = store.write("p", {"a": rows}, new_rows=True)
    out = store.read("p", g)["a"]
    assert len(out) == 3 and all(same(x, y) for x, y in zip(out, rows))


def test_rows_of_equal_shape_read_from_jagged_field_stack(store):
    rows = [torch.ones(3), torch.zeros(3)]
    g = store.write("p", {"a": rows}, new_rows=True)
    out = store.read("p", g)["a"]
    assert not out.is_nested and out.shape == (2, 3)


def test_returned_tensors_are_writable_and_independent_of_the_store(store):
    x = torch.arange(12.0).reshape(3, 4)
    g = store.write("p", {"x": x, "big": torch.zeros(3, 20_000)}, new_rows=True)
    out = store.read("p", g)
    out["x"] += 1
    out["big"] += 1
    again = store.read("p", g)
    assert same(again["x"], x) and float(again["big"].sum()) == 0.0


# ---------------------------------------------------------------------------- routing

@pytest.mark.parametrize("num_units", [1, 3, 4])
def test_row_i_lives_on_unit_i_mod_n(tmp_path, num_units):
    with Store(tmp_path / "s", num_units=num_units) as s:
        x = torch.arange(40).reshape(20, 2)
        g = s.write("p", {"x": x, "v": list(range(20))}, new_rows=True)
        assert g == list(range(20))
        for u in s.units:
            held = {gi for gi, _ in u.keys()}
            assert held == {gi for gi in g if gi % num_units == u.unit_id}
        out = s.read("p", g)
        assert same(out["x"], x) and out["v"] == list(range(20))


def test_a_relative_path_names_the_same_store_after_the_process_changes_directory(tmp_path, monkeypatch):
    """A store opened by a relative path keeps writing into that directory after a chdir (new
    segment files, checkpoints of it); its ``root`` is absolute."""
    (tmp_path / "job").mkdir()
    monkeypatch.chdir(tmp_path / "job")
    x = torch.arange(64 * 4096, dtype=torch.uint8).reshape(64, 4096)
    with tqstore.open("run/s", num_units=2, segment_bytes=65536) as s:
        assert s.root == tmp_path / "job" / "run" / "s"
        s.kv_batch_put([f"a{i}" for i in range(64)], "p", {"x": x})
        monkeypatch.chdir(tmp_path)
        s.kv_batch_put([f"b{i}" for i in range(64)], "p", {"x": x})  # into new segment files
        s.save_checkpoint(tmp_path / "ck")
        assert s.verify() == []
    assert not (tmp_path / "run").exists()
    with tqstore.open(tmp_path / "job" / "run" / "s") as s:
        assert torch.equal(s.kv_batch_get([f"b{i}" for i in range(64)], "p")["x"], x)
        assert s.verify() == []


@pytest.mark.parametrize("index", ["controller", "unit-001/index"])
def test_a_truncated_lmdb_index_is_a_corruption_error_not_a_dead_process(tmp_path, index):
    """LMDB maps its file and follows the page numbers of its meta page: a truncated index
    would end the process with SIGBUS at open.  The open (and inspect, ls, verify) raises
    CorruptionError naming the file instead (run in a child: a regression kills only it)."""
    from tqstore.testing import run_forked

    with tqstore.open(tmp_path / "s", num_units=2) as s:
        s.kv_batch_put([f"k{i}" for i in range(300)], "p", {"x": torch.arange(300 * 8).reshape(300, 8)},
                       tags=[{"i": i} for i in range(300)])
        data = s.state_dir / index / "data.mdb"
    os.truncate(data, 8192)  # its two meta pages stay

    def opening():
        try:
            tqstore.open(tmp_path / "s").close()
        except tqstore.CorruptionError as e:
            return str(e)
        return None

    res = run_forked(opening)
    assert res.exitcode == 0 and res.value and "truncated" in res.value and str(data) in res.value, res


def test_num_units_of_existing_store_must_match(tmp_path):
    Store(tmp_path / "s", num_units=3).close()
    with pytest.raises(ConfigError, match="3 units"):
        Store(tmp_path / "s", num_units=4)
    with Store(tmp_path / "s") as s:
        assert s.num_units == 3


# ---------------------------------------------------------------------------- reopen

def write_mixed(s: Store):
    data = {}
    g1 = s.write("train", {"ids": random_tensor(torch.int64, (10, 300), 1),
                           "lp": random_tensor(torch.bfloat16, (10, 300), 2),
                           "big": random_tensor(torch.float32, (10, 20_000), 3),
                           "text": [f"row {i}" for i in range(10)]}, keys=[f"k{i}" for i in range(10)],
                 tags=[{"step": i} for i in range(10)])
    data["train"] = (g1, s.read("train", g1))
    g2 = s.write("eval", {"jag": [torch.ones(i + 1) for i in range(7)]}, new_rows=True)
    data["eval"] = (g2, s.read("eval", g2))
    s.delete_rows("train", g1[:2])
    data["train"] = (g1[2:], {f: (v[2:] if not isinstance(v, list) else v[2:]) for f, v in data["train"][1].items()})
    return data


def check_data(s: Store, data):
    for pid, (g, fields) in data.items():
        out = s.read(pid, g)
        assert set(out) == set(fields)
        for f, v in fields.items():
            assert same(out[f], v), (pid, f)


def test_reopen_after_clean_close_returns_everything_bit_identical(tmp_path):
    with Store(tmp_path / "s", num_units=4, segment_bytes=1 << 16) as s:
        data = write_mixed(s)
        state = store_state(s)
    with Store(tmp_path / "s") as s:
        assert store_state(s) == state
        check_data(s, data)
        assert s.verify() == []
        assert s.controller.rows[data["train"][0][0]].tag == {"step": 2}
        # the allocator continues: fresh rows never reuse a live index
        g = s.write("train", {"text": ["new"]}, keys=["new"])
        assert g[0] not in data["train"][0] and g[0] not in data["eval"][0]


def test_durability_commit_fsyncs_each_write_and_round_trips(tmp_path):
    with Store(tmp_path / "c", num_units=2, durability="commit") as s:
        fp.start_counting()
        try:
            g = s.write("p", {"x": torch.arange(6).reshape(3, 2)}, new_rows=True)
        finally:
            counts = fp.stop_counting()
        assert counts.get("fsync_file", 0) >= 2  # every unit touched fsyncs its segment
    with Store(tmp_path / "c", durability="commit") as s:
        assert same(s.read("p", g)["x"], torch.arange(6).reshape(3, 2))
    with Store(tmp_path / "k", num_units=2) as s:  # the default does not fsync on a put
        fp.start_counting()
        try:
            s.write("p", {"x": torch.arange(6).reshape(3, 2)}, new_rows=True)
        finally:
            counts = fp.stop_counting()
        assert counts.get("fsync_file", 0) == 0


def codecs(s: Store, pid: str, field: str):
    p = s.controller.partition(pid)
    out = set()
    for g in p.rows:
        u = s.units[g % s.num_units]
        (loc,) = u.locate([g], field)
        out.add(u.read_frame(loc).codec)
    return out


def test_store_wide_zstd_round_trips_and_marks_frames(tmp_path):
    tok = torch.randint(0, 100, (16, 5000))
    vals = [{"t": "x" * 100}] * 16
    with Store(tmp_path / "s", num_units=2, compress="zstd") as s:
        g = s.write("p", {"tok": tok, "v": vals}, new_rows=True)
        assert codecs(s, "p", "tok") == {CODEC_ZSTD} and codecs(s, "p", "v") == {CODEC_ZSTD}
        stored = sum(i.size for u in s.units for i in u.segments().values())
        assert stored < tok.nbytes / 3
        out = s.read("p", g)
        assert same(out["tok"], tok) and out["v"] == vals
    with Store(tmp_path / "s", compress="zstd") as s:
        assert same(s.read("p", g)["tok"], tok)


def test_per_field_compression_compresses_only_named_fields(tmp_path):
    tok = torch.randint(0, 100, (8, 5000))
    lp = torch.randn(8, 5000)
    with Store(tmp_path / "s", num_units=3, compress=["tok"]) as s:
        g = s.write("p", {"tok": tok, "lp": lp}, new_rows=True)
        assert codecs(s, "p", "tok") == {CODEC_ZSTD}
        assert codecs(s, "p", "lp") == {CODEC_RAW}
        out = s.read("p", g)
        assert same(out["tok"], tok) and same(out["lp"], lp)
    with Store(tmp_path / "s") as s:  # compressed frames read without the setting
        out = s.read("p", g)
        assert same(out["tok"], tok) and same(out["lp"], lp)


# ---------------------------------------------------------------------------- bad input

def _strict(s: Store) -> Store:
    s.strict_schema = True
    return s


def _bad_calls():
    x = torch.zeros(4, 2)
    return [
        ("dtype clash", lambda s: _strict(s).write("p", {"x": torch.zeros(4, 2, dtype=torch.int32)}, new_rows=True),
         SchemaError),
        ("kind clash", lambda s: s.write("p", {"x": np.zeros((4, 2), np.float32)}, new_rows=True), SchemaError),
        ("wrong rows", lambda s: s.write("p", {"x": x, "y": torch.zeros(3)}, keys=list("abcd")), InvalidInputError),
        ("fewer keys", lambda s: s.write("p", {"x": x}, keys=["a", "b"]), InvalidInputError),
        ("duplicate keys", lambda s: s.write("p", {"x": x}, keys=["a", "a", "b", "c"]), InvalidInputError),
        ("unsupported value", lambda s: s.write("p", {"v": [object()] * 4, "x": x}, new_rows=True),
         UnsupportedTypeError),
        ("dict key not str", lambda s: s.write("p", {"v": [{1: 2}] * 4}, new_rows=True), UnsupportedTypeError),
        ("unknown gidx", lambda s: s.write("p", {"x": x}, gidxs=[0, 1, 2, 999]), KeyNotFoundError),
        ("unknown partition gidx", lambda s: s.write("zz", {"x": x}, gidxs=[0, 1, 2, 3]), PartitionNotFoundError),
        ("fields not a mapping", lambda s: s.write("p", [("x", x)], new_rows=True), InvalidInputError),
        ("mixed jagged dtypes", lambda s: s.write("p", {"j": [torch.zeros(2), torch.zeros(2, dtype=torch.int8),
                                                               torch.zeros(1), torch.zeros(1)]}, new_rows=True),
         InvalidInputError),
        ("bad tags", lambda s: s.write("p", {"x": x}, new_rows=True, tags=[1, 2]), InvalidInputError),
        ("bad tag type", lambda s: s.write("p", {"x": x}, new_rows=True, tags=[set()] * 4), UnsupportedTypeError),
        ("empty partition id", lambda s: s.write("", {"x": x}, new_rows=True), InvalidInputError),
    ]


@pytest.mark.parametrize("case", range(len(_bad_calls())), ids=[c[0] for c in _bad_calls()])
def test_bad_input_raises_before_any_write_and_changes_nothing(store, case):
    name, call, exc = _bad_calls()[case]
    store.write("p", {"x": torch.ones(4, 2)}, keys=["a", "b", "c", "d"])
    before = store_state(store)
    fp.start_counting()
    try:
        with pytest.raises(exc):
            call(store)
    finally:
        counts = fp.stop_counting()
    assert counts.get("write", 0) == 0 and counts.get("unit_commit", 0) == 0, name
    assert counts.get("controller_commit", 0) == 0, name
    assert store_state(store) == before
    assert same(store.read("p", [0, 1, 2, 3])["x"], torch.ones(4, 2))


def test_read_errors_name_what_is_missing(store):
    g = store.write("p", {"x": torch.ones(2, 2)}, new_rows=True)
    store.write("p", {"y": torch.ones(1)}, gidxs=[g[0]])
    with pytest.raises(PartitionNotFoundError):
        store.read("nope", g)
    with pytest.raises(KeyNotFoundError):
        store.read("p", [12345])
    with pytest.raises(FieldNotFoundError, match="'y'"):
        store.read("p", g, select_fields=["y"])
    assert set(store.read("p", g)) == {"x"}  # only fields every row has
    assert isinstance(FieldNotFoundError("x"), KeyError)


@pytest.mark.parametrize("kw", [
    {"num_units": 2 ** 62}, {"num_units": True}, {"num_units": "2"}, {"segment_bytes": "1M"},
    {"segment_bytes": 2 ** 70}, {"index_map_bytes": "1G"}, {"index_map_bytes": 1}, {"index_map_bytes": 2 ** 70},
    {"max_workers": -1}, {"max_workers": "2"}, {"max_workers": 0},
    {"edge": 5}, {"edge": "numpy"},  # (an edge was taken as it was: the first put failed with an AttributeError)
])
def test_an_option_out_of_range_is_a_config_error_before_anything_is_created(tmp_path, kw):
    with pytest.raises(ConfigError, match=next(iter(kw))):
        Store(tmp_path / "s", **kw)
    assert not (tmp_path / "s").exists()


def test_an_edge_with_the_methods_a_store_calls_is_taken(tmp_path):
    """The open's check must not refuse an edge written before the Ray client's to_wire and
    from_wire existed (a store never calls them on the edge it is given)."""
    from tqstore.edge import EDGE_ATTRIBUTES, EDGE_METHODS, NumpyEdge

    inner = NumpyEdge()

    class Duck:
        alloc, result_type = inner.alloc, inner.result_type

    for m in EDGE_METHODS:
        setattr(Duck, m, staticmethod(getattr(inner, m)))
    assert not hasattr(Duck(), "to_wire") and set(EDGE_ATTRIBUTES) == {"alloc", "result_type"}
    with Store(tmp_path / "s", num_units=1, edge=Duck()) as s:
        s.kv_batch_put(["a"], "p", {"x": np.arange(3).reshape(1, 3)})
        assert s.kv_batch_get(["a"], "p")["x"].tolist() == [[0, 1, 2]]


def test_a_bad_option_when_reopening_leaves_the_store_openable(tmp_path):
    Store(tmp_path / "s", num_units=2).close()
    with pytest.raises(ConfigError, match="max_workers"):
        Store(tmp_path / "s", max_workers=-1)
    with Store(tmp_path / "s", num_units=np.int64(2)) as s:  # (a numpy integer is an int)
        assert s.num_units == 2


def test_a_store_descriptor_naming_too_many_units_is_damaged_not_opened(tmp_path):
    Store(tmp_path / "s", num_units=2).close()
    p = tmp_path / "s" / "STORE.json"
    p.write_text(p.read_text().replace('"num_units": 2', '"num_units": 4611686018427387904'))
    with pytest.raises(tqstore.CorruptionError, match="num_units"):
        Store(tmp_path / "s")


def test_bad_config_raises_config_error(tmp_path):
    with pytest.raises(ConfigError):
        Store(tmp_path / "a", durability="sometimes")
    with pytest.raises(ConfigError):
        Store(tmp_path / "b", num_units=0)
    with pytest.raises(ConfigError):
        Store(tmp_path / "c", compress="lz4")
    with pytest.raises(ConfigError, match="result_type"):
        Store(tmp_path / "e", result_type="arrow")
    assert not [p.name for p in tmp_path.iterdir()]  # nothing was created for any of them
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "precious.txt").write_text("mine")
    with pytest.raises(ConfigError, match="not empty"):
        Store(tmp_path / "d")
    assert (tmp_path / "d" / "precious.txt").read_text() == "mine"


# ---------------------------------------------------------------------------- lifecycle

def test_store_directory_is_locked_against_a_second_open(tmp_path):
    with Store(tmp_path / "s") as s:
        s.write("p", {"v": [1]}, new_rows=True)
        with pytest.raises(StorageIOError, match="already open in this process"):
            Store(tmp_path / "s")
        code = ("import sys, tqstore\n"
                "try:\n    tqstore.open(sys.argv[1])\nexcept tqstore.StorageIOError as e:\n"
                "    print('locked', e); sys.exit(3)\n")
        r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "s")], cwd=ROOT, capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 3, r.stderr
        assert "open in another process" in r.stdout and "close it there" in r.stdout
    with Store(tmp_path / "s") as s:  # released on close
        assert s.read("p", [0])["v"] == [1]


_COMMAND_HOLDER = ("import sys\nfrom tqstore._io import locks\n"
                   "fd = locks.lock_for_check_nowait(sys.argv[1] + '/LOCK')  # as a command takes it\n"
                   "print('held', flush=True)\nsys.stdin.readline()\n")


def _command_holding(root):
    """A process holding the store's LOCK as a tqstore command does, until its stdin gets a line."""
    p = subprocess.Popen([sys.executable, "-c", _COMMAND_HOLDER, str(root)], cwd=ROOT, stdout=subprocess.PIPE,
                         stdin=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p


def _end(p):
    p.stdin.write("\n")
    p.stdin.close()
    p.wait(60)


def test_an_open_waits_for_a_command_of_another_process_instead_of_refusing(tmp_path):
    """``python -m tqstore inspect|ls|verify|compact`` hold the store's LOCK while they walk its
    indexes or use it: a trainer's open meanwhile was refused as "open in another process" (17
    opens in 141 beside a monitoring loop of ``inspect``).  It waits for the command now."""
    with Store(tmp_path / "s") as s:
        s.write("p", {"v": [1]}, new_rows=True)
    p = _command_holding(tmp_path / "s")
    try:
        out = []
        t = threading.Thread(target=lambda: out.append(Store(tmp_path / "s")))
        t.start()
        t.join(1.0)
        assert t.is_alive() and not out  # waiting for the command
    finally:
        _end(p)
    t.join(60)
    with out[0] as s:
        assert s.read("p", [0])["v"] == [1]


def test_a_command_mark_outlives_another_descriptor_of_the_lock_closed_in_its_process(tmp_path):
    """The mark was a classic POSIX lock: any descriptor of LOCK its process closed dropped it
    (here another check's failed attempt in the same process), and other processes' opens
    were refused again instead of waiting."""
    from tqstore._io import locks

    Store(tmp_path / "s").close()
    lock = tmp_path / "s" / "LOCK"
    fd = locks.lock_for_check_nowait(lock)
    try:
        with pytest.raises(BlockingIOError):
            locks.lock_for_check_nowait(lock)  # (opens and closes another descriptor of LOCK)
        probe = "import sys; from tqstore._io import locks; print(locks.check_mark_held(sys.argv[1]))"
        r = subprocess.run([sys.executable, "-c", probe, str(lock)], cwd=ROOT, capture_output=True, text=True,
                           timeout=120)
        assert r.stdout.strip() == "True", r.stderr
    finally:
        locks.unlock(fd)
    assert not locks.check_mark_held(lock)


def test_a_whole_file_lock_of_a_store_holder_is_no_command_mark(tmp_path, monkeypatch):
    """NFS emulates a flock with a POSIX lock over the whole file: an open beside a trainer
    holding the store took that lock for a command's mark and waited 600 s, then blamed a
    command.  Only a read lock on exactly the mark's byte counts."""
    from tqstore import store_lock

    Store(tmp_path / "s").close()
    code = ("import sys, fcntl, tqstore\ns = tqstore.open(sys.argv[1])\n"
            "fcntl.lockf(s._lock_fd, fcntl.LOCK_EX, 0, 0)  # what NFS takes for the store's flock\n"
            "print('held', flush=True)\nsys.stdin.readline()\n")
    p = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "s")], cwd=ROOT, stdout=subprocess.PIPE,
                         stdin=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "held"
        monkeypatch.setattr(store_lock, "CHECK_WAIT_S", 3.0)  # (what a mistaken wait would last)
        with pytest.raises(StorageIOError, match="is open in another process"):
            Store(tmp_path / "s")
    finally:
        _end(p)


def test_close_is_idempotent_and_closed_store_refuses_calls(tmp_path):
    s = Store(tmp_path / "s")
    s.close()
    s.close()
    with pytest.raises(tqstore.StoreClosedError):
        s.write("p", {"v": [1]}, new_rows=True)
    with pytest.raises(tqstore.StoreClosedError):
        s.read("p", [0])
    with pytest.raises(tqstore.StoreClosedError):  # (it was taken, on a closed controller)
        s.set_sampler("sequential")


def test_private_temporary_store_is_removed_on_close():
    s = Store()
    root = s.root
    s.write("p", {"x": torch.ones(3, 3)}, new_rows=True)
    assert root.exists()
    s.close()
    assert not root.exists()
    tq = tqstore.init()
    root = tq.root
    tqstore.close()
    assert not root.exists()


def test_init_creates_and_reopens_a_store(tmp_path):
    s = tqstore.init({"path": str(tmp_path / "s"), "num_units": 2})
    try:
        g = s.write("p", {"x": torch.arange(4)}, new_rows=True)
    finally:
        tqstore.close()
    s = tqstore.init({"path": tmp_path / "s"})
    try:
        assert s.num_units == 2 and same(s.read("p", g)["x"], torch.arange(4))
    finally:
        tqstore.close()


# ---------------------------------------------------------------------------- reconcile

def test_reconcile_drops_unit_entries_no_controller_row_claims(tmp_path):
    from tqstore.torch_adapter import to_column
    with Store(tmp_path / "s", num_units=2) as s:
        g = s.write("p", {"x": torch.arange(8).reshape(4, 2)}, new_rows=True)
        # an unacknowledged put: units wrote, the controller never committed
        col = to_column("x", torch.full((2, 2), 7), 2)
        for gi in (100, 101):
            s.units[gi % 2].write([(col, [gi - 100], [gi])], fresh=True)
        # and an extra field written to an existing row
        col_y = to_column("y", torch.ones(1, 3), 1)
        s.units[g[0] % 2].write([(col_y, [0], [g[0]])], fresh=True)
    with Store(tmp_path / "s") as s:
        held = {k for u in s.units for k in u.keys()}
        assert held == {(gi, "x") for gi in g}
        assert same(s.read("p", g)["x"], torch.arange(8).reshape(4, 2))


def test_put_whose_controller_commit_failed_is_invisible_and_dropped_on_reopen(tmp_path):
    with Store(tmp_path / "s", num_units=3) as s:
        g = s.write("p", {"x": torch.arange(6).reshape(3, 2)}, keys=["a", "b", "c"])
        before = store_state(s)[0]
        fp.arm("controller_commit", "eio")
        try:
            with pytest.raises(StorageIOError):
                s.write("p", {"x": torch.zeros(3, 2, dtype=torch.int64)}, keys=["d", "e", "f"])
        finally:
            fp.disarm()
        assert store_state(s)[0] == before
        with pytest.raises(KeyNotFoundError):
            s.controller.gidxs_for_keys("p", ["d"])
    with Store(tmp_path / "s") as s:
        held = {k for u in s.units for k in u.keys()}
        assert held == {(gi, "x") for gi in g}
        g2 = s.write("p", {"x": torch.ones(3, 2, dtype=torch.int64)}, keys=["d", "e", "f"])
        assert same(s.read("p", g + g2)["x"], torch.cat([torch.arange(6).reshape(3, 2),
                                                          torch.ones(3, 2, dtype=torch.int64)]))


# ---------------------------------------------------------------------------- deletes, compaction, verify

def test_deleted_rows_disappear_and_dead_segments_go(tmp_path):
    with Store(tmp_path / "s", num_units=2, segment_bytes=1 << 16) as s:
        gs = []
        for i in range(20):
            gs += s.write("p", {"x": torch.full((4, 1000), i)}, new_rows=True)
        segs_before = sum(len(u.segments()) for u in s.units)
        s.delete_rows("p", gs[:60])
        assert sum(len(u.segments()) for u in s.units) < segs_before
        with pytest.raises(KeyNotFoundError):
            s.read("p", gs[:1])
        out = s.read("p", gs[60:])["x"]
        assert same(out, torch.cat([torch.full((4, 1000), i) for i in range(15, 20)]))
        assert s.drop_partition("p") == gs[60:]
        assert s.drop_partition("p") == []
        assert all(u.keys() == [] for u in s.units)


def test_store_compaction_keeps_rows(tmp_path):
    with Store(tmp_path / "s", num_units=2, segment_bytes=1 << 16) as s:
        gs = []
        for i in range(12):
            gs += s.write("p", {"x": torch.full((4, 1000), i)}, new_rows=True)
        keep = gs[::5]
        s.delete_rows("p", [g for g in gs if g not in keep])
        s.compact()
        out = s.read("p", keep)["x"]
        assert same(out, torch.stack([torch.full((1000,), g // 4) for g in keep]))
        assert s.verify() == []


def test_verify_reports_a_flipped_byte_and_read_raises(tmp_path):
    with Store(tmp_path / "s", num_units=1) as s:
        g = s.write("p", {"x": torch.arange(100).reshape(4, 25)}, new_rows=True)
        u = s.units[0]
        (loc,) = u.locate([g[2]], "x")
        from tqstore._format.segment import segment_name
        path = u.path / segment_name(loc.seg)
        data = bytearray(path.read_bytes())
        data[loc.offset + 70] ^= 1
        path.write_bytes(bytes(data))
        u.maps.clear()
        problems = s.verify()
        assert len(problems) == 1 and str(path) in problems[0]
        with pytest.raises(tqstore.CorruptionError):
            s.read("p", g)
        assert same(s.read("p", g[:2])["x"], torch.arange(50).reshape(2, 25))
        assert same(s.read("p", g, verify=False)["x"][:2], torch.arange(50).reshape(2, 25))


def _flip_frame(s, gidx: int, field: str) -> None:
    from tqstore._format.segment import segment_name
    u = s.units[gidx % len(s.units)]
    (loc,) = u.locate([gidx], field)
    path = u.path / segment_name(loc.seg)
    data = bytearray(path.read_bytes())
    data[loc.offset + loc.length - 5] ^= 1
    path.write_bytes(bytes(data))
    u.maps.clear()


def test_verify_names_the_partition_key_and_field_of_a_damaged_frame(tmp_path):
    """It named the segment file and offset only: an operator could not tell which samples
    were hit (to clear them or produce them again)."""
    import pickle

    from tqstore.ports import FrameProblem

    with Store(tmp_path / "s", num_units=2) as s:
        s.kv_batch_put(["a", "b", "c"], "train", {"x": torch.arange(30.).reshape(3, 10), "t": ["p", "q", "r"]})
        g = s.write("rollouts", {"y": torch.ones(4, 8)}, new_rows=True)
        (gb,) = s.controller.resolve_keys("train", ["b"])
        _flip_frame(s, gb, "x")
        _flip_frame(s, g[3], "y")
        problems = s.verify()
        assert len(problems) == 2, problems
        assert any(f"partition 'train', key 'b', row {gb}, field 'x'" in p for p in problems), problems
        assert any(f"partition 'rollouts', row {g[3]} (no key), field 'y'" in p for p in problems), problems
        # (a unit's own line names the row and field; it crosses process boundaries whole)
        (line,) = [p for p in s.units[gb % 2].verify() if isinstance(p, FrameProblem)]
        back = pickle.loads(pickle.dumps(line))
        assert (back, back.gidx, back.field, back.message) == (line, gb, "x", line.message)
        assert f"(row {gb}, field 'x')" in line
        s.kv_clear(["b"], "train")  # the damaged frame went with its row
        assert [p for p in s.verify() if "'train'" in p] == []
    r = subprocess.run([sys.executable, "-m", "tqstore", "verify", str(tmp_path / "s")], capture_output=True,
                       text=True, cwd=tmp_path)
    assert r.returncode == 1 and f"partition 'rollouts', row {g[3]} (no key), field 'y'" in r.stdout, r


@pytest.mark.parametrize("k", [1, 1000], ids=["mmap-path", "preadv-path"])
def test_rows_of_one_length_but_different_shapes_keep_their_shapes(store, k):
    rows = [torch.randn(2, 10 * k), torch.randn(4, 5 * k), torch.randn(2, 10 * k), torch.randn(8, 2 * k + k // 2)]
    if k == 1:
        rows[3] = torch.randn(5, 4)
    g = store.write("p", {"x": rows}, new_rows=True)
    out = store.read("p", g)["x"]
    got = list(out.unbind()) if isinstance(out, torch.Tensor) else out
    assert [r.shape for r in got] == [r.shape for r in rows]
    assert [bits(r) for r in got] == [bits(r) for r in rows]


def test_jagged_rows_mixing_small_and_large_frames(store):
    rows = [torch.arange(n, dtype=torch.int64) for n in (5, 50_000, 0, 3_000, 70_000, 1)]
    g = store.write("p", {"ids": rows}, new_rows=True)
    out = store.read("p", g[::-1])["ids"]
    assert [bits(r) for r in out.unbind()] == [bits(r) for r in rows[::-1]]


@pytest.mark.parametrize("row_elems", [25, 30_000], ids=["mmap-path", "preadv-path"])
@pytest.mark.parametrize("where", ["magic", "gidx", "dims", "payload", "crc", "end-magic", "padding"])
def test_read_rejects_a_flipped_byte_anywhere_in_a_frame(tmp_path, row_elems, where):
    from tqstore._format.frame import parse_head
    from tqstore._format.segment import segment_name
    with Store(tmp_path / "s", num_units=2) as s:
        x = torch.arange(6 * row_elems, dtype=torch.int32).reshape(6, row_elems)
        g = s.write("p", {"x": x}, new_rows=True)
        u = s.units[g[3] % 2]
        (loc,) = u.locate([g[3]], "x")
        path = u.path / segment_name(loc.seg)
        data = bytearray(path.read_bytes())
        h = parse_head(bytes(data[loc.offset:loc.offset + 640]), 0, loc.length)
        end = h.payload_start + h.payload_len
        pos = {"magic": 1, "gidx": 24, "dims": 24 + 12 + 1 + 7,  # top byte of dim 0 (after the 1-byte field name)
               
               "payload": h.payload_start + h.payload_len // 2, "crc": end + 1, "end-magic": end + 5,
               "padding": loc.length - 1}[where]
        if where == "padding" and loc.length == end + 8:
            pytest.skip("frame has no trailing padding")
        data[loc.offset + pos] ^= 0x20
        path.write_bytes(bytes(data))
        u.maps.clear()
        with pytest.raises(tqstore.CorruptionError) as ei:
            s.read("p", g)
        assert str(path) in str(ei.value)
        assert same(s.read("p", g[:3])["x"], x[:3])  # the other rows still read


def test_large_values_of_different_lengths_round_trip(store):
    vals = ["x" * 5000, {"t": "y" * 9000}, "z", ["w" * 70_000]]
    g = store.write("p", {"v": vals}, new_rows=True)
    assert store.read("p", g)["v"] == vals


def test_small_and_large_puts_round_trip_on_many_units(tmp_path):
    """Small batches are written on the calling thread, large ones by the unit pool."""
    with Store(tmp_path / "s", num_units=4) as s:
        small = torch.arange(64).reshape(16, 4)
        big = torch.randn(64, 20_000)  # ~5 MB: over the parallel bound
        g1 = s.write("p", {"x": small}, new_rows=True)
        g2 = s.write("q", {"x": big}, new_rows=True)
        assert same(s.read("p", g1)["x"], small) and same(s.read("q", g2)["x"], big)
        back = list(range(63, -1, -3))
        assert same(s.read("q", [g2[i] for i in back])["x"], big[back])


def test_gc_is_paused_during_bulk_calls_and_restored_after(store):
    import gc
    from tqstore import _gcpause
    seen = []
    real = Store.__dict__["write"].__wrapped__

    assert gc.isenabled()
    with _gcpause.paused():
        seen.append(gc.isenabled())
        with _gcpause.paused():  # nested
            seen.append(gc.isenabled())
        seen.append(gc.isenabled())
    assert seen == [False, False, False] and gc.isenabled()
    gc.disable()  # a user who turned the collector off keeps it off
    try:
        store.write("p", {"x": torch.ones(2, 2)}, new_rows=True)
        assert not gc.isenabled()
    finally:
        gc.enable()
    store.write("p", {"x": torch.ones(2, 2)}, new_rows=True)
    assert gc.isenabled() and callable(real)
    with pytest.raises(InvalidInputError):  # and an error inside restores it too
        store.write("p", {"x": torch.ones(3, 2)}, keys=["a", "b"])
    assert gc.isenabled()


def test_a_current_pointer_naming_a_missing_state_is_an_error_that_removes_nothing(tmp_path):
    """CURRENT names a state directory that is gone (a damaged or hand-edited store): the open
    raises CorruptionError naming CURRENT and removes no other state directory (one of them
    may hold the data)."""
    root = tmp_path / "s"
    with tqstore.open(root, num_units=2) as s:
        s.kv_batch_put(["a", "b"], "p", fields={"x": torch.arange(4).view(2, 2)})
    current = (root / "CURRENT").read_text().strip()
    (root / "CURRENT").write_text("state-00000009\n")
    before = sorted(os.listdir(root))
    with pytest.raises(tqstore.CorruptionError, match="CURRENT"):
        tqstore.open(root)
    assert sorted(os.listdir(root)) == before and (root / current).is_dir()
    (root / "CURRENT").write_text(current + "\n")
    with tqstore.open(root) as s:
        assert s.kv_batch_get(["a", "b"], "p")["x"].tolist() == [[0, 1], [2, 3]]


def _create_under_limit(root: Path, limit: str, *, num_units: int, map_bytes: int, env=None):
    """Create the store ``root`` in a child process under ``resource`` limit ``limit``
    (``"RLIMIT_NOFILE"``: 128 descriptors; ``"RLIMIT_AS"``: 32 GiB of address space); the
    child prints the StorageIOError the open raises and exits 3."""
    cap = {"RLIMIT_NOFILE": 128, "RLIMIT_AS": 32 << 30}[limit]
    code = ("import resource, sys, tqstore\n"
            f"resource.setrlimit(resource.{limit}, ({cap}, resource.getrlimit(resource.{limit})[1]))\n"
            "try:\n"
            f"    tqstore.open(sys.argv[1], num_units={num_units}, index_map_bytes={map_bytes})\n"
            "except tqstore.StorageIOError as e:\n"
            "    print(e)\n"
            "    sys.exit(3)\n")
    r = subprocess.run([sys.executable, "-c", code, str(root)], cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env=env)
    assert r.returncode == 3, r.stderr[-2000:]
    return r.stdout


def _opens_afresh_with_two_units(root: Path) -> None:
    with tqstore.open(root, num_units=2) as s:
        s.kv_batch_put(["a"], "p", fields={"x": torch.zeros(1, 2)})
    with tqstore.open(root) as s:
        assert s.num_units == 2 and list(s.kv_list("p")["p"]) == ["a"]


def test_a_creation_that_fails_to_open_its_units_leaves_no_store_behind(tmp_path):
    """A new store whose units cannot all be opened (here the open-file limit) raises with
    the limit to raise named, and takes back what it made: a retry, with another unit count,
    creates the store afresh instead of meeting the failed one's STORE.json."""
    root = tmp_path / "s"
    assert "ulimit -n" in _create_under_limit(root, "RLIMIT_NOFILE", num_units=60, map_bytes=1 << 20)
    assert sorted(os.listdir(root)) == ["LOCK"]
    _opens_afresh_with_two_units(root)


def test_an_undo_of_a_failed_creation_that_fails_itself_leaves_debris_the_next_open_removes(tmp_path):
    """Taking back a failed creation can stop halfway (here its removal of the state
    directory fails): the marker it wrote first makes what is left debris, not a directory
    every later open refuses."""
    root = tmp_path / "s"
    _create_under_limit(root, "RLIMIT_NOFILE", num_units=60, map_bytes=1 << 20,
                        env={**os.environ, "TQSTORE_FAILPOINTS": "rmtree=eio@1"})
    left = sorted(os.listdir(root))
    assert "CREATION_UNDO" in left and "STORE.json" not in left and os.listdir(root / "state-00000001")
    _opens_afresh_with_two_units(root)
    assert "CREATION_UNDO" not in os.listdir(root)


def test_an_index_map_the_address_space_cannot_hold_names_the_setting(tmp_path):
    root = tmp_path / "s"
    assert "'index_map_bytes'" in _create_under_limit(root, "RLIMIT_AS", num_units=1, map_bytes=64 << 30)
    assert sorted(os.listdir(root)) == ["LOCK"]


def test_a_store_missing_its_store_json_is_refused_not_taken_for_creation_debris(tmp_path):
    """Only an interrupted creation (pointer files, empty state directories) is removed as
    debris; a directory without STORE.json whose state directory holds anything is refused
    with ConfigError and left as it is."""
    root = tmp_path / "s"
    with tqstore.open(root, num_units=2) as s:
        s.kv_batch_put(["a"], "p", fields={"x": torch.zeros(1, 2)})
    (root / "STORE.json").rename(tmp_path / "STORE.json.saved")
    before = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    with pytest.raises(tqstore.ConfigError, match="STORE.json"):
        tqstore.open(root)
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*")) == before
    (tmp_path / "STORE.json.saved").rename(root / "STORE.json")
    with tqstore.open(root) as s:
        assert list(s.kv_list("p")["p"]) == ["a"]
    debris = tmp_path / "d"  # what a creation killed before STORE.json leaves
    (debris / "state-00000001").mkdir(parents=True)
    (debris / "CURRENT").write_text("state-00000001\n")
    with tqstore.open(debris, num_units=2) as s:
        assert s.kv_list() == {}


def test_opening_a_users_directory_is_refused_before_anything_is_written_into_it(tmp_path):
    """A directory that is no store (a dump opened by mistake, a user's files) is refused with
    ConfigError and left byte for byte as it was: not even the store's LOCK file is made."""
    with tqstore.open(tmp_path / "s", num_units=2) as s:
        s.kv_batch_put(["a"], "p", fields={"x": torch.zeros(1, 2)})
        s.dump_data_by_key(tmp_path / "dump", ["a"], "p")
    user = tmp_path / "user"
    user.mkdir()
    (user / "notes.txt").write_text("mine")
    for d in (tmp_path / "dump", user):
        before = sorted(os.listdir(d))
        with pytest.raises(tqstore.ConfigError, match="holds no STORE.json"):
            tqstore.open(d)
        assert sorted(os.listdir(d)) == before
    from tqstore.dump import verify_dump
    assert verify_dump(tmp_path / "dump") == []


def test_a_store_published_by_another_process_between_the_checks_is_not_called_foreign(tmp_path, monkeypatch):
    """Two processes opening one new path together: the other's STORE.json may appear after
    the open looked for it and before it lists the directory; that is a store, not a
    user's directory (the open then meets the other's LOCK, as a retry would)."""
    from tqstore import layout_dirs

    root = tmp_path / "s"
    (root / "state-00000001").mkdir(parents=True)
    real = layout_dirs.files.listdir

    def listdir_after_the_other_published(p):
        (root / "STORE.json").write_text("{}")  # (the other creator's commit point, just now)
        (root / "state-00000001" / "controller").mkdir(exist_ok=True)
        return real(p)

    monkeypatch.setattr(layout_dirs.files, "listdir", listdir_after_the_other_published)
    assert layout_dirs.refuse_foreign(root) == []


def _files_under(root: Path) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*.tqs"))}


@pytest.mark.parametrize("lost", ["controller", "unit index"])
def test_a_store_whose_index_file_was_lost_refuses_to_open_and_removes_no_payload(tmp_path, lost):
    """A store's controller index or a unit's index deleted by hand (or lost with a disk):
    opening must not take the units' frames for debris of a crash and delete them; it raises
    CorruptionError naming the missing file, and every segment file is left as it was."""
    path = tmp_path / "s"
    with Store(path, num_units=2) as s:
        s.write("p", {"x": np.arange(40, dtype=np.int64).reshape(20, 2)}, keys=[f"k{i}" for i in range(20)])
        s.save_checkpoint(tmp_path / "ck")  # (seals the segments)
        s.write("p", {"x": np.arange(8, dtype=np.int64).reshape(4, 2)}, keys=[f"j{i}" for i in range(4)])
    state = next(path.glob("state-*"))
    gone = state / "controller" / "data.mdb" if lost == "controller" else state / "unit-001" / "index" / "data.mdb"
    gone.unlink()
    segments = _files_under(path)
    assert segments
    for _ in range(2):
        with pytest.raises(CorruptionError, match="missing") as e:
            Store(path)
        assert "data.mdb" in str(e.value)
        assert _files_under(path) == segments
    for command in ["verify"] + (["inspect", "ls"] if lost == "controller" else []):  # (1: damaged)
        r = subprocess.run([sys.executable, "-m", "tqstore", command, str(path)], capture_output=True, text=True)
        assert r.returncode == 1 and "missing" in r.stderr, (command, r.stdout, r.stderr)
    assert _files_under(path) == segments and not gone.exists()


def test_a_store_created_but_never_written_opens_without_its_index_files(tmp_path):
    """A crash right after a store's creation (STORE.json written) and before its indexes
    were: the next open creates them; nothing was ever stored."""
    path = tmp_path / "s"
    Store(path, num_units=2).close()
    state = next(path.glob("state-*"))
    for p in [state / "controller"] + [state / f"unit-00{i}" for i in range(2)]:
        shutil.rmtree(p)
    with Store(path) as s:
        s.write("p", {"x": np.arange(4, dtype=np.int64).reshape(2, 2)}, keys=["a", "b"])
        assert s.num_units == 2


@pytest.fixture
def small_disk(tmp_path):
    """A real 8 MiB file system (a tmpfs; root only, skipped otherwise), unmounted after."""
    d = tmp_path / "small"
    d.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(d)],
                                           capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here: no small file system to fill")
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], capture_output=True)


def test_a_put_on_a_full_disk_says_the_disk_may_be_full_and_loses_nothing(small_disk):
    """Puts until the disk is full: the failing put raises StorageIOError whose message says the
    file system is (nearly) full (LMDB reports a write cut short as an I/O error, which reads as
    failing hardware); the last acknowledged row reads back."""
    path = small_disk / "s"
    done = []
    with Store(path, num_units=2) as s:
        with pytest.raises(StorageIOError) as e:
            for i in range(10_000):
                s.write("p", {"x": np.full((4, 4096), i, dtype=np.int64)}, keys=[f"k{i}-{j}" for j in range(4)])
                done.append(i)
        assert "may be full" in str(e.value), str(e.value)
        assert len(done) > 10
        got = s.read("p", s.controller.resolve_keys("p", [f"k{done[-1]}-0"]), ["x"])
        assert int(np.asarray(got["x"]).reshape(-1)[0]) == done[-1]
