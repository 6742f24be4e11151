"""Where tqstore may write: the one rule for checkpoint, generation, generation-root and
(coming) dump directories, and the lock a reader or publisher of such a path takes.

tqstore never destroys what is not its own (issue #8):

* a save may replace only a directory of its own kind (a checkpoint: a directory whose
  MANIFEST.json parses as a tqstore checkpoint manifest) or fill a missing or empty
  directory; a regular file, a user's directory, a store directory, anything else is
  refused with :class:`CheckpointError` before anything is touched;
* nothing tqstore owns nests inside another thing it owns: a checkpoint, dump or generation
  root is never written inside a store directory, a checkpoint or a generation root (a
  generation inside its own root excepted), and a store is never opened inside one of
  them (:func:`check_store_location`); otherwise the outer one's next load, reopen,
  replacement or prune would delete the inner one;
* symbolic links are resolved first (:func:`os.path.realpath`): a save through a
  symlinked path publishes at the symlink's target and leaves the link in place.

A kind of directory is a :class:`TargetKind`.  The selective dump passes its own, e.g.
``TargetKind("dump", "tqstore dump", is_own=<does DUMP manifest parse>)``, to
:func:`check_target` and gets the same rule.

The lock of a published path (:func:`lock_path_for`): ``<parent>/.<name>.lock``, or for a
generation ``step-N`` of a generation root ``root/.tqstore-checkpoints.lock``.  Readers
take it shared (:func:`reading`), publication and deletion exclusive.
"""
from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, List, Optional, Tuple

from .._format import dump_records as DR
from .._io import files, locks
from ..errors import CheckpointError, ConfigError, InvalidInputError
from ..layout_dirs import STORE_FILE
from . import manifest as M

PathLike = Any
ROOT_LOCK_NAME = ".tqstore-checkpoints.lock"  # the lock file of a generation root, also its mark
STEP_RE = re.compile(r"^step-(\d{10,})(\.old)?$")
_ROOT_ENTRY = re.compile(r"^(step-\d{10,}(\.old|\.tmp-[0-9a-f]{8})?|\.deleting-step-\d{10,}(\.old)?-[0-9a-f]{8})$")
_CKPT_ENTRY = re.compile(r"^(controller|unit-\d{3,})$")
assert DR.MANIFEST_NAME == M.MANIFEST_NAME  # enclosing_owner looks for one name


def real_path(path: PathLike) -> Path:
    """``path`` (a str or an ``os.PathLike`` giving one) as an absolute path, ``~`` expanded,
    symlinks resolved.

    Raises InvalidInputError: another type (None, a number, bytes), an empty string, a NUL
    character, text that is not valid UTF-8 (an undecodable byte a file name carried in, as
    a surrogate: LMDB takes UTF-8 paths), a name longer than 255 bytes, or the file
    system root (nothing is touched)."""
    try:
        p = os.fspath(path)
    except TypeError:
        raise InvalidInputError(f"a path must be a str or os.PathLike, got {type(path).__name__}") from None
    if not isinstance(p, str):
        raise InvalidInputError(f"a path must be a str (or os.PathLike giving one), got {type(p).__name__}")
    if not p or "\0" in p:
        raise InvalidInputError(f"a path must be a non-empty str without NUL characters, got {p!r:.80}")
    p = os.path.expanduser(p)  # ("~/run/gens" as the store's own path takes it, not ./~/run/gens)
    try:
        p.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInputError(f"a path must be valid UTF-8 text, got {p!r:.80}") from None
    if any(len(part.encode()) > NAME_MAX for part in p.split(os.sep)):
        raise InvalidInputError(f"a path's names are at most {NAME_MAX} bytes each, got {p!r:.80}")
    real = Path(os.path.realpath(p))
    if real.parent == real:
        raise InvalidInputError(f"{p!r} is the file system root: no checkpoint, root or dump can be there")
    return real


#: the longest file name (bytes) a path may hold
NAME_MAX = 255


def is_checkpoint_dir(d: PathLike) -> bool:
    """True if ``d/MANIFEST.json`` is a regular file whose JSON declares the tqstore checkpoint
    format (its checksum and members are not checked: a damaged checkpoint is still one)."""
    return _manifest_format(d, M.MANIFEST_NAME, M.MAX_MANIFEST_BYTES) == M.FORMAT_NAME


