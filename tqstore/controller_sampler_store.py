"""Reading and writing a partition's sampler state in the controller's LMDB index (the
``sampler`` database; docs/FORMAT.md, "Sampler state"; bytes by :mod:`tqstore._format.sampler_records`).

The state proper is one record; each cached rank result (what rank-aware sampling keeps
per ``(task, dp_rank, batch_index)``) is a record of its own, numbered per partition.  A
fetch writes the state record (small: a few numbers per task) and only the results it
added, handed out or dropped, so its cost does not grow with the results cached before it.
A version-2 index keeps the results inside the state record; they are read from there,
and moved to records of their own by the first write (:class:`SamplerWrite` from
:meth:`~tqstore.controller_sampling.SamplerHost.pending_write`).

Functions take an open LMDB transaction and the ``sampler`` database; they run inside the
caller's transaction (the one that marks rows consumed, deletes cleared rows or resets
consumption), so the state and the marks change together.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from ._format import controller_records as R
from ._format import sampler_records as S
from ._io.lmdbenv import prefixed

EntryName = S.EntryName


@dataclass
class SamplerWrite:
    """What a change of a partition's sampler state writes: the state record's value (no
    cached results), the results to write as ``(number, name, entry)``, and the numbers of
    results to delete."""

    state: Dict[str, Any]
    puts: List[Tuple[int, EntryName, List[Any]]] = field(default_factory=list)
    dels: List[int] = field(default_factory=list)


@dataclass
class SamplerRecords:
    """A partition's saved sampler state: joined (cached results under their tasks, as
    ``BaseSampler.state_dict`` gives it; None when nothing is saved), each result's record
    number, and whether the state record held results inline (a version-2 index)."""

    state: Optional[Dict[str, Any]]
    numbers: Dict[EntryName, int]
    inline: bool


def read(txn: Any, db: Any, pid: str) -> SamplerRecords:
    """The saved state of ``pid``. Raises RecordError for a malformed record."""
    raw = txn.get(S.state_key(pid), db=db)
    state = None if raw is None else R.decode_sampler(raw)
    inline: Dict[EntryName, List[Any]] = {}
    if state is not None:
        state, inline = S.split_state(state)
    numbers: Dict[EntryName, int] = {}
    entries = list(inline.items())
    for k, v in prefixed(txn, db, S.entry_prefix(pid)):
        name, entry = S.decode_entry(v)
        numbers[name] = S.decode_key(k)[1]
        entries.append((name, entry))
    return SamplerRecords(S.join_state(state, entries), numbers, bool(inline))


def write(txn: Any, db: Any, pid: str, w: SamplerWrite) -> None:
    """Apply ``w``: the state record, then the results deleted and written."""
    txn.put(S.state_key(pid), R.encode_sampler(w.state), db=db)
    for n in w.dels:
        txn.delete(S.entry_key(pid, n), db=db)
    for n, name, entry in w.puts:
        txn.put(S.entry_key(pid, n), S.encode_entry(name, entry), db=db)


def drop(txn: Any, db: Any, pid: str) -> None:
    """Delete every sampler record of ``pid`` (its partition is dropped)."""
    txn.delete(S.state_key(pid), db=db)
    for k in [k for k, _ in prefixed(txn, db, S.entry_prefix(pid))]:  # (listed first: no deletes under the cursor)
        txn.delete(k, db=db)


def replace(txn: Any, db: Any, pid: str, state: Dict[str, Any]) -> None:
    """Replace the saved state of ``pid`` by ``state`` (as ``state_dict`` gives it: results
    under their tasks), its results numbered from 0."""
    drop(txn, db, pid)
    rest, entries = S.split_state(state)
    write(txn, db, pid, SamplerWrite(rest, [(i, name, e) for i, (name, e) in enumerate(entries.items())]))


def check(key: Any, value: Any) -> None:
    """Decode one record of the ``sampler`` database (the index's open checks every one).
    Raises RecordError."""
    _, n = S.decode_key(key)
    if n is None:
        R.decode_sampler(value)
    else:
        S.decode_entry(value)


__all__ = ["SamplerWrite", "SamplerRecords", "read", "write", "drop", "replace", "check"]
