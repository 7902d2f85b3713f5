"""Webhook endpoints and the outbox: fan-out from ``job_event``, claim, record the outcome.

At least once: a delivery row is written in the same transaction that advances the outbox
cursor, a worker claims it by moving its ``next_attempt_at`` one lease ahead (committed
before sending), and it is marked delivered only after the receiver answered 2xx. A worker
killed mid-send leaves the row due again when the lease runs out.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import random
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta

from sqlalchemy import func, or_, select, update
from sqlalchemy.orm import Session

from gateway.audit import service as audit
from gateway.audit.service import Who
from gateway.kit.errors import Invalid, LimitExceeded, NotFound
from gateway.kit.timeutil import as_utc, utcnow
from gateway.models.accounts import Account
from gateway.models.identity import ADMIN_ROLE, ANY_ACCOUNT, MembershipSeen
from gateway.models.jobs import Job, JobEvent
from gateway.models.nodes import NodeStanding
from gateway.models.webhooks import WebhookCursor, WebhookDelivery, WebhookEndpoint
from gateway.webhooks.address import Allowlist, Refused, resolve
from gateway.webhooks.send import new_secret

CURSOR = "job_event"
EVENT_TYPE = "job.state_changed"
PENDING, DELIVERED = "pending", "delivered"


# --- endpoints -------------------------------------------------------------------------

def check_url(url: str, allow: Allowlist, *, field: str = "body.url") -> None:
    try:
        resolve(url, allow)
    except Refused as exc:
        raise Invalid(field, str(exc)) from None


def shown(endpoint: WebhookEndpoint) -> dict:
    """An endpoint as the audit log records it: never its secret, and its URL without user
    information, query or fragment (where a receiver's own token may be)."""
    from urllib.parse import urlsplit

    parts = urlsplit(endpoint.url)
    return {"url": f"{parts.scheme}://{parts.hostname or ''}{f':{parts.port}' if parts.port else ''}{parts.path}",
            "description": endpoint.description, "enabled": endpoint.enabled, "account": endpoint.account_name}


def create(session: Session, *, account: str | None, url: str, description: str, by: Who,
           allow: Allowlist, max_per_account: int) -> WebhookEndpoint:
    """Raises:
        Invalid: the URL is refused (naming ``body.url``).
        LimitExceeded: the account already has ``max_per_account`` endpoints.
    """
    check_url(url, allow)
    if account is not None:
        # The account row is the lock: two concurrent registrations cannot both take the last place.
        session.get(Account, account, with_for_update=True)
        n = session.scalar(select(func.count()).select_from(WebhookEndpoint)
                           .where(WebhookEndpoint.account_name == account)) or 0
        if n >= max_per_account:
            raise LimitExceeded(f"account {account!r} has {n} webhook endpoints, the limit "
                                f"(ISTHMUS_WEBHOOK_MAX_ENDPOINTS_PER_ACCOUNT = {max_per_account}); "
                                "delete one first")
    now = utcnow()
    endpoint = WebhookEndpoint(account_name=account, url=url, description=description, secret=new_secret(),
                               created_by=by.subject, held_by=by.subject, created_at=now, events_from_at=now,
                               enabled=True, consecutive_failures=0, last_error="", disabled_reason="")
    session.add(endpoint)
    session.flush()
    audit.record(session, by=by, action="webhook.create", target_kind="webhook", target_name=str(endpoint.id),
                 account=account, before=None, after=shown(endpoint), now=now)
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


def update_(session: Session, *, endpoint: WebhookEndpoint, enabled: bool | None, description: str | None,
            by: Who) -> None:
    """Re-enabling makes ``by`` (who holds the account: the routes' tenancy) its holder."""
    caller = by.subject
    before = shown(endpoint)
    if description is not None:
        endpoint.description = description
    if enabled is True and not endpoint.enabled:
        endpoint.enabled = True
        endpoint.held_by = caller
        if endpoint.suspended_at is not None:
            endpoint.suspended_at = None
            endpoint.events_from_at = utcnow()
        endpoint.consecutive_failures = 0
        endpoint.disabled_at = None
        endpoint.disabled_reason = ""
        endpoint.blocked_until = None
        # What waited while it was disabled goes out now, not after its old backoff.
        session.execute(update(WebhookDelivery).where(WebhookDelivery.endpoint_id == endpoint.id,
                                                      WebhookDelivery.status == PENDING)
                        .values(next_attempt_at=utcnow()))
    elif enabled is False and endpoint.enabled:
        endpoint.enabled = False
        endpoint.disabled_at = utcnow()
        endpoint.disabled_reason = "disabled through the API"
    session.flush()
    if shown(endpoint) != before:
        audit.record(session, by=by, action="webhook.update", target_kind="webhook", target_name=str(endpoint.id),
                     account=endpoint.account_name, before=before, after=shown(endpoint))


def delete(session: Session, *, endpoint: WebhookEndpoint, by: Who) -> None:
    before, endpoint_id, account = shown(endpoint), endpoint.id, endpoint.account_name
    session.execute(WebhookDelivery.__table__.delete().where(WebhookDelivery.endpoint_id == endpoint.id))
    session.delete(endpoint)
    session.flush()
    audit.record(session, by=by, action="webhook.delete", target_kind="webhook", target_name=str(endpoint_id),
                 account=account, before=before, after=None)


def pending_counts(session: Session, endpoint_ids: list[int]) -> dict[int, int]:
    if not endpoint_ids:
        return {}
    rows = session.execute(select(WebhookDelivery.endpoint_id, func.count()).where(
        WebhookDelivery.endpoint_id.in_(endpoint_ids), WebhookDelivery.status == PENDING)
        .group_by(WebhookDelivery.endpoint_id))
    return dict(rows.all())


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
                 "pool": job.pool, "from_state": event.from_state, "to_state": event.to_state,
                 "reason": event.reason or "", "at": at},
    }, separators=(",", ":"), sort_keys=True)


