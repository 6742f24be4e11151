"""KV and streaming operations of a Store (TransferQueue-shaped); mixed into Store."""
from __future__ import annotations


class KVMixin:
    """Placeholder: filled by the data-plane work (issue 3)."""
