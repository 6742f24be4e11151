"""The data plane of a Store (TransferQueue-shaped): :class:`DataPlane`, composed by
:class:`~tqstore.store.Store`, which forwards its public calls to it.

Two ways to address rows, over the same partitions:

* by user key — ``kv_put``, ``kv_batch_put``, ``kv_batch_get``, ``kv_batch_get_by_meta``,
  ``kv_list``, ``kv_clear`` (here; rows are :class:`~tqstore.meta.KVBatchMeta`);
* by global index, streaming — ``put``, ``get_meta``, ``get_data``, ``clear_samples``,
  ``clear_partition``, status queries (:mod:`tqstore.streaming`; rows are
  :class:`~tqstore.meta.BatchMeta`).

The data plane works through two collaborators only: the controller, a
:class:`~tqstore.ports.ControllerPort` answering values (never its in-memory mirror), and
the store's payload side (:class:`PayloadIO`: ``Store.write`` / ``read`` / ``delete_rows``
/ ``drop_partition``, which reach the units).  The sampler lives with the controller: a
fetch is one controller call that chooses rows and marks them consumed in one transaction.

Every call validates its whole input before anything is written (sizes, duplicate keys,
dtype clashes, unsupported types, stale metadata) and raises a
:class:`~tqstore.errors.TqstoreError` subclass.  Clears are idempotent.

Locking: ``write_lock`` (the store's) serialises puts and clears (held for a whole put,
unit writes included).  ``lock`` (the store's metadata lock) is held around controller
calls that the store's state replacement must not interleave with (fetches, status
queries, listings) and is the lock of the condition consumers wait on for new rows; the
controller is thread-safe by itself.  Order: ``write_lock`` before ``lock``.
"""
from __future__ import annotations

import functools
import inspect
import logging
import threading
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from ._format.names import as_int, check_flag
from ._gcpause import pausing
from .call_checks import check_pid as _check_pid
from .edge import NumpyEdge
from .errors import (FieldNotFoundError, InvalidInputError, KeyNotFoundError, PartitionKeysNotFoundError,
                     UnsupportedTypeError)
from .meta import BatchMeta, KVBatchMeta
from .ports import ControllerPort, RowBatch, check_no_restore
from .samplers import BaseSampler, make_sampler
from .streaming import (
    STREAMING_CALLS, Streaming, _field_list, _no_partition, check_produced, common_fields,
)

try:  # Python 3.8+: typing.Protocol
    from typing import Protocol
except ImportError:  # pragma: no cover
    from typing_extensions import Protocol  # type: ignore

log = logging.getLogger("tqstore")



def _no_fields(fields: Any) -> bool:
    """``fields`` is None or a mapping (a dict, a TensorDict) of no field."""
    if fields is None:
        return True
    names = getattr(fields, "keys", None)
    try:
        return callable(names) and not list(names())
    except Exception:  # noqa: BLE001 - not a mapping we can list: the write checks it
        return False

class PayloadIO(Protocol):
    """The store's payload side the data plane writes and reads rows through (``Store``).

    ``removals`` is its :class:`~tqstore.read_guard.RemovalGuard`: every read of the data
    plane (controller answer, then unit read) runs through it, so a clear racing a read never
    yields a removed or reused row's payload.
    """

    removals: Any

    def write(self, partition_id: str, fields: Any, *, keys: Optional[Sequence[str]] = None,
              gidxs: Optional[Sequence[int]] = None, tags: Optional[Sequence[Any]] = None,
              new_rows: bool = False, create_keys: bool = True) -> List[int]: ...

    def read(self, partition_id: str, gidxs: Sequence[int], select_fields: Optional[Sequence[str]] = None, *,
             verify: Optional[bool] = None) -> Dict[str, Any]: ...

    def read_rows(self, gidxs: Sequence[int], fields: Sequence[Tuple[str, int]], *,
                  verify: Optional[bool] = None) -> Dict[str, Any]: ...

    def row_shapes(self, partition_id: str, gidxs: Sequence[int], fields: Sequence[str]
                   ) -> Dict[str, List[Any]]: ...

    def check_writes(self, writes: Sequence[Tuple[str, Any, Sequence[int], Optional[List[Any]]]]) -> None: ...

    def delete_rows(self, partition_id: str, gidxs: Sequence[int]) -> List[int]: ...

    def drop_partition(self, partition_id: str) -> List[int]: ...


