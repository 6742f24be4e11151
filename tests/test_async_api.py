"""The async API: awaitable twins of the KV calls and of every client call, run off the event loop."""
from __future__ import annotations

import asyncio
import time

import pytest
import torch

import tqstore as tq
from tqstore.errors import StoreClosedError


@pytest.fixture
def store():
    s = tq.init({"num_units": 2})
    yield s
    tq.close()


def test_many_concurrent_async_kv_calls_on_one_loop(store):
    async def main():
        await asyncio.gather(*(tq.async_kv_put(f"k{i}", "p", fields={"x": torch.full((4,), i)}, tag={"i": i})
                               for i in range(64)))
        got = await asyncio.gather(*(tq.async_kv_batch_get(f"k{i}", "p") for i in range(64)))
        listing = await tq.async_kv_list("p")
        meta = await tq.async_kv_batch_put(["k0", "k1"], "p", tags=[{"j": 0}, {"j": 1}])
        by_meta = await tq.async_kv_batch_get_by_meta(meta, select_fields="x")
        await asyncio.gather(*(tq.async_kv_clear(f"k{i}", "p") for i in range(32)))
        return got, listing, by_meta, await tq.async_kv_list("p")

    got, listing, by_meta, after = asyncio.run(main())
    assert [int(g["x"][0, 0]) for g in got] == list(range(64))
    assert listing["p"]["k5"] == {"i": 5} and len(listing["p"]) == 64
    assert torch.equal(by_meta["x"], torch.stack([torch.full((4,), 0), torch.full((4,), 1)]))
    assert sorted(after["p"]) == sorted(f"k{i}" for i in range(32, 64))


def test_event_loop_keeps_serving_while_a_large_put_and_get_run(store):
    big = torch.arange(32 * 1024 * 1024, dtype=torch.int64).view(64, -1)  # 256 MiB

    async def main():
        ticks = 0
        stop = asyncio.Event()

        async def ticker():
            nonlocal ticks
            while not stop.is_set():
                await asyncio.sleep(0.001)
                ticks += 1

        t = asyncio.create_task(ticker())
        await asyncio.sleep(0.01)
        before = ticks
        await tq.async_kv_batch_put([f"r{i}" for i in range(64)], "big", fields={"x": big})
        during_put = ticks - before
        before = ticks
        out = await tq.async_kv_batch_get([f"r{i}" for i in range(64)], "big")
        during_get = ticks - before
        stop.set()
        await t
        return during_put, during_get, out

    during_put, during_get, out = asyncio.run(main())
    assert during_put > 0, "the ticker never ran while the put was awaited: the loop was blocked"
    assert during_get > 0, "the ticker never ran while the get was awaited: the loop was blocked"
    assert torch.equal(out["x"], big)


def test_async_client_twins_and_async_client_class(store):
    client = tq.get_client()
    aclient = tq.AsyncTransferQueueClient()

    async def main():
        meta = await client.async_put({"prompt": torch.arange(8).view(4, 2)}, partition_id="s")
        got = await aclient.async_get_meta(["prompt"], 2, "s", task_name="t")
        data = await aclient.async_get_data(got)
        status = await client.async_get_consumption_status("t", "s")
        parts = await aclient.async_get_partition_list()
        await aclient.async_clear_partition("s")
        return meta, got, data, status, parts, await client.async_get_partition_list()

    meta, got, data, status, parts, after = asyncio.run(main())
    assert meta.size == 4 and got.global_indexes == [0, 1]
    assert torch.equal(data["prompt"], torch.tensor([[0, 1], [2, 3]]))
    assert status[1].tolist() == [1, 1, 0, 0]
    assert parts == ["s"] and after == []
    assert not hasattr(aclient, "get_meta"), "the async client has only the async_* calls"


def test_async_call_before_init_raises_at_once():
    tq.close()
    with pytest.raises(StoreClosedError, match="not initialized"):
        asyncio.run(tq.async_kv_list())


# ---------------------------------------------------------------- async_get_meta waits on the loop


def _rows(n, start=0):
    return {"prompt": torch.arange(start, start + n).view(n, 1)}


