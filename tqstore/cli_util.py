"""Shared pieces of ``python -m tqstore``: exit codes, sizes and times for humans, the
progress bar, and what kind of directory a path is.

Nothing here writes to a store, a checkpoint, a generation root or a dump.
"""
from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, List, Optional, TextIO

EXIT_OK = 0
EXIT_DAMAGED = 1
EXIT_USAGE = 2
EXIT_BROKEN_PIPE = 141  # (128 + SIGPIPE, as a tool the signal ended: the reader of the output went away)

KINDS = ("checkpoint", "root", "store", "dump", "dumps", "missing", "file", "torn store", "torn checkpoint", "other")
#: kinds that are damage (exit 1), not a usage error: what lost its descriptor or manifest
TORN_KINDS = ("torn store", "torn checkpoint")


def to_json(doc: Any, **kwargs: Any) -> str:
    """``json.dumps(doc, **kwargs)`` as strict JSON: a NaN or infinite float (tags may hold
    them) is written as the string ``"NaN"``, ``"Infinity"`` or ``"-Infinity"`` (bare ``NaN``
    is no JSON: strict parsers, jq among them, refuse the whole document); integers of any
    size (tags may hold them) are written in full."""
    limit = getattr(sys, "get_int_max_str_digits", lambda: 0)()
    if limit:
        sys.set_int_max_str_digits(0)  # (the command's own process: restored after)
    try:
        try:
            return json.dumps(doc, allow_nan=False, **kwargs)
        except ValueError:
            return json.dumps(_finite(doc), allow_nan=False, **kwargs)
    finally:
        if limit:
            sys.set_int_max_str_digits(limit)


def _finite(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return "NaN" if v != v else "Infinity" if v > 0 else "-Infinity"
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_finite(x) for x in v]
    return v


