"""Names of the files and directories inside a store directory (docs/FORMAT.md, "Store directory")."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

from ._format.store_files import (  # noqa: F401 - the names are re-exported for the engine
    CURRENT_FILE, STORE_FILE, STORE_FORMAT, STORE_VERSION, decode_current, decode_store_descriptor, encode_current,
    encode_store_descriptor, parse_state_name, state_name, store_descriptor,
)
from ._io import files
from .errors import ConfigError


def scratch_dir(prefix: str) -> Path:
    """A new private temporary directory (``tempfile.mkdtemp`` through :mod:`tqstore._io`,
    failpoint ``mkdir``), for the API edge, which does not reach the I/O layer itself."""
    return files.make_temp_dir(prefix)


def remove_tree(path: Path, *, ignore_errors: bool = False) -> None:
    """Remove a directory tree (through :mod:`tqstore._io`, failpoint ``rmtree``)."""
    files.rmtree(path, ignore_errors=ignore_errors)


def remove_file(path: Path) -> None:
    """Remove a file if it is there (through :mod:`tqstore._io`, failpoint ``unlink``)."""
    files.unlink(path, missing_ok=True)


def unit_dir(state: Path, i: int) -> Path:
    return Path(state) / f"unit-{i:03d}"


def controller_dir(state: Path) -> Path:
    return Path(state) / "controller"


def read_store_file(root: Path) -> Optional[dict]:
    """The parsed STORE.json, or None for a directory that is not (yet) a store."""
    p = Path(root) / STORE_FILE
    if not p.exists():
        return None
    return decode_store_descriptor(p.read_bytes(), path=str(p))


def create_store_file(root: Path, num_units: int) -> dict:
    d = store_descriptor(num_units)
    files.write_file_atomic(Path(root) / STORE_FILE, encode_store_descriptor(d))
    return d


def read_current(root: Path) -> Optional[str]:
    p = Path(root) / CURRENT_FILE
    if not p.exists():
        return None
    return decode_current(p.read_bytes(), path=str(p))


def write_current(root: Path, name: str, *, fsync: bool = True) -> None:
    """Switch the store to state ``name``: one atomic rename of the pointer file."""
    files.write_file_atomic(Path(root) / CURRENT_FILE, encode_current(name), fsync=fsync)


def check_units(root: Path, d: dict, requested: Optional[int]) -> int:
    n = int(d["num_units"])
    if requested is not None and int(requested) != n:
        raise ConfigError(f"store at {root} has {n} units but num_units={requested} was asked for; open it "
                          f"without num_units, or save a checkpoint and load it into a new store with "
                          f"{requested} units")
    return n


#: written by :func:`undo_creation` before it takes ``STORE.json`` back, removed last: while it
#: is there, everything in the store directory but ``LOCK`` is the debris of a creation
UNDO_FILE = "CREATION_UNDO"


def creation_debris(root: Path, name: str) -> bool:
    """What an interrupted store creation can leave (before STORE.json was published): its
    pointer files and an empty state directory (one that holds anything is not debris)."""
    if name in (CURRENT_FILE, CURRENT_FILE + ".tmp", STORE_FILE + ".tmp", UNDO_FILE):
        return True
    p = Path(root) / name
    return parse_state_name(name) is not None and not p.is_symlink() and p.is_dir() and not files.listdir(p)


def undo_creation(root: Path) -> None:
    """Take back a store creation whose open failed before it returned (nothing was
    acknowledged): :data:`UNDO_FILE` is written (durably), then ``STORE.json``, the commit
    point, goes (durably), then the pointer and the state directories it made, the marker
    last; ``LOCK`` and ``root`` stay (the caller holds the lock).  Raises OSError: what is
    left is then the store (the marker not written yet: it opens as it is) or, with the
    marker, debris the next open removes (:func:`refuse_foreign`) before creating afresh."""
    root = Path(root)
    files.write_file(root / UNDO_FILE, b"", fsync=True)
    files.fsync_dir(root)
    files.unlink(root / STORE_FILE)
    files.fsync_dir(root)
    remove_debris(root, [n for n in files.listdir(root) if n != "LOCK"])


def remove_debris(root: Path, names: List[str]) -> None:
    """Remove the debris ``names`` of a creation (:func:`refuse_foreign`'s answer), the undo
    marker last (an interruption leaves it in charge), then fsync ``root``."""
    root = Path(root)
    for name in names:
        if name != UNDO_FILE:
            p = root / name
            files.rmtree(p) if p.is_dir() and not p.is_symlink() else files.unlink(p)
    files.fsync_dir(root)
    if UNDO_FILE in names:
        files.unlink(root / UNDO_FILE)
        files.fsync_dir(root)


def refuse_foreign(root: Path) -> List[str]:
    """Check that ``root`` may hold a store: it is missing, or a store (STORE.json), or holds
    nothing but ``LOCK`` and what an interrupted creation leaves (:func:`creation_debris`,
    returned: the caller removes it once it holds the lock).  Reads only, so an open refuses
    a user's directory (a dump, a checkpoint, anything) before it writes its LOCK file there.

    Raises:
        ConfigError: ``root`` holds other names and no STORE.json.
    """
    root = Path(root)
    if not root.is_dir() or (root / STORE_FILE).exists():
        return []
    leftovers = [n for n in files.listdir(root) if n != "LOCK"]
    if STORE_FILE in leftovers:  # (published meanwhile, by a creation in another process)
        return []
    if UNDO_FILE in leftovers:  # an undone creation (undo_creation) that was interrupted: all of it is debris
        return leftovers
    if not all(creation_debris(root, n) for n in leftovers):
        raise ConfigError(f"{root} is not empty and holds no {STORE_FILE}; refusing to use it as a store "
                          f"(found {sorted(leftovers)[:5]})")
    return leftovers
