"""run_workers: the one loop batch and score share — a worker's error surfaces at once, a cancel stops
every worker, and no task outlives the call."""

from __future__ import annotations

import asyncio

import pytest

from tokview.batch.tasks import run_workers


async def test_all_workers_finishing_is_not_a_cancel():
    done = []

    async def work(n):
        await asyncio.sleep(0)
        done.append(n)

    workers = [asyncio.create_task(work(n)) for n in range(3)]
    assert await run_workers(workers, asyncio.Event()) is False
    assert sorted(done) == [0, 1, 2]


async def test_a_worker_error_surfaces_at_once_and_the_others_are_cancelled():
    forever = asyncio.Event()

    async def stuck():
        await forever.wait()

    async def broken():
        raise RuntimeError("boom")

    workers = [asyncio.create_task(stuck()), asyncio.create_task(broken())]
    with pytest.raises(RuntimeError, match="boom"):
        await run_workers(workers, None)
    assert workers[0].cancelled()


async def test_a_cancel_returns_true_and_stops_every_worker():
    cancel = asyncio.Event()
    forever = asyncio.Event()

    async def stuck():
        await forever.wait()

    workers = [asyncio.create_task(stuck()) for _ in range(2)]
    asyncio.get_running_loop().call_soon(cancel.set)
    assert await run_workers(workers, cancel) is True
    assert all(w.cancelled() for w in workers)
