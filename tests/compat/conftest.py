"""Ported TransferQueue tests: xfail marks for what tqstore does not do yet or does differently.

Reasons starting "needs #11 part 2" wait for the engine refactor (kv/controller/samplers/
store); "differs on purpose" ones are documented in docs/MIGRATING.md.
"""
from __future__ import annotations

import pytest

from ._xfails import XFAIL


def pytest_collection_modifyitems(config, items):
    for item in items:
        rel = item.nodeid.split("tests/compat/", 1)[-1]
        reason = XFAIL.get(rel) or XFAIL.get(rel.split("[", 1)[0])
        if reason is None and "::" in rel:  # a whole class or file
            parts = rel.split("[", 1)[0].split("::")
            for i in range(len(parts) - 1, 0, -1):
                reason = XFAIL.get("::".join(parts[:i]))
                if reason:
                    break
        if reason:
            item.add_marker(pytest.mark.xfail(strict=False, reason=reason))
