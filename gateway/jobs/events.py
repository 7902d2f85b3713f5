"""Live job events as server-sent events: one stream per caller for all their jobs (docs/logs.md).

One :class:`EventHub` per gateway process reads new rows of the ``job_event`` table (one
query per poll, whatever the number of streams) and hands each to the streams whose
caller may read that job. A stream first replays from the database what came after its
``Last-Event-ID``, then sends what the hub hands it, so a reconnecting client loses and
repeats nothing.

Ids must be delivered in order for ``Last-Event-ID`` to mean "everything up to here". On
Postgres, ids come from a sequence and a transaction may commit after another that took a
later id. The hub therefore only hands out ids up to its *horizon*: the highest id below
which every id is either seen or has stayed missing for ``GAP_SETTLE_S`` (a rolled-back
transaction's id never appears). Replays read only up to the horizon as well.

Memory per stream is bounded: a stream's queue holds at most ``QUEUE_EVENTS`` events; a
stream that falls further behind is marked lagging, its queue is dropped, and it catches
up from the database instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gateway.identity.principal import Principal
from gateway.kit.timeutil import as_utc
from gateway.models.jobs import Job, JobEvent

log = logging.getLogger(__name__)

POLL_S = 0.2
GAP_SETTLE_S = 0.5
QUEUE_EVENTS = 256
PAGE = 500
HEARTBEAT_S = 15.0


@dataclasses.dataclass(frozen=True)
class Event:
    id: int
    account: str
    data: str  # the JSON payload, rendered once for every stream


def _render(e: JobEvent, account: str) -> Event:
    payload: dict[str, Any] = {
        "id": e.id, "job_id": e.job_id, "account": account, "at": as_utc(e.at).isoformat(),
        "actor": e.actor, "kind": e.kind, "from_state": e.from_state, "to_state": e.to_state,
        "reason": e.reason or "", "data": e.data,
    }
    return Event(id=e.id, account=account, data=json.dumps(payload, separators=(",", ":")))


def _query(accounts: frozenset[str] | None, after_id: int, upto_id: int | None, limit: int):
    stmt = (select(JobEvent, Job.account_name).join(Job, Job.id == JobEvent.job_id)
            .where(JobEvent.id > after_id).order_by(JobEvent.id).limit(limit))
    if upto_id is not None:
        stmt = stmt.where(JobEvent.id <= upto_id)
    if accounts is not None:
        stmt = stmt.where(Job.account_name.in_(sorted(accounts)))
    return stmt


def scope_of(principal: Principal) -> frozenset[str] | None:
    """The accounts whose jobs' events this caller may read; None: all (admins)."""
    return None if principal.is_admin else frozenset(principal.accounts)


class Subscriber:
    def __init__(self, accounts: frozenset[str] | None, size: int):
        self.accounts = accounts
        # None in the queue: a heartbeat (or a wake-up after the queue was dropped).
        self.queue: asyncio.Queue[Event | None] = asyncio.Queue(maxsize=size)
        self.lagging = False

    def offer(self, event: Event) -> None:
        if self.lagging or (self.accounts is not None and event.account not in self.accounts):
            return
        try:
            self.queue.put_nowait(event)
        except asyncio.QueueFull:
            # Too slow a reader: drop what is queued and let it catch up from the database.
            self.lagging = True
            while not self.queue.empty():
                self.queue.get_nowait()
            self.queue.put_nowait(None)

