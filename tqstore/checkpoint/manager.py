"""Generations of checkpoints under one root: ``root/step-XXXXXXXXXX/``.

* :meth:`CheckpointManager.save` writes a generation (blocking or not) and, once it is
  durable, deletes the generations its retention policy no longer keeps;
* a generation shares every unchanged segment with the previous ones through hard links
  (in link mode they are the store's own files; in copy mode the manifest's ``origin``
  identifies a store file already copied), so a save costs what changed;
* :meth:`CheckpointManager.restore` loads the newest generation that verifies and falls
  back past torn or corrupt ones, with a warning.

A root is only ever a missing or empty directory or one holding nothing but what a
manager puts there (``step-N`` directories, their ``.old``/``.tmp-*``/``.deleting-*``
leftovers, ``.tqstore-checkpoints.lock``), never inside a store, a checkpoint or another
root (:func:`target.check_target`); anything else is refused with CheckpointError.

``root/.tqstore-checkpoints.lock`` (created with the manager; it also marks the directory
as a generation root) is held exclusively to publish a generation and to prune, and
shared by :meth:`restore`, :meth:`verify` and every load or verify of a generation, so a
reader never sees a generation half replaced or deleted under it.
"""
from __future__ import annotations

import contextlib
import functools
import logging
import operator
import os
import secrets
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Tuple

from .. import _default
from .._io import files, locks
from ..running_loads import waits_for_running_loads
from ..errors import (
    CheckpointError, CheckpointNotFoundError, CorruptionError, InvalidInputError, StorageIOError, TqstoreError,
)
from . import manifest as M
from . import target as T
from . import writer
from .planner import Reusable
from .retention import KeepAll, KeepLast, RetentionPolicy, check_policy, kept_steps
from .target import step_name
from .verify import CheckpointReport, read_manifest, resolve_checkpoint_dir, verify_checkpoint

log = logging.getLogger("tqstore")

_STEP = T.STEP_RE
LOCK_NAME = T.ROOT_LOCK_NAME


class CheckpointFallbackWarning(UserWarning):
    """``restore()`` skipped a generation that does not verify and used an older one."""


@contextlib.contextmanager
def _os_errors(what: str) -> Iterator[None]:
    """A bare OSError (a read-only root, say) as StorageIOError naming ``what``."""
    try:
        yield
    except OSError as e:
        if isinstance(e, TqstoreError):
            raise
        raise StorageIOError(f"{what} failed: {e}") from e


#: what :meth:`CheckpointManager._served` answers for a store in this process
_LOCAL = object()


