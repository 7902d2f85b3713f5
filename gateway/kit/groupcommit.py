"""Group commit: requests that arrive while a transaction is in flight share the next one.

One :class:`GroupCommit` per worker process and kind of write (``POST /v1/jobs``, issue #32).
A request on an idle worker starts its transaction at once, alone: there is no waiting
window, so an idle gateway answers as fast as before. While that transaction runs, every
request that arrives queues; when it ends, the queue (at most ``max_batch``) goes into the
next transaction together. Under load a batch is about as large as the requests in flight,
so its fixed costs (``BEGIN``, the cap locks and reads, one multi-row insert, ``COMMIT``
and its WAL flush) are paid once per batch, not once per request.

Gathering under load: in a closed loop the requests of one batch come back together, but
not at once. Started on the first of them, the next transaction would carry one request
and the one after it the rest (measured: batches of 1, 15, 1, 15 ... with 16 clients). So
when the last batch carried several requests, the next one waits until as many are queued,
or for half the last batch's duration (at most ``max_wait_s``), whichever comes first. After
a batch of one (an idle or lightly loaded worker) nothing waits.

Failure isolation: ``run(items)`` returns one result per item, a value or the exception
that item's request raises (a refusal of that request alone, written nothing). If ``run``
itself raises for a batch of several (a database error, a bug), nothing of that
transaction was kept, and each item is run again alone, so one bad request fails only
itself; but a database outage (``kit/db.py::database_unavailable``) fails every member of the
batch at once, each answered 503 with Retry-After (docs/operations.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Generic, TypeVar

from gateway.kit.db import database_unavailable

T = TypeVar("T")


class GroupCommit(Generic[T]):
    def __init__(self, run: Callable[[list[T]], Awaitable[Sequence[Any]]], *, max_batch: int = 64,
                 max_wait_s: float = 0.005):
        self._run = run
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self._last = (0, 0.0)  # the last batch's size and duration (s)
        self._wanted = 0
        self._enough: asyncio.Event | None = None
        self._queue: list[tuple[T, asyncio.Future]] = []
        self._draining = False
        self._task: asyncio.Task | None = None  # the drain, referenced so it is not collected
        self.batches = 0  # how many transactions ran (tests, metrics)

    async def submit(self, item: T) -> Any:
        """The item's result once its batch committed; raises what its request raises."""
        future = asyncio.get_running_loop().create_future()
        self._queue.append((item, future))
        if self._enough is not None and len(self._queue) >= self._wanted:
            self._enough.set()
        if not self._draining:
            self._draining = True
            self._task = asyncio.ensure_future(self._drain())
        return await future

    async def _drain(self) -> None:
        try:
            loop = asyncio.get_running_loop()
            while self._queue:
                await self._gather()
                batch, self._queue = self._queue[:self.max_batch], self._queue[self.max_batch:]
                started = loop.time()
                await self._run_batch(batch)
                self._last = (len(batch), loop.time() - started)
        finally:
            self._draining = False
            if self._queue:  # left by a cancelled drain: start again
                self._draining = True
                self._task = asyncio.ensure_future(self._drain())

    async def _gather(self) -> None:
        """Under load, let the requests of the last batch come back before starting the next."""
        size, took = self._last
        wanted = min(size, self.max_batch)
        if size <= 1 or len(self._queue) >= wanted:
            return
        self._wanted, self._enough = wanted, asyncio.Event()
        try:
            await asyncio.wait_for(self._enough.wait(), min(self.max_wait_s, took / 2))
        except TimeoutError:
            pass
        finally:
            self._enough = None

    async def _run_batch(self, batch: list[tuple[T, asyncio.Future]]) -> None:
        self.batches += 1
        try:
            results = await self._run([item for item, _ in batch])
        except asyncio.CancelledError:
            for _, future in batch:
                future.cancel()
            raise
        except Exception as exc:  # noqa: BLE001 - any failure: re-run the members alone
            if len(batch) == 1 or database_unavailable(exc):
                # An outage fails every member as it is (a 503 each, kit/errors.py): none would
                # fare better alone, and N more attempts would only wait on the same server.
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                return
            for one in batch:  # nothing of the batch was kept: each member alone
                await self._run_batch([one])
            return
        for (_, future), result in zip(batch, results, strict=True):
            if future.done():  # its request went away (client disconnected)
                continue
            if isinstance(result, BaseException):
                future.set_exception(result)
            else:
                future.set_result(result)
