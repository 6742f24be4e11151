"""The controller half of the port conformance suite: :class:`ControllerPortTests` (see
:mod:`tqstore.testing.conformance`)."""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, List, Optional, Sequence

import numpy as np

from .._format.columns import to_column
from .._format.controller_records import SEQ_ALIGN
from ..errors import (
    InvalidInputError, KeyNotFoundError, PartitionNotFoundError, SchemaError, TqstoreError,
)
from ..ports import PartitionInfo, RowBatch, RowInfo
from ._conformance_base import _PortTests, pytest
from ._conformance_reconcile import ControllerReconcileTests
from ._conformance_restore import ControllerRestoreTests

RANK0 = {"dp_rank": 0, "batch_index": 0}


def _cols(fields: Sequence[str], n: int, dtype: Any = np.int64) -> List[Any]:
    return [to_column(f, np.arange(n, dtype=dtype).reshape(n, 1), n) for f in fields]


def _pairs(status: Any) -> Any:
    return None if status is None else tuple(np.asarray(x).tolist() for x in status)


class ControllerPortTests(ControllerRestoreTests, ControllerReconcileTests, _PortTests):
    """Conformance of a :class:`~tqstore.ports.ControllerPort` implementation.

    Subclasses define :meth:`make_controller`."""

    NUM_UNITS = 2

    def make_controller(self, path: Path, num_units: int) -> Any:
        """A controller port of a store of ``num_units`` units, in ``path`` (new or existing)."""
        raise NotImplementedError

    # helpers ------------------------------------------------------------------
    def controller(self, tmp_path: Path) -> Any:
        args = ((tmp_path / "controller", self.NUM_UNITS), {})
        return self._track(self.make_controller(*args[0]), self.make_controller, args)

    @staticmethod
    def put(c: Any, pid: str, *, keys: Optional[List[str]] = None, gidxs: Optional[List[int]] = None, n: int = 0,
            fields: Sequence[str] = ("x",), tags: Optional[List[Any]] = None, token: Optional[int] = None
            ) -> List[int]:
        """plan_put + commit_put (the unit writes between them are not the controller's business)."""
        rows = len(keys) if keys is not None else len(gidxs) if gidxs is not None else n
        plan = c.plan_put(pid, _cols(fields, rows), keys=keys, gidxs=gidxs, n_new=n, tags=tags)
        c.commit_put(plan, token=token)
        return list(plan.gidxs)

    @staticmethod
    def state(c: Any, tasks: Sequence[str] = ("t",)) -> Any:
        """Everything the port's queries say, as plain values (to compare before and after)."""
        out = {"partitions": c.partitions(), "keys": c.list_keys()}
        for pid in out["partitions"]:
            info = c.partition_info(pid)
            first = c.first_rows(pid)
            schema = sorted(info.schema)
            out[pid] = (info.rows, sorted(info.schema.items()), first.gidxs, first.keys, first.tags,
                        [sorted(f) for f in first.fields], first.seqs, _pairs(c.production_status(pid, schema)),
                        [_pairs(c.consumption_status(pid, t)) for t in tasks])
        out["claims"] = [{g: sorted(f) for g, f in c.claims(u).items()} for u in range(c.num_units)]
        return out

    # puts and queries -----------------------------------------------------------
    def test_num_units_is_the_stores(self, tmp_path):
        assert self.controller(tmp_path).num_units == self.NUM_UNITS

    def test_plan_put_commits_nothing_until_commit_put(self, tmp_path):
        c = self.controller(tmp_path)
        plan = c.plan_put("p", _cols(["x"], 2), keys=["a", "b"], tags=[{"i": 1}, None])
        assert c.partitions() == [] and c.list_keys() == {} and c.first_rows("p") is None
        c.commit_put(plan)
        assert c.partitions() == ["p"] and c.list_keys() == {"p": {"a": {"i": 1}, "b": None}}
        assert c.resolve_keys("p", ["b", "a"]) == list(plan.gidxs)[::-1]
        info = c.partition_info("p")
        assert isinstance(info, PartitionInfo) and info.rows == 2 and set(info.schema) == {"x"}
        assert [r.fields for r in c.row_infos("p", list(plan.gidxs))] == [frozenset({"x"})] * 2

    def test_verify_index_finds_nothing_in_an_index_it_wrote(self, tmp_path):
        c = self.controller(tmp_path)
        g = self.put(c, "p", keys=["a", "b", "c"], tags=[{"i": 1}, None, None])
        self.put(c, "q", n=2)
        c.clear_rows("p", g[:1])
        c.fetch("p", "t", ["x"], 1)
        assert c.verify_index() == []
        c = self.reopen(c)
        assert c.verify_index() == []

    def test_partitions_are_listed_oldest_first_also_after_a_reopen(self, tmp_path):
        # (TransferQueue's order: get_partition_list()[-1] is the newest partition)
        c = self.controller(tmp_path)
        for pid in ["step_9", "step_10", "a", "step_2"]:
            self.put(c, pid, keys=["k"])
        c.drop_partition("a")
        self.put(c, "a", keys=["k"])  # made again: the newest
        want = ["step_9", "step_10", "step_2", "a"]
        assert c.partitions() == want and list(c.list_keys()) == want
        c = self.reopen(c)
        assert c.partitions() == want and list(c.list_keys()) == want

    def test_global_indexes_are_unique_across_partitions(self, tmp_path):
        c = self.controller(tmp_path)
        got = self.put(c, "p", n=3) + self.put(c, "q", keys=["a", "b"]) + self.put(c, "p", keys=["c"])
        assert len(set(got)) == 6

    def test_a_put_to_existing_rows_adds_fields_and_replaces_tags(self, tmp_path):
        c = self.controller(tmp_path)
        g = self.put(c, "p", keys=["a", "b"], tags=[{"v": 1}, {"v": 2}])
        assert self.put(c, "p", gidxs=g[:1], fields=["y"], tags=[{"v": 3}]) == g[:1]
        assert self.put(c, "p", keys=["b"], fields=["x"]) == g[1:]  # an existing key keeps its index
        rows = c.row_infos("p", g)
        assert [r.fields for r in rows] == [frozenset({"x", "y"}), frozenset({"x"})]
        assert [r.tag for r in rows] == [{"v": 3}, {"v": 2}]
        assert c.partition_info("p").rows == 2

    def test_resolve_keys_of_an_unknown_key_raises_key_not_found_also_a_value_error(self, tmp_path):
        c = self.controller(tmp_path)
        self.put(c, "p", keys=["a"])
        for exc in (KeyNotFoundError, KeyError, ValueError, TqstoreError):
            with pytest.raises(exc):
                c.resolve_keys("p", ["a", "nope"])
        with pytest.raises(PartitionNotFoundError):
            c.resolve_keys("q", ["a"])
        with pytest.raises(PartitionNotFoundError):
            c.partition_info("q")

    def test_check_keys_counts_distinct_known_keys_and_names_an_unknown_one(self, tmp_path):
        c = self.controller(tmp_path)
        self._needs(c, "check_keys")
        g = self.put(c, "p", keys=["a", "b", "c"])
        assert c.check_keys("p", ["c", "a", "c"]) == 2 and c.check_keys("p", []) == 0
        for exc in (KeyNotFoundError, KeyError, ValueError, TqstoreError):
            with pytest.raises(exc, match="nope"):
                c.check_keys("p", ["a", "nope", "b"])
        c.clear_rows("p", g[1:2])
        with pytest.raises(KeyNotFoundError, match="'b'"):
            c.check_keys("p", ["a", "b"])
        with pytest.raises(PartitionNotFoundError):
            c.check_keys("q", ["a"])
        with pytest.raises(PartitionNotFoundError):
            c.check_keys("q", [])

    def test_the_removal_epoch_changes_with_every_removal_and_only_then(self, tmp_path):
        c = self.controller(tmp_path)
        self._needs(c, "removal_epoch")
        g = self.put(c, "p", keys=["a", "b", "c"])
        e0 = c.removal_epoch()
        self.put(c, "p", keys=["d"])  # adding rows, fields or tags removes nothing
        self.put(c, "p", keys=["a"], fields=["y"], tags=[{"v": 1}])
        self.put(c, "q", n=2)
        assert c.removal_epoch() == e0
        c.clear_rows("p", [])  # removing nothing
        assert c.removal_epoch() == e0
        c.clear_rows("p", g[:1])
        e1 = c.removal_epoch()
        assert e1 != e0
        c.drop_partition("q")
        assert c.removal_epoch() not in (e0, e1)

    def test_row_queries_say_none_for_rows_and_partitions_that_do_not_exist(self, tmp_path):
        c = self.controller(tmp_path)
        g = self.put(c, "p", n=3)
        self.put(c, "p", keys=["k"], tags=[{"t": 1}])
        b = c.row_batch("p", [g[1], 999, g[0]])
        assert isinstance(b, RowBatch) and b.missing() == [1] and b.gidxs == [g[1], 999, g[0]]
        assert b.row(1) is None and isinstance(b.row(0), RowInfo) and b.row(0).seq == b.row(2).seq + 1
        k = c.rows_by_key("p", ["nope", "k"])
        assert k.missing() == [0] and k.keys[1] == "k" and k.tags[1] == {"t": 1}
        assert [r and r.gidx for r in c.row_infos("p", [g[2], 999])] == [g[2], None]
        assert c.row_infos("q", g) == [None] * 3
        assert c.row_batch("q", g) is None and c.rows_by_key("q", ["k"]) is None and c.first_rows("q") is None
        assert c.production_status("q", ["x"]) is None and c.consumption_status("q", "t") is None
        assert c.fetch("q", "t", ["x"], 1) is None and c.list_keys("q") in ({}, {"q": {}})

    def test_query_answers_are_copies_editing_them_changes_nothing(self, tmp_path):
        c = self.controller(tmp_path)
        g = self.put(c, "p", keys=["a", "b"], tags=[{"n": [1, 2]}, {"m": {"k": 1}}])
        before = self.state(c)
        c.list_keys("p")["p"]["a"]["n"].append(3)
        c.list_keys()["p"].pop("b")
        c.key_list("p")[1]["a"]["n"].append(5)
        c.key_list("p")[0].clear()
        c.row_infos("p", g)[0].tag["n"].append(4)
        b = c.row_batch("p", g)
        b.tags[1]["m"]["k"] = 2
        b.gidxs.append(5)
        b.schema.clear()
        k = c.rows_by_key("p", ["a"])
        k.tags[0].clear()
        k.keys[0] = "z"
        c.first_rows("p").tags[0]["n"].clear()
        c.partition_info("p").schema.clear()
        gs, flags = c.production_status("p", ["x"])
        flags[:] = 0
        c.claims(g[0] % self.NUM_UNITS).clear()
        assert self.state(c) == before

    def test_list_keys_keeps_insertion_order(self, tmp_path):
        c = self.controller(tmp_path)
        self.put(c, "p", keys=["b", "a"])
        self.put(c, "q", keys=["z"])
        self.put(c, "p", keys=["c", "a"], tags=[None, {"t": 1}])
        assert list(c.list_keys("p")["p"].items()) == [("b", None), ("a", {"t": 1}), ("c", None)]
        assert list(c.list_keys()) == ["p", "q"] and c.list_keys("q") == {"q": {"z": None}}
        keys, tags = c.key_list("p")
        assert [k for k in keys if k is not None] == ["b", "a", "c"] and tags == {"a": {"t": 1}}
        assert c.key_list("nope") is None
        assert c.first_rows("p", 2).keys == ["b", "a"] and len(c.first_rows("p")) == 3

    def test_claims_name_each_units_rows_with_their_produced_fields(self, tmp_path):
        c = self.controller(tmp_path)
        g = self.put(c, "p", n=5)
        k = self.put(c, "q", keys=["a"], fields=[])
        claims = [c.claims(u) for u in range(self.NUM_UNITS)]
        assert all(x % self.NUM_UNITS == u for u, cl in enumerate(claims) for x in cl)
        assert {x: f for cl in claims for x, f in cl.items()} == {**{x: frozenset({"x"}) for x in g},
                                                                   k[0]: frozenset()}

    def test_claim_rows_say_by_field_what_claims_says(self, tmp_path):
        c = self.controller(tmp_path)
        g = self.put(c, "p", n=5)
        self.put(c, "p", gidxs=g[1:3], fields=["y"])
        self.put(c, "q", keys=["a", "b"], fields=["x", "z"])
        self.put(c, "q", keys=["c"], fields=[])
        c.clear_rows("p", [g[0]])
        for u in range(self.NUM_UNITS):
            want: dict = {}
            for x, fs in c.claims(u).items():
                for f in fs:
                    want.setdefault(f, []).append(x)
            got = c.claim_rows(u)
            assert all(isinstance(v, np.ndarray) and v.dtype == np.int64 for v in got.values())
            assert {f: v.tolist() for f, v in got.items()} == {f: sorted(v) for f, v in want.items()}

    # clears ---------------------------------------------------------------------
    def test_clear_rows_is_idempotent_and_frees_indexes_reused_smallest_first(self, tmp_path):
        c = self.controller(tmp_path)
        g = self.put(c, "p", n=5)
        assert sorted(c.clear_rows("p", [g[3], g[1], 999])) == [g[1], g[3]]
        assert c.clear_rows("p", [g[3], g[1]]) == [] and c.clear_rows("q", g) == []
        assert c.partition_info("p").rows == 3
        again = self.put(c, "q", n=3)
        assert again[:2] == sorted([g[1], g[3]]) and again[2] not in g

    def test_clear_rows_forgets_keys_and_consumption(self, tmp_path):
        c = self.controller(tmp_path)
        g = self.put(c, "p", keys=["a", "b"])
        assert c.fetch("p", "t", ["x"], 2).gidxs == g
        c.clear_rows("p", g[:1])
        assert c.list_keys("p") == {"p": {"b": None}}
        assert [k for k in c.key_list("p")[0] if k is not None] == ["b"]
        with pytest.raises(KeyNotFoundError):
            c.resolve_keys("p", ["a"])
        assert _pairs(c.consumption_status("p", "t")) == ([g[1]], [1])

    def test_drop_partition_removes_it_with_its_rows_and_is_idempotent(self, tmp_path):
        c = self.controller(tmp_path)
        g = self.put(c, "p", keys=["a", "b"])
        self.put(c, "q", n=1)
        c.fetch("p", "t", ["x"], 1)
        assert sorted(c.drop_partition("p")) == g and c.drop_partition("p") == []
        assert c.partitions() == ["q"] and c.row_batch("p", g) is None
        again = self.put(c, "p", keys=["a"])  # a new partition of the same name
        assert again[0] in g and _pairs(c.consumption_status("p", "t")) == (again, [0])

    def test_raise_seq_floor_makes_later_rows_sequence_numbers_start_past_it_and_survives_a_reopen(self, tmp_path):
        """A raise keeps each partition's sequence numbers the same modulo SEQ_ALIGN (its GRPO
        groups go on where they were); a partition's first is a multiple of it."""
        c = self.controller(tmp_path)
        self.put(c, "p", keys=["a", "b"])
        self.put(c, "q", n=5)
        s0 = c.first_rows("p").seqs[0]  # (a new store's first is random: FORMAT.md)
        assert s0 % SEQ_ALIGN == 0 and c.first_rows("q").seqs[0] % SEQ_ALIGN == 0
        assert (high := c.seq_high()) >= s0 + 5 and c.first_rows("p").seqs == [s0, s0 + 1]
        c.raise_seq_floor(high + 10), c.raise_seq_floor(3)  # (the lower one changes nothing)
        c = self.reopen(c)
        assert c.seq_high() >= high + 10 and c.first_rows("p").seqs == [s0, s0 + 1]  # rows keep theirs
        self.put(c, "p", keys=["c"])
        self.put(c, "new", n=1)
        after = c.first_rows("p").seqs[-1]
        assert after >= high + 10 and (after - (s0 + 2)) % SEQ_ALIGN == 0
        first_new = c.first_rows("new").seqs[0]
        assert first_new >= high + 10 and first_new % SEQ_ALIGN == 0
        with pytest.raises(InvalidInputError):
            c.raise_seq_floor(-1)

    # consumption ----------------------------------------------------------------
    def test_fetch_marks_the_rows_it_hands_out_consumed_by_the_task(self, tmp_path):
        c = self.controller(tmp_path)
        g = self.put(c, "p", n=4)
        first = c.fetch("p", "t", ["x"], 3)
        assert isinstance(first, RowBatch) and first.gidxs == g[:3] and set(first.schema) == {"x"}
        empty = c.fetch("p", "t", ["x"], 3)  # the default sampler: a whole batch or nothing
        assert empty is not None and len(empty) == 0
        assert c.fetch("p", "t", ["x"], 1).gidxs == g[3:]
        assert len(c.fetch("p", "t", ["x"], 1)) == 0
        assert c.fetch("p", "other", None, 4).gidxs == g  # fields=None: the whole schema
        assert _pairs(c.consumption_status("p", "t")) == (g, [1, 1, 1, 1])
        assert _pairs(c.consumption_status("p", "never")) == (g, [0, 0, 0, 0])

    def test_fetch_hands_out_only_rows_whose_fields_are_produced(self, tmp_path):
        c = self.controller(tmp_path)
        g = self.put(c, "p", n=3)
        self.put(c, "p", gidxs=[g[1]], fields=["y"])
        assert _pairs(c.production_status("p", ["x", "y"])) == (g, [[1, 0], [1, 1], [1, 0]])
        assert c.fetch("p", "t", ["x", "y"], 1).gidxs == [g[1]]
        assert len(c.fetch("p", "t", ["x", "y"], 1)) == 0 and len(c.fetch("p", "t", ["x", "nope"], 1)) == 0
        self.put(c, "p", gidxs=[g[2]], fields=["y"])
        assert c.fetch("p", "t", ["x", "y"], 1).gidxs == [g[2]]
        assert c.fetch("p", "u", ["x"], 3).gidxs == g

    def test_concurrent_fetches_of_one_task_never_share_a_row(self, tmp_path):
        c = self.controller(tmp_path)
        g = self.put(c, "p", n=60)
        got: List[List[int]] = [[] for _ in range(4)]
        errors: List[BaseException] = []

        def consume(i: int) -> None:
            try:
                while True:
                    b = c.fetch("p", "t", ["x"], 2)
                    if not len(b):
                        return
                    got[i].extend(b.gidxs)
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=consume, args=(i,)) for i in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(60)
        assert not errors, errors[0]
        served = [x for part in got for x in part]
        assert sorted(served) == sorted(g)  # every row once, none twice

    def test_reset_consumption_forgets_one_task_or_all(self, tmp_path):
        c = self.controller(tmp_path)
        g = self.put(c, "p", n=2)
        c.fetch("p", "a", ["x"], 2)
        c.fetch("p", "b", ["x"], 2)
        assert c.reset_consumption("p", "a") is True
        assert _pairs(c.consumption_status("p", "a")) == (g, [0, 0])
        assert _pairs(c.consumption_status("p", "b")) == (g, [1, 1])
        assert c.fetch("p", "a", ["x"], 2).gidxs == g
        assert c.reset_consumption("p") is True and c.fetch("p", "b", ["x"], 2).gidxs == g
        assert c.reset_consumption("q") is False

    def test_set_sampler_changes_what_fetch_chooses(self, tmp_path):
        c = self.controller(tmp_path)
        g = self.put(c, "p", n=20)
        c.set_sampler({"name": "random", "seed": 3})
        drawn = c.fetch("p", "t", ["x"], 5).gidxs
        assert len(set(drawn)) == 5 and set(drawn) <= set(g) and drawn != g[:5]
        c.set_sampler("grpo_group_n")
        c.set_sampler(None)  # sequential
        rest = [x for x in g if x not in drawn]
        assert c.fetch("p", "t", ["x"], 3).gidxs == rest[:3]

    def test_sampler_state_is_saved_with_the_fetch_and_survives_a_reopen(self, tmp_path):
        c = self.controller(tmp_path)
        g = self.put(c, "p", n=4)
        c.set_sampler("rank_aware")
        first = c.fetch("p", "t", ["x"], 2, RANK0).gidxs
        assert first == g[:2] and c.fetch("p", "t", ["x"], 2, RANK0).gidxs == first  # cached
        c = self.reopen(c)
        c.set_sampler("rank_aware")
        assert c.fetch("p", "t", ["x"], 2, RANK0).gidxs == first  # the cache came back
        assert c.fetch("p", "t", ["x"], 2, {"dp_rank": 0, "batch_index": 1}).gidxs == g[2:]

    def test_first_batch_index_starts_past_an_earlier_runs_cached_batches_and_stays_put(self, tmp_path):
        c = self.controller(tmp_path)
        self.put(c, "p", n=8)
        c.set_sampler("rank_aware")
        assert c.first_batch_index("p", "t", 0) == 0
        for bi in range(3):
            c.fetch("p", "t", ["x"], 2, {"dp_rank": 0, "batch_index": bi})
        assert c.first_batch_index("p", "t", 0) == 0  # the same answer while it is open
        c = self.reopen(c)
        c.set_sampler("rank_aware")
        assert c.first_batch_index("p", "t", 0) == 3 and c.first_batch_index("p", "t", 1) == 0
        assert c.first_batch_index("p", "u", 0) == 0 and c.first_batch_index("nope", "t", 0) == 0
        c.fetch("p", "t", ["x"], 2, {"dp_rank": 0, "batch_index": 3})
        assert c.first_batch_index("p", "t", 0) == 3

    def test_first_batch_index_does_not_pass_a_share_set_aside_for_a_rank_that_never_fetched_it(self, tmp_path):
        c = self.controller(tmp_path)
        self.put(c, "p", n=8, tags=[{"total_lengths": 3}] * 8)
        c.set_sampler({"name": "seqlen_balanced", "n_samples_per_prompt": 2, "dp_size": 2})
        c.fetch("p", "t", ["x"], 2, {"dp_rank": 0, "batch_index": 0})  # sets rank 1's share of batch 0 aside
        c = self.reopen(c)
        c.set_sampler({"name": "seqlen_balanced", "n_samples_per_prompt": 2, "dp_size": 2})
        assert c.first_batch_index("p", "t", 0) == 1 and c.first_batch_index("p", "t", 1) == 0
        assert len(c.fetch("p", "t", ["x"], 2, {"dp_rank": 1, "batch_index": 0}).gidxs) == 2  # its share

    # durability -----------------------------------------------------------------
    def test_committed_state_survives_a_reopen_and_an_uncommitted_plan_does_not(self, tmp_path):
        c = self.controller(tmp_path)
        self.put(c, "p", keys=["a", "b"], tags=[{"i": 1}, None])
        g = self.put(c, "q", n=3)
        c.clear_rows("q", g[:1])
        c.fetch("p", "t", ["x"], 1)
        plan = c.plan_put("r", _cols(["x"], 2), keys=["u", "v"])  # never committed
        before = self.state(c)
        c = self.reopen(c)
        assert self.state(c) == before and "r" not in c.partitions()
        again = c.plan_put("r", _cols(["x"], 2), keys=["u", "v"])
        assert list(again.gidxs) == list(plan.gidxs)  # the uncommitted reservation was not kept

    def test_put_token_is_committed_with_the_put_and_survives_a_reopen(self, tmp_path):
        c = self.controller(tmp_path)
        self.put(c, "p", n=1, token=3)
        assert c.put_token == 3
        self.put(c, "p", n=1)  # no token: unchanged
        c = self.reopen(c)
        assert c.put_token == 3

    def test_a_dtype_change_is_rejected_by_default_and_recorded_as_mixed_when_allowed(self, tmp_path):
        from .._format.dtypes import SCHEMA_MIXED
        c = self.controller(tmp_path)
        self.put(c, "p", keys=["a"])
        kind, code = c.partition_info("p").schema["x"]
        with pytest.raises(SchemaError):  # strict_dtypes defaults to True
            c.plan_put("p", _cols(["x"], 1, np.float32), keys=["b"])
        plan = c.plan_put("p", _cols(["x"], 1, np.float32), keys=["b"], strict_dtypes=False)
        assert c.partition_info("p").schema["x"] == (kind, code)  # planned, not committed
        c.commit_put(plan)
        assert c.partition_info("p").schema["x"] == (kind, SCHEMA_MIXED)
        c.commit_put(c.plan_put("p", _cols(["x"], 1, np.int16), keys=["c"], strict_dtypes=False))
        with pytest.raises(SchemaError):  # a mixed field accepts no put under strict_dtypes
            c.plan_put("p", _cols(["x"], 1), keys=["d"])
        with pytest.raises(SchemaError):  # a kind clash in both modes
            c.plan_put("p", [to_column("x", ["v"], 1)], keys=["d"], strict_dtypes=False)
        c = self.reopen(c)
        assert c.partition_info("p").schema["x"] == (kind, SCHEMA_MIXED)
        assert sorted(c.rows_by_key("p", ["a", "b", "c"]).gidxs) == sorted(c.resolve_keys("p", ["a", "b", "c"]))

    # errors and failed calls ----------------------------------------------------------
    def test_rejected_puts_raise_tqstore_errors_and_change_nothing(self, tmp_path):
        c = self.controller(tmp_path)
        g = self.put(c, "p", keys=["a"])
        before = self.state(c)
        bad = [
            (InvalidInputError, lambda: c.plan_put("p", _cols(["x"], 2), keys=["b", "b"])),
            (SchemaError, lambda: c.plan_put("p", _cols(["x"], 1, np.float32), keys=["b"])),
            (KeyNotFoundError, lambda: c.plan_put("p", _cols(["x"], 1), gidxs=[g[0] + 1000])),
            (PartitionNotFoundError, lambda: c.plan_put("q", _cols(["x"], 1), gidxs=g)),
            (InvalidInputError, lambda: c.plan_put("p", _cols(["x"], 1), keys=["b"], tags=[None, None])),
            (InvalidInputError, lambda: c.plan_put("p", _cols(["x"], 2), keys=["b"])),
            (KeyNotFoundError, lambda: c.plan_put("p", _cols(["x"], 1), keys=["b"], create_keys=False)),
        ]
        for exc, call in bad:
            with pytest.raises(exc):
                call()
        assert self.state(c) == before

    def test_a_failed_commit_changes_nothing(self, tmp_path):
        c = self.controller(tmp_path)
        self.put(c, "p", keys=["a"], token=1)
        before = self.state(c)
        plan = c.plan_put("p", _cols(["x", "y"], 2), keys=["a", "b"], tags=[{"i": 1}, None])
        with self._failing("controller_commit"):
            with pytest.raises(TqstoreError):
                c.commit_put(plan, token=2)
        assert self.state(c) == before and c.put_token == 1
        assert self.put(c, "p", keys=["a", "b"], fields=["x", "y"], token=2) == list(plan.gidxs)
        assert c.put_token == 2

    def test_a_failed_clear_fetch_or_reset_changes_nothing(self, tmp_path):
        c = self.controller(tmp_path)
        g = self.put(c, "p", keys=["a", "b", "c"])
        c.set_sampler("rank_aware")
        c.fetch("p", "t", ["x"], 1, RANK0)
        before = self.state(c)
        with self._failing("controller_commit"):
            for call in (lambda: c.clear_rows("p", g), lambda: c.drop_partition("p"),
                         lambda: c.fetch("p", "t", ["x"], 2, {"dp_rank": 0, "batch_index": 1}),
                         lambda: c.reset_consumption("p")):
                with pytest.raises(TqstoreError):
                    call()
        assert self.state(c) == before
        assert c.fetch("p", "t", ["x"], 1, RANK0).gidxs == g[:1]  # the sampler's cache is intact
        assert c.fetch("p", "t", ["x"], 2, {"dp_rank": 0, "batch_index": 1}).gidxs == g[1:]

    # snapshots (methods still being added to the embedded Controller) ----------------
    def test_a_snapshot_exports_the_state_at_its_cut(self, tmp_path):
        c = self.controller(tmp_path)
        self._needs(c, "snapshot")
        self._needs(c, "export_snapshot")
        self.put(c, "p", n=2)
        snap = c.snapshot()
        try:
            self.put(c, "p", n=3)  # after the cut
            dest = tmp_path / "export"
            dest.mkdir()
            out = c.export_snapshot(snap, str(dest))
        finally:
            c.release(snap)
        c.release(snap)  # idempotent
        assert out.files
        for entry in out.files:
            assert (dest / entry["path"]).is_file(), entry
        if "rows" in out.summary:
            assert out.summary["rows"] == 2
        with pytest.raises(TqstoreError):
            c.export_snapshot(snap, str(tmp_path / "again"))  # released

    def test_an_exported_snapshot_staged_again_opens_as_the_cut(self, tmp_path):
        self._staged_again(tmp_path, sync=True)

    def test_a_staged_copy_opens_before_sync_staged_makes_it_durable(self, tmp_path):
        self._staged_again(tmp_path, sync=False)

    def _staged_again(self, tmp_path, *, sync: bool) -> None:
        # a load stages the checkpoint's copy of the index beside the live one; with sync=False
        # the copy may be opened before sync_staged makes it durable
        c = self.controller(tmp_path)
        for name in ("snapshot", "export_snapshot", "stage_import", "sync_staged"):
            self._needs(c, name)
        self.put(c, "p", keys=["a", "b"], tags=[{"t": 1}, None])
        snap = c.snapshot()
        try:
            want = self.state(c)
            self.put(c, "p", keys=["c"])  # after the cut
            dest = tmp_path / "export"
            dest.mkdir()
            c.export_snapshot(snap, str(dest))
        finally:
            c.release(snap)
        live = self.state(c)
        target = tmp_path / "staged"
        assert c.stage_import(str(target), str(dest), src_checked=False, sync=sync) is True
        staged = self._track(self.make_controller(target, self.NUM_UNITS), self.make_controller,
                             ((target, self.NUM_UNITS), {}))
        if not sync:
            c.sync_staged(str(target))
        assert self.state(staged) == want
        assert self.state(c) == live  # the live controller untouched

    def test_snapshot_rows_answers_the_rows_as_they_were_at_the_cut(self, tmp_path):
        c = self.controller(tmp_path)
        self._needs(c, "snapshot_rows")
        g = self.put(c, "p", keys=["a", "b", "c"], tags=[{"t": 1}, None, [1, 2]])
        self.put(c, "p", keys=["e"], fields=())
        snap = c.snapshot()
        try:
            self.put(c, "p", keys=["a", "d"], fields=("x", "y"), tags=[{"t": 9}, None])  # after the cut
            c.clear_rows("p", g[1:2])
            self.put(c, "q", n=1)
            rb = c.snapshot_rows(snap, "p", ["c", "a", "d", "b", "e"])
            assert c.snapshot_rows(snap, "q", ["x"]) is None  # no partition q at the cut
        finally:
            c.release(snap)
        assert rb.missing() == [2]  # "d" came after the cut
        assert rb.keys[:2] == ["c", "a"] and rb.gidxs[:2] == [g[2], g[0]] and rb.gidxs[3] == g[1]
        assert rb.tags[:2] == [[1, 2], {"t": 1}] and rb.tags[3] is None
        assert [sorted(f) for f in (rb.fields[0], rb.fields[1], rb.fields[4])] == [["x"], ["x"], []]
        assert set(rb.schema) == {"x"}  # "y" came after the cut
        with pytest.raises(TqstoreError):
            c.snapshot_rows(snap, "p", ["a"])  # released

    def test_snapshot_ids_are_distinct_and_an_unknown_one_is_a_tqstore_error(self, tmp_path):
        c = self.controller(tmp_path)
        self._needs(c, "snapshot")
        a, b = c.snapshot(), c.snapshot()
        try:
            assert a != b
        finally:
            c.release(a)
            c.release(b)
        if callable(getattr(c, "export_snapshot", None)):
            with pytest.raises(TqstoreError):
                c.export_snapshot(987654, str(tmp_path / "x"))


__all__ = ["ControllerPortTests"]
