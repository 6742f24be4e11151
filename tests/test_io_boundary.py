"""Every syscall that changes durable state goes through ``tqstore/_io``, behind a failpoint
(DESIGN.md §1: ``_io`` holds every syscall and the failpoints).

* an AST scan of ``tqstore/`` outside ``_io`` (and ``testing``, the harnesses that build
  crash images themselves) finds no call that creates, writes, truncates, removes, renames,
  links, locks or fsyncs a file or directory; inside ``_io`` every function making such a
  call also hits a failpoint, or is listed below with the reason it needs none;
* each step routed through ``_io`` by issue #9 (segment creation, torn-tail truncation, the
  store's ``LOCK``, the snapshot's index copies, temporary directories, best-effort tree
  removal), failed with EIO, gives a clean ``TqstoreError`` and loses nothing acknowledged.
"""
from __future__ import annotations

import ast
import errno
import os
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set, Tuple

import pytest

from tqstore import CheckpointError, StorageIOError, TqstoreError
from tqstore._io import failpoints as fp
from tqstore._io import files
from tqstore._format.segment import segment_name
from tqstore.checkpoint import verify_checkpoint
from tqstore.store import Store

from crash.model import store_state
from failpoint_helpers import fail_each_occurrence
from test_failpoints import _fill, _store

PKG = Path(__file__).resolve().parents[1] / "tqstore"

# ---------------------------------------------------------------------------- the scan
#: module -> functions that change durable state (or create something that outlives the call)
DURABLE: Dict[str, Set[str]] = {
    "os": {"write", "pwrite", "pwritev", "writev", "ftruncate", "truncate", "unlink", "remove", "rmdir",
           "removedirs", "rename", "renames", "replace", "mkdir", "makedirs", "link", "symlink", "fsync",
           "fdatasync", "sync", "posix_fallocate", "copy_file_range", "sendfile", "mkfifo", "mknod", "chmod",
           "fchmod", "chown", "utime"},
    "shutil": {"rmtree", "move", "copy", "copy2", "copyfile", "copytree", "copymode", "copystat"},
    "fcntl": {"flock", "lockf"},
    "tempfile": {"mkdtemp", "mkstemp", "NamedTemporaryFile", "TemporaryDirectory"},
}
#: ``os.open`` changes the disk when it may create or truncate
CREATING_FLAGS = {"O_CREAT", "O_TRUNC", "O_APPEND"}
#: method names that only pathlib objects have: ``p.mkdir()`` and the like
PATH_METHODS = {"mkdir", "rmdir", "touch", "unlink", "write_text", "write_bytes", "symlink_to", "hardlink_to",
                "link_to"}
#: calls that hit a failpoint (inside _io)
FAILPOINT_CALLS = {"_fp", "hit", "lmdb_commit_point", "_open_lock_file"}
#: functions of _io that make such a call without a failpoint of their own, and why
EXEMPT: Dict[Tuple[str, str], str] = {
    ("_io/_lmdbwalk_child.py", "_child_main"): "writes its report to the pipe of its parent (stdout)",
    ("_io/locks.py", "hold_dir"): "an flock on a directory: an in-use mark that vanishes with the process",
    ("_io/locks.py", "_held_elsewhere"): "tries (and drops) the flock of hold_dir or flocked: changes nothing",
    ("_io/locks.py", "_flock_waiting"): "the flock of flocked, whose lock file's open (_open_lock_file) is the failpoint",
    ("_io/lmdbenv.py", "_allocate_lock_file"): "a new LMDB environment's lock file (its reader table, shared memory: "
                                               "no durable state) allocated before LMDB maps it; LMDB's own open "
                                               "makes the same file and directory without failpoints",
}
#: functions outside _io that make a durable call, and why that is fine
EXEMPT_OUTSIDE_IO: Dict[Tuple[str, str], str] = {
    ("_native/_pure.py", "_pwritev_views"): "pwrite_ranges, the pure twin of the C kernel (which no scan sees); only "
                                           "_io.files.write_buffers calls it, and with failpoints active it "
                                           "writes the ranges as views through pwrite_all instead",
}
SKIP_DIRS = ("testing",)  # crash and power-loss harnesses: they materialise images outside the engine


