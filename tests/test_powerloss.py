"""The power-loss simulator models what a power cut leaves: synced data stays, unsynced
writes and directory entries are kept, dropped or garbled, renames stay atomic."""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from tqstore._io import failpoints as fp
from tqstore._io import files
from tqstore.testing import DROP_ALL, KEEP_ALL, PowerLoss, SimulatedCrash

SEEDS = [DROP_ALL, KEEP_ALL, 2, 3, 4, 5, 6, 7]


@pytest.fixture
def base():
    """A scratch directory on tmpfs when there is one (inode numbers are not reused there)."""
    parent = "/dev/shm" if os.path.isdir("/dev/shm") else None
    d = Path(tempfile.mkdtemp(prefix="tq-pl-", dir=parent))
    (d / "root").mkdir()
    yield d
    fp.set_observer(None)
    shutil.rmtree(d, ignore_errors=True)


def image_tree(img: Path) -> dict:
    out = {}
    for dirpath, dirnames, filenames in os.walk(img):
        rel = os.path.relpath(dirpath, img)
        for n in dirnames:
            out[os.path.normpath(os.path.join(rel, n))] = "<dir>"
        for n in filenames:
            out[os.path.normpath(os.path.join(rel, n))] = Path(dirpath, n).read_bytes()
    return out


def crash_after(base: Path, seed: int, action, crash_at=None) -> dict:
    sim = PowerLoss(base / "root", base / "img", seed=seed, crash_at=crash_at)
    with sim:
        try:
            action(base / "root")
        except SimulatedCrash:
            pass
    if not sim.crashed:
        sim.crash_now()
    assert sim.errors == []
    return image_tree(base / "img")


def count_events(base: Path, action) -> int:
    shutil.copytree(base / "root", base / "count")
    sim = PowerLoss(base / "count", base / "img", seed=0)
    with sim:
        action(base / "count")
    shutil.rmtree(base / "count")
    return len(sim.events)


def reset(base: Path, template: Path) -> None:
    shutil.rmtree(base / "root")
    shutil.copytree(template, base / "root")


def test_atomic_replace_leaves_old_or_new_content_at_every_crash_point(base):
    files.write_file_atomic(base / "root" / "f", b"old")
    shutil.copytree(base / "root", base / "tmpl")

    def action(root):
        files.write_file_atomic(root / "f", b"new content")

    n = count_events(base, action)
    assert n >= 4  # create, write, fsync, rename, fsync_dir
    for k in range(1, n + 2):
        for seed in SEEDS:
            reset(base, base / "tmpl")
            img = crash_after(base, seed, action, crash_at=k if k <= n else None)
            assert img["f"] in (b"old", b"new content"), (k, seed, img)
            if k > n:
                assert img["f"] == b"new content"  # acknowledged: the directory was fsynced


def test_unsynced_new_file_is_lost_with_drop_all_and_kept_with_keep_all(base):
    def action(root):
        files.write_file(root / "g", b"data", fsync=False)

    assert "g" not in crash_after(base, DROP_ALL, action)
    (base / "root" / "g").unlink()
    assert crash_after(base, KEEP_ALL, action)["g"] == b"data"


def test_file_fsync_without_directory_fsync_does_not_make_the_name_durable(base):
    def action(root):
        files.write_file(root / "g", b"data", fsync=True)

    assert "g" not in crash_after(base, DROP_ALL, action)


def test_directory_fsync_makes_entries_and_synced_data_durable(base):
    def action(root):
        files.write_file(root / "g", b"data", fsync=True)
        files.fsync_dir(root)

    for seed in SEEDS:
        (base / "root" / "g").unlink(missing_ok=True)
        assert crash_after(base, seed, action)["g"] == b"data"


def test_synced_directory_entry_with_unsynced_data_may_be_empty(base):
    def action(root):
        files.write_file(root / "g", b"data", fsync=False)
        files.fsync_dir(root)

    img = crash_after(base, DROP_ALL, action)
    assert img["g"] == b""


def test_unsynced_appends_are_kept_dropped_or_garbled_but_synced_prefix_survives(base):
    with open(base / "root" / "seg", "wb") as f:
        f.write(b"H" * 64)
    shutil.copytree(base / "root", base / "tmpl")
    chunks = [bytes([65 + i]) * 100 for i in range(5)]

    def action(root):
        fd = os.open(root / "seg", os.O_RDWR)
        try:
            off = 64
            for i, c in enumerate(chunks):
                off += files.pwrite_all(fd, [c], off)
                if i == 1:
                    files.fsync_fd(fd)
        finally:
            os.close(fd)

    synced = b"H" * 64 + chunks[0] + chunks[1]
    full = synced + b"".join(chunks[2:])
    seen = set()
    for seed in SEEDS:
        reset(base, base / "tmpl")
        data = crash_after(base, seed, action)["seg"]
        assert data[:len(synced)] == synced
        if seed == DROP_ALL:
            assert data == synced
        if seed == KEEP_ALL:
            assert data == full
        seen.add(data)
    assert len(seen) >= 3  # the seeds really mix outcomes


def test_rename_is_atomic_never_losing_both_names(base):
    files.write_file(base / "root" / "a.tmp", b"payload")
    shutil.copytree(base / "root", base / "tmpl")

    def action(root):
        files.rename(root / "a.tmp", root / "a")

    for seed in SEEDS:
        reset(base, base / "tmpl")
        img = crash_after(base, seed, action)
        assert ("a" in img) != ("a.tmp" in img), img


