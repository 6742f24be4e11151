"""A small in-process metrics registry: counts, errors, rows and latencies per operation.

The API layer (module functions, clients, async twins) times every call into one
:class:`Metrics` per process (:data:`REGISTRY`), grouped by operation family:
``put`` (put, kv_put, kv_batch_put), ``get`` (get_data, kv_batch_get, kv_batch_get_by_meta),
``get_meta``, ``clear``, ``save`` (save_checkpoint), ``load`` (load_checkpoint) and ``dump``
(dump/restore by key).  :func:`snapshot` gives a plain mapping; :func:`prometheus_text`
the Prometheus exposition format (needs ``prometheus_client``).
"""
from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, Optional

#: operation → family
FAMILIES = {
    "put": "put", "kv_put": "put", "kv_batch_put": "put",
    "get_data": "get", "kv_batch_get": "get", "kv_batch_get_by_meta": "get",
    "get_meta": "get_meta",
    "clear_samples": "clear", "clear_partition": "clear", "kv_clear": "clear",
    "save_checkpoint": "save", "load_checkpoint": "load",
    "dump_data_by_key": "dump", "load_data_by_key": "dump", "recover_data_load": "dump",
    # the background write of a blocking=False save or dump (its call above times the cut alone)
    "save_checkpoint_background": "save_background", "dump_data_by_key_background": "dump_background",
}

#: latency bucket bounds in seconds (Prometheus histogram style, cumulative)
BUCKETS_S = (0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0, float("inf"))


@dataclass
class OpStats:
    """Counters of one operation."""

    calls: int = 0
    errors: int = 0
    rows: int = 0
    seconds_total: float = 0.0
    seconds_max: float = 0.0
    buckets: Dict[float, int] = field(default_factory=lambda: {b: 0 for b in BUCKETS_S})

    def as_dict(self) -> Dict[str, Any]:
        return {"calls": self.calls, "errors": self.errors, "rows": self.rows,
                "seconds_total": self.seconds_total, "seconds_max": self.seconds_max,
                "seconds_mean": self.seconds_total / self.calls if self.calls else 0.0,
                "buckets": {("+Inf" if b == float("inf") else b): n for b, n in self.buckets.items()}}


