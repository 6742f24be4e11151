"""Structural walk of untrusted LMDB files, in a child process.

LMDB maps its file and follows the page numbers it finds there: a damaged page (a branch
pointing past the end of the file, an overflow run longer than the file) makes the
*process* die of SIGBUS or SIGSEGV, which no ``try`` catches.  A checkpoint comes from
anywhere, so before a process maps one of its LMDB files, that file is checked: in process
when it reads so (every page by the checked page reader, every entry by the same schema
checks: :mod:`tqstore._io.lmdbschema`), else here: :class:`LmdbWalk` has a child
process open each file read-only, iterate every named database and every entry (which
touches every branch, leaf and overflow page reachable from the main database, the pages
any reader of the file can reach) and check the size and encoding of every key and
value against the file's schema (docs/FORMAT.md, "Unit index" and "Controller index").
A crash, a signal or a timeout of the child, like any problem it reports, is a problem
of the file it was walking.  One child walks all files of a checkpoint, one after the
other; after a crash a new child goes on with the next file.

The child runs ``_lmdbwalk_child.py`` as a script (``python -I -S``): it imports only the
standard library and lmdb, so it starts in tens of milliseconds.  It reports, it does not
decide: callers turn problems into ``CorruptionError``.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import lmdb

from ._lmdbwalk_child import SCHEMAS

_CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_lmdbwalk_child.py")
_LMDB_PATH = os.path.dirname(os.path.dirname(os.path.abspath(lmdb.__file__)))

log = logging.getLogger("tqstore")

DEFAULT_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class WalkProblem:
    """What is wrong with target ``index`` (its ``path``): a message for a CorruptionError."""

    index: int
    path: str
    message: str


# ---------------------------------------------------------------------------- parent side
def _signal_name(rc: int) -> str:
    try:
        return signal.Signals(-rc).name
    except ValueError:
        return f"signal {-rc}"


class LmdbWalk:
    """Walk LMDB environments in child processes, started at once (:meth:`result` waits).

    ``targets`` are ``(env_dir, schema)`` pairs, ``schema`` a key of :data:`SCHEMAS`; each
    ``env_dir/data.mdb`` must already be known to be a regular file (the child opens it by
    path).  ``timeout_s`` bounds the whole walk.  ``first_only``: stop at the first problem
    (a loader needs no more); else every target is walked, a new child going on past a
    crash.
    """

    def __init__(self, targets: Sequence[Tuple[str, str]], *, timeout_s: float = DEFAULT_TIMEOUT_S,
                 first_only: bool = False) -> None:
        self.targets = [(os.fspath(d), s) for d, s in targets]
        for _d, s in self.targets:
            if s not in SCHEMAS:
                raise ValueError(f"unknown LMDB schema {s!r}")
        self.timeout_s = timeout_s
        self.first_only = first_only
        self.t0 = time.monotonic()
        self.elapsed_s = 0.0
        self.entries = 0
        self._problems: List[WalkProblem] = []
        self._proc: Optional[subprocess.Popen] = None
        self._out = None
        self._base = 0
        self._done: Optional[List[WalkProblem]] = None
        self._lock = threading.Lock()  # result() and wait_clean() from several threads
        if self.targets:
            self._spawn(0)

    def _spawn(self, base: int) -> None:
        self._base = base
        self._out = tempfile.TemporaryFile()
        # the targets go through a file on stdin, not the command line: one argument holds at
        # most 128 KiB on Linux (a store of thousands of units, or a long path, names more)
        with tempfile.TemporaryFile() as targets:
            targets.write(json.dumps(self.targets[base:]).encode())
            targets.seek(0)
            self._proc = subprocess.Popen([sys.executable, "-I", "-S", _CHILD, "-", _LMDB_PATH], stdin=targets,
                                          stdout=self._out, stderr=subprocess.DEVNULL, close_fds=True)

    def _records(self) -> List[dict]:
        """The child's records so far.  Read with ``pread`` (no seek): the child writes
        through the same open file description, so moving its offset while the child
        runs would make it overwrite earlier records."""
        assert self._out is not None
        fd = self._out.fileno()
        chunks, off = [], 0
        while True:
            b = os.pread(fd, 1 << 16, off)
            if not b:
                break
            chunks.append(b)
            off += len(b)
        out = []
        for line in b"".join(chunks).splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                break
        return out

    def wait_clean(self, index: int, *, poll_s: float = 0.002) -> List[WalkProblem]:
        """Wait until target ``index`` has been walked; the problems found so far (empty:
        that file walked cleanly, and it may be mapped now, while the child goes on with
        the next files).  Any problem, of this target or of one walked before it, or a
        child that ended early, ends the wait with :meth:`result` (the whole walk's
        findings), so a caller never maps a file the walk did not finish cleanly.

        Thread-safe: the loader's per-unit tasks each wait for their own file.
        """
        if not 0 <= index < len(self.targets):
            raise IndexError(f"no walk target {index}")
        while True:
            with self._lock:
                if self._done is not None:
                    return self._done
                if self._proc is None or self._out is None or self._base != 0:
                    return self._result_locked()  # past a crash: the whole walk settles it
                state = "walking"
                for r in self._records():
                    if "error" in r:
                        state = "problem"
                        break
                    if r.get("done") == index:
                        state = "clean"
                        break
                if state == "clean":
                    self.elapsed_s = max(self.elapsed_s, time.monotonic() - self.t0)
                    return []
                if state == "problem" or self._proc.poll() is not None or \
                        time.monotonic() - self.t0 >= self.timeout_s:
                    return self._result_locked()
            time.sleep(poll_s)

    def result(self) -> List[WalkProblem]:
        """Wait for the walk; the problems found (empty: every file walked cleanly)."""
        with self._lock:
            return self._result_locked()

    def _result_locked(self) -> List[WalkProblem]:
        if self._done is not None:
            return self._done
        while self._proc is not None:
            left = self.timeout_s - (time.monotonic() - self.t0)
            timed_out = False
            try:
                rc = self._proc.wait(timeout=max(0.0, left))
            except subprocess.TimeoutExpired:
                timed_out = True
                self._kill()
                rc = None
            recs = self._records()
            self._out.close()
            self._out, self._proc = None, None
            started: Optional[int] = None
            finished = 0
            for r in recs:
                if "start" in r:
                    started = self._base + r["start"]
                elif "done" in r:
                    started = None
                    finished += 1
                    i = self._base + r["done"]
                    if "error" in r:
                        self._problems.append(WalkProblem(i, self._file(i), f"LMDB file does not walk cleanly: "
                                                                             f"{r['error']}"))
                    else:
                        self.entries += int(r.get("entries", 0))
            if self._base + finished == len(self.targets):
                break
            if started is None:  # the child failed before or between files: not the file's fault
                started = self._base + finished
                why = (f"the walk did not finish within {self.timeout_s:g} s" if timed_out else
                       f"the checking process failed before walking it (exit status {rc})")
                self._problems.append(WalkProblem(started, self._file(started), f"LMDB file cannot be checked: "
                                                                                 f"{why}"))
                break
            why = (f"the walk did not finish within {self.timeout_s:g} s" if timed_out else
                   f"walking it crashed the checking process ({_signal_name(rc)})" if rc is not None and rc < 0
                   else f"walking it ended the checking process (exit status {rc})")
            self._problems.append(WalkProblem(started, self._file(started), f"LMDB file is damaged: {why}"))
            if timed_out or (self.first_only and self._problems) or started + 1 >= len(self.targets):
                break
            self._spawn(started + 1)
        self._problems.sort(key=lambda p: p.index)
        if self.first_only:
            self._problems = self._problems[:1]
        self.elapsed_s = time.monotonic() - self.t0
        self._done = self._problems
        log.debug("walked %d LMDB file(s), %d entries, in %.3f s: %d problem(s)", len(self.targets), self.entries,
                  self.elapsed_s, len(self._problems))
        return self._done

    def _file(self, i: int) -> str:
        return os.path.join(self.targets[i][0], "data.mdb")

    def _kill(self) -> None:
        p = self._proc
        if p is not None and p.poll() is None:
            p.kill()
            p.wait()

    def cancel(self) -> None:
        """Stop the walk (its result no longer matters)."""
        self._kill()
        if self._out is not None:
            self._out.close()
            self._out = None
        self._proc = None
        if self._done is None:
            self._done = []

    def __del__(self) -> None:  # never leave a child running
        try:
            self._kill()
        except Exception:  # noqa: BLE001
            pass
