"""A unit's location cache (tqstore.unit_locs) never answers a lookup with a location the index
no longer holds: after writes, overwrites (settled either way), deletes, compaction, seals and
snapshots, and after index changes made by code that does not tell it, ``lookup`` of the latest
state equals what the index holds (``locate`` reads the index itself), and reads return the
latest values.
"""
from __future__ import annotations

import random

import pytest
import torch

from tqstore._format.index import INDEX_KEY_HEAD, Loc
from tqstore.torch_adapter import row_to_object, to_column
from tqstore.unit import Unit

pytestmark = pytest.mark.usefixtures("record_path")

SEG = 1 << 16


def put(u: Unit, gidxs, fields, *, fresh=True, token=None):
    n = len(gidxs)
    cols = [to_column(f, v, n) for f, v in fields.items()]
    return u.write([(c, list(range(n)), list(gidxs)) for c in cols], fresh=fresh, token=token)


def value(u: Unit, g: int, field: str):
    """The row's value as the latest lookup names it (cache or index), read and CRC-checked."""
    locs = u.lookup([g], [field])[field]
    assert locs is not None, (g, field)
    fr = u.read_frame(Loc._make(locs[0].tolist()))
    return row_to_object(fr.kind, fr.dtype, fr.shape, u.decode_payload(fr))


def assert_in_step(u: Unit, gidxs, fields):
    """Every row's lookup equals the index's entries (all present), or says absent as the index does."""
    gidxs = list(gidxs)
    for f in fields:
        want = u.locate(gidxs, f)
        got = u.lookup(gidxs, [f])[f]
        if any(w is None for w in want):
            assert got is None, f
        else:
            assert [tuple(r) for r in got.tolist()] == [tuple(w) for w in want], f
        for g in gidxs:  # one row at a time too (a lookup of a subset)
            (w,) = u.locate([g], f)
            one = u.lookup([g], [f])[f]
            assert (one is None) if w is None else tuple(one[0].tolist()) == tuple(w), (g, f)


@pytest.fixture
def unit(tmp_path):
    u = Unit(tmp_path / "u", 0, segment_bytes=SEG)
    yield u
    u.close()


def rows(n, seed):
    return torch.full((n, 4), seed, dtype=torch.int64) + torch.arange(n).reshape(-1, 1)


def test_a_long_batch_of_uniform_rows_is_held_where_the_index_says(tmp_path):
    u = Unit(tmp_path / "u", 1, segment_bytes=1 << 22, stride=2)
    try:
        g = list(range(1, 2 * 1500, 2))  # at least RUN_LOCS_MIN rows: locations computed from the run
        x = torch.arange(1500 * 16, dtype=torch.int64).reshape(1500, 16)
        put(u, g, {"ids": x, "lp": torch.rand(1500)})
        put(u, g[100:1300], {"ids": x[:1200] + 1}, fresh=False)
        assert_in_step(u, g, ["ids", "lp"])
        assert torch.equal(value(u, g[200], "ids"), x[100] + 1) and torch.equal(value(u, g[1400], "ids"), x[1400])
    finally:
        u.close()


def test_jagged_values_and_large_rows_are_held_where_the_index_says(unit):
    jag = [torch.arange(i + 1, dtype=torch.int64) for i in range(12)]
    put(unit, range(12), {"j": jag, "v": [{"i": i} for i in range(12)], "big": torch.randn(12, 3000)})
    assert_in_step(unit, range(12), ["j", "v", "big"])
    assert torch.equal(value(unit, 7, "j"), jag[7]) and value(unit, 3, "v") == {"i": 3}


def test_lookups_follow_writes_overwrites_and_deletes(unit):
    put(unit, range(40), {"x": rows(40, 0), "y": rows(40, 100)})
    assert unit.lookup(list(range(40)), ["x"])["x"] is not None
    put(unit, range(10, 20), {"x": rows(10, 7)}, fresh=False)
    assert torch.equal(value(unit, 12, "x"), rows(10, 7)[2])
    unit.delete([3, 4], ["y"])
    unit.delete([5])
    assert_in_step(unit, range(40), ["x", "y"])
    assert unit.lookup([5], ["x"])["x"] is None and unit.lookup([3], ["y"])["y"] is None
    put(unit, [5], {"x": rows(1, 55)})  # a reused row
    assert torch.equal(value(unit, 5, "x"), rows(1, 55)[0])


