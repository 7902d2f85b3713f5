"""The audit log's one writer and its reads (docs/ledger.md, "Audit log").

Every privileged change (accounts, quotas, members, ledger adjustments, pools, windows,
reservations, webhook endpoints) calls :func:`record` from the service function that makes
it, in the same transaction: the change and its record commit together or not at all.

The chain: each record's ``hash`` is sha256 over a canonical JSON of its fields plus
``prev_hash``, the hash of the record before it. Appends are serialised so the chain never
forks: on Postgres a transaction-scoped advisory lock is taken before the last hash is read
(held until the change commits); SQLite has one writer at a time anyway (``BEGIN IMMEDIATE``).
:func:`verify` walks the chain oldest first and names the first record that does not hold.

This package sits just above the tables (tests/layout/test_import_cycles.py) so that the
pools', accounts', ledger's and webhooks' services can all call it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Iterator
from datetime import date, datetime
from typing import Any

from sqlalchemy import delete, func, select, text
from sqlalchemy.orm import Session

from gateway.kit.logs import REQUEST_ID
from gateway.kit.timeutil import as_utc, utcnow
from gateway.models.audit import AuditRecord

# Serialises appends on Postgres (one bigint key; the dispatchers' two-key locks are another space).
_CHAIN_LOCK = text("SELECT pg_advisory_xact_lock(hashtextextended('isthmus.audit.chain', 0))")
# Keys whose values are never written to the log, whatever the caller hands in: the whole key
# must match (a key merely containing "token", e.g. "tokens_used", is kept).
SECRET_KEY = re.compile(r"(?i)(?:[a-z0-9]+_)*(?:secret|password|passphrase|token|credentials?|private_key|api_key)")
REDACTED = "[redacted]"


@dataclasses.dataclass(frozen=True)
class Who:
    """Who made a change: the caller's token subject and POSIX user, or the gateway itself
    (``Who.system("reconcile")`` -> subject ``system:reconcile``)."""

    subject: str
    username: str = ""

    @classmethod
    def system(cls, what: str) -> Who:
        return cls(subject=f"system:{what}")


def _default(value: Any) -> Any:
    if isinstance(value, datetime):
        return as_utc(value).isoformat()
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, (set, frozenset, tuple)):
        return sorted(value, key=str) if isinstance(value, (set, frozenset)) else list(value)
    return str(value)


def _redact(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: (REDACTED if isinstance(k, str) and SECRET_KEY.fullmatch(k) else _redact(v))
                for k, v in value.items()}
    if isinstance(value, list):
        return [_redact(v) for v in value]
    return value


def plain(value: Any) -> Any:
    """``value`` as the JSON the record stores (and hashes): dates as ISO strings, secrets redacted."""
    if value is None:
        return None
    return _redact(json.loads(json.dumps(value, default=_default)))


def _at_text(at: datetime) -> str:
    return as_utc(at).isoformat(timespec="microseconds")


def digest(row: Any) -> str:
    """The record's hash: sha256 over its fields and ``prev_hash``, as canonical JSON (sorted
    keys, no spaces, UTF-8). The id is not in it: a removed record shows as the next one's
    ``prev_hash`` no longer matching."""
    doc = {"at": _at_text(row.at), "subject": row.subject, "username": row.username,
           "request_id": row.request_id, "action": row.action, "target_kind": row.target_kind,
           "target_name": row.target_name, "account": row.account, "before": row.before, "after": row.after,
           "prev_hash": row.prev_hash}
    canonical = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _last_hash(session: Session) -> str:
    if session.get_bind().dialect.name == "postgresql":
        session.execute(_CHAIN_LOCK)
    return session.scalar(select(AuditRecord.hash).order_by(AuditRecord.id.desc()).limit(1)) or ""


def record(session: Session, *, by: Who, action: str, target_kind: str, target_name: str,
           account: str | None = None, before: Any = None, after: Any = None,
           now: datetime | None = None) -> AuditRecord:
    """Append one record of a change made in this transaction. ``before`` / ``after``: the
    changed thing as plain values (None: it did not exist / no longer exists)."""
    session.flush()  # the change first: a refused change raises before anything is recorded
    row = AuditRecord(at=now or utcnow(), subject=by.subject[:255], username=(by.username or "")[:64],
                      request_id=(REQUEST_ID.get() or "")[:64], action=action, target_kind=target_kind,
                      target_name=str(target_name)[:255], account=account, before=plain(before), after=plain(after))
    row.prev_hash = _last_hash(session)
    row.hash = digest(row)
    session.add(row)
    session.flush()
    return row


# ----------------------------------------------------------------- reading


def list_(session: Session, *, actions: list[str] | None = None, account: str | None = None,
          subject: str | None = None, since: datetime | None = None, until: datetime | None = None,
          before_id: int | None = None, limit: int = 100) -> list[AuditRecord]:
    """Records newest first, filtered. An action ending in ``.*`` is a prefix (``account.*``)."""
    q = select(AuditRecord)
    if actions:
        exact = [a for a in actions if not a.endswith(".*")]
        prefixes = [a[:-1] for a in actions if a.endswith(".*")]
        from sqlalchemy import or_

        q = q.where(or_(*([AuditRecord.action.in_(exact)] if exact else []),
                        *(AuditRecord.action.startswith(p, autoescape=True) for p in prefixes)))
    if account is not None:
        q = q.where(AuditRecord.account == account)
    if subject is not None:
        q = q.where(AuditRecord.subject == subject)
    if since is not None:
        q = q.where(AuditRecord.at >= since)
    if until is not None:
        q = q.where(AuditRecord.at < until)
    if before_id is not None:
        q = q.where(AuditRecord.id < before_id)
    return list(session.scalars(q.order_by(AuditRecord.id.desc()).limit(limit)))


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What :func:`verify` found. ``broken_id``: the first record that does not hold (None: all do)."""

    checked: int
    first_id: int | None
    last_id: int | None
    broken_id: int | None = None
    reason: str = ""
    starts_after_prune: bool = False

    @property
    def ok(self) -> bool:
        return self.broken_id is None