NODE_QUARANTINED = "node.quarantined"
NODE_CURSOR = "node_standing"  # how far the node notices have read (suspect_since, epoch microseconds)


def fan_out_nodes(session: Session) -> int:
    """Every node the dispatcher newly quarantined (``node_standing.suspect_since``, docs/recovery.md
    "Node health") becomes a ``node.quarantined`` delivery to every admin endpoint; returns how many.
    The same outbox rule as job events: the cursor row is locked, and moves past what was queued."""
    cursor = session.execute(select(WebhookCursor).where(WebhookCursor.name == NODE_CURSOR).with_for_update()
                             ).scalar_one_or_none()
    if cursor is None:  # from the start: an endpoint gets no notice older than itself anyway
        cursor = WebhookCursor(name=NODE_CURSOR, last_event_id=0, updated_at=utcnow())
        session.add(cursor)
        session.flush()
    since = _EPOCH + timedelta(microseconds=cursor.last_event_id)
    rows = list(session.scalars(select(NodeStanding).where(NodeStanding.suspect_since > since)
                                .order_by(NodeStanding.suspect_since)))
    if not rows:
        return 0
    endpoints = list(session.scalars(select(WebhookEndpoint).where(WebhookEndpoint.account_name.is_(None),
                                                                   WebhookEndpoint.suspended_at.is_(None))))
    ids = {(r.pool, r.node): _notice_id(r) for r in rows}
    seen = set(session.execute(select(WebhookDelivery.endpoint_id, WebhookDelivery.event_id)
                               .where(WebhookDelivery.event_id.in_(list(ids.values())))).tuples())
    written = 0
    for row in rows:
        at = as_utc(row.suspect_since)
        event_id = ids[(row.pool, row.node)]
        stamp = at.isoformat().replace("+00:00", "Z")
        body = json.dumps({"type": NODE_QUARANTINED, "timestamp": stamp,
                           "data": {"pool": row.pool, "node": row.node, "reason": row.reason, "at": stamp}},
                          separators=(",", ":"), sort_keys=True)
        for ep in endpoints:
            if as_utc(ep.events_from_at or ep.created_at) > at or (ep.id, event_id) in seen:
                continue
            session.add(WebhookDelivery(endpoint_id=ep.id, event_id=event_id, msg_id=f"msg_n{-event_id}",
                                        event_type=NODE_QUARANTINED, job_id="", payload=body, status=PENDING,
                                        attempts=0, created_at=utcnow(), next_attempt_at=utcnow(), last_error=""))
            written += 1
    cursor.last_event_id = max(cursor.last_event_id, max(_micros(as_utc(r.suspect_since)) for r in rows))
    cursor.updated_at = utcnow()
    session.flush()
    return written


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _notice_id(row: NodeStanding) -> int:
    """A quarantine's delivery event id: negative (job events are positive), the same each time."""
    key = f"{row.pool}/{row.node}/{_micros(row.suspect_since)}"
    return -(int.from_bytes(hashlib.sha256(key.encode()).digest()[:7], "big") or 1)


def _micros(at: datetime) -> int:
    return (as_utc(at) - _EPOCH) // timedelta(microseconds=1)


