"""Names of the files and directories inside a store directory (docs/FORMAT.md, "Store directory")."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Optional

from ._io import files
from .errors import ConfigError, CorruptionError, FormatVersionError

STORE_FILE = "STORE.json"
CURRENT_FILE = "CURRENT"
STORE_FORMAT = "tqstore-store"
STORE_VERSION = 1


def state_name(n: int) -> str:
    return f"state-{n:08d}"


def parse_state_name(name: str) -> Optional[int]:
    if name.startswith("state-") and name[6:].isdigit():
        return int(name[6:])
    return None


def unit_dir(state: Path, i: int) -> Path:
    return Path(state) / f"unit-{i:03d}"


def controller_dir(state: Path) -> Path:
    return Path(state) / "controller"


def read_store_file(root: Path) -> Optional[dict]:
    """The parsed STORE.json, or None for a directory that is not (yet) a store."""
    p = Path(root) / STORE_FILE
    if not p.exists():
        return None
    try:
        d = json.loads(p.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise CorruptionError(f"unreadable {STORE_FILE}: {e}", path=str(p)) from e
    if not isinstance(d, dict) or d.get("format") != STORE_FORMAT:
        raise CorruptionError(f"{STORE_FILE} is not a tqstore store descriptor", path=str(p))
    if d.get("version") != STORE_VERSION:
        raise FormatVersionError(f"store format version {d.get('version')} is not supported (reads "
                                 f"{STORE_VERSION})", path=str(p))
    n = d.get("num_units")
    if type(n) is not int or n < 1:
        raise CorruptionError(f"{STORE_FILE} has num_units {n!r}, not a positive int (damaged descriptor: it must "
                              f"match the controller's unit count)", path=str(p))
    return d


def create_store_file(root: Path, num_units: int) -> dict:
    d = {"format": STORE_FORMAT, "version": STORE_VERSION, "num_units": num_units, "created": time.time()}
    files.write_file_atomic(Path(root) / STORE_FILE, json.dumps(d, indent=1).encode())
    return d


def read_current(root: Path) -> Optional[str]:
    p = Path(root) / CURRENT_FILE
    if not p.exists():
        return None
    try:
        name = p.read_bytes().decode("utf-8").strip()
    except UnicodeDecodeError as e:
        raise CorruptionError(f"unreadable {CURRENT_FILE} (not UTF-8): {e}", path=str(p)) from e
    if parse_state_name(name) is None:
        raise CorruptionError(f"{CURRENT_FILE} names {name!r}, not a state directory", path=str(p))
    return name


def write_current(root: Path, name: str, *, fsync: bool = True) -> None:
    """Switch the store to state ``name``: one atomic rename of the pointer file."""
    files.write_file_atomic(Path(root) / CURRENT_FILE, (name + "\n").encode(), fsync=fsync)


def check_units(root: Path, d: dict, requested: Optional[int]) -> int:
    n = int(d["num_units"])
    if requested is not None and int(requested) != n:
        raise ConfigError(f"store at {root} has {n} units but num_units={requested} was asked for; open it "
                          f"without num_units, or save a checkpoint and load it into a new store with "
                          f"{requested} units")
    return n