@pytest.mark.parametrize("committed", [True, False])
def test_an_overwriting_put_settled_either_way_reads_what_the_index_holds(unit, committed):
    put(unit, range(8), {"x": rows(8, 0)})
    put(unit, range(8), {"x": rows(8, 50)}, fresh=False, token=1)
    assert torch.equal(value(unit, 3, "x"), rows(8, 50)[3])
    unit.settle(1, committed=committed)
    assert_in_step(unit, range(8), ["x"])
    assert torch.equal(value(unit, 3, "x"), rows(8, 50 if committed else 0)[3])


def test_compaction_moves_frames_and_lookups_name_their_new_place(unit):
    g, data = 0, {}
    while sum(i.sealed for i in unit.segments().values()) < 2:
        x = torch.randint(0, 1 << 40, (20, 128), dtype=torch.int64)
        put(unit, range(g, g + 20), {"x": x})
        data.update({g + i: x[i] for i in range(20)})
        g += 20
    unit.lookup(list(data), ["x"])
    first = min(unit.segments())
    victims = [r for r in data if unit.locate([r], "x")[0].seg == first]
    unit.delete(victims[1:])
    assert unit.compact() >= 1
    assert_in_step(unit, [r for r in data if r not in victims[1:]], ["x"])
    assert torch.equal(value(unit, victims[0], "x"), data[victims[0]])


def test_an_index_change_the_cache_was_not_told_of_is_never_served_from_it(unit):
    put(unit, range(6), {"x": rows(6, 0)})
    put(unit, range(6, 12), {"x": rows(6, 10)})
    unit.lookup(list(range(12)), ["x"])
    # another writer (a restore, a recovery step) swaps two rows' entries in the index directly
    k0, k7 = INDEX_KEY_HEAD.pack(0) + b"x", INDEX_KEY_HEAD.pack(7) + b"x"
    with unit.env.begin(write=True) as txn:
        v0, v7 = bytes(txn.get(k0, db=unit.db_loc)), bytes(txn.get(k7, db=unit.db_loc))
        txn.put(k0, v7, db=unit.db_loc)
        txn.put(k7, v0, db=unit.db_loc)
    assert_in_step(unit, range(12), ["x"])
    put(unit, range(12, 14), {"x": rows(2, 20)})  # the next write starts the cache again
    assert_in_step(unit, range(14), ["x"])
    with unit.env.begin(write=True) as txn:
        txn.delete(INDEX_KEY_HEAD.pack(13) + b"x", db=unit.db_loc)
    assert unit.lookup([12, 13], ["x"])["x"] is None
    assert_in_step(unit, range(13), ["x"])


def test_a_snapshot_lookup_sees_the_cut_not_the_latest_state(unit):
    put(unit, range(4), {"x": rows(4, 0)})
    sid = unit.snapshot()
    before = unit.lookup(list(range(4)), ["x"], snapshot=sid)["x"].tolist()
    put(unit, range(4), {"x": rows(4, 9)}, fresh=False)
    unit.delete([1])
    assert unit.lookup(list(range(4)), ["x"], snapshot=sid)["x"].tolist() == before
    assert_in_step(unit, range(4), ["x"])
    unit.release(sid)


def test_a_snapshot_is_answered_from_the_cache_only_for_the_commit_it_holds(unit):
    # a dump resolves its rows at its cut through get(at=the snapshot's commit)
    put(unit, range(6), {"x": rows(6, 0)})
    g = list(range(6))
    sid = unit.snapshot()
    at = unit._views[sid].txn.id()
    cut = unit.lookup(g, ["x"], snapshot=sid)["x"].tolist()
    held = unit.locs.get(g, ["x"], at=at)
    assert held is not None and held["x"].tolist() == cut
    put(unit, range(3), {"x": rows(3, 9)}, fresh=False)  # a commit after the cut, told to the cache
    assert unit.locs.get(g, ["x"], at=at) is None  # never the newer locations for the older cut
    assert unit.locs.get(g, ["x"])["x"].tolist() != cut and unit.lookup(g, ["x"], snapshot=sid)["x"].tolist() == cut
    unit.release(sid)
    with unit.env.begin(write=True) as txn:  # a change the cache was not told of, then a cut of it
        txn.delete(INDEX_KEY_HEAD.pack(5) + b"x", db=unit.db_loc)
    sid = unit.snapshot()
    assert unit.locs.get(g[:5], ["x"], at=unit._views[sid].txn.id()) is None
    assert unit.lookup([5], ["x"], snapshot=sid)["x"] is None
    unit.release(sid)


