"""The data plane's bulk paths (issues 9 and 12) keep what a user relies on: metas built from
the controller's answer without copies are still independent values, the per-unit split of a
put keeps every row where it belongs, and a sampler's bad answer is still refused."""
from __future__ import annotations

import pickle

import numpy as np
import pytest

import tqstore as tq
from tqstore import BaseSampler, InvalidInputError
from tqstore._format.columns import take_rows
from tqstore.meta import BatchMeta, KVBatchMeta


def _store(tmp_path, **kw):
    return tq.open(tmp_path / "s", num_units=kw.pop("num_units", 2), result_type="dict", **kw)


def test_get_meta_custom_meta_is_a_fresh_dict_per_row_and_editing_it_changes_nothing_stored(tmp_path):
    with _store(tmp_path) as s:
        s.kv_batch_put(["a", "b", "c"], "p", {"x": np.arange(3)}, tags=[{"t": 1}, None, {"t": 3}])
        m = s.get_meta(["x"], 3, "p", mode="force_fetch")
        assert m.custom_meta == [{"t": 1}, {}, {"t": 3}]
        m.custom_meta[1]["new"] = 1
        m.custom_meta[0]["t"] = 99
        assert m.custom_meta[2] is not m.custom_meta[1]
        again = s.get_meta(["x"], 3, "p", mode="force_fetch")
        assert again.custom_meta == [{"t": 1}, {}, {"t": 3}]
        assert s.kv_list("p")["p"] == {"a": {"t": 1}, "b": {}, "c": {"t": 3}}


def test_a_get_meta_answer_pickles_and_concatenates_with_its_lazy_per_row_metadata(tmp_path):
    with _store(tmp_path) as s:
        s.put({"x": np.arange(4)}, partition_id="p")
        m = s.get_meta(["x"], 4, "p", mode="force_fetch")
        back = pickle.loads(pickle.dumps(m))
        assert back.custom_meta == [{}] * 4 and back.global_indexes == m.global_indexes
        both = BatchMeta.concat([m, back])
        assert both.size == 8 and both.custom_meta == [{}] * 8
        assert np.array_equal(s.get_data(back)["x"], np.arange(4))
        m.custom_meta[0]["k"] = "v"  # stored with set_custom_meta-like put of the meta
        s.put({"y": np.arange(4)}, metadata=m)
        assert s.kv_list("p") == {"p": {}}  # unkeyed rows are not listed
        assert s.get_meta(["x", "y"], 4, "p", mode="force_fetch").custom_meta[0] == {"k": "v"}


def test_force_fetch_answers_the_first_rows_in_insertion_order_after_clears(tmp_path):
    with _store(tmp_path) as s:
        for i in range(3):
            s.put({"x": np.full((4, 2), i)}, partition_id="p")
        first = s.get_meta(["x"], None, "p", mode="force_fetch")
        s.clear_samples(first.select_samples([0, 5]))
        m = s.get_meta(["x"], 3, "p", mode="force_fetch")
        want = [g for j, g in enumerate(first.global_indexes) if j not in (0, 5)][:3]
        assert m.global_indexes == want and list(m.production_status) == [1, 1, 1]
        assert s.get_meta(["x"], 100, "p", mode="force_fetch").size == 10


def test_force_fetch_of_a_few_rows_finds_them_past_a_long_run_of_cleared_ones(tmp_path):
    """The first rows after thousands of cleared ones (the scan for them goes chunk by
    chunk: fewer holes than live rows, so the partition keeps them), and after more clears
    in between, are those of the whole listing."""
    with _store(tmp_path) as s:
        s.put({"x": np.arange(20000)[:, None]}, partition_id="p")
        every = s.get_meta(["x"], None, "p", mode="force_fetch")
        s.clear_samples(every.select_samples(list(range(9000)) + list(range(15000, 15003)) + [9001, 9003]))
        assert s.controller.parts["p"].n == 20000  # (holes kept: the scan below meets them)
        left = s.get_meta(["x"], None, "p", mode="force_fetch")
        for n in (1, 7, 5996, 5997, 10995, 10 ** 6):
            m = s.get_meta(["x"], n, "p", mode="force_fetch")
            assert m.global_indexes == left.global_indexes[:n], n
        assert left.global_indexes[:3] == [every.global_indexes[i] for i in (9000, 9002, 9004)]


