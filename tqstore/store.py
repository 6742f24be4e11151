"""Store: a controller plus N storage units in one directory, opened in this process.

Guarantees:

* every acknowledged write is a committed controller transaction written after the unit
  transactions holding its payload (storage is a superset of what the controller calls
  produced); a reopened store — also after ``kill -9`` — returns exactly the acknowledged
  state; unit entries no controller row claims are dropped on open;
* row ``g`` lives on unit ``g % N``; per-unit work runs in a thread pool;
* one process opens a store at a time (an advisory lock on ``LOCK``);
* bad input raises before anything is written.
"""
from __future__ import annotations

import inspect
import logging
import os
import threading
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from . import layout_dirs as L
from ._io import files
from ._io.workpool import WorkPool
from .checkpoint import CheckpointMixin
from .checkpoint.target import check_store_location
from .dump import DumpMixin
from .store_undo import UndoSettling
from . import _interrupts as interrupts
from . import store_lock, store_open
from .errors import (ConfigError, CorruptionError, DistributedError, InvalidInputError, KeyNotFoundError,
                     StorageIOError, StoreClosedError, TqstoreError, UnsupportedTypeError)
from .edge import (batch_len as _batch_len, check_edge, check_result_type, default_edge,
                   normalise_fields as _normalise_fields)
from .capacity import RowCapacity
from ._format.names import check_bool_option, check_fraction, check_int_option
from ._format.store_files import MAX_UNITS  # (the most units a store may have)
from ._gilswitch import handing_off
from .kv import PUBLIC_CALLS, DataPlane, forwarder
from ._gcpause import pausing
from .embedded import DEFAULT_SEGMENT_BYTES, EmbeddedParts
from .ports import ControllerPort
from .read_guard import RemovalGuard
from .running_loads import waits_for_running_loads
from .state_switch import join_retired
from .store_verify import verify_parts
from .store_snapshot import StoreSnapshot, take_cut
from .reader import read_fields, read_shapes
from .streaming import _no_partition, check_produced, common_fields

log = logging.getLogger("tqstore")

DURABILITY = ("checkpoint", "commit")
MIN_MAP_BYTES, MAX_MAP_BYTES = 1 << 20, 1 << 46  # index_map_bytes' bounds (an index's LMDB map: address space)
PathLike = Union[str, "os.PathLike[str]"]