def fan_out(session: Session, *, settle_s: float, unseen_s: float, limit: int = 1000) -> int:
    """Turn new job state events into delivery rows; return how many were written.

    The cursor row is locked for the whole transaction, so workers fan out one at a time.
    It advances over consecutive event ids only: a gap is an event whose transaction has
    not committed yet (or rolled back), and holds the cursor until the event after it is
    ``settle_s`` old. Events after a gap are still fanned out at once; the unique
    (endpoint, event) key keeps the re-scan from writing them twice.
    """
    cursor = session.execute(select(WebhookCursor).where(WebhookCursor.name == CURSOR).with_for_update()
                             ).scalar_one_or_none()
    suspend_unheld(session, unseen_s=unseen_s)
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
    endpoints = list(session.scalars(select(WebhookEndpoint).where(WebhookEndpoint.suspended_at.is_(None))))
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
                if as_utc(event.at) < as_utc(ep.events_from_at or ep.created_at):
                    continue  # from before the endpoint existed, or while it was suspended
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


def suspend_unheld(session: Session, *, unseen_s: float) -> int:
    """Suspend enabled endpoints whose holder no longer holds their account; return how many.

    Held means seen (gateway/identity/seen.py) with the account in the token (an admin
    endpoint: with the admin role; an admin holds every account) within ``unseen_s``, and
    not seen since without it. A suspended endpoint is disabled, queues nothing, and says why.
    """
    endpoints = list(session.scalars(select(WebhookEndpoint).where(WebhookEndpoint.enabled)))
    if not endpoints:
        return 0
    now = utcnow()
    seen = {(r.subject, r.account): as_utc(r.last_seen_at) for r in session.scalars(
        select(MembershipSeen).where(MembershipSeen.subject.in_(sorted({e.held_by for e in endpoints}))))}
    suspended = 0
    for ep in endpoints:
        what = f"account {ep.account_name}" if ep.account_name is not None else "the admin role"
        keys = [(ep.held_by, ADMIN_ROLE)] + ([(ep.held_by, ep.account_name)] if ep.account_name is not None else [])
        held_at = max((seen[k] for k in keys if k in seen), default=None)
        last_seen = seen.get((ep.held_by, ANY_ACCOUNT))
        if held_at is None or (now - held_at).total_seconds() > unseen_s:
            reason = (f"suspended: its holder {ep.held_by} has not been seen holding {what} for "
                      f"{unseen_s / 86400:g} days (ISTHMUS_WEBHOOK_HOLDER_UNSEEN_S)")
        elif last_seen is not None and held_at < last_seen:
            reason = (f"suspended: its holder {ep.held_by} was seen at {last_seen.isoformat(timespec='seconds')} "
                      f"without {what}")
        else:
            continue
        ep.enabled = False
        ep.disabled_at = ep.suspended_at = now
        ep.disabled_reason = reason + "; someone who holds it may re-enable the endpoint and becomes its holder"
        suspended += 1
    session.flush()
    return suspended


@dataclasses.dataclass(frozen=True)
class Claimed:
    delivery_id: int
    endpoint_id: int
    account: str | None
    attempt: int
    msg_id: str
    payload: str
    url: str
    secret: str = dataclasses.field(repr=False)


def _claimable(now: datetime):
    return (WebhookEndpoint.enabled,
            or_(WebhookEndpoint.blocked_until.is_(None), WebhookEndpoint.blocked_until <= now))


def fair_order(rows: list[tuple[int, str | None]], *, slots: int, busy: Mapping[str | None, int],
               account_slots: int) -> list[int]:
    """Endpoint ids to claim: one per account in turn, accounts in the order given (earliest due
    first), none for an account that already has ``account_slots`` attempts in flight."""
    queues: dict[str | None, list[int]] = {}
    for endpoint_id, account in rows:
        queues.setdefault(account, []).append(endpoint_id)
    taken = collections.Counter(busy)
    chosen: list[int] = []
    while queues and len(chosen) < slots:
        for account in list(queues):
            ids = queues[account]
            if len(chosen) >= slots:
                break
            if taken[account] >= account_slots or not ids:
                del queues[account]
                continue
            chosen.append(ids.pop(0))
            taken[account] += 1
    return chosen


