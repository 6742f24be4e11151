"""The async API: awaitable twins of the KV calls and of every client call, run off the event loop."""
from __future__ import annotations

import asyncio

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
