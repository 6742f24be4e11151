"""Record frames: round trip, and every torn or bit-flipped frame is rejected.

Runs with the C record path and with the pure-Python one (``record_path`` fixture).
"""
from __future__ import annotations

import math
import struct

import crc32c as crc32c_pkg
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tqstore import _native
from tqstore._format.frame import decode_frame, encode_parts, parse_head
from tqstore._format.layout import (
    ALIGN, CODEC_RAW, DTYPE_ITEMSIZE, CODEC_ZSTD, FRAME_VERSION, INDEX_KEY_HEAD, INDEX_VALUE, KIND_NDARRAY, KIND_TENSOR, KIND_VALUE,
    PREFIX_SIZE, TRAILER,
)
from tqstore.errors import CorruptionError, FormatVersionError

pytestmark = pytest.mark.usefixtures("record_path")

FAST = settings(deadline=None, max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])


def make_frame(payload: bytes, *, field="f", kind=KIND_TENSOR, dtype=2, gidx=7, shape=None, codec=CODEC_RAW,
               raw_len=None) -> bytes:
    if shape is None:
        shape = (len(payload),)  # uint8 elements: consistent with the payload length
    head, tail, crc, flen = encode_parts(field.encode(), kind, dtype, gidx, shape, payload, codec, raw_len)
    frame = bytes(head) + bytes(payload) + bytes(tail)
    assert len(frame) == flen
    return frame


fields = st.text(min_size=1, max_size=20).filter(lambda s: len(s.encode()) <= 255)
shapes = st.lists(st.integers(0, 2**40), max_size=5).map(tuple)


@FAST
@given(payload=st.binary(max_size=3000), field=fields, kind=st.sampled_from([KIND_TENSOR, KIND_NDARRAY, KIND_VALUE]),
       dtype=st.integers(1, 17), gidx=st.integers(0, 2**64 - 1), shape=shapes, lead=st.integers(0, 3))