def test_a_unit_of_many_holds_only_its_rows_and_a_bounded_cache_still_answers(tmp_path):
    u = Unit(tmp_path / "u", 1, segment_bytes=SEG, stride=3)
    try:
        mine = list(range(1, 300, 3))
        put(u, mine, {"x": rows(len(mine), 0)})
        put(u, [2, 5], {"x": rows(2, 4)})  # rows of another residue: not held, still indexed
        assert_in_step(u, mine + [2, 5], ["x"])
        u.locs.max_bytes = 20 * 8  # room for 8 rows: the rest is read from the index
        u.locs.clear()
        put(u, mine[:50], {"x": rows(50, 3)}, fresh=False)
        assert u.locs.nbytes() <= 20 * 8
        assert_in_step(u, mine, ["x"])
        assert torch.equal(value(u, mine[40], "x"), rows(50, 3)[40])
    finally:
        u.close()


def test_reopened_unit_answers_from_the_index_and_stays_in_step(tmp_path):
    u = Unit(tmp_path / "u", 0, segment_bytes=SEG)
    put(u, range(10), {"x": rows(10, 0)})
    u.close()
    u = Unit(tmp_path / "u", 0, segment_bytes=SEG)
    try:
        assert_in_step(u, range(10), ["x"])
        u.delete([2])
        put(u, range(10, 12), {"x": rows(2, 1)})
        assert_in_step(u, range(12), ["x"])
    finally:
        u.close()


def test_random_operations_keep_lookups_equal_to_the_index(unit):
    rng = random.Random(12)
    live: set = set()
    token = 0
    for step in range(120):
        op = rng.choice(["new", "new", "over", "over_token", "delete", "delete_field", "compact", "snapshot",
                         "lookup", "foreign"])
        if op == "new":
            g0 = max(live, default=-1) + 1 + rng.randrange(3)
            n = rng.randrange(1, 30)
            put(unit, range(g0, g0 + n), {"x": rows(n, step), "y": rows(n, -step)})
            live |= set(range(g0, g0 + n))
        elif op in ("over", "over_token") and live:
            gs = sorted(rng.sample(sorted(live), min(len(live), rng.randrange(1, 10))))
            if op == "over":
                put(unit, gs, {"x": rows(len(gs), 1000 + step)}, fresh=False)
            else:
                token += 1
                put(unit, gs, {"x": rows(len(gs), 1000 + step)}, fresh=False, token=token)
                unit.settle(token, committed=rng.random() < 0.5)
        elif op == "delete" and live:
            gs = rng.sample(sorted(live), min(len(live), rng.randrange(1, 8)))
            unit.delete(gs)
            live -= set(gs)
        elif op == "delete_field" and live:
            unit.delete(rng.sample(sorted(live), 1), ["y"])
        elif op == "compact":
            unit.compact(live_ratio=0.9)
        elif op == "snapshot":
            unit.release(unit.snapshot())
        elif op == "lookup" and live:
            unit.lookup(sorted(live), ["x"])
        elif op == "foreign" and live:
            g = rng.choice(sorted(live))
            with unit.env.begin(write=True) as txn:
                txn.delete(INDEX_KEY_HEAD.pack(g) + b"y", db=unit.db_loc)
        assert_in_step(unit, sorted(live), ["x", "y"])
    assert unit.verify() == []
    for g in sorted(live)[:20]:
        assert value(unit, g, "x").shape == (4,)


def test_a_failure_of_the_cache_after_a_commit_empties_it_and_the_write_stands(unit, monkeypatch):
    import tqstore.unit as unit_mod

    put(unit, range(4), {"x": rows(4, 0)})
    unit.lookup(list(range(4)), ["x"])

    def fail(*_args):
        raise MemoryError("no room for the cache")

    monkeypatch.setattr(unit_mod, "write_sets", fail)
    put(unit, range(4), {"x": rows(4, 9)}, fresh=False)  # committed: the call succeeds
    assert unit.locs.nbytes() == 0
    assert torch.equal(value(unit, 2, "x"), rows(4, 9)[2])
    assert_in_step(unit, range(4), ["x"])
