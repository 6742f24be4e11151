"""Every ``python -m tqstore`` command on every kind of path: a store, a checkpoint, a
generation root and a selective dump, healthy and damaged, with and without ``--json``;
``prune`` never deletes the newest generation that verifies; ``compact`` keeps the data."""
from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import tqstore
from tqstore._format import values
from tqstore.checkpoint import CheckpointFallbackWarning, CheckpointManager
from tqstore.cli import EXIT_DAMAGED, EXIT_OK, EXIT_USAGE, main

from checkpoint_helpers import fill, first_segment, flip_byte, payload_offset_of_first_frame, state

ROOT = Path(__file__).resolve().parents[1]
HAS_DUMP = callable(getattr(tqstore, "dump_data_by_key", None))
KINDS = ["store", "checkpoint", "root"] + (["dump"] if HAS_DUMP else [])


def run(*argv):
    out, err = io.StringIO(), io.StringIO()
    code = main(list(map(str, argv)), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def _flip_first_frame(d: Path) -> Path:
    shards = sorted(d.glob("shard-*.tqd"))  # a dump's shard: a header, then frames
    if shards:
        flip_byte(shards[0], 100)
        return shards[0]
    seg = sorted(d.rglob("*.tqs"))[0]
    flip_byte(seg, payload_offset_of_first_frame(seg))
    return seg


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    """Healthy and damaged copies of each kind.  Damaged: a flipped payload byte in a frame
    (store, checkpoint, dump; the newest generation of the root), and an unreadable index
    or manifest (``*-unreadable``)."""
    d = tmp_path_factory.mktemp("kinds")
    with tqstore.open(d / "store", num_units=2) as s:
        keys = fill(s, "train", 8)
        s.save_checkpoint(d / "checkpoint", metadata={"step": 5}, copy_segments=True)
        m = CheckpointManager(d / "root", store=s, copy_segments=True)
        for step in (1, 2, 3):
            m.save(step)
        if HAS_DUMP:
            s.dump_data_by_key(d / "dump", keys[:4], "train")
    out = {k: d / k for k in KINDS}
    for k in KINDS:
        bad = d / f"{k}-damaged"
        shutil.copytree(d / k, bad)
        if k == "root":
            _flip_first_frame(bad / "step-0000000003")
        else:
            _flip_first_frame(bad)
        out[f"{k}-damaged"] = bad
    bad = d / "store-unreadable"
    shutil.copytree(d / "store", bad)
    next(bad.rglob("controller")).joinpath("data.mdb").write_bytes(b"junk" * 100)
    out["store-unreadable"] = bad
    bad = d / "checkpoint-unreadable"
    shutil.copytree(d / "checkpoint", bad)
    (bad / "MANIFEST.json").write_text("{ torn")
    out["checkpoint-unreadable"] = bad
    return out


# (command, path kind) -> exit status; prune and compact change files and are tested below
EXPECTED = {
    ("verify", "store"): EXIT_OK, ("verify", "store-damaged"): EXIT_DAMAGED,
    ("verify", "store-unreadable"): EXIT_DAMAGED,
    ("verify", "checkpoint"): EXIT_OK, ("verify", "checkpoint-damaged"): EXIT_DAMAGED,
    ("verify", "checkpoint-unreadable"): EXIT_DAMAGED,
    ("verify", "root"): EXIT_OK, ("verify", "root-damaged"): EXIT_DAMAGED,
    ("verify", "dump"): EXIT_OK, ("verify", "dump-damaged"): EXIT_DAMAGED,
    # inspect summarises without checking frames: a flipped payload byte is not its business
    ("inspect", "store"): EXIT_OK, ("inspect", "store-damaged"): EXIT_OK,
    ("inspect", "store-unreadable"): EXIT_DAMAGED,
    ("inspect", "checkpoint"): EXIT_OK, ("inspect", "checkpoint-damaged"): EXIT_OK,
    ("inspect", "checkpoint-unreadable"): EXIT_DAMAGED,
    ("inspect", "root"): EXIT_OK, ("inspect", "root-damaged"): EXIT_OK,
    ("inspect", "dump"): EXIT_OK, ("inspect", "dump-damaged"): EXIT_OK,
    # ls of a root verifies every generation (its "valid" column)
    ("ls", "store"): EXIT_OK, ("ls", "store-damaged"): EXIT_OK, ("ls", "store-unreadable"): EXIT_DAMAGED,
    ("ls", "checkpoint"): EXIT_OK, ("ls", "checkpoint-damaged"): EXIT_OK,
    ("ls", "checkpoint-unreadable"): EXIT_DAMAGED,
    ("ls", "root"): EXIT_OK, ("ls", "root-damaged"): EXIT_DAMAGED,
    ("ls", "dump"): EXIT_OK, ("ls", "dump-damaged"): EXIT_OK,
}
CASES = [(c, k) for (c, k) in EXPECTED if k.split("-")[0] in KINDS]


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
@pytest.mark.parametrize("command,kind", CASES, ids=[f"{c}-{k}" for c, k in CASES])
def test_command_exit_status_and_output_on_each_kind(paths, command, kind, as_json):
    before = {p: p.read_bytes() for p in paths[kind].rglob("*")
              if p.is_file() and p.name != "lock.mdb" and command != "verify"}  # LMDB reader slots aside
    code, out, err = run(command, paths[kind], *(["--json"] if as_json else []))
    assert code == EXPECTED[(command, kind)], (out, err)
    assert "Traceback" not in out + err
    report = code == EXIT_OK or (command == "verify" and kind != "store-unreadable") or (command, kind) == (
        "ls", "root-damaged")
    if report:
        assert out  # a report, also for damage
        if as_json:
            json.loads(out)
    else:
        assert err.startswith("error: ") and err.count("\n") == 1  # one line
    if command == "verify" and code == EXIT_DAMAGED and kind != "store-unreadable" and not as_json:
        assert "BAD" in out and ("offset" in out or "MANIFEST" in out)
    for p, data in before.items():  # inspect and ls write nothing
        assert p.read_bytes() == data


def test_inspect_reports_rows_bytes_units_and_format_version(paths):
    doc = json.loads(run("inspect", paths["store"], "--json")[1])
    assert doc["num_units"] == 2 and doc["rows"] == 8 and doc["total_bytes"] > 0 and doc["format_version"] == 1
    assert doc["partitions"] == [{"partition": "train", "rows": 8, "keys": 8}]
    gens = json.loads(run("inspect", paths["root"], "--json")[1])["generations"]
    assert [g["step"] for g in gens] == [1, 2, 3] and all(g["format_version"] >= 1 and g["rows"] == 8 for g in gens)
    code, out, _ = run("inspect", paths["root"])
    assert code == EXIT_OK and "step 3: 8 rows, 2 units" in out and "format version" in out


def test_ls_of_a_root_says_which_generations_are_valid(paths):
    code, out, _ = run("ls", paths["root-damaged"])
    assert code == EXIT_DAMAGED
    valid = {ln.split()[0]: ln.split()[-2] for ln in out.splitlines()}
    assert valid == {"1": "yes", "2": "yes", "3": "NO"}
    gens = json.loads(run("ls", paths["root-damaged"], "--json")[1])
    assert [(g["step"], g["valid"]) for g in gens] == [(1, True), (2, True), (3, False)]
    assert gens[2]["problems"] and all(g["total_bytes"] > 0 and g["created_unix"] for g in gens)


@pytest.mark.parametrize("command", ["prune", "compact"])
def test_prune_and_compact_refuse_other_kinds_with_exit_2(paths, tmp_path, command):
    extra = ["--keep", "1"] if command == "prune" else []
    wrong = ["checkpoint", "store"] if command == "prune" else ["checkpoint", "root"]
    for kind in wrong + (["dump"] if HAS_DUMP else []):
        code, out, err = run(command, paths[kind], *extra)
        assert code == EXIT_USAGE and out == "" and err.startswith("error: ") and "Traceback" not in err
    assert run(command, tmp_path / "missing", *extra)[0] == EXIT_USAGE


def _root(tmp_path, steps=(1, 2, 3, 4)):
    with tqstore.open(tmp_path / "s") as s:
        fill(s, "train", 4)
        m = CheckpointManager(tmp_path / "gens", store=s, copy_segments=True)
        for st in steps:
            m.save(st)
    return tmp_path / "gens"


@pytest.mark.parametrize("as_json", [False, True])
def test_prune_keeps_the_newest_n(tmp_path, as_json):
    root = _root(tmp_path)
    code, out, _ = run("prune", root, "--keep", "2", *(["--json"] if as_json else []))
    assert code == EXIT_OK and CheckpointManager(root).steps() == [3, 4]
    if as_json:
        doc = json.loads(out)
        assert doc["deleted"] == [1, 2] and doc["kept"] == [3, 4] and doc["newest_valid"] == 4
    else:
        assert "deleted 2 generation(s) [1, 2]" in out


def test_prune_never_deletes_the_newest_valid_generation(tmp_path):
    root = _root(tmp_path)
    for st in (3, 4):  # the two newest are damaged: 2 is the newest that verifies
        _flip_first_frame(root / f"step-{st:010d}")
    code, out, _ = run("prune", root, "--keep", "1", "--json")
    doc = json.loads(out)
    assert code == EXIT_OK and doc["newest_valid"] == 2 and doc["damaged"] == [3, 4]
    assert CheckpointManager(root).steps() == [2, 3, 4]  # the damaged newer ones are kept, and named
    with tqstore.open(tmp_path / "s2") as s, pytest.warns(CheckpointFallbackWarning):  # and it still restores
        assert CheckpointManager(root, store=s).restore() == 2


def test_prune_keeps_n_generations_that_verify_whatever_damaged_ones_lie_between(tmp_path):
    """--keep N counted damaged generations: with the newest N damaged and one valid
    generation besides the newest, prune deleted the only older good fallback."""
    root = _root(tmp_path, steps=(1, 2, 3, 4, 5))
    for st in (2, 3):
        _flip_first_frame(root / f"step-{st:010d}")
    (root / f"step-{4:010d}" / "MANIFEST.json").unlink()  # torn
    code, out, err = run("prune", root, "--keep", "2")
    assert code == EXIT_OK, err
    assert CheckpointManager(root).steps() == [1, 2, 3, 5]  # 5 and 1 verify: nothing of them is deleted
    assert "damaged (kept" in out and "[2, 3]" in out
    _flip_first_frame(root / f"step-{5:010d}")
    code, out, _ = run("prune", root, "--keep", "1", "--json")
    doc = json.loads(out)
    assert code == EXIT_OK and doc["newest_valid"] == 1 and doc["damaged"] == [2, 3, 5] and doc["deleted"] == []


def test_prune_dry_run_says_what_the_same_run_deletes_and_what_it_leaves_alone(tmp_path):
    """The dry run listed a torn generation directory holding a user's file as deleted, which
    the real prune leaves alone (not a tqstore checkpoint)."""
    root = _root(tmp_path, steps=(3, 4))
    (root / f"step-{1:010d}").mkdir()
    (root / f"step-{1:010d}" / "mine.txt").write_text("x")  # torn, and not tqstore's: left alone
    (root / f"step-{2:010d}").mkdir()  # torn (empty), older than every kept generation: deleted
    dry = json.loads(run("prune", root, "--keep", "1", "--dry-run", "--json")[1])
    assert (root / f"step-{2:010d}").exists()
    code, out, _ = run("prune", root, "--keep", "1", "--json")
    real = json.loads(out)
    assert dry["deleted"] == real["deleted"] == [2, 3] and dry["not_tqstore"] == real["not_tqstore"] == [1]
    assert (root / f"step-{1:010d}" / "mine.txt").exists() and not (root / f"step-{2:010d}").exists()
    assert "left alone" in run("prune", root, "--keep", "1", "--dry-run")[1]


def test_prune_with_no_valid_generation_deletes_nothing(tmp_path):
    root = _root(tmp_path, steps=(1, 2))
    for st in (1, 2):
        _flip_first_frame(root / f"step-{st:010d}")
    code, out, err = run("prune", root, "--keep", "1")
    assert code == EXIT_DAMAGED and "nothing deleted" in err and CheckpointManager(root).steps() == [1, 2]


def test_json_output_is_strict_json_also_for_tags_holding_nan_and_infinities(tmp_path):
    """Tags may hold NaN and infinities; ``--json`` wrote them bare (NaN, Infinity), which strict
    parsers (jq, JSON.parse) refuse: they are strings."""
    def strict(text):
        return json.loads(text, parse_constant=lambda c: pytest.fail(f"bare {c} in the JSON output"))

    with tqstore.open(tmp_path / "s", num_units=1) as s:
        s.kv_batch_put(["a", "b"], "p", {"x": torch.zeros(2, 1)},
                       tags=[{"r": float("nan")}, {"lo": float("-inf"), "hi": float("inf")}])
        s.dump_data_by_key(tmp_path / "d", ["a", "b"], "p")
    code, out, err = run("ls", tmp_path / "d", "--json")
    assert code == EXIT_OK, err
    assert [r["tag"] for r in strict(out)["rows"]] == [{"r": "NaN"}, {"lo": "-Infinity", "hi": "Infinity"}]
    for command in ("inspect", "verify"):
        code, out, err = run(command, tmp_path / "d", "--json")
        assert code == EXIT_OK, (command, err)
        strict(out)


def test_prune_of_a_root_with_no_generations_yet_has_nothing_to_do(tmp_path):
    """A manager that has not saved yet (its lock file only): nothing is damaged, nothing to
    delete (it exited 1 "no generation verifies"); a root whose only generation is torn still
    exits 1."""
    root = tmp_path / "gens"
    CheckpointManager(root, keep_last=2)
    for extra in ([], ["--json"]):
        code, out, err = run("prune", root, "--keep", "1", *extra)
        assert code == EXIT_OK and not err, (out, err)
        assert (json.loads(out)["ok"] and json.loads(out)["deleted"] == []) if extra else "nothing to prune" in out
    (root / "step-0000000001").mkdir()  # a save that never wrote its manifest
    code, out, err = run("prune", root, "--keep", "1")
    assert code == EXIT_DAMAGED and "nothing deleted" in err


def test_prune_dry_run_and_bad_keep(tmp_path):
    root = _root(tmp_path)
    code, out, _ = run("prune", root, "--keep", "1", "--dry-run")
    assert code == EXIT_OK and "would delete 3" in out and CheckpointManager(root).steps() == [1, 2, 3, 4]
    assert run("prune", root, "--keep", "0")[0] == EXIT_USAGE
    assert run("prune", root, "--keep", "x")[0] == EXIT_USAGE
    assert run("prune", root)[0] == EXIT_USAGE  # --keep is required


@pytest.mark.parametrize("as_json", [False, True])
def test_compact_rewrites_mostly_dead_segments_and_keeps_the_data(tmp_path, as_json):
    with tqstore.open(tmp_path / "s", num_units=1, segment_bytes=64 * 1024) as s:
        keys = [f"k{i}" for i in range(64)]
        for i, k in enumerate(keys):  # 8 KiB rows: about 8 to a 64 KiB segment
            s.kv_put(k, "p", fields={"x": np.arange(i * 1024, (i + 1) * 1024, dtype=np.int64)})
        s.kv_clear([k for i, k in enumerate(keys) if i % 8], "p")  # 1 row in 8 stays live
        want = state(s)
    code, out, err = run("compact", tmp_path / "s", *(["--json"] if as_json else []))
    assert code == EXIT_OK, err
    if as_json:
        doc = json.loads(out)
        assert doc["segments_compacted"] > 0 and doc["bytes_after"] < doc["bytes_before"]
    else:
        assert out.startswith("compacted ") and not out.startswith("compacted 0 ")
    with tqstore.open(tmp_path / "s") as s:
        assert state(s) == want
    assert run("verify", tmp_path / "s")[0] == EXIT_OK


def _store_with_sealed_segments(tmp_path):
    with tqstore.open(tmp_path / "s", num_units=2, segment_bytes=65536) as s:
        for i in range(16):  # (a segment fills and is sealed every few batches)
            fill(s, "train", 40, start=40 * i)
        want = state(s)
        segs = sorted((s.state_dir / "unit-000").glob("seg-*.tqs"))
    assert len(segs) > 2
    return want, segs


def _files(d):
    return sorted((str(p.relative_to(d)), p.stat().st_size) for p in d.rglob("*") if p.is_file() and p.name != "LOCK")


@pytest.mark.parametrize("damage", ["missing segment", "truncated segment", "missing unit"])
def test_verify_and_compact_report_files_an_open_would_take_for_lost_and_change_nothing(tmp_path, damage):
    """Verify and compact opened the store, whose crash recovery took a missing or truncated
    segment file (or a whole missing unit directory) for power-loss debris and forgot those
    rows' fields for good: compact then said "compacted" (exit 0) and a second verify "ok".
    Both now report the files without opening the store; nothing is changed, so putting the
    files back recovers everything; ``verify --repair`` accepts the loss."""
    want, segs = _store_with_sealed_segments(tmp_path)
    unit1 = segs[0].parent.parent / "unit-001"
    aside = tmp_path / "aside"
    if damage == "missing segment":
        shutil.move(segs[1], aside)
    elif damage == "truncated segment":
        shutil.copy(segs[1], aside)
        with open(segs[1], "r+b") as f:
            f.truncate(segs[1].stat().st_size // 2)
    else:
        shutil.move(unit1, aside)
    before = _files(tmp_path / "s")
    for argv in (["verify"], ["verify", "--json"], ["compact"], ["compact", "--json"]):
        code, out, err = run(*argv, tmp_path / "s")
        assert code == EXIT_DAMAGED and "nothing was changed" in out + err, (argv, out, err)
        assert {"missing segment": "is missing", "truncated segment": "(truncated)",
                "missing unit": "unit 1: its directory"}[damage] in out + err
        assert _files(tmp_path / "s") == before  # nothing changed
        if "--json" in argv:
            doc = json.loads(out)
            assert doc["ok"] is False and (doc.get("problems") or doc.get("error"))
    if damage != "missing unit":  # put back, the store is whole: nothing was lost
        shutil.move(aside, segs[1]) if damage == "missing segment" else shutil.copy(aside, segs[1])
        assert run("verify", tmp_path / "s")[0] == EXIT_OK
        with tqstore.open(tmp_path / "s") as s:
            assert state(s) == want
        return
    code, out, err = run("verify", "--repair", tmp_path / "s")  # the loss accepted: reported once, then clean
    assert code == EXIT_DAMAGED and "at open:" in out and "lost fields" in out, (out, err)
    assert run("verify", tmp_path / "s")[0] == EXIT_OK


@pytest.mark.parametrize("command", ["verify", "compact"])
def test_verify_and_compact_beside_another_command_wait_for_it_and_still_change_nothing(tmp_path, command):
    """Beside another tqstore command holding the store's LOCK (``inspect`` of a monitoring
    loop) the checks before the open were skipped (the store looked open elsewhere), then the
    open waited for that command and went on unchecked: its crash recovery dropped a truncated
    segment's rows for good, and the next verify said "ok".  The checks wait for it too."""
    import threading

    _, segs = _store_with_sealed_segments(tmp_path)
    with open(segs[1], "r+b") as f:
        f.truncate(segs[1].stat().st_size // 2)
    before = _files(tmp_path / "s")
    holder = subprocess.Popen([sys.executable, "-c", "import sys\nfrom tqstore._io import locks\n"
                               "fd = locks.lock_for_check_nowait(sys.argv[1] + '/LOCK')\nprint('held', flush=True)\n"
                               "sys.stdin.readline()\n", str(tmp_path / "s")],
                              cwd=ROOT, stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        got = []
        t = threading.Thread(target=lambda: got.append(run(command, tmp_path / "s")))
        t.start()
        t.join(1.0)
        assert t.is_alive()  # waiting for the other command
    finally:
        holder.stdin.write("\n")
        holder.stdin.close()
        holder.wait(60)
    t.join(120)
    code, out, err = got[0]
    assert code == EXIT_DAMAGED and "(truncated)" in out + err and "nothing was changed" in out + err, (out, err)
    assert _files(tmp_path / "s") == before


def test_verify_repair_reports_what_the_open_dropped_of_a_missing_segment(tmp_path):
    _, segs = _store_with_sealed_segments(tmp_path)
    segs[1].unlink()
    code, out, err = run("verify", "--repair", tmp_path / "s")
    assert code == EXIT_DAMAGED and f"segment files [{int(segs[1].stem.split('-')[1])}] are missing" in out, out
    assert "lost fields" in out


def test_compact_and_verify_of_a_store_open_in_another_process_exit_2(tmp_path):
    tqstore.open(tmp_path / "s").close()
    code = "import tqstore, sys, time; s = tqstore.open(sys.argv[1]); print('open', flush=True); time.sleep(60)"
    p = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "s")], stdout=subprocess.PIPE, text=True,
                         cwd=ROOT)
    try:
        assert p.stdout.readline().strip() == "open"
        for command in ("compact", "verify"):
            c, out, err = run(command, tmp_path / "s")
            assert c == EXIT_USAGE and "another process" in err and "Traceback" not in err
            assert "close it there first" in err and "open another path" not in err, err  # (one hint, the CLI's)
    finally:
        p.kill()
        p.wait()


def test_a_reader_that_goes_away_ends_the_output_quietly(tmp_path):
    """``python -m tqstore ls ROOT | head -1``: the closed pipe ends the output quietly with
    141, as a tool SIGPIPE ended (it printed "error: [Errno 32] Broken pipe" and exited 2)."""
    with tqstore.open(tmp_path / "s") as s:
        fill(s, "train", 2)
        m = CheckpointManager(tmp_path / "g", store=s)
        for step in range(3):
            m.save(step)
    p = subprocess.run(["bash", "-c", f"set -o pipefail; {sys.executable} -m tqstore ls {tmp_path / 'g'} | head -c 1"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode in (0, 141) and p.stderr == "", p.stderr  # (0: all of it fitted in the pipe first)
    out, err = io.StringIO(), io.StringIO()

    class Closed(io.StringIO):
        def write(self, s):
            raise BrokenPipeError(32, "Broken pipe")

    assert main(["ls", str(tmp_path / "g")], out=Closed(), err=err) == 141 and err.getvalue() == ""


def test_a_generation_root_with_no_generation_yet_is_a_root(tmp_path):
    """A CheckpointManager root holds only its lock file until the first save: the commands
    know it as a root (they called it neither a checkpoint nor a root, exit 2)."""
    (tmp_path / "g").mkdir()
    (tmp_path / "g" / ".tqstore-checkpoints.lock").touch()
    code, out, err = run("inspect", tmp_path / "g")
    assert code == EXIT_OK and out.strip() == f"checkpoint generations under {tmp_path / 'g'}: 0", (out, err)
    assert run("ls", tmp_path / "g")[0] == EXIT_OK


def test_inspect_of_a_root_with_an_unreadable_generation_lists_it_and_exits_1(tmp_path):
    with tqstore.open(tmp_path / "s") as s:
        fill(s, "train", 2)
        m = CheckpointManager(tmp_path / "g", store=s)
        m.save(1)
        m.save(2)
    (m.path(2) / "MANIFEST.json").write_text("torn")
    code, out, err = run("inspect", tmp_path / "g")
    assert code == EXIT_DAMAGED and "step 1: " in out and "step 2: unreadable" in out, (out, err)


def test_every_command_has_help_with_an_example(forkrun):
    for command in ("demo", "inspect", "verify", "ls", "prune", "compact"):
        r = forkrun.run("module", "tqstore", [command, "--help"], cwd=ROOT, timeout=120)
        assert r.returncode == 0 and "example:" in r.stdout and f"python -m tqstore {command}" in r.stdout


def test_console_script_is_declared():
    text = (ROOT / "pyproject.toml").read_text()
    assert 'tqstore = "tqstore.cli:main"' in text


def test_prune_and_its_dry_run_report_a_torn_generation_it_leaves_the_same_way(tmp_path):
    root = _root(tmp_path)
    (root / f"step-{3:010d}" / "MANIFEST.json").unlink()  # torn, newer than the newest valid (2)
    _flip_first_frame(root / f"step-{4:010d}")  # damaged: kept as the newest, 2 as the newest valid
    dry = json.loads(run("prune", root, "--keep", "1", "--dry-run", "--json")[1])
    real = json.loads(run("prune", root, "--keep", "1", "--json")[1])
    assert dry["deleted"] == real["deleted"] == [1]
    assert dry["kept"] == real["kept"] == [2, 3, 4] and (root / f"step-{3:010d}").exists()


def test_prune_and_compact_name_what_the_path_is_when_it_is_not_theirs(tmp_path):
    """prune of a checkpoint, compact of a checkpoint or of a generation root: exit 2, and the
    message says what the path is (it said "no MANIFEST.json" of a checkpoint that has one)."""
    with tqstore.open(tmp_path / "s", num_units=2) as s:
        s.kv_batch_put(["a"], "p", {"x": torch.ones(1, 2)})
        s.save_checkpoint(tmp_path / "ck")
        tqstore.CheckpointManager(tmp_path / "gens", store=s).save(1)
    for argv, says in ((["prune", tmp_path / "ck", "--keep", "1"], "is a checkpoint, not a directory of checkpoint"),
                       (["compact", tmp_path / "ck"], "is a checkpoint, not a store directory"),
                       (["compact", tmp_path / "gens"], "is a directory of checkpoint generations, not a store")):
        code, _out, err = run(*argv)
        assert code == 2 and says in err and "no MANIFEST.json" not in err, (argv, err)


@pytest.mark.skipif(not HAS_DUMP, reason="this build has no selective dumps")
def test_a_command_waiting_for_a_lock_held_elsewhere_says_so_then_finishes(tmp_path, caplog):
    """A verify of a dump whose lock another holder has (a dump or load of that path in
    progress) waits, and says on stderr what it waits for at once, not after it; the library
    logs the same at INFO (a trainer's save that seems stuck behind another process)."""
    import fcntl
    import os
    import threading
    import time

    with tqstore.open(tmp_path / "s") as s:
        keys = fill(s, "train", 4)
        s.dump_data_by_key(tmp_path / "d", keys, "train")
    fd = os.open(tmp_path / "d.lock", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)  # (another open file description: conflicts as another process would)
    out, err, res = io.StringIO(), io.StringIO(), []
    t = threading.Thread(target=lambda: res.append(main(["verify", str(tmp_path / "d")], out=out, err=err)))
    try:
        t.start()
        deadline = time.monotonic() + 30
        while "note: waiting for the lock" not in err.getvalue() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert "note: waiting for the lock" in err.getvalue() and str(tmp_path / "d.lock") in err.getvalue()
        assert t.is_alive() and not res and out.getvalue() == ""  # still waiting, nothing verified yet
    finally:
        os.close(fd)
        t.join(60)
    assert res == [EXIT_OK] and "ok" in out.getvalue()
    with open(tmp_path / "d.lock", "rb") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        with caplog.at_level("INFO", logger="tqstore"), tqstore.open(tmp_path / "s") as s:
            h = threading.Timer(0.5, fcntl.flock, (f.fileno(), fcntl.LOCK_UN))
            h.start()
            s.dump_data_by_key(tmp_path / "d", keys[:2], "train")
            h.join()
    assert any("waiting for the lock" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("command", ["ls", "verify"])
def test_a_generation_a_trainer_prunes_while_the_root_is_listed_is_left_out_not_damaged(tmp_path, monkeypatch,
                                                                                         command):
    """A trainer's save prunes a generation while ``ls``/``verify`` of the root runs: it is
    gone, not damaged (monitoring saw exit 1 and "does not exist" errors for a healthy root)."""
    from tqstore.checkpoint import verify as verify_module

    _root(tmp_path, steps=(1, 2, 3))
    real = verify_module.verify_checkpoint

    def pruned_meanwhile(path, *args, **kwargs):
        if Path(path).name == "step-0000000001" and Path(path).exists():
            shutil.rmtree(path)  # (as a prune: renamed away and removed)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(verify_module, "verify_checkpoint", pruned_meanwhile)
    code, out, err = run(command, tmp_path / "gens")
    assert code == EXIT_OK, (out, err)
    assert "Traceback" not in err and "does not exist" not in err
    if command == "ls":
        assert [ln.split()[0] for ln in out.splitlines()] == ["2", "3"]


@pytest.mark.parametrize("command", ["inspect", "ls", "verify", "compact", "prune"])
def test_every_json_failure_answers_in_json_on_stdout(tmp_path, command):
    """A script reading --json output gets a JSON document for a failure too (the message on
    stderr as always), whatever the command."""
    (tmp_path / "plain").mkdir()
    extra = ["--keep", "1"] if command == "prune" else []
    for target in (tmp_path / "missing", tmp_path / "plain"):
        code, out, err = run(command, target, "--json", *extra)
        assert code != 0, (command, target)
        doc = json.loads(out)
        assert doc["ok"] is False and doc["exit"] == code
        assert doc["error"] and doc["error"] in err


@pytest.mark.parametrize("what", ["store", "checkpoint"])
def test_a_store_or_checkpoint_that_lost_its_descriptor_is_damaged_not_a_usage_error(paths, tmp_path, what):
    """A store without STORE.json or a checkpoint without MANIFEST.json exited 2 ("neither a
    checkpoint ... nor ..."), which a `verify || restore` script takes for a typo."""
    d = tmp_path / what
    shutil.copytree(paths[what], d)
    (d / ("STORE.json" if what == "store" else "MANIFEST.json")).unlink()
    for command in ("verify", "inspect", "ls") + (("compact",) if what == "store" else ()):
        code, out, err = run(command, d)
        assert code == EXIT_DAMAGED, (command, out, err)
        assert ("no STORE.json" if what == "store" else "no MANIFEST.json") in err and "damaged" in err


@pytest.mark.skipif(not HAS_DUMP, reason="this build has no dump")
def test_a_directory_of_dumps_is_verified_listed_and_inspected_dump_by_dump(tmp_path):
    """One dump per step beside the model's checkpoints (as the demo writes them) was taken for a
    generation root: verify and ls said "damaged" (exit 1), each step "a dump, not a checkpoint"."""
    d = tmp_path / "pending"
    with tqstore.open(tmp_path / "s", num_units=2) as s:
        keys = fill(s, "train", 8)
        for step in (2, 4):
            s.dump_data_by_key(d / f"step-{step:010d}", keys[:step], "train")
    for command in ("verify", "ls", "inspect"):
        code, out, err = run(command, d)
        assert code == EXIT_OK and "step-0000000004" in out, (command, out, err)
    doc = json.loads(run("verify", d, "--json")[1])
    assert doc["kind"] == "dumps" and doc["ok"] and [x["rows"] for x in doc["dumps"]] == [2, 4]
    _flip_first_frame(d / f"step-{4:010d}")
    code, out, _ = run("verify", d)
    assert code == EXIT_DAMAGED and "ok  step-0000000002" in out and "BAD step-0000000004" in out
    code, _, err = run("prune", d, "--keep", "1")
    assert code == EXIT_USAGE and "directory of selective dumps" in err and (d / f"step-{2:010d}").exists()


@pytest.mark.parametrize("what", ["dump", "checkpoint"] if HAS_DUMP else ["checkpoint"])
def test_a_dump_or_checkpoint_left_at_old_by_an_interrupted_replacement_is_named_as_such(paths, tmp_path, what):
    """verify and inspect read ``<dir>.old`` when a replacement was killed between its renames
    and said "ok <dir>" of a directory that is not there."""
    d = tmp_path / what
    shutil.copytree(paths[what], d.with_name(what + ".old"))
    for command in ("verify", "inspect"):
        code, out, err = run(command, d)
        assert code == EXIT_OK, (command, out, err)
        assert f"{d} is missing: an interrupted replacement left the previous one at {what}.old" in err


def test_leftovers_of_an_interrupted_save_are_named_by_verify_and_ls(tmp_path):
    root = _root(tmp_path, steps=(1, 2))
    (root / "step-0000000003.tmp-abcd").mkdir()  # a save killed before it published
    for command in ("verify", "ls"):
        code, out, err = run(command, root)
        assert code == EXIT_OK and "step-0000000003.tmp-abcd" in err and "no generation" in err, (command, err)


@pytest.mark.parametrize("argv", [["prune", "--keep", "x", "--json", "ROOT"], ["verify", "--json"],
                                  ["ls", "--json", "--nope", "ROOT"]])
def test_usage_errors_of_the_argument_parser_answer_in_json_too(tmp_path, argv):
    """argparse's errors wrote nothing on stdout with --json (and went to the process's stderr
    whatever stream main was given)."""
    code, out, err = run(*[str(tmp_path) if a == "ROOT" else a for a in argv])
    assert code == EXIT_USAGE
    doc = json.loads(out)
    assert doc == {"ok": False, "exit": EXIT_USAGE, "error": doc["error"]} and doc["error"] in err and "usage:" in err


def test_a_json_failure_keeps_a_message_that_holds_a_newline_whole(tmp_path):
    target = tmp_path / "new\nline"
    code, out, err = run("inspect", target, "--json")
    assert code != 0 and json.loads(out)["error"] == err[len("error: "):].rstrip("\n") and "line" in json.loads(out)["error"]


def test_ls_of_a_dump_or_store_shows_one_line_per_key_whatever_the_key_holds(tmp_path):
    """A key with a newline (or a partition id with a tab) would split or blur a listing
    line: such names are shown as JSON strings, one line each; plain names as they are."""
    keys = ["plain", "two\nlines", '"quoted"', "tab\there", ""]
    with tqstore.open(tmp_path / "s", num_units=1) as s:
        s.kv_batch_put(keys, "train", fields={"x": torch.arange(5).view(5, 1)})
        s.kv_batch_put(["k"], "odd\tpart", fields={"x": torch.ones(1, 1)})
        s.dump_data_by_key(tmp_path / "d", keys, "train")
    code, out, _ = run("ls", tmp_path / "d")
    lines = out.splitlines()
    assert code == 0 and len(lines) == len(keys)
    shown = [ln.split("  fields=")[0] for ln in lines]
    assert shown[0] == "plain" and [json.loads(x) for x in shown[1:]] == keys[1:]
    code, out, _ = run("ls", tmp_path / "s")
    assert code == 0 and len(out.splitlines()) == 2
    assert sorted(ln.split(" keys  ")[1] for ln in out.splitlines()) == sorted([json.dumps("odd\tpart"), "train"])


def test_ls_and_inspect_of_a_dump_whose_tags_hold_integers_of_any_size(tmp_path):
    """Tags may hold integers of any size (README); ls of such a dump died on Python's
    4,300-digit limit (its --json too, writing no JSON)."""
    big = 7 ** 6000
    with tqstore.open(tmp_path / "s", num_units=1) as s:
        s.kv_batch_put(["a"], "p", tags=[{"big": big}])
        s.dump_data_by_key(tmp_path / "d", ["a"], "p")
    code, out, err = run("ls", tmp_path / "d")
    assert code == 0 and out.startswith("a  "), err
    code, out, err = run("ls", "--json", tmp_path / "d")
    assert code == 0, err
    assert values.loads(out)["rows"][0]["tag"]["big"] == big  # (parses integers of any size)
    for argv in (["inspect", tmp_path / "d"], ["inspect", "--json", tmp_path / "d"], ["verify", tmp_path / "d"]):
        code, out, err = run(*argv)
        assert code == 0, (argv, err)


@pytest.mark.parametrize("command", ["verify", "inspect", "ls", "compact", "prune"])
def test_an_empty_path_is_a_usage_error_not_the_current_directory(tmp_path, command, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with tqstore.open(tmp_path / "s", num_units=1):
        pass
    monkeypatch.chdir(tmp_path / "s")  # ("" took the current directory: here a store)
    argv = [command, "", "--json"] + (["--keep", "1"] if command == "prune" else [])
    code, out, err = run(*argv)
    assert code == EXIT_USAGE and "the path is empty" in json.loads(out)["error"], (out, err)