class Store(CheckpointMixin, DumpMixin, UndoSettling):
    """An open tqstore store. Use as a context manager; :meth:`close` is idempotent.

    The data-plane calls (``kv_*``, ``get_meta``, ``put``, ``get_data``, ...) are those of
    :class:`~tqstore.kv.DataPlane`, which the store composes over its controller and its own
    ``write`` / ``read`` / ``delete_rows`` / ``drop_partition``, and forwards to.

    ``num_units`` is the store's, fixed when it is created; every other argument applies to
    this open only (a reopen may change them: data written compressed reads back after a
    reopen without compression, a reopen with another durability applies it from then on).

    Args:
        path: store directory (created if missing; a relative one is taken in the working
            directory of the open, ``~`` expanded, and ``root`` is absolute; an empty path
            is refused). ``None``: a private temporary store, removed on close.
        num_units: storage units of a new store (default 1, at most 4096); for an existing
            one it must match or be None.
        durability: ``"checkpoint"`` (default; acknowledged writes survive a process kill,
            fsync happens at checkpoints) or ``"commit"`` (every acknowledged write is
            fsynced and survives power loss).
        segment_bytes: size at which a unit's active segment is sealed (64 KiB to 1 TiB).
        max_workers: threads of the store's pool (default: the unit count, at most 8).
        index_map_bytes: the LMDB map size of each index (1 MiB to 64 TiB; default 64 GiB).
        compress: None, ``"zstd"`` (every field) or a collection of field names to compress.
        verify_reads: check CRC32C on every read (default True).
        result_type: what reads return: ``"tensordict"`` (a TensorDict, as TransferQueue; the
            default with the torch adapter) or ``"dict"`` (a plain mapping).
        strict_schema: True: a field's dtype is fixed by its first put in a partition (another
            raises SchemaError).  False (default, as TransferQueue): it may change; a get over rows
            of several dtypes gives that field as a list of per-row tensors or arrays.
        total_storage_size: None (default, no limit) or TransferQueue's row capacity: each unit
            holds at most ``ceil(total_storage_size / num_units)`` rows with data; a put past it
            raises CapacityError before anything is written (:mod:`tqstore.capacity`).
        edge: the framework adapter (:class:`~tqstore.edge.Edge`); default
            ``tqstore.edge.default_edge(result_type)``, the torch adapter (imported by ``import
            tqstore``'s factory at the first such open).
        parts: how the controller and the units are opened: None (default), objects in this
            process (:class:`tqstore.embedded.EmbeddedParts`); ``tqstore.ray.RayParts()``, Ray
            actors (every call of theirs an actor task; the store's own files, its lock and
            its write lock stay with this process, so one process drives the store).  Parts
            whose ``remote`` attribute is true answer from other processes: a read then calls
            its units and reads its fields at once.

    Raises:
        ConfigError: a setting is invalid or contradicts the existing store, or ``path``
            lies inside a store directory, a checkpoint or a checkpoint generation root
            (symlinks resolved), whose replacement, load or prune would delete it.
        StorageIOError: the directory is locked by another process or cannot be opened.
    """

    def __init__(self, path: Optional[PathLike] = None, *, num_units: Optional[int] = None,
                 durability: str = "checkpoint", segment_bytes: int = DEFAULT_SEGMENT_BYTES, compress=None,
                 verify_reads: bool = True, max_workers: Optional[int] = None,
                 index_map_bytes: Optional[int] = None, result_type: Optional[str] = None,
                 strict_schema: bool = False, total_storage_size: Optional[int] = None, edge: Any = None,
                 parts: Any = None) -> None:
        if durability not in DURABILITY:
            raise ConfigError(f"durability must be one of {DURABILITY}, got {durability!r}")
        num_units = check_int_option("num_units", num_units, 1, MAX_UNITS)
        if compress not in (None, "zstd") and not (isinstance(compress, (list, tuple, set, frozenset)) and
                                                   all(isinstance(f, str) for f in compress)):
            raise ConfigError(f"compress must be None, 'zstd' or a collection of field names, got {compress!r:.80}")
        verify_reads = check_bool_option("verify_reads", verify_reads)
        strict_schema = check_bool_option("strict_schema", strict_schema)
        segment_bytes = check_int_option("segment_bytes", segment_bytes, 1 << 16, 1 << 40, optional=False)
        max_workers = check_int_option("max_workers", max_workers, 1)
        index_map_bytes = check_int_option("index_map_bytes", index_map_bytes, MIN_MAP_BYTES, MAX_MAP_BYTES)
        capacity = None if total_storage_size is None else RowCapacity(total_storage_size)  # ConfigError
        check_result_type(result_type)  # (the edge itself is made once the parts are open: it may import torch)
        if edge is not None:
            check_edge(edge)
        self._parts = EmbeddedParts() if parts is None else parts
        self._remote_parts = bool(getattr(self._parts, "remote", False))  # (reads call their units at once)
        self._closed = True
        if path is not None and not isinstance(path, (str, os.PathLike)):
            raise ConfigError(f"path must be a str or os.PathLike (or None: a temporary store), got {path!r:.80}")
        if path is not None and os.fspath(path) in ("", b""):
            raise ConfigError("path is empty: give the store's directory ('.' for the current one), or None for a "
                              "temporary store")
        self._temporary = path is None
        try:  # (absolute: a later chdir, or a part in another process, must find the same files)
            self.root = files.make_temp_dir("tqstore-") if path is None else Path(path).expanduser().absolute()
        except OSError as e:
            what = "create a temporary store directory" if path is None else f"place store {str(path)!r}"
            raise StorageIOError(f"cannot {what}: {e}") from e
        if path is not None:
            check_store_location(self.root)  # never inside a store, checkpoint or generation root
        self.durability = durability
        self.verify_reads = verify_reads
        self.strict_schema = bool(strict_schema)
        self._opts = dict(durability=durability, segment_bytes=int(segment_bytes),
                          compress=set(compress) if isinstance(compress, (list, tuple, set, frozenset)) else compress,
                          map_bytes=index_map_bytes)
        try:
            L.refuse_foreign(self.root)  # a user's directory is refused before LOCK is written into it
            files.mkdir(self.root, exist_ok=True, parents=True)
        except OSError as e:
            raise StorageIOError(f"cannot create store directory {self.root}: {e}") from e
        self._pid = os.getpid()  # (a forked child may not use the store: _check_open)
        self._lock_fd = self._take_lock()
        self._created = False  # (True once this open has written STORE.json: a new store)
        try:
            try:
                self._open_state(num_units)
            except TqstoreError:
                raise
            except OSError as e:
                raise StorageIOError(f"cannot open store {self.root}: {e}") from e
            self.edge = default_edge(result_type) if edge is None else edge
        except BaseException:
            try:
                self._parts.close()
            finally:
                try:
                    if self._created:  # (a new store that never opened: a retry starts afresh)
                        self._undo_creation()
                finally:
                    self._release_lock()
            raise
        self._capacity = capacity and capacity.for_units(self.num_units)
        self._pool = WorkPool(max_workers=max_workers or min(self.num_units, 8), thread_name_prefix="tqstore-unit",
                              closed_error=lambda: StoreClosedError(f"store {self.root} was closed during the call"))
        # _write_lock serialises puts, clears, state replacement and close (held for a whole
        # put, unit writes included); _meta_lock is held only for metadata steps (the data
        # plane holds it around fetches and status queries, so they don't wait for unit writes,
        # and state replacement holds it to swap the controller; the controller is thread-safe
        # by itself).  Always take _write_lock before _meta_lock.
        self._write_lock = threading.RLock()
        self._meta_lock = threading.RLock()
        self._retiring: List[threading.Thread] = []  # removals of replaced states (state_switch.retire_state)
        self.removals = RemovalGuard()  # reads racing clears retry (tqstore.read_guard)
        self._data = DataPlane(self.controller, self, write_lock=self._write_lock, lock=self._meta_lock,
                               check_open=self._check_open, edge=self.edge)
        self._closed = False
        try:
            self._reconcile()
        except BaseException:
            self.close()  # releases the lock: the store can be opened again once repaired
            raise
        if self._temporary:
            store_open.remove_at_exit(self)
        log.info("opened store %s (%d units, durability=%s)", self.root, self.num_units, durability)

    # ------------------------------------------------------------------ open / close
    def _take_lock(self) -> int:
        fd, self._real_root = store_lock.take(self.root)
        return fd

    def _release_lock(self) -> None:
        store_lock.release(self._real_root, self._lock_fd)

    def _undo_creation(self) -> None:
        try:
            L.undo_creation(self.root)
            log.info("store creation in %s failed; what it made was removed", self.root)
        except OSError as e:
            log.warning("store creation in %s failed, and removing what it made failed too (%s); the next open "
                        "removes what is left (or, if the undo had not begun, opens the new store as it is)",
                        self.root, e)

    def _open_state(self, num_units: Optional[int]) -> None:
        d = L.read_store_file(self.root)
        new = d is None
        if d is None:
            leftovers = L.refuse_foreign(self.root)  # (again, under the lock: ConfigError)
            if leftovers:  # a creation interrupted before STORE.json, its commit point, or one undone: nothing was acknowledged
                log.info("removing the debris of an interrupted store creation in %s: %s", self.root, leftovers)
                L.remove_debris(self.root, leftovers)
            n = num_units or 1
            files.mkdir(self.root / L.state_name(1))
            L.write_current(self.root, L.state_name(1))
            d = L.create_store_file(self.root, n)
            self._created = True
            files.fsync_dir(self.root.parent)  # the store directory's own entry
        self.num_units = L.check_units(self.root, d, num_units)
        current = L.read_current(self.root)
        if current is None:
            raise StorageIOError(f"store {self.root} has no {L.CURRENT_FILE} pointer")
        self.state_dir = self.root / current
        if not self.state_dir.is_dir():  # (checked before any other state is removed: it may be the data)
            raise CorruptionError(f"{L.CURRENT_FILE} names the state directory {current}, which does not exist; "
                                  f"nothing was removed", path=str(self.root / L.CURRENT_FILE))
        # remove states left behind by an interrupted load (never the current one)
        for name in files.listdir(self.root):
            if L.parse_state_name(name) is not None and name != current:
                log.info("removing abandoned state directory %s", name)
                files.rmtree(self.root / name)
        self._open_parts(self.state_dir)
        if not new and self.controller.created and any(u.keys() for u in self.units):
            self.controller.close_created()  # (nothing else was changed: reconcile has not run)
            for u in self.units:
                u.close()
            raise CorruptionError(
                f"store {self.root}: its controller index {L.CURRENT_FILE} -> {current}/controller/data.mdb is "
                f"missing while its units hold data; nothing was removed: load the store's last checkpoint into a new "
                f"store", path=str(L.controller_dir(self.state_dir) / "data.mdb"))
        if self.durability == "commit":
            # directories LMDB and the units created must be durable before a commit is acknowledged
            for p in [self.state_dir, L.controller_dir(self.state_dir)] + [
                    q for i in range(self.num_units) for q in (L.unit_dir(self.state_dir, i),
                                                               L.unit_dir(self.state_dir, i) / "index")]:
                files.fsync_dir(p)

    def _open_parts(self, state: Path, controller: Optional[ControllerPort] = None) -> None:
        """Open the parts of ``state`` (``controller``: already opened by :meth:`_open_controller`)."""
        self.controller, self.units = self._parts.open_parts(
            L.controller_dir(state), [L.unit_dir(state, i) for i in range(self.num_units)], durability=self.durability,
            segment_bytes=self._opts["segment_bytes"], compress=self._opts["compress"], map_bytes=self._opts["map_bytes"],
            controller=controller)

    def _open_controller(self, state: Path) -> ControllerPort:
        """The controller of ``state`` opened alone (a load's, while its units are staged)."""
        return self._parts.open_controller(L.controller_dir(state), num_units=self.num_units,
                                           durability=self.durability, map_bytes=self._opts["map_bytes"])

    def _reconcile(self) -> bool:
        """Settle what a crash left and reconcile the units with the controller, unless the
        store was closed cleanly (:func:`tqstore.store_open.reconcile`); True when it ran.
        Until one has completed, a close records no clean-close marker."""
        self._reconciled = False
        ran = store_open.reconcile(self)
        self._reconciled = True
        return ran

    def __reduce__(self):
        """A store is this process's open files: it cannot be pickled (to a spawned DataLoader
        worker, a multiprocessing pool, a Ray task); UnsupportedTypeError says what to do."""
        raise UnsupportedTypeError(
            f"a tqstore Store ({self.root}) cannot be pickled into another process: it is this process's open "
            f"index files. Open the store in that process (after this one closed it), use tqstore's Ray backend "
            f"(tq.init({{'backend': 'ray'}})) to share one store between processes, or pass the data instead; a "
            f"torch DataLoader over tqstore needs num_workers=0")

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"store {self.root} is closed")
        if os.getpid() != self._pid:
            raise store_lock.fork_error(self.root, self._pid)

    def close(self) -> None:
        """Close the store (idempotent). A temporary store is deleted.  Every part is closed
        and the store's lock released even when a step fails (the clean-close marker, a part
        that is gone); that step's error is raised after, and the next open reconciles.

        Saves, dumps (blocking or not) and loads by key that other threads are running end
        first (they use the parts); such a call made while close waits raises
        StoreClosedError once the store is closed, having written nothing.  A read racing
        the close returns its rows or raises StoreClosedError."""
        if getattr(self, "_closed", True):
            return
        if os.getpid() != self._pid:  # a forked child's copy: the store is the parent's, left as it is
            self._closed = True
            log.debug("close of store %s in a forked child: the parent's store is left as it is", self.root)
            return
        with self._long_calls_ended():  # saves, dumps and loads by key of other threads use the parts: they end first
            self._close_now()

    def _close_now(self) -> None:
        with self._write_lock, self._meta_lock:
            if self._closed:  # (another thread's close ran while this one waited)
                return
            self._closed = True
            self._pool.shutdown(wait=True)
            try:
                if not self._temporary and getattr(self, "_reconciled", False):
                    store_open.mark_clean(self)  # the next open may skip its reconciliation
            finally:  # a failed marker (a full disk, a part gone) still closes the parts and frees the store
                try:
                    self._close_parts()
                finally:
                    try:
                        join_retired(self)  # (another process's open would remove the same directories)
                    finally:
                        try:
                            self._parts.close()  # (a backend's actors end here)
                        finally:
                            self._release_lock()
        if self._temporary:
            files.rmtree(self.root, ignore_errors=True)
        log.info("closed store %s", self.root)

    def _close_parts(self) -> None:
        """Close every unit and the controller, all of them even when one fails (the first
        error is raised after)."""
        first: Optional[BaseException] = None
        for part in [*self.units, self.controller]:
            try:
                part.close()
            except Exception as e:  # noqa: BLE001 - raised below, once every part was closed
                first = first or e
        if first is not None:
            raise first

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            if not self._closed and self._temporary:
                self.close()
        except Exception:
            pass

    # ------------------------------------------------------------------ writing
    @pausing  # a bulk call must not pay full collections of the whole heap
    def write(self, partition_id: str, fields: Any, *, keys: Optional[Sequence[str]] = None,
              gidxs: Optional[Sequence[int]] = None, tags: Optional[Sequence[Any]] = None,
              new_rows: bool = False, create_keys: bool = True) -> List[int]:
        """Write a batch of fields to rows and return their global indexes.

        Rows are addressed by ``keys`` (created when missing), ``gidxs`` (existing rows), or
        ``new_rows=True`` (fresh unkeyed rows, as many as the batch has).  Validation happens
        first; then units write in parallel; then one controller transaction acknowledges.

        Raises:
            InvalidInputError, SchemaError, UnsupportedTypeError, KeyNotFoundError: nothing written.
            StorageIOError: the write failed; no row became visible.
        """
        self._check_open()
        items = _normalise_fields(self.edge, fields)
        if keys is not None:
            keys = list(keys)
            n = len(keys)
        elif gidxs is not None:
            gidxs = [int(g) for g in gidxs]
            n = len(gidxs)
        elif new_rows:
            n = _batch_len(self.edge, items, tags)
        else:
            raise InvalidInputError("write needs keys, gidxs or new_rows=True")
        cols = [self.edge.to_column(f, v, n) for f, v in items]
        with self._write_lock, interrupts.deferred():  # (a Ctrl-C waits for the put to be whole)
            self._check_open()
            with self._meta_lock:
                plan = self.controller.plan_put(partition_id, cols, keys=keys, gidxs=gidxs,
                                                n_new=n if new_rows else 0, tags=tags, create_keys=create_keys,
                                                strict_dtypes=self.strict_schema)
            grow = self._capacity.check(self.controller, partition_id, plan) if self._capacity and cols and n else {}
            token = None
            if plan.overwrites and cols and n:
                # replaced entries stay undoable until the controller commits (the put is atomic)
                self._settle_undo()
                token = self.controller.put_token + 1
            self._settle_first()
            if cols and n:
                self._write_units(plan, cols, token)
            try:
                with self._meta_lock:
                    self.controller.commit_put(plan, token=token)
            except DistributedError:  # no answer (its host died): committed or not, unknown; the
                raise  # replaced entries stay undoable, settled by the controller's put token later
            except BaseException:
                if token is not None:
                    self._settle_units(token, committed=False)
                raise
            if token is not None:
                self._settle_units(token, committed=True)
            if grow:
                self._capacity.commit(grow)
            return list(plan.gidxs)

    def check_writes(self, writes: Sequence[Tuple[str, Any, Sequence[int], Optional[List[Any]]]]) -> None:
        """Check writes to existing rows, ``(partition, fields, gidxs, tags)`` each, as one put:
        each as :meth:`write` checks it (schema by ``strict_schema``, tags), and the rows they
        add summed against ``total_storage_size``.  The caller holds the write lock and then
        writes them.  Nothing is written.  Raises what :meth:`write` raises before writing."""
        grows = []
        for pid, fields, gidxs, tags in writes:
            cols = [self.edge.to_column(f, v, len(gidxs)) for f, v in _normalise_fields(self.edge, fields)]
            with self._meta_lock:
                plan = self.controller.plan_put(pid, cols, gidxs=list(gidxs), tags=tags,
                                                strict_dtypes=self.strict_schema)
            if self._capacity and cols and len(gidxs):
                grows.append(self._capacity.check(self.controller, pid, plan))
        if len(grows) > 1:
            self._capacity.check_sum(self.controller, grows)

    def delete_rows(self, partition_id: str, gidxs: Sequence[int]) -> List[int]:
        """Remove rows (idempotent). Controller first, then the units' entries."""
        self._check_open()
        with self._write_lock, interrupts.deferred():
            self._settle_first()
            with self.removals.removing():
                with self._meta_lock:
                    held = self._capacity.holding(self.controller, partition_id, gidxs) if self._capacity else []
                    gone = self.controller.clear_rows(partition_id, gidxs)
                if held:
                    self._capacity.cleared(held, gone)
                self._delete_units(gone)
            return gone

    def drop_partition(self, partition_id: str) -> List[int]:
        """Remove a partition with all its rows (idempotent)."""
        self._check_open()
        with self._write_lock, interrupts.deferred():
            self._settle_first()
            with self.removals.removing():
                with self._meta_lock:
                    gone = self.controller.drop_partition(partition_id)
                if gone and self._capacity:
                    self._capacity.forget()
                self._delete_units(gone)
            return gone

    def _delete_units(self, gidxs: Sequence[int]) -> None:
        per_unit: Dict[int, List[int]] = defaultdict(list)
        for g in gidxs:
            per_unit[g % self.num_units].append(g)
        list(self._pool.map(lambda u: self.units[u].delete(per_unit[u]), per_unit))

    # ------------------------------------------------------------------ reading
    @pausing  # a bulk call must not pay full collections of the whole heap
    def read(self, partition_id: str, gidxs: Sequence[int], select_fields: Optional[Sequence[str]] = None, *,
             verify: Optional[bool] = None) -> Dict[str, Any]:
        """Read fields of rows into a mapping field → batched value.

        ``select_fields=None`` reads the fields every requested row has produced.  Values
        come back as a tensor (rows share a shape), a jagged nested tensor (they do not),
        a numpy array for numpy fields, or a list for non-tensor fields.

        Raises:
            PartitionNotFoundError, KeyNotFoundError: unknown partition or row.
            FieldNotFoundError: a selected field is not produced for some row.
            CorruptionError: a payload does not verify (names file and offset).
        """
        self._check_open()
        gidxs = [int(g) for g in gidxs]

        def attempt() -> Dict[str, Any]:
            rows = self.controller.row_batch(partition_id, gidxs)  # one controller answer for the rows
            if rows is None:
                raise _no_partition(partition_id, self.controller.partitions())
            if None in rows.seqs:
                g = gidxs[rows.seqs.index(None)]
                raise KeyNotFoundError(f"global index {g} is not a row of partition {partition_id!r}")
            fields = sorted(common_fields(rows.fields)) if select_fields is None else list(select_fields)
            check_produced(rows, range(len(rows)), fields)
            return self.read_rows(gidxs, [(f, rows.schema[f][0]) for f in fields], verify=verify)

        return self.removals.stable(attempt, self._write_lock)  # a clear racing the read: tried again

    def read_rows(self, gidxs: Sequence[int], fields: Sequence[Tuple[str, int]], *,
                  verify: Optional[bool] = None) -> Dict[str, Any]:
        """Read ``(field, kind)`` of rows ``gidxs`` whose fields the caller checked with the
        controller (the data plane, from its one controller answer): no second row lookup.

        Raises:
            FieldNotFoundError: a unit holds no payload of a field for some row.
            CorruptionError: a payload does not verify (names file and offset).
        """
        self._check_open()
        verify = self.verify_reads if verify is None else verify
        return read_fields(self.units, self._pool, gidxs, fields, verify=verify, alloc=self.edge.alloc,
                           remote=self._remote_parts)

    def row_shapes(self, partition_id: str, gidxs: Sequence[int], fields: Sequence[str]
                   ) -> Dict[str, List[Optional[Tuple[int, ...]]]]:
        """Each field's stored row shape for rows ``gidxs`` (None where not produced), from the
        frames' heads: what a BatchMeta's schema reports as ``shape`` / ``is_nested``.  Read as
        the payload is (tqstore.read_guard): tried again when a removal or a load's commit overlaps."""
        self._check_open()
        rows = [int(g) for g in gidxs]
        return self.removals.stable(lambda: read_shapes(self.units, rows, fields), self._write_lock)

    # ------------------------------------------------------------------ snapshots
    def snapshot(self) -> StoreSnapshot:
        """Take an MVCC cut (:func:`tqstore.store_snapshot.take_cut`) under the write and
        metadata locks, held only for the cut."""
        self._check_open()
        with self._write_lock, self._meta_lock:
            self._check_open()
            return take_cut(list(self.units), self.controller, self.state_dir)

    def install_state(self, build: Callable[..., Any], *, reconcile: bool = True,
                      before_switch: Optional[Callable[[], Any]] = None, early_open: bool = False) -> Any:
        """Replace the whole live state transactionally.

        ``build(new_state_dir)`` fills a fresh state directory beside the live one (controller
        and unit directories, see layout_dirs) and returns any value.  Then every file is
        fsynced, the new parts are opened (validated), and the ``CURRENT`` pointer is switched
        with one atomic rename.  On any failure before the switch the new directory is removed
        and the live store is exactly as before; a crash is settled on the next open.
        Runs under the write and metadata locks: puts, clears and fetches wait.  ``reconcile=False`` skips the
        reconcile pass after the switch, for a caller whose state is consistent by
        construction (a checkpoint of one MVCC cut); the next open reconciles anyway.
        ``before_switch()``, if given, runs after the new parts opened and right before the
        switch (e.g. to finish a verification started by ``build``); if it raises, the new
        state is discarded like any other failure.  ``early_open=True``: ``build(new_state_dir,
        early)`` may call ``early.open_controller()`` (see :class:`tqstore.state_switch.EarlyParts`).
        """
        from .state_switch import install_state

        return install_state(self, build, reconcile=reconcile, before_switch=before_switch, early_open=early_open)

    def compact(self, *, live_ratio: float = 0.5) -> int:
        """Compact mostly-dead segments of every unit and merge its small ones (less live data than
        1/16 of ``segment_bytes``; :meth:`tqstore.unit.Unit.compact`); returns segments compacted.
        InvalidInputError: ``live_ratio`` is not a number in (0, 1]."""
        self._check_open()
        live_ratio = check_fraction("live_ratio", live_ratio)
        with self._write_lock:
            return sum(self._pool.map(lambda u: u.compact(live_ratio=live_ratio), self.units))

    def verify(self) -> List[str]:
        """Check every stored frame and the controller's index; returns one line per problem
        (empty when clean), a frame that does not check named by its row's partition, key and
        field (:mod:`tqstore.store_verify`)."""
        self._check_open()
        return verify_parts(self.controller, self.units, self._pool)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def sampler(self):
        """The sampler ``get_meta(mode="fetch")`` uses (default :class:`SequentialSampler`)."""
        return self._data.sampler


for _name in PUBLIC_CALLS:  # the data plane's calls, forwarded (signatures and docstrings kept), each with the
    # GIL handed back quickly while it runs (tqstore._gilswitch), waiting for a load this process runs when
    # they meet its restore (tqstore.running_loads)
    setattr(Store, _name, handing_off(waits_for_running_loads(forwarder(DataPlane, "_data", _name))))


def open(path: Optional[PathLike] = None, **kwargs) -> Store:  # noqa: A001 - mirrors builtins.open
    """Open or create a store; see :class:`Store` for arguments. Use ``with tqstore.open(p) as s:``.

    Raises ConfigError for an argument :class:`Store` does not take (naming the ones it takes)."""
    unknown = sorted(set(kwargs) - _STORE_ARGS)
    if unknown:
        raise ConfigError(f"tqstore.open got unknown argument(s) {unknown}; it takes {sorted(_STORE_ARGS)}")
    return Store(path, **kwargs)


_STORE_ARGS = frozenset(inspect.signature(Store.__init__).parameters) - {"self", "path"}