def claim(session: Session, *, slots: int, busy: Mapping[str | None, int], account_slots: int, lease_s: float,
          postgres: bool) -> list[Claimed]:
    """The oldest due delivery of up to ``slots`` endpoints, taken fairly across accounts, each
    endpoint leased to this worker (commit before sending).

    An endpoint is leased by moving its ``blocked_until`` one lease ahead, so no worker claims
    any of its deliveries while an attempt is in flight: at most one per endpoint. ``busy``
    counts this worker's attempts in flight per account.
    """
    now = utcnow()
    due = (select(func.min(WebhookDelivery.next_attempt_at))
           .where(WebhookDelivery.endpoint_id == WebhookEndpoint.id, WebhookDelivery.status == PENDING)
           .correlate(WebhookEndpoint).scalar_subquery())
    rows = session.execute(select(WebhookEndpoint.id, WebhookEndpoint.account_name)
                           .where(*_claimable(now), due <= now).order_by(due, WebhookEndpoint.id)).all()
    chosen = fair_order([(r[0], r[1]) for r in rows], slots=slots, busy=busy, account_slots=account_slots)
    if not chosen:
        return []
    q = select(WebhookEndpoint).where(WebhookEndpoint.id.in_(chosen), *_claimable(now)).order_by(WebhookEndpoint.id)
    if postgres:  # another worker's claim holds the row or has moved blocked_until; SQLite serialises writers
        q = q.with_for_update(skip_locked=True)
    out = [c for ep in session.scalars(q).all() if (c := _lease_next(session, ep, now=now, lease_s=lease_s))]
    session.flush()
    return out


def _lease_next(session: Session, ep: WebhookEndpoint, *, now: datetime, lease_s: float) -> Claimed | None:
    """Lease the endpoint (locked by the caller) and its oldest due delivery; None if none is due."""
    d = session.scalars(select(WebhookDelivery).where(
        WebhookDelivery.endpoint_id == ep.id, WebhookDelivery.status == PENDING, WebhookDelivery.next_attempt_at <= now)
        .order_by(WebhookDelivery.next_attempt_at, WebhookDelivery.id).limit(1)).first()
    if d is None:
        ep.blocked_until = None
        return None
    d.attempts += 1
    d.last_attempt_at = now
    d.next_attempt_at = ep.blocked_until = now + timedelta(seconds=lease_s)
    return Claimed(delivery_id=d.id, endpoint_id=ep.id, account=ep.account_name, attempt=d.attempts,
                   msg_id=d.msg_id, payload=d.payload, url=ep.url, secret=ep.secret)


def backoff_s(attempt: int, *, base_s: float, max_s: float, rng: random.Random | None = None) -> float:
    """Exponential backoff with jitter: between half and all of min(max, base * 2^(attempt-1))."""
    ceiling = min(max_s, base_s * 2 ** min(attempt - 1, 40))
    return ceiling * (0.5 + 0.5 * (rng or random).random())


def record(session: Session, *, claimed: Claimed, ok: bool, status_code: int | None, error: str,
           base_s: float, max_s: float, disable_after: int, lease_s: float, more: bool) -> Claimed | None:
    """Store one attempt's outcome as soon as it is known; on success with ``more``, lease the
    endpoint's next due delivery in the same transaction and return it.

    A failure backs off the delivery (by its attempts) and the whole endpoint (by its failures
    in a row), and disables the endpoint after ``disable_after`` failures in a row: its
    ``disabled_reason`` and the failed delivery's ``last_error`` say so.
    """
    now = utcnow()
    ep = session.get(WebhookEndpoint, claimed.endpoint_id, with_for_update=True)  # endpoint first: one lock order
    d = session.get(WebhookDelivery, claimed.delivery_id, with_for_update=True)
    if d is None or ep is None or d.status == DELIVERED:
        return None  # deleted meanwhile, or another worker's later attempt already succeeded
    ours = d.attempts == claimed.attempt  # nobody re-claimed it after the lease ran out
    d.last_status_code = status_code
    if ok:
        d.status, d.delivered_at, d.last_error = DELIVERED, now, ""
        ep.consecutive_failures = 0
        ep.last_success_at = now
    else:
        d.last_error = error
        if ours:
            d.next_attempt_at = now + timedelta(seconds=backoff_s(claimed.attempt, base_s=base_s, max_s=max_s))
        ep.consecutive_failures += 1
        ep.last_error, ep.last_error_at = error, now
        if ep.enabled and ep.consecutive_failures >= disable_after:
            ep.enabled = False
            ep.disabled_at = now
            ep.disabled_reason = f"{ep.consecutive_failures} failed deliveries in a row; last: {error}"
            d.last_error = (f"{error}; the endpoint was disabled after {ep.consecutive_failures} failed "
                            "deliveries in a row")
    nxt = None
    if ours:
        if not ok:
            ep.blocked_until = now + timedelta(seconds=backoff_s(ep.consecutive_failures, base_s=base_s, max_s=max_s))
        elif more and ep.enabled:
            nxt = _lease_next(session, ep, now=now, lease_s=lease_s)
        else:
            ep.blocked_until = None
    session.flush()
    return nxt