def test_waiting_async_fetches_do_not_hold_back_async_puts(store):
    """More waiting consumers than the API pool has threads (4): a producer's async_put still
    runs at once, and every consumer then gets its rows."""
    client = tq.get_client()

    async def main():
        waiters = [asyncio.create_task(client.async_get_meta(["prompt"], 1, "w", task_name=f"t{i}", timeout_s=60))
                   for i in range(6)]
        await asyncio.sleep(0.2)  # every waiter is waiting
        await asyncio.wait_for(client.async_put(_rows(1), partition_id="w"), 20)
        got = await asyncio.wait_for(asyncio.gather(*waiters), 20)
        return got

    got = asyncio.run(main())
    assert [m.global_indexes for m in got] == [[0]] * 6


def test_a_cancelled_waiting_async_fetch_takes_no_rows(store):
    client = tq.get_client()

    async def main():
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(client.async_get_meta(["prompt"], 2, "c", task_name="t", timeout_s=60), 0.2)
        await client.async_put(_rows(2), partition_id="c")
        await asyncio.sleep(0.3)  # a fetch left waiting in a pool thread would take the rows now
        return await client.async_get_meta(["prompt"], 2, "c", task_name="t")

    got = asyncio.run(main())
    assert got.global_indexes == [0, 1], "the cancelled fetch consumed the rows"
    assert store.get_consumption_status("t", "c")[1].tolist() == [1, 1]


def test_an_async_fetch_wakes_on_a_put_and_honours_its_timeout(store):
    client = tq.get_client()

    async def main():
        waiter = asyncio.create_task(client.async_get_meta(["prompt"], 3, "p", task_name="t", timeout_s=60))
        await client.async_put(_rows(2), partition_id="p")  # not enough for a batch of 3
        await asyncio.sleep(0.1)
        assert not waiter.done()
        await client.async_put(_rows(1, 2), partition_id="p")
        got = await asyncio.wait_for(waiter, 20)
        empty = await client.async_get_meta(["prompt"], 1, "p", task_name="t", timeout_s=0.05)
        return got, empty

    got, empty = asyncio.run(main())
    assert got.global_indexes == [0, 1, 2] and empty.size == 0


def test_async_fetch_with_polling_mode_false_raises_timeout_error():
    tq.init({"num_units": 1, "polling_mode": False, "get_meta_timeout_s": 0.1})
    try:
        client = tq.get_client()

        async def main():
            with pytest.raises(TimeoutError, match="polling_mode=False"):
                await client.async_get_meta(["prompt"], 1, "n", task_name="t")
            with pytest.raises(tq.InvalidInputError, match="timeout_s"):
                await client.async_get_meta(["prompt"], 1, "n", task_name="t", timeout_s="soon")

        asyncio.run(main())
    finally:
        tq.close()


class _PausingFetches:
    """The store, but each get_meta(mode="fetch") waits for ``go`` before it runs (the window in
    which a fetch is in flight on the pool)."""

    def __init__(self, store):
        import threading
        self._store, self.started, self.go = store, threading.Event(), threading.Event()

    def get_meta(self, *args, **kwargs):
        if kwargs.get("mode", "fetch") == "fetch":
            self.started.set()
            assert self.go.wait(30)
        return self._store.get_meta(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._store, name)


@pytest.mark.parametrize("rows_ready", [True, False])
def test_a_cancellation_during_a_running_fetch_loses_no_rows(store, rows_ready):
    """A cancellation while the fetch runs lets it finish: its rows are returned to the caller
    (the store cannot give them back) and the cancellation is delivered at the next await;
    when it took none, CancelledError at once."""
    if rows_ready:
        store.put(_rows(2), partition_id="f")
    slow = _PausingFetches(store)
    client = tq.TransferQueueClient(slow)

    async def consumer(out):
        out.append(await client.async_get_meta(["prompt"], 2, "f", task_name="t", timeout_s=0))
        await asyncio.sleep(30)  # the cancellation arrives here
        out.append("not cancelled")

    async def main():
        out = []
        task = asyncio.create_task(consumer(out))
        loop = asyncio.get_running_loop()
        assert await loop.run_in_executor(None, slow.started.wait, 20)
        task.cancel()
        await asyncio.sleep(0.05)
        slow.go.set()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 20)
        return out

    out = asyncio.run(main())
    if rows_ready:
        assert len(out) == 1 and out[0].global_indexes == [0, 1], out
    else:
        assert out == []