def test_unsynced_tree_removal_can_resurrect_files(base):
    d = base / "root" / "gen-1"
    d.mkdir()
    (d / "m").write_bytes(b"manifest")
    (d / "x").write_bytes(b"x" * 10)
    shutil.copytree(base / "root", base / "tmpl")

    def action(root):
        files.rmtree(root / "gen-1")

    assert crash_after(base, DROP_ALL, action)["gen-1/m"] == b"manifest"
    reset(base, base / "tmpl")
    assert "gen-1" not in crash_after(base, KEEP_ALL, action)
    reset(base, base / "tmpl")

    def durable(root):
        files.rmtree(root / "gen-1")
        files.fsync_dir(root)

    assert "gen-1" not in crash_after(base, DROP_ALL, durable)


def test_unsynced_directory_rename_moves_the_whole_tree_or_nothing(base):
    def action(root):
        files.mkdir(root / "ck.tmp")
        files.write_file(root / "ck.tmp" / "MANIFEST", b"m")
        files.fsync_dir(root / "ck.tmp")
        files.fsync_dir(root)
        files.rename(root / "ck.tmp", root / "ck")

    for seed in SEEDS:
        shutil.rmtree(base / "root")
        (base / "root").mkdir()
        img = crash_after(base, seed, action)
        assert (img.get("ck/MANIFEST"), img.get("ck.tmp/MANIFEST")) in ((b"m", None), (None, b"m")), img


def test_hard_links_stay_links_in_the_image(base):
    (base / "root" / "seg").write_bytes(b"frames")
    (base / "root" / "ck").mkdir()

    def action(root):
        files.link(root / "seg", root / "ck" / "seg")
        files.fsync_dir(root / "ck")

    crash_after(base, DROP_ALL, action)
    a, b = base / "img" / "seg", base / "img" / "ck" / "seg"
    assert os.stat(a).st_ino == os.stat(b).st_ino


def test_choices_are_deterministic_per_seed(base):
    shutil.copytree(base / "root", base / "tmpl")

    def action(root):
        for i in range(6):
            files.write_file(root / f"f{i}", bytes([i]) * 50, fsync=i % 2 == 0)

    for seed in (2, 3):
        reset(base, base / "tmpl")
        one = crash_after(base, seed, action)
        reset(base, base / "tmpl")
        assert crash_after(base, seed, action) == one


def test_unobserved_changes_follow_the_path_policy(base):
    (base / "root" / "data.mdb").write_bytes(b"A" * 100)
    shutil.copytree(base / "root", base / "tmpl")

    def action(root):
        (root / "data.mdb").write_bytes(b"B" * 100)  # like LMDB: written without the I/O layer
        files.fsync_dir(root)

    for policy, allowed in (("current", {b"B" * 100}), ("atomic", {b"A" * 100, b"B" * 100})):
        for seed in SEEDS:
            reset(base, base / "tmpl")
            sim = PowerLoss(base / "root", base / "img", seed=seed, policy=lambda rel, p=policy: p)
            with sim:
                action(base / "root")
            sim.crash_now()
            assert (base / "img" / "data.mdb").read_bytes() in allowed


def test_crash_point_stops_the_operation_and_images_the_disk_before_the_event(base):
    def action(root):
        files.write_file(root / "a", b"1")
        files.fsync_dir(root)
        files.write_file(root / "b", b"2")

    sim = PowerLoss(base / "root", base / "img", seed=KEEP_ALL, crash_at=5)  # 5th event: create of b
    with sim, pytest.raises(SimulatedCrash):
        action(base / "root")
    assert sim.crash_event.name == "create"
    img = image_tree(base / "img")
    assert img["a"] == b"1"
    # b was already opened (O_CREAT) when its create event fired, but never written
    assert img.get("b", b"") == b""
    assert len(sim.events) == 4 and sim.crashed


def test_a_tree_another_thread_removes_while_the_image_is_made_comes_from_the_model(base, monkeypatch):
    """A store removes a replaced state in a background thread: the power may be cut while
    that removal runs, so the image is made while directories vanish under its walk.  What
    vanished after its removal was observed is imaged from the model (DROP_ALL: the unsynced
    removal is undone, the files come back with their content)."""
    gen = base / "root" / "gen-1"
    (gen / "sub").mkdir(parents=True)
    (gen / "sub" / "m").write_bytes(b"manifest")
    real_walk = os.walk

    def racing_walk(top, *args, **kwargs):
        for dirpath, dirnames, filenames in real_walk(top, *args, **kwargs):
            if dirpath == str(gen / "sub"):
                shutil.rmtree(gen)  # the other thread's removal catches up with the walk
            yield dirpath, dirnames, filenames

    sim = PowerLoss(base / "root", base / "img", seed=DROP_ALL)
    with sim:
        fp.observe("rmtree", str(gen))  # files.rmtree's event, observed before the removal runs
        monkeypatch.setattr(os, "walk", racing_walk)
        sim.crash_now()
    monkeypatch.undo()
    assert sim.errors == []
    assert image_tree(base / "img")["gen-1/sub/m"] == b"manifest"
