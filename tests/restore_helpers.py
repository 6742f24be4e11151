"""Test helpers of the load tests (selective restores): write a dump directory of the v1 format
(docs/FORMAT.md, "Dump directory") from a live store, and damage one.

``write_dump`` uses ``tq.dump_data_by_key`` when the store has it (branch dump-write) and
else builds the files here with the format's encoders (frames copied byte for byte from
the units' segments), so the load tests do not depend on the dump half's progress.
"""
from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path
from typing import Dict, Iterator, List, Sequence, Tuple

from tqstore import _native
from tqstore._format import dump_records as D
from tqstore._format.segment import segment_name


def write_dump(store, path, keys: Sequence[str], pid: str) -> Path:
    path = Path(path)
    if hasattr(store, "dump_data_by_key"):
        store.dump_data_by_key(path, list(keys), pid)
        return path
    rb = store.controller.rows_by_key(pid, list(dict.fromkeys(keys)))
    assert rb is not None and not rb.missing()
    n = store.num_units
    path.mkdir(parents=True)
    rows = [(k, g, t, sorted(f)) for k, g, t, f in zip(rb.keys, rb.gidxs, rb.tags, rb.fields)]
    shards = []
    for u in range(n):
        mine = [(g, sorted(f)) for _, g, _, f in rows if g % n == u and f]
        if not mine:
            continue
        names: List[str] = sorted({f for _, fs in mine for f in fs})
        frames, gidxs, lens, crcs, fids = [], [], [], [], []
        for g, fs in mine:
            for f in fs:
                loc = store.units[u].locate([g], f)[0]
                with open(store.units[u].path / segment_name(loc.seg), "rb") as fh:
                    fh.seek(loc.offset)
                    frames.append(fh.read(loc.length))
                gidxs.append(g)
                lens.append(loc.length)
                crcs.append(loc.crc)
                fids.append(names.index(f))
        table = D.encode_shard_table(gidxs, lens, crcs, fids, names)
        head = D.encode_shard_header(u, n, len(frames), sum(lens), table)
        data = head + b"".join(frames) + table
        (path / D.shard_name(u)).write_bytes(data)
        shards.append({"unit": u, "size": len(data), "crc32c": _native.crc32c(data), "frames": len(frames),
                       "rows": len(mine), "payload_bytes": sum(lens)})
    ri = D.encode_row_index(pid, n, rb.schema, rows)
    (path / D.ROW_INDEX_NAME).write_bytes(ri)
    summary = {"keys": len(rows), "rows_with_data": sum(1 for r in rows if r[3]),
               "frames": sum(s["frames"] for s in shards), "payload_bytes": sum(s["payload_bytes"] for s in shards)}
    man = D.encode_manifest(created_unix=0.0, partition_id=pid, num_units=n, summary=summary,
                            row_index={"size": len(ri), "crc32c": _native.crc32c(ri)}, shards=shards)
    (path / D.MANIFEST_NAME).write_bytes(man)
    return path


def shard_paths(dump: Path) -> Dict[int, Path]:
    return {int(p.name[6:-4]): p for p in sorted(Path(dump).glob("shard-*.tqd"))}


def flip_byte(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x40]))


def first_frame_payload_offset(shard: Path) -> int:
    """An offset inside the first frame's payload of a shard (header 64 + the frame's head)."""
    return D.SHARD_HEADER_SIZE + 128 + 1


def truncate(path: Path, by: int) -> None:
    os.truncate(path, os.path.getsize(path) - by)


@contextlib.contextmanager
def load_held_in_import(store, dump) -> Iterator[Tuple[threading.Event, threading.Thread]]:
    """Run ``store.load_data_by_key(dump)`` in a thread whose unit 0 import waits for
    ``release.set()``; yields ``(release, loader)`` once the load waits there (its restore
    begun, nothing imported).  On exit the load is released and joined, the unit restored."""
    release, importing = threading.Event(), threading.Event()
    unit = store.units[0]
    real = unit.import_restore

    def held_import(*a, **kw):
        importing.set()
        assert release.wait(30)
        return real(*a, **kw)

    unit.import_restore = held_import
    loader = threading.Thread(target=store.load_data_by_key, args=(dump,))
    loader.start()
    try:
        assert importing.wait(30)
        yield release, loader
    finally:
        release.set()
        loader.join(30)
        del unit.import_restore
