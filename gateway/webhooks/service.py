"""Webhook endpoints and the outbox: fan-out from ``job_event``, claim, record the outcome.

At least once: a delivery row is written in the same transaction that advances the outbox
cursor, a worker claims it by moving its ``next_attempt_at`` one lease ahead (committed
before sending), and it is marked delivered only after the receiver answered 2xx. A worker
killed mid-send leaves the row due again when the lease runs out.
"""

from __future__ import annotations

import dataclasses
import json
import random
from datetime import datetime, timedelta

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from gateway.jobs.models import Job, JobEvent
from gateway.kit.errors import Invalid, NotFound
from gateway.kit.timeutil import as_utc, utcnow
from gateway.webhooks.address import Allowlist, Refused, resolve
from gateway.webhooks.models import WebhookCursor, WebhookDelivery, WebhookEndpoint
from gateway.webhooks.send import new_secret

CURSOR = "job_event"
EVENT_TYPE = "job.state_changed"
PENDING, DELIVERED = "pending", "delivered"


def job_pool(job: Job) -> str | None:
    """The pool a job was routed to (one place, for the pools-as-data rename)."""
    return job.backend


# --- endpoints -------------------------------------------------------------------------

def check_url(url: str, allow: Allowlist, *, field: str = "body.url") -> None:
    try:
        resolve(url, allow)
    except Refused as exc:
        raise Invalid(field, str(exc)) from None


def create(session: Session, *, account: str | None, url: str, description: str, created_by: str,
           allow: Allowlist) -> WebhookEndpoint:
    check_url(url, allow)
    endpoint = WebhookEndpoint(account_name=account, url=url, description=description, secret=new_secret(),
                               created_by=created_by, created_at=utcnow(), enabled=True, consecutive_failures=0,
                               last_error="", disabled_reason="")
    session.add(endpoint)
    session.flush()
    return endpoint


def list_(session: Session, *, account: str | None) -> list[WebhookEndpoint]:
    q = select(WebhookEndpoint).order_by(WebhookEndpoint.id)
    q = q.where(WebhookEndpoint.account_name.is_(None) if account is None else WebhookEndpoint.account_name == account)
    return list(session.scalars(q))


def get_or_raise(session: Session, *, account: str | None, endpoint_id: int, for_update: bool = False
                 ) -> WebhookEndpoint:
    """An endpoint of this account (None: an admin endpoint); another's is not found."""
    endpoint = session.get(WebhookEndpoint, endpoint_id, with_for_update=for_update)
    if endpoint is None or endpoint.account_name != account:
        raise NotFound(f"no webhook endpoint {endpoint_id}")
    return endpoint


def update_(session: Session, *, endpoint: WebhookEndpoint, enabled: bool | None, description: str | None) -> None:
    if description is not None:
        endpoint.description = description
    if enabled is True and not endpoint.enabled:
        endpoint.enabled = True
        endpoint.consecutive_failures = 0
        endpoint.disabled_at = None
        endpoint.disabled_reason = ""
        # What waited while it was disabled goes out now, not after its old backoff.
        session.execute(update(WebhookDelivery).where(WebhookDelivery.endpoint_id == endpoint.id,
                                                      WebhookDelivery.status == PENDING)
                        .values(next_attempt_at=utcnow()))
    elif enabled is False and endpoint.enabled:
        endpoint.enabled = False
        endpoint.disabled_at = utcnow()
        endpoint.disabled_reason = "disabled through the API"
    session.flush()


def delete(session: Session, *, endpoint: WebhookEndpoint) -> None:
    session.execute(WebhookDelivery.__table__.delete().where(WebhookDelivery.endpoint_id == endpoint.id))
    session.delete(endpoint)
    session.flush()


def pending_counts(session: Session, endpoint_ids: list[int]) -> dict[int, int]:
    if not endpoint_ids:
        return {}
    rows = session.execute(select(WebhookDelivery.endpoint_id, func.count()).where(
        WebhookDelivery.endpoint_id.in_(endpoint_ids), WebhookDelivery.status == PENDING)
        .group_by(WebhookDelivery.endpoint_id))
    return {eid: n for eid, n in rows}


