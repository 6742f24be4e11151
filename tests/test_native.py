"""The C record path (tqstore._native._frames) is byte-for-byte the pure-Python one.

Every function is run on both implementations with the same arguments; results must be
equal, and failures must raise the same exception type.  The frame-check kernel
(check_frames) and gather_frames are also fed garbage, bit flips, truncations and hostile
offsets/lengths/header fields: they must never crash and must agree with the pure version.
The LMDB leaf kernel (leaf_room, leaf_columns) runs on data files written by py-lmdb, whole
and damaged each way it checks: the same outputs, or the same ValueError and message.
"""
from __future__ import annotations

import os
import random
import struct
import subprocess
import sys
import threading
from pathlib import Path

import crc32c as crc32c_pkg
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tqstore._format import layout
from tqstore._format.lmdb_pages import P_INVALID, PageFile
from tqstore._native import _pure as P
from tqstore._native.layout import LOC_DTYPE

import lmdb_helpers

F = pytest.importorskip("tqstore._native._frames", reason="C extension not built")

ROOT = Path(__file__).resolve().parents[1]

settings.register_profile(
    "native", deadline=None, max_examples=150, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("native")


def run_both(name, *args, **kwargs):
    """Call ``name`` on both implementations; return the common result or the exception type."""
    out = []
    for mod in (F, P):
        try:
            out.append(("ok", getattr(mod, name)(*args, **kwargs)))
        except Exception as e:  # noqa: BLE001 - compared below
            out.append(("err", type(e)))
    assert out[0] == out[1], f"{name}: native {out[0]!r} != pure {out[1]!r}"
    return out[0]


def index_offsets(items, base_offset=0):
    offs, lens = [], []
    for _key, value in items:
        _seg, off, flen, _crc = layout.INDEX_VALUE.unpack(value)
        offs.append(off - base_offset)
        lens.append(flen)
    return offs, lens


# ---- module surface -------------------------------------------------------------------


def test_surface_and_layout_constants():
    assert F.IMPLEMENTATION == "native"
    assert P.IMPLEMENTATION == "pure"
    for name in ("crc32c", "build_header", "frame_head", "frame_tail", "encode_frames", "encode_rows",
                 "check_frames", "gather_frames", "copy_ranges", "restamp_frames", "crc32c_frames", "pread_ranges",
                 "pwrite_ranges",
                 "leaf_room",
                 "leaf_columns", "place_keys"):
        assert callable(getattr(F, name)) and callable(getattr(P, name))
    c = F._LAYOUT
    assert c["FRAME_MAGIC"] == layout.FRAME_MAGIC
    assert c["FRAME_END_MAGIC"] == layout.FRAME_END_MAGIC
    assert c["FRAME_VERSION"] == layout.FRAME_VERSION
    assert c["ALIGN"] == layout.ALIGN
    assert c["PREFIX_SIZE"] == layout.PREFIX_SIZE
    assert c["HEADER_HEAD_SIZE"] == layout.HEADER_HEAD_SIZE
    assert c["TRAILER_SIZE"] == layout.TRAILER_SIZE
    assert c["INDEX_KEY_HEAD_SIZE"] == layout.INDEX_KEY_HEAD.size
    assert c["INDEX_VALUE_SIZE"] == layout.INDEX_VALUE.size
    assert c["MAX_FIELD_BYTES"] == layout.MAX_FIELD_BYTES
    assert c["MAX_NDIM"] == layout.MAX_NDIM
    assert c["DTYPE_ITEMSIZE"] == bytes(layout.DTYPE_ITEMSIZE)
    from tqstore._format import dtypes
    assert all(layout.DTYPE_ITEMSIZE[code] == (dtypes.itemsize(code) if code else 0) for code in dtypes.DTYPE_NAMES)
    assert len(layout.DTYPE_ITEMSIZE) == len(dtypes.DTYPE_NAMES)


@pytest.mark.parametrize("pure_env, expected", [("1", "pure"), ("0", "native")])
def test_tqstore_pure_env_selects_implementation(pure_env, expected):
    env = dict(os.environ, TQSTORE_PURE=pure_env)
    out = subprocess.run(
        [sys.executable, "-c", "import tqstore._native as n; print(n.IMPLEMENTATION, n.impl.__name__)"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=True,
    ).stdout.split()
    assert out[0] == expected
    assert out[1] == f"tqstore._native._{'pure' if expected == 'pure' else 'frames'}"


# ---- crc32c ---------------------------------------------------------------------------

u32_or_wild = st.one_of(
    st.integers(0, 2**32 - 1), st.integers(-(2**70), 2**70), st.sampled_from([True, False])
)


@given(data=st.binary(max_size=5000), value=u32_or_wild)
def test_crc32c_matches(data, value):
    expected = crc32c_pkg.crc32c(data, value)
    assert run_both("crc32c", data, value) == ("ok", expected)
    assert F.crc32c(data=data, value=value) == expected
    assert F._crc32c_table(data, value & 0xFFFFFFFF) == expected


@given(a=st.binary(max_size=3000), b=st.binary(max_size=3000))
def test_crc32c_continues(a, b):
    assert F.crc32c(b, F.crc32c(a)) == F.crc32c(a + b) == crc32c_pkg.crc32c(a + b)


def test_crc32c_sizes_and_alignments():
    """Every code path of the interleaved hardware loop and of the table fallback."""
    rng = np.random.default_rng(1)
    data = rng.integers(0, 256, 3 * 8192 * 3 + 4096, dtype=np.uint8).tobytes()
    sizes = sorted({0, 1, 7, 8, 9, 63, 64, 255, 256, 767, 768, 769, 1000, 3 * 8192 - 1, 3 * 8192,
                    3 * 8192 + 1, 3 * 8192 + 767, 3 * 8192 + 768, 2 * 3 * 8192 + 5, 65535, 65536, 65537})
    mv = memoryview(data)
    for size in sizes:
        for start in range(9):
            chunk = mv[start:start + size]
            expected = crc32c_pkg.crc32c(chunk, 0x1234567)
            assert F.crc32c(chunk, 0x1234567) == expected, (size, start)
            assert F._crc32c_table(chunk, 0x1234567) == expected, (size, start)


def test_crc32c_large_and_buffer_types():
    rng = np.random.default_rng(2)
    big = rng.integers(0, 256, 5 * 1024 * 1024 + 3, dtype=np.uint8)  # released-GIL path
    assert F.crc32c(big) == crc32c_pkg.crc32c(big.tobytes())
    arr = rng.standard_normal((17, 5)).astype(np.float32)
    assert F.crc32c(arr) == crc32c_pkg.crc32c(arr.tobytes())
    assert F.crc32c(bytearray(b"abc"), 7) == crc32c_pkg.crc32c(b"abc", 7)
    assert F.crc32c(np.int64(5).tobytes(), np.int64(3)) == crc32c_pkg.crc32c(np.int64(5).tobytes(), 3)
    for bad in ("text", 5, None, [1, 2]):
        assert run_both("crc32c", bad)[0] == "err"
    assert run_both("crc32c", b"x", 1.5) == ("err", TypeError)
    assert run_both("crc32c", arr[:, ::2])[0] == "err"  # not contiguous


# ---- build_header / frame_head / frame_tail -------------------------------------------

u8_or_wild = st.one_of(st.integers(0, 255), st.integers(-300, 600))
u64_or_wild = st.one_of(st.integers(0, 2**64 - 1), st.integers(-(2**65), 2**66))
dims = st.lists(st.one_of(st.integers(0, 2**64 - 1), st.integers(-5, 2**65)), max_size=36)
fields = st.one_of(st.binary(max_size=300), st.text(max_size=4), st.builds(bytearray, st.binary(max_size=20)))


@given(field=fields, kind=u8_or_wild, dtype=u8_or_wild, gidx=u64_or_wild, shape=dims)
def test_build_header_matches(field, kind, dtype, gidx, shape):
    r = run_both("build_header", field, kind, dtype, gidx, shape)
    if r[0] == "ok":
        head = layout.HEADER_HEAD.unpack_from(r[1])
        assert head == (gidx, kind, dtype, len(shape), len(field))
        assert len(r[1]) == layout.HEADER_HEAD_SIZE + len(field) + 8 * len(shape)


@given(field=st.binary(max_size=255), shape=st.lists(st.integers(0, 2**64 - 1), max_size=32))
def test_build_header_valid(field, shape):
    assert F.build_header(field, 1, 2, 3, tuple(shape)) == P.build_header(field, 1, 2, 3, tuple(shape))
    assert F.build_header(field=field, kind=1, dtype=2, gidx=3, shape=shape) == P.build_header(
        field, 1, 2, 3, shape)


def test_build_header_errors():
    for args in [
        (b"x" * 256, 0, 0, 0, ()),  # field too long
        (b"f", 0, 0, 0, (1,) * 33),  # too many dims
        (b"f", 0, 0, 0, (-1,)),  # negative dim
        (b"f", 0, 0, 0, (1.0,)),  # float dim
        (b"f", 0, 0, 0, 5),  # shape not iterable
        (b"f", 256, 0, 0, ()),  # kind out of range
        (b"f", 0, 0, -1, ()),  # negative gidx
        (b"f", 0, 0, 2**64, ()),  # gidx too large
        (b"f", 0, 0, "1", ()),  # gidx not an int
        ("f", 0, 0, 0, ()),  # str field
    ]:
        assert run_both("build_header", *args)[0] == "err", args
    assert run_both("build_header", b"x" * 256, 0, 0, 0, ()) == ("err", ValueError)
    assert run_both("build_header", b"f", 0, 0, 0, (1,) * 33) == ("err", ValueError)
    assert run_both("build_header", b"f", 0, 0, 0, (-1,)) == ("err", OverflowError)
    assert run_both("build_header", b"f", 0, 0, 0, (1.0,)) == ("err", TypeError)
    # numpy integers and torch-like sizes are accepted
    assert F.build_header(b"f", np.uint8(1), 2, np.int64(3), np.array([2, 3])) == P.build_header(
        b"f", 1, 2, 3, (2, 3))
    with pytest.raises(TypeError):
        F.build_header(b"f", 0, 0, 0)
    with pytest.raises(TypeError):
        F.build_header(b"f", 0, 0, 0, (), bogus=1)


@given(header=st.binary(max_size=600), plen=u64_or_wild, flags=u8_or_wild, raw=u64_or_wild)
def test_frame_head_matches(header, plen, flags, raw):
    r = run_both("frame_head", header, plen, flags, raw)
    if r[0] == "ok":
        assert len(r[1]) % layout.ALIGN == 0


def test_frame_head_limits():
    assert run_both("frame_head", b"h" * 65535, 0, 0, 0)[0] == "ok"
    assert run_both("frame_head", b"h" * 65536, 0, 0, 0) == ("err", ValueError)
    assert run_both("frame_head", memoryview(b"h" * 10), 1, 2, 3)[0] == "ok"


@given(crc=st.one_of(st.integers(0, 2**32 - 1), st.integers(-(2**33), 2**34)),
       end=st.one_of(st.integers(-1000, 1 << 20), st.integers(-(2**130), 2**130)))
def test_frame_tail_matches(crc, end):
    r = run_both("frame_tail", crc, end)
    if r[0] == "ok":
        assert (end + len(r[1])) % layout.ALIGN == 0


# ---- encode_frames --------------------------------------------------------------------

NP_DTYPES = [np.uint8, np.int16, np.float32, np.float64, np.int64, np.bool_]


@st.composite
def payloads(draw):
    n = draw(st.integers(0, 300))
    kind = draw(st.sampled_from(["bytes", "bytearray", "memoryview", "numpy", "numpy2d", "empty"]))
    raw = draw(st.binary(min_size=n, max_size=n))
    if kind == "bytes":
        return raw
    if kind == "bytearray":
        return bytearray(raw)
    if kind == "memoryview":
        return memoryview(raw)
    if kind == "empty":
        return b""
    dt = np.dtype(draw(st.sampled_from(NP_DTYPES)))
    k = n // dt.itemsize
    arr = np.frombuffer(raw[: k * dt.itemsize], dtype=np.uint8).view(dt).copy()
    if kind == "numpy2d" and k % 2 == 0:
        arr = arr.reshape(2, k // 2)
    return arr


@st.composite
def encode_args(draw):
    n = draw(st.integers(0, 12))
    pl = [draw(payloads()) for _ in range(n)]
    raw_lens = draw(st.one_of(st.none(), st.lists(st.integers(0, 2**64 - 1), min_size=n, max_size=n)))
    return dict(
        field=draw(st.binary(max_size=255)),
        kind=draw(st.integers(0, 255)),
        dtype=draw(st.integers(0, 255)),
        gidxs=draw(st.lists(st.integers(0, 2**64 - 1), min_size=n, max_size=n)),
        shapes=[tuple(draw(st.lists(st.integers(0, 2**64 - 1), max_size=32))) for _ in range(n)],
        payloads=pl,
        flags=draw(st.integers(0, 255)),
        raw_lens=raw_lens,
        seg_id=draw(st.integers(0, 2**32 - 1)),
        base_offset=draw(st.integers(0, 2**63)),
    )


@given(args=encode_args())
def test_encode_frames_matches_and_verifies(args):
    r = run_both("encode_frames", **args)
    assert r[0] == "ok"
    blob, items = r[1]
    assert isinstance(blob, bytes) and isinstance(items, list)
    assert len(items) == len(args["gidxs"])
    assert len(blob) % layout.ALIGN == 0
    offs, lens = index_offsets(items, args["base_offset"])
    assert sum(lens) == len(blob)
    for off, flen, (key, value), payload, shape in zip(offs, lens, items, args["payloads"], args["shapes"]):
        plen = memoryview(payload).nbytes
        pstart = layout.payload_offset(layout.HEADER_HEAD_SIZE + len(args["field"]) + 8 * len(shape))
        assert layout.frame_extent(pstart, plen) == flen
        assert blob[off + pstart:off + pstart + plen] == memoryview(payload).tobytes()
        crc = int.from_bytes(blob[off + pstart + plen:off + pstart + plen + 4], "little")
        assert crc == crc32c_pkg.crc32c(blob[off:off + pstart + plen]) == layout.INDEX_VALUE.unpack(value)[3]
        assert key[8:] == args["field"]


def test_encode_frames_positional_and_large_payloads():
    """Large payloads: chunked copy + CRC, and the released-GIL path."""
    rng = np.random.default_rng(3)
    pls = [rng.integers(0, 256, size, dtype=np.uint8) for size in (0, 1, 200_000, 3 * 1024 * 1024 + 17)]
    args = (b"obs", 1, 2, [10, 11, 12, 13], [(p.size,) for p in pls], pls, 0, None, 4, 4096)
    a = F.encode_frames(*args)
    assert a == P.encode_frames(*args)
    locs = b"".join(v for _k, v in a[1])
    assert F.check_frames(a[0], locs, np.array([10, 11, 12, 13], np.uint64), base=4096)[0] == bytes(4)


def test_encode_frames_many_small_matches():
    pls = [bytes([i & 0xFF]) * 64 for i in range(5000)]
    args = (b"response", 0, 3, list(range(5000)), [(64,)] * 5000, pls, 0, None, 1, 0)
    assert F.encode_frames(*args) == P.encode_frames(*args)


def test_encode_frames_errors_match():
    ok = dict(field=b"f", kind=0, dtype=0, gidxs=[1, 2], shapes=[(1,), (1,)], payloads=[b"a", b"b"],
              flags=0, raw_lens=None, seg_id=0, base_offset=0)
    noncontig = np.arange(10, dtype=np.int32)[::2]
    cases = [
        ({"gidxs": [1]}, ValueError),  # length mismatch
        ({"raw_lens": [1]}, ValueError),
        ({"payloads": [b"a"]}, ValueError),
        ({"field": b"x" * 256}, ValueError),
        ({"shapes": [(1,), (1,) * 33]}, ValueError),
        ({"gidxs": [1, -1]}, OverflowError),
        ({"gidxs": [1, 2**64]}, OverflowError),
        ({"gidxs": [1, 2.0]}, TypeError),
        ({"shapes": [(1,), (-2,)]}, OverflowError),
        ({"shapes": [(1,), None]}, TypeError),
        ({"payloads": [b"a", "text"]}, TypeError),
        ({"payloads": [b"a", noncontig]}, BufferError),
        ({"payloads": [b"a", memoryview(noncontig)]}, BufferError),
        ({"raw_lens": [1, -1]}, OverflowError),
        ({"seg_id": 2**32}, OverflowError),
        ({"base_offset": -1}, OverflowError),
        ({"flags": 256}, OverflowError),
        ({"kind": None}, TypeError),
        ({"gidxs": 5}, TypeError),
        ({"base_offset": 2**64 - 64}, OverflowError),  # second frame's offset passes 2**64
    ]
    for change, exc in cases:
        assert run_both("encode_frames", **{**ok, **change}) == ("err", exc), change
    # the last frame may end exactly at (or past) 2**64: only frame offsets are stored
    assert run_both("encode_frames", **{**ok, "gidxs": [1], "shapes": [()], "payloads": [b""],
                                        "base_offset": 2**64 - 64})[0] == "ok"
    with pytest.raises(TypeError):
        F.encode_frames(b"f", 0, 0, [], [], [], 0, None, 0)


@st.composite
def rows_args(draw):
    ndim = draw(st.integers(0, 3))
    shape = tuple(draw(st.lists(st.integers(0, 5), min_size=ndim, max_size=ndim)))
    row_bytes = int(np.prod(shape, dtype=np.int64)) * draw(st.sampled_from([1, 2, 4, 8]))
    m = draw(st.integers(1, 20))
    n = draw(st.integers(0, 30))
    data = np.frombuffer(draw(st.binary(min_size=m * row_bytes, max_size=m * row_bytes)), np.uint8)
    rows = draw(st.none() | st.lists(st.integers(0, m - 1), min_size=n, max_size=n))
    if rows is None:
        n = min(n, m)
    return dict(field=draw(st.binary(max_size=12)), kind=draw(st.integers(0, 2)), dtype=draw(st.integers(0, 20)),
                gidxs=draw(st.lists(st.integers(0, 2**64 - 1), min_size=n, max_size=n)), shape=shape, data=data,
                row_bytes=row_bytes, rows=rows, seg_id=draw(st.integers(0, 2**32 - 1)),
                base_offset=draw(st.integers(0, 2**62)))


@given(args=rows_args())
def test_encode_rows_matches_encode_frames_of_the_same_rows(args):
    r = run_both("encode_rows", **args)
    assert r[0] == "ok"
    per, n = args["row_bytes"], len(args["gidxs"])
    rows = range(n) if args["rows"] is None else args["rows"]
    payloads = [args["data"][i * per:(i + 1) * per].tobytes() for i in rows]
    want = P.encode_frames(args["field"], args["kind"], args["dtype"], args["gidxs"], [args["shape"]] * n, payloads,
                           0, None, args["seg_id"], args["base_offset"])
    assert r[1] == want


def test_encode_rows_errors_match():
    data = np.arange(24, dtype=np.uint8)
    ok = dict(field=b"f", kind=1, dtype=3, gidxs=[1, 2], shape=(2,), data=data, row_bytes=8, rows=[0, 2],
              seg_id=0, base_offset=0)
    cases = [
        ({"rows": [0]}, ValueError),  # length mismatch
        ({"rows": [0, 3]}, IndexError),  # outside the data
        ({"rows": [0, -1]}, OverflowError),
        ({"rows": 5}, TypeError),
        ({"data": data.reshape(4, 6)[:, :4]}, BufferError),
        ({"data": "text"}, TypeError),
        ({"row_bytes": -1}, OverflowError),
        ({"gidxs": [1, -1]}, OverflowError),
        ({"field": b"x" * 256}, ValueError),
        ({"shape": (1,) * 33}, ValueError),
        ({"seg_id": 2**32}, OverflowError),
        ({"base_offset": 2**64 - 64}, OverflowError),  # the second frame's offset passes 2**64
    ]
    for change, exc in cases:
        assert run_both("encode_rows", **{**ok, **change}) == ("err", exc), change
    big = np.zeros(300_000, np.uint8)  # the released-GIL path
    assert run_both("encode_rows", b"x", 1, 1, list(range(3)), (100_000,), big, 100_000, [2, 0, 1], 1, 64)[0] == "ok"


def test_encode_frames_threads():
    pls = [np.full(100, i & 0xFF, dtype=np.uint8) for i in range(3000)]
    args = (b"f", 0, 0, list(range(3000)), [(100,)] * 3000, pls, 1, [200] * 3000, 9, 0)
    expected = P.encode_frames(*args)
    errors = []

    def work():
        try:
            for _ in range(5):
                assert F.encode_frames(*args) == expected
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


# ---- check_frames: the frame-check kernel ---------------------------------------------


def check_both(buf, locs, gidxs=None, verify=True, index_crc=True, base=0):
    """check_frames on both implementations: same statuses and CRCs, or the same exception type."""
    return run_both("check_frames", buf, locs, None if gidxs is None else np.asarray(gidxs, dtype=np.uint64),
                    verify, index_crc, base)


def _statuses(res):
    return list(res[1][0])


def _mixed_blob(n=6, seed=0, base=0):
    """Frames of varying shapes, dtypes, kinds, fields and codecs back to back from ``base``:
    (blob, locs bytes, gidxs, extents)."""
    rng = np.random.default_rng(seed)
    parts, locs, gidxs = [], [], []
    off = base
    for i in range(n):
        kind = int(rng.integers(0, 3))
        dtype = int(rng.integers(1, 18)) if kind != layout.KIND_VALUE else 0
        shape = tuple(int(d) for d in rng.integers(0, 5, int(rng.integers(0, 3)))) if kind != 2 else ()
        plen = layout.DTYPE_ITEMSIZE[dtype] * int(np.prod(shape)) if kind != 2 else int(rng.integers(0, 90))
        field = [b"f", b"obs", "é".encode() * 3, b"x" * 255][int(rng.integers(0, 4))]
        g = int(rng.integers(0, 1 << 62))
        blob, items = F.encode_frames(field, kind, dtype, [g], [shape], [rng.integers(0, 256, plen, np.uint8)], 0,
                                      None, 3, off)
        parts.append(blob)
        locs.append(items[0][1])
        gidxs.append(g)
        off += len(blob)
    return b"".join(parts), b"".join(locs), gidxs


@st.composite
def check_case(draw):
    n = draw(st.integers(0, 8))
    base = draw(st.sampled_from([0, 64, 4096]))
    blob, locs, gidxs = _mixed_blob(n, seed=draw(st.integers(0, 10_000)), base=base)
    return blob, locs, gidxs, base


def _loc_list(locs):
    return [layout.INDEX_VALUE.unpack_from(locs, k) for k in range(0, len(locs), layout.INDEX_VALUE.size)]


@given(case=check_case(), verify=st.booleans(), with_gidx=st.booleans())
def test_check_frames_valid_runs(case, verify, with_gidx):
    blob, locs, gidxs, base = case
    res = check_both(blob, locs, gidxs if with_gidx else None, verify, True, base)
    assert res[0] == "ok"
    st_, crcs, trailers = res[1]
    n = len(gidxs)
    assert st_ == bytes(n)
    recorded = [v[3] for v in _loc_list(locs)]
    assert list(np.frombuffer(trailers, "<u4")) == recorded
    assert list(np.frombuffer(crcs, "<u4")) == (recorded if verify else [0] * n)


@given(case=check_case(), data=st.data(), verify=st.booleans())
def test_check_frames_bit_flips(case, data, verify):
    """Every byte of a frame is checked: a flip is seen (a payload flip by the CRC32C)."""
    blob, locs, gidxs, base = case
    assume(blob)
    buf = bytearray(blob)
    for _ in range(data.draw(st.integers(1, 3))):
        pos = data.draw(st.integers(0, len(buf) - 1))
        buf[pos] ^= 1 << data.draw(st.integers(0, 7))
    flipped = {p for p in range(len(buf)) if buf[p] != blob[p]}
    res = check_both(bytes(buf), locs, gidxs, verify, True, base)
    for (_seg, off, ln, _crc), code in zip(_loc_list(locs), res[1][0]):
        f = off - base
        hit = {p for p in flipped if f <= p < f + ln}
        if not verify:  # without the CRC32C: magic, version, gidx, end magic and padding are still seen
            hlen = blob[f + 6] | blob[f + 7] << 8
            plen = int.from_bytes(blob[f + 8:f + 16], "little")
            t = f + layout.payload_offset(hlen) + plen
            hit = {p for p in hit if p < f + 5 or f + 24 <= p < f + 32 or p >= t + 4}
            assert code != 0 or not hit, (code, hit)
            continue
        assert (code != 0) == bool(hit), (code, hit)


@given(case=check_case(), data=st.data())
def test_check_frames_truncated(case, data):
    blob, locs, gidxs, base = case
    cut = data.draw(st.integers(0, len(blob)))
    res = check_both(blob[:cut], locs, gidxs, True, True, base)
    for (_seg, off, ln, _crc), code in zip(_loc_list(locs), res[1][0]):
        assert code == (layout.FRAME_TRUNCATED if off - base + ln > cut else 0)


@given(case=check_case(), data=st.data())
def test_check_frames_wrong_extents_gidxs_and_index_crcs(case, data):
    blob, locs, gidxs, base = case
    assume(gidxs)
    vals = _loc_list(locs)
    i = data.draw(st.integers(0, len(vals) - 1))
    seg, off, ln, crc = vals[i]
    what = data.draw(st.sampled_from(["extent", "gidx", "crc"]))
    g = list(gidxs)
    if what == "extent":
        vals[i] = (seg, off, data.draw(st.integers(0, 2**32 - 1).filter(lambda x: x != ln)), crc)
    elif what == "gidx":
        g[i] ^= 1 << data.draw(st.integers(0, 63))
    else:
        vals[i] = (seg, off, ln, crc ^ (1 << data.draw(st.integers(0, 31))))
    res = check_both(blob, b"".join(layout.INDEX_VALUE.pack(*v) for v in vals), g, True, True, base)
    codes = list(res[1][0])
    assert codes[:i] + codes[i + 1:] == [0] * (len(vals) - 1)
    if what == "extent":
        assert codes[i] in (layout.FRAME_EXTENT, layout.FRAME_TRUNCATED, layout.FRAME_HEADER)
    else:
        assert codes[i] == (layout.FRAME_GIDX if what == "gidx" else layout.FRAME_INDEX_CRC)
    assert check_both(blob, b"".join(layout.INDEX_VALUE.pack(*v) for v in vals), None, True, False, base)[1][0] == (
        bytes(len(vals)) if what != "extent" else res[1][0])


@given(buf=st.binary(max_size=2000), data=st.data(), verify=st.booleans(), index_crc=st.booleans())
def test_check_frames_garbage(buf, data, verify, index_crc):
    """Hostile index values over random bytes (and over frames with overwritten fields)."""
    if data.draw(st.booleans()):
        blob, _locs, _g = _mixed_blob(3, seed=data.draw(st.integers(0, 99)))
        b = bytearray(blob)
        for _ in range(data.draw(st.integers(1, 4))):
            pos = data.draw(st.integers(0, len(b) - 8))
            b[pos:pos + 8] = data.draw(st.sampled_from([b"TQFR\x01\x00\xff\xff", b"\xff" * 8, bytes(8), b"TQFE" * 2]))
        buf = bytes(b)
    n = data.draw(st.integers(0, 10))
    locs = b"".join(layout.INDEX_VALUE.pack(
        data.draw(st.integers(0, 2**32 - 1)),
        data.draw(st.one_of(st.integers(0, 2**64 - 1), st.integers(0, len(buf) + 64).map(lambda x: x & ~63))),
        data.draw(st.one_of(st.integers(0, 2**32 - 1), st.integers(0, len(buf) + 64))),
        data.draw(st.integers(0, 2**32 - 1))) for _ in range(n))
    gidxs = data.draw(st.one_of(st.none(), st.lists(st.integers(0, 2**64 - 1), min_size=n, max_size=n)))
    base = data.draw(st.sampled_from([0, 0, 64, 2**64 - 1]))
    check_both(buf, locs, gidxs, verify, index_crc, base)


def _reseal(buf: bytearray, f: int) -> None:
    """Rewrite the CRC of the frame at ``f`` after its head was changed (its lengths intact)."""
    hlen = buf[f + 6] | buf[f + 7] << 8
    plen = int.from_bytes(buf[f + 8:f + 16], "little")
    end = f + layout.payload_offset(hlen) + plen
    struct.pack_into("<I", buf, end, crc32c_pkg.crc32c(bytes(buf[f:end])))


@pytest.mark.parametrize("change, code", [
    (lambda b: b.__setitem__(slice(0, 4), b"TQFX"), layout.FRAME_MAGIC_BAD),
    (lambda b: b.__setitem__(4, 2), layout.FRAME_VERSION_UNKNOWN),
    (lambda b: b.__setitem__(5, 4), layout.FRAME_FLAGS),
    (lambda b: b.__setitem__(5, 2), layout.FRAME_FLAGS),
    (lambda b: b.__setitem__(24 + 8, 3), layout.FRAME_HEADER),  # kind
    (lambda b: b.__setitem__(24 + 10, 2), layout.FRAME_HEADER),  # ndim against header_len
    (lambda b: b.__setitem__(24 + 12, 0xFF), layout.FRAME_HEADER),  # field name not UTF-8
    (lambda b: b.__setitem__(slice(24 + 12, 24 + 15), b"\xed\xa0\x80"[:3]), layout.FRAME_HEADER),  # surrogate
    (lambda b: b.__setitem__(24 + 9, 6), layout.FRAME_SIZE),  # dtype int64: 8x the bytes
    (lambda b: b.__setitem__(24 + 9, 40), layout.FRAME_SIZE),  # unknown dtype
    (lambda b: b.__setitem__(16, 9), layout.FRAME_SIZE),  # raw_len != P for the raw codec
    (lambda b: b.__setitem__(slice(8, 16), (1 << 40).to_bytes(8, "little")), layout.FRAME_EXTENT),
])
def test_check_frames_head_codes(change, code):
    blob, items = F.encode_frames(b"abc", 0, 2, [5], [(100,)], [bytes(range(100))], 0, None, 0, 0)
    buf = bytearray(blob)
    change(buf)
    _reseal(buf, 0) if code != layout.FRAME_EXTENT else None
    loc = items[0][1]
    res = check_both(bytes(buf), loc, None, True, False)
    assert res[1][0] == bytes([code])


def test_check_frames_tail_codes_and_crcs():
    pls = [bytes([i]) * 40 for i in range(4)]
    blob, items = F.encode_frames(b"f", 0, 2, [0, 1, 2, 3], [(40,)] * 4, pls, 0, None, 0, 0)
    locs = b"".join(v for _k, v in items)
    vals = _loc_list(locs)
    buf = bytearray(blob)
    buf[vals[1][1] + 64 + 40 + 4] ^= 1  # end magic
    buf[vals[2][1] + 64 + 40 + 20] = 1  # padding
    buf[vals[3][1] + 64 + 3] ^= 1  # payload
    st_, crcs, trailers = check_both(bytes(buf), locs, [0, 1, 2, 3])[1]
    assert list(st_) == [0, layout.FRAME_TORN, layout.FRAME_PADDING, layout.FRAME_CRC]
    c = np.frombuffer(crcs, "<u4")
    t = np.frombuffer(trailers, "<u4")
    assert t[0] == c[0] == vals[0][3] and c[1] == 0 and t[3] == vals[3][3]
    assert c[3] == crc32c_pkg.crc32c(bytes(buf[vals[3][1]:vals[3][1] + 104]))
    assert list(check_both(bytes(buf), locs, None, False)[1][0]) == [0, layout.FRAME_TORN, layout.FRAME_PADDING, 0]


def test_check_frames_arguments():
    blob, locs, gidxs = _mixed_blob(4)
    g = np.asarray(gidxs, dtype=np.uint64)
    from tqstore._format.index import LOC_DTYPE
    arr = np.frombuffer(locs, LOC_DTYPE)
    ok = check_both(blob, locs, gidxs)
    assert ok[0] == "ok" and ok[1][0] == bytes(4)
    assert run_both("check_frames", blob, arr)[1] == ok[1]
    assert run_both("check_frames", buf=np.frombuffer(blob, np.float32), locs=arr, gidxs=g, verify=1, index_crc=1,
                    base=0)[1] == ok[1]
    assert run_both("check_frames", blob, b"") == ("ok", (b"", b"", b""))
    assert run_both("check_frames", b"", locs)[1][0] == bytes([layout.FRAME_TRUNCATED]) * 4
    assert run_both("check_frames", blob, locs[:-1]) == ("err", ValueError)
    assert run_both("check_frames", blob, locs, g[:3]) == ("err", ValueError)
    assert run_both("check_frames", blob, locs, None, True, True, -1) == ("err", OverflowError)
    assert run_both("check_frames", blob, locs, None, True, True, 1.0) == ("err", TypeError)
    assert run_both("check_frames", "text", locs) == ("err", TypeError)
    assert run_both("check_frames", np.frombuffer(blob, np.uint8)[::2], locs) == ("err", BufferError)
    assert run_both("check_frames", blob) == ("err", TypeError)
    assert run_both("check_frames", blob, locs, bogus=1) == ("err", TypeError)


def test_check_frames_large_releases_gil():
    rng = np.random.default_rng(4)
    pls = [rng.integers(0, 256, 300_000, dtype=np.uint8) for _ in range(4)]
    blob, items = F.encode_frames(b"x", 0, 2, [0, 1, 2, 3], [(300_000,)] * 4, pls, 0, None, 0, 0)
    locs = b"".join(v for _k, v in items)
    buf = bytearray(blob)
    buf[_loc_list(locs)[2][1] + 1000] ^= 0x10
    assert list(check_both(bytes(buf), locs)[1][0]) == [0, 0, layout.FRAME_CRC, 0]
    errors = []

    def work():
        try:
            for _ in range(20):
                assert F.check_frames(blob, locs)[0] == bytes(4)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    ts = [threading.Thread(target=work) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors


# ---- gather_frames --------------------------------------------------------------------


def _uniform_run(n, plen, seed=0, field=b"f", shape_extra=(), base=0):
    """n frames of one field/shape (payloads of plen bytes) as encode_frames lays them out;
    returns blob, locs (list of INDEX_VALUE bytes), gidxs, payloads, template, payload_start."""
    rng = np.random.default_rng(seed)
    gidxs = [int(g) for g in rng.choice(1 << 40, n, replace=False)] if n else []
    pls = [rng.integers(0, 256, plen, dtype=np.uint8) for _ in range(n)]
    shape = (plen,) + tuple(shape_extra)
    blob, items = F.encode_frames(field, 0, 3, gidxs, [shape] * n, pls, 0, None, 7, base)
    pstart = layout.payload_offset(layout.HEADER_HEAD_SIZE + len(field) + 8 * len(shape))
    if n:
        off0 = layout.INDEX_VALUE.unpack(items[0][1])[1] - base
        head = blob[off0:off0 + pstart]
        template = (head[:layout.PREFIX_SIZE], head[layout.PREFIX_SIZE + 8:])
    else:
        head = F.frame_head(F.build_header(field, 0, 3, 0, shape), plen, 0, plen)
        template = (head[:layout.PREFIX_SIZE], head[layout.PREFIX_SIZE + 8:pstart])
    return blob, [v for _k, v in items], gidxs, pls, template, pstart


def gather_both(buf, locs, gidxs, template, pstart, plen, nrows, rows, verify=True):
    """gather_frames on both implementations into fresh outputs; results and outputs must agree."""
    out = []
    for mod in (F, P):
        dst = np.full((nrows, plen), 0xA5, dtype=np.uint8)
        try:
            r = ("ok", mod.gather_frames(buf, locs, np.asarray(gidxs, dtype=np.uint64), template, pstart, plen, dst,
                                         np.asarray(rows, dtype=np.int64), verify))
        except Exception as e:  # noqa: BLE001 - compared below
            r = ("err", type(e))
        out.append((r, dst))
    (rn, dn), (rp, dp) = out
    assert rn == rp, f"gather_frames: native {rn!r} != pure {rp!r}"
    assert np.array_equal(dn, dp), "gather_frames: outputs differ"
    return rn, dn


@st.composite
def gather_case(draw):
    n = draw(st.integers(0, 12))
    plen = draw(st.sampled_from([0, 1, 7, 8, 24, 56, 64, 100, 200]))
    blob, locs, gidxs, pls, template, pstart = _uniform_run(
        n, plen, seed=draw(st.integers(0, 1000)), field=draw(st.sampled_from([b"f", b"", b"field_" * 9])),
        shape_extra=tuple(draw(st.lists(st.just(1), max_size=3))))
    # any subset of the frames, in any order, into any distinct rows of a larger output
    pick = draw(st.permutations(range(n)))[:draw(st.integers(0, n))] if n else []
    nrows = len(pick) + draw(st.integers(0, 3))
    rows = draw(st.permutations(range(nrows)))[:len(pick)] if nrows else []
    return blob, locs, gidxs, pls, template, pstart, plen, pick, nrows, rows


def _args(case, buf=None):
    blob, locs, gidxs, _pls, template, pstart, plen, pick, nrows, rows = case
    return (blob if buf is None else buf, b"".join(locs[i] for i in pick), [gidxs[i] for i in pick], template,
            pstart, plen, nrows, rows)


@given(case=gather_case(), verify=st.booleans())
def test_gather_frames_valid_runs(case, verify):
    blob, locs, gidxs, pls, template, pstart, plen, pick, nrows, rows = case
    (kind, res), out = gather_both(*_args(case), verify=verify)
    assert kind == "ok" and res == (0, -1, 0, 0)
    for i, r in zip(pick, rows):
        assert bytes(out[r]) == pls[i].tobytes()


def _extents(case):
    blob, locs, *_ = case
    return [layout.INDEX_VALUE.unpack(v)[1:3] for v in locs]


@given(case=gather_case(), data=st.data(), verify=st.booleans())
def test_gather_frames_bit_flips(case, data, verify):
    blob = case[0]
    pick = case[7]
    assume(blob and pick)
    buf = bytearray(blob)
    flipped = set()
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, len(buf) - 1))
        buf[pos] ^= 1 << data.draw(st.integers(0, 7))
        flipped.add(pos)
    flipped = {p for p in flipped if buf[p] != blob[p]}
    (kind, res), _out = gather_both(*_args(case, bytes(buf)), verify=verify)
    assert kind == "ok"
    ext = _extents(case)
    pstart, plen = case[5], case[6]
    hit = []
    for i in case[7]:
        off, flen = ext[i]
        in_payload = {p for p in flipped if off + pstart <= p < off + pstart + plen}
        in_frame = {p for p in flipped if off <= p < off + flen}
        hit.append(bool(in_frame - (set() if verify else in_payload)))
    # every byte of a frame is checked (the payload by the CRC32C, when verifying)
    if any(hit):
        assert res[0] != 0 and res[1] == hit.index(True)
    else:
        assert res == (0, -1, 0, 0)


@given(case=gather_case(), data=st.data())
def test_gather_frames_truncated(case, data):
    blob = case[0]
    assume(blob and case[7])
    cut = data.draw(st.integers(0, len(blob)))
    (kind, res), _out = gather_both(*_args(case, blob[:cut]))
    ext = _extents(case)
    short = [ext[i][0] + ext[i][1] > cut for i in case[7]]
    if any(short):
        assert res[:2] == (layout.FRAME_TRUNCATED, short.index(True))
    else:
        assert res == (0, -1, 0, 0)


@given(buf=st.binary(max_size=3000), data=st.data(), verify=st.booleans())
def test_gather_frames_garbage(buf, data, verify):
    """Random index values (hostile offsets, lengths that sometimes match) over random bytes."""
    plen = data.draw(st.sampled_from([0, 8, 40, 100]))
    pstart = data.draw(st.sampled_from([64, 128]))
    flen = (pstart + plen + layout.TRAILER_SIZE + 63) & ~63
    n = data.draw(st.integers(0, 8))
    locs = b"".join(layout.INDEX_VALUE.pack(
        data.draw(st.integers(0, 2**32 - 1)),
        data.draw(st.one_of(st.integers(0, 2**64 - 1), st.integers(0, len(buf) + 64))),
        data.draw(st.one_of(st.just(flen), st.integers(0, 2**32 - 1))),
        data.draw(st.integers(0, 2**32 - 1))) for _ in range(n))
    template = (data.draw(st.binary(min_size=24, max_size=24)), data.draw(st.binary(min_size=pstart - 32,
                                                                                     max_size=pstart - 32)))
    gidxs = data.draw(st.lists(st.integers(0, 2**64 - 1), min_size=n, max_size=n))
    gather_both(buf, locs, gidxs, template, pstart, plen, n, list(range(n)), verify=verify)


def test_gather_frames_argument_errors():
    blob, locs, gidxs, pls, template, pstart = _uniform_run(4, 16)
    lb = b"".join(locs)
    g = np.asarray(gidxs, dtype=np.uint64)
    rows = np.arange(4, dtype=np.int64)

    def both(*a, **kw):
        out = []
        for mod in (F, P):
            try:
                out.append(("ok", mod.gather_frames(*a, **kw)))
            except Exception as e:  # noqa: BLE001
                out.append(("err", type(e)))
        assert out[0] == out[1], f"native {out[0]!r} != pure {out[1]!r}"
        return out[0]

    dst = np.zeros((4, 16), np.uint8)
    assert both(blob, lb, g, template, pstart, 16, dst, rows) == ("ok", (0, -1, 0, 0))
    assert both(buf=blob, locs=lb, gidxs=g, template=template, payload_start=pstart, payload_len=16, out=dst,
                rows=rows, verify=False) == ("ok", (0, -1, 0, 0))
    assert both(blob, lb, g, (template[0], template[1] + b"x"), pstart, 16, dst, rows) == ("err", ValueError)
    assert both(blob, lb, g, (template[0][:-1], template[1]), pstart, 16, dst, rows) == ("err", ValueError)
    assert both(blob, lb, g, (template[0],), pstart, 16, dst, rows) == ("err", ValueError)
    assert both(blob, lb[:-1], g, template, pstart, 16, dst, rows) == ("err", ValueError)
    assert both(blob, lb, g[:3], template, pstart, 16, dst, rows) == ("err", ValueError)
    assert both(blob, lb, g, template, pstart, 16, dst, rows[:3]) == ("err", ValueError)
    assert both(blob, lb, g, template, pstart, 16, dst[:, :15].copy(), rows) == ("err", ValueError)
    assert both(blob, lb, g, template, pstart, 16, dst, np.array([0, 1, 2, 4])) == ("err", IndexError)
    assert both(blob, lb, g, template, pstart, 16, dst, np.array([0, 1, -1, 2])) == ("err", IndexError)
    assert both(blob, lb, g, template, pstart, 16, bytes(64), rows) == ("err", TypeError)
    assert both(blob, lb, g, template, pstart, 16, dst[:, ::2], rows) == ("err", BufferError)
    assert both(np.frombuffer(blob, np.uint8)[::2], lb, g, template, pstart, 16, dst, rows) == ("err", BufferError)
    assert both(blob, lb, g, template, -1, 16, dst, rows) == ("err", OverflowError)
    assert both(blob, lb, g, template, pstart, 2**64, dst, rows) == ("err", OverflowError)
    assert both(blob, lb, g, template, pstart, 1.0, dst, rows) == ("err", TypeError)
    assert both(blob, lb, g, template, pstart, 16, dst) == ("err", TypeError)
    # index values as a LOC_DTYPE array (what the unit passes) and as bytes agree
    from tqstore._format.index import LOC_DTYPE
    arr = np.frombuffer(lb, LOC_DTYPE)
    d2 = np.zeros((4, 16), np.uint8)
    assert both(blob, arr, g, template, pstart, 16, d2, rows) == ("ok", (0, -1, 0, 0))
    assert [bytes(r) for r in d2] == [p.tobytes() for p in pls]


def test_gather_frames_large_releases_gil():
    blob, locs, gidxs, pls, template, pstart = _uniform_run(64, 4096, seed=5)
    lb = b"".join(locs)
    rows = list(range(63, -1, -1))
    (kind, res), out = gather_both(blob, lb, gidxs, template, pstart, 4096, 64, rows)
    assert res == (0, -1, 0, 0)
    assert all(bytes(out[63 - i]) == pls[i].tobytes() for i in range(64))
    buf = bytearray(blob)
    off = layout.INDEX_VALUE.unpack(locs[40])[1]
    buf[off + pstart + 100] ^= 0x40
    (kind, res), _ = gather_both(bytes(buf), lb, gidxs, template, pstart, 4096, 64, rows)
    assert res[:2] == (layout.FRAME_CRC, 40)
    (kind, res), _ = gather_both(bytes(buf), lb, gidxs, template, pstart, 4096, 64, rows, verify=False)
    assert res == (0, -1, 0, 0)
    # threads calling it at once over one buffer
    errors = []

    def work():
        try:
            for _ in range(20):
                dst = np.zeros((64, 4096), np.uint8)
                r = F.gather_frames(blob, lb, np.asarray(gidxs, np.uint64), template, pstart, 4096, dst,
                                    np.arange(64, dtype=np.int64))
                assert r == (0, -1, 0, 0) and bytes(dst[3]) == pls[3].tobytes()
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    ts = [threading.Thread(target=work) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors


# ---- copy_ranges, restamp_frames ------------------------------------------------------


def _frames_blob(n, seed, max_payload=20_000):
    rng = np.random.default_rng(seed)
    pls = [rng.integers(0, 256, int(m), dtype=np.uint8) for m in rng.integers(0, max_payload, n)]
    gidxs = [int(g) for g in rng.integers(0, 1 << 62, n)]
    blob, items = F.encode_frames(b"f" * int(rng.integers(1, 255)), 0, 2, gidxs, [(len(p),) for p in pls], pls, 0,
                                  None, 0, 0)
    offs, lens = index_offsets(items)
    return blob, np.asarray(offs, "<i8"), np.asarray(lens, "<i8"), gidxs


@given(st.integers(0, 40), st.integers(0, 2**32 - 1), st.data())
def test_copy_ranges_matches(n, seed, data):
    blob, offs, lens, _g = _frames_blob(n, seed, 3000)
    sel = np.asarray(data.draw(st.lists(st.integers(0, max(n - 1, 0)), max_size=n)) if n else [], np.int64)
    outs = [bytearray(int(lens[sel].sum()) + 7) for _ in range(2)]
    assert run_both("copy_ranges", blob, offs[sel], lens[sel], outs[0]) == ("ok", int(lens[sel].sum()))
    P.copy_ranges(blob, offs[sel], lens[sel], outs[1])
    assert outs[0] == outs[1] == b"".join(blob[o:o + m] for o, m in zip(offs[sel], lens[sel])) + bytes(7)


def test_copy_ranges_refuses_ranges_outside_and_short_destinations_before_copying():
    src = bytes(range(256)) * 4
    for offs, lens, dst in (([1000], [100], 200), ([-1], [4], 10), ([0, 10], [8, 2000], 4096), ([0], [64], 63)):
        out = bytearray(dst)
        assert run_both("copy_ranges", src, np.asarray(offs, "<i8"), np.asarray(lens, "<i8"), out) == \
            ("err", ValueError)
        assert out == bytearray(dst)
    assert run_both("copy_ranges", src, np.zeros(1, "<i8"), np.zeros(2, "<i8"), bytearray(4)) == ("err", ValueError)
    assert run_both("copy_ranges", src, np.zeros(1, "<i8"), np.ones(1, "<i8"), bytes(4)) == ("err", TypeError)


@given(st.integers(1, 30), st.integers(0, 2**32 - 1))
def test_restamp_frames_matches_and_the_frames_verify_under_their_new_gidx(n, seed):
    blob, offs, lens, gidxs = _frames_blob(n, seed)
    new = np.asarray([g + 1 + (i % 3) * (1 << 40) if i % 4 else g for i, g in enumerate(gidxs)], "<i8")
    bufs = [bytearray(blob), bytearray(blob)]
    crcs = run_both("restamp_frames", bufs[0], offs, lens, new)[1]
    P.restamp_frames(bufs[1], offs, lens, new)
    assert bufs[0] == bufs[1]
    loc = np.zeros(n, LOC_DTYPE)
    loc["offset"], loc["length"], loc["crc"] = offs, lens, np.frombuffer(crcs, "<u4")
    status, computed, trailers = F.check_frames(bytes(bufs[0]), loc, new.astype("<u8"))
    assert status == bytes(n) and computed == crcs == trailers
    for o, m, g in zip(offs.tolist(), lens.tolist(), new.tolist()):  # only the gidx and the trailer CRC change
        old, now = blob[o:o + m], bytes(bufs[0][o:o + m])
        cover = layout.payload_offset(int.from_bytes(old[6:8], "little")) + int.from_bytes(old[8:16], "little")
        assert now[24:32] == g.to_bytes(8, "little") and now[:24] == old[:24]
        assert now[32:cover] == old[32:cover] and now[cover + 4:] == old[cover + 4:]


def test_restamp_frames_keeps_a_damaged_frame_damaged_and_refuses_foreign_extents():
    blob, offs, lens, gidxs = _frames_blob(3, 7)
    buf = bytearray(blob)
    buf[int(offs[1]) + 200] ^= 1  # a flipped payload byte: its CRC must not become valid
    new = np.asarray([g + 5 for g in gidxs], "<i8")
    crcs = np.frombuffer(run_both("restamp_frames", buf, offs, lens, new)[1], "<u4")
    loc = np.zeros(3, LOC_DTYPE)
    loc["offset"], loc["length"], loc["crc"] = offs, lens, crcs
    assert list(F.check_frames(bytes(buf), loc, new.astype("<u8"))[0]) == [0, layout.FRAME_CRC, 0]
    for o, m in (([len(blob)], [64]), ([0], [40]), ([0], [int(lens[0]) + 64 * 1000])):
        b = bytearray(blob)
        assert run_both("restamp_frames", b, np.asarray(o, "<i8"), np.asarray(m, "<i8"), np.ones(1, "<i8")) == \
            ("err", ValueError)
        assert b == bytearray(blob)
    assert run_both("restamp_frames", bytes(blob), offs, lens, new) == ("err", TypeError)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.data())
def test_crc32c_frames_is_the_crc32c_of_the_frames_back_to_back(seed, data):
    """The CRC32C of a head followed by a selection of frames (in any order, repeated, large
    and small) equals the CRC32C of those bytes concatenated, whichever implementation."""
    n = data.draw(st.integers(1, 25))
    blob, offs, lens, _g = _frames_blob(n, seed, data.draw(st.sampled_from([64, 3000, 200_000])))
    sel = np.asarray(data.draw(st.lists(st.integers(0, n - 1), max_size=2 * n)), np.int64)
    head = data.draw(st.binary(max_size=100))
    got = run_both("crc32c_frames", blob, offs[sel], lens[sel], F.crc32c(head))
    assert got == ("ok", F.crc32c(head + b"".join(blob[o:o + m] for o, m in zip(offs[sel], lens[sel]))))
    assert run_both("crc32c_frames", blob, offs[sel], lens[sel]) == \
        ("ok", F.crc32c(b"".join(blob[o:o + m] for o, m in zip(offs[sel], lens[sel]))))


def test_crc32c_frames_trusts_the_trailer_and_refuses_foreign_extents():
    """Only checked frames: a flipped payload byte is not read (the trailer's CRC stands for
    the covered bytes), a flipped trailer or padding byte is; extents outside ``buf`` or that
    do not fit the frame's lengths raise ValueError."""
    blob, offs, lens, _g = _frames_blob(3, 11)
    want = F.crc32c(blob[:int(offs[2] + lens[2])])
    payload = bytearray(blob)
    payload[int(offs[1]) + 200] ^= 1
    assert run_both("crc32c_frames", payload, offs, lens) == ("ok", want)
    tail = bytearray(blob)
    tail[int(offs[1] + lens[1]) - 1] ^= 1  # the last padding byte of frame 1
    assert run_both("crc32c_frames", tail, offs, lens) == ("ok", F.crc32c(bytes(tail)))
    assert run_both("crc32c_frames", tail, offs, lens)[1] != want
    for o, m in (([len(blob)], [64]), ([0], [40]), ([0], [int(lens[0]) + 64 * 1000]), ([-64], [64])):
        assert run_both("crc32c_frames", blob, np.asarray(o, "<i8"), np.asarray(m, "<i8")) == ("err", ValueError)
    assert run_both("crc32c_frames", blob, offs, lens[:2]) == ("err", ValueError)
    assert run_both("crc32c_frames", blob, offs[:0], lens[:0], 12345) == ("ok", 12345)


def test_crc_shifts_past_512_mib_frames_are_right():
    """A frame of 2^29 bytes or more (rows may reach 4 GiB): crc32c_frames combines it right
    and restamp_frames leaves a trailer CRC the frame check accepts (x^(2^k) for every k a
    64-bit length reaches, not zlib's table wrapped at 32, which is wrong for CRC32C)."""
    flen = (1 << 29) + 128
    buf = np.zeros(flen, np.uint8)
    name = b"x"
    plen = flen - 64 - 64  # payload at 64, trailer at flen - 64, then zero padding
    buf[:24] = np.frombuffer(layout.PREFIX.pack(layout.FRAME_MAGIC, layout.FRAME_VERSION, 0, 12 + len(name),
                                                plen, plen), np.uint8)
    buf[24:24 + 12 + len(name)] = np.frombuffer(layout.HEADER_HEAD.pack(5, 2, 0, 0, len(name)) + name, np.uint8)
    buf[64:64 + 4096] = 7
    cover = 64 + plen
    buf[cover:cover + 8] = np.frombuffer(layout.TRAILER.pack(F.crc32c(buf[:cover]), layout.FRAME_END_MAGIC), np.uint8)
    offs, lens = np.zeros(1, "<i8"), np.full(1, flen, "<i8")
    loc = np.zeros(1, LOC_DTYPE)
    loc["length"], loc["crc"] = flen, F.crc32c(buf[:cover])
    assert F.check_frames(buf, loc, np.full(1, 5, "<u8"))[0] == bytes(1)
    head = F.crc32c(b"shard header")
    assert run_both("crc32c_frames", buf, offs, lens, head) == ("ok", F.crc32c(buf, head))
    crc = np.frombuffer(F.restamp_frames(buf, offs, lens, np.full(1, 1 << 40, "<i8")), "<u4")
    loc["crc"] = crc
    assert F.check_frames(buf, loc, np.full(1, 1 << 40, "<u8"))[0] == bytes(1)
    assert int(crc[0]) == F.crc32c(buf[:cover])


# ---- pread_ranges -------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.data())
def test_pread_ranges_reads_the_ranges_back_to_back_and_stops_at_the_end_of_the_file(tmp_path_factory, seed, data):
    rng = np.random.default_rng(seed)
    blob = rng.integers(0, 256, int(rng.integers(0, 300_000)), dtype=np.uint8).tobytes()
    path = tmp_path_factory.mktemp("pread") / "f"
    path.write_bytes(blob)
    n = data.draw(st.integers(0, 30))
    offs = np.asarray([data.draw(st.integers(0, len(blob) + 100)) for _ in range(n)], "<i8")
    lens = np.asarray([data.draw(st.integers(0, 70_000)) for _ in range(n)], "<i8")
    want = b""
    for o, m in zip(offs.tolist(), lens.tolist()):  # up to the first range the file does not hold whole
        want += blob[o:o + m]
        if m and o + m > len(blob):  # (an empty range reads nothing, so never meets the end)
            break
    fd = os.open(path, os.O_RDONLY)
    try:
        outs = [bytearray(int(lens.sum()) + 3) for _ in range(2)]
        assert run_both("pread_ranges", fd, offs, lens, outs[0]) == ("ok", len(want))
        P.pread_ranges(fd, offs, lens, outs[1])
    finally:
        os.close(fd)
    assert outs[0][:len(want)] == outs[1][:len(want)] == want


def test_pread_ranges_refuses_bad_arguments_before_reading(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(bytes(range(256)) * 16)
    fd = os.open(path, os.O_RDONLY)
    try:
        for offs, lens, dst in (([-1], [4], 10), ([0], [-4], 10), ([0, 10], [8, 20], 27)):
            out = bytearray(dst)
            assert run_both("pread_ranges", fd, np.asarray(offs, "<i8"), np.asarray(lens, "<i8"), out) == \
                ("err", ValueError)
            assert out == bytearray(dst)
        assert run_both("pread_ranges", fd, np.zeros(1, "<i8"), np.zeros(2, "<i8"), bytearray(4)) == ("err", ValueError)
        assert run_both("pread_ranges", fd, np.zeros(1, "<i8"), np.ones(1, "<i8"), bytes(4)) == ("err", TypeError)
    finally:
        os.close(fd)
    assert run_both("pread_ranges", fd, np.zeros(1, "<i8"), np.ones(1, "<i8"), bytearray(4)) == ("err", OSError)


# ---- leaf_room, leaf_columns (LMDB leaf pages) --------------------------------------


def leaf_run(mod, buf, pgnos, psize, allowed, room=None):
    """leaf_room then leaf_columns of ``mod`` into fresh outputs (sized by ``room``, (nodes,
    room), when given: leaf_columns then runs even where leaf_room fails); ``("ok", sizes,
    outputs...)`` or ``("err", type, message)`` of the first that raises."""
    try:
        sized = mod.leaf_room(buf, pgnos, psize)
    except Exception as e:  # noqa: BLE001 - compared by the caller
        if room is None:
            return ("err", type(e), str(e))
        sized = ("err", type(e), str(e))
    nodes, size = room if room is not None else sized
    outs = [np.zeros(size, np.uint8), np.zeros(nodes, "<i8"), np.zeros(size, np.uint8), np.zeros(nodes, "<i8"),
            np.zeros(nodes, "<u2")]
    try:
        nk, nv, big = mod.leaf_columns(buf, pgnos, psize, allowed, *outs)
    except Exception as e:  # noqa: BLE001
        return ("err", type(e), str(e))
    return ("ok", sized, nk, nv, big, outs[0][:nk].tobytes(), outs[1].tobytes(), outs[2][:nv].tobytes(),
            outs[3].tobytes(), outs[4].tobytes())


def leaf_both(buf, pgnos, psize=lmdb_helpers.PSIZE, allowed=1, room=None):
    got = [leaf_run(mod, buf, np.asarray(pgnos, "<i8"), psize, allowed, room) for mod in (F, P)]
    assert got[0] == got[1], f"native {str(got[0])[:300]} != pure {str(got[1])[:300]}"
    return got[0]


@pytest.fixture(scope="module")
def lmdb_file(tmp_path_factory):
    """A data file written by py-lmdb (tests/lmdb_helpers.fill_env): its bytes, its database
    names and their entries through lmdb."""
    path = tmp_path_factory.mktemp("leaf")
    names = lmdb_helpers.fill_env(path, random.Random(5))
    return (path / "data.mdb").read_bytes(), names, lmdb_helpers.through_lmdb(path, names)


def test_leaf_columns_of_real_files_match_and_read_what_lmdb_reads(lmdb_file):
    raw, names, want = lmdb_file
    pf = PageFile(raw)
    assert pf.psize == lmdb_helpers.PSIZE
    dbs = pf.databases()
    for name in names:
        if dbs[name].root == P_INVALID:
            assert not want[name]
            continue
        lv = pf.leaf_pages(dbs[name])
        ok, (nodes, room), nk, nv, big, keys, klens, values, vlens, flags = leaf_both(raw, lv)
        assert ok == "ok" and nodes == len(want[name]) and nk <= room and nv <= room
        klens, vlens = np.frombuffer(klens, "<i8"), np.frombuffer(vlens, "<i8")
        assert np.array_equal(klens, [len(k) for k, _ in want[name]])
        assert np.array_equal(vlens, [len(v) for _, v in want[name]])
        assert keys == b"".join(k for k, _ in want[name])
        rows = np.frombuffer(big, "<i8").reshape(-1, 3)
        is_big = (np.frombuffer(flags, "<u2") & 1) != 0
        assert np.array_equal(rows[:, 0], np.flatnonzero(is_big))
        assert values == b"".join(v for (_, v), b in zip(want[name], is_big) if not b)
        if name in (b"big", b"mixed"):  # values on overflow pages, where the inline ones leave off
            mv = memoryview(raw)
            assert len(rows) and all(mv[pg * pf.psize + 16:pg * pf.psize + 16 + n] == want[name][i][1]
                                     for i, pg, n in zip(rows[:, 0], rows[:, 2], vlens[rows[:, 0]]))
            inline_before = np.cumsum(np.where(is_big, 0, vlens)) - np.where(is_big, 0, vlens)
            assert np.array_equal(rows[:, 1], inline_before[rows[:, 0]])
    main = pf.leaf_pages(pf.main)  # named databases: F_SUBDATA nodes, allowed or not
    ok = leaf_both(raw, main, allowed=3)
    assert ok[0] == "ok" and set(np.frombuffer(ok[9], "<u2").tolist()) == {2}
    assert leaf_both(raw, main, allowed=1) == ("err", ValueError,
                                               f"leaf 0 (page {main[0]}) node 0: a node of unexpected flags")


@pytest.mark.parametrize("kind", sorted(lmdb_helpers.DAMAGE))
def test_leaf_columns_both_reject_each_damaged_page(lmdb_file, kind):
    raw, _names, _want = lmdb_file
    buf, pg = lmdb_helpers.damage(raw, b"small", kind)
    _pf, lv = lmdb_helpers.leaves(raw, b"small")  # (the page numbers of the whole file)
    i = int(np.flatnonzero(lv == pg)[0])
    for room in (None, (len(raw) // 8, len(raw))):  # leaf_columns checks alone what leaf_room does
        err = leaf_both(buf, lv, room=room)
        assert err[:2] == ("err", ValueError), err
        assert err[2].startswith(f"leaf {i} (page {pg})") and err[2].endswith(lmdb_helpers.DAMAGE[kind]), err


def test_leaf_columns_both_reject_bad_page_numbers_and_truncated_files(lmdb_file):
    raw, _names, _want = lmdb_file
    _pf, lv = lmdb_helpers.leaves(raw, b"small")
    npages = len(raw) // lmdb_helpers.PSIZE
    outside = "a page number outside the file"
    for bad in (npages, npages + 5, 1, 0, -1, -(1 << 63), (1 << 62)):
        pgnos = lv.copy()
        pgnos[3] = bad
        assert leaf_both(raw, pgnos) == ("err", ValueError, f"leaf 3 (page {bad}): {outside}")
    pgnos = lv.copy()
    pgnos[7] = pgnos[2]
    assert leaf_both(raw, pgnos) == ("err", ValueError, f"leaf 7 (page {lv[2]}): a page named twice in the tree")
    last = int(np.argmax(lv))  # the file cut inside the last leaf page, or at its start
    for cut in (int(lv[last]) * lmdb_helpers.PSIZE + 100, int(lv[last]) * lmdb_helpers.PSIZE):
        assert leaf_both(raw[:cut], lv) == ("err", ValueError, f"leaf {last} (page {lv[last]}): {outside}")
    assert leaf_both(b"", lv)[:2] == ("err", ValueError)
    assert leaf_both(raw, lv[:0])[:2] == ("ok", (0, 0))
    room = leaf_both(raw, lv)[1]  # the first failure in order: the headers before any node
    buf, pg = lmdb_helpers.damage(raw, b"small", "flags")
    buf = bytearray(buf)
    struct.pack_into("<Q", buf, int(lv[-1]) * lmdb_helpers.PSIZE, 7)
    assert leaf_both(bytes(buf), lv, room=room)[2].endswith("a page that is not the page its number names")


def test_leaf_columns_bit_flips_both_agree_never_crash(tmp_path):
    rng = random.Random(11)
    lmdb_helpers.fill_env(tmp_path, rng, scale=20)
    raw = (tmp_path / "data.mdb").read_bytes()
    pf = PageFile(raw)
    dbs = pf.databases()
    trees = [pf.leaf_pages(dbs[n]) for n in (b"small", b"mixed", b"wide", b"big")]
    for trial in range(300):
        lv = trees[trial % len(trees)]
        buf = bytearray(raw)
        for _ in range(rng.randrange(1, 6)):
            pg = int(lv[rng.randrange(len(lv))])
            at = pg * lmdb_helpers.PSIZE + rng.choice((0, 10, 11, 12, 13, 14, 15, 16, 17, 18,
                                                      rng.randrange(lmdb_helpers.PSIZE)))
            buf[at] ^= 1 << rng.randrange(8)
        leaf_both(bytes(buf), lv, allowed=rng.choice((1, 3)))
        leaf_both(bytes(buf), lv, room=(rng.randrange(0, 400), rng.randrange(0, 1 << 16)))  # outputs of any size


def test_leaf_columns_argument_errors_match(lmdb_file):
    raw, _names, _want = lmdb_file
    _pf, lv = lmdb_helpers.leaves(raw, b"small")
    nodes, room = F.leaf_room(raw, lv, lmdb_helpers.PSIZE)
    outs = [bytearray(room), np.zeros(nodes, "<i8"), bytearray(room), np.zeros(nodes, "<i8"), np.zeros(nodes, "<u2")]
    for psize in (0, 511, 4095, 3 << 12, 1 << 32):
        assert leaf_both(raw, lv, psize=psize)[:2] == ("err", ValueError)
    assert run_both("leaf_room", raw, lv, -1) == ("err", OverflowError)
    assert run_both("leaf_room", raw, lv, 4096.0) == ("err", TypeError)
    assert run_both("leaf_room", raw, lv.tobytes()[:-1], 4096) == ("err", ValueError)
    assert run_both("leaf_room", np.frombuffer(raw, np.uint8)[::2], lv, 4096) == ("err", BufferError)
    assert run_both("leaf_room", raw, lv) == ("err", TypeError)
    assert run_both("leaf_columns", raw, lv, 4096, 1 << 16, *outs) == ("err", OverflowError)
    assert run_both("leaf_columns", raw, lv, 4096, 1, bytes(room), *outs[1:]) == ("err", TypeError)
    assert run_both("leaf_columns", raw, lv, 4096, 1, *outs[:4]) == ("err", TypeError)
    for i, short in enumerate((bytearray(room - 1), np.zeros(nodes - 1, "<i8"), bytearray(room - 1),
                               np.zeros(nodes - 1, "<i8"), np.zeros(nodes - 1, "<u2"))):
        args = outs[:i] + [short] + outs[i + 1:]
        assert run_both("leaf_columns", raw, lv, 4096, 1, *args) == ("err", ValueError)
    assert run_both("leaf_columns", buf=raw, pgnos=lv, page_size=4096, allowed_flags=1, keys=outs[0], key_lens=outs[1],
                    values=outs[2], value_lens=outs[3], flags=outs[4])[0] == "ok"


def test_leaf_columns_in_threads(lmdb_file):
    raw, _names, _want = lmdb_file
    _pf, lv = lmdb_helpers.leaves(raw, b"small")
    want = leaf_run(F, raw, lv, lmdb_helpers.PSIZE, 1)
    errors = []

    def work():
        try:
            for _ in range(10):
                assert leaf_run(F, raw, lv, lmdb_helpers.PSIZE, 1) == want
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    ts = [threading.Thread(target=work) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors and want[0] == "ok"


# ---- place_keys -------------------------------------------------------------------------

_KEY_PARTS = st.lists(st.one_of(st.text(max_size=6), st.binary(max_size=6)), min_size=0, max_size=12)


def _place(mod, entries, prefix, slots, out):
    buf = b"".join(entries)
    lens = np.array([len(e) for e in entries], dtype=np.int64)
    return mod.place_keys(buf, lens, prefix, np.asarray(slots, dtype=np.int64), out)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(parts=_KEY_PARTS, pid=st.sampled_from(["p", "train", "\u00e9"]), data=st.data())
def test_place_keys_agrees_with_the_pure_path_and_with_a_plain_decode(parts, pid, data):
    """Every entry that is the prefix + UTF-8 without NUL lands decoded in its slot; the first
    that is not stops the run with its reason and index, in both implementations alike."""
    prefix = pid.encode() + b"\0"
    entries = [prefix + (p.encode() if isinstance(p, str) else p) if data.draw(st.booleans()) or not p
               else (p if isinstance(p, bytes) else p.encode()) for p in parts]
    n = len(entries)
    room = n + data.draw(st.integers(0, 3))
    slots = data.draw(st.permutations(list(range(room))))[:n] if room else []
    if n and data.draw(st.booleans()):  # a slot named twice, or out of range
        slots[data.draw(st.integers(0, n - 1))] = data.draw(st.sampled_from([slots[0], room, -1]))
    outs = []
    for mod in (F, P):
        out = [None] * room
        outs.append((_place(mod, entries, prefix, slots, out), out))
    assert outs[0] == outs[1]
    (status, i), out = outs[0]
    want = [None] * room
    for j, e in enumerate(entries):  # the rules, one entry at a time
        k = e[len(prefix):]
        if not e.startswith(prefix):
            code = 1
        elif b"\0" in k:
            code = 2
        elif not 0 <= slots[j] < room or want[slots[j]] is not None:
            code = 3
        else:
            try:
                want[slots[j]] = k.decode("utf-8")
                continue
            except UnicodeDecodeError:
                code = 4
        assert (status, i) == (code, j)
        break
    else:
        assert (status, i) == (0, n)
    assert out == want


def test_place_keys_refuses_bad_arguments_before_placing():
    ok = (b"p\0ab", np.array([4], np.int64), b"p\0", np.array([0], np.int64))
    for mod in (F, P):  # (a fresh list each: the call fills it)
        out = [None]
        assert mod.place_keys(*ok, out) == (0, 1) and out == ["ab"]
    assert run_both("place_keys", b"p\0a", *ok[1:], [None]) == ("err", ValueError)  # lens run past buf
    assert run_both("place_keys", ok[0], ok[1], ok[2], np.array([0, 1], np.int64), [None]) == ("err", ValueError)
    assert run_both("place_keys", *ok, (None,)) == ("err", TypeError)
    assert run_both("place_keys", ok[0], np.array([4], np.int32), *ok[2:], [None]) == ("err", ValueError)


# ---- pwrite_ranges ------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.data())
def test_pwrite_ranges_writes_the_ranges_back_to_back_from_pos(tmp_path_factory, seed, data):
    rng = np.random.default_rng(seed)
    src = rng.integers(0, 256, int(rng.integers(1, 300_000)), dtype=np.uint8).tobytes()
    n = data.draw(st.integers(0, 2100))  # (past one vectored write of 1024 ranges)
    offs = rng.integers(0, len(src), n).astype("<i8")
    lens = np.minimum(rng.integers(0, 300, n), len(src) - offs).astype("<i8")
    pos = data.draw(st.integers(0, 5000))
    writeback = data.draw(st.sampled_from([0, 1, 4096, 1 << 20]))
    want = b"".join(src[o:o + m] for o, m in zip(offs.tolist(), lens.tolist()))
    d = tmp_path_factory.mktemp("pwrite")
    for mod in (F, P):
        path = d / mod.IMPLEMENTATION
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            assert mod.pwrite_ranges(fd, src, offs, lens, pos, writeback) == len(want)
        finally:
            os.close(fd)
        got = path.read_bytes()
        assert got[pos:] == want and got[:pos] == bytes(len(got[:pos]))  # (a hole before pos, when anything follows)


def test_pwrite_ranges_refuses_bad_arguments_before_writing(tmp_path):
    path = tmp_path / "f"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    src = bytes(range(256))
    try:
        for offs, lens, pos in (([0, 250], [4, 10], 0), ([-1], [4], 0), ([0], [-4], 0), ([0], [4], -1),
                                ([257], [0], 0)):
            assert run_both("pwrite_ranges", fd, src, np.asarray(offs, "<i8"), np.asarray(lens, "<i8"), pos, 0) == \
                ("err", ValueError)
        assert run_both("pwrite_ranges", fd, src, np.zeros(1, "<i8"), np.zeros(2, "<i8"), 0, 0) == ("err", ValueError)
        assert run_both("pwrite_ranges", fd, src, np.zeros(1, "<i4"), np.ones(1, "<i8"), 0, 0) == ("err", ValueError)
        assert os.path.getsize(path) == 0  # nothing was written
        assert run_both("pwrite_ranges", fd, src, np.asarray([3], "<i8"), np.asarray([0], "<i8"), 0, 0) == ("ok", 0)
    finally:
        os.close(fd)
    ro = os.open(path, os.O_RDONLY)
    try:  # a failed write: OSError (here EBADF: a descriptor not open for writing)
        assert run_both("pwrite_ranges", ro, src, np.zeros(1, "<i8"), np.ones(1, "<i8"), 0, 0) == ("err", OSError)
    finally:
        os.close(ro)
    assert run_both("pwrite_ranges", ro, src, np.zeros(1, "<i8"), np.ones(1, "<i8"), 0, 0) == ("err", OSError)