def human(n: float) -> str:
    """``1536`` -> ``"1.5 KiB"``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def when(t: Optional[float]) -> str:
    """A unix time as local ``YYYY-mm-dd HH:MM:SS`` (``?`` when unknown)."""
    try:
        return "?" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))
    except (OverflowError, OSError, ValueError, TypeError):  # (a time no clock shows: a hand-edited file)
        return "?"


#: a progress bar appears once its operation has run this long (seconds)
PROGRESS_DELAY_S = 0.5


class Progress:
    """A count progress bar on ``stream``, drawn only when it is a terminal and only once the
    operation has run :data:`PROGRESS_DELAY_S` (a check of a small checkpoint draws none; tqdm
    when installed, else a plain ``[####....]`` line); call it with the amount done since the
    last call, then :meth:`close`."""

    def __init__(self, total: int, label: str, stream: TextIO, *, unit: str = "B") -> None:
        self.total = max(1, int(total))
        self.done = 0
        self.stream = stream
        self.label = label
        self.unit = unit
        self._bar = None
        self._start = time.monotonic()
        self._last = 0.0
        self._drawn = 0  # the length of the plain line on the terminal
        self.enabled = bool(getattr(stream, "isatty", lambda: False)())
        if self.enabled:
            try:
                from tqdm import tqdm  # optional dependency (the "progress" extra)
            except ImportError:
                tqdm = None
            if tqdm is not None:
                scale = unit == "B"
                kw = dict(total=self.total, unit=unit, unit_scale=scale, unit_divisor=1024, desc=label, file=stream,
                          leave=False)
                try:
                    self._bar = tqdm(delay=PROGRESS_DELAY_S, **kw)
                except TypeError:  # (a tqdm before 4.60 has no delay)
                    self._bar = tqdm(**kw)

    def __call__(self, n: int) -> None:
        if not self.enabled:
            return
        self.done += n
        if self._bar is not None:
            self._bar.update(n)
            return
        now = time.monotonic()
        if now - self._start < PROGRESS_DELAY_S:
            return
        if now - self._last >= 0.1 or self.done >= self.total:
            self._last = now
            frac = min(1.0, self.done / self.total)
            fill = int(frac * 30)
            amount = human(self.done) if self.unit == "B" else f"{self.done}/{self.total}"
            line = f"{self.label} [{'#' * fill}{'.' * (30 - fill)}] {frac * 100:5.1f}% {amount}"
            self.stream.write("\r" + line.ljust(self._drawn))
            self.stream.flush()
            self._drawn = max(self._drawn, len(line))

    def close(self) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.close()
        elif self._drawn:
            self.stream.write("\r" + " " * self._drawn + "\r")
            self.stream.flush()


def _is_dump(path: Path) -> bool:
    """A selective dump directory (its MANIFEST.json declares the dump format), or the
    ``.old`` of one whose replacement was interrupted."""
    from .checkpoint.target import is_dump_dir

    return is_dump_dir(path) or (not path.exists() and is_dump_dir(path.with_name(path.name + ".old")))


def dumps_in(path: Path, names: Optional[List[str]] = None) -> List[str]:
    """The names of the selective dumps in the directory ``path``, sorted, when it holds one
    or more and every other subdirectory holding a MANIFEST.json is a dump too (a directory
    of dumps, such as one dump per trainer step beside the model's checkpoints); else []."""
    from .checkpoint.manifest import MANIFEST_NAME
    from .checkpoint.target import is_dump_dir

    names = os.listdir(path) if names is None else names
    subdirs = [n for n in names if (path / n).is_dir() and not n.endswith((".tmp", ".old"))]
    dumps = [n for n in subdirs if is_dump_dir(path / n)]
    if not dumps or any((path / n / MANIFEST_NAME).exists() for n in subdirs if n not in dumps):
        return []
    return sorted(dumps)


def kind_of(path: Path) -> str:
    """What ``path`` is: ``checkpoint`` | ``root`` (of generations) | ``store`` | ``dump``
    (a selective dump by key) | ``dumps`` (a directory of dumps: :func:`dumps_in`) | ``missing`` | ``file`` (not a directory) | ``torn store`` (a
    store's state, no STORE.json) | ``torn checkpoint`` (a checkpoint's files, no
    MANIFEST.json) | ``other``.  Reads only; a torn manifest still names a checkpoint (verify
    reports it)."""
    from .checkpoint.manager import _STEP
    from .checkpoint.manifest import MANIFEST_NAME
    from .checkpoint.target import ROOT_LOCK_NAME, is_generation_root

    if _is_dump(path):
        return "dump"
    if (path / MANIFEST_NAME).is_file():
        return "checkpoint"
    if not path.exists():
        old = path.with_name(path.name + ".old")
        return "checkpoint" if (old / MANIFEST_NAME).is_file() else "missing"
    if not path.is_dir():
        return "file" if os.path.lexists(path) else "other"
    if (path / "STORE.json").is_file():
        return "store"
    names = os.listdir(path)
    if ROOT_LOCK_NAME not in names and dumps_in(path, names):
        return "dumps"
    if any(_STEP.match(n) for n in names) or (ROOT_LOCK_NAME in names and is_generation_root(path)):
        return "root"  # (a root with no generation yet holds only its lock file)
    if "CURRENT" in names and any(n.startswith("state-") for n in names):
        return "torn store"
    if "controller" in names and any(n.startswith("unit-") for n in names):
        return "torn checkpoint"
    return "other"


def not_a_target(path: Path, kind: str, what: str = "a checkpoint") -> str:
    """The one-line reason why ``path`` is not something a command works on."""
    if kind == "missing":
        return f"{path} does not exist"
    if kind == "store":
        return f"{path} is a store directory, not {what}"
    if kind == "dump":
        return f"{path} is a selective dump, not {what}"
    if kind == "checkpoint":
        return f"{path} is a checkpoint, not {what}"
    if kind == "root":
        return f"{path} is a directory of checkpoint generations, not {what}"
    if kind == "dumps":
        return f"{path} is a directory of selective dumps, not {what}"
    if kind == "file":
        return f"{path} is a file, not a directory ({what} is one)"
    if kind == "torn store":
        return (f"{path} holds a store's state (CURRENT, state-*) but no STORE.json: the store is damaged, its "
                f"descriptor is missing (put STORE.json back from a copy, or load the store's last checkpoint into "
                f"a new store)")
    if kind == "torn checkpoint":
        return (f"{path} holds a checkpoint's files (controller/, unit-*) but no MANIFEST.json: the checkpoint is "
                f"torn (damaged); load another generation")
    return (f"{path} is neither a checkpoint or dump (no MANIFEST.json), a store (no STORE.json) nor a directory of "
            f"checkpoint generations")


def note_interrupted(path: Path, err: TextIO) -> None:
    """When the dump or checkpoint ``path`` is missing and ``<path>.old`` holds it (a
    replacement interrupted between its renames), say so on stderr: the command reads that."""
    old = path.with_name(path.name + ".old")
    if not os.path.lexists(path) and old.is_dir():
        err.write(f"note: {path} is missing: an interrupted replacement left the previous one at {old.name}, which "
                  f"is what this reads (the next save, dump or load of the path moves it back)\n")


def refuse(path: Path, kind: str, err: TextIO, what: str = "a checkpoint") -> int:
    """Say why the command does not work on ``path`` (of ``kind``); the exit status: 1 for
    something damaged (:data:`TORN_KINDS`), else 2 (usage)."""
    err.write(f"error: {not_a_target(path, kind, what)}\n")
    return EXIT_DAMAGED if kind in TORN_KINDS else EXIT_USAGE


def dump_function(name: str) -> Optional[Callable[..., Any]]:
    """``tqstore.dump.<name>`` (``describe_dump``, ``verify_dump``) when this build has it."""
    try:
        from . import dump
    except ImportError:  # pragma: no cover
        return None
    fn = getattr(dump, name, None)
    return fn if callable(fn) else None


class CliDamaged(Exception):
    """Raised inside a command: report the message and exit 1 (damaged or unreadable)."""


class CliUsage(Exception):
    """Raised inside a command: report the message and exit 2 (usage)."""


def open_store(path: Path, what: str, *, repair: bool = False, walked: bool = False):
    """``tqstore.open(path)`` for ``verify`` / ``compact``: a store held by another process
    raises :class:`CliUsage`; a store that cannot be opened otherwise (a damaged
    controller or unit index, a bad descriptor), or, unless ``repair``, whose open would drop
    data as lost (:func:`tqstore.store_check.data_problems`: nothing is changed), raises
    :class:`CliDamaged`.  ``walked``: the caller walked its indexes already."""
    import tqstore
    from .edge import NumpyEdge
    from .errors import CorruptionError, StorageIOError, TqstoreError
    from .store_check import data_problems
    from . import store_lock

    if not walked:
        walk_store_indexes(path, units=True)
    lost = [] if repair else data_problems(path)
    if lost:
        more = f" (and {len(lost) - 1} more: `verify` lists them)" if len(lost) > 1 else ""
        raise CliDamaged(f"cannot {what} {path}: {lost[0]}{more}; nothing was changed. {LOSS_HINT}")
    try:  # (no tensor leaves these commands: the numpy edge, so that opening does not import torch)
        with store_lock.as_command():  # (a trainer's open meanwhile waits for the command)
            return tqstore.open(path, edge=NumpyEdge("dict"))
    except StorageIOError as e:
        if "is open in another process" in str(e):
            raise CliUsage(f"cannot {what} {path}: the store is open in another process (its LOCK is held); close it "
                           f"there first") from e
        if "already open in this process" in str(e):
            raise CliUsage(f"cannot {what} {path}: {e}") from e
        raise CliDamaged(f"cannot {what} {path}: the store does not open: {e}") from e
    except (CorruptionError, TqstoreError) as e:
        raise CliDamaged(f"cannot {what} {path}: the store does not open: {e}") from e


#: what to do about data_problems (files of a store an open would take for lost)
LOSS_HINT = ("Put the files back if you have them; else load the store's last checkpoint into a new store, or "
             "accept the loss with `python -m tqstore verify --repair STORE` (the open then forgets the fields "
             "those bytes held, as after a power loss)")


def walk_store_indexes(path: Path, *, units: bool) -> None:
    """Before this process maps a store's LMDB files (``units``: the unit indexes too, else the
    controller's alone): walk them in a child process (:mod:`tqstore.store_check`); a problem
    raises :class:`CliDamaged` naming the file."""
    from .store_check import index_walk_problems

    problems = index_walk_problems(path, units=units)
    if problems:
        raise CliDamaged("{}: {}".format(*problems[0]))