def is_dump_dir(d: PathLike) -> bool:
    """True if ``d/MANIFEST.json`` is a regular file whose JSON declares the tqstore dump format
    (``"format": "tqstore dump"``; checksum and members not checked: a damaged dump is still one)."""
    return _manifest_format(d, DR.MANIFEST_NAME, DR.MAX_JSON_BYTES) == DR.MANIFEST_FORMAT


def _manifest_format(d: PathLike, name: str, max_bytes: int) -> Any:
    """The ``"format"`` of the JSON object in ``d/name``, None when there is none: the file is
    missing, larger than ``max_bytes``, not JSON, or not a regular file (opened without
    following a link and without blocking, then checked: a file swapped for a FIFO between a
    check and the open cannot block the caller)."""
    try:
        data = files.read_regular(os.path.join(os.fspath(d), name), max_bytes=max_bytes)
        doc = None if data is None else json.loads(bytes(data))
    except (OSError, ValueError, UnicodeDecodeError, RecursionError):
        return None
    return doc.get("format") if isinstance(doc, dict) else None


_TMP_SUFFIX = re.compile(r"\.tmp-[0-9a-f]{8}")


def is_tmp_name(n: str, name: str) -> bool:
    """``n`` is the name of a save's temporary directory for ``name``: ``<name>.tmp-XXXXXXXX``."""
    return n.startswith(name) and _TMP_SUFFIX.fullmatch(n, len(name)) is not None


def real_dir(p: PathLike) -> bool:
    """``p`` is a directory, not a symbolic link to one."""
    try:
        return stat.S_ISDIR(os.lstat(p).st_mode)
    except OSError:
        return False


def is_save_leftover(d: Path) -> bool:
    """``d`` is a directory (not a symbolic link) holding only what a checkpoint save writes
    (``controller`` and ``unit-NNN`` directories, ``MANIFEST.json``), or nothing: what an
    interrupted save leaves, garbage to remove."""
    if not real_dir(d):
        return False
    try:
        names = os.listdir(d)
    except OSError:
        return False
    return all(n == M.MANIFEST_NAME or (_CKPT_ENTRY.match(n) and real_dir(d / n)) for n in names)


def _is_torn_checkpoint(d: Path) -> bool:
    """A checkpoint directory that lost its manifest: no MANIFEST.json, only ``controller`` and
    ``unit-NNN`` directories."""
    try:
        names = os.listdir(d)
    except OSError:
        return False
    return all(_CKPT_ENTRY.match(n) and (d / n).is_dir() for n in names)


def _is_torn_dump(d: Path) -> bool:
    """A dump directory that lost its manifest: no MANIFEST.json, only its row index and
    shard files."""
    try:
        names = os.listdir(d)
    except OSError:
        return False
    return all((n == DR.ROW_INDEX_NAME or DR._SHARD_RE.match(n)) and (d / n).is_file() for n in names)


def step_name(step: int) -> str:
    """The directory name of generation ``step`` in a generation root."""
    return f"step-{step:010d}"


def generation_steps(d: PathLike) -> Optional[List[int]]:
    """The published steps (ascending) of ``d`` when it is a generation root that a
    :class:`CheckpointManager` made (:func:`is_generation_root`, and its lock file or a
    generation is there), else None."""
    d = Path(d)
    if not is_generation_root(d):
        return None
    names = os.listdir(d)
    if ROOT_LOCK_NAME not in names and not any(_ROOT_ENTRY.match(n) for n in names):
        return None  # (an empty directory)
    return sorted(int(m.group(1)) for m in map(STEP_RE.match, names) if m and not m.group(2))


def is_generation_root(d: PathLike) -> bool:
    """True if ``d`` holds only what a :class:`CheckpointManager` puts there: ``step-N`` (and
    ``step-N.old``, ``step-N.tmp-X``) directories, ``.deleting-*`` directories (none of them
    a symbolic link), its lock file."""
    d = Path(d)
    try:
        names = os.listdir(d)
    except OSError:
        return False
    for n in names:
        if n == ROOT_LOCK_NAME:
            if not (d / n).is_file():
                return False
            continue
        if not _ROOT_ENTRY.match(n):
            return False
        try:
            if not stat.S_ISDIR(os.lstat(d / n).st_mode):  # (a symbolic link is the user's)
                return False
        except FileNotFoundError:
            continue  # renamed since the listing: a save publishing (step-N.tmp-X), a prune (.deleting-*)
        except OSError:
            return False
    return True