def deliveries(session: Session, *, endpoint_id: int, status: str | None, limit: int) -> list[WebhookDelivery]:
    q = select(WebhookDelivery).where(WebhookDelivery.endpoint_id == endpoint_id)
    if status:
        q = q.where(WebhookDelivery.status == status)
    return list(session.scalars(q.order_by(WebhookDelivery.id.desc()).limit(limit)))


# --- the outbox ------------------------------------------------------------------------

def payload(event: JobEvent, job: Job) -> str:
    at = as_utc(event.at).isoformat().replace("+00:00", "Z")
    return json.dumps({
        "type": EVENT_TYPE, "timestamp": at,
        "data": {"event_id": event.id, "job_id": job.id, "job_name": job.name, "account": job.account_name,
                 "pool": job_pool(job), "from_state": event.from_state, "to_state": event.to_state,
                 "reason": event.reason or "", "at": at},
    }, separators=(",", ":"), sort_keys=True)


def fan_out(session: Session, *, settle_s: float, limit: int = 1000) -> int:
    """Turn new job state events into delivery rows; return how many were written.

    The cursor row is locked for the whole transaction, so workers fan out one at a time.
    It advances over consecutive event ids only: a gap is an event whose transaction has
    not committed yet (or rolled back), and holds the cursor until the event after it is
    ``settle_s`` old. Events after a gap are still fanned out at once; the unique
    (endpoint, event) key keeps the re-scan from writing them twice.
    """
    cursor = session.execute(select(WebhookCursor).where(WebhookCursor.name == CURSOR).with_for_update()
                             ).scalar_one_or_none()
    if cursor is None:  # the migration writes it; a wiped table starts over from the oldest event
        cursor = WebhookCursor(name=CURSOR, last_event_id=0, updated_at=utcnow())
        session.add(cursor)
        session.flush()
    rows = session.execute(select(JobEvent, Job).join(Job, Job.id == JobEvent.job_id)
                           .where(JobEvent.id > cursor.last_event_id).order_by(JobEvent.id).limit(limit)).all()
    if not rows:
        return 0
    now = utcnow()
    last, advancing = cursor.last_event_id, True
    for event, _job in rows:
        if advancing and (event.id == last + 1 or (now - as_utc(event.at)).total_seconds() >= settle_s):
            last = event.id
        else:
            advancing = False
    endpoints = list(session.scalars(select(WebhookEndpoint)))
    written = 0
    if endpoints:
        ids = [e.id for e, _ in rows]
        seen = set(session.execute(select(WebhookDelivery.endpoint_id, WebhookDelivery.event_id)
                                   .where(WebhookDelivery.event_id.in_(ids))).tuples())
        for event, job in rows:
            if event.kind != "state" or event.to_state is None:
                continue
            body = None
            for ep in endpoints:
                if ep.account_name not in (None, job.account_name) or (ep.id, event.id) in seen:
                    continue
                if as_utc(event.at) < as_utc(ep.created_at):
                    continue  # events from before the endpoint existed are not sent to it
                body = body or payload(event, job)
                session.add(WebhookDelivery(endpoint_id=ep.id, event_id=event.id, msg_id=f"msg_{event.id}",
                                            event_type=EVENT_TYPE, job_id=job.id, payload=body, status=PENDING,
                                            attempts=0, created_at=now, next_attempt_at=now, last_error=""))
                written += 1
    if last != cursor.last_event_id:
        cursor.last_event_id = last
        cursor.updated_at = now
    session.flush()
    return written


@dataclasses.dataclass(frozen=True)
class Claimed:
    delivery_id: int
    endpoint_id: int
    attempt: int
    msg_id: str
    payload: str
    url: str
    secret: str = dataclasses.field(repr=False)


