"""A power-loss simulator driven by the I/O layer's observer.

:class:`PowerLoss` watches every durable operation of ``tqstore._io`` (through
:func:`tqstore._io.failpoints.set_observer`) under one directory ``base`` and models what
a power cut would leave on disk:

* file content: what each file held at its last ``fsync`` (or at :meth:`PowerLoss.start`,
  the *baseline*, which is taken as durable), plus the writes and truncations since, each
  **kept**, **dropped** or **garbled** (a torn write: part new bytes, part noise);
* directory entries: the names at the baseline, plus every create, rename, link, unlink,
  mkdir and tree removal since, each kept or dropped unless an ``fsync`` of its directory
  made it durable (a rename is kept or dropped as a whole; an operation whose source no
  longer exists in the simulated tree is skipped);
* files that change without an observed write (LMDB writes in C, ``copy_file_range``) are
  judged by a per-path policy: ``"current"`` (the writer syncs them itself, e.g. LMDB with
  ``durability="commit"``), ``"atomic"`` (old or new content as a whole: LMDB without
  sync) or ``"torn"`` (old, new, or a torn mix).

At a crash point — the ``crash_at``-th observed event (before it executes), or an
explicit :meth:`PowerLoss.crash_now` — the simulated disk is written to ``image`` as a
restarted process would find it, and :class:`SimulatedCrash` is raised to stop the
operation.  The choices depend only on ``seed`` and the event sequence: seed 0 drops
every unsynced change, seed 1 keeps every one (like a process kill), larger seeds mix.

Meant for tests: it reads whole files at every fsync, so keep the data small.
"""
from __future__ import annotations

import os
import random
import shutil
import stat
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple, Union

from .._io import failpoints as fp

PathLike = Union[str, "os.PathLike[str]"]

#: I/O events that are crash points but do not change the disk model.
COMMIT_EVENTS = ("unit_commit", "controller_commit")

#: Seeds with a fixed meaning.
DROP_ALL = 0
KEEP_ALL = 1


class SimulatedCrash(BaseException):
    """Raised at the crash point to stop the operation (derives from BaseException so
    that ``except Exception`` cleanup in the engine does not swallow it)."""


@dataclass
class _Node:
    uid: int
    kind: str  # "file" | "dir"
    durable: bytes = b""  # file content at the last fsync (or baseline)
    pending: List[tuple] = field(default_factory=list)  # ("write", off, n) / ("trunc", size)
    last_seen: Optional[bytes] = None  # content read just before the node lost a name
    relpath: str = ""  # a recent path relative to base (for the unobserved policy)


@dataclass
class _DirOp:
    kind: str  # "add" | "remove" | "rename"
    dir: int
    name: str
    uid: int
    dst_dir: int = -1
    dst_name: str = ""
    synced: bool = False
    event: int = 0

    def touches(self, d: int) -> bool:
        return self.dir == d or self.dst_dir == d


@dataclass
class Event:
    """One observed I/O event: its 1-based index, name and a short description."""

    index: int
    name: str
    detail: str


def default_policy(relpath: str) -> str:
    """Unobserved-change policy: LMDB lock files do not matter; everything else may tear."""
    return "current" if relpath.endswith("lock.mdb") else "torn"


def lmdb_policy(live_prefix: str, *, synced: bool) -> Callable[[str], str]:
    """A policy for a base holding a live store at ``live_prefix`` (relative path).

    LMDB files of the live store are ``"current"`` when the store syncs every commit
    (``durability="commit"``) and ``"atomic"`` otherwise; other unobserved changes tear.
    """
    live_prefix = live_prefix.rstrip("/") + "/"

    def policy(relpath: str) -> str:
        if relpath.endswith("lock.mdb"):
            return "current"
        if relpath.startswith(live_prefix) and relpath.endswith("data.mdb"):
            return "current" if synced else "atomic"
        return "torn"

    return policy


