"""The controller's side of checkpoints: export of a snapshot, staging of a load, and the
readers of a controller index copy (checkpoint verification, the CLI) that answer values.

Owner-side I/O, like the units' (:mod:`tqstore.unit_export`, :mod:`tqstore.unit_import`):
the controller writes ``data.mdb`` of a checkpoint or of a new state directory itself, and
nothing above the ports opens its LMDB files.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Dict, Mapping, Optional

import lmdb

from ._format import controller_records as CR
from ._format.lmdb_pages import LmdbPageError
from ._format.records import RecordError
from ._io import files
from ._io.lmdbenv import check_env_pages, check_extent, copy_env, copy_env_file, copy_txn_compact, open_env
from ._io.scan import seal_index_file
from ._io.workpool import WorkPool
from .controller_decode import CONTROLLER_DBS, decode_controller
from .errors import CorruptionError, StorageIOError, TqstoreError
from .ports import ControllerExport

log = logging.getLogger("tqstore")
ROLE_CONTROLLER = "controller"  # the manifest's role (docs/FORMAT.md, "MANIFEST.json")
INDEX_FILE = "data.mdb"


def export_controller(env, txn, dbs: Mapping[str, Any], dest: Path, *, index_block_bytes: int) -> ControllerExport:
    """Write a compact copy of the controller index at read transaction ``txn`` as
    ``dest/data.mdb`` (``dest`` created), fsync it and its directory; answer its manifest
    entry and the cut's summary."""
    files.mkdir(dest, exist_ok=True)
    try:
        copy_txn_compact(env, dest, txn)
    except lmdb.Error as e:
        raise StorageIOError(f"controller: exporting snapshot into {dest} failed: {e}") from e
    size, crc, blocks = seal_index_file(dest / INDEX_FILE, index_block_bytes)
    files.fsync_dir(dest)
    raw_next = txn.get(CR.META_NEXT_GIDX, db=dbs["meta"])
    raw_token = txn.get(CR.META_PUT_TOKEN, db=dbs["meta"])
    summary = {
        "rows": txn.stat(dbs["rows"])["entries"],
        "partitions": txn.stat(dbs["parts"])["entries"],
        "next_gidx": CR.decode_optional_decimal(raw_next),
        "put_token": CR.decode_optional_decimal(raw_token),  # overwriting puts the controller committed
    }
    entry = {"path": INDEX_FILE, "role": ROLE_CONTROLLER, "size": size, "crc32c": crc, "block_crc32c": list(blocks)}
    return ControllerExport([entry], summary)


def stage_controller(target: Path, src: Path, *, num_units: Optional[int], src_checked: bool = True,
                     sync: bool = True) -> bool:
    """Fill the new controller directory ``target`` with a copy of the (checked) controller
    index ``src`` that has no free page, its unit count set to ``num_units`` (None keeps it);
    fsynced, unless ``sync=False`` and the byte copy of ``src_checked=False`` was staged: then
    the caller fsyncs ``target`` (:func:`tqstore._io.files.fsync_tree`) before it relies on it,
    and may open it meanwhile.  Answers True when staged.

    ``src_checked=False``: ``src`` has not been checked (in process or by a walk), so LMDB
    must not map it.  Only a byte copy (:func:`copy_env_file`: a file with an empty free
    list, every checkpoint's) with ``num_units`` None is staged, and only when every page and
    entry of the copy reads checked (:func:`check_env_pages` with the controller's schema,
    beside its fsync): then LMDB may open the copy, ``src`` never mapped.  Otherwise nothing
    is left (the directory is removed) and the answer is False.  (Clearing the produced
    fields is the controller's: :meth:`Controller.stage_import`.)"""
    try:
        return _stage(target, src, num_units) if src_checked else _stage_unchecked(target, src, num_units, sync)
    except lmdb.Error as e:
        raise StorageIOError(f"staging {target} from a checkpoint failed: {e}") from e


def _stage(target: Path, src: Path, num_units: Optional[int]) -> bool:
    files.mkdir(target)
    copy_env(src, target)
    if num_units is not None:
        env = open_env(target, max_dbs=12)
        try:
            meta = env.open_db(b"meta")
            with env.begin(write=True) as txn:
                txn.put(CR.META_NUM_UNITS, CR.encode_decimal(num_units), db=meta)
            env.sync(True)
        finally:
            env.close()
    files.fsync_tree(target)
    return True


def _stage_unchecked(target: Path, src: Path, num_units: Optional[int], sync: bool) -> bool:
    if num_units is not None:
        return False
    files.mkdir(target)
    try:
        if not copy_env_file(src, target):
            files.rmtree(target)
            return False
        with WorkPool(max_workers=1, thread_name_prefix="tqstore-fsync") as pool:
            # beside the check (both read what the copy wrote); with sync=False the caller's
            # fsync overlaps its open (the decode) of the copy instead
            synced = pool.submit(files.fsync_tree, target) if sync else None
            try:
                check_env_pages(target, "controller")
            except LmdbPageError as e:
                log.info("controller copy %s: its pages or entries do not all read checked (%s); staged again once "
                         "its source is checked", target, e)
                ok = False
            else:
                ok = True
            if synced is not None:
                synced.result()
            if not ok:
                files.rmtree(target)
                return False
    except BaseException:
        files.rmtree(target)
        raise
    return True


