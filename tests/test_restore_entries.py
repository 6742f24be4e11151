"""A unit's records of a selective restore (docs/FORMAT.md, "Unit index", "Selective
restores"): one staged batch entry per import window and one published batch entry per
8,192 frames, decoded strictly; per-frame entries that an older tqstore wrote (kinds 0 and
1) still publish, unpublish and settle; a power loss that shortens the active segment drops
the staged frames past its end and keeps the rest.
"""
from __future__ import annotations

import lmdb
import numpy as np
import pytest

from tqstore import CorruptionError, FormatVersionError
from tqstore._format import unit_records as UR
from tqstore._format.index import LOC_DTYPE
from tqstore.testing._conformance_restore import UnitRestoreTests
from tqstore.testing._conformance_unit import UnitPortTests
from tqstore.unit import Unit


def _keys(n):
    return [int(g).to_bytes(8, "big") + f"field{g % 3}".encode() for g in range(n)]


def _locs(n):
    a = np.zeros(n, LOC_DTYPE)
    a["seg"], a["offset"], a["length"], a["crc"] = 1, np.arange(n) * 64 + 64, 64, np.arange(n)
    return a


def test_a_batch_value_round_trips_keys_locations_and_presence():
    keys, locs = _keys(5), _locs(5)
    present = np.array([1, 0, 1, 1, 0], bool)
    k, l, p = UR.decode_restore_batch(UR.encode_restore_batch(keys, locs, present))
    assert k == keys and l.tobytes() == locs.tobytes() and p.tolist() == present.tolist()
    k, l, p = UR.decode_restore_batch(UR.encode_restore_batch([], np.zeros(0, LOC_DTYPE)))
    assert k == [] and len(l) == 0 and len(p) == 0
    key = UR.restore_batch_key(7, UR.RESTORE_STAGED_BATCH, 3)
    assert UR.decode_restore_entry_key(key) == (7, UR.RESTORE_STAGED_BATCH, (3).to_bytes(4, "big"))


@pytest.mark.parametrize("damage", ["truncated", "longer", "presence", "short key", "count"])
def test_a_malformed_batch_value_is_refused(damage):
    raw = bytearray(UR.encode_restore_batch(_keys(3), _locs(3)))
    n = 3
    if damage == "truncated":
        raw = raw[:-1]
    elif damage == "longer":
        raw += b"x"
    elif damage == "presence":
        raw[4 + 20 * n] = 2
    elif damage == "short key":
        raw[4 + 21 * n:4 + 21 * n + 2] = (3).to_bytes(2, "little")
    else:
        raw[:4] = (UR.RESTORE_BATCH_MAX + 1).to_bytes(4, "little")
    with pytest.raises(UR.RecordError):
        UR.decode_restore_batch(bytes(raw))


def test_a_batch_key_of_the_wrong_length_is_refused():
    for bad in (UR.restore_prefix(1, UR.RESTORE_STAGED_BATCH) + b"\0\0\0",
                UR.restore_prefix(1, UR.RESTORE_PUBLISHED_BATCH) + b"\0" * 5, UR.restore_prefix(1, 9) + b"\0" * 4):
        with pytest.raises(UR.RecordError):
            UR.decode_restore_entry_key(bad)


def _rewrite(unit_dir, fn):
    """Rewrite the unit index's ``restore`` database with ``fn(items) -> items`` (the unit closed)."""
    env = lmdb.open(str(unit_dir / "index"), max_dbs=8, subdir=True)
    try:
        db = env.open_db(b"restore")
        with env.begin(write=True) as txn:
            items = [(bytes(k), bytes(v)) for k, v in txn.cursor(db)]
            txn.drop(db, delete=False)
            for k, v in fn(items):
                txn.put(k, v, db=db)
        return items
    finally:
        env.close()


def _per_frame(items):
    """Batch entries turned into the per-frame kinds 0 and 1 an older tqstore wrote."""
    out = []
    for k, v in items:
        tag, kind, _rest = UR.decode_restore_entry_key(k)
        if kind not in UR.RESTORE_BATCH_KINDS:
            out.append((k, v))
            continue
        keys, locs, present = UR.decode_restore_batch(v)
        old_kind = UR.RESTORE_STAGED if kind == UR.RESTORE_STAGED_BATCH else UR.RESTORE_PUBLISHED
        for ik, loc, p in zip(keys, locs, present):
            out.append((UR.restore_entry_key(tag, old_kind, ik), loc.tobytes() if p else b""))
    return out


