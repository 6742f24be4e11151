"""Helpers of the dump tests: the frames a dump holds and the frames a store holds, byte for
byte, and a comparable picture of a dump (row index and frames)."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Dict, Iterable, Tuple

from tqstore.dump import read_row_index
from tqstore.dump.reader import read_index, read_shard_table
from tqstore._io import files


def dump_frames(dump_dir: Path) -> Dict[Tuple[str, str], bytes]:
    """``(key, field) -> frame bytes`` of every frame the dump's shards hold."""
    ix = read_index(dump_dir)
    key_of = {r["gidx"]: k for k, r in ix.rows.rows.items()}
    out: Dict[Tuple[str, str], bytes] = {}
    for entry in ix.manifest["shards"]:
        fd = files.open_regular(ix.dir / entry["path"], under=ix.dir)
        try:
            _h, t = read_shard_table(ix.dir, entry, fd)
            for e, f in zip(t.entries, t.fields()):
                out[(key_of[int(e["gidx"])], f)] = os.pread(fd, int(e["length"]), int(e["offset"]))
        finally:
            os.close(fd)
    return out


def store_frames(store, pid: str, keys: Iterable[str]) -> Dict[Tuple[str, str], bytes]:
    """``(key, field) -> frame bytes`` of the produced fields of ``keys`` as the store holds them now."""
    c = store.controller
    p = c.parts[pid]
    out = {}
    for k in keys:
        g = p.keys[k]
        u = store.units[g % store.num_units]
        for f in sorted(p.rows[g].fields):
            loc = u.locate([g], f)[0]
            with open(u.describe(loc), "rb") as fh:
                fh.seek(loc.offset)
                out[(k, f)] = fh.read(loc.length)
    return out


def dump_picture(dump_dir: Path) -> Dict[str, Any]:
    """The row index (repr of tags, so NaN compares) and a digest of every frame of a dump, as
    plain JSON values (the crash matrix carries it between processes as JSON)."""
    ri = read_row_index(dump_dir)
    rows = {k: [r["gidx"], repr(r["tag"]), list(r["fields"])] for k, r in ri["rows"].items()}
    frames = {f"{k}\0{f}": hashlib.sha256(b).hexdigest() for (k, f), b in sorted(dump_frames(dump_dir).items())}
    return {"partition": ri["partition_id"], "rows": rows, "order": list(ri["rows"]), "schemas": ri["schemas"],
            "frames": frames}
