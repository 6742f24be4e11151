"""The in-process check of a checkpoint's LMDB files (tqstore.embedded.index_unchecked:
every page read by the checked page reader, every entry checked against its schema) and the
out-of-process walk it stands in for (tqstore/_io/lmdbwalk.py): on a file with no free page
they reach the same verdict, entry shape by entry shape, so a load or a verify may skip the
walk for a file that reads checked; a file that does not (free pages, damage) is walked, and
loads as before.  Real LMDB files throughout; the walk runs in its real child process."""
from __future__ import annotations

import json
import logging
import random
from pathlib import Path

import lmdb
from hypothesis import HealthCheck, given, settings, strategies as st

import tqstore
from tqstore import embedded
from tqstore._io.lmdbwalk import LmdbWalk
from tqstore._io._lmdbwalk_child import SCHEMAS
from tqstore.checkpoint import verify_checkpoint

from checkpoint_helpers import fill, resign, state

_WALKED = "walked out of process"


def _json(d) -> bytes:
    return json.dumps(d).encode()


def _entry(kind: str):
    """(key, value) pairs of database kind ``kind``: mostly of the shape the schema requires,
    some not (a wrong length, a wrong NUL count, text that is not a JSON object)."""
    b = st.binary
    anykey = b(min_size=1, max_size=24)
    nulish = st.lists(st.sampled_from([b"\0", b"a"]), min_size=0, max_size=14).map(b"".join)
    shapes = {
        "loc": st.tuples(anykey, st.one_of(b(min_size=20, max_size=20), b(min_size=0, max_size=24))),
        "gidx_value": st.tuples(anykey, st.one_of(b(min_size=8, max_size=8), b(min_size=0, max_size=12))),
        "rows": st.tuples(anykey, st.one_of(b(min_size=24, max_size=40), st.just(_json({"a": 1})),
                                            st.just(b"[1, 2]"), b(min_size=0, max_size=23),
                                            b(min_size=20, max_size=23))),
        "undo": st.tuples(b(min_size=10, max_size=24), st.one_of(b(min_size=20, max_size=20), b(max_size=22))),
        "gidx_empty": st.tuples(st.one_of(b(min_size=8, max_size=8), b(min_size=1, max_size=10)),
                                st.one_of(st.just(b""), b(min_size=1, max_size=2))),
        "cons": st.tuples(st.tuples(nulish, b(min_size=8, max_size=8)).map(lambda t: t[0] + t[1]),
                          st.one_of(st.just(b""), st.just(b"x"))),
        "segs": st.tuples(st.one_of(b(min_size=4, max_size=4), b(min_size=1, max_size=6)),
                          st.one_of(st.builds(lambda s, l, z: _json({"size": s, "live": l, "sealed": z}),
                                              st.integers(-1, 9), st.integers(0, 9), st.booleans()),
                                    st.just(_json({"size": 1, "live": 1, "sealed": 1})), st.just(b"{"))),
        "meta_format": st.tuples(anykey, st.one_of(st.integers(0, 10 ** 6).map(lambda i: str(i).encode()),
                                                   st.just(b""), st.just(b"1.5"), st.just(b"9" * 41))),
        "json_object": st.tuples(anykey, st.one_of(st.just(_json({"x": [1]})), st.just(b"\xff"),
                                                   st.just(b"3"))),
        "any": st.tuples(anykey, b(max_size=8)),
    }
    shapes["meta_decimal"] = shapes["meta_format"]
    return shapes[kind]


#: (schema, database name, checker kind): every database of every schema, and one no schema names
_DATABASES = [(schema, name, kind) for schema in sorted(SCHEMAS) for name, kind in sorted(SCHEMAS[schema].items())] \
    + [("controller", b"stranger", "any")]