def test_wait_for_a_running_fetch_returns_its_rows(store):
    store.put(_rows(2), partition_id="g")
    slow = _PausingFetches(store)
    client = tq.TransferQueueClient(slow)

    async def main():
        loop = asyncio.get_running_loop()
        loop.call_later(0.3, slow.go.set)  # after wait_for's timeout has cancelled the call
        return await asyncio.wait_for(client.async_get_meta(["prompt"], 2, "g", task_name="t"), 0.1)

    got = asyncio.run(main())
    assert got.global_indexes == [0, 1]
    assert store.get_meta(["prompt"], 2, "g", task_name="t").size == 0


def test_watch_puts_calls_back_after_puts_until_stopped(store):
    calls = []
    stop = store.watch_puts(lambda: calls.append(1))

    def broken():
        raise RuntimeError("loop closed")

    store.watch_puts(broken)
    store.put(_rows(1), partition_id="x")
    assert calls == [1]
    store.kv_put("k", "x", fields={"prompt": torch.tensor([7])})
    assert calls == [1, 1]
    stop()
    stop()  # idempotent
    store.put(_rows(1), partition_id="x")
    assert calls == [1, 1]
    assert store._data._watchers == [], "the raising watcher was dropped"
    with pytest.raises(tq.InvalidInputError, match="callable"):
        store.watch_puts(None)


class _NoWatch:
    """The store without ``watch_puts`` (as a Ray store's client): waits poll it."""

    def __init__(self, store):
        self._store = store

    def __getattr__(self, name):
        if name == "watch_puts":
            raise AttributeError(name)
        return getattr(self._store, name)


def test_an_async_fetch_polls_a_store_that_does_not_notify_puts(store):
    client = tq.TransferQueueClient(_NoWatch(store))

    async def main():
        waiter = asyncio.create_task(client.async_get_meta(["prompt"], 2, "n", task_name="t", timeout_s=60))
        await asyncio.sleep(0.3)  # several polls find nothing
        assert not waiter.done()
        store.put(_rows(2), partition_id="n")
        return await asyncio.wait_for(waiter, 20)

    assert asyncio.run(main()).global_indexes == [0, 1]


def test_an_async_fetch_does_not_block_the_event_loop_while_a_state_switch_holds_the_store(store):
    """A checkpoint load holds the store's metadata lock for as long as it runs: an
    async_get_meta meanwhile waits off the loop (it registered its put watcher under that lock,
    which froze every coroutine of the loop until the load ended)."""
    import threading
    client = tq.get_client()
    held, release = threading.Event(), threading.Event()

    def hold():
        with store._data.lock:
            held.set()
            release.wait(30)

    async def main():
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        threading.Thread(target=hold, daemon=True).start()
        assert await asyncio.get_running_loop().run_in_executor(None, held.wait, 20)
        beat = asyncio.create_task(ticker())
        fetch = asyncio.create_task(client.async_get_meta(["prompt"], 1, "h", task_name="t", timeout_s=0.1))
        await asyncio.sleep(0.5)
        during = ticks
        release.set()
        got = await asyncio.wait_for(fetch, 20)
        beat.cancel()
        return during, got

    during, got = asyncio.run(main())
    assert during >= 10, f"the loop ran {during} times in 0.5 s: blocked by the fetch"
    assert got.size == 0


def test_a_cancel_of_a_waiting_fetch_is_never_lost_while_puts_keep_waking_it(store):
    """Puts wake the waiting fetch every millisecond (never enough rows for its batch): a
    ``cancel()`` arriving as a put wakes it still ends the task at once.  (With
    ``asyncio.wait_for`` between asks, Python 3.11 dropped such a cancellation: about one in
    two; the fetch went on waiting, and could take rows.)"""
    import threading
    import time

    stop = threading.Event()

    def producer():
        while not stop.is_set():
            store.put(_rows(1), partition_id="w")
            time.sleep(0.0005)

    async def main():
        client = tq.get_client()
        lost = 0
        for i in range(30):
            t = asyncio.ensure_future(client.async_get_meta(["prompt"], 10 ** 7, "w", task_name="t", timeout_s=5))
            await asyncio.sleep(0.002 + (i % 7) * 0.0007)
            t.cancel()
            done, _ = await asyncio.wait([t], timeout=1.0)
            if not done:
                lost += 1
                await asyncio.wait([t])
            assert t.cancelled()
        return lost

    th = threading.Thread(target=producer, daemon=True)
    th.start()
    try:
        assert asyncio.run(main()) == 0, "cancellations were lost"
    finally:
        stop.set()
        th.join(10)