def test_sequential_fetches_stay_in_order_while_consumed_and_cleared_rows_leave_the_ready_view(tmp_path):
    """A task consuming thousands of rows batch by batch, with clears in between, gets every
    remaining row once, oldest first (the ready view rebuilds itself as rows leave it)."""
    with _store(tmp_path) as s:
        s.put({"x": np.arange(6000)[:, None]}, partition_id="p")
        every = s.get_meta(["x"], None, "p", mode="force_fetch").global_indexes
        seen = []
        for step in range(40):
            m = s.get_meta(["x"], 100, "p", mode="fetch", task_name="t")
            seen += m.global_indexes
            if step == 20:
                s.clear_samples(s.get_meta(["x"], None, "p", mode="force_fetch").select_samples(
                    list(range(2100, 2600))))
            s.controller.check_mirror()
        cleared = set(every[2100:2600])  # (the next 500 rows not consumed yet)
        assert seen == [g for g in every if g not in cleared][:4000]
        rest = s.get_meta(["x"], 1500, "p", mode="fetch", task_name="t").global_indexes
        assert seen + rest == [g for g in every if g not in cleared]


def test_kv_put_meta_holds_fresh_tags_and_the_common_fields(tmp_path):
    with _store(tmp_path) as s:
        s.kv_batch_put(["a", "b"], "p", {"x": np.arange(2)})
        meta = s.kv_batch_put(["a", "b"], "p", {"y": np.arange(2)}, tags=[None, {"t": 2}])
        assert isinstance(meta, KVBatchMeta) and meta.fields == ["x", "y"]
        assert meta.tags == [{}, {"t": 2}] and meta.tags[0] is not meta.tags[1]
        meta.tags[1]["t"] = 5
        assert s.kv_list("p")["p"]["b"] == {"t": 2}
        assert meta.select_keys(["b"]).keys == ["b"]


@pytest.mark.parametrize("units", [1, 2, 3])
def test_a_put_split_over_units_reads_back_every_row_of_every_shape(tmp_path, units):
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 1000, (1000, 16))
    lp = rng.random(1000, dtype=np.float32)
    keys = [f"k{i}" for i in range(1000)]
    with _store(tmp_path, num_units=units) as s:
        s.kv_batch_put(keys[:10], "p", {"ids": ids[:10], "lp": lp[:10]})
        s.kv_batch_put(keys, "p", {"ids": ids, "lp": lp})  # 10 overwritten, 990 new: mixed positions
        order = list(rng.permutation(1000))
        got = s.kv_batch_get([keys[i] for i in order], "p")
        assert np.array_equal(got["ids"], ids[order]) and np.array_equal(got["lp"], lp[order])


def test_take_rows_equals_a_plain_pick_for_any_positions():
    items = list(range(100))
    for pos in ([], [7], [0, 2, 4, 6], [1, 2, 3], [0, 2, 5], [9, 3, 1], list(range(1, 100, 3)), [4, 4]):
        assert list(take_rows(items, pos)) == [items[p] for p in pos]
    assert list(take_rows(items, np.array([3, 1]))) == [3, 1]


class _Rogue(BaseSampler):
    """Answers a row that is not one of the partition's."""

    def sample(self, ready_indexes, batch_size, **kw):
        return [10 ** 6], [10 ** 6]


def test_a_sampler_answering_rows_outside_the_partition_is_refused_and_marks_nothing(tmp_path):
    with _store(tmp_path) as s:
        s.put({"x": np.arange(4)}, partition_id="p")
        s.set_sampler(_Rogue())
        with pytest.raises(InvalidInputError, match="not \\(unique\\) rows"):
            s.get_meta(["x"], 2, "p", task_name="t")
        s.set_sampler("sequential")
        assert s.get_meta(["x"], 4, "p", task_name="t").size == 4