def _key_list(keys: Union[str, Sequence[str]]) -> List[str]:
    if isinstance(keys, str):
        return [keys]
    if keys is None or not isinstance(keys, (list, tuple)):
        raise InvalidInputError(f"keys must be a str or a list of str, got {type(keys).__name__}")
    keys = list(keys)
    if not keys:
        raise InvalidInputError("keys is an empty list")
    if set(map(type, keys)) == {str}:  # C speed for the usual batch of str keys
        return keys
    bad = [k for k in keys if not isinstance(k, str)]
    if bad:
        raise InvalidInputError(f"keys must be str, got {type(bad[0]).__name__} {bad[0]!r}")
    return keys


def _merge_tag(old: Any, new: Any) -> Any:
    """TransferQueue semantics: a new dict tag updates the old one; None leaves it alone."""
    if new is None:
        return old
    if isinstance(old, dict) and isinstance(new, dict):
        return {**old, **new}
    return new


def _single_row(edge: Any, fields: Any) -> Any:
    """``kv_put``'s fields (one row, no batch dimension) → a batch of one row (the edge adds the
    batch dimension to framework values)."""
    if edge.is_batch(fields):
        if tuple(fields.batch_size)[:1] != (1,):
            raise InvalidInputError(f"kv_put takes a TensorDict of batch size 1, got {tuple(fields.batch_size)}")
        return fields
    if not isinstance(fields, Mapping):
        raise InvalidInputError(f"fields must be a mapping of field name to value, got {type(fields).__name__}")
    return {name: edge.single_row(name, v) for name, v in fields.items()}