# ---------------------------------------------------------------------------- readers (values out)
def read_controller(ctrl_dir: Path, *, shared: bool = False) -> Dict[str, Any]:
    """Decode and check every entry of the controller index in ``ctrl_dir`` (read only; the
    store's own decoder) and summarise it: ``num_units``, ``next_gidx``, ``put_token``,
    ``rows`` and ``partitions`` (``{pid: {"rows": n, "keys": n}}``, sorted).

    ``shared``: the index may be open in a store elsewhere; take a reader slot in its lock
    file when that is writable.

    Raises:
        StorageIOError: it cannot be opened.
        FormatVersionError, CorruptionError: an unknown format, a malformed entry, or an
            index that cannot be read ("controller index cannot be read: ...").
    """
    p = Path(ctrl_dir)
    if shared and os.access(p / "lock.mdb", os.W_OK):  # a reader slot: safe while the store is open elsewhere
        check_extent(p / INDEX_FILE)  # (CorruptionError, not SIGBUS, for a truncated file)
        try:
            env = lmdb.open(str(p), readonly=True, lock=True, max_dbs=12, subdir=True, create=False)
        except lmdb.Error as e:
            raise CorruptionError(f"controller index cannot be read: {e}", path=str(p / INDEX_FILE)) from e
    else:
        env = open_env(p, max_dbs=12, readonly=True)
    try:
        with env.begin() as txn:
            dbs = {n: env.open_db(n.encode(), txn=txn, create=False) for n in CONTROLLER_DBS if n != "restores"}
            try:  # (only its size is used: it bounds the indexes a pending restore reserves)
                dbs["restores"] = env.open_db(b"restores", txn=txn, create=False)
            except lmdb.Error:
                pass
            st = decode_controller(txn, dbs, p)
    except TqstoreError:
        raise
    except (lmdb.Error, ValueError) as e:
        raise CorruptionError(f"controller index cannot be read: {e}", path=str(p / INDEX_FILE)) from e
    finally:
        env.close()
    return {"num_units": st.num_units, "next_gidx": st.next_gidx, "put_token": st.put_token, "rows": len(st.rows),
            "partitions": {pid: {"rows": len(q.rows), "keys": q.key_count()} for pid, q in sorted(st.parts.items())}}


def read_controller_counts(ctrl_dir: Path) -> Dict[str, int]:
    """The unit count (``meta/num_units``) and the row count (entries of ``rows``) of the
    controller index in ``ctrl_dir`` (checked first, see :func:`check_env_pages`), read only
    and without decoding the entries: a checkpoint load compares them with MANIFEST.json, and the
    store's open of the staged copy decodes and checks every entry (the checked decoder of
    :func:`read_controller`), before the switch.  ``meta/format`` must be present.

    Raises:
        StorageIOError: it cannot be opened.
        CorruptionError: a database or a ``meta`` value is missing or malformed.
    """
    p = Path(ctrl_dir)
    env = open_env(p, max_dbs=12, readonly=True)
    where = "meta"
    try:
        with env.begin() as txn:
            meta = env.open_db(b"meta", txn=txn, create=False)
            where = "meta/format"
            CR.decode_decimal(txn.get(CR.META_FORMAT, db=meta))
            where = "meta/num_units"
            num_units = CR.decode_decimal(txn.get(CR.META_NUM_UNITS, db=meta), 1)
            where = "rows"
            rows = txn.stat(env.open_db(b"rows", txn=txn, create=False))["entries"]
    except (lmdb.Error, RecordError) as e:
        raise CorruptionError(f"controller index: {where} cannot be read: {e}", path=str(p / INDEX_FILE)) from e
    finally:
        env.close()
    return {"num_units": num_units, "rows": rows}


def partition_counts(ctrl_dir: Path) -> Optional[Dict[str, int]]:
    """Rows per partition of a controller index, read leniently (what an inspection can
    show of a damaged one); None when it cannot be read at all."""
    try:
        env = open_env(Path(ctrl_dir), max_dbs=12, readonly=True)
    except TqstoreError:
        return None
    try:
        counts: Dict[str, int] = {}
        with env.begin() as txn:
            parts = env.open_db(b"parts", txn=txn, create=False)
            rows = env.open_db(b"rows", txn=txn, create=False)
            by_num: Dict[int, str] = {}
            for k, v in txn.cursor(parts):
                name = bytes(k).decode("utf-8", "replace")
                counts[name] = 0
                try:
                    num = CR.decode_partition2(v)[2]
                except RecordError:
                    continue
                if num is not None:
                    by_num[num] = name
            for v in txn.cursor(rows).iternext(keys=False):
                try:  # version 2 (binary) or 1 (JSON: starts with "{")
                    pid = CR.decode_row(v).pid if bytes(v[:1]) == b"{" else by_num[CR.decode_row2(v).part]
                except (RecordError, KeyError):
                    continue
                counts[pid] = counts.get(pid, 0) + 1
        return counts
    except Exception:  # noqa: BLE001 - an inspection shows what it can
        return None
    finally:
        env.close()