class TestUnitRestoreEntries:
    """Against the local Unit (the records are its own; the port's behaviour is the
    conformance suite's)."""

    UNIT_ID, NUM_UNITS = 1, 2
    _source = UnitRestoreTests._source
    _plan = UnitRestoreTests._plan
    g = UnitPortTests.g
    write = staticmethod(UnitPortTests.write)
    payloads = staticmethod(UnitPortTests.payloads)

    @pytest.fixture(autouse=True)
    def _units(self):
        self._open = []
        yield
        for u in self._open:
            u.close()

    def unit(self, tmp_path):
        u = Unit(tmp_path / "unit", self.UNIT_ID)
        self._open.append(u)
        return u

    def reopen(self, u):
        u.close()
        return self.unit(u.path.parent)

    def _kinds(self, u):
        u.close()
        got = sorted({UR.decode_restore_entry_key(k)[1] for k, _v in _rewrite(u.path, lambda items: items)})
        return got, self.reopen(u)

    def test_an_import_writes_one_batch_entry_and_publish_one_published_batch(self, tmp_path):
        u = self.unit(tmp_path)
        d, locs, src = self._source(tmp_path)
        dst = self.g(0, 1, 2, 3)
        u.import_restore(7, self._plan(d, locs, src, dst))
        kinds, u = self._kinds(u)
        assert kinds == [UR.RESTORE_STAGED_BATCH]
        assert u.publish_restore(7) == 4
        kinds, u = self._kinds(u)
        assert kinds == [UR.RESTORE_PUBLISHED_BATCH]
        assert u.settle_restore(7, committed=True) == 4
        kinds, u = self._kinds(u)
        assert kinds == [UR.RESTORE_CLOSED] and u.verify() == []

    def _format(self, u):
        u.close()
        env = lmdb.open(str(u.path / "index"), max_dbs=8, readonly=True, lock=False)
        try:
            with env.begin() as txn:
                raw = txn.get(UR.META_FORMAT, db=env.open_db(b"meta", txn=txn, create=False))
        finally:
            env.close()
        return UR.decode_format(raw), self.reopen(u)

    @pytest.mark.parametrize("committed", [True, False])
    def test_the_index_is_version_2_exactly_while_batch_entries_are_in_it(self, tmp_path, committed):
        # a reader of version 1 knows only the per-frame kinds: it must reject the index by
        # name while batches are pending, not miss them; once settled, version 1 reads it again
        u = self.unit(tmp_path)
        d, locs, src = self._source(tmp_path)
        version, u = self._format(u)
        assert version == UR.UNIT_INDEX_FORMAT
        u.import_restore(7, self._plan(d, locs, src, self.g(0, 1, 2, 3)))
        version, u = self._format(u)
        assert version == UR.UNIT_INDEX_FORMAT_BATCHES
        assert u.publish_restore(7) == 4
        version, u = self._format(u)
        assert version == UR.UNIT_INDEX_FORMAT_BATCHES
        assert u.settle_restore(7, committed=committed) == 4
        version, u = self._format(u)
        assert version == UR.UNIT_INDEX_FORMAT and u.verify() == []

    def test_an_unknown_unit_index_version_is_refused_by_name(self, tmp_path):
        u = self.unit(tmp_path)
        u.close()
        env = lmdb.open(str(u.path / "index"), max_dbs=8)
        with env.begin(write=True) as txn:
            txn.put(UR.META_FORMAT, UR.encode_format(3), db=env.open_db(b"meta", txn=txn))
        env.close()
        with pytest.raises(FormatVersionError, match="reads 1, 2"):
            Unit(u.path, self.UNIT_ID)

    def test_per_frame_entries_of_an_older_version_publish_unpublish_and_settle(self, tmp_path):
        u = self.unit(tmp_path)
        d, locs, src = self._source(tmp_path)
        dst = self.g(0, 1, 2, 3)
        self.write(u, "x", np.full((1, 10), -1, np.int64), dst[:1])
        old = self.payloads(u, dst[:1], "x")
        u.import_restore(7, self._plan(d, locs, src, dst))
        u.close()
        _rewrite(u.path, _per_frame)
        u = self.reopen(u)
        assert u.restore_tags() == [7] and sorted(u.keys()) == [(dst[0], "x")]
        assert u.publish_restore(7) == 4
        want = [np.arange(i * 10, i * 10 + 10, dtype=np.int64).tobytes() for i in range(4)]
        assert self.payloads(u, dst, "x") == want
        u.close()
        _rewrite(u.path, _per_frame)  # published entries as an older version wrote them
        u = self.reopen(u)
        assert u.unpublish_restore(7) == 4 and self.payloads(u, dst[:1], "x") == old
        assert sorted(u.keys()) == [(dst[0], "x")]
        assert u.publish_restore(7) == 4 and self.payloads(u, dst, "x") == want
        u.close()
        _rewrite(u.path, _per_frame)
        u = self.reopen(u)
        assert u.settle_restore(7, committed=False) == 4
        assert self.payloads(u, dst[:1], "x") == old and sorted(u.keys()) == [(dst[0], "x")]
        assert u.verify() == []

    def test_a_malformed_batch_entry_is_corruption_naming_the_index(self, tmp_path):
        u = self.unit(tmp_path)
        d, locs, src = self._source(tmp_path)
        u.import_restore(7, self._plan(d, locs, src, self.g(0, 1, 2, 3)))
        u.close()
        _rewrite(u.path, lambda items: [(k, v[:-1]) for k, v in items])
        with pytest.raises(CorruptionError, match="restore entry"):
            u = self.reopen(u)
            u.publish_restore(7)

    def test_a_shortened_segment_drops_only_the_staged_frames_past_its_end(self, tmp_path):
        u = self.unit(tmp_path)
        d, locs, src = self._source(tmp_path)
        dst = self.g(0, 1, 2, 3)
        u.import_restore(7, self._plan(d, locs, src, dst))
        u.close()
        segs = sorted(p for p in u.path.iterdir() if p.name.startswith("seg-"))
        last = segs[-1]
        size = last.stat().st_size
        cut = size - int(locs["length"][-1])  # the last staged frame is lost (power loss)
        with open(last, "r+b") as f:
            f.truncate(cut)
        u = self.reopen(u)
        assert u.restore_tags() == [7]
        assert u.publish_restore(7) == 3
        want = [np.arange(i * 10, i * 10 + 10, dtype=np.int64).tobytes() for i in range(3)]
        assert self.payloads(u, dst[:3], "x") == want
        assert u.settle_restore(7, committed=True) == 3 and u.verify() == []