class PowerLoss:
    """Record unsynced changes under ``base`` and materialise a power-cut image.

    Args:
        base: directory holding everything to simulate (e.g. a store and a checkpoint root).
        image: where :meth:`crash` writes the simulated disk (a directory, replaced).
        seed: the keep/drop/garble choices (0 drops all, 1 keeps all, others mix).
        crash_at: crash before the ``crash_at``-th observed event (None: only on
            :meth:`crash_now`).
        policy: ``policy(relpath) -> "current" | "atomic" | "torn"`` for unobserved changes.
    """

    def __init__(self, base: PathLike, image: PathLike, *, seed: int = 0, crash_at: Optional[int] = None,
                 policy: Callable[[str], str] = default_policy) -> None:
        self.base = Path(base).resolve()
        self.image = Path(image)
        self.seed = seed
        self.crash_at = crash_at
        self.policy = policy
        self.events: List[Event] = []
        self.crashed = False
        self.crash_event: Optional[Event] = None
        self.errors: List[str] = []  # internal failures of the simulator (tests assert none)
        self._lock = threading.RLock()
        self._nodes: Dict[int, _Node] = {}
        self._ino: Dict[Tuple[int, int], int] = {}  # live (dev, ino) -> uid
        self._base_listing: Dict[int, Dict[str, int]] = {}
        self._model: Dict[int, Dict[str, int]] = {}  # listings with every observed op applied
        self._log: List[_DirOp] = []
        self._deferred: List[Tuple[str, str]] = []  # ops whose effect is known only afterwards
        self._next_uid = 1
        self._root_uid = 0
        self._started = False

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> "PowerLoss":
        """Take the baseline (everything under ``base`` counts as durable) and start observing."""
        self._baseline()
        self._started = True
        fp.set_observer(self._on_event)
        return self

    def stop(self) -> None:
        """Stop observing (the recorded state stays; :meth:`crash_now` still works)."""
        fp.set_observer(None)

    def __enter__(self) -> "PowerLoss":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def crash_now(self) -> Path:
        """Cut the power now: write the image and stop observing. Returns the image path."""
        with self._lock:
            if not self.crashed:
                self._settle()
                self._materialize()
                self.crashed = True
        self.stop()
        return self.image

    # ------------------------------------------------------------------ identities
    def _rel(self, path: PathLike) -> Optional[str]:
        p = os.path.abspath(path)
        b = str(self.base)
        if p == b:
            return ""
        if p.startswith(b + os.sep):
            return p[len(b) + 1:]
        return None

    def _new_node(self, kind: str, key: Optional[Tuple[int, int]], relpath: str, durable: bytes = b"") -> _Node:
        uid = self._next_uid
        self._next_uid += 1
        n = _Node(uid, kind, durable=durable, relpath=relpath)
        self._nodes[uid] = n
        if key is not None:
            self._ino[key] = uid
        if kind == "dir":
            self._model.setdefault(uid, {})
        return n

    def _node_for_stat(self, st: os.stat_result, relpath: str) -> _Node:
        key = (st.st_dev, st.st_ino)
        uid = self._ino.get(key)
        kind = "dir" if stat.S_ISDIR(st.st_mode) else "file"
        if uid is not None and self._nodes[uid].kind == kind:
            n = self._nodes[uid]
            n.relpath = relpath
            return n
        return self._new_node(kind, key, relpath)  # a node born since the baseline: nothing durable

    def _node_at(self, path: PathLike) -> Optional[_Node]:
        rel = self._rel(path)
        if rel is None:
            return None
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return None
        return self._node_for_stat(st, rel)

    def _node_for_fd(self, fd: int) -> Optional[_Node]:
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
            st = os.fstat(fd)
        except OSError:
            return None
        if target.endswith(" (deleted)"):
            key = (st.st_dev, st.st_ino)
            uid = self._ino.get(key)
            return self._nodes.get(uid) if uid is not None else None
        rel = self._rel(target)
        if rel is None:
            return None
        return self._node_for_stat(st, rel)

    def _dir_of(self, path: PathLike) -> Optional[_Node]:
        return self._node_at(os.path.dirname(os.path.abspath(path)))

    @staticmethod
    def _read_fd(fd: int) -> bytes:
        with open(f"/proc/self/fd/{fd}", "rb") as f:
            return f.read()

    @staticmethod
    def _read_path(path: PathLike) -> Optional[bytes]:
        try:
            with open(path, "rb") as f:
                return f.read()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None

    def _forget(self, node: _Node, path: PathLike) -> None:
        """``path`` (a name of ``node``) is about to go: keep its content, retire its inode key
        when this was the last name so a reused inode number gets a new identity."""
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return
        if node.kind == "file":
            node.last_seen = self._read_path(path)
        if node.kind == "dir" or st.st_nlink <= 1:
            self._ino.pop((st.st_dev, st.st_ino), None)

    # ------------------------------------------------------------------ baseline
    def _baseline(self) -> None:
        st = os.lstat(self.base)
        root = self._new_node("dir", (st.st_dev, st.st_ino), "")
        self._root_uid = root.uid
        for dirpath, dirnames, filenames in os.walk(self.base):
            d = self._node_at(dirpath)
            listing = {}
            for name in sorted(dirnames + filenames):
                p = os.path.join(dirpath, name)
                try:
                    st = os.lstat(p)
                except FileNotFoundError:
                    continue
                n = self._node_for_stat(st, self._rel(p))
                if n.kind == "file":
                    n.durable = self._read_path(p) or b""
                listing[name] = n.uid
            self._base_listing[d.uid] = dict(listing)
            self._model[d.uid] = dict(listing)

    # ------------------------------------------------------------------ the observer
    def _on_event(self, event: str, *args) -> None:
        with self._lock:
            if self.crashed:
                raise SimulatedCrash(f"power already cut (event {event})")
            self._settle()
            ev = Event(len(self.events) + 1, event, " ".join(str(a) for a in args))
            if self.crash_at is not None and ev.index >= self.crash_at:
                self.crash_event = ev
                self._materialize()
                self.crashed = True
                raise SimulatedCrash(f"simulated power loss before event {ev.index} ({event} {ev.detail})")
            self.events.append(ev)
            handler = getattr(self, "_ev_" + event, None)
            if handler is not None:
                try:
                    handler(ev, *args)
                except Exception as e:  # noqa: BLE001 - a simulator bug must not change the engine's path
                    self.errors.append(f"event {ev.index} {event}: {type(e).__name__}: {e}")

    def _log_op(self, op: _DirOp) -> None:
        self._log.append(op)
        self._apply(self._model, op)

    @staticmethod
    def _apply(listings: Dict[int, Dict[str, int]], op: _DirOp) -> None:
        if op.kind == "add":
            listings.setdefault(op.dir, {})[op.name] = op.uid
        elif op.kind == "remove":
            d = listings.setdefault(op.dir, {})
            if d.get(op.name) == op.uid:
                del d[op.name]
        elif op.kind == "rename":
            s = listings.setdefault(op.dir, {})
            if s.get(op.name) != op.uid:
                return  # its source never became durable: the rename cannot have happened
            del s[op.name]
            listings.setdefault(op.dst_dir, {})[op.dst_name] = op.uid

    def _ev_write(self, ev: Event, fd: int, offset: int, total: int) -> None:
        n = self._node_for_fd(fd)
        if n is not None:
            n.pending.append(("write", int(offset), int(total)))

    def _ev_truncate(self, ev: Event, path: str, size: int) -> None:
        n = self._node_at(path)
        if n is not None:
            n.pending.append(("trunc", int(size)))

    def _ev_fsync_file(self, ev: Event, fd: int, label: str = "") -> None:
        n = self._node_for_fd(fd)
        if n is not None:
            n.durable = self._read_fd(fd)
            n.pending = []

    def _ev_lmdb_sync(self, ev: Event, path: str) -> None:  # an LMDB environment flushed (env.sync)
        n = self._node_at(os.path.join(path, "data.mdb"))
        if n is not None and n.kind == "file":
            n.durable = self._read_path(os.path.join(path, "data.mdb")) or b""
            n.pending = []

    def _ev_fsync_dir(self, ev: Event, path: str) -> None:
        d = self._node_at(path)
        if d is None:
            return
        self._reconcile(d, path, ev.index)
        for op in self._log:
            if op.touches(d.uid):
                op.synced = True

    def _ev_create(self, ev: Event, path: str) -> None:
        # write_file opened path with O_CREAT|O_TRUNC: an existing node was truncated, or a new one made
        d = self._dir_of(path)
        if d is None:
            return
        name = os.path.basename(path)
        n = self._node_at(path)
        if n is None:
            return
        if self._model.get(d.uid, {}).get(name) == n.uid:
            n.pending.append(("trunc", 0))
        else:
            self._log_op(_DirOp("add", d.uid, name, n.uid, event=ev.index))

    def _ev_rename(self, ev: Event, src: str, dst: str) -> None:
        sd, dd = self._dir_of(src), self._dir_of(dst)
        n = self._node_at(src)
        if sd is None or dd is None or n is None:
            return
        old = self._node_at(dst)
        if old is not None and old.uid != n.uid:
            self._forget(old, dst)
        self._log_op(_DirOp("rename", sd.uid, os.path.basename(src), n.uid, dd.uid, os.path.basename(dst),
                            event=ev.index))
        n.relpath = self._rel(dst) or n.relpath

    def _ev_link(self, ev: Event, src: str, dst: str) -> None:
        self._deferred.append(("link", dst))

    def _ev_copy(self, ev: Event, src: str, dst: str) -> None:
        self._deferred.append(("new", dst))

    def _ev_mkdir(self, ev: Event, path: str) -> None:
        self._deferred.append(("new", path))

    def _ev_segment_create(self, ev: Event, path: str) -> None:
        # a new segment file (O_CREAT | O_EXCL): it exists once the step is done
        self._deferred.append(("new", path))

    def _ev_unlink(self, ev: Event, path: str) -> None:
        d, n = self._dir_of(path), self._node_at(path)
        if d is None or n is None:
            return
        self._forget(n, path)
        self._log_op(_DirOp("remove", d.uid, os.path.basename(path), n.uid, event=ev.index))

    def _ev_rmtree(self, ev: Event, path: str) -> None:
        top = self._node_at(path)
        if top is None:
            return
        for dirpath, dirnames, filenames in os.walk(path, topdown=False):
            dn = self._node_at(dirpath)
            for name in sorted(filenames + dirnames):
                p = os.path.join(dirpath, name)
                n = self._node_at(p)
                if n is None:
                    continue
                self._forget(n, p)
                self._log_op(_DirOp("remove", dn.uid, name, n.uid, event=ev.index))
        parent = self._dir_of(path)
        self._forget(top, path)
        self._log_op(_DirOp("remove", parent.uid, os.path.basename(path), top.uid, event=ev.index))

    def _settle(self) -> None:
        """Record the effect of operations that complete after their event (mkdir, link, copy)."""
        todo, self._deferred = self._deferred, []
        for kind, path in todo:
            rel = self._rel(path)
            if rel is None:
                continue
            # make every component from base down known to the model
            parts = Path(rel).parts
            cur = self.base
            for i, comp in enumerate(parts):
                parent = self._node_at(cur)
                cur = cur / comp
                n = self._node_at(cur)
                if parent is None or n is None:
                    break
                if self._model.get(parent.uid, {}).get(comp) != n.uid:
                    self._log_op(_DirOp("add", parent.uid, comp, n.uid, event=len(self.events)))

    def _reconcile(self, d: _Node, path: PathLike, event: int) -> None:
        """Record, as unsynced operations, entries of ``path`` that changed without an event
        (files LMDB or a raw ``open`` created)."""
        try:
            names = sorted(os.listdir(path))
        except (FileNotFoundError, NotADirectoryError):
            names = []
        actual = {}
        for name in names:
            n = self._node_at(os.path.join(path, name))
            if n is not None:
                actual[name] = n.uid
        model = self._model.setdefault(d.uid, {})
        for name, uid in actual.items():
            if model.get(name) != uid:
                self._log_op(_DirOp("add", d.uid, name, uid, event=event))
        for name, uid in list(model.items()):
            if name not in actual:
                self._log_op(_DirOp("remove", d.uid, name, uid, event=event))

    # ------------------------------------------------------------------ materialising the image
    def _choose(self, rng: random.Random, options: Tuple[str, ...], weights: Tuple[float, ...]) -> str:
        if self.seed == DROP_ALL:
            return options[-1]  # every option list ends with its "drop"/"old" choice
        if self.seed == KEEP_ALL:
            return options[0]
        return rng.choices(options, weights)[0]

    def _materialize(self) -> None:
        # everything that exists now under base, with nodes for unobserved files
        current_paths: Dict[int, str] = {}
        for dirpath, dirnames, filenames in os.walk(self.base):
            d = self._node_at(dirpath)
            if d is None:  # removed since the walk listed it (another thread's rmtree): the model has it
                continue
            current_paths[d.uid] = dirpath
            self._reconcile(d, dirpath, len(self.events) + 1)
            for name in filenames:
                n = self._node_at(os.path.join(dirpath, name))
                if n is not None:
                    current_paths.setdefault(n.uid, os.path.join(dirpath, name))
        rng = random.Random(self.seed * 1_000_003 + 17)
        listings = {k: dict(v) for k, v in self._base_listing.items()}
        for op in self._log:
            if op.synced or self._choose(rng, ("keep", "drop"), (0.5, 0.5)) == "keep":
                self._apply(listings, op)
        contents: Dict[int, bytes] = {}
        for uid in sorted(self._nodes):
            n = self._nodes[uid]
            if n.kind != "file":
                continue
            p = current_paths.get(uid)
            cur = self._read_path(p) if p is not None else None
            if p is not None:
                n.relpath = self._rel(p) or n.relpath
            if cur is None:
                cur = n.last_seen if n.last_seen is not None else n.durable
            contents[uid] = self._file_content(n, cur, rng)
        if self.image.exists():
            shutil.rmtree(self.image)
        made: Dict[int, str] = {}
        self._write_dir(self._root_uid, str(self.image), listings, contents, made, set())

    def _write_dir(self, uid: int, out: str, listings, contents, made: Dict[int, str], stack: set) -> None:
        os.makedirs(out, exist_ok=True)
        stack = stack | {uid}
        for name, child in sorted(listings.get(uid, {}).items()):
            n = self._nodes[child]
            p = os.path.join(out, name)
            if n.kind == "dir":
                if child in stack or child in made:
                    continue  # a directory can live at one place only
                made[child] = p
                self._write_dir(child, p, listings, contents, made, stack)
            elif child in made:
                os.link(made[child], p)
            else:
                with open(p, "wb") as f:
                    f.write(contents[child])
                made[child] = p

    def _file_content(self, n: _Node, cur: bytes, rng: random.Random) -> bytes:
        base = n.durable
        if not n.pending and base == cur:
            return cur
        if n.pending:
            full = bytearray(base)
            for op in n.pending:
                _apply_file_op(full, op, cur, keep=True)
            if bytes(full) == cur:
                buf = bytearray(base)
                for op in n.pending:
                    how = self._choose(rng, ("keep", "garble", "drop"), (0.5, 0.25, 0.25))
                    if how == "keep":
                        _apply_file_op(buf, op, cur, keep=True)
                    elif how == "garble":
                        _apply_file_op(buf, op, cur, keep=True, garble=rng)
                return bytes(buf)
        policy = self.policy(n.relpath)
        if policy == "current":
            return cur
        if policy == "atomic":
            return cur if self._choose(rng, ("new", "old"), (0.5, 0.5)) == "new" else base
        how = self._choose(rng, ("new", "torn", "old"), (0.4, 0.3, 0.3))
        if how == "new":
            return cur
        if how == "old":
            return base
        return _torn(base, cur, rng)


