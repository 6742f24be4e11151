"""Every read path rejects a damaged frame, including bytes outside the CRC-covered range."""
import pytest
import torch

import tqstore
from tqstore.errors import CorruptionError


def _flip(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x01]))


@pytest.mark.parametrize("where", ["head_padding", "tail_padding"])
def test_large_jagged_get_rejects_a_flipped_padding_byte(tmp_path, where):
    rows = [torch.randn(5000 + 3 * i) for i in range(3)]  # large frames of different lengths
    with tqstore.open(tmp_path / "s") as s:
        s.kv_batch_put(["a", "b", "c"], "p", fields={"j": rows})
        unit = s.units[0]
        g = s.controller.gidxs_for_keys("p", ["a"])[0]
        loc = unit.locate([g], "j")[0]
        path = unit.describe(loc)
    # head padding: the header ends well before byte 63 of the frame; the tail padding ends the frame
    _flip(path, loc.offset + 60 if where == "head_padding" else loc.offset + loc.length - 1)
    with tqstore.open(tmp_path / "s") as s:
        with pytest.raises(CorruptionError) as e:
            s.kv_batch_get(["a", "b", "c"], "p")
        assert str(path) in str(e.value)
        # the other rows are intact and still readable
        got = s.kv_batch_get(["b", "c"], "p")["j"]
        assert all(torch.equal(x, y) for x, y in zip(got.unbind(), rows[1:]))


def test_unit_index_of_an_unknown_format_version_is_rejected_by_name(tmp_path):
    import lmdb

    from tqstore.errors import FormatVersionError

    with tqstore.open(tmp_path / "s", num_units=2) as s:
        s.kv_batch_put(["a"], "p", fields={"x": torch.zeros(1, 4)})
        index = s.units[1].path / "index"
    env = lmdb.open(str(index), max_dbs=8)
    with env.begin(write=True) as txn:
        txn.put(b"format", b"7", db=env.open_db(b"meta", txn=txn))
    env.close()
    with pytest.raises(FormatVersionError, match="unit index format"):
        tqstore.open(tmp_path / "s")


def test_segment_of_an_unknown_format_version_is_rejected_by_name_on_open(tmp_path):
    import struct

    from tqstore import _native
    from tqstore.errors import FormatVersionError

    with tqstore.open(tmp_path / "s") as s:
        s.kv_batch_put(["a"], "p", fields={"x": torch.zeros(1, 4)})
        seg = next(s.units[0].path.glob("seg-*.tqs"))
    with open(seg, "r+b") as f:
        head = bytearray(f.read(64))
        head[4:6] = struct.pack("<H", 9)
        head[60:64] = _native.crc32c(bytes(head[:60])).to_bytes(4, "little")
        f.seek(0)
        f.write(head)
    with pytest.raises(FormatVersionError, match="segment format version 9"):
        tqstore.open(tmp_path / "s")
