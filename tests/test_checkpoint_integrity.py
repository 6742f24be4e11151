"""Damaged checkpoints and interrupted saves.

A flipped, truncated, missing or foreign file makes the load fail with a clear error
naming the file (and offset) and leaves the running store exactly as it was;
verify_checkpoint finds the same damage.  A save that fails or is killed at any step of
its publication leaves the previous checkpoint readable.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import textwrap
from pathlib import Path

import pytest

import tqstore
from tqstore import CheckpointError, CorruptionError
from tqstore._io import failpoints as fp
from tqstore.checkpoint import resolve_checkpoint_dir, verify_checkpoint

from checkpoint_helpers import first_segment, open_files_under, flip_byte, payload_offset_of_first_frame, rewrite, state, truncate, fill

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """A 2-unit checkpoint to copy and damage (copies: damage never reaches a store)."""
    d = tmp_path_factory.mktemp("integrity")
    with tqstore.open(d / "src", num_units=2) as s:
        fill(s, "train", 12)
        want = state(s)
        s.save_checkpoint(d / "ckpt", copy_segments=True)
    return d / "ckpt", want


@pytest.fixture
def live(tmp_path):
    with tqstore.open(tmp_path / "live", num_units=2) as s:
        fill(s, "live", 6, prefix="L", seed=42)
        yield s


@pytest.fixture(autouse=True)
def _no_failpoints():
    yield
    fp.disarm()
    fp.set_observer(None)


def _damaged(pristine, tmp_path, how):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(pristine[0], ckpt)
    return ckpt, how(ckpt)


def _flip_segment(c):
    seg = first_segment(c)
    off = payload_offset_of_first_frame(seg)
    flip_byte(seg, off)
    return seg, off


def _flip_segment_header(c):
    seg = first_segment(c)
    flip_byte(seg, 5)
    return seg, None


def _truncate_segment(c):
    seg = first_segment(c)
    truncate(seg, seg.stat().st_size - 100)
    return seg, None


def _delete_segment(c):
    seg = first_segment(c)
    seg.unlink()
    return seg, None


def _flip_index(c):
    p = c / "unit-001" / "index" / "data.mdb"
    flip_byte(p, 4096 + 200)
    return p, 0


def _flip_controller(c):
    p = c / "controller" / "data.mdb"
    flip_byte(p, p.stat().st_size - 4096 + 10)
    return p, 0


def _truncate_controller(c):
    p = c / "controller" / "data.mdb"
    truncate(p, 4096)
    return p, None


def _edit_manifest(c):
    p = c / "MANIFEST.json"
    d = json.loads(p.read_text())
    d["snapshot"]["rows"] += 1
    p.write_text(json.dumps(d))
    return p, None


def _garbage_manifest(c):
    p = c / "MANIFEST.json"
    rewrite(p, p.read_bytes()[:50])
    return p, None


DAMAGE = {
    "segment-payload-bit-flip": _flip_segment,
    "segment-header-bit-flip": _flip_segment_header,
    "segment-truncated": _truncate_segment,
    "segment-missing": _delete_segment,
    "unit-index-bit-flip": _flip_index,
    "controller-bit-flip": _flip_controller,
    "controller-truncated": _truncate_controller,
    "manifest-edited": _edit_manifest,
    "manifest-torn": _garbage_manifest,
}


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_a_damaged_checkpoint_fails_the_load_and_leaves_the_store_unchanged(pristine, live, tmp_path, kind):
    ckpt, (path, offset) = _damaged(pristine, tmp_path, DAMAGE[kind])
    before, state_dir = state(live), live.state_dir
    with pytest.raises(CorruptionError) as ei:
        live.load_checkpoint(ckpt)
    assert str(path) in str(ei.value)
    if offset is not None:
        assert ei.value.offset is not None and ei.value.offset <= offset
    assert state(live) == before and live.state_dir == state_dir
    assert [p.name for p in live.root.glob("state-*")] == [state_dir.name]
    with pytest.raises(CorruptionError):
        verify_checkpoint(ckpt)
    rep = verify_checkpoint(ckpt, raise_on_error=False)
    assert not rep.ok and any(str(path) in str(p) for p in rep.problems)


def test_verify_names_the_file_and_offset_of_a_bad_frame(pristine, tmp_path):
    ckpt, (seg, off) = _damaged(pristine, tmp_path, _flip_segment)
    with pytest.raises(CorruptionError) as ei:
        verify_checkpoint(ckpt)
    e = ei.value
    assert e.path == str(seg) and e.offset is not None and e.offset <= off < e.offset + 4096
    assert e.expected_crc is not None and e.actual_crc is not None and e.expected_crc != e.actual_crc


def test_verify_reports_foreign_files_and_the_load_ignores_them(pristine, live, tmp_path):
    ckpt, _ = _damaged(pristine, tmp_path, lambda c: (c / "unit-000" / "stray.bin").write_bytes(b"x"))
    rep = verify_checkpoint(ckpt, raise_on_error=False)
    assert [("stray.bin" in p.path) for p in rep.problems] == [True]
    live.load_checkpoint(ckpt)
    assert state(live) == pristine[1]


def test_a_clean_checkpoint_verifies_with_every_frame_checked(pristine):
    rep = verify_checkpoint(pristine[0])
    assert rep.ok and rep.rows == 12 and rep.frames_checked == 12 * 6 and rep.bytes_checked == rep.total_bytes
    assert verify_checkpoint(pristine[0], deep=False).frames_checked == 0


# ------------------------------------------------------------------ interrupted publication
def test_a_replacement_interrupted_between_its_renames_leaves_the_old_one_readable(pristine, live, tmp_path):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(pristine[0], ckpt)
    os.rename(ckpt, tmp_path / "ckpt.old")  # crash after "final -> .old", before "tmp -> final"
    assert resolve_checkpoint_dir(ckpt) == tmp_path / "ckpt.old"
    live.load_checkpoint(ckpt)
    assert state(live) == pristine[1]
    fill(live, "more", 2)
    live.save_checkpoint(ckpt)  # the next save to the path publishes and removes the .old
    assert sorted(n for n in os.listdir(tmp_path) if n.startswith("ckpt")) == ["ckpt"]
    verify_checkpoint(ckpt)


def test_leftovers_of_an_interrupted_save_are_ignored_and_then_removed(pristine, live, tmp_path):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(pristine[0], ckpt)
    junk = tmp_path / "ckpt.tmp-deadbeef"
    shutil.copytree(pristine[0], junk)
    (junk / "MANIFEST.json").unlink()
    live.load_checkpoint(ckpt)
    live.save_checkpoint(ckpt)
    assert not junk.exists()


@pytest.mark.parametrize("point,at", [("rename", 1), ("rename", 2), ("fsync_dir", 1), ("fsync_file", 3),
                                      ("link", 1), ("write", 1), ("mkdir", 2)])
def test_a_failing_step_of_a_save_leaves_the_previous_checkpoint_intact(tmp_path, point, at):
    with tqstore.open(tmp_path / "store", num_units=2) as s:
        fill(s, "train", 6)
        want = state(s)
        s.save_checkpoint(tmp_path / "ckpt", metadata={"v": 1})
        fill(s, "train", 6, seed=3)
        fp.arm(point, "eio", at)
        with pytest.raises(CheckpointError):
            s.save_checkpoint(tmp_path / "ckpt", metadata={"v": 2})
        fp.disarm()
        assert not list(tmp_path.glob("ckpt.tmp-*"))
        assert verify_checkpoint(tmp_path / "ckpt").metadata == {"v": 1}
        s.load_checkpoint(tmp_path / "ckpt")
        assert state(s) == want


@pytest.mark.parametrize("point,at", [("link", 1), ("copy", 2), ("rename", 1)])
def test_a_failing_step_of_a_load_leaves_the_store_unchanged(pristine, live, tmp_path, point, at):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(pristine[0], ckpt)
    before, state_dir = state(live), live.state_dir
    fp.arm(point, "eio", at)
    with pytest.raises(CheckpointError):
        live.load_checkpoint(ckpt)
    fp.disarm()
    assert state(live) == before and live.state_dir == state_dir
    assert [p.name for p in live.root.glob("state-*")] == [state_dir.name]


_KILL_SCRIPT = textwrap.dedent("""
    import sys, torch, tqstore
    from tqstore._io import failpoints as fp
    name, _, point = sys.argv[3].partition("=")
    action, _, at = point.partition("@")
    fp.arm(name, action, int(at))
    s = tqstore.open(sys.argv[1])
    s.kv_batch_put(["new"], "train", {"text": ["written after the first checkpoint"]})
    s.save_checkpoint(sys.argv[2], metadata={"v": 2})
    print("survived")