class EventHub:
    """Reads new job events once per poll and fans them out to the open streams."""

    def __init__(self, sessions: Callable[[], Session], *, poll_s: float = POLL_S,
                 gap_settle_s: float = GAP_SETTLE_S, queue_events: int = QUEUE_EVENTS,
                 heartbeat_s: float = HEARTBEAT_S):
        self._sessions = sessions
        self.poll_s = poll_s
        self.heartbeat_s = heartbeat_s
        self.gap_settle_s = gap_settle_s
        self.queue_events = queue_events
        self.horizon: int | None = None
        self._gaps: dict[int, float] = {}  # first missing id -> when it was first seen missing
        self._subscribers: set[Subscriber] = set()
        self._task: asyncio.Task | None = None
        self._start_lock: asyncio.Lock | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Start polling in the running event loop (the first stream does this)."""
        if self._task is not None:
            return
        self.loop = asyncio.get_running_loop()
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
        async with self._start_lock:
            if self._task is None:
                self.horizon = await anyio.to_thread.run_sync(self._max_id)
                self._task = self.loop.create_task(self._run(), name="isthmus-event-hub")

    async def stop(self) -> None:
        task, loop, self._task = self._task, self.loop, None
        if task is None or loop is None or loop.is_closed():
            return
        if loop is asyncio.get_running_loop():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        else:  # started by a server running in another loop (tests serve one app twice)
            loop.call_soon_threadsafe(task.cancel)

    @property
    def streams(self) -> int:
        return len(self._subscribers)

    def _max_id(self) -> int:
        with self._sessions() as s:
            return s.scalar(select(func.coalesce(func.max(JobEvent.id), 0))) or 0

    # ------------------------------------------------------------------- polling

    def _fetch(self, after_id: int) -> list[tuple[JobEvent, str]]:
        with self._sessions() as s:
            return [(e, account) for e, account in s.execute(_query(None, after_id, None, PAGE))]

    def _accept(self, rows: list[tuple[JobEvent, str]], now: float) -> list[Event]:
        """The rows that extend the horizon without a gap younger than the settle time."""
        out: list[Event] = []
        expected = (self.horizon or 0) + 1
        for e, account in rows:
            if e.id < expected:
                continue  # handed out already (by a poll that overlapped this one)
            if e.id > expected:
                first_seen = self._gaps.setdefault(expected, now)
                if now - first_seen < self.gap_settle_s:
                    break  # an earlier id may still commit: wait for it
            self._gaps.pop(expected, None)
            out.append(_render(e, account))
            expected = e.id + 1
        if out:
            self.horizon = out[-1].id
            self._gaps = {k: v for k, v in self._gaps.items() if k > self.horizon}
        return out

    async def poll_once(self) -> int:
        rows = await anyio.to_thread.run_sync(self._fetch, self.horizon or 0)
        events = self._accept(rows, time.monotonic())
        for event in events:
            for sub in tuple(self._subscribers):
                sub.offer(event)
        return len(rows)

    async def _run(self) -> None:
        while True:
            try:
                fetched = await self.poll_once()
            except Exception:
                log.exception("event hub: reading job events failed; retrying")
                fetched = 0
            if fetched < PAGE:
                await asyncio.sleep(self.poll_s)

    # ---------------------------------------------------------------- streaming

    def _replay(self, accounts: frozenset[str] | None, after_id: int, upto_id: int) -> list[Event]:
        with self._sessions() as s:
            return [_render(e, account) for e, account in s.execute(_query(accounts, after_id, upto_id, PAGE))]

    async def events(self, principal: Principal, *, after_id: int | None) -> AsyncIterator[Event | None]:
        """The caller's events after ``after_id`` (None: from now on), in id order.

        Yields None first once subscribed, then whenever nothing happened for a while (the
        caller sends a heartbeat).
        """
        await self.start()
        sub = Subscriber(scope_of(principal), self.queue_events)
        self._subscribers.add(sub)
        try:
            cursor = (self.horizon or 0) if after_id is None else after_id
            # Subscribed: everything after ``cursor`` will reach this stream. Say so first, so
            # the caller tells its client "connected" only from this point on.
            yield None
            while True:
                # Replay from the database up to the horizon: what happened before this
                # stream subscribed, or while it was lagging.
                sub.lagging = False
                while True:
                    upto = self.horizon or 0
                    page = await anyio.to_thread.run_sync(self._replay, sub.accounts, cursor, upto)
                    for event in page:
                        cursor = event.id
                        yield event
                    if len(page) < PAGE:
                        break
                while True:
                    event = await sub.queue.get()
                    if sub.lagging:
                        break  # the queue was dropped: replay from the database
                    if event is None:
                        yield None
                        continue
                    if event.id <= cursor:
                        continue  # already replayed
                    cursor = event.id
                    yield event
        finally:
            self._subscribers.discard(sub)


class Hubs:
    """The process's event hub, one per running event loop (tests serve one app in two loops):
    built once where the app is built (gateway/app.py) and asked by the streams' routes."""

    def __init__(self, sessions: Callable[[], Session], *, heartbeat_s: float) -> None:
        self._sessions = sessions
        self._heartbeat_s = heartbeat_s
        self._hub: EventHub | None = None

    def current(self) -> EventHub:
        """The hub of the running event loop (made at the first stream of each loop)."""
        hub = self._hub
        if hub is None or (hub.loop is not None and hub.loop is not asyncio.get_running_loop()):
            hub = self._hub = EventHub(self._sessions, heartbeat_s=self._heartbeat_s)
        return hub

    async def stop(self) -> None:
        if self._hub is not None:
            await self._hub.stop()


async def sse(hub: EventHub, principal: Principal, *, after_id: int | None,
              max_stream_s: float) -> AsyncIterator[bytes]:
    """The text/event-stream body: ``id``/``event``/``data`` per event, comments as heartbeats."""
    deadline = time.monotonic() + max_stream_s
    events = hub.events(principal, after_id=after_id)
    try:
        await events.__anext__()  # subscribed: from here on nothing is missed
        yield b"retry: 2000\n: connected\n\n"
        async for event in events:
            if time.monotonic() > deadline:
                return  # the client reconnects with Last-Event-ID and a fresh token check
            if event is None:
                yield b": heartbeat\n\n"
            else:
                yield f"id: {event.id}\nevent: job\ndata: {event.data}\n\n".encode()
    finally:
        await events.aclose()
