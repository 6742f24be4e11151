"""Shared helpers of the checkpoint tests: data of every field kind, a comparable picture of
a store's whole state, and ways to damage a checkpoint file without touching the store
(hard-linked files are rewritten into a new inode, never edited in place)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, List

import numpy as np
import torch


def fill(store, pid: str = "train", n: int = 12, *, start: int = 0, seed: int = 0, prefix: str = "k") -> List[str]:
    """Put ``n`` keyed rows holding every field kind into ``pid``; returns the keys."""
    g = torch.Generator().manual_seed(seed)
    keys = [f"{prefix}{start + i}" for i in range(n)]
    fields = {
        "input_ids": torch.randint(0, 50000, (n, 16), generator=g, dtype=torch.int64),
        "bf16": torch.randn(n, 4, generator=g).to(torch.bfloat16),
        "logprobs": [torch.randn(3 + (i % 5), generator=g) for i in range(n)],  # jagged
        "np": np.arange(n * 3, dtype=np.float64).reshape(n, 3) + seed,
        "text": [f"response {start + i} " + "é" * (i % 4) for i in range(n)],
        "info": [{"reward": (start + i) / 7, "ok": bool(i % 2), "tags": [i, None, "x"]} for i in range(n)],
    }
    tags = [{"score": float(start + i), "group": (start + i) // 4} for i in range(n)]
    store.kv_batch_put(keys, pid, fields, tags=tags)
    return keys


def canon(v: Any) -> Any:
    """A hashable, exact picture of a value read from a store (bit-exact for tensors)."""
    if isinstance(v, torch.Tensor):
        if v.is_nested:
            return ("nested", tuple(canon(t) for t in v.unbind()))
        t = v.detach().contiguous()
        return ("t", str(t.dtype), tuple(t.shape), t.reshape(-1).view(torch.uint8).numpy().tobytes())
    if isinstance(v, np.ndarray):
        return ("n", str(v.dtype), v.shape, np.ascontiguousarray(v).tobytes())
    if isinstance(v, (list, tuple)):
        return ("l", tuple(canon(x) for x in v))
    if isinstance(v, dict):
        return ("d", tuple(sorted((k, canon(x)) for k, x in v.items())))
    return ("v", repr(v))


def state(store) -> Dict[str, Any]:
    """Everything a checkpoint must carry: rows (key, tag, fields, payload bit for bit),
    partitions, schemas, consumption, sampler state, allocator."""
    c = store.controller
    rows = {}
    for g, r in sorted(c.rows.items()):
        payload = {f: canon(store.read(r.pid, [g], [f])[f]) for f in sorted(r.fields)}
        rows[(r.pid, r.key if r.key is not None else g)] = (g, canon(r.tag), r.seq, payload)
    return {
        "rows": rows,
        "partitions": sorted(c.parts),
        "schema": {p: dict(c.parts[p].schema) for p in c.parts},
        "consumed": {k: sorted(v) for k, v in c.consumed.items() if v},
        "sampler": {p: c.sampler_state(p) for p in c.parts},
        "next_gidx": c.next_gidx,
        "free": sorted(c.free),
        "kv_list": store.kv_list(),
    }


def rewrite(path: Path, data: bytes) -> None:
    """Replace ``path`` by a new file holding ``data`` (a new inode: links elsewhere keep the old bytes)."""
    tmp = Path(str(path) + ".rewrite")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def flip_byte(path: Path, offset: int) -> None:
    data = bytearray(Path(path).read_bytes())
    data[offset] ^= 0x40
    rewrite(path, bytes(data))


def truncate(path: Path, size: int) -> None:
    rewrite(path, Path(path).read_bytes()[:size])


def first_segment(ckpt: Path) -> Path:
    return sorted(Path(ckpt).glob("unit-*/seg-*.tqs"))[0]


def payload_offset_of_first_frame(seg: Path) -> int:
    """An offset inside the payload of the segment's first frame."""
    from tqstore._format.frame import parse_head
    from tqstore._format.layout import SEGMENT_HEADER_SIZE

    data = seg.read_bytes()
    h = parse_head(data, SEGMENT_HEADER_SIZE)
    return SEGMENT_HEADER_SIZE + h.payload_start + max(0, h.payload_len // 2)


def resign(ckpt: Path, *, keep: tuple = ()) -> None:
    """What an attacker (or a buggy tool) does after tampering with a checkpoint: recompute
    the size, CRC32C and block CRCs of every listed file (except the paths in ``keep``,
    whose entries stay as they are) and the manifest's own checksum."""
    import json

    from tqstore import _native
    from tqstore.checkpoint import manifest as M

    mp = Path(ckpt) / M.MANIFEST_NAME
    d = json.loads(mp.read_bytes())
    for e in d["files"]:
        if e["path"] in keep:
            continue
        data = (Path(ckpt) / e["path"]).read_bytes()
        e["size"], e["crc32c"] = len(data), _native.crc32c(data)
        if "block_crc32c" in e:
            b = M.INDEX_BLOCK_BYTES
            e["block_crc32c"] = [_native.crc32c(data[i:i + b]) for i in range(0, len(data), b)] or [0]
    resign_manifest(ckpt, d)


def resign_manifest(ckpt: Path, d: dict) -> None:
    """Write manifest object ``d`` into ``ckpt`` with a freshly computed ``manifest_crc32c``."""
    import json

    from tqstore import _native
    from tqstore.checkpoint import manifest as M

    d = {k: v for k, v in d.items() if k != "manifest_crc32c"}
    d["manifest_crc32c"] = _native.crc32c(M._canonical(d))
    rewrite(Path(ckpt) / M.MANIFEST_NAME, (json.dumps(d, sort_keys=True, indent=1) + "\n").encode())


def open_files_under(root: Path, *, mapped: bool = False) -> list:
    """Files under ``root`` this process holds open (``/proc/self/fd``), and with ``mapped`` the
    lines of ``/proc/self/maps`` naming a file under it."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(root)):
            out.append(target)
    if mapped:
        out = sorted(out) + [line for line in Path("/proc/self/maps").read_text().splitlines() if str(root) in line]
    return out