def _flag_names(node: ast.AST) -> Set[str]:
    return {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)} | \
        {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _is_minus_one(node: ast.AST) -> bool:
    """The literal ``-1`` (an anonymous mapping's file descriptor: memory, no file)."""
    return isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and \
        isinstance(node.operand, ast.Constant) and node.operand.value == 1


def _open_mode(call: ast.Call) -> Optional[str]:
    mode = call.args[1] if len(call.args) > 1 else next((k.value for k in call.keywords if k.arg == "mode"), None)
    if mode is None:
        return "r"
    return mode.value if isinstance(mode, ast.Constant) and isinstance(mode.value, str) else "?"


class _Scan(ast.NodeVisitor):
    """Durable calls of one module: ``(function, line, what)``."""

    def __init__(self) -> None:
        self.aliases: Dict[str, str] = {}  # local name -> "module" or "module.func"
        self.stack: List[str] = []
        self.found: List[Tuple[str, int, str]] = []
        self.failpoint_in: Set[str] = set()
        self.io_names: Set[str] = set()  # names bound to tqstore._io modules: files.mkdir() is the I/O layer's

    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            if a.name in DURABLE or a.name in ("mmap", "os"):
                self.aliases[a.asname or a.name] = a.name

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        mod = node.module or ""
        if mod == "_io" or mod.endswith("._io") or "_io." in mod:
            self.io_names.update(a.asname or a.name for a in node.names)
        if node.module in DURABLE or node.module == "mmap":
            for a in node.names:
                self.aliases[a.asname or a.name] = f"{node.module}.{a.name}"

    def _visit_fn(self, node) -> None:
        self.stack.append(node.name)
        self.generic_visit(node)
        self.stack.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = _visit_fn

    def _target(self, func: ast.AST) -> Optional[str]:
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in self.aliases:
            return f"{self.aliases[func.value.id]}.{func.attr}"
        if isinstance(func, ast.Name) and func.id in self.aliases and "." in self.aliases[func.id]:
            return self.aliases[func.id]
        return None

    def visit_Call(self, node: ast.Call) -> None:
        where = ".".join(self.stack) or "<module>"
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if name in FAILPOINT_CALLS:
            self.failpoint_in.update(self.stack[:1] or ["<module>"])
        target = self._target(func)
        what = None
        if target is not None:
            mod, _, fn = target.partition(".")
            if fn in DURABLE.get(mod, ()):
                what = target
            elif target == "os.open" and len(node.args) > 1 and _flag_names(node.args[1]) & CREATING_FLAGS:
                what = "os.open creating or truncating"
            elif target == "mmap.mmap" and not (node.args and _is_minus_one(node.args[0])):  # fd -1: memory
                kw = {k.arg: k.value for k in node.keywords}
                prot, access = kw.get("prot"), kw.get("access")
                if not ((prot is not None and _flag_names(prot) == {"mmap", "PROT_READ"}) or
                        (access is not None and "ACCESS_READ" in _flag_names(access))):
                    what = "a writable mmap"
        elif isinstance(func, ast.Name) and func.id == "open":
            mode = _open_mode(node)
            if mode == "?" or set(mode) & set("wax+"):
                what = f"open(..., {mode!r})"
        elif isinstance(func, ast.Attribute) and func.attr in PATH_METHODS and not (
                isinstance(func.value, ast.Name) and func.value.id in self.io_names):
            what = f".{func.attr}()"
        elif isinstance(func, ast.Attribute) and func.attr == "open" and node.args and \
                isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str) and \
                set(node.args[0].value) & set("wax+"):
            what = f".open({node.args[0].value!r})"
        if what is not None:
            self.found.append((self.stack[0] if self.stack else "<module>", node.lineno, what))
        self.generic_visit(node)


def scan(path: Path) -> _Scan:
    s = _Scan()
    s.visit(ast.parse(path.read_text(), filename=str(path)))
    return s


def _modules() -> Iterator[Tuple[str, Path]]:
    for p in sorted(PKG.rglob("*.py")):
        rel = p.relative_to(PKG).as_posix()
        if rel.split("/")[0] in SKIP_DIRS:
            continue
        yield rel, p