def test_a_timeout_block_whose_fetch_took_rows_ends_in_timeout_error_with_the_rows(store):
    """``asyncio.timeout`` fires while the fetch is taking rows (a slow sampler): the fetch
    returns them and the block ends in TimeoutError at its next ``await``, never in a
    CancelledError that kills a task nobody cancelled."""
    import time

    class SlowSampler(tq.SequentialSampler):
        def sample(self, ready_indexes, batch_size, **kw):
            time.sleep(0.3)
            return super().sample(ready_indexes, batch_size, **kw)

    store.put(_rows(4), partition_id="s")
    store.set_sampler(SlowSampler())
    client = tq.get_client()

    async def main():
        meta = None
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.1):
                meta = await client.async_get_meta(["prompt"], 2, "s", task_name="t")
                await asyncio.sleep(5)
        assert asyncio.current_task().cancelling() == 0
        await asyncio.sleep(0.01)  # not cancelled later either
        return meta

    if not hasattr(asyncio, "timeout"):
        pytest.skip("asyncio.timeout is Python 3.11+")
    assert asyncio.run(main()).global_indexes == [0, 1]


def test_a_fetch_cancelled_while_queued_behind_busy_pool_threads_never_runs(store, monkeypatch):
    """Every thread of the API pool's read lane (where a fetch's asks run) is busy: a fetch
    cancelled before its ask started is withdrawn (CancelledError at once, no row taken), not
    run later with its rows lost."""
    import threading

    from tqstore import _executor

    monkeypatch.setenv("TQSTORE_ASYNC_WORKERS", "2")
    _executor.shutdown()  # (a pool of 2 threads from here on)
    store.put(_rows(2), partition_id="q")
    client = tq.get_client()
    release = threading.Event()

    async def main():
        busy = [asyncio.ensure_future(_executor.run_on("read", release.wait, 30)) for _ in range(2)]
        await asyncio.sleep(0.05)
        t = asyncio.ensure_future(client.async_get_meta(["prompt"], 2, "q", task_name="t", timeout_s=5))
        await asyncio.sleep(0.05)
        t.cancel()
        done, _ = await asyncio.wait([t], timeout=1.0)
        release.set()
        await asyncio.gather(*busy)
        await asyncio.sleep(0.1)  # (a fetch that ran anyway has run by now)
        return done, t

    try:
        done, t = asyncio.run(main())
    finally:
        release.set()
        _executor.shutdown()
        monkeypatch.delenv("TQSTORE_ASYNC_WORKERS")
    assert done and t.cancelled()
    assert store.get_consumption_status("t", "q")[1].tolist() == [0, 0]


def test_async_calls_work_in_a_child_forked_after_the_parent_used_them(tmp_path):
    """A child forked after the parent's async calls started the API pool has none of its
    threads: its async calls start a pool of their own (they hung forever)."""
    import multiprocessing as mp

    tq.init({"path": str(tmp_path / "parent")})
    try:
        asyncio.run(tq.async_kv_put("a", "p", fields={"x": torch.zeros(2)}))  # the parent's pool runs
    finally:
        tq.close()  # (before the fork: the child must not share the parent's open store)

    def child(q):
        tq.init({"path": str(tmp_path / "child")})

        async def go():
            await tq.async_kv_put("k", "p", fields={"x": torch.zeros(2)})
            return sorted((await tq.async_kv_list("p"))["p"])

        try:
            q.put(asyncio.run(asyncio.wait_for(go(), 20)))
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            q.put(repr(e))
        finally:
            tq.close()

    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=child, args=(q,))
    p.start()
    try:
        assert q.get(timeout=60) == ["k"]
    finally:
        p.join(30)
        if p.is_alive():
            p.kill()