def _write_compacted(d: Path, name: bytes, entries) -> Path:
    raw, out = d / "raw", d / "env"
    raw.mkdir(parents=True)
    out.mkdir()
    env = lmdb.open(str(raw), map_size=1 << 26, max_dbs=4)
    with env.begin(write=True) as txn:
        db = env.open_db(name, txn=txn)
        for k, v in entries:
            txn.put(k, v, db=db)
    env.copy(str(out), compact=True)  # as a save writes it: no free page
    env.close()
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_the_in_process_check_and_the_walk_agree_on_every_entry_shape(tmp_path_factory, data):
    """One file per database of each schema, its entries drawn mostly well-shaped; all walked
    by one child; each file's two verdicts must agree."""
    base = tmp_path_factory.mktemp("envs")
    targets = []
    for i, (schema, name, kind) in enumerate(_DATABASES):
        entries = data.draw(st.lists(_entry(kind), min_size=1, max_size=5), label=name.decode())
        targets.append((str(_write_compacted(base / str(i), name, entries)), schema))
    walked = {p.index: p.message for p in LmdbWalk(targets, timeout_s=120).result()}
    for i, (env_dir, schema) in enumerate(targets):
        why = embedded.index_unchecked(Path(env_dir), schema)
        assert (why is None) == (i not in walked), f"{_DATABASES[i]}: in process: {why}; walk: {walked.get(i)}"


def test_a_file_with_free_pages_or_damage_is_never_passed_in_process(tmp_path):
    d = tmp_path / "idx"
    d.mkdir()
    env = lmdb.open(str(d), map_size=1 << 26, max_dbs=8)
    loc = env.open_db(b"loc")
    with env.begin(write=True) as txn:
        for i in range(3000):
            txn.put(i.to_bytes(8, "big") + b"f", b"x" * 20, db=loc)
    for _ in range(2):
        with env.begin(write=True) as txn:
            for i in range(0, 3000, 2):
                txn.delete(i.to_bytes(8, "big") + b"f", db=loc)
    env.close()
    assert "free list" in embedded.index_unchecked(d, "unit_index")
    assert not LmdbWalk([(str(d), "unit_index")], timeout_s=60).result()  # ... which the walk accepts
    raw = bytearray((d / "data.mdb").read_bytes())
    raw[2 * 4096:3 * 4096] = b"\xff" * 4096
    (d / "data.mdb").write_bytes(bytes(raw))
    assert embedded.index_unchecked(d, "unit_index") is not None
    assert embedded.index_unchecked(tmp_path / "missing", "unit_index") is not None


def test_a_clean_checkpoint_is_loaded_and_verified_without_a_walk(tmp_path, caplog):
    with tqstore.open(tmp_path / "src", num_units=2) as s:
        fill(s, "train", 24)
        s.save_checkpoint(tmp_path / "ck")
        want = state(s)
    caplog.set_level(logging.DEBUG, logger="tqstore")
    with tqstore.open(tmp_path / "dst", num_units=2) as d:
        d.load_checkpoint(tmp_path / "ck")
        assert state(d) == want
    with tqstore.open(tmp_path / "resharded", num_units=3) as d:
        d.load_checkpoint(tmp_path / "ck")
        assert state(d) == want
    assert verify_checkpoint(tmp_path / "ck").ok
    assert not [r for r in caplog.records if _WALKED in r.getMessage()]


def test_a_checkpoint_index_with_free_pages_is_walked_then_loaded(tmp_path, caplog):
    with tqstore.open(tmp_path / "src", num_units=2) as s:
        fill(s, "train", 24)
        s.save_checkpoint(tmp_path / "ck")
        want = state(s)
    ck = tmp_path / "ck"
    idx = ck / "unit-000" / "index"
    env = lmdb.open(str(idx), map_size=1 << 28, max_dbs=8)  # a well-formed file, its free list not empty
    scratch = env.open_db(b"restore")
    for _ in range(3):
        with env.begin(write=True) as txn:
            for i in range(2000):
                txn.put(i.to_bytes(4, "big"), b"y" * 100, db=scratch)
        with env.begin(write=True) as txn:
            txn.drop(scratch, delete=False)
    env.close()
    (idx / "lock.mdb").unlink(missing_ok=True)
    resign(ck)
    assert "free list" in embedded.index_unchecked(idx, "unit_index")
    caplog.set_level(logging.DEBUG, logger="tqstore")
    with tqstore.open(tmp_path / "dst", num_units=2) as d:
        fill(d, "other", 3)
        d.load_checkpoint(ck)
        assert state(d) == want
    assert [r for r in caplog.records if _WALKED in r.getMessage() and "unit-000" in r.getMessage()]
    assert verify_checkpoint(ck).ok