""")


@pytest.mark.parametrize("spec", ["rename=kill@1", "rename=kill@2", "fsync_dir=kill@3", "rmtree=kill@1"])
def test_a_process_killed_while_publishing_never_loses_the_last_checkpoint(tmp_path, forkrun, spec):
    with tqstore.open(tmp_path / "store", num_units=2) as s:
        fill(s, "train", 5)
        want = state(s)
        s.save_checkpoint(tmp_path / "ckpt", metadata={"v": 1})
    r = forkrun.run("code", _KILL_SCRIPT, [tmp_path / "store", tmp_path / "ckpt", spec], cwd=tmp_path, timeout=120,
                    env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode == fp.KILL_EXIT_CODE, r.stderr
    v = verify_checkpoint(tmp_path / "ckpt").metadata["v"]  # the old one, or the new one if it was published
    with tqstore.open(tmp_path / "store") as s:
        s.load_checkpoint(tmp_path / "ckpt")
        if v == 1:
            assert state(s) == want
        else:
            assert s.kv_batch_get(["new"], "train")["text"] == ["written after the first checkpoint"]
        s.save_checkpoint(tmp_path / "ckpt", metadata={"v": 3})  # the path is usable again
    assert sorted(n for n in os.listdir(tmp_path) if n.startswith("ckpt")) == ["ckpt"]


# ------------------------------------------------------------------ the frame-check kernel in the scans
def _first_frame_edit(edit):
    """Edit the first frame of the first segment (re-sealing its CRC where the frame still has
    one at the same place), then re-sign the manifest: only the frame checks can see it."""
    def how(ckpt):
        import crc32c as crc32c_pkg
        from tqstore._format.layout import SEGMENT_HEADER_SIZE, payload_offset
        from checkpoint_helpers import resign

        seg = first_segment(ckpt)
        data = bytearray(seg.read_bytes())
        f = SEGMENT_HEADER_SIZE
        hlen = int.from_bytes(data[f + 6:f + 8], "little")
        plen = int.from_bytes(data[f + 8:f + 16], "little")
        end = f + payload_offset(hlen) + plen
        edit(data, f, end)
        data[end:end + 4] = crc32c_pkg.crc32c(bytes(data[f:end])).to_bytes(4, "little")
        rewrite(seg, bytes(data))
        resign(ckpt)
        return seg, f
    return how


FRAME_DAMAGE = {  # what the checkpoint scans did not check before the kernel
    "padding": (lambda d, f, end: d.__setitem__(end + 8 + ((-(end - f + 8)) % 64 or 1) - 1, 7), "padding"),
    "extent": (lambda d, f, end: d.__setitem__(slice(f + 8, f + 16), (int.from_bytes(d[f + 8:f + 16], "little")
                                                                       + 64).to_bytes(8, "little")), "extent"),
    "version": (lambda d, f, end: d.__setitem__(f + 4, 2), "version 2"),
}


@pytest.mark.parametrize("kind", sorted(FRAME_DAMAGE))
def test_checkpoint_scans_check_exact_extents_padding_and_versions(pristine, live, tmp_path, kind):
    from tqstore.errors import FormatVersionError

    edit, words = FRAME_DAMAGE[kind]
    ckpt, (seg, off) = _damaged(pristine, tmp_path, _first_frame_edit(edit))
    cls = FormatVersionError if kind == "version" else CorruptionError
    before = state(live)
    with pytest.raises(cls, match=words) as ei:
        verify_checkpoint(ckpt)
    assert ei.value.path == str(seg) and ei.value.offset == off
    with pytest.raises(cls, match=words):
        live.load_checkpoint(ckpt)
    assert state(live) == before
    with tqstore.open(tmp_path / "other", num_units=3) as s:  # the reshard loader
        with pytest.raises(cls, match=words):
            s.load_checkpoint(ckpt)



@pytest.mark.parametrize("version", [0, 2, "damaged"])
def test_verify_rejects_a_segment_header_of_another_version_by_name_as_the_load_does(pristine, live, tmp_path,
                                                                                    version):
    """verify_checkpoint covered the header only by the file's CRC32C: a re-signed checkpoint
    whose segment header declares another version verified clean, and its load then failed
    naming the staged copy."""
    import crc32c as crc32c_pkg
    from tqstore.errors import FormatVersionError
    from tqstore._format.layout import SEGMENT_HEADER_SIZE
    from checkpoint_helpers import resign

    def how(ckpt):
        seg = first_segment(ckpt)
        data = bytearray(seg.read_bytes())
        if version == "damaged":  # (a header whose own CRC32C fails, the file re-signed)
            data[20] ^= 1
        else:
            data[4:6] = version.to_bytes(2, "little")
            data[SEGMENT_HEADER_SIZE - 4:SEGMENT_HEADER_SIZE] = crc32c_pkg.crc32c(
                bytes(data[:SEGMENT_HEADER_SIZE - 4])).to_bytes(4, "little")
        rewrite(seg, bytes(data))
        resign(ckpt)
        return seg

    ckpt, seg = _damaged(pristine, tmp_path, how)
    cls, words = (CorruptionError, "segment header checksum mismatch") if version == "damaged" else \
        (FormatVersionError, f"segment format version {version}")
    for deep in (True, False):
        with pytest.raises(cls, match=words) as ei:
            verify_checkpoint(ckpt, deep=deep)
        assert ei.value.path == str(seg)
        rep = verify_checkpoint(ckpt, deep=deep, raise_on_error=False)
        assert not rep.ok and [p.path for p in rep.problems] == [str(seg)]
    before = state(live)
    with pytest.raises(cls, match=words) as ei:
        live.load_checkpoint(ckpt)
    assert state(live) == before and ei.value.path == str(seg)  # (the checkpoint's file, not a staged copy)
    with tqstore.open(tmp_path / "other", num_units=3) as s:  # (the reshard load read the frames only)
        with pytest.raises(cls, match=words):
            s.load_checkpoint(ckpt)
        assert s.kv_list() == {}


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
def test_a_load_failing_after_the_staged_controller_opened_closes_it_and_the_next_load_succeeds(
        pristine, live, tmp_path, monkeypatch):
    # the staged controller opens while the units are still being staged; a unit failing
    # after that (an I/O error injected once the controller is open) must close it with the
    # abandoned state (no file of it stays open) and change nothing
    import threading

    from tqstore import state_switch

    opened = threading.Event()
    real_open = state_switch.EarlyParts.open_controller

    def open_controller(self):
        real_open(self)
        opened.set()

    def failing_stage(target_dir, plan):
        assert opened.wait(30)
        raise OSError(5, "injected I/O error while staging a unit")

    monkeypatch.setattr(state_switch.EarlyParts, "open_controller", open_controller)
    monkeypatch.setattr(live.units[1], "stage_import", failing_stage)
    _a_failed_load_changes_nothing(live, pristine, monkeypatch, "injected")
    assert opened.is_set()


def test_a_load_whose_staged_controller_cannot_be_synced_fails_and_changes_nothing(pristine, live, monkeypatch):
    # the staged controller copy is opened (decoded) while its fsync runs; a failed fsync must
    # fail the load after that open, close the opened controller and leave the store as it was
    import threading

    from tqstore import state_switch

    opened = threading.Event()
    real_open = state_switch.EarlyParts.open_controller
    real_sync = type(live.controller).sync_staged
    synced = []

    def open_controller(self):
        real_open(self)
        opened.set()

    def failing_sync(self, target_dir):
        assert opened.wait(30)  # the open did not wait for the sync
        real_sync(self, target_dir)
        synced.append(target_dir)
        raise OSError(5, "injected fsync failure of the staged controller")

    monkeypatch.setattr(state_switch.EarlyParts, "open_controller", open_controller)
    monkeypatch.setattr(type(live.controller), "sync_staged", failing_sync)
    _a_failed_load_changes_nothing(live, pristine, monkeypatch, "injected fsync")
    assert synced and opened.is_set()


def _a_failed_load_changes_nothing(live, pristine, monkeypatch, match: str) -> None:
    """Load ``pristine`` into ``live`` under the faults ``monkeypatch`` set: the load raises
    CheckpointError matching ``match`` and changes nothing (state, state directory, no file of
    the abandoned state left open); once the faults are undone the same load succeeds."""
    before, state_dir = state(live), live.state_dir
    with pytest.raises(CheckpointError, match=match):
        live.load_checkpoint(pristine[0])
    assert state(live) == before and live.state_dir == state_dir
    assert [p.name for p in live.root.glob("state-*")] == [state_dir.name]
    assert not [p for p in open_files_under(live.root) if state_dir.name not in p and not p.endswith("LOCK")]
    monkeypatch.undo()
    live.load_checkpoint(pristine[0])
    assert state(live) == pristine[1]
