"""Checkpoints of a whole store: MVCC snapshot, atomic publication, generations, loads."""
from __future__ import annotations


class CheckpointMixin:
    """Placeholder: filled by the checkpoint work (issue 4)."""
