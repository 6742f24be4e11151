"""CheckpointManager: numbered generations, keep_last pruning after the newer one is
durable, restore of the newest generation that verifies (falling back past torn or
corrupt ones), and sharing of unchanged segments between generations."""
from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

import tqstore
from tqstore import CheckpointError, CheckpointNotFoundError, CorruptionError, InvalidInputError
from tqstore._io import failpoints as fp
from tqstore.checkpoint import (
    CheckpointFallbackWarning, CheckpointManager, KeepAll, KeepAny, KeepEvery, KeepLast, verify_checkpoint,
)

from checkpoint_helpers import fill, first_segment, flip_byte, payload_offset_of_first_frame, state, truncate


@pytest.fixture(autouse=True)
def _clean_failpoints():
    yield
    fp.disarm()


@pytest.fixture
def store(tmp_path):
    with tqstore.open(tmp_path / "store", num_units=2, segment_bytes=1 << 16) as s:
        yield s


def _dirs(root):
    return sorted(n for n in os.listdir(root) if not n.startswith("."))


def test_keep_last_prunes_older_generations_after_each_save(store, tmp_path):
    m = CheckpointManager(tmp_path / "gens", keep_last=2, store=store)
    for step in (10, 20, 30, 40):
        fill(store, "train", 3, start=step, seed=step)
        m.save(step, metadata={"step": step})
    assert m.steps() == [30, 40] and m.latest_step() == 40
    assert _dirs(tmp_path / "gens") == ["step-0000000030", "step-0000000040"]
    assert m.metadata(30) == {"step": 30}


def test_loading_a_generation_root_as_a_checkpoint_names_the_mistake_and_leaves_nothing_beside_it(store, tmp_path):
    """``load_checkpoint(root)`` (or verify) of a generation root, where a generation was meant,
    says what the directory is and what to call, and creates no lock file beside it."""
    m = CheckpointManager(tmp_path / "gens", keep_last=2, store=store)
    fill(store, "train", 3)
    m.save(1)
    m.save(2)
    before = sorted(os.listdir(tmp_path)), sorted(os.listdir(tmp_path / "gens"))
    want = state(store)
    for call in (store.load_checkpoint, verify_checkpoint):
        with pytest.raises(CheckpointNotFoundError, match=r"generation root.*restore\(\).*step-0000000002"):
            call(tmp_path / "gens")
    assert (sorted(os.listdir(tmp_path)), sorted(os.listdir(tmp_path / "gens"))) == before
    assert state(store) == want


def test_pruning_waits_for_the_newer_generation_to_be_durable(store, tmp_path):
    m = CheckpointManager(tmp_path / "gens", keep_last=1, store=store)
    fill(store, "train", 3)
    m.save(1)
    fp.arm("rename", "eio", 1)  # publication of step 2 fails
    with pytest.raises(CheckpointError):
        m.save(2)
    fp.disarm()
    assert m.steps() == [1]
    verify_checkpoint(m.path(1))


def test_restore_loads_the_newest_generation(store, tmp_path):
    m = CheckpointManager(tmp_path / "gens", store=store)
    fill(store, "train", 4)
    m.save(1)
    fill(store, "train", 4, start=4)
    want = state(store)
    m.save(2)
    store.clear_partition("train")
    assert m.restore() == 2 and state(store) == want


def test_a_link_where_the_roots_lock_file_belongs_is_refused_and_nothing_is_made_at_its_target(store, tmp_path):
    m = CheckpointManager(tmp_path / "gens", store=store)
    fill(store, "train", 4)
    m.save(1)
    lock = next(p for p in (tmp_path / "gens").iterdir() if p.name.startswith(".") and p.name.endswith(".lock"))
    target = tmp_path / "elsewhere"
    lock.unlink()
    lock.symlink_to(target)
    for call in (m.restore, lambda: m.verify(1)):
        with pytest.raises(tqstore.StorageIOError, match="must be a regular file"):
            call()
    assert not os.path.lexists(target)