def durable_calls_outside_io() -> List[str]:
    return [f"tqstore/{rel}:{line} in {fn}: {what}" for rel, p in _modules() if not rel.startswith("_io/")
            for fn, line, what in scan(p).found if (rel, fn) not in EXEMPT_OUTSIDE_IO]


def io_calls_without_failpoint() -> List[str]:
    out = []
    for rel, p in _modules():
        if rel.startswith("_io/"):
            s = scan(p)
            for fn, line, what in s.found:
                if fn not in s.failpoint_in and (rel, fn) not in EXEMPT:
                    out.append(f"tqstore/{rel}:{line} in {fn}: {what} without a failpoint")
    return out


def test_no_durable_syscall_outside_io():
    bad = durable_calls_outside_io()
    assert not bad, ("syscalls that change durable state outside tqstore/_io (route them through an _io function "
                     "with a failpoint):\n  " + "\n  ".join(bad))


def test_every_durable_syscall_in_io_has_a_failpoint():
    bad = io_calls_without_failpoint()
    assert not bad, "durable syscalls in tqstore/_io without a failpoint (add one, or EXEMPT with the reason):\n  " \
        + "\n  ".join(bad)
    stale = [k for k in {**EXEMPT, **EXEMPT_OUTSIDE_IO} if not any(fn == k[1] for fn, _l, _w in scan(PKG / k[0]).found)]
    assert not stale, f"EXEMPT entries that no longer make a durable call: {stale}"


def test_the_scan_sees_what_it_must(tmp_path):
    src = tmp_path / "m.py"
    src.write_text(
        "import os, shutil as sh, fcntl, mmap, tempfile\n"
        "from os import unlink as rm\n"
        "def f(p, fd):\n"
        "    os.open(p, os.O_RDONLY)\n"            # fine: reads
        "    os.open(p, os.O_RDWR | os.O_CREAT)\n"  # creates
        "    sh.rmtree(p)\n"
        "    rm(p)\n"
        "    fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "    open(p, 'rb').read()\n"                # fine
        "    open(p, 'ab')\n"
        "    p.write_bytes(b'')\n"
        "    'a'.replace('a', 'b')\n"               # fine: not a path method
        "    mmap.mmap(fd, 10, prot=mmap.PROT_READ)\n"  # fine
        "    mmap.mmap(-1, 4096)\n"  # fine: anonymous memory
        "    mmap.mmap(fd, 10)\n"
        "    tempfile.mkdtemp()\n"
        "    tempfile.TemporaryFile()\n")         # fine: anonymous
    found = [w for _f, _l, w in scan(src).found]
    assert found == ["os.open creating or truncating", "shutil.rmtree", "os.unlink", "fcntl.flock",
                     "open(..., 'ab')", ".write_bytes()", "a writable mmap", "tempfile.mkdtemp"], found


# ---------------------------------------------------------------------------- the routed steps under EIO
@pytest.fixture(autouse=True)
def _clean_failpoints():
    fp.disarm()
    fp.set_observer(None)
    yield
    fp.disarm()
    fp.set_observer(None)


def _assert_clean(e: BaseException, kinds=(StorageIOError, CheckpointError)) -> None:
    assert isinstance(e, kinds), repr(e)
    assert "injected" in str(e) or os.strerror(errno.EIO) in str(e), str(e)


def _put_needing_new_segments(tmp: Path) -> None:
    keys = [f"n{i}" for i in range(6)] + ["a0"]  # new rows and one overwrite, big rows: segments roll over
    with _store(tmp / "s") as s:
        _fill(s, "a", 2, 1)
        before = store_state(s)

        def check(e, n):
            _assert_clean(e, StorageIOError)
            assert store_state(s) == before, n

        from crash.scenarios import batch

        failures = fail_each_occurrence("segment_create", "eio",
                                         lambda: s.write("p", batch(keys, salt=5, big=True), keys=keys), check)
        assert failures >= 1
        after = store_state(s)
        assert after != before
    with _store(tmp / "s", num_units=None) as s:
        assert store_state(s) == after