@dataclass(frozen=True)
class TargetKind:
    """A kind of directory tqstore writes.

    Attributes:
        name: short name, e.g. ``"checkpoint"``.
        label: what the user reads in an error, e.g. ``"a tqstore checkpoint"``.
        is_own: ``is_own(dir)``: the existing non-empty directory is one of this kind and
            may be replaced (published kinds) or filled (a generation root).
        published: replaced as a whole through ``<dir>.old`` (:func:`tqstore._io.files.publish_dir`);
            then a ``<dir>.old`` beside it must be of this kind too, or a torn one
            (``is_torn``: the leftover of an interrupted removal, garbage the next publish removes).
        in_generation_root: lives directly in a generation root (a generation).
    """

    name: str
    label: str
    is_own: Callable[[Path], bool]
    published: bool = True
    in_generation_root: bool = False
    #: ``is_torn(dir)``: the directory is one of this kind that lost its manifest (what an
    #: interrupted removal of a replaced ``<dir>.old`` leaves: its manifest goes first)
    is_torn: Callable[[Path], bool] = lambda d: False


CHECKPOINT = TargetKind("checkpoint", "a tqstore checkpoint", is_checkpoint_dir, is_torn=_is_torn_checkpoint)
GENERATION = TargetKind("generation", "a checkpoint generation",
                        lambda d: is_checkpoint_dir(d) or _is_torn_checkpoint(d), in_generation_root=True,
                        is_torn=_is_torn_checkpoint)
GENERATION_ROOT = TargetKind("generation root", "a checkpoint generation root", is_generation_root, published=False)
DUMP = TargetKind("dump", "a tqstore dump", is_dump_dir, is_torn=_is_torn_dump)


def _within(inner: Path, outer: Path) -> bool:
    """``inner`` is ``outer`` or below it (both resolved, absolute).  Strings, not
    ``Path.parents``: this runs in a non-blocking save's stall."""
    i, o = os.fspath(inner), os.fspath(outer)
    return i == o or i.startswith(o if o.endswith(os.sep) else o + os.sep)


def enclosing_owner(real: Path, *, skip_root_parent: bool = False) -> Optional[Tuple[str, Path]]:
    """The nearest strict ancestor of ``real`` (a resolved path) that tqstore owns, as
    ``(what, directory)``: ``"the store"`` (holds STORE.json), ``"the checkpoint"`` (holds a
    checkpoint MANIFEST.json) or ``"the checkpoint generation root"`` (holds
    ``.tqstore-checkpoints.lock``).  ``skip_root_parent``: the immediate parent may be a
    generation root (``real`` is one of its generations)."""
    # plain strings and three lstat calls per ancestor: this runs in a non-blocking save's stall
    join, lexists = os.path.join, os.path.lexists
    a, i = os.path.dirname(os.fspath(real)), 0
    while True:
        if lexists(join(a, STORE_FILE)):
            return "the store", Path(a)
        if lexists(join(a, M.MANIFEST_NAME)):  # the checkpoint's and the dump's manifest name
            if is_checkpoint_dir(a):
                return "the checkpoint", Path(a)
            if is_dump_dir(a):
                return "the dump", Path(a)
        if lexists(join(a, ROOT_LOCK_NAME)) and not (i == 0 and skip_root_parent):
            return "the checkpoint generation root", Path(a)
        up = os.path.dirname(a)
        if up == a:
            return None
        a, i = up, i + 1