def test_verify_of_a_generation_takes_verify_checkpoints_options_by_name(store, tmp_path):
    """deep, raise_on_error and progress work as verify_checkpoint's; another name is refused."""
    m = CheckpointManager(tmp_path / "gens", store=store, copy_segments=True)
    fill(store, "train", 4)
    m.save(1)
    seen = []
    assert m.verify(deep=True, progress=seen.append).ok and seen
    flip_byte(sorted(m.path(1).glob("unit-*/seg-*.tqs"))[0], 100)
    with pytest.raises(CorruptionError):
        m.verify(1)
    report = m.verify(1, raise_on_error=False, deep=False)
    assert not report.ok and report.problems
    with pytest.raises(TypeError, match="quick"):
        m.verify(1, quick=True)


@pytest.mark.parametrize("damage", ["truncated-segment", "flipped-frame", "missing-manifest", "flipped-controller"])
def test_restore_falls_back_past_a_torn_newest_generation(store, tmp_path, damage):
    m = CheckpointManager(tmp_path / "gens", keep_last=3, store=store, copy_segments=True)
    fill(store, "train", 6)
    m.save(1)
    fill(store, "train", 6, start=6)
    want = state(store)
    m.save(2)
    fill(store, "train", 6, start=12)
    m.save(3)
    newest = m.path(3)
    seg = sorted(newest.glob("unit-*/seg-*.tqs"))[-1]  # a segment only generation 3 holds
    if damage == "truncated-segment":
        truncate(seg, seg.stat().st_size // 2)
    elif damage == "flipped-frame":
        flip_byte(seg, seg.stat().st_size - 70)
    elif damage == "missing-manifest":
        (newest / "MANIFEST.json").unlink()
    else:
        flip_byte(newest / "controller" / "data.mdb", 100)
    store.clear_partition("train")
    with pytest.warns(CheckpointFallbackWarning, match="generation 3"):
        assert m.restore() == 2
    assert state(store) == want


def test_a_save_below_a_damaged_newer_generation_is_kept_and_restored(store, tmp_path, caplog):
    """After restore() fell back past a damaged newer generation, training goes on from the
    older step: its saves are never pruned for being below the damaged one (keep_last keeps
    the highest steps), so a generation that verifies always remains; the save says which
    higher steps restore() would try first."""
    import logging

    every = CheckpointManager(tmp_path / "gens", store=store, copy_segments=True)  # (keeps all: 10 and 20)
    fill(store, "train", 6)
    every.save(10)
    fill(store, "train", 6, start=6)
    every.save(20)
    m = CheckpointManager(tmp_path / "gens", keep_last=1, store=store, copy_segments=True)
    seg = sorted(m.path(20).glob("unit-*/seg-*.tqs"))[-1]
    flip_byte(seg, seg.stat().st_size - 70)  # bit rot
    with pytest.warns(CheckpointFallbackWarning, match="generation 20"):
        assert m.restore() == 10
    fill(store, "train", 3, start=100)
    want = state(store)
    with caplog.at_level(logging.WARNING, logger="tqstore"):
        m.save(11)
    assert any("below generations [20]" in r.getMessage() for r in caplog.records)
    assert m.steps() == [11, 20]  # 10 dropped by keep_last=1; 11, just written, kept
    store.clear_partition("train")
    with pytest.warns(CheckpointFallbackWarning, match="generation 20"):
        assert m.restore() == 11
    assert state(store) == want


def test_a_torn_generation_is_pruned_once_older_than_every_kept_one_and_never_holds_a_slot(store, tmp_path):
    """A generation directory that lost its MANIFEST.json is deleted once it is older than
    every generation the policy keeps (it stayed forever, and `ls` and `verify` of the root
    reported it damaged forever); it never takes a slot of keep_last from a generation that
    verifies, so a prune never leaves only a torn one."""
    m = CheckpointManager(tmp_path / "gens", keep_last=1, store=store)
    fill(store, "train", 3)
    m.save(10)
    want = state(store)
    fill(store, "train", 3, start=3)
    CheckpointManager(tmp_path / "gens", store=store).save(20)  # (keeps all)
    (m.path(20) / "MANIFEST.json").unlink()  # torn, the newest
    assert m.prune() == [] and m.steps() == [10] and m._torn_steps() == [20]
    store.clear_partition("train")
    with pytest.warns(CheckpointFallbackWarning, match="generation 20"):
        assert m.restore() == 10
    assert state(store) == want
    m.save(30)  # 10 dropped by the policy, the torn 20 older than every generation kept
    assert m.steps() == [30] and m._torn_steps() == [] and not m.path(20).exists()


def test_restore_falls_back_several_generations_and_fails_when_none_verifies(store, tmp_path):
    m = CheckpointManager(tmp_path / "gens", store=store, copy_segments=True)
    fill(store, "train", 4)
    want = state(store)
    m.save(1)
    for step in (2, 3):
        fill(store, "train", 4, start=4 * step, seed=step)
        m.save(step)
    for step in (2, 3):
        (m.path(step) / "controller" / "data.mdb").write_bytes(b"garbage")
    with pytest.warns(CheckpointFallbackWarning):
        assert m.restore() == 1
    assert state(store) == want
    (m.path(1) / "controller" / "data.mdb").write_bytes(b"garbage")
    before = state(store)
    with pytest.warns(CheckpointFallbackWarning), pytest.raises(CheckpointError, match="no generation"):
        m.restore()
    assert state(store) == before


def test_restore_of_an_explicit_step_does_not_fall_back(store, tmp_path):
    m = CheckpointManager(tmp_path / "gens", store=store, copy_segments=True)
    fill(store, "train", 4)
    m.save(1)
    m.save(2)
    seg = first_segment(m.path(2))
    flip_byte(seg, payload_offset_of_first_frame(seg))
    with pytest.raises(CorruptionError):
        m.restore(2)
    assert m.restore(1) == 1
    with pytest.raises(CheckpointNotFoundError):
        m.restore(7)


def test_restore_with_no_generation_raises_file_not_found(store, tmp_path):
    with pytest.raises(FileNotFoundError):
        CheckpointManager(tmp_path / "gens", store=store).restore()


def test_generations_share_unchanged_segments_through_hard_links(store, tmp_path):
    m = CheckpointManager(tmp_path / "gens", store=store)
    fill(store, "train", 40)
    first = m.save(1)
    fill(store, "train", 4, seed=9)  # 10 % of the rows change
    second = m.save(2)
    ino = lambda step: {p.name: p.stat().st_ino for p in m.path(step).glob("unit-*/seg-*.tqs")}  # noqa: E731
    shared = set(ino(1).items()) & set(ino(2).items())
    assert len(shared) >= len(ino(1)) - 2  # old segments shared (the ones the cut sealed may differ)
    assert first.checksummed_bytes > 0
    assert second.checksummed_bytes < first.checksummed_bytes / 4  # only the new segments are read


def test_copy_mode_generations_reuse_the_previous_copy_and_copy_only_what_changed(store, tmp_path):
    m = CheckpointManager(tmp_path / "gens", store=store, copy_segments=True)
    fill(store, "train", 60)
    first = m.save(1)
    assert first.reused_bytes == 0 and first.linked_bytes == 0
    fill(store, "train", 6, seed=9)
    second = m.save(2)
    assert second.reused_bytes > 0
    seg_copied = second.copied_bytes - sum(p.stat().st_size for p in m.path(2).rglob("*.mdb"))
    assert seg_copied < first.copied_bytes / 4
    store_inodes = {p.stat().st_ino for p in store.state_dir.glob("unit-*/seg-*.tqs")}
    assert not {p.stat().st_ino for p in m.path(2).glob("unit-*/seg-*.tqs")} & store_inodes
    want = state(store)
    store.clear_partition("train")
    m.prune()
    shutil.rmtree(m.path(1))  # generation 2 does not depend on generation 1's directory
    assert m.restore() == 2 and state(store) == want


def test_a_segment_shared_with_an_earlier_generation_costs_a_link_and_no_flush(store, tmp_path):
    """The per-generation cost of an unchanged segment: one hard link; the earlier
    generation made it durable, so it is not fsynced again (the new generation's
    directories are, which makes the new names durable)."""
    m = CheckpointManager(tmp_path / "gens", store=store, copy_segments=True)
    fill(store, "train", 60)
    m.save(1)
    fill(store, "train", 6, seed=9)
    events = []
    fp.set_observer(lambda ev, *args: events.append((ev, args)))
    try:
        second = m.save(2)
    finally:
        fp.set_observer(None)
    assert second.reused_bytes > 0
    first_inodes = {p.stat().st_ino for p in m.path(1).glob("unit-*/seg-*.tqs")}
    reused = [p for p in m.path(2).glob("unit-*/seg-*.tqs") if p.stat().st_ino in first_inodes]
    assert reused
    flushed = {os.path.basename(str(a[-1])) + "@" + os.path.basename(os.path.dirname(str(a[-1])))
               for ev, a in events if ev == "fsync_file" and a}
    for p in reused:
        assert f"{p.name}@{p.parent.name}" not in flushed, f"{p} was fsynced again"
    synced_dirs = {os.path.basename(str(a[-1])) for ev, a in events if ev == "fsync_dir" and a}
    assert {p.parent.name for p in reused} <= synced_dirs
    verify_checkpoint(m.path(2))
    want = state(store)
    store.clear_partition("train")
    assert m.restore() == 2 and state(store) == want


def test_a_generation_whose_replacement_was_interrupted_counts_through_its_old_directory(store, tmp_path):
    m = CheckpointManager(tmp_path / "gens", keep_last=2, store=store)
    fill(store, "train", 3)
    m.save(1)
    want = state(store)
    m.save(2)
    os.rename(m.path(2), str(m.path(2)) + ".old")
    assert m.steps() == [1, 2]
    store.clear_partition("train")
    assert m.restore() == 2 and state(store) == want
    m.save(3)
    assert m.steps() == [2, 3] and not os.path.exists(str(m.path(2)) + ".old")


def test_saving_an_existing_step_replaces_it(store, tmp_path):
    m = CheckpointManager(tmp_path / "gens", store=store)
    fill(store, "train", 3)
    m.save(5, metadata={"v": 1})
    m.save(5, metadata={"v": 2})
    assert m.steps() == [5] and m.metadata(5) == {"v": 2}


def test_async_manager_save_prunes_in_the_background(store, tmp_path):
    m = CheckpointManager(tmp_path / "gens", keep_last=1, store=store)
    fill(store, "train", 3)
    m.save(1)
    h = m.save(2, blocking=False)
    m.wait_until_finished()
    assert h.done() and m.steps() == [2]


def test_bad_arguments(store, tmp_path):
    with pytest.raises(InvalidInputError):
        CheckpointManager(tmp_path / "g", keep_last=2, policy=KeepAll())
    with pytest.raises(ValueError):
        CheckpointManager(tmp_path / "g", keep_last=0)
    m = CheckpointManager(tmp_path / "g", store=store)
    for bad in (-1, 1.5, "3", True, np.int64(-2), np.float64(3.0)):
        with pytest.raises(InvalidInputError):
            m.save(bad)


def test_numpy_integer_steps_and_keep_last_are_taken_as_ints(store, tmp_path):
    """A trainer's step counter is often a numpy integer (it was refused)."""
    m = CheckpointManager(tmp_path / "g", store=store, keep_last=np.int64(2))
    fill(store, "train", 3)
    for step in np.arange(1, 4):
        m.save(step)
    assert m.steps() == [2, 3] and all(type(x) is int for x in m.steps()) and m.policy.n == 2
    assert type(m.restore(np.int32(2))) is int and m.path(np.uint8(3)).name == "step-0000000003"


def test_retention_policies_are_pure():
    steps = [0, 100, 150, 200, 250, 300]
    assert KeepLast(2).keep(steps) == {250, 300}
    assert KeepLast(10).keep(steps) == set(steps)
    assert KeepEvery(100).keep(steps) == {0, 100, 200, 300}
    assert KeepAny(KeepLast(1), KeepEvery(200)).keep(steps) == {0, 200, 300}
    assert KeepAll().keep(steps) == set(steps)
    assert KeepLast(3).keep([]) == set()
    with pytest.raises(ValueError):
        KeepEvery(0)


def test_a_policy_s_numbers_and_steps_are_checked_when_it_is_made():
    """KeepEvery(np.int64(5)) was refused while KeepLast took it; KeepSteps([2.7, True])
    became {2, 1} and KeepSteps(["x"]) raised a bare ValueError."""
    from tqstore.checkpoint import KeepSteps
    assert KeepEvery(np.int64(5)).every == 5 and type(KeepEvery(np.int64(5)).every) is int
    assert KeepSteps([np.int64(3), 4]).keep([1, 3, 4, 5]) == {3, 4}
    for bad in ([2.7], [True], [-1], ["x"], 5):
        with pytest.raises(InvalidInputError):
            KeepSteps(bad)
    with pytest.raises(InvalidInputError, match="an instance: KeepEvery"):
        KeepAny(KeepLast(1), KeepEvery)


def test_a_user_policy_may_return_any_iterable_of_steps(store, tmp_path):
    """keep() returning a list made every prune fail (logged only, nothing ever deleted) and
    prune() raise a bare TypeError; something that is no steps is an InvalidInputError."""
    class LastTwo(tqstore.checkpoint.RetentionPolicy):
        def keep(self, steps):
            return list(steps)[-2:]

    m = CheckpointManager(tmp_path / "gens", store=store, policy=LastTwo())
    fill(store, "train", 2)
    for step in range(1, 5):
        m.save(step)
    assert m.steps() == [3, 4]

    class Broken(tqstore.checkpoint.RetentionPolicy):
        def keep(self, steps):
            return 3

    m2 = CheckpointManager(tmp_path / "gens2", store=store, policy=Broken())
    m2.save(1)
    with pytest.raises(InvalidInputError, match="must return the steps to keep"):
        m2.prune()


def test_a_root_removed_after_the_manager_was_made(store, tmp_path):
    """restore() and verify() raised a bare FileNotFoundError (taking the root's lock), which a
    trainer's ``except CheckpointNotFoundError: start fresh`` missed; save() refused the
    missing root the README says a save may use."""
    m = CheckpointManager(tmp_path / "gens", keep_last=2, store=store)
    fill(store, "train", 2)
    shutil.rmtree(tmp_path / "gens")
    for call in (m.restore, m.verify, CheckpointManager.for_reading(tmp_path / "nope").verify):
        with pytest.raises(CheckpointNotFoundError, match="does not exist"):
            call()
    assert not (tmp_path / "nope").exists()
    want = state(store)
    m.save(1)
    store.clear_partition("train")
    assert m.restore() == 1 and state(store) == want


def test_reading_a_directory_that_is_no_checkpoint_leaves_no_lock_file_beside_it(store, tmp_path):
    (tmp_path / "my_data").mkdir()
    (tmp_path / "my_data" / "notes.txt").write_text("x")
    before = sorted(os.listdir(tmp_path))
    for call in (lambda: verify_checkpoint(tmp_path / "my_data"), lambda: store.load_checkpoint(tmp_path / "my_data"),
                 lambda: store.load_checkpoint(tmp_path / "store")):
        with pytest.raises(CheckpointNotFoundError):
            call()
    assert sorted(os.listdir(tmp_path)) == before


def test_a_handles_timeout_must_be_seconds(store, tmp_path):
    h = store.save_checkpoint(tmp_path / "ck", blocking=False)
    for bad in ("1", True, float("nan")):
        with pytest.raises(InvalidInputError, match="timeout must be a number of seconds"):
            h.result(timeout=bad)
    assert h.result(timeout=60).rows >= 0 and h.wait(-1) is True


def test_manager_with_a_custom_policy(store, tmp_path):
    m = CheckpointManager(tmp_path / "gens", store=store, policy=KeepAny(KeepLast(1), KeepEvery(2)))
    fill(store, "train", 2)
    for step in range(1, 6):
        m.save(step)
    assert m.steps() == [2, 4, 5]


@pytest.mark.parametrize("kw", [{"policy": "keep"}, {"policy": 3}, {"policy": KeepLast}, {"policy": KeepAll},
                                {"store": "x"}, {"copy_segments": "no"}])
def test_a_manager_with_a_bad_policy_or_store_is_refused_before_any_save(store, tmp_path, kw):
    """A policy that is not one was only found at the first prune, logged, and no save ever
    pruned: generations piled up."""
    with pytest.raises(InvalidInputError, match=next(iter(kw))):
        CheckpointManager(tmp_path / "gens", **{"store": store, **kw})
    assert not (tmp_path / "gens").exists()


def _shared_segment(m, older, newer):
    """A segment file of generation ``newer`` that generation ``older`` holds too (same origin)."""
    names = {p.relative_to(m.path(older)) for p in m.path(older).glob("unit-*/seg-*.tqs")}
    return sorted(p for p in m.path(newer).glob("unit-*/seg-*.tqs") if p.relative_to(m.path(newer)) in names)[0]


@pytest.mark.parametrize("copy_segments", [False, True])
def test_a_save_never_carries_an_earlier_generations_damaged_file_into_the_new_one(store, tmp_path,
                                                                                 copy_segments):
    """Generation 2's copy of a segment generation 1 shares is damaged (a separate file in
    place of the link): the next save must not link that file into generation 3 (it did, in
    both modes, and with keep_last=2 the prune after it deleted generation 1: no generation
    verified).  Generation 3 verifies and restores; so does generation 1 after a fallback."""
    m = CheckpointManager(tmp_path / "gens", keep_last=3, store=store, copy_segments=copy_segments)
    fill(store, "train", 40)
    m.save(1)
    fill(store, "train", 4, start=40, seed=3)
    m.save(2)
    bad = _shared_segment(m, 1, 2)
    flip_byte(bad, payload_offset_of_first_frame(bad))
    want = state(store)
    m.save(3)
    assert verify_checkpoint(m.path(3)).ok
    store.clear_partition("train")
    assert m.restore() == 3 and state(store) == want
    shutil.rmtree(m.path(3))
    with pytest.warns(CheckpointFallbackWarning):
        assert m.restore() == 1


def test_prune_keeps_the_generation_restore_fell_back_to(store, tmp_path):
    """keep_last=1 with a damaged newest generation: the one restore fell back to is the only
    one that verifies, and prune() keeps it (it deleted it); a later good save lets it go."""
    first_run = CheckpointManager(tmp_path / "gens", store=store)  # (kept every generation)
    fill(store, "train", 6)
    first_run.save(10)
    first_run.save(20)
    m = CheckpointManager(tmp_path / "gens", keep_last=1, store=store)  # the next run keeps one
    seg = first_segment(m.path(20))
    flip_byte(seg, payload_offset_of_first_frame(seg))
    with pytest.warns(CheckpointFallbackWarning):
        assert m.restore() == 10
    assert m.prune() == [] and m.steps() == [10, 20]
    with pytest.warns(CheckpointFallbackWarning):
        assert m.restore() == 10
    m.save(30)
    assert m.steps() == [30]


def test_a_root_whose_generations_all_lost_their_manifests_is_damaged_not_empty(store, tmp_path):
    """A trainer catching CheckpointNotFoundError to start afresh must not start afresh over a
    root whose generations are all there but damaged."""
    m = CheckpointManager(tmp_path / "gens", store=store)
    fill(store, "train", 3)
    m.save(7)
    os.unlink(m.path(7) / "MANIFEST.json")
    with pytest.raises(CheckpointError, match="no generation .* verifies") as e:
        m.restore()
    assert not isinstance(e.value, CheckpointNotFoundError)
    shutil.rmtree(m.path(7))
    with pytest.raises(CheckpointNotFoundError):
        m.restore()


def test_a_save_into_a_root_holding_a_foreign_file_is_refused_before_the_cut(store, tmp_path):
    """A root that came to hold someone else's file: the save says so at once (it published,
    and every prune after it failed, logged only, so retention stopped and the next run could
    not make its manager)."""
    m = CheckpointManager(tmp_path / "gens", keep_last=1, store=store)
    fill(store, "train", 3)
    m.save(1)
    (tmp_path / "gens" / "NOTES.txt").write_text("mine")
    for blocking in (True, False):
        with pytest.raises(CheckpointError, match="NOTES.txt|hold only what tqstore puts there"):
            m.save(2, blocking=blocking)
    assert m.steps() == [1]


def test_a_save_is_not_refused_when_the_save_before_it_renames_an_entry_while_the_root_is_checked(
        store, tmp_path, monkeypatch):
    """Saves with blocking=False every step, nobody waiting: the next save's root check listed
    the root while the previous save published (step-N.tmp-X renamed to step-N) or pruned
    (step-N renamed to .deleting-*); the entry gone by the time it was looked at counted as
    foreign, and ~5 % of the saves raised "... is a checkpoint generation root, and a
    checkpoint generation root must be missing, empty, or hold only what tqstore puts there"."""
    from tqstore.checkpoint import target as T

    m = CheckpointManager(tmp_path / "gens", keep_last=2, store=store)
    fill(store, "train", 3)
    m.save(1)
    listdir = os.listdir

    def racing(d):  # the listing still shows entries a concurrent save or prune renamed meanwhile
        names = listdir(d)
        return names + ["step-0000000002.tmp-1a2b3c4d", ".deleting-step-0000000000-5e6f7a8b"] \
            if os.fspath(d) == os.fspath(tmp_path / "gens") else names
    monkeypatch.setattr(T.os, "listdir", racing)
    assert T.is_generation_root(tmp_path / "gens")
    m.save(2, blocking=False).result()
    monkeypatch.setattr(T.os, "listdir", listdir)
    assert m.steps() == [1, 2]
    (tmp_path / "gens" / "step-0000000007.tmp-0a0b0c0d").write_text("a file, not a directory")  # (still refused)
    assert not T.is_generation_root(tmp_path / "gens")


def test_restore_falls_back_past_a_generation_whose_files_do_not_read_back(store, tmp_path, monkeypatch):
    """A bad sector in the newest generation (reads of its files fail with EIO) falls back as
    damage does (it raised CheckpointError); an I/O error on the store's side is raised."""
    import errno

    m = CheckpointManager(tmp_path / "gens", store=store)
    fill(store, "train", 6)
    m.save(1)
    want = state(store)
    fill(store, "train", 3, start=6, seed=4)
    m.save(2)
    bad_dir = os.fspath(m.path(2))

    def failing(real):
        def call(fd, *args):
            try:
                path = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                path = ""
            if path.startswith(bad_dir + os.sep):
                raise OSError(errno.EIO, "Input/output error")
            return real(fd, *args)
        return call

    monkeypatch.setattr(os, "preadv", failing(os.preadv))
    monkeypatch.setattr(os, "pread", failing(os.pread))
    with pytest.warns(CheckpointFallbackWarning):
        assert m.restore() == 1
    assert state(store) == want


def test_a_manager_root_given_with_a_tilde_is_under_the_home_directory(store, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    m = CheckpointManager("~/run/gens", store=store)
    fill(store, "train", 3)
    m.save(1)
    assert m.root == (tmp_path / "home" / "run" / "gens").resolve() and m.path(1).is_dir()
    assert not (tmp_path / "~").exists()
    store.save_checkpoint("~/one")
    assert (tmp_path / "home" / "one" / "MANIFEST.json").is_file()


def test_a_save_parses_each_kept_generations_manifest_once(store, tmp_path, monkeypatch):
    """The caller of save(blocking=False) waits while the manager lists what the kept
    generations share: each manifest is parsed once while it stays the same file (every save
    parsed every kept generation's manifest again: 0.5 s with 100 generations); a generation
    saved again is parsed again."""
    from tqstore.checkpoint import manager as manager_module

    parsed = []
    real = manager_module.read_manifest
    monkeypatch.setattr(manager_module, "read_manifest", lambda p: parsed.append(os.path.basename(p)) or real(p))
    m = CheckpointManager(tmp_path / "gens", store=store)
    for step in range(1, 6):
        fill(store, "train", 2, start=2 * step, seed=step)
        m.save(step)
    assert sorted(parsed) == [f"step-{s:010d}" for s in range(1, 5)]  # each once, by the save after it
    parsed.clear()
    m.save(3)  # replaced: a new manifest
    m.save(6)
    assert sorted(parsed) == ["step-0000000003", "step-0000000005"]
    want = state(store)
    store.clear_partition("train")
    assert m.restore() == 6 and state(store) == want