def _oldest_first(session: Session, batch: int = 1000) -> Iterator[Any]:
    """Every record as a plain row (not ORM objects: a long log is walked in constant memory)."""
    columns = AuditRecord.__table__.c
    after = 0
    while True:
        rows = session.execute(select(*columns).where(columns.id > after).order_by(columns.id).limit(batch)).all()
        if not rows:
            return
        yield from rows
        after = rows[-1].id


def verify(session: Session) -> Verdict:
    """Walk the chain oldest first: each record's hash must be its fields' and each
    ``prev_hash`` the hash of the record before it. The oldest kept record's ``prev_hash`` is
    trusted: it is "" for the first record ever, or the hash of a record retention pruned."""
    checked, first, last, prev, pruned = 0, None, None, None, False
    for row in _oldest_first(session):
        if first is None:
            first, pruned = row.id, row.prev_hash != ""
        elif row.prev_hash != prev:
            return Verdict(checked, first, last, row.id, "its prev_hash is not the hash of the record before it "
                                                         "(that record was changed or removed)", pruned)
        if digest(row) != row.hash:
            return Verdict(checked, first, last, row.id, "its fields do not match its hash (it was changed)", pruned)
        checked, last, prev = checked + 1, row.id, row.hash
    return Verdict(checked, first, last, starts_after_prune=pruned)


def prune(session: Session, *, retention_days: int, by: Who, now: datetime | None = None) -> int:
    """Delete the records older than ``retention_days`` (0: keep forever); return how many.

    The chain stays verifiable: the oldest kept record still carries the hash of the last one
    deleted, which :func:`verify` trusts. The pruning itself is recorded (with that hash)."""
    if retention_days <= 0:
        return 0
    from datetime import timedelta

    _last_hash(session)  # on Postgres: the chain's lock, before reading what to cut
    now = now or utcnow()
    cut = now - timedelta(days=retention_days)
    last_cut = session.scalar(select(func.max(AuditRecord.id)).where(AuditRecord.at < cut))
    if last_cut is None:
        return 0
    # Keep the newest record whatever its age: the next append chains to it.
    newest = session.scalar(select(func.max(AuditRecord.id)))
    last_cut = min(last_cut, newest - 1)
    if last_cut <= 0:
        return 0
    anchor = session.scalar(select(AuditRecord.hash).where(AuditRecord.id == last_cut))
    done = session.execute(delete(AuditRecord).where(AuditRecord.id <= last_cut))
    n = done.rowcount or 0
    record(session, by=by, action="audit.prune", target_kind="audit", target_name="audit_record",
           after={"deleted": n, "through_id": last_cut, "through_hash": anchor, "retention_days": retention_days},
           now=now)
    return n
