"""The controller index's ``sampler`` database, format version 3 (docs/FORMAT.md, "Controller
index", "Sampler state"): a partition's sampler state as one record for the state proper and
one record per cached rank result, so a fetch that caches or hands out one result writes
one small record, whatever the number of results cached before it.

==========================================  ==================================================
key                                         value
==========================================  ==================================================
partition id (:func:`state_key`)            :func:`~tqstore._format.controller_records.encode_sampler`:
                                            JSON ``{"sampler": name, "state": {task: state}}``
                                            (version 3: a task's state has no ``"cache"``)
partition id ``\\0`` u64 big-endian          :func:`encode_entry`: compact ASCII JSON
number (:func:`entry_key`)                  ``{"task", "rank", "batch", "sampled", "consumed",
                                            "fetches"}``
==========================================  ==================================================

In memory (what a sampler holds, :meth:`~tqstore.samplers.BaseSampler.state_dict`) a cached
result lives at ``state[task]["cache"][rank][batch] = [sampled, consumed, fetches]``; a
version-2 index keeps it there in the partition's one record, which a reader still accepts
(:func:`split_state` and :func:`join_state` convert).  Bytes in, objects out: no I/O.
"""
from __future__ import annotations

import json
import struct
from typing import Any, Dict, Iterable, List, Optional, Tuple

from .records import RecordError, decode_json_object, decode_utf8, is_uint, member

#: a cached result's place in a partition's state: (task, rank, batch index), as str
EntryName = Tuple[str, str, str]

_NUM = struct.Struct(">Q")


def state_key(pid: str) -> bytes:
    """Key of a partition's state record: the partition id (UTF-8)."""
    return pid.encode()


def entry_key(pid: str, number: int) -> bytes:
    """Key of cached result ``number`` of partition ``pid``: pid ``\\0`` u64 big-endian."""
    return pid.encode() + b"\0" + _NUM.pack(number)


def entry_prefix(pid: str) -> bytes:
    """The prefix every entry key of ``pid`` starts with (no state key of another partition
    does: partition ids hold no NUL)."""
    return pid.encode() + b"\0"


def decode_key(raw: Any) -> Tuple[str, Optional[int]]:
    """``(partition id, None)`` for a state key, ``(partition id, number)`` for an entry key.

    Raises RecordError: not UTF-8, or a ``\\0`` not followed by exactly 8 bytes."""
    b = bytes(raw)
    cut = b.find(b"\0")
    if cut < 0:
        return decode_utf8(b, "partition id"), None
    if len(b) != cut + 1 + _NUM.size:
        raise RecordError(f"sampler entry key of {len(b)} bytes: not partition id, NUL, 8-byte number")
    return decode_utf8(b[:cut], "partition id"), _NUM.unpack_from(b, cut + 1)[0]


def encode_entry(name: EntryName, entry: List[Any]) -> bytes:
    """A cached result ``entry`` (``[sampled, consumed, fetches]``) of ``name``."""
    task, rank, batch = name
    sampled, consumed, fetches = entry
    return json.dumps({"task": task, "rank": rank, "batch": batch, "sampled": [int(g) for g in sampled],
                       "consumed": [int(g) for g in consumed], "fetches": int(fetches)},
                      separators=(",", ":")).encode()


def decode_entry(raw: Any) -> Tuple[EntryName, List[Any]]:
    """``((task, rank, batch), [sampled, consumed, fetches])``. Raises RecordError."""
    d = decode_json_object(raw, "sampler entry")
    name = tuple(member(d, k, "sampler entry") for k in ("task", "rank", "batch"))
    if not all(isinstance(x, str) for x in name):
        raise RecordError("sampler entry: task, rank and batch must be strings")
    lists = [member(d, k, "sampler entry") for k in ("sampled", "consumed")]
    if not all(isinstance(v, list) and all(is_uint(g) for g in v) for v in lists):
        raise RecordError("sampler entry: sampled and consumed must be lists of global indexes")
    fetches = member(d, "fetches", "sampler entry")
    if not is_uint(fetches):
        raise RecordError("sampler entry: fetches must be an integer >= 0")
    return name, [lists[0], lists[1], fetches]  # type: ignore[return-value]


def split_state(state: Dict[str, Any]) -> Tuple[Dict[str, Any], Dict[EntryName, List[Any]]]:
    """A state as :meth:`~tqstore.samplers.BaseSampler.state_dict` gives it → the state record's
    value (every task's ``"cache"`` left out) and the cached results by name."""
    tasks = state.get("state") or {}
    rest: Dict[str, Any] = {}
    entries: Dict[EntryName, List[Any]] = {}
    for task, st in tasks.items():
        if isinstance(st, dict) and isinstance(st.get("cache"), dict):
            for rank, per in st["cache"].items():
                for batch, entry in (per or {}).items():
                    entries[(task, rank, batch)] = entry
            st = {k: v for k, v in st.items() if k != "cache"}
        rest[task] = st
    return {**state, "state": rest}, entries


def join_state(state: Optional[Dict[str, Any]], entries: Iterable[Tuple[EntryName, List[Any]]]
               ) -> Optional[Dict[str, Any]]:
    """The inverse of :func:`split_state` (the cached results put back under their tasks);
    None when there is no state record and no entry."""
    entries = list(entries)
    if state is None:
        if not entries:
            return None
        state = {"sampler": None, "state": {}}
    tasks = state.setdefault("state", {})
    if not isinstance(tasks, dict):
        raise RecordError("sampler state: 'state' is not an object")
    for (task, rank, batch), entry in entries:
        st = tasks.setdefault(task, {})
        if not isinstance(st, dict):
            raise RecordError(f"sampler state of task {task!r} is not an object")
        st.setdefault("cache", {}).setdefault(rank, {})[batch] = entry
    return state


__all__ = ["EntryName", "state_key", "entry_key", "entry_prefix", "decode_key", "encode_entry", "decode_entry",
           "split_state", "join_state"]
