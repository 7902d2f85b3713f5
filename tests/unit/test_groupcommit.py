"""gateway/kit/groupcommit.py without a database: who shares a batch, and failure isolation."""

from __future__ import annotations

import asyncio

import pytest

from gateway.kit.groupcommit import GroupCommit


def run(coro):
    return asyncio.run(coro)


async def four_at_once(work) -> list:
    """Items 0-3 submitted together (one batch); each one's result or exception."""
    gc = GroupCommit(work)
    tasks = [asyncio.ensure_future(gc.submit(i)) for i in range(4)]
    return await asyncio.gather(*tasks, return_exceptions=True)


def test_an_idle_worker_runs_a_request_at_once_and_alone():
    seen: list[list[int]] = []

    async def work(items):
        seen.append(list(items))
        return [i * 10 for i in items]

    async def main():
        gc = GroupCommit(work)
        assert await gc.submit(1) == 10
        assert await gc.submit(2) == 20

    run(main())
    assert seen == [[1], [2]]


def test_requests_arriving_during_a_batch_share_the_next_one_in_order():
    seen: list[list[int]] = []

    async def work(items):
        seen.append(list(items))
        await asyncio.sleep(0.05)
        return [i * 10 for i in items]

    async def main():
        gc = GroupCommit(work, max_batch=3)
        first = asyncio.ensure_future(gc.submit(0))
        await asyncio.sleep(0.01)  # the first batch is in flight
        rest = [asyncio.ensure_future(gc.submit(i)) for i in range(1, 6)]
        return await asyncio.gather(first, *rest), gc.batches

    results, batches = run(main())
    assert results == [0, 10, 20, 30, 40, 50]
    assert seen == [[0], [1, 2, 3], [4, 5]] and batches == 3


def test_a_refusal_is_its_requests_alone():
    async def work(items):
        return [ValueError(f"bad {i}") if i == 2 else i for i in items]

    out = run(four_at_once(work))
    assert out[0] == 0 and out[1] == 1 and out[3] == 3
    assert isinstance(out[2], ValueError) and str(out[2]) == "bad 2"


def test_a_failed_batch_is_run_again_member_by_member():
    seen: list[list[int]] = []

    async def work(items):
        seen.append(list(items))
        if 2 in items:
            raise RuntimeError("the transaction failed")
        return list(items)

    out = run(four_at_once(work))
    assert out[0] == 0 and out[1] == 1 and out[3] == 3
    assert isinstance(out[2], RuntimeError)
    assert seen == [[0, 1, 2, 3], [0], [1], [2], [3]]


def test_a_database_outage_fails_the_whole_batch_at_once():
    """Nothing to isolate when the server is gone: each member gets the outage (a 503), none runs again."""
    import psycopg
    from sqlalchemy.exc import OperationalError

    seen: list[list[int]] = []

    async def work(items):
        seen.append(list(items))
        raise OperationalError("BEGIN", {}, psycopg.OperationalError("connection refused"))

    out = run(four_at_once(work))
    assert all(isinstance(o, OperationalError) for o in out)
    assert seen == [[0, 1, 2, 3]]


def test_a_request_that_went_away_does_not_break_its_batch():
    async def work(items):
        await asyncio.sleep(0.02)
        return list(items)

    async def main():
        gc = GroupCommit(work)
        gone = asyncio.ensure_future(gc.submit(0))
        kept = asyncio.ensure_future(gc.submit(1))
        await asyncio.sleep(0.005)
        gone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gone
        return await kept

    assert run(main()) == 1


def test_under_load_the_next_batch_waits_briefly_for_the_last_ones_size():
    """Closed loop: the three requests of a batch come back one by one, 1 ms apart. Without
    gathering, the first would go alone and the other two after it."""
    seen: list[list[int]] = []

    async def work(items):
        seen.append(list(items))
        await asyncio.sleep(0.02)
        return list(items)

    async def main():
        gc = GroupCommit(work, max_wait_s=0.05)
        await asyncio.gather(*(gc.submit(i) for i in range(3)))  # one batch of 1, then of 2
        seen.clear()
        await asyncio.gather(gc.submit(0), gc.submit(1))  # now the last batch had 2
        seen.clear()
        tasks = []
        for i in range(2):
            tasks.append(asyncio.ensure_future(gc.submit(10 + i)))
            await asyncio.sleep(0.001)
        await asyncio.gather(*tasks)

    run(main())
    assert seen == [[10, 11]]
