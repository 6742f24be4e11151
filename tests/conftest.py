"""Shared fixtures.

``record_path``: engine tests run once per record-path implementation.  The engine
calls ``tqstore._native.<fn>`` by attribute at call time, so swapping the module's
attributes for the pure-Python ones exercises the fallback in-process (``native`` is
skipped when the C extension is not built, or when ``TQSTORE_PURE=1`` is set, so that
``TQSTORE_PURE=1 pytest`` runs the pure path only, selected at import).
"""
from __future__ import annotations

import importlib
import os

import pytest

from tqstore import _native
from tqstore._native import _pure

_FUNCS = ("crc32c", "build_header", "frame_head", "frame_tail", "encode_frames", "encode_rows", "check_frames",
          "gather_frames", "leaf_room", "leaf_columns")


def _native_module():
    try:
        return importlib.import_module("tqstore._native._frames")
    except ImportError:
        return None


@pytest.fixture(params=["native", "pure"])
def record_path(request, monkeypatch):
    """Run the test with the C record path, then with the pure-Python one."""
    if request.param == "native" and os.environ.get("TQSTORE_PURE") == "1":
        pytest.skip("TQSTORE_PURE=1: only the pure-Python record path runs")
    mod = _pure if request.param == "pure" else _native_module()
    if mod is None:
        pytest.skip("C extension tqstore._native._frames is not built")
    for name in _FUNCS:
        monkeypatch.setattr(_native, name, getattr(mod, name))
    monkeypatch.setattr(_native, "impl", mod)
    monkeypatch.setattr(_native, "IMPLEMENTATION", mod.IMPLEMENTATION)
    return request.param


@pytest.fixture
def reconciles(monkeypatch):
    """A list that gets one entry (the store's root) per full reconciliation of an open."""
    from tqstore import store_open

    calls = []
    real = store_open.full_reconcile
    monkeypatch.setattr(store_open, "full_reconcile", lambda s: (calls.append(s.root), real(s))[1])
    return calls


@pytest.fixture(scope="session")
def forkrun():
    """A :class:`forkrun.ForkServer`: fresh processes that start with torch and tqstore imported."""
    from forkrun import ForkServer

    server = ForkServer()
    yield server
    server.close()
