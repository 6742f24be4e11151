"""Setup shims for the ported TransferQueue tests (not part of tqstore).

TransferQueue's e2e tests start Ray and inspect the controller actor's internal state
(``ray.get(controller.get_partition_snapshot.remote(pid))``).  Here ``ray`` is a stand-in
whose ``get`` returns its argument and whose ``get_actor("TransferQueueController")``
returns :class:`ControllerView`: the same questions answered from tqstore's public API
(``kv_retrieve_meta``, ``get_meta(mode="force_fetch")``, ``get_production_status``), so
the tests' assertions run unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import numpy as np

import tqstore as tq


class _Remote:
    def __init__(self, fn):
        self._fn = fn

    def remote(self, *args, **kwargs):
        return self._fn(*args, **kwargs)


@dataclass
class PartitionSnapshot:
    """The attributes of TransferQueue's DataPartitionStatus the tests read."""

    partition_id: str
    keys_mapping: Dict[str, int] = field(default_factory=dict)
    global_indexes: List[int] = field(default_factory=list)
    custom_meta: Dict[int, Any] = field(default_factory=dict)
    field_name_mapping: Dict[str, int] = field(default_factory=dict)
    production_status: Any = None


class ControllerView:
    """``TransferQueueController`` questions answered through the public API of the default store."""

    def __init__(self) -> None:
        self.list_partitions = _Remote(lambda: tq.get_client().get_partition_list())
        self.clear_partition = _Remote(lambda pid: tq.get_client().clear_partition(pid))
        self.get_partition_snapshot = _Remote(self._snapshot)

    @staticmethod
    def _snapshot(partition_id: str) -> Optional[PartitionSnapshot]:
        client = tq.get_client()
        if partition_id not in client.get_partition_list():
            return None
        meta = client.get_meta(None, None, partition_id, mode="force_fetch")
        snap = PartitionSnapshot(partition_id)
        snap.global_indexes = list(meta.global_indexes)
        snap.keys_mapping = {k: g for k, g in zip(meta.keys, meta.global_indexes) if k is not None}
        snap.custom_meta = {g: m for g, m in zip(meta.global_indexes, meta.custom_meta)}
        fields = sorted(meta.field_schema)
        snap.field_name_mapping = {f: i for i, f in enumerate(fields)}
        rows = (max(meta.global_indexes) + 1) if meta.global_indexes else 0
        status = np.zeros((rows, len(fields)), dtype=np.int8)
        for col, f in enumerate(fields):
            gidx, produced = client.get_production_status([f], partition_id)
            for g, p in zip(gidx.tolist(), produced.reshape(-1).tolist()):
                status[g, col] = p
        snap.production_status = status
        return snap


class ray:  # noqa: N801 - stands in for the module
    """The few ``ray`` calls TransferQueue's tests make, for an in-process store."""

    _up = False

    @staticmethod
    def is_initialized() -> bool:
        return ray._up

    @staticmethod
    def init(*args, **kwargs) -> None:
        ray._up = True

    @staticmethod
    def shutdown() -> None:
        ray._up = False

    @staticmethod
    def get(x):
        return x

    @staticmethod
    def get_actor(name: str, namespace: Optional[str] = None):
        if name != "TransferQueueController":
            raise ValueError(f"no actor {name!r} (tqstore runs in-process)")
        return ControllerView()