def _load_resharding(tmp: Path) -> None:
    with _store(tmp / "src") as src:
        _fill(src, "a", 5, 1)
        src.save_checkpoint(tmp / "ck")
        want = store_state(src)
    with _store(tmp / "dst", num_units=3) as s:
        _fill(s, "live", 2, 3)
        before = store_state(s)

        def check(e, n):
            _assert_clean(e)
            assert store_state(s) == before, n

        assert fail_each_occurrence("segment_create", "eio", lambda: s.load_checkpoint(tmp / "ck"), check) >= 1
        assert store_state(s) == want


def _torn_tail_on_reopen(tmp: Path) -> None:
    with _store(tmp / "s", num_units=1) as s:
        _fill(s, "a", 2, 1)
        before = store_state(s)
        active = [seg for seg, i in s.units[0].segments().items() if not i.sealed]
        seg = s.units[0].path / segment_name(max(active))
        size = s.units[0].segments()[max(active)].size
    with open(seg, "ab") as f:
        f.write(b"torn" * 100)  # an interrupted write's tail past the recorded size
    fp.arm("truncate", "eio")
    with pytest.raises(TqstoreError) as ei:
        _store(tmp / "s", num_units=None)
    fp.disarm()
    _assert_clean(ei.value, StorageIOError)
    assert "open unit 0" in str(ei.value)
    with _store(tmp / "s", num_units=None) as s:  # the failed open released everything: this one repairs
        assert store_state(s) == before
    assert os.path.getsize(seg) == size


def _store_lock(tmp: Path) -> None:
    with _store(tmp / "s") as s:
        _fill(s, "a", 3, 1)
        before = store_state(s)
    fp.arm("lock_open", "eio")
    with pytest.raises(TqstoreError) as ei:
        _store(tmp / "s", num_units=None)
    fp.disarm()
    _assert_clean(ei.value, StorageIOError)
    assert "LOCK" in str(ei.value)
    with _store(tmp / "s", num_units=None) as s:
        assert store_state(s) == before


def _index_copies_of_a_save(tmp: Path) -> None:
    ck = tmp / "ck"
    with _store(tmp / "s") as s:
        _fill(s, "a", 3, 1)
        s.save_checkpoint(ck)
        prev = store_state(s)
        _fill(s, "b", 2, 2)
        live = store_state(s)

        def check(e, n):
            _assert_clean(e, CheckpointError)
            assert verify_checkpoint(ck, raise_on_error=False).ok
            assert store_state(s) == live
            assert not [p for p in os.listdir(tmp) if ".tmp-" in p]

        # controller and both unit indexes are copied (no segment copies: they are hard-linked)
        assert fail_each_occurrence("copy", "eio", lambda: s.save_checkpoint(ck), check) == 3
        with _store(tmp / "probe") as p:
            p.load_checkpoint(ck)
            assert store_state(p) == live != prev


def _temporary_store(tmp: Path) -> None:
    fp.arm("mkdir", "eio")
    with pytest.raises(TqstoreError) as ei:
        Store(None)
    fp.disarm()
    _assert_clean(ei.value, StorageIOError)


def _best_effort_removal(tmp: Path) -> None:
    s = Store(None, num_units=1)
    s.kv_put("a", "p", fields={"x": 1})
    root = s.root
    fp.arm("rmtree", "eio", repeat=True)
    s.close()  # a temporary store's removal is best effort: the close itself succeeds
    fp.disarm()
    assert s.closed and root.exists()
    files.rmtree(root)


STEPS = {
    "segment_create-put": _put_needing_new_segments,
    "segment_create-reshard_load": _load_resharding,
    "truncate-torn_tail_on_open": _torn_tail_on_reopen,
    "lock_open-store_LOCK": _store_lock,
    "copy-index_copies_of_a_save": _index_copies_of_a_save,
    "mkdir-temporary_store": _temporary_store,
    "rmtree-best_effort_cleanup": _best_effort_removal,
}


@pytest.mark.parametrize("step", sorted(STEPS))
def test_a_routed_step_failed_with_eio_is_a_clean_error_and_loses_nothing(tmp_path, step):
    STEPS[step](tmp_path)