def _apply_file_op(buf: bytearray, op: tuple, cur: bytes, *, keep: bool, garble: Optional[random.Random] = None) -> None:
    if op[0] == "trunc":
        size = op[1]
        if size < len(buf):
            del buf[size:]
        else:
            buf.extend(b"\0" * (size - len(buf)))
        return
    _, off, n = op
    data = bytearray(cur[off:off + n])
    data.extend(b"\0" * (n - len(data)))
    if garble is not None and n:
        a = garble.randrange(n)
        b = garble.randrange(a, n) + 1
        data[a:b] = garble.randbytes(b - a)
    if len(buf) < off:
        buf.extend(b"\0" * (off - len(buf)))
    buf[off:off + n] = data


def _torn(old: bytes, new: bytes, rng: random.Random) -> bytes:
    """A torn update: new content up to a random point, then old content or zeros."""
    if not new:
        return old
    cut = rng.randrange(len(new) + 1)
    tail = old[cut:len(new)] if rng.random() < 0.5 else b"\0" * max(0, len(new) - cut)
    out = new[:cut] + tail
    return out[:rng.randrange(cut, len(new) + 1)] if rng.random() < 0.3 else out


__all__ = ["PowerLoss", "SimulatedCrash", "Event", "default_policy", "lmdb_policy", "DROP_ALL", "KEEP_ALL",
           "COMMIT_EVENTS"]