def test_a_put_wakes_only_the_watchers_of_its_partition_and_those_of_every_partition(store):
    """Waiting consumers of other partitions are not woken by a put (each wake is an ask on
    the API pool the producers' puts run on): 200 waiters of one partition made puts to
    another ten times slower."""
    calls = []
    store.watch_puts(lambda: calls.append("a"), partition_id="a")
    store.watch_puts(lambda: calls.append("b"), partition_id="b")
    store.watch_puts(lambda: calls.append("any"))
    store.put(_rows(1), partition_id="a")
    assert sorted(calls) == ["a", "any"]
    calls.clear()
    store.kv_put("k", "b", fields={"prompt": torch.tensor([7])})
    assert sorted(calls) == ["any", "b"]
    calls.clear()
    store.get_meta(["prompt"], 1, "b", task_name="t")
    store.reset_consumption("b", "t")
    assert sorted(calls) == ["any", "b"]


def test_kv_batch_put_refuses_tags_that_are_no_list_before_writing(store):
    with pytest.raises(tq.InvalidInputError, match="tags must be a list"):
        store.kv_batch_put(["k"], "p", {"prompt": torch.tensor([[1]])}, tags=5)
    assert store.kv_list("p") == {}


def test_reads_and_fetches_never_queue_behind_puts_waiting_for_the_write_lock(store, monkeypatch):
    """Producers' puts waiting their turn for the store's write lock hold only the write
    lane's threads: a fetch's ``timeout_s`` and a small read keep their time (with one pool,
    4 puts waiting held every thread and the 0.2 s fetch and the read waited for the lock)."""
    import threading

    from tqstore import _executor

    monkeypatch.setenv("TQSTORE_ASYNC_WORKERS", "2")
    _executor.shutdown()  # (pools of 2 threads from here on)
    store.put(_rows(2), partition_id="q")
    client = tq.get_client()
    meta = client.get_meta(["prompt"], 2, "q", task_name="reader")
    held, release = threading.Event(), threading.Event()

    def long_put():  # holds the write lock up to 5 s, as a long put would
        with store._write_lock:
            held.set()
            release.wait(5.0)

    holder = threading.Thread(target=long_put)
    holder.start()
    held.wait()

    async def main():
        puts = [asyncio.ensure_future(client.async_put(_rows(2), partition_id="w")) for _ in range(4)]
        await asyncio.sleep(0.2)  # (every write-lane thread is now waiting for the lock)
        t0 = time.monotonic()
        empty = await client.async_get_meta(["prompt"], 2, "nothing-here", task_name="t", timeout_s=0.2)
        fetch_s = time.monotonic() - t0
        t0 = time.monotonic()
        got = await client.async_get_data(meta)
        read_s = time.monotonic() - t0
        waiting = not any(p.done() for p in puts)
        release.set()
        await asyncio.gather(*puts)
        return empty, fetch_s, got, read_s, waiting

    try:
        empty, fetch_s, got, read_s, waiting = asyncio.run(main())
    finally:
        release.set()
        holder.join()
        _executor.shutdown()
        monkeypatch.delenv("TQSTORE_ASYNC_WORKERS")
    assert empty.size == 0 and fetch_s < 2.0, fetch_s  # about its 0.2 s, not the lock's 5 s
    assert got["prompt"].shape[0] == 2 and read_s < 2.0, read_s
    assert waiting  # the puts were waiting for the lock all along
    assert len(store.get_consumption_status("any", "w")[1]) == 8  # and all 4 puts landed after it


def test_a_bad_async_workers_setting_is_a_config_error_naming_it(monkeypatch):
    """TQSTORE_ASYNC_WORKERS=abc raised a bare ValueError from int() at the first async call."""
    from tqstore import _executor

    _executor.shutdown()  # (the pools are made at first use: the next call reads the variable)
    tq.init({})
    try:
        for bad in ("abc", "0", "-1"):
            monkeypatch.setenv("TQSTORE_ASYNC_WORKERS", bad)
            with pytest.raises(tq.ConfigError, match="TQSTORE_ASYNC_WORKERS"):
                asyncio.run(tq.async_kv_list())
        monkeypatch.setenv("TQSTORE_ASYNC_WORKERS", "2")
        assert asyncio.run(tq.async_kv_list()) == {}
    finally:
        tq.close()
        _executor.shutdown()
