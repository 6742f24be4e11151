"""The sampler state in the controller index, format version 3 (docs/FORMAT.md, "Sampler state"):
a record for the state proper and one per cached rank result, so a fetch writes what it
changed, whatever the number of results cached before it; version-2 indexes (results inside
the state record) still read, and are moved to the new layout by the next write."""
from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Dict

import lmdb
import numpy as np
import pytest

import tqstore
from tqstore.errors import CorruptionError


def _sampler_db(where) -> Dict[bytes, bytes]:
    """The ``sampler`` records (and ``meta/format``) of an open store's index, or of a closed
    store's state directory."""
    if isinstance(where, Path):
        env = lmdb.open(str(where / "controller"), readonly=True, lock=False, max_dbs=16, subdir=True)
        dbs = None
    else:
        env, dbs = where.controller.env, where.controller.db
    try:
        with env.begin() as txn:
            sdb = dbs["sampler"] if dbs else env.open_db(b"sampler", txn=txn, create=False)
            mdb = dbs["meta"] if dbs else env.open_db(b"meta", txn=txn, create=False)
            out = {bytes(k): bytes(v) for k, v in txn.cursor(sdb)}
            out[b"meta/format"] = bytes(txn.get(b"format", db=mdb))
    finally:
        if dbs is None:
            env.close()
    return out


def _put_raw(state_dir: Path, db: bytes, items: Dict[bytes, bytes], delete=()) -> None:
    env = lmdb.open(str(state_dir / "controller"), max_dbs=16, subdir=True)
    try:
        with env.begin(write=True) as txn:
            d = env.open_db(db, txn=txn)
            for k in delete:
                txn.delete(k, db=d)
            for k, v in items.items():
                txn.put(k, v, db=d)
    finally:
        env.close()


def _entry_key(pid: str, n: int) -> bytes:
    return pid.encode() + b"\0" + struct.pack(">Q", n)


def _fetch(s, rank, bi, size=2, pid="p", task="t"):
    return s.get_meta(["x"], size, pid, task_name=task,
                      sampling_config={"dp_rank": rank, "batch_index": bi}).global_indexes


def _store(path, rows=40, sampler="rank_aware"):
    s = tqstore.open(path, num_units=1)
    s.set_sampler(sampler)
    s.put({"x": np.arange(rows).reshape(rows, 1)}, partition_id="p")
    return s


def test_a_fetch_writes_the_state_record_and_one_record_per_cached_result(tmp_path):
    with _store(tmp_path / "s") as s:
        assert _fetch(s, 0, 0) == [0, 1]
        state = s.state_dir
    db = _sampler_db(state)
    assert db[b"meta/format"] == b"3"
    assert db[b"p"] == b'{"sampler": "rank_aware", "state": {"t": {}}}'
    assert db[_entry_key("p", 0)] == b'{"task":"t","rank":"0","batch":"0","sampled":[0,1],"consumed":[0,1],"fetches":1}'
    assert len(db) == 3