class CheckpointManager:
    """Numbered checkpoint generations of a store under ``root``.

    Args:
        root: directory of the generations (created if missing).
        keep_last: keep only the newest ``keep_last`` generations (None: keep all).
        store: the store to save and restore; None means the default store of
            ``tqstore.init`` (looked up at each call).
        policy: a retention policy object instead of ``keep_last`` (e.g.
            ``KeepAny(KeepLast(3), KeepEvery(1000))``).
        copy_segments: always copy segment files instead of hard-linking the store's
            (generations still share unchanged segments among themselves).

    A store served on Ray (``tq.init({"backend": "ray"})``) has its saves, waits and
    restores run by its host, beside the store (the root must be the same path there).

    Raises:
        CheckpointError: ``root`` is not a directory of generations (a file, a user's or
            a store's directory, a checkpoint), or lies inside a store, a checkpoint or
            another generation root; nothing was created.
    """

    def __init__(self, root, keep_last: Optional[int] = None, *, store=None,
                 policy: Optional[RetentionPolicy] = None, copy_segments: bool = False) -> None:
        if policy is not None and keep_last is not None:
            raise InvalidInputError("give keep_last or policy, not both")
        if policy is not None:
            check_policy(policy)  # (else no save ever prunes)
        if store is not None and not callable(getattr(store, "save_checkpoint", None)):
            raise InvalidInputError(f"store must be a tqstore store (tqstore.open, tq.init), got {store!r:.80}")
        if not isinstance(copy_segments, bool):
            raise InvalidInputError(f"copy_segments must be a bool, got {copy_segments!r:.80}")
        self.root = T.real_path(root)  # (as a save resolves a path: symbolic links, then "..")
        self.policy: RetentionPolicy = policy or (KeepLast(keep_last) if keep_last is not None else KeepAll())
        self.copy_segments = copy_segments
        self._store = store
        self._known_valid: set = set()  # steps this manager published or restored: never pruned as the newest of them
        self._reuse_cache: Dict[str, Any] = {}  # generation dir -> (its manifest's identity, reusable segments)
        T.check_target(self.root, T.GENERATION_ROOT)
        self._make_root()

    def _make_root(self) -> None:
        """Create the root (and its lock file) when it is missing: at construction, and at a
        save after it was removed since (a cleanup between runs)."""
        try:
            files.mkdir(self.root, exist_ok=True, parents=True)
        except OSError as e:
            raise StorageIOError(f"cannot create the checkpoint root {self.root}: {e}") from e
        locks.ensure_lock_file(self.root / LOCK_NAME)  # marks the root (best effort: it may be read-only)

    def _root_lock(self):
        """The root's lock held shared, for a reader; CheckpointNotFoundError when the root is
        gone (removed after this manager was made: taking its lock raised a bare
        FileNotFoundError)."""
        if not os.path.isdir(self.root):
            raise CheckpointNotFoundError(f"no checkpoint generations under {self.root}: it does not exist")
        return locks.flocked(self.root / LOCK_NAME, shared=True)

    @classmethod
    def for_reading(cls, root) -> "CheckpointManager":
        """A manager of the existing root ``root`` for reading its generations (``steps``,
        ``path``, verifying; the command line's read commands): it creates nothing, and takes a
        root that also holds entries no manager puts there (they are no generations, and are
        left alone), which the constructor refuses to write into."""
        m = cls.__new__(cls)
        m.root, m.policy, m.copy_segments, m._store = T.real_path(root), KeepAll(), False, None
        return m

    def __repr__(self) -> str:
        return f"CheckpointManager({str(self.root)!r}, policy={self.policy!r})"

    @property
    def store(self):
        """The managed store (the default store when none was given). RuntimeError before init."""
        return self._store if self._store is not None else _default.get_default()

    def _served(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """When the managed store is served by another process (a Ray store: it has
        ``run_checkpoint_manager``), ``name`` runs there, in a manager of the same root and
        policy beside the store; else :data:`_LOCAL`.  The root must be the same path there."""
        run = getattr(self.store, "run_checkpoint_manager", None)
        if run is None:
            return _LOCAL
        return run(str(self.root), {"policy": self.policy, "copy_segments": self.copy_segments}, name, args, kwargs)

    def path(self, step: int) -> Path:
        """Directory of generation ``step`` (it may not exist)."""
        return self.root / step_name(self._check_step(step))

    @staticmethod
    def _check_step(step: Any) -> int:
        try:  # (an int, or a numpy integer: a trainer's step counter often is one)
            if isinstance(step, bool):
                raise TypeError
            step = operator.index(step)
        except TypeError:
            raise InvalidInputError(f"step must be an int >= 0, got {step!r}") from None
        if step < 0:
            raise InvalidInputError(f"step must be an int >= 0, got {step!r}")
        return step

    def steps(self) -> List[int]:
        """Published generations, ascending (a generation whose replacement was interrupted
        counts through its ``.old`` directory)."""
        out = set()
        for name in files.listdir(self.root):
            m = _STEP.match(name)
            if not m:
                continue
            d = self.root / name
            try:
                if not (d / M.MANIFEST_NAME).is_file():
                    continue
            except OSError:  # (a directory this process may not search: a damaged generation, as a torn one)
                continue
            if m.group(2) and os.path.lexists(self.root / name[:-4]):
                continue
            out.add(int(m.group(1)))
        return sorted(out)

    def _torn_steps(self) -> List[int]:
        """Generation directories without a manifest (damaged after publication)."""
        published = set(self.steps())
        out = set()
        for name in files.listdir(self.root):
            m = _STEP.match(name)
            if m and not m.group(2) and int(m.group(1)) not in published:
                out.add(int(m.group(1)))
        return sorted(out)

    def latest_step(self) -> Optional[int]:
        s = self.steps()
        return s[-1] if s else None

    def metadata(self, step: int) -> Dict[str, Any]:
        """The user metadata saved with generation ``step``."""
        return dict(read_manifest(self.path(step)).metadata)

    def verify(self, step: Optional[int] = None, *, deep: bool = True, raise_on_error: bool = True,
               progress: Optional[Callable[[int], None]] = None) -> CheckpointReport:
        """:func:`verify_checkpoint` of generation ``step`` (newest when None; its keyword
        arguments as there), under the root's lock held shared (no prune deletes it, no save
        replaces it meanwhile).

        Raises:
            CheckpointNotFoundError: no generation (``step`` None) or not that one.
            CorruptionError, FormatVersionError: as :func:`verify_checkpoint`.
        """
        with self._root_lock():
            if step is None:
                step = self.latest_step()
                if step is None:
                    raise CheckpointNotFoundError(f"no checkpoint generations under {self.root}")
            return verify_checkpoint(self.path(step), deep=deep, raise_on_error=raise_on_error, progress=progress)

    # ------------------------------------------------------------------ save
    def _reusable(self) -> Dict[str, Reusable]:
        """Identity -> file of an existing generation holding those bytes (newest first).
        Each generation's manifest is parsed once while it stays the same file (a save
        blocks its caller for this: parsing every kept generation's manifest again at every
        save made ``blocking=False`` stall for 0.5 s with 100 generations)."""
        out: Dict[str, Reusable] = {}
        cache: Dict[str, Any] = {}
        for s in reversed(self.steps()):
            try:
                src = resolve_checkpoint_dir(self.path(s))
                st = os.stat(src / M.MANIFEST_NAME)
                key = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
                hit = self._reuse_cache.get(str(src))
                if hit is not None and hit[0] == key:
                    entries = hit[1]
                else:
                    man = read_manifest(src)
                    entries = [(e.origin, Reusable(str(src / e.path), e.size, e.crc32c))
                               for e in man.by_role(M.ROLE_SEGMENT) if e.origin]
                cache[str(src)] = (key, entries)
            except (CorruptionError, CheckpointNotFoundError, OSError) as e:
                log.info("generation %d is not reusable for sharing: %s", s, e)
                continue
            for origin, r in entries:
                if origin not in out:
                    out[origin] = r
        self._reuse_cache = cache  # (the generations listed now: pruned ones are forgotten)
        return out

    @functools.partial(waits_for_running_loads, store_of=lambda manager: manager.store)
    def save(self, step: int, metadata: Optional[Mapping[str, Any]] = None, *, blocking: bool = True,
             include_storage: bool = True):
        """Save the store as generation ``step`` (replacing an existing one atomically).

        Returns a :class:`CheckpointInfo`, or with ``blocking=False`` a :class:`SaveHandle`
        right after the cut.  Generations the policy drops are deleted after this one is
        durable; this one never is (a policy of the highest steps would otherwise drop a
        step saved below a damaged or abandoned higher one, and with it the only generation
        that verifies).  Saving a step lower than existing ones is allowed and logged at
        WARNING: :meth:`restore` picks the highest step that verifies, so after a crash it
        resumes from those higher steps (a rolled-back run's) until they are removed.
        Raises what :meth:`~tqstore.Store.save_checkpoint` raises (``RestorePendingError``
        while a load by key into the store is unresolved, say), and InvalidInputError for a
        step that is not a non-negative int.
        """
        step = self._check_step(step)
        higher = [s for s in self.steps() if s > step]
        if higher:
            log.warning("saving generation %d under %s below generations %s: restore() takes the highest step that "
                        "verifies, so it would resume from %d, not %d, until those are removed", step, self.root,
                        higher[:5], higher[-1], step)
        path = self.path(step)
        served = self._served("save", step, metadata, blocking=blocking, include_storage=include_storage)
        if served is not _LOCAL:
            return served
        T.check_target(self.root, T.GENERATION_ROOT)  # (else the save would publish and every prune after it fail)
        self._make_root()  # (removed since this manager was made: "missing" is a root a save may use)
        return writer.save(self.store, path, include_storage=include_storage, metadata=metadata, blocking=blocking,
                           copy_segments=self.copy_segments, reuse=self._reusable(),
                           lock_path=self.root / LOCK_NAME, on_published=lambda info: self._published(step),
                           kind=T.GENERATION)

    def _published(self, step: int) -> None:
        self._known_valid.add(step)
        self._prune({step})

    def wait_until_finished(self) -> None:
        """Wait for a background save of the managed store; raise its error if unseen."""
        if self._served("wait_until_finished") is not _LOCAL:
            return
        st = writer.state_of(self.store)
        with st.lock:
            writer.settle(st)

    def prune(self) -> List[int]:
        """Delete the generations the policy does not keep, torn ones (a generation directory
        that lost its manifest) older than every generation kept, and leftovers of interrupted
        saves and prunes (a generation left at ``step-N.old`` by an interrupted replacement is moved
        back to ``step-N``).  Returns the steps deleted.  The newest generation this manager
        published or restored is kept too (say, the one :meth:`restore` fell back to when the
        newer ones the policy keeps do not verify).

        Runs under the root's lock held exclusively (waits for readers of the root).  The
        root is checked again first: if it now holds anything a manager does not put there,
        or lies inside a store or checkpoint, nothing is deleted.  A generation whose
        manifest is not a tqstore checkpoint manifest is left alone (with a warning), as is
        the temporary directory of a save still running.

        Raises:
            CheckpointError: the root is no longer a generation root (nothing deleted).
        """
        return self._prune(())

    def prune_plan(self) -> Tuple[List[int], List[int]]:
        """What :meth:`prune` would do now, deleting nothing: ``(steps it would delete, steps
        it would leave alone as holding what is not a tqstore checkpoint)``, ascending (an
        interrupted replacement's ``step-N.old``, which prune first moves back, is not
        counted)."""
        return self._plan((), warn=False)

    def _plan(self, also_keep: Iterable[int], *, warn: bool) -> Tuple[List[int], List[int]]:
        """``(doomed, foreign)`` of a prune keeping ``also_keep`` too (see :meth:`prune_plan`)."""
        steps = self.steps()
        keep = kept_steps(self.policy, steps) | frozenset(also_keep)
        valid = [v for v in self._known_valid if v in steps]
        if valid:  # the newest generation known to verify stays (the policy's may be damaged)
            keep |= {max(valid)}
        doomed = [s for s in steps if s not in keep]
        # a torn one goes once it is older than every generation kept (it never holds a slot of the policy)
        doomed += [t for t in self._torn_steps() if keep and t < min(keep)]
        left = []
        for s in list(doomed):
            foreign = [n for n in (step_name(s), step_name(s) + ".old") if os.path.lexists(self.root / n)
                       and not T.GENERATION.is_own(self.root / n)]
            if foreign:
                if warn:
                    log.warning("not pruning generation %d under %s: %s is not a tqstore checkpoint", s, self.root,
                                foreign)
                doomed.remove(s)
                left.append(s)
        return sorted(doomed), sorted(left)

    def _prune(self, also_keep: Iterable[int]) -> List[int]:
        """:meth:`prune`, keeping the steps ``also_keep`` too (a save's own)."""
        deleted = []
        with _os_errors(f"pruning checkpoint generations under {self.root}"), writer.path_lock(self.root / LOCK_NAME):
            T.check_target(self.root, T.GENERATION_ROOT)
            for name in files.listdir(self.root):  # finish replacements interrupted between their renames
                m = _STEP.match(name)
                if m and m.group(2) and not os.path.lexists(self.root / name[:-4]) \
                        and (self.root / name / M.MANIFEST_NAME).is_file():
                    log.info("restoring %s left by an interrupted replacement", name)
                    files.rename(self.root / name, self.root / name[:-4])
                    files.fsync_dir(self.root)
            doomed, _foreign = self._plan(also_keep, warn=True)
            for s in doomed:
                for name in (step_name(s), step_name(s) + ".old"):
                    p = self.root / name
                    if os.path.lexists(p):
                        files.rename(p, self.root / f".deleting-{name}-{secrets.token_hex(4)}")
                deleted.append(s)
            if doomed:
                files.fsync_dir(self.root)
            for name in files.listdir(self.root):
                if name.startswith(".deleting-") or (_STEP.match(name.split(".tmp-")[0]) and ".tmp-" in name
                                                     and not locks.dir_in_use(self.root / name)):
                    files.rmtree(self.root / name)
        if deleted:
            log.info("pruned checkpoint generations %s under %s", deleted, self.root)
        return deleted

    # ------------------------------------------------------------------ restore
    def restore(self, step: Optional[int] = None) -> int:
        """Load generation ``step`` into the store, or (None) the newest one that verifies,
        falling back past torn or corrupt generations with a :class:`CheckpointFallbackWarning`.

        Returns the step restored.  Raises CheckpointNotFoundError when there is no
        generation, the load's error when ``step`` is given, and CheckpointError when none
        verifies (also when the only generations left lost their manifests).  A load that
        fails with an I/O error falls back too when the generation's own files do not read
        back (:func:`verify_checkpoint`; a bad sector), and raises when they do (the
        store's side failed: a full disk, say).

        The root's lock is held shared from listing the generations to the end of the load
        (after the store's own background save, if any, has finished): no save publishes
        and no prune deletes a generation under it, in any process, so a generation is never
        skipped for being replaced or pruned meanwhile.
        """
        served = self._served("restore", step)
        if served is not _LOCAL:
            return served
        store = self.store
        if step is not None:
            step = self._check_step(step)
            store.load_checkpoint(self.path(step))
            self._known_valid.add(step)
            return step
        st = writer.state_of(store)
        with st.lock:  # re-entered by load_checkpoint; our own save must publish before we lock
            writer.settle(st)
            with self._root_lock():
                return self._restore_newest(store)

    def _restore_newest(self, store) -> int:
        steps = sorted(self.steps(), reverse=True)
        if not steps:
            torn = self._torn_steps()
            if torn:  # (not "no generation": a trainer would start afresh)
                raise CheckpointError(f"no generation under {self.root} verifies: generation(s) {torn} have no "
                                      f"{M.MANIFEST_NAME} (damaged)")
            raise CheckpointNotFoundError(f"no checkpoint generations under {self.root}")
        failures = []
        for s in self._torn_steps():
            if s > steps[0]:
                msg = (f"checkpoint generation {s} under {self.root} has no {M.MANIFEST_NAME} (torn or damaged); "
                       f"skipping it")
                log.warning(msg)
                warnings.warn(msg, CheckpointFallbackWarning, stacklevel=3)
        for s in steps:
            try:
                store.load_checkpoint(self.path(s))
            except (CorruptionError, CheckpointNotFoundError, CheckpointError) as e:
                if type(e) is CheckpointError and not self._unreadable(s):  # (the store's side failed: raise)
                    raise
                failures.append((s, e))
                msg = f"checkpoint generation {s} under {self.root} does not verify ({e}); trying an older one"
                log.warning(msg)
                warnings.warn(msg, CheckpointFallbackWarning, stacklevel=3)
                continue
            if failures:
                log.warning("restored generation %d after skipping %s", s, [f[0] for f in failures])
            self._known_valid.add(s)
            return s
        s, e = failures[0]
        raise CheckpointError(f"no generation under {self.root} verifies (newest {s}: {e})") from e

    def _unreadable(self, step: int) -> bool:
        """Whether generation ``step``'s own files fail a check (a load that failed with an
        I/O error: a bad sector of the generation falls back like damage, a failure on the
        store's side does not)."""
        try:
            return not verify_checkpoint(self.path(step), raise_on_error=False).ok
        except TqstoreError:
            return True
