"""The controller's part in a store's open and close, for the port conformance suite (a
mixin of :class:`~tqstore.testing.conformance.ControllerPortTests`; it uses that class's
helpers): what the reconcile after a crash or a power loss calls (``claim_counts``,
``drop_fields``) and the clean-close mark."""
from __future__ import annotations

from ..errors import TqstoreError
from ._conformance_base import pytest

_RANK0 = {"dp_rank": 0, "batch_index": 0}


class ControllerReconcileTests:
    """Reconcile and clean close (see the module docstring)."""

    # the store's clean close ------------------------------------------------------
    def test_claim_counts_count_the_produced_fields_of_each_units_rows(self, tmp_path):
        c = self.controller(tmp_path)
        self._needs(c, "claim_counts")
        assert c.claim_counts() == [0] * self.NUM_UNITS
        g = self.put(c, "p", keys=["a", "b", "c"], fields=("x", "y"))
        self.put(c, "q", n=2)
        self.put(c, "p", keys=["e"], fields=())
        c.clear_rows("p", g[:1])
        want = [0] * self.NUM_UNITS
        for u in range(self.NUM_UNITS):
            want[u] = sum(len(f) for f in c.claims(u).values())
        assert c.claim_counts() == want and sum(want) == 2 * 2 + 2

    def test_a_clean_mark_is_taken_once_and_only_while_nothing_was_committed_after_it(self, tmp_path):
        c = self.controller(tmp_path)
        self._needs(c, "mark_clean")
        assert c.take_clean() is None
        self.put(c, "p", keys=["a"])
        c.mark_clean(12345)
        c = self.reopen(c)
        assert c.take_clean() == 12345
        assert c.take_clean() is None  # taken: removed
        c.mark_clean(7)
        self.put(c, "p", keys=["b"])  # a commit after the mark: stale
        assert c.take_clean() is None
        c = self.reopen(c)
        assert c.take_clean() is None and c.list_keys() == {"p": {"a": None, "b": None}}
        for bad in (-1, 1 << 63, "1"):
            with pytest.raises(TqstoreError):
                c.mark_clean(bad)

    def test_a_controller_reopened_after_a_clean_mark_answers_as_before_and_so_after_it_was_taken(self, tmp_path):
        c = self.controller(tmp_path)
        self._needs(c, "mark_clean")
        g = self.put(c, "p", keys=["a", "b", "c", "d"], fields=("x", "y"), tags=[{"s": 1}, None, [1.5], "t"])
        self.put(c, "q", n=3)
        self.put(c, "p", keys=["e"], fields=())
        c.clear_rows("p", g[1:2])
        c.fetch("p", "t", ["x"], 2, _RANK0)
        want = self.state(c)
        c.mark_clean(4242)
        c = self.reopen(c)  # an implementation may read a persisted mirror here: the answers are the same
        assert self.state(c) == want
        assert c.take_clean() == 4242
        c = self.reopen(c)  # no mark: the index itself
        assert self.state(c) == want
        assert c.take_clean() is None

    def test_drop_fields_marks_lost_fields_not_produced_and_skips_rows_that_are_gone(self, tmp_path):
        """What the reconcile after a power loss calls when units no longer hold some frames
        (a store over Ray reached it through the port: it was no port method, and the open
        failed with AttributeError)."""
        c = self.controller(tmp_path)  # (no _needs: every store's open may call it)
        g = self.put(c, "p", keys=["a", "b", "c"], fields=("x", "y"))
        c.clear_rows("p", g[2:])
        c.drop_fields({g[0]: {"x"}, g[1]: {"x", "y"}, g[2]: {"x"}, 10_000: {"x"}})
        want = {g[0]: frozenset({"y"}), g[1]: frozenset()}
        for _ in range(2):  # and after a reopen
            assert {x: f for u in range(self.NUM_UNITS) for x, f in c.claims(u).items()} == want
            assert c.list_keys() == {"p": {"a": None, "b": None}}
            c = self.reopen(c)


__all__ = ["ControllerReconcileTests"]