def describe(p: Path) -> str:
    """What is at ``p``, in words, for an error message."""
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        return "nothing"
    except OSError as e:
        return f"unreadable ({e.strerror})"
    if stat.S_ISLNK(st.st_mode):
        return "a symbolic link that does not resolve (a loop?)"
    if stat.S_ISREG(st.st_mode):
        return f"a regular file of {st.st_size} bytes"
    if not stat.S_ISDIR(st.st_mode):
        return "a special file (not a directory)"
    try:
        names = sorted(os.listdir(p))
    except OSError as e:
        return f"a directory that cannot be listed ({e.strerror})"
    if STORE_FILE in names:
        return "a tqstore store directory (it holds STORE.json)"
    if M.MANIFEST_NAME in names and not is_checkpoint_dir(p) and not is_dump_dir(p):
        return f"a directory holding a {M.MANIFEST_NAME} that is not a tqstore checkpoint's or dump's manifest"
    if ROOT_LOCK_NAME in names or any(_ROOT_ENTRY.match(n) for n in names):
        foreign = [n for n in names if n != ROOT_LOCK_NAME and not (_ROOT_ENTRY.match(n) and real_dir(p / n))]
        if not foreign:
            return "a checkpoint generation root"
        shown = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
        return (f"a checkpoint generation root that also holds {len(foreign)} entr"
                f"{'y' if len(foreign) == 1 else 'ies'} no CheckpointManager puts there ({shown})")
    if is_checkpoint_dir(p):
        return "a tqstore checkpoint"
    if is_dump_dir(p):
        return "a tqstore dump"
    shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
    return f"a directory holding {len(names)} entr{'y' if len(names) == 1 else 'ies'} ({shown})"


def _refuse(path: PathLike, kind: TargetKind, why: str) -> CheckpointError:
    return CheckpointError(f"refusing to write {kind.label} at {os.fspath(path)}: {why}; nothing was changed")


def check_target(path: PathLike, kind: TargetKind = CHECKPOINT, *, live_store: Optional[PathLike] = None) -> Path:
    """Check that ``kind`` may be written at ``path``; return the resolved path to write.

    Allowed: ``path`` is missing (a dangling symlink: its target is missing), an empty
    directory, or a directory ``kind.is_own`` recognises.  Refused: anything else (a file, a
    user's directory, a store, a checkpoint where a generation root is asked for, ...);
    ``path`` inside a store, a checkpoint or a generation root (``kind.in_generation_root``:
    its own parent excepted); ``path`` holding ``live_store`` (the store being saved); for
    a published kind, a ``<path>.old`` that is not of the kind (publication would remove it).
    Nothing is written.

    Raises:
        CheckpointError: naming the path and what is there.
    """
    real = real_path(path)
    owner = enclosing_owner(real, skip_root_parent=kind.in_generation_root)
    if owner is not None:
        raise _refuse(path, kind, f"{real} is inside {owner[0]} {owner[1]}, which would delete it when it is "
                                  f"replaced, loaded, reopened or pruned; choose a path outside it")
    if kind.in_generation_root and not os.path.lexists(real.parent / ROOT_LOCK_NAME) \
            and not is_generation_root(real.parent):
        raise _refuse(path, kind, f"{real.parent} is not a checkpoint generation root ({describe(real.parent)})")
    if live_store is not None:
        sroot = real_path(live_store)
        if _within(sroot, real):
            raise _refuse(path, kind, f"the store being {'dumped' if kind.name == 'dump' else 'saved'} lives at {sroot}")
    _check_one(path, real, kind)
    if kind.published:
        old = os.fspath(real) + ".old"
        if os.path.lexists(old):
            old = Path(old)
            _check_one(path, old, kind, what="the leftover of an interrupted replacement ", torn_ok=True)
    return real


def _check_one(path: PathLike, real: Path, kind: TargetKind, what: str = "", torn_ok: bool = False) -> None:
    try:
        st = os.lstat(real)
    except FileNotFoundError:
        return
    except OSError as e:
        raise _refuse(path, kind, f"{real} cannot be examined ({e.strerror})") from e
    if not stat.S_ISDIR(st.st_mode):
        raise _refuse(path, kind, f"{what}{real} is {describe(real)}")
    try:
        empty = not os.listdir(real)
    except OSError as e:
        raise _refuse(path, kind, f"{real} cannot be listed ({e.strerror})") from e
    if empty or kind.is_own(real) or (torn_ok and kind.is_torn(real)):
        return
    if kind.published:
        rule = f"a {'dump' if kind.name == 'dump' else 'save'} may replace only {kind.label} or fill an empty directory"
    else:
        rule = f"{kind.label} must be missing, empty, or hold only what tqstore puts there"
    raise _refuse(path, kind, f"{what}{real} is {describe(real)}, and {rule}; move it away or choose another path")


