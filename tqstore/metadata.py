"""TransferQueue's ``transfer_queue.metadata`` module under tqstore's name, so that imports written
for TransferQueue (``from transfer_queue.metadata import BatchMeta``) need only the package name
changed.  The classes are :mod:`tqstore.meta`'s; see docs/MIGRATING.md.
"""
from __future__ import annotations

from .meta import BatchMeta, KVBatchMeta
from .meta_schema import extract_field_schema

__all__ = ["BatchMeta", "KVBatchMeta", "extract_field_schema"]
