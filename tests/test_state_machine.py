"""A Hypothesis state machine drives a store through puts, clears, consumption, saves (both
modes), checkpoint loads, generation restores, clean reopens and crashes (process kill or
power loss mid-operation, then reopen), and checks it against a plain Python model after
every step.

The store uses ``durability="commit"``: after any crash the store must hold exactly the
model's state before the interrupted operation or after it (after it when the operation
returned), and every checkpoint the model knows must still load to what was saved.

Profiles: a short one for ``make test``; ``TQSTORE_STATEFUL=long`` or ``-m crash`` (the
``crash``-marked test) runs the long one.
"""
from __future__ import annotations

import copy
import os
from collections import Counter
import random
import shutil
import tempfile
from pathlib import Path
from typing import Dict, Optional

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle, RuleBasedStateMachine, initialize, invariant, precondition, rule, run_state_machine_as_test,
)

from tqstore.checkpoint import CheckpointManager, read_manifest, verify_checkpoint
from tqstore.dump import read_row_index, verify_dump
from tqstore.errors import KeyNotFoundError, PartitionNotFoundError
from tqstore.store import Store
from tqstore.testing import PowerLoss, SimulatedCrash, lmdb_policy, run_forked

from crash.harness import copy_tree
from crash.model import digest
from dump_helpers import dump_frames, store_frames

PIDS = ("p0", "p1")
KEYS = tuple(f"k{i}" for i in range(6))
TASKS = ("train", "eval")
SEG = 1 << 16
KEEP = 2

STATS: Counter = Counter()  # rule calls, for a look at what a run exercised

