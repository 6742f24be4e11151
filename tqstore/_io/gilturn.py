"""One unit at a time for the bulk index calls of the units of this process.

py-lmdb lets the GIL go around every item of a ``getmulti`` or ``putmulti`` (and of the
cursor calls it makes for them) and takes it back after.  When the units of one process
make such calls side by side, in threads of one interpreter, each take-back waits for
another thread to let the GIL go: the threads convoy, and together they take longer than
the same calls made one after another.  So a unit holds :data:`bulk_index` around its calls
of thousands of items: a dump's location lookups (:mod:`tqstore.unit_dump`) and a selective
restore's publish and unpublish (:mod:`tqstore.unit_restore`; a cancelled restore's settle
unpublishes).  The work around them that needs no GIL (frame checks, copies, commits and
their fsyncs) still overlaps.

Measured on a 2 GiB store of 4 units in one process, 10 % of its keys (11,161 rows, 33,483
frames), alternating runs: the four publishes of a load took 45 to 55 ms side by side and
22 to 35 ms in turn; the first dump after an open (the units' location cache empty) took
0.27 to 0.36 s in its shards phase in turn and 0.30 to 1.28 s side by side.

Units in other processes (Ray actors) do not share the lock, nor a GIL; units that share
a process with others share both.  Lock order: a unit's own lock, then this one; nothing
is waited for while it is held but the unit's own index calls.
"""
from __future__ import annotations

import threading

#: held by a unit around one bulk index call of the units of this process (see the module docstring)
bulk_index = threading.Lock()

__all__ = ["bulk_index"]