class DataPlane:
    """The data plane over a controller port and the store's payload side (module docstring).

    Args:
        controller: the controller (replaced by :meth:`rebind` when the store installs a new state).
        io: the store's payload side.
        write_lock, lock: the store's write lock and metadata lock (see the module docstring).
        check_open: raises StoreClosedError when the store is closed.
        edge: the framework adapter (:class:`~tqstore.edge.Edge`): batch-of-one rows, results,
            status arrays, schema dtypes (default the framework-free :class:`~tqstore.edge.NumpyEdge`).
    """

    def __init__(self, controller: ControllerPort, io: PayloadIO, *, write_lock: Any, lock: Any,
                 check_open: Callable[[], None], edge: Any = None) -> None:
        self.edge = NumpyEdge() if edge is None else edge
        self.controller = controller
        self.io = io
        self.write_lock = write_lock
        self.lock = lock
        self.cond = threading.Condition(lock)  # consumers waiting for rows; notified after puts
        self._watchers: List[Tuple[Callable[[], None], Optional[str]]] = []  # watch_puts (callback, partition)
        self._watch_lock = threading.Lock()  # guards _watchers only: (un)watching never waits for ``lock``
        self.check_open = check_open
        self._sampler: BaseSampler = make_sampler(None)
        controller.set_sampler(self._sampler)
        self.streaming = Streaming(self)

    # ------------------------------------------------------------------ controller, sampler
    def rebind(self, controller: ControllerPort) -> None:
        """Work with ``controller`` from now on (the store replaced its state, e.g. by
        ``load_checkpoint``); the sampler moves there and reloads its state from it."""
        with self.lock:
            controller.set_sampler(self._sampler)
            self.controller = controller
            self.wake_locked()

    @property
    def sampler(self) -> BaseSampler:
        """The sampler ``get_meta(mode="fetch")`` uses (default :class:`SequentialSampler`)."""
        return self._sampler

    def set_sampler(self, sampler: Any) -> BaseSampler:
        """Use ``sampler`` (instance, class, name or ``{"name": ..., **kwargs}``) from now on.

        Its state per partition is loaded from the controller when it was saved by a sampler
        of the same kind, else it starts empty.  Raises ConfigError for a bad spec,
        StoreClosedError once the store is closed.
        """
        s = make_sampler(sampler)
        self.check_open()
        with self.lock:
            self.controller.set_sampler(s)
            self._sampler = s
        return s

    def notify(self, partition_id: Optional[str] = None) -> None:
        """Wake consumers waiting for rows (after a put into ``partition_id``; None: any)."""
        with self.lock:
            self.wake_locked(partition_id)

    def wake_locked(self, partition_id: Optional[str] = None) -> None:
        """Wake consumers waiting for rows, with ``lock`` held: the condition's waiters and
        the :meth:`watch_puts` callbacks of ``partition_id`` (None: every one)."""
        self.cond.notify_all()
        with self._watch_lock:
            watchers = list(self._watchers)
        for entry in watchers:
            cb, pid = entry
            if partition_id is not None and pid is not None and pid != partition_id:
                continue
            try:
                cb()
            except Exception:  # a watcher whose event loop has closed: it no longer waits
                log.debug("a put watcher failed; dropped", exc_info=True)
                self._unwatch(entry)

    def _unwatch(self, entry: Tuple[Callable[[], None], Optional[str]]) -> None:
        with self._watch_lock:
            try:
                self._watchers.remove(entry)
            except ValueError:
                pass

    def watch_puts(self, callback: Callable[[], None], partition_id: Optional[str] = None) -> Callable[[], None]:
        """Call ``callback()`` whenever a waiting ``get_meta(mode="fetch")`` would look
        again for rows (after every put, consumption reset and state switch; with
        ``partition_id``, only those of that partition and those of the whole store);
        returns the function that stops it (idempotent).

        The callback runs in the thread that changed the store, with the store's metadata
        lock held: it must be quick and must not call the store (``loop.call_soon_threadsafe``
        of an event's ``set``, say).  One that raises is dropped.  A waiter still asks again
        at least every 50 ms, as changes such as a load by key do not call it.  Neither this
        call nor the function it returns waits for the store's locks (an event loop calls
        them while a checkpoint load may hold the metadata lock for seconds).
        """
        if not callable(callback):
            raise InvalidInputError(f"watch_puts takes a callable, got {type(callback).__name__}")
        entry = (callback, None if partition_id is None else str(partition_id))
        with self._watch_lock:  # (not ``lock``: an event loop calls this, and a state switch holds ``lock`` long)
            self._watchers.append(entry)
        return functools.partial(self._unwatch, entry)

    def _rows_for_keys(self, pid: str, keys: List[str]) -> RowBatch:
        """Row metadata of ``keys``; raises PartitionNotFoundError / KeyNotFoundError."""
        rows = self.controller.rows_by_key(pid, keys)
        if rows is None:
            raise _no_partition(pid, self.controller.partitions())
        missing = [keys[i] for i in rows.missing()] if None in rows.seqs else None
        if missing:
            raise KeyNotFoundError(f"{len(missing)} key(s) not in partition {pid!r}: {missing[:5]!r}")
        return rows

    # ------------------------------------------------------------------ KV: by key
    def kv_put(self, key: str, partition_id: str, fields: Any = None, tag: Any = None) -> KVBatchMeta:
        """Put one row by key: ``fields`` maps field → value of this row (no batch dimension).

        Tensors gain a batch dimension, anything else is one non-tensor value.  Without
        ``fields`` only the tag is updated (the key is created if new).  A dict ``tag`` is
        merged into the key's existing dict tag.

        Returns:
            KVBatchMeta of the key, whose ``fields`` lists every field it has produced.

        Raises:
            InvalidInputError: neither fields nor tag, a nested tensor, a bad key.
            SchemaError, UnsupportedTypeError: nothing written.
        """
        if _no_fields(fields) and tag is None:
            raise InvalidInputError("kv_put needs fields or tag (or both)" + ("" if fields is None else
                                                                           ": fields holds no field"))
        if not isinstance(key, str):
            raise InvalidInputError(f"key must be a str, got {type(key).__name__} {key!r}")
        return self.kv_batch_put([key], partition_id, None if fields is None else _single_row(self.edge, fields),
                                 None if tag is None else [tag])

    @pausing  # the whole call, the returned meta's per-key tags included (see tqstore._gcpause)
    def kv_batch_put(self, keys: Sequence[str], partition_id: str, fields: Any = None,
                     tags: Optional[Sequence[Any]] = None) -> KVBatchMeta:
        """Put a batch of rows by key; missing keys are created.

        Args:
            keys: one key per row, no duplicates.
            partition_id: partition (created when missing).
            fields: mapping (dict or TensorDict) of field → batched value with ``len(keys)``
                rows; None to update tags only.
            tags: one tag per key (dicts are merged into existing dict tags; None entries
                leave a tag unchanged).

        Returns:
            KVBatchMeta whose ``fields`` are all fields every one of these keys has produced,
            including earlier puts.

        Raises:
            InvalidInputError: sizes disagree, duplicate keys, neither fields nor tags.
            SchemaError: a dtype/kind clashes with the partition's schema.
            UnsupportedTypeError: a value tqstore cannot store without pickle.
            Nothing is written when any of these is raised.
        """
        keys = _key_list(keys)
        if _no_fields(fields) and tags is None:  # (an empty mapping too: rows with nothing at all)
            raise InvalidInputError("kv_batch_put needs fields or tags (or both)" + ("" if fields is None else
                                                                                    ": fields holds no field"))
        _check_pid(partition_id)
        if tags is not None:
            if isinstance(tags, (Mapping, str, bytes)):  # (a dict would silently become its keys)
                raise InvalidInputError(f"tags must be a list with one tag per key, got {type(tags).__name__}")
            try:
                tags = list(tags)
            except TypeError:
                raise InvalidInputError(f"tags must be a list with one tag per key, got {type(tags).__name__}") \
                    from None
            if len(tags) != len(keys):
                raise InvalidInputError(f"{len(tags)} tags for {len(keys)} keys")
        with self.write_lock:
            self.check_open()
            merged = None
            if tags is not None:
                old = self.controller.rows_by_key(partition_id, keys)
                merged = [_merge_tag(o, t) for o, t in zip(old.tags if old is not None else [None] * len(keys), tags)]
            gidxs = self.io.write(partition_id, fields if fields is not None else {}, keys=keys, tags=merged)
            self.notify(partition_id)
            meta = self._kv_meta(partition_id, keys, gidxs)
        log.debug("kv_batch_put %d keys into %r (fields %s)", len(keys), partition_id, meta.fields)
        return meta

    def _kv_meta(self, pid: str, keys: List[str], gidxs: Sequence[int]) -> KVBatchMeta:
        """The meta of a put's ``keys``, written to rows ``gidxs`` (the write lock still held: the
        rows are those keys; asked by global index, no key lookup)."""
        rows = self.controller.row_batch(pid, gidxs)
        if rows is None or (None in rows.seqs and len(gidxs)):
            rows = self._rows_for_keys(pid, keys)  # (not expected: the error the key lookup gives)
        common = common_fields(rows.fields)
        return KVBatchMeta._of_rows(list(keys), rows.tags, pid, sorted(common))  # tags: the answer's copies

    def kv_batch_get(self, keys: Union[str, Sequence[str]], partition_id: str,
                     select_fields: Union[None, str, Sequence[str]] = None) -> Any:
        """Read rows by key: ``{field: batched value}`` in the order of ``keys``, as the store's
        result type (a ``TensorDict`` with ``batch_size``, or a plain dict).

        ``select_fields=None`` reads every field all the keys have produced.  Values are a
        tensor when rows share a shape, a jagged nested tensor when they do not; numpy fields
        are numpy arrays in a dict (tensors in a TensorDict); non-tensor fields a list (a
        ``NonTensorStack``).

        Raises:
            PartitionNotFoundError, KeyNotFoundError: unknown partition or key.
            FieldNotFoundError: a selected field is not produced for some key, or (with
                ``select_fields=None``) the keys have no field in common.
        """
        keys = _key_list(keys)
        sel = _field_list(select_fields)
        _check_pid(partition_id)
        self.check_open()

        def attempt() -> Any:
            rows = self._rows_for_keys(partition_id, keys)  # the call's one controller query
            fields = sel
            if fields is None:
                fields = sorted(common_fields(rows.fields))
                if not fields:
                    raise FieldNotFoundError(f"the {len(keys)} key(s) of partition {partition_id!r} have no field "
                                             f"produced in common; pass select_fields")
            else:
                check_produced(rows, range(len(rows)), fields)
            return self.io.read_rows(rows.gidxs, [(f, rows.schema[f][0]) for f in fields])

        return self.edge.result(self.io.removals.stable(attempt, self.write_lock), len(keys))

    def kv_batch_get_by_meta(self, meta: KVBatchMeta, select_fields: Union[None, str, Sequence[str]] = None
                             ) -> Any:
        """Read the rows of a :class:`KVBatchMeta` (its ``fields``, or ``select_fields`` ⊆ them);
        a meta of no keys gives an empty result (as an empty BatchMeta does).

        Raises:
            InvalidInputError: the meta has no partition_id.
            FieldNotFoundError: a selected field is not among ``meta.fields``.
        """
        if not isinstance(meta, KVBatchMeta):
            raise InvalidInputError(f"kv_batch_get_by_meta takes a KVBatchMeta, got {type(meta).__name__}")
        if meta.partition_id is None:
            raise InvalidInputError("the KVBatchMeta has no partition_id")
        sel = _field_list(select_fields)
        if sel is not None:
            missing = [f for f in sel if meta.fields is None or f not in meta.fields]
            if missing:
                raise FieldNotFoundError(f"select_fields {missing} not found in the KVBatchMeta (it has {meta.fields})")
        else:
            sel = meta.fields
        if not meta.keys:
            self.check_open()
            return self.edge.result({}, 0)
        return self.kv_batch_get(meta.keys, meta.partition_id, sel)

    def kv_list(self, partition_id: Optional[str] = None) -> Dict[str, Dict[str, Any]]:
        """``{partition: {key: tag}}`` for one partition (empty dict if unknown) or all.

        Partitions oldest first (creation order), keys in insertion order; a key without a tag
        maps to ``{}``.  One dict is built per
        partition, from the controller's key column (no per-key work but the entry and its ``{}``).
        """
        if partition_id is not None:
            _check_pid(partition_id)
        self.check_open()
        with self.lock:
            pids = self.controller.partitions() if partition_id is None else [partition_id]
            listed = [(pid, self.controller.key_list(pid)) for pid in pids]
        out: Dict[str, Dict[str, Any]] = {}
        for pid, got in listed:
            if got is not None:
                keys, tags = got
                d = out[pid] = {k: {} for k in keys}
                d.pop(None, None)  # (rows without a key)
                d.update(tags)
        return out

    def kv_clear(self, keys: Union[str, Sequence[str]], partition_id: str) -> None:
        """Remove keys with their data (idempotent: unknown keys or partition are ignored).

        Raises RestorePendingError while a load by key into the partition is unresolved
        (also for keys that are not rows yet: the load may create them), nothing removed."""
        keys = _key_list(keys)
        _check_pid(partition_id)
        self.check_open()
        with self.write_lock:
            rows = self.controller.rows_by_key(partition_id, keys)
            gidxs = [] if rows is None else [g for g, q in zip(rows.gidxs, rows.seqs) if q is not None]
            if gidxs:
                self.io.delete_rows(partition_id, gidxs)  # (the controller refuses it during a restore)
            else:  # no row yet: a restore of the partition may still create them
                check_no_restore(self.controller, partition_id, f"clearing keys of partition {partition_id!r}")
                return
        log.debug("kv_clear %d keys of %r", len(gidxs), partition_id)


    # ------------------------------------------------------------------ TransferQueue's key <-> row lookups
    def kv_retrieve_meta(self, keys: Union[str, List[str]], partition_id: str, create: bool = False) -> BatchMeta:
        """A BatchMeta of the rows of ``keys`` (in their order; keys that are not in the
        partition are left out, as TransferQueue's client does), over the fields every one of
        those rows has produced (in the partition's schema order, as TransferQueue: so that
        ``get_data`` of it reads them; a row created here has none).  ``create``: missing keys
        are created first (rows without data, tag ``{}``).  An unknown partition gives an
        empty meta.  The work is that of the keys asked for, whatever the partition's size.

        Raises:
            UnsupportedTypeError (a TypeError, TransferQueue's error): ``keys`` is not a str
                or a list of str.
            InvalidInputError: an empty list, a bad partition id or key, ``create`` not a bool.
        """
        keys = _one_or_list(keys, str, "Received an empty list as keys.", "Not all elements in `keys` are strings.",
                            "Only string or list of strings are allowed as `keys`.")
        _check_pid(partition_id)
        create = check_flag("create", create)  # ("no" would create rows)
        self.check_open()
        if create:
            with self.lock:
                rows = self.controller.rows_by_key(partition_id, keys)
            missing = list(keys) if rows is None else [keys[i] for i in rows.missing()]
            if missing:
                missing = list(dict.fromkeys(missing))
                self.kv_batch_put(missing, partition_id, tags=[{}] * len(missing))
        with self.lock:  # (not during a state switch: the answer is of one state)
            rows = self.controller.rows_by_key(partition_id, keys)
        if rows is None:
            return BatchMeta.empty()
        found = [i for i, q in enumerate(rows.seqs) if q is not None]
        if len(found) != len(rows):
            rows = RowBatch(rows.pid, rows.schema, *([col[i] for i in found] for col in
                                                    (rows.gidxs, rows.keys, rows.tags, rows.fields, rows.seqs)))
        common = common_fields(rows.fields) if len(rows) else set()
        return self.streaming._meta(rows, [f for f in rows.schema if f in common])

    def kv_retrieve_keys(self, global_indexes: Union[int, List[int]], partition_id: str) -> List[Optional[str]]:
        """The key of each of ``global_indexes`` in the partition (None for an index that is
        not a row of it, or a row without a key, as TransferQueue); the work is that of the
        indexes asked for, whatever the partition's size.

        Raises:
            UnsupportedTypeError (a TypeError, TransferQueue's error): ``global_indexes`` is not
                an int or a list of ints (numpy integers count; bools do not).
            InvalidInputError: an empty list, a bad partition id.
            PartitionKeysNotFoundError (a PartitionNotFoundError and a RuntimeError,
                TransferQueue's error): the partition does not exist ("Some global_indexes
                have no corresponding keys!").
        """
        global_indexes = _one_or_list(global_indexes, int, "Received an empty list as `global_indexes`.",
                                      "Not all elements in `global_indexes` are int.",
                                      "Only int or list of int are allowed as `global_indexes`.")
        _check_pid(partition_id)
        self.check_open()
        gidxs = [int(g) for g in global_indexes]
        asked = [g for g in gidxs if 0 <= g < 1 << 63]  # (any other int is no row)
        with self.lock:
            rows = self.controller.row_batch(partition_id, asked)
        if rows is None:  # TransferQueue: the controller answers [], the client raises (a RuntimeError)
            raise PartitionKeysNotFoundError(f"Some global_indexes have no corresponding keys! (partition "
                                             f"{partition_id!r} not found)")
        key_of = {g: k for g, k, q in zip(rows.gidxs, rows.keys, rows.seqs) if q is not None}
        return [key_of.get(g) for g in gidxs]