def test_frame_round_trips_every_header_field(payload, field, kind, dtype, gidx, shape, lead):
    if kind != KIND_VALUE:  # a tensor's payload is its elements: itemsize * prod(shape) bytes
        shape = tuple(d % 7 for d in shape[:3])
        n = DTYPE_ITEMSIZE[dtype] * math.prod(shape)
        payload = (payload * (n // max(len(payload), 1) + 1))[:n] if payload else bytes(n)
    frame = make_frame(payload, field=field, kind=kind, dtype=dtype, gidx=gidx, shape=shape)
    assert len(frame) % ALIGN == 0
    buf = b"\xee" * (lead * ALIGN) + frame + b"\xee" * 64  # frames live inside larger segment buffers
    fr = decode_frame(buf, lead * ALIGN, len(frame))
    assert (fr.field, fr.kind, fr.dtype, fr.gidx, fr.shape, fr.codec) == (field, kind, dtype, gidx, shape, CODEC_RAW)
    assert bytes(fr.payload) == payload
    assert fr.raw_len == len(payload)
    h = parse_head(frame, 0, len(frame))
    assert h.payload_start % ALIGN == 0 and h.payload_len == len(payload)
    assert fr.crc == struct.unpack_from("<I", frame, h.payload_start + h.payload_len)[0]
    assert fr.crc == crc32c_pkg.crc32c(frame[:h.payload_start + h.payload_len])


@pytest.mark.parametrize("kind, dtype, shape, payload, raw_len", [
    (KIND_TENSOR, 6, (3,), b"x" * 23, None),  # int64[3] needs 24 bytes
    (KIND_NDARRAY, 9, (2, 2), b"x" * 17, None),
    (KIND_TENSOR, 0, (1,), b"x", None),  # no dtype: no elements
    (KIND_TENSOR, 99, (1,), b"x", None),  # unknown dtype code
    (KIND_TENSOR, 2, (2**63, 2), b"", None),  # overflows 64 bits
    (KIND_VALUE, 0, (), b"null", 5),  # raw codec: raw_len must be P
])
def test_header_inconsistent_with_payload_length_raises(kind, dtype, shape, payload, raw_len):
    frame = make_frame(payload, kind=kind, dtype=dtype, shape=shape, raw_len=raw_len)
    with pytest.raises(CorruptionError, match="disagrees with its header"):
        decode_frame(frame, 0, len(frame))


@FAST
@given(data=st.one_of(st.binary(max_size=4000), st.integers(0, 50).map(lambda n: bytes(range(50)) * n)),
       level=st.integers(1, 5))
def test_zstd_frame_round_trips_with_codec_flag(data, level):
    z = zstandard.ZstdCompressor(level=level).compress(data)
    frame = make_frame(z, codec=CODEC_ZSTD, raw_len=len(data), shape=(len(data),), dtype=2)
    fr = decode_frame(frame, 0, len(frame))
    assert fr.codec == CODEC_ZSTD
    assert fr.raw_len == len(data)
    assert zstandard.ZstdDecompressor().decompress(fr.payload, max_output_size=fr.raw_len) == data


@FAST
@given(payloads=st.lists(st.binary(max_size=300), min_size=1, max_size=20), base=st.integers(0, 1000).map(lambda k: k * 64))
def test_bulk_encoded_frames_decode_and_index_entries_point_at_them(payloads, base):
    gidxs = list(range(100, 100 + len(payloads)))
    blob, items = _native.encode_frames(b"tok", KIND_TENSOR, 2, gidxs, [(len(p),) for p in payloads], payloads, 0,
                                        None, 5, base)
    buf = b"\0" * base + bytes(blob)
    assert len(items) == len(payloads)
    for g, p, (key, value) in zip(gidxs, payloads, items):
        assert key == INDEX_KEY_HEAD.pack(g) + b"tok"
        seg, off, flen, crc = INDEX_VALUE.unpack(value)
        assert seg == 5
        fr = decode_frame(buf, off, flen, expected_crc=crc)
        assert (fr.gidx, fr.field, bytes(fr.payload), fr.shape) == (g, "tok", p, (len(p),))


def _sample_frames():
    z = zstandard.ZstdCompressor().compress(b"abc" * 40)
    return [
        make_frame(bytes(range(40))),  # payload smaller than the padding
        make_frame(b"\x01" * 70, field="prompt_ids", shape=(2, 5, 7), dtype=2),
        make_frame(b'{"a":[1,2]}', field="meta", kind=KIND_VALUE, dtype=0, shape=()),
        make_frame(b"", shape=(0,)),
        make_frame(z, codec=CODEC_ZSTD, raw_len=120, dtype=2, shape=(120,)),
    ]


@pytest.mark.parametrize("i", range(5))
def test_every_truncation_of_a_frame_raises_corruption(i):
    frame = _sample_frames()[i]
    for k in range(len(frame)):
        cut = frame[:k]
        with pytest.raises(CorruptionError):
            decode_frame(cut, 0, k)  # extent recorded as what is there
        with pytest.raises(CorruptionError):
            decode_frame(cut, 0, len(frame))  # extent from the index, bytes missing
    # a frame followed by the start of another frame, read with a short extent
    with pytest.raises(CorruptionError):
        decode_frame(frame + frame, 0, len(frame) - ALIGN)


@pytest.mark.parametrize("i", range(5))
def test_every_single_bit_flip_of_a_frame_raises_corruption(i):
    frame = _sample_frames()[i]
    fr = decode_frame(frame, 0, len(frame))
    good_crc = fr.crc
    for byte in range(len(frame)):
        for bit in range(8):
            bad = bytearray(frame)
            bad[byte] ^= 1 << bit
            with pytest.raises(CorruptionError) as ei:
                decode_frame(bytes(bad), 0, len(frame))
            assert ei.value.offset == 0
            # and with the index's CRC too (the path readers take)
            with pytest.raises(CorruptionError):
                decode_frame(bytes(bad), 0, len(frame), expected_crc=good_crc)


@settings(deadline=None, max_examples=200, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payload=st.binary(min_size=0, max_size=500), pos=st.integers(0, 10**6), bit=st.integers(0, 7))
def test_random_bit_flip_never_returns_data(payload, pos, bit):
    frame = bytearray(make_frame(payload, shape=(len(payload),), dtype=2))
    pos %= len(frame)
    frame[pos] ^= 1 << bit
    with pytest.raises(CorruptionError):
        decode_frame(bytes(frame), 0, len(frame))


@settings(deadline=None, max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(junk=st.binary(max_size=400), length=st.integers(0, 500), offset=st.integers(-5, 500))
def test_garbage_raises_corruption_and_nothing_else(junk, length, offset):
    with pytest.raises(CorruptionError):
        decode_frame(junk, offset, length)


def _with_version(frame: bytes, version: int) -> bytes:
    """Rewrite the version byte and re-seal the CRC, so only the version is wrong."""
    bad = bytearray(frame)
    bad[4] = version
    h = parse_head(bytes(frame), 0, len(frame))
    end = h.payload_start + h.payload_len
    crc = crc32c_pkg.crc32c(bytes(bad[:end]))
    TRAILER.pack_into(bad, end, crc, bytes(frame[end + 4:end + 8]))
    return bytes(bad)


@pytest.mark.parametrize("version", [0, FRAME_VERSION + 1, 255])
def test_unknown_format_version_raises_format_version_error(version):
    frame = _with_version(make_frame(b"x" * 10), version)
    with pytest.raises(FormatVersionError, match=f"version {version}"):
        decode_frame(frame, 0, len(frame))
    with pytest.raises(FormatVersionError):
        parse_head(frame, 0, len(frame))


def test_crc_mismatch_names_offset_and_both_crcs():
    frame = bytearray(b"\0" * 128 + make_frame(b"payload!" * 4))
    frame[128 + 70] ^= 0x10  # inside the payload
    with pytest.raises(CorruptionError) as ei:
        decode_frame(bytes(frame), 128, len(frame) - 128, path="/x/seg-00000001.tqs")
    e = ei.value
    assert e.offset == 128 and e.path == "/x/seg-00000001.tqs"
    assert e.expected_crc is not None and e.actual_crc is not None and e.expected_crc != e.actual_crc
    assert "seg-00000001.tqs" in str(e) and "offset 128" in str(e)
    assert isinstance(e, ValueError)


def test_index_crc_naming_another_frame_raises():
    a, b = make_frame(b"a" * 10), make_frame(b"b" * 10)
    crc_b = decode_frame(b, 0, len(b)).crc
    with pytest.raises(CorruptionError, match="not the one the index names"):
        decode_frame(a, 0, len(a), expected_crc=crc_b)


def test_payload_is_a_view_not_a_copy():
    buf = bytearray(make_frame(b"z" * 100))
    fr = decode_frame(buf, 0, len(buf))
    start = parse_head(bytes(buf), 0, len(buf)).payload_start
    buf[start] = ord("Q")
    assert bytes(fr.payload[:1]) == b"Q"
    assert PREFIX_SIZE < start


@pytest.mark.parametrize("shape, itemsize", [((16,), 8), ((), 4), ((3,), 1), ((0,), 8)])
def test_run_locs_names_each_frame_of_a_uniform_run_as_its_index_value(shape, itemsize):
    from tqstore._format.frame import run_locs
    from tqstore._format.index import LOC_DTYPE

    per = itemsize * math.prod(shape)
    gidxs = [5, 9, 1 << 33, 2]
    payloads = [bytes([i]) * per for i in range(4)]
    base = (1 << 32) + 64
    blob, items = _native.encode_frames(b"ids", KIND_TENSOR, 1, gidxs, [shape] * 4, payloads, 0, None, 3, base)
    got = run_locs(blob, 4, 3, base)
    assert got is not None and got.tobytes() == b"".join(v for _k, v in items) and got.dtype == LOC_DTYPE


def test_run_locs_refuses_frames_of_different_lengths():
    from tqstore._format.frame import run_locs

    blob, _ = _native.encode_frames(b"x", KIND_TENSOR, 1, [1, 2], [(3,), (67,)], [bytes(3), bytes(67)], 0, None, 1, 0)
    assert run_locs(blob, 2, 1, 0) is None
    blob, _ = _native.encode_frames(b"x", KIND_TENSOR, 1, [1, 2], [(3,), (4,)], [bytes(3), bytes(4)], 0, None, 1, 0)
    assert run_locs(blob, 2, 1, 0) is None  # one length, other prefixes
    assert run_locs(b"", 0, 1, 0) is None
