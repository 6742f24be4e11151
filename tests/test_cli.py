"""``python -m tqstore verify|inspect|ls``: exit codes, output, no tracebacks (more in test_cli_commands.py,
the demo in test_demo.py)."""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import tqstore
from tqstore.checkpoint import CheckpointManager
from tqstore.cli import EXIT_DAMAGED, EXIT_OK, EXIT_USAGE, main

from checkpoint_helpers import fill, first_segment, flip_byte, payload_offset_of_first_frame

ROOT = Path(__file__).resolve().parents[1]


def run(*argv):
    out, err = io.StringIO(), io.StringIO()
    code = main(list(map(str, argv)), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    with tqstore.open(d / "store", num_units=2) as s:
        fill(s, "train", 8)
        fill(s, "val", 3, prefix="v")
        s.save_checkpoint(d / "ckpt", metadata={"step": 42}, copy_segments=True)
        m = CheckpointManager(d / "gens", store=s, copy_segments=True)
        m.save(1)
        m.save(2)
    return d


def test_verify_of_a_clean_checkpoint_exits_0(saved):
    code, out, err = run("verify", saved / "ckpt")
    assert code == EXIT_OK and out.startswith("ok ") and "11 rows" in out and err == ""


def test_verify_json(saved):
    code, out, _ = run("verify", saved / "ckpt", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["ok"] and doc["checkpoints"][0]["rows"] == 11
    assert doc["checkpoints"][0]["frames_checked"] == 11 * 6


def test_verify_of_a_damaged_checkpoint_exits_1_with_one_line_per_problem(saved, tmp_path):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(saved / "ckpt", bad)
    seg = first_segment(bad)
    flip_byte(seg, payload_offset_of_first_frame(seg))
    (bad / "unit-001" / "extra").write_bytes(b"?")
    code, out, err = run("verify", bad)
    assert code == EXIT_DAMAGED and out.startswith("BAD ")
    lines = out.strip().splitlines()[1:]
    assert len(lines) == 2 and any(str(seg) in ln and "offset" in ln for ln in lines)
    assert "Traceback" not in out + err
    code, out, _ = run("verify", bad, "--json")
    assert code == EXIT_DAMAGED and not json.loads(out)["ok"]


def test_verify_of_a_generation_root_checks_every_generation(saved, tmp_path):
    import shutil

    code, out, _ = run("verify", saved / "gens")
    assert code == EXIT_OK and out.count("ok  step") == 2
    root = tmp_path / "gens"
    shutil.copytree(saved / "gens", root)
    (root / "step-0000000002" / "controller" / "data.mdb").write_bytes(b"junk")
    code, out, _ = run("verify", root)
    assert code == EXIT_DAMAGED and "ok  step 1" in out and "BAD step 2" in out
    (root / "step-0000000002" / "MANIFEST.json").unlink()
    code, out, _ = run("verify", root)
    assert code == EXIT_DAMAGED and "BAD step 2" in out and "no MANIFEST.json" in out


def test_verify_of_a_root_not_saved_to_yet_has_nothing_to_verify_exit_0(tmp_path):
    """It exited 2, the status of a PATH that is nothing tqstore knows, for a root that inspect,
    ls and prune take for one (exit 0)."""
    from tqstore.checkpoint import CheckpointManager

    with tqstore.open(tmp_path / "s", num_units=1) as s:
        CheckpointManager(tmp_path / "gens", store=s)
    assert (tmp_path / "gens").is_dir()
    code, out, err = run("verify", tmp_path / "gens")
    assert code == EXIT_OK and "nothing to verify" in out, (out, err)
    code, out, _ = run("verify", "--json", tmp_path / "gens")
    doc = json.loads(out)
    assert code == EXIT_OK and doc["ok"] is True and doc["kind"] == "root" and doc["checkpoints"] == []
    assert run("ls", tmp_path / "gens")[0] == EXIT_OK and run("prune", tmp_path / "gens", "--keep", "1")[0] == EXIT_OK


def test_verify_of_something_that_is_not_a_checkpoint_exits_2(saved, tmp_path):
    assert run("verify", tmp_path / "missing")[0] == EXIT_USAGE
    (tmp_path / "empty").mkdir()
    code, _, err = run("verify", tmp_path / "empty")
    assert code == EXIT_USAGE and "neither a checkpoint" in err
    (tmp_path / "file").write_text("x")
    code, _, err = run("verify", tmp_path / "file")
    assert code == EXIT_USAGE and "is a file, not a directory" in err


def test_verify_of_a_torn_manifest_exits_1(saved, tmp_path):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(saved / "ckpt", bad)
    (bad / "MANIFEST.json").write_text("{ not json")
    code, out, err = run("verify", bad)
    assert code == EXIT_DAMAGED and "MANIFEST.json" in out and "Traceback" not in err


def test_inspect_checkpoint_root_and_store(saved):
    code, out, _ = run("inspect", saved / "ckpt")
    assert code == 0 and "11 rows in 2 partitions, 2 units" in out and '"step": 42' in out
    assert "partition 'train': 8 rows" in out
    code, out, _ = run("inspect", saved / "ckpt", "--json")
    doc = json.loads(out)
    assert doc["kind"] == "checkpoint" and doc["metadata"] == {"step": 42}
    assert {p["partition"]: p["rows"] for p in doc["partitions"]} == {"train": 8, "val": 3}
    code, out, _ = run("inspect", saved / "gens", "--json")
    assert code == 0 and [g["step"] for g in json.loads(out)["generations"]] == [1, 2]
    code, out, _ = run("inspect", saved / "store")
    assert code == 0 and "2 units" in out and "partition 'val': 3 rows" in out


def test_ls_lists_generations_and_files(saved):
    code, out, _ = run("ls", saved / "gens")
    assert code == 0 and [ln.split()[0] for ln in out.splitlines()] == ["1", "2"]
    code, out, _ = run("ls", saved / "ckpt", "--json")
    rows = json.loads(out)
    assert code == 0 and {r["role"] for r in rows} == {"controller", "unit_index", "segment"}
    assert all(len(r["crc32c"]) == 8 for r in rows)
    assert run("ls", saved / "store")[0] == EXIT_OK  # a store: its partitions (tests/test_hardening_input.py)


def test_no_subcommand_prints_help_and_a_bad_one_exits_2():
    code, out, _ = run()
    assert code == EXIT_USAGE and "verify" in out
    assert run("frobnicate")[0] == EXIT_USAGE


def test_python_dash_m_exit_codes_without_traceback(saved, tmp_path):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(saved / "ckpt", bad)
    (bad / "controller" / "data.mdb").write_bytes(b"x" * 10)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for path, want in ((saved / "ckpt", 0), (bad, 1), (tmp_path / "nope", 2)):
        r = subprocess.run([sys.executable, "-m", "tqstore", "verify", str(path)], capture_output=True, text=True,
                           env=env, timeout=120)
        assert r.returncode == want, (path, r.stdout, r.stderr)
        assert "Traceback" not in r.stderr


@pytest.mark.parametrize("what", ["ckpt", "gens", "store"])
def test_json_nested_too_deeply_for_the_parser_is_damage_not_a_traceback(saved, tmp_path, what):
    """A manifest or store descriptor of 100,000 nested arrays (no file tqstore writes): every
    read command says it is damaged in one line (exit 1), as for any other bad JSON."""
    import shutil

    bad = tmp_path / what
    shutil.copytree(saved / what, bad)
    name = {"ckpt": "MANIFEST.json", "store": "STORE.json"}.get(what)
    target = bad / name if name else sorted(bad.glob("step-*"))[0] / "MANIFEST.json"
    target.write_text("[" * 100_000 + "]" * 100_000)
    for command in ("verify", "inspect", "ls"):
        code, out, err = run(command, bad)
        assert code == EXIT_DAMAGED and "Traceback" not in err and "RecursionError" not in err, (command, out, err)


def test_a_store_index_with_a_flipped_byte_is_reported_never_a_crash(tmp_path, forkrun):
    """One byte flipped in a page of a store's LMDB index (a node pointer: LMDB may then read past
    the file, and its reader die of SIGBUS, which no try catches, or fail inside a read): verify
    walks the indexes in a child process first, so it reports damage (exit 1) or nothing wrong,
    and never dies of a signal or prints a traceback (inspect and ls walk the controller's)."""
    import shutil

    src = tmp_path / "store"
    with tqstore.open(src, num_units=2) as s:
        for j in range(12):
            s.kv_batch_put([f"k{j}-{i}" for i in range(150)], "train", {"x": torch.arange(150 * 16, dtype=torch.float32).reshape(150, 16)})
    seen = set()
    for kind, rel in (("unit", "unit-000/index/data.mdb"),):
        size = (src / "state-00000001" / rel).stat().st_size
        for page in range(2, min(size // 4096, 10)):
            bad = tmp_path / f"{kind}-{page}"
            shutil.copytree(src, bad)
            f = bad / "state-00000001" / rel
            raw = bytearray(f.read_bytes())
            raw[page * 4096 + 17] ^= 0xFF
            f.write_bytes(bytes(raw))
            for command in ("verify",):
                r = forkrun.run("module", "tqstore", [command, str(bad)], cwd=tmp_path, timeout=120)
                assert r.returncode in (EXIT_OK, EXIT_DAMAGED) and "Traceback" not in r.stderr, \
                    (kind, page, command, r.returncode, r.stderr[-500:])
                seen.add(r.returncode)
    assert EXIT_DAMAGED in seen


def test_read_commands_list_and_verify_a_root_that_also_holds_a_stray_file(saved, tmp_path):
    """A note left in a generation root (an entry no manager puts there): saving into the root
    is refused, but verify, inspect and ls still read its generations (they write nothing)."""
    import shutil

    root = tmp_path / "gens"
    shutil.copytree(saved / "gens", root)
    (root / "notes.txt").write_text("x")
    for command in ("verify", "inspect", "ls"):
        code, out, err = run(command, root)
        assert code == EXIT_OK and "refusing" not in err and "2" in out, (command, out, err)
    code, out, _ = run("ls", root, "--json")
    assert [g["step"] for g in json.loads(out)] == [1, 2]
    assert (root / "notes.txt").read_text() == "x"


@pytest.mark.parametrize("change", [("created_unix", 1e300), ("created_unix", -1e18), ("rows", "x"),
                                    ("payload_bytes", "x")])
def test_a_re_signed_manifest_with_values_no_save_writes_is_damage_not_a_traceback(saved, tmp_path, change):
    """MANIFEST.json edited and re-signed (its checksum recomputed: FORMAT.md says a manifest
    can be): a creation time no clock shows, a count that is no int.  Every read command says
    it is malformed (exit 1), naming the member."""
    import shutil

    from tqstore import _native
    from tqstore.checkpoint import manifest as M

    ck = tmp_path / "ck"
    shutil.copytree(saved / "ckpt", ck)
    doc = json.loads((ck / "MANIFEST.json").read_text())
    key, value = change
    (doc if key == "created_unix" else doc["snapshot"])[key] = value
    doc.pop("manifest_crc32c")
    doc["manifest_crc32c"] = _native.crc32c(M._canonical(doc))
    (ck / "MANIFEST.json").write_text(json.dumps(doc, sort_keys=True, indent=1))
    for command in ("verify", "inspect", "ls"):
        code, out, err = run(command, ck)
        assert code == EXIT_DAMAGED and f"'{key}'" in out + err, (command, out, err)


def test_a_store_with_a_directory_where_a_file_belongs_is_damaged_exit_1(saved, tmp_path):
    """A segment replaced by a directory: the open names it (nothing removed or mapped) and
    verify exits 1; CURRENT a directory: inspect and ls exit 1 (unreadable), not 2 (usage)."""
    import shutil

    seg_dir = tmp_path / "seg"
    shutil.copytree(saved / "store", seg_dir)
    seg = sorted(seg_dir.glob("state-*/unit-000/seg-*.tqs"))[0]
    seg.unlink()
    seg.mkdir()
    code, out, err = run("verify", seg_dir)
    assert code == EXIT_DAMAGED and "is not a regular file" in err and seg.name in err, (out, err)
    assert seg.is_dir()
    cur_dir = tmp_path / "cur"
    shutil.copytree(saved / "store", cur_dir)
    (cur_dir / "CURRENT").unlink()
    (cur_dir / "CURRENT").mkdir()
    for command in ("inspect", "ls", "verify"):
        code, out, err = run(command, cur_dir)
        assert code == EXIT_DAMAGED and "Traceback" not in err, (command, out, err)


@pytest.mark.parametrize("with_tqdm", [False, True])
def test_a_progress_bar_appears_only_once_its_operation_has_run_a_while(monkeypatch, with_tqdm):
    """``verify`` of a small checkpoint (0.01 s) drew a bar on the terminal, and the plain bar's
    clearing wrote 79 spaces whatever the line's length."""
    from tqstore import cli_util

    if with_tqdm:
        pytest.importorskip("tqdm")
    else:
        monkeypatch.setitem(sys.modules, "tqdm", None)  # (the plain bar)

    class Tty(io.StringIO):
        def isatty(self):
            return True

    quick = Tty()
    p = cli_util.Progress(100, "verify", quick)
    p(60)
    p(40)
    p.close()
    assert quick.getvalue() == ""
    monkeypatch.setattr(cli_util, "PROGRESS_DELAY_S", 0.0)
    slow = Tty()
    p = cli_util.Progress(100, "verify", slow)
    p(60)
    p(40)
    p.close()
    assert "verify" in slow.getvalue()
    if not with_tqdm:
        drawn = slow.getvalue().split("\r")[-3]  # (the last and longest line drawn, then its clearing)
        assert slow.getvalue().endswith("\r" + " " * len(drawn) + "\r")