def check_store_location(root: PathLike) -> None:
    """Refuse to open or create a store inside a store directory, a checkpoint or a
    checkpoint generation root (symlinks resolved).

    Raises:
        ConfigError: naming the store path and the directory it would be inside.
        InvalidInputError: ``root`` is not a path (:func:`real_path`).
    """
    real = real_path(root)
    owner = enclosing_owner(real)
    if owner is not None:
        raise ConfigError(f"refusing to open a store at {os.fspath(root)}: {real} is inside {owner[0]} {owner[1]}, "
                          f"which would delete it when it is replaced, loaded, reopened or pruned; choose a path "
                          f"outside it")


# ---------------------------------------------------------------------------- locks
def check_target_settled(path: PathLike, kind: TargetKind, *, lock: PathLike,
                         live_store: Optional[PathLike] = None) -> Path:
    """:func:`check_target`, outside the path's lock (a caller checks before its cut and again
    under the lock when it publishes); a refusal is checked again holding ``lock`` shared
    when that lock file exists: another process publishing at ``path`` meanwhile showed a
    passing state (``path`` renamed to ``path.old``, then that removed), which was refused with
    advice to move things away.  Raises CheckpointError as :func:`check_target` does."""
    try:
        return check_target(path, kind, live_store=live_store)
    except CheckpointError:
        if not os.path.lexists(lock):
            raise
    with locks.flocked(lock, shared=True):
        return check_target(path, kind, live_store=live_store)


def lock_path_for(path: PathLike) -> Path:
    """The lock file serialising publication, deletion and reads of the checkpoint at ``path``
    (resolved): ``root/.tqstore-checkpoints.lock`` for a generation ``step-N`` of a generation
    root, else ``<parent>/.<name>.lock`` (``.tqstore-checkpoints.checkpoint.lock`` for a
    checkpoint named ``tqstore-checkpoints``: the other name marks a generation root)."""
    real = real_path(path)
    m = STEP_RE.match(real.name)
    if m and not m.group(2) and os.path.lexists(real.parent / ROOT_LOCK_NAME):
        return real.parent / ROOT_LOCK_NAME
    lock = f".{real.name}.lock"
    if lock == ROOT_LOCK_NAME:  # (a checkpoint named "tqstore-checkpoints": its lock must not mark a root)
        lock = f".{real.name}.checkpoint.lock"
    return real.parent / lock


@contextlib.contextmanager
def reading(path: PathLike) -> Iterator[bool]:
    """Hold the shared lock of the checkpoint at ``path`` (:func:`lock_path_for`): no
    publication replaces it and no prune deletes it meanwhile.  Yields False when the lock
    could not be taken (read-only location: see :func:`tqstore._io.locks.flocked`)."""
    lp = lock_path_for(path)
    real = lp.parent / real_path(path).name
    old = real.with_name(real.name + ".old")
    nothing = not (os.path.lexists(real / M.MANIFEST_NAME) or os.path.lexists(old / M.MANIFEST_NAME))
    if (nothing and not os.path.lexists(lp)) or (
            lp != real.parent / ROOT_LOCK_NAME and (generation_steps(real) is not None or is_dump_dir(real))):
        # nothing there to read (no manifest: nothing, a user's directory, a store) and no
        # lock file a save made (it makes one before it publishes: then the lock is taken, so
        # a save publishing meanwhile is waited for), or a generation root or a dump (read as
        # a checkpoint by mistake): no lock file is left behind, the reader raises not-found
        yield False
        return
    stack = contextlib.ExitStack()
    try:
        held = stack.enter_context(locks.flocked(lp, shared=True))
    except OSError as e:
        raise CheckpointError(f"cannot take the read lock {lp} of checkpoint {os.fspath(path)}: {e}") from e
    with stack:
        yield held


def read_locked(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate ``fn(path, ...)`` to run under :func:`reading` of ``path``."""

    @functools.wraps(fn)
    def wrapper(path: PathLike, *args: Any, **kwargs: Any) -> Any:
        with reading(path):
            return fn(path, *args, **kwargs)

    return wrapper


__all__: List[str] = ["TargetKind", "CHECKPOINT", "GENERATION", "GENERATION_ROOT", "DUMP", "is_dump_dir", "check_target",
                      "check_store_location", "enclosing_owner", "is_checkpoint_dir", "is_generation_root",
                      "lock_path_for", "reading", "read_locked", "ROOT_LOCK_NAME", "is_tmp_name", "is_save_leftover",
                      "step_name", "generation_steps",
                      "real_dir"]