class Metrics:
    """Thread-safe counters and latency histograms keyed by operation name."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ops: Dict[str, OpStats] = {}

    def observe(self, op: str, seconds: float, *, rows: int = 0, error: bool = False) -> None:
        with self._lock:
            st = self._ops.get(op)
            if st is None:  # (not setdefault: an OpStats with its buckets made per call)
                st = self._ops[op] = OpStats()
            st.calls += 1
            st.errors += int(error)
            st.rows += int(rows)
            st.seconds_total += seconds
            st.seconds_max = max(st.seconds_max, seconds)
            for b in BUCKETS_S:
                if seconds <= b:
                    st.buckets[b] += 1

    @contextlib.contextmanager
    def timed(self, op: str) -> Iterator[Dict[str, int]]:
        """Time the block as one call of ``op``; set ``box["rows"]`` inside to count rows."""
        box = {"rows": 0}
        t0 = time.perf_counter()
        try:
            yield box
        except BaseException:
            self.observe(op, time.perf_counter() - t0, rows=box["rows"], error=True)
            raise
        self.observe(op, time.perf_counter() - t0, rows=box["rows"])

    def snapshot(self) -> Dict[str, Any]:
        """``{"operations": {op: stats}, "families": {family: stats}}`` as plain values."""
        with self._lock:
            ops = {k: v.as_dict() for k, v in sorted(self._ops.items())}
        fams: Dict[str, Dict[str, Any]] = {}
        for op, st in ops.items():
            f = fams.setdefault(FAMILIES.get(op, op), {"calls": 0, "errors": 0, "rows": 0, "seconds_total": 0.0,
                                                      "seconds_max": 0.0})
            for k in ("calls", "errors", "rows", "seconds_total"):
                f[k] += st[k]
            f["seconds_max"] = max(f["seconds_max"], st["seconds_max"])
        return {"operations": ops, "families": fams}

    def reset(self) -> None:
        with self._lock:
            self._ops.clear()

    def prometheus_text(self) -> str:
        """The registry in Prometheus text format (ImportError without prometheus_client)."""
        from prometheus_client import CollectorRegistry, generate_latest
        from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

        metrics = self

        class _Collector:
            def collect(self):  # noqa: D401 - prometheus_client protocol
                with metrics._lock:
                    items = [(op, OpStats(st.calls, st.errors, st.rows, st.seconds_total, st.seconds_max,
                                          dict(st.buckets))) for op, st in sorted(metrics._ops.items())]
                calls = CounterMetricFamily("tqstore_calls", "API calls", labels=["op", "family"])
                errors = CounterMetricFamily("tqstore_errors", "API calls that raised", labels=["op", "family"])
                rows = CounterMetricFamily("tqstore_rows", "rows moved by API calls", labels=["op", "family"])
                lat = HistogramMetricFamily("tqstore_latency_seconds", "API call latency", labels=["op", "family"])
                for op, st in items:
                    lab = [op, FAMILIES.get(op, op)]
                    calls.add_metric(lab, st.calls)
                    errors.add_metric(lab, st.errors)
                    rows.add_metric(lab, st.rows)
                    lat.add_metric(lab, [("+Inf" if b == float("inf") else repr(b), n) for b, n in st.buckets.items()],
                                   st.seconds_total)
                return [calls, errors, rows, lat]

        reg = CollectorRegistry()
        reg.register(_Collector())
        return generate_latest(reg).decode("utf-8")


#: the process-wide registry the API layer records into
REGISTRY = Metrics()


def snapshot() -> Dict[str, Any]:
    return REGISTRY.snapshot()


def endpoint_payload() -> Any:
    """Prometheus text when prometheus_client is installed, else the :func:`snapshot` mapping."""
    try:
        return REGISTRY.prometheus_text()
    except ImportError:
        return REGISTRY.snapshot()


def rows_of(result: Any, default: Optional[int] = None) -> int:
    """Rows in a call's result (a BatchMeta / KVBatchMeta / TensorDict / mapping of batched values)."""
    size = getattr(result, "size", None)
    if isinstance(size, int):
        return size
    bs = getattr(result, "batch_size", None)
    if bs is not None and len(tuple(bs)):
        return int(tuple(bs)[0])
    if isinstance(result, dict) and result:
        v = next(iter(result.values()))
        try:
            return len(v)
        except TypeError:
            return default or 0
    return default or 0


def rows_moved(result: Any) -> int:
    """Rows a save, load or dump moved, from its result: a ``CheckpointInfo`` or ``LoadInfo``
    (``rows``), a dump's or a load by key's report (``keys``); else 0."""
    rows = getattr(result, "rows", None)
    if isinstance(rows, int) and not isinstance(rows, bool):
        return rows
    keys = result.get("keys") if isinstance(result, dict) else None
    return keys if isinstance(keys, int) and not isinstance(keys, bool) else 0


def timed_call(op: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` timed as one call of ``op``, with the rows it moved
    (:func:`rows_moved`) and, for the handle of a ``blocking=False`` save or dump, its
    background write (:func:`meter_background`)."""
    with REGISTRY.timed(op) as box:
        out = fn(*args, **kwargs)
        box["rows"] = rows_moved(out)
    return meter_background(op, out)


def meter_background(op: str, result: Any) -> Any:
    """``result``, after arranging, when it is the handle of a ``blocking=False`` save or dump
    (it has ``add_done_callback``), that its background write is recorded as one call of
    ``<op>_background`` when it ends: from the call's return to the write's end, an error
    when it failed (the call itself is timed as the cut it waits for)."""
    add = getattr(result, "add_done_callback", None)
    if add is not None:
        t0 = time.perf_counter()
        add(lambda error: REGISTRY.observe(f"{op}_background", time.perf_counter() - t0, error=error is not None))
    return result


__all__ = ["Metrics", "REGISTRY", "snapshot", "endpoint_payload", "FAMILIES", "meter_background", "timed_call",
           "rows_moved"]