def test_the_replaced_state_is_gone_once_the_store_is_closed(tmp_path):
    with tqstore.open(tmp_path / "src", num_units=2) as s:
        fill(s, "train", 12)
        s.save_checkpoint(tmp_path / "ck")
        want = state(s)
    with tqstore.open(tmp_path / "dst", num_units=2) as d:
        first = d.state_dir
        for _ in range(3):
            d.load_checkpoint(tmp_path / "ck")
            assert state(d) == want  # served at once, while the replaced state is removed
        current = d.state_dir
    assert not first.exists()
    assert sorted(p.name for p in (tmp_path / "dst").iterdir() if p.name.startswith("state-")) == [current.name]
    with tqstore.open(tmp_path / "dst") as d:
        assert state(d) == want


def test_a_damaged_file_the_in_process_check_passes_is_one_the_walk_passes_too(tmp_path):
    """Bit flips in the pages of a real checkpoint's unit index and controller (headers,
    node offsets, anywhere): each variant the in-process check passes must walk cleanly in
    the child process, which a page LMDB could not read would crash."""
    with tqstore.open(tmp_path / "src", num_units=1) as s:
        fill(s, "train", 300)
        s.save_checkpoint(tmp_path / "ck")
    rng = random.Random(7)
    targets, passed = [], []
    for rel, schema in (("unit-000/index", "unit_index"), ("controller", "controller")):
        raw = (tmp_path / "ck" / rel / "data.mdb").read_bytes()
        psize = 4096
        for trial in range(60):
            buf = bytearray(raw)
            for _ in range(rng.randrange(1, 6)):
                pg = rng.randrange(2, len(buf) // psize)
                at = pg * psize + rng.choice((0, 10, 11, 12, 13, 14, 15, 16, 17, rng.randrange(psize)))
                buf[at] ^= 1 << rng.randrange(8)
            d = tmp_path / "variants" / f"{schema}-{trial}"
            d.mkdir(parents=True)
            (d / "data.mdb").write_bytes(bytes(buf))
            targets.append((str(d), schema))
            passed.append(embedded.index_unchecked(d, schema) is None)
    walked = {p.index: p.message for p in LmdbWalk(targets, timeout_s=300).result()}
    assert 0 < sum(passed) < len(passed)  # both verdicts occur
    for i, ok in enumerate(passed):
        if ok:
            assert i not in walked, f"{targets[i]} passed in process, the walk says: {walked[i]}"


def test_a_walk_of_more_paths_than_one_command_line_argument_holds(tmp_path):
    # verify and loads of a store of thousands of units (or under a long path) name more than
    # 128 KiB of paths, the most one argument of a child process holds on Linux
    d = tmp_path
    for i in range(12):
        d = d / (f"{i:02d}" + "d" * 240)
    d.mkdir(parents=True)
    env = lmdb.open(str(d), map_size=1 << 24, max_dbs=8)
    loc = env.open_db(b"loc")
    with env.begin(write=True) as txn:
        txn.put((7).to_bytes(8, "big") + b"f", b"x" * 20, db=loc)
    env.close()
    targets = [(str(d), "unit_index")] * 60
    assert len(json.dumps(targets)) > 128 * 1024
    walk = LmdbWalk(targets, timeout_s=120)
    assert walk.result() == []
    assert walk.entries == 60
