"""Entries held back for reads: an overwriting put that the store rolled back, whose put-back
on this unit failed (its index commit: a full disk, an I/O error).

Until the put-back gets through (the store settles undo records before its next put or clear
and at open), this unit's index still names the failed put's frames for the rows it
overwrote.  Reads of the latest state must give what the put replaced, never values the
store reported as not written.  So when :meth:`HeldBack.settle` fails to put entries back,
it keeps that put's undo records in memory (read in a read transaction, which needs no
space: each index key with the location it replaced), and reads of the latest state
(:meth:`~tqstore.unit_read.UnitReader.lookup`, ``locate``) answer those locations in place
of the index's; the unit's location cache is emptied then and bypassed while any entry is
held.  A later settle of that put that gets through drops them.  Snapshot reads (checkpoint
exports, dumps) need none of this: they put back by the controller's put token themselves.
"""
from __future__ import annotations

import logging
from typing import Dict, Optional, Sequence

import numpy as np

from ._format import unit_records as UR
from ._format.index import INDEX_KEY_HEAD, LOC_DTYPE

log = logging.getLogger("tqstore")


class HeldBack:
    """A mixin of :class:`~tqstore.unit.Unit` (needs ``env``, ``db_undo``, ``locs``, ``unit_id``
    and ``_settle``); ``held_back`` maps a put's token to ``{index key: replaced location}``."""

    held_back: Dict[int, Dict[bytes, bytes]]

    def settle(self, token: int, *, committed: bool) -> int:
        """Settle the overwriting put ``token``: committed, the frames it replaced become dead;
        not committed, the replaced entries are put back (its new frames become dead).
        Returns the undo records settled.  When putting back fails, reads of the latest state
        give the replaced entries all the same until a settle gets through (see the module
        docstring).  Raises StorageIOError (the settle did not get through)."""
        try:
            n = self._settle(token, committed=committed)
        except BaseException:
            if not committed:
                self._hold_back(token)
            raise
        if self.held_back.pop(token, None) is not None:
            self.locs.clear()
        return n

    def _hold_back(self, token: int) -> None:
        prefix = UR.undo_prefix(token)
        held: Dict[bytes, bytes] = {}
        try:
            with self.env.begin() as txn:
                cur = txn.cursor(self.db_undo)
                if cur.set_range(prefix):
                    for k, v in cur:
                        if not bytes(k).startswith(prefix):
                            break
                        held[UR.decode_undo_key(bytes(k))[1]] = bytes(v)
        except Exception:  # noqa: BLE001 - the settle's error is the one raised
            log.exception("unit %d: could not read the undo records of put %d back", self.unit_id, token)
            return
        self.held_back[token] = held
        self.locs.clear()
        log.warning("unit %d: reads give the %d entries put %d replaced until its rollback gets through",
                    self.unit_id, len(held), token)

    def held_loc(self, key: bytes) -> Optional[bytes]:
        """The location held back for index key ``key`` (None: read the index)."""
        for held in self.held_back.values():
            v = held.get(key)
            if v is not None:
                return v
        return None

    def patch_held(self, gidxs: Sequence[int], fields: Sequence[str], out: Dict[str, Optional[np.ndarray]]) -> None:
        """Put the held-back locations into a lookup's answer ``out`` (in place)."""
        heads = [INDEX_KEY_HEAD.pack(int(g)) for g in gidxs]
        for field in fields:
            f = field.encode()
            arr = out.get(field)
            for i, h in enumerate(heads):
                v = self.held_loc(h + f)
                if v is None:
                    continue
                if arr is None:  # (some row lacks the field: the caller asks locate, which holds back too)
                    break
                if not arr.flags.writeable:
                    arr = out[field] = arr.copy()
                arr[i] = np.frombuffer(v, LOC_DTYPE)[0]


__all__ = ["HeldBack"]