def claim(session: Session, *, limit: int, lease_s: float, postgres: bool) -> list[Claimed]:
    """Due deliveries of enabled endpoints, leased to this worker (commit before sending)."""
    now = utcnow()
    q = (select(WebhookDelivery, WebhookEndpoint).join(WebhookEndpoint, WebhookEndpoint.id == WebhookDelivery.endpoint_id)
         .where(WebhookDelivery.status == PENDING, WebhookDelivery.next_attempt_at <= now, WebhookEndpoint.enabled)
         .order_by(WebhookDelivery.next_attempt_at, WebhookDelivery.id).limit(limit))
    if postgres:  # SQLite serialises writers with BEGIN IMMEDIATE instead
        q = q.with_for_update(of=WebhookDelivery, skip_locked=True)
    out = []
    for d, ep in session.execute(q).tuples():
        d.attempts += 1
        d.last_attempt_at = now
        d.next_attempt_at = now + timedelta(seconds=lease_s)
        out.append(Claimed(delivery_id=d.id, endpoint_id=ep.id, attempt=d.attempts, msg_id=d.msg_id,
                           payload=d.payload, url=ep.url, secret=ep.secret))
    session.flush()
    return out


def backoff_s(attempt: int, *, base_s: float, max_s: float, rng: random.Random | None = None) -> float:
    """Exponential backoff with jitter: between half and all of min(max, base * 2^(attempt-1))."""
    ceiling = min(max_s, base_s * 2 ** min(attempt - 1, 40))
    return ceiling * (0.5 + 0.5 * (rng or random).random())


def record(session: Session, *, claimed: Claimed, ok: bool, status_code: int | None, error: str,
           base_s: float, max_s: float, disable_after: int, now: datetime | None = None) -> None:
    """Store one attempt's outcome; count failures on the endpoint and disable it after too many."""
    now = now or utcnow()
    ep = session.get(WebhookEndpoint, claimed.endpoint_id, with_for_update=True)  # endpoint first: one lock order
    d = session.get(WebhookDelivery, claimed.delivery_id, with_for_update=True)
    if d is None or ep is None or d.status == DELIVERED:
        return  # deleted meanwhile, or another worker's later attempt already succeeded
    d.last_status_code = status_code
    if ok:
        d.status, d.delivered_at, d.last_error = DELIVERED, now, ""
        ep.consecutive_failures = 0
        ep.last_success_at = now
    else:
        d.last_error = error
        if d.attempts == claimed.attempt:  # still ours: nobody re-claimed it after the lease ran out
            d.next_attempt_at = now + timedelta(seconds=backoff_s(claimed.attempt, base_s=base_s, max_s=max_s))
        ep.consecutive_failures += 1
        ep.last_error, ep.last_error_at = error, now
        if ep.enabled and ep.consecutive_failures >= disable_after:
            ep.enabled = False
            ep.disabled_at = now
            ep.disabled_reason = f"{ep.consecutive_failures} failed deliveries in a row; last: {error}"
    session.flush()


def record_many(session: Session, *, outcomes: list[tuple[Claimed, bool, int | None, str]], base_s: float,
                max_s: float, disable_after: int) -> None:
    """A round's outcomes: successes in one UPDATE per status code, failures one by one (rare).

    Endpoints are locked first, in id order, so concurrent workers cannot deadlock.
    """
    now = utcnow()
    endpoint_ids = sorted({c.endpoint_id for c, *_ in outcomes})
    endpoints = {ep.id: ep for ep in session.scalars(
        select(WebhookEndpoint).where(WebhookEndpoint.id.in_(endpoint_ids)).order_by(WebhookEndpoint.id)
        .with_for_update())}
    by_code: dict[int | None, list[int]] = {}
    for c, ok, code, _error in outcomes:
        if ok:
            by_code.setdefault(code, []).append(c.delivery_id)
            ep = endpoints.get(c.endpoint_id)
            if ep is not None:
                ep.consecutive_failures = 0
                ep.last_success_at = now
    for code, ids in by_code.items():
        session.execute(update(WebhookDelivery).where(WebhookDelivery.id.in_(ids), WebhookDelivery.status == PENDING)
                        .values(status=DELIVERED, delivered_at=now, last_error="", last_status_code=code)
                        .execution_options(synchronize_session=False))
    for c, ok, code, error in outcomes:
        if not ok:
            record(session, claimed=c, ok=False, status_code=code, error=error, base_s=base_s, max_s=max_s,
                   disable_after=disable_after, now=now)
    session.flush()