SHORT = settings(max_examples=20, stateful_step_count=20, deadline=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
LONG = settings(max_examples=300, stateful_step_count=50, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


# ---------------------------------------------------------------------------- the model
class Model:
    """``rows[pid][key] = {"tag": ..., "fields": {field: digest}}``; ``consumed[(pid, task)]`` keys."""

    def __init__(self) -> None:
        self.rows: Dict[str, Dict[str, dict]] = {}
        self.consumed: Dict[tuple, set] = {}

    def snapshot(self) -> "Model":
        return copy.deepcopy(self)

    def picture(self) -> dict:
        return {pid: {k: (r["tag"], dict(r["fields"])) for k, r in rows.items()} for pid, rows in self.rows.items()}

    def consumption(self) -> dict:
        return {k: set(v) for k, v in self.consumed.items() if v}

    def put(self, pid: str, keys, fields: Dict[str, list], tag: dict) -> None:
        STATS["put"] += 1
        part = self.rows.setdefault(pid, {})
        for i, k in enumerate(keys):
            r = part.setdefault(k, {"tag": None, "fields": {}})
            r["tag"] = {**r["tag"], **tag} if isinstance(r["tag"], dict) else dict(tag)
            for f, vals in fields.items():
                r["fields"][f] = vals[i]

    def clear(self, pid: str, keys) -> None:
        STATS["clear"] += 1
        part = self.rows.get(pid)
        if part is None:
            return
        for k in keys:
            part.pop(k, None)
        for (p, _t), s in self.consumed.items():
            if p == pid:
                s.difference_update(keys)

    def drop(self, pid: str) -> None:
        self.rows.pop(pid, None)
        for key in [k for k in self.consumed if k[0] == pid]:
            del self.consumed[key]


def store_picture(s: Store) -> tuple:
    rows, cons = {}, {}
    for pid, p in s.controller.parts.items():
        out = {}
        for g, r in p.rows.items():
            fields = {}
            for f in sorted(r.fields):
                fields[f] = digest(s.read(pid, [g], [f])[f][0])
            out[r.key] = (r.tag, fields)
        rows[pid] = out
    for (pid, task), gs in s.controller.consumed.items():
        if gs:
            p = s.controller.parts[pid]
            cons[(pid, task)] = {p.rows[g].key for g in gs}
    return rows, cons


def make_batch(keys, salt: int, *, field: str = "t"):
    n = len(keys)
    if field == "t":
        t = torch.arange(n * 3, dtype=torch.float32).reshape(n, 3) + salt
        fields = {"t": t, "v": [{"k": k, "s": salt} for k in keys]}
        digests = {"t": [digest(t[i]) for i in range(n)], "v": [digest({"k": k, "s": salt}) for k in keys]}
    else:
        w = torch.full((n, 2), salt, dtype=torch.int64)
        fields = {"w": w}
        digests = {"w": [digest(w[i]) for i in range(n)]}
    return fields, digests


# ---------------------------------------------------------------------------- the machine
class StoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        parent = "/dev/shm" if os.path.isdir("/dev/shm") else None
        self.base = Path(tempfile.mkdtemp(prefix="tq-sm-", dir=parent))
        self.store: Optional[Store] = None
        self.model = Model()
        self.cks: Dict[str, Model] = {}
        self.saves: Dict[int, Model] = {}  # save id (in the checkpoint's metadata) -> model at its cut
        self.gens: Dict[int, Model] = {}
        self.next_step = 1
        self.pending = None  # (handle, kind, name/step, snapshot)
        self.dumps: Dict[str, tuple] = {}  # dump name -> (partition, keys, model rows at the cut, frames at the cut)
        self.restore_dumps: Dict[str, tuple] = {}  # dump name -> (partition, {key: row of the model at the dump})

    # -------------------------------------------------------------- helpers
    def _open(self) -> Store:
        return Store(self.base / "store", num_units=2, durability="commit", segment_bytes=SEG, max_workers=1)

    def _mgr(self) -> CheckpointManager:
        return CheckpointManager(self.base / "gens", keep_last=KEEP, store=self.store)

    def _settle(self) -> None:
        if self.pending is None:
            return
        handle, kind, name, snap = self.pending
        self.pending = None
        handle.result()
        self._saved(kind, name, snap)

    def _saved(self, kind: str, name, snap) -> None:
        if kind == "dump":
            self.dumps[name] = snap
            self._check_dump(name)
        elif kind == "ck":
            self.cks[name] = snap
        else:
            self.gens[name] = snap
            for s in sorted(self.gens)[:-KEEP]:
                del self.gens[s]

    @initialize()
    def start(self) -> None:
        self.store = self._open()

    def teardown(self) -> None:
        try:
            if self.store is not None and not self.store.closed:
                self._settle()
                self.store.close()
            for name in self.cks:
                assert verify_checkpoint(self.base / name, raise_on_error=False).ok, name
            for name in self.dumps:
                self._check_dump(name)
        finally:
            shutil.rmtree(self.base, ignore_errors=True)

    # -------------------------------------------------------------- data plane
    @rule(pid=st.sampled_from(PIDS), keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=4, unique=True),
          salt=st.integers(0, 10_000))
    def put(self, pid, keys, salt) -> None:
        fields, digests = make_batch(keys, salt)
        self.store.kv_batch_put(keys, pid, fields, tags=[{"s": salt}] * len(keys))
        self.model.put(pid, keys, digests, {"s": salt})

    @rule(pid=st.sampled_from(PIDS), keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=3, unique=True),
          salt=st.integers(0, 10_000))
    def put_other_field(self, pid, keys, salt) -> None:
        STATS["put_other_field"] += 1
        fields, digests = make_batch(keys, salt, field="w")
        self.store.kv_batch_put(keys, pid, fields, tags=[{"w": salt}] * len(keys))
        self.model.put(pid, keys, digests, {"w": salt})

    @rule(pid=st.sampled_from(PIDS), keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=3, unique=True))
    def clear(self, pid, keys) -> None:
        self.store.kv_clear(keys, pid)
        self.model.clear(pid, keys)

    @rule(pid=st.sampled_from(PIDS))
    def clear_partition(self, pid) -> None:
        STATS["clear_partition"] += 1
        self.store.clear_partition(pid)
        self.model.drop(pid)

    @rule(pid=st.sampled_from(PIDS), task=st.sampled_from(TASKS), n=st.integers(1, 3))
    def consume(self, pid, task, n) -> None:
        STATS["consume"] += 1
        meta = self.store.get_meta(["t"], n, pid, mode="fetch", task_name=task)
        got = list(meta.keys)
        done = self.model.consumed.setdefault((pid, task), set())
        ready = {k for k, r in self.model.rows.get(pid, {}).items() if "t" in r["fields"]} - done
        assert set(got) <= ready, f"fetch returned {set(got) - ready} (not ready, or consumed)"
        assert len(got) in (0, n) and (len(got) == n or len(ready) < n), (got, ready, n)
        done.update(got)

    # -------------------------------------------------------------- checkpoints
    @rule(name=st.sampled_from(["ckA", "ckB"]), blocking=st.booleans())
    def save(self, name, blocking) -> None:
        STATS["save"] += 1
        self._settle()
        snap = self.model.snapshot()
        sid = len(self.saves) + 1
        self.saves[sid] = snap
        h = self.store.save_checkpoint(self.base / name, blocking=blocking, metadata={"id": sid})
        if blocking:
            self._saved("ck", name, snap)
        else:
            self.pending = (h, "ck", name, snap)

    @rule(blocking=st.booleans())
    def save_generation(self, blocking) -> None:
        STATS["save_generation"] += 1
        self._settle()
        step, self.next_step = self.next_step, self.next_step + 1
        snap = self.model.snapshot()
        h = self._mgr().save(step, blocking=blocking)
        if blocking:
            self._saved("gen", step, snap)
        else:
            self.pending = (h, "gen", step, snap)

    # -------------------------------------------------------------- selective dumps
    @rule(name=st.sampled_from(["dA", "dB"]), pid=st.sampled_from(PIDS), blocking=st.booleans(),
          keys=st.lists(st.sampled_from(KEYS), max_size=4))
    def dump(self, name, pid, keys, blocking) -> None:
        STATS["dump"] += 1
        self._settle()
        rows = self.model.rows.get(pid)
        if rows is None or any(k not in rows for k in keys):
            with pytest.raises(PartitionNotFoundError if rows is None else KeyNotFoundError):
                h = self.store.dump_data_by_key(self.base / name, keys, pid, blocking=blocking)
                h.result()  # (blocking=False: the job checks the keys in the cut's snapshot)
            return
        wanted = set(keys)  # duplicates dropped; the dump lists its rows in the partition's insertion order
        keys = [k for k in rows if k in wanted]
        cut = (pid, keys, {k: (rows[k]["tag"], sorted(rows[k]["fields"])) for k in keys},
               store_frames(self.store, pid, keys))
        h = self.store.dump_data_by_key(self.base / name, keys, pid, blocking=blocking)
        if blocking:
            self._saved("dump", name, cut)
        else:
            self.pending = (h, "dump", name, cut)

    def _check_dump(self, name: str) -> None:
        pid, keys, rows, frames = self.dumps[name]
        ri = read_row_index(self.base / name)
        assert ri["partition_id"] == pid and list(ri["rows"]) == keys
        assert {k: (r["tag"], r["fields"]) for k, r in ri["rows"].items()} == rows
        assert dump_frames(self.base / name) == frames
        assert verify_dump(self.base / name) == []

    @precondition(lambda self: self.cks or (self.pending and self.pending[1] == "ck"))
    @rule(data=st.data())
    def load(self, data) -> None:
        STATS["load"] += 1
        self._settle()
        name = data.draw(st.sampled_from(sorted(self.cks)))
        self.store.load_checkpoint(self.base / name)
        self.model = self.cks[name].snapshot()

    @precondition(lambda self: self.gens or (self.pending and self.pending[1] == "gen"))
    @rule(data=st.data())
    def restore_generation(self, data) -> None:
        STATS["restore_generation"] += 1
        self._settle()
        step = data.draw(st.sampled_from([None] + sorted(self.gens)))
        got = self._mgr().restore(step)
        assert got == (max(self.gens) if step is None else step)
        self.model = self.gens[got].snapshot()

    @rule()
    def reopen(self) -> None:
        STATS["reopen"] += 1
        self._settle()
        self.store.close()
        self.store = self._open()

    # -------------------------------------------------------------- crashes
    @rule(kind=st.sampled_from(["kill", "power"]), what=st.sampled_from(["put", "clear", "save", "load"]),
          seed=st.integers(0, 2**16))
    def crash(self, kind, what, seed) -> None:
        """Run one operation in a forked child that dies in the middle (kill -9 at a random
        failpoint occurrence, or a simulated power cut at a random I/O event), reopen."""
        STATS["crash"] += 1
        self._settle()
        if what == "load" and not self.cks:
            what = "put"
        rng = random.Random(seed)
        before = self.model.snapshot()
        after = self.model.snapshot()
        keys = rng.sample(KEYS, rng.randint(1, 3))
        pid = rng.choice(PIDS)
        salt = rng.randint(0, 10_000)
        ck_name = rng.choice(sorted(self.cks)) if what == "load" else rng.choice(["ckA", "ckC"])
        sid = len(self.saves) + 1
        self.saves[sid] = before.snapshot()  # a save does not change the live state
        fields, digests = make_batch(keys, salt)
        if what == "put":
            after.put(pid, keys, digests, {"s": salt})
        elif what == "clear":
            after.clear(pid, keys)
        elif what == "load":
            after = self.cks[ck_name].snapshot()
        base, store_dir = self.base, self.base / "store"

        def op() -> None:
            with Store(store_dir, durability="commit", segment_bytes=SEG, max_workers=1) as s:
                if what == "put":
                    s.kv_batch_put(keys, pid, fields, tags=[{"s": salt}] * len(keys))
                elif what == "clear":
                    s.kv_clear(keys, pid)
                elif what == "save":
                    s.save_checkpoint(base / ck_name, metadata={"id": sid})
                else:
                    s.load_checkpoint(base / ck_name)

        STATS[f"crash:{kind}:{what}"] += 1
        self.store.close()
        if kind == "kill":
            name = rng.choice(["write", "fsync_file", "fsync_dir", "rename", "unit_commit", "controller_commit",
                               "mkdir", "link", "copy"])
            res = run_forked(op, failpoints=[(name, "kill", rng.randint(1, 8))], timeout_s=60)
            assert res.ok or res.killed, res.error
            acked = res.ok
        else:
            img = self.base.parent / (self.base.name + "-img")

            def child():
                sim = PowerLoss(base, img, seed=rng.randint(0, 5), crash_at=rng.randint(1, 60),
                                policy=lmdb_policy("store", synced=True))
                sim.start()
                try:
                    op()
                except SimulatedCrash:
                    pass
                except BaseException:
                    if not sim.crashed:
                        raise
                acked = not sim.crashed
                sim.crash_now()
                assert not sim.errors, sim.errors
                return acked

            res = run_forked(child, timeout_s=60)
            assert res.ok, res.error
            acked = res.value
            shutil.rmtree(self.base)
            os.rename(img, self.base)
        self.store = self._open()
        got = store_picture(self.store)
        want_after = (after.picture(), after.consumption())
        want_before = (before.picture(), before.consumption())
        if acked:
            assert got == want_after, f"{kind} after an acknowledged {what}: the store lost it"
        else:
            assert got in (want_before, want_after), f"{kind} during {what}: the store is torn"
        self.model = after if got == want_after else before
        if what == "save":
            exists = (self.base / ck_name).exists() or (self.base / (ck_name + ".old")).exists()
            if not exists:
                assert not acked, "acknowledged checkpoint lost"
                assert ck_name not in self.cks, f"the previous checkpoint {ck_name} was lost by a {kind} crash"
                return
            assert verify_checkpoint(self.base / ck_name, raise_on_error=False).ok, \
                f"torn checkpoint {ck_name} visible after a {kind} crash"
            got_id = read_manifest(self.base / ck_name).metadata["id"]
            prev = self.cks.get(ck_name)
            assert got_id == sid or (not acked and prev is not None and self.saves[got_id] is prev), \
                f"{ck_name} holds save {got_id} after a {kind} crash of save {sid} (acknowledged: {acked})"
            self.cks[ck_name] = self.saves[got_id]

    # -------------------------------------------------------------- selective restores (load by key, recover)
    @rule(pid=st.sampled_from(PIDS), keys=st.lists(st.sampled_from(KEYS), min_size=0, max_size=4, unique=True),
          name=st.sampled_from(["dA", "dB"]))
    def restore_dump(self, pid, keys, name) -> None:
        """A dump for the load rules (of the keys the partition has)."""
        self._settle()
        part = self.model.rows.get(pid)
        if part is None:
            return
        keys = [k for k in keys if k in part]
        STATS["restore_dump"] += 1
        self.store.dump_data_by_key(self.base / "dumps" / name, keys, pid)
        self.restore_dumps[name] = (pid, {k: copy.deepcopy(part[k]) for k in keys})

    def _loaded(self, model: Model, name: str) -> Model:
        """``model`` after the load of dump ``name``: its rows take the dump's tag and fields."""
        out = model.snapshot()
        pid, rows = self.restore_dumps[name]
        part = out.rows.setdefault(pid, {})
        for k, r in rows.items():
            row = part.setdefault(k, {"tag": None, "fields": {}})
            row["tag"] = copy.deepcopy(r["tag"])
            row["fields"].update(r["fields"])
        return out

    @precondition(lambda self: self.restore_dumps)
    @rule(data=st.data())
    def load_by_key(self, data) -> None:
        STATS["load_by_key"] += 1
        self._settle()
        name = data.draw(st.sampled_from(sorted(self.restore_dumps)))
        rep = self.store.load_data_by_key(self.base / "dumps" / name)
        assert rep["keys"] == len(self.restore_dumps[name][1])
        self.model = self._loaded(self.model, name)

    @precondition(lambda self: self.restore_dumps)
    @rule(data=st.data(), kind=st.sampled_from(["kill", "power"]), cancel=st.booleans(), seed=st.integers(0, 2**16))
    def crash_load_by_key(self, data, kind, cancel, seed) -> None:
        """A load by key dies in a forked child (kill -9 at a random failpoint occurrence, or a
        power cut at a random I/O event); after the reopen the load is done, not visible, or
        pending (then nothing of it is visible) and ``recover_data_load`` completes or cancels it."""
        self._settle()
        name = data.draw(st.sampled_from(sorted(self.restore_dumps)))
        rng = random.Random(seed)
        before, after = self.model.snapshot(), self._loaded(self.model, name)
        store_dir, dump = self.base / "store", self.base / "dumps" / name

        def op() -> None:
            with Store(store_dir, durability="commit", segment_bytes=SEG, max_workers=1) as s:
                s.load_data_by_key(dump)

        STATS[f"crash_load_by_key:{kind}"] += 1
        self.store.close()
        if kind == "kill":
            point = rng.choice(["write", "fsync_file", "fsync_dir", "rename", "unit_commit", "controller_commit"])
            res = run_forked(op, failpoints=[(point, "kill", rng.randint(1, 10))], timeout_s=60)
            assert res.ok or res.killed, res.error
            acked = res.ok
        else:
            img = self.base.parent / (self.base.name + "-img")

            def child():
                sim = PowerLoss(self.base, img, seed=rng.randint(0, 5), crash_at=rng.randint(1, 80),
                                policy=lmdb_policy("store", synced=True))
                sim.start()
                try:
                    op()
                except SimulatedCrash:
                    pass
                except BaseException:
                    if not sim.crashed:
                        raise
                done = not sim.crashed
                sim.crash_now()
                assert not sim.errors, sim.errors
                return done

            res = run_forked(child, timeout_s=60)
            assert res.ok, res.error
            acked = res.value
            shutil.rmtree(self.base)
            os.rename(img, self.base)
        self.store = self._open()
        got = store_picture(self.store)
        want_after = (after.picture(), after.consumption())
        want_before = (before.picture(), before.consumption())
        if self.store.controller.restores():
            STATS["crash_load_by_key:pending"] += 1
            assert not acked and got == want_before, "a pending restore is visible"
            assert self.store.recover_data_load(dump, cancel=cancel) is True
            assert self.store.recover_data_load(dump, cancel=cancel) is False
            got = store_picture(self.store)
            assert got == (want_before if cancel else want_after), f"recover_data_load(cancel={cancel})"
        elif acked:
            assert got == want_after, f"{kind} after an acknowledged load by key: the store lost it"
        else:
            assert got in (want_before, want_after), f"{kind} during a load by key: the store is torn"
        self.store.recover_data_load(dump)  # a marker a crash before the restore began may leave
        self.model = after if got == want_after else before

    # -------------------------------------------------------------- the check
    @invariant()
    def matches_model(self) -> None:
        if self.store is None:
            return
        rows, cons = store_picture(self.store)
        assert rows == self.model.picture()
        assert cons == self.model.consumption()


def _run(profile: settings) -> None:
    run_state_machine_as_test(StoreMachine, settings=profile)


def test_store_behaves_like_the_model():
    _run(LONG if os.environ.get("TQSTORE_STATEFUL") == "long" else SHORT)


@pytest.mark.crash
def test_store_behaves_like_the_model_long():
    _run(LONG)