def test_consumption_status_is_sorted_by_index_and_flags_exactly_the_consumed_rows_after_reuse(tmp_path):
    """Cleared indexes reused by later rows (slots no longer in index order), rows consumed
    before and after: the status lists every live row by index, 1 exactly where consumed."""
    with _store(tmp_path) as s:
        s.put({"x": np.arange(50)[:, None]}, partition_id="p")
        got = s.get_meta(["x"], 20, "p", mode="fetch", task_name="t").global_indexes
        every = s.get_meta(["x"], None, "p", mode="force_fetch")
        gone = [every.global_indexes[i] for i in (1, 3, 30, 31, 40)]
        s.clear_samples(every.select_samples([1, 3, 30, 31, 40]))
        s.put({"x": np.arange(8)[:, None]}, partition_id="p")  # reuses the 5 freed indexes, then new ones
        got += s.get_meta(["x"], 30, "p", mode="fetch", task_name="t").global_indexes
        live = s.get_meta(["x"], None, "p", mode="force_fetch").global_indexes
        assert set(gone) <= set(live)  # (reused)
        g, done = s.get_consumption_status("t", "p")
        assert g.tolist() == sorted(live)
        assert done.tolist() == [1 if x in set(got) else 0 for x in sorted(live)]
        assert not s.check_consumption_status("t", "p")
        s.get_meta(["x"], len(live) - int(done.sum()), "p", mode="fetch", task_name="t")
        assert s.check_consumption_status("t", "p") and s.get_consumption_status("t", "p")[1].all()
        assert s.get_consumption_status("other", "p")[1].tolist() == [0] * len(live)


def _filled_out_of_order(s, meta, positions, rnd, chunks):
    """Fill the rows ``positions`` of the insert-mode ``meta`` in random order, a random
    number (of ``chunks``) at a time, yielding each chunk's positions once it is put."""
    order = list(positions)
    rnd.shuffle(order)
    i = 0
    while i < len(order):
        n = rnd.choice(chunks)
        pos = sorted(order[i:i + n])
        i += n
        s.put({"x": np.asarray(pos)[:, None]}, metadata=meta.select_samples(pos))
        yield pos


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fetches_serve_the_oldest_ready_rows_while_reservations_are_filled_out_of_order(tmp_path, seed):
    """Insert-mode reservations filled in random order (rows becoming ready after newer
    ones, as partial rollouts finish), fetches in between: every fetch gets the oldest ready
    rows not consumed yet, in insertion order, whether few or many rows came late."""
    import random

    rnd = random.Random(seed)
    with _store(tmp_path) as s:
        meta = s.get_meta(["x"], 600, "p", mode="insert")
        ready, consumed = [], set()
        for pos in _filled_out_of_order(s, meta, range(600), rnd, [1, 3, 40, 200]):
            ready += [meta.global_indexes[j] for j in pos]
            for _ in range(rnd.choice([0, 1, 2])):
                b = rnd.choice([1, 5, 32])
                want = sorted(g for g in ready if g not in consumed)[:b]  # (gidx order is insertion order here)
                got = s.get_meta(["x"], b, "p", mode="fetch", task_name="t").global_indexes
                assert got == (want if len(want) == b else []), (len(ready), b)
                consumed.update(got)
            if rnd.random() < 0.1:
                s.controller.check_mirror()
        s.controller.check_mirror()


def test_grpo_fetches_from_the_oldest_rows_equal_those_from_every_ready_row(tmp_path, monkeypatch):
    """The GRPO sampler is asked first with the oldest rows only (a fetch copies a few
    batches, not a million-row backlog): with groups filled out of order and some left
    partial, every fetch hands out exactly what it hands out when given every ready row."""
    import random

    from tqstore import controller_sampling

    def run(path, seed):
        rnd = random.Random(seed)
        got = []
        with tq.open(path, num_units=2, result_type="dict") as s:
            s.set_sampler({"name": "grpo_group_n", "n_samples_per_prompt": 4})
            meta = s.get_meta(["x"], 400, "p", mode="insert")
            skip = set(rnd.sample(range(400), 30))  # rows never filled: their groups stay partial
            for _pos in _filled_out_of_order(s, meta, [i for i in range(400) if i not in skip], rnd, [1, 4, 9, 60]):
                for _ in range(rnd.choice([0, 1, 2])):
                    got.append(s.get_meta(["x"], rnd.choice([4, 8, 16]), "p", mode="fetch",
                                          task_name="t").global_indexes)
            while got[-1:] != [[]]:  # what is left, in batches of two groups
                got.append(s.get_meta(["x"], 8, "p", mode="fetch", task_name="t").global_indexes)
            s.controller.check_mirror()
        return got

    for seed in range(3):
        fronted = run(tmp_path / f"a{seed}", seed)
        monkeypatch.setattr(controller_sampling, "FRONT_ROWS_PER_ROW", 10 ** 9)  # every ready row
        whole = run(tmp_path / f"b{seed}", seed)
        monkeypatch.undo()
        assert fronted == whole
        assert sum(map(len, fronted)) > 200  # (groups were handed out)