def test_the_state_record_does_not_grow_with_the_results_cached_and_replicas_get_theirs_after_a_reopen(tmp_path):
    with _store(tmp_path / "s", rows=400) as s:
        for bi in range(100):
            _fetch(s, bi % 4, bi // 4)
        state = s.state_dir
    db = _sampler_db(state)
    assert len(db[b"p"]) < 100, "the cached results are not in the state record"
    assert sorted(k for k in db if k.startswith(b"p\0")) == [_entry_key("p", n) for n in range(100)]
    with tqstore.open(tmp_path / "s") as s:
        s.set_sampler("rank_aware")
        # a replica of rank 2 asks for batch 7: the cached result, not new rows
        assert _fetch(s, 2, 7) == [2 * 2 + 7 * 8, 2 * 2 + 7 * 8 + 1]
        assert s.controller.sampler_state("p")["state"]["t"]["cache"]["2"]["7"][2] == 2
        _fetch(s, 0, 25)
    db = _sampler_db(state)
    assert json.loads(db[_entry_key("p", 30)])["fetches"] == 2  # only its record changed
    assert len([k for k in db if k.startswith(b"p\0")]) == 101


def test_cleared_rows_reset_consumption_and_a_dropped_partition_delete_their_records(tmp_path):
    with _store(tmp_path / "s") as s:
        for bi in range(3):
            _fetch(s, 0, bi)
        _fetch(s, 0, 0, task="u")
        s.clear_samples(s.get_meta(["x"], None, "p", mode="force_fetch").select_samples([2]))  # row 2: batch 1 of t
        names = {(json.loads(v)["task"], json.loads(v)["batch"]) for k, v in _sampler_db(s).items()
                 if k.startswith(b"p\0")}
        assert names == {("t", "0"), ("t", "2"), ("u", "0")}
        s.reset_consumption("p", "t")
        names = {json.loads(v)["task"] for k, v in _sampler_db(s).items() if k.startswith(b"p\0")}
        assert names == {"u"}
        s.clear_partition("p")
        assert [k for k in _sampler_db(s) if k != b"meta/format"] == []


def test_a_version_2_index_with_results_in_its_state_record_reads_and_moves_them_at_the_next_write(tmp_path):
    with _store(tmp_path / "s") as s:
        state = s.state_dir
    v2 = {"sampler": "rank_aware", "state": {"t": {"cache": {"0": {"0": [[0, 1], [0, 1], 1]},
                                                             "1": {"0": [[2, 3], [2, 3], 1]}}}}}
    _put_raw(state, b"sampler", {b"p": json.dumps(v2).encode()})
    _put_raw(state, b"cons", {b"t\0p\0" + struct.pack(">Q", g): b"" for g in range(4)})
    _put_raw(state, b"meta", {b"format": b"2"})
    with tqstore.open(tmp_path / "s") as s:
        s.set_sampler("rank_aware")
        assert _fetch(s, 1, 0) == [2, 3], "a replica gets the result cached in the version-2 record"
        db = _sampler_db(s)
        assert db[b"meta/format"] == b"3"
        assert json.loads(db[b"p"]) == {"sampler": "rank_aware", "state": {"t": {}}}
        moved = {(v["rank"], v["batch"]): (v["sampled"], v["fetches"]) for v in
                 (json.loads(x) for k, x in db.items() if k.startswith(b"p\0"))}
        assert moved == {("0", "0"): ([0, 1], 1), ("1", "0"): ([2, 3], 2)}
        assert _fetch(s, 0, 1) == [4, 5]


def test_another_samplers_results_are_ignored_and_deleted_by_the_next_write(tmp_path):
    with _store(tmp_path / "s") as s:
        _fetch(s, 0, 0)
        _fetch(s, 1, 0)
        s.set_sampler("grpo_group_n")  # keeps its results in the same layout, under another name
        assert _fetch(s, 1, 0) == [4, 5], "not rank_aware's cached [2, 3]"
        entries = [json.loads(v) for k, v in _sampler_db(s).items() if k.startswith(b"p\0")]
        assert [(e["rank"], e["sampled"]) for e in entries] == [("1", [4, 5])]


@pytest.mark.parametrize("key, value", [
    (_entry_key("p", 0), b'{"task": "t", "rank": "0", "batch": "0", "sampled": [-1], "consumed": [], "fetches": 1}'),
    (_entry_key("p", 0), b'[]'),
    (b"p\0\1", b'{}'),
])
def test_a_malformed_sampler_record_is_a_corruption_error_naming_the_index(tmp_path, key, value):
    with _store(tmp_path / "s") as s:
        state = s.state_dir
    _put_raw(state, b"sampler", {key: value})
    with pytest.raises(CorruptionError) as ei:
        tqstore.open(tmp_path / "s")
    assert "sampler" in str(ei.value) and ei.value.path == str(state / "controller" / "data.mdb")