def _one_or_list(value: Any, typ: type, empty: str, mixed: str, wrong: str) -> list:
    """``[value]`` for one ``typ``, a non-empty list of them; else TransferQueue's errors with
    its messages: InvalidInputError ``empty``, UnsupportedTypeError (a TypeError, as
    TransferQueue raises) ``mixed`` / ``wrong``.  For ``int``: numpy integers and one-element
    integer tensors count (as ints), bools do not."""
    one = as_int if typ is int else (lambda v: v if isinstance(v, typ) else None)
    single = one(value)
    if single is not None:
        return [single]
    if not isinstance(value, list):
        raise UnsupportedTypeError(wrong)
    if not value:
        raise InvalidInputError(empty)
    out = [one(v) for v in value]
    if None in out:
        raise UnsupportedTypeError(mixed)
    return out



def forwarder(cls: type, attr: str, name: str) -> Callable:
    """A method calling ``self.<attr>.<name>`` (an instance of ``cls``), with the signature
    and docstring of ``cls.<name>`` (composition: the owner forwards, nothing is mixed in)."""
    target = getattr(cls, name)

    @functools.wraps(target)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        return getattr(getattr(self, attr), name)(*args, **kwargs)

    method.__signature__ = inspect.signature(target)  # type: ignore[attr-defined]
    del method.__wrapped__
    return method


for _name in STREAMING_CALLS:
    setattr(DataPlane, _name, forwarder(Streaming, "streaming", _name))

#: the public calls of a DataPlane that a Store forwards (the client's FORWARDED, set_sampler and watch_puts)
PUBLIC_CALLS = STREAMING_CALLS + ("kv_put", "kv_batch_put", "kv_batch_get", "kv_batch_get_by_meta", "kv_list",
                                  "kv_clear", "kv_retrieve_meta", "kv_retrieve_keys", "set_sampler", "watch_puts")

__all__ = ["DataPlane", "PayloadIO", "PUBLIC_CALLS", "forwarder"]
