"""HTTP only: the audit log. /v1/admin/audit (admins: every record, the chain's check, retention)
and /v1/accounts/{account}/audit (the account's coordinators, and admins: its records)."""

from __future__ import annotations

import base64
import binascii
import re
from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from sqlalchemy.orm import Session

from gateway.accounts import service as accounts
from gateway.audit import service as audit
from gateway.audit.schemas import (
    AuditPage,
    AuditPruneOut,
    AuditRecordOut,
    AuditVerifyOut,
)
from gateway.identity.dependency import get_principal, require_admin
from gateway.identity.principal import Principal
from gateway.kit.db import get_session
from gateway.kit.errors import Forbidden, Invalid, NotFound, problem_responses
from gateway.kit.names import ACCOUNT_NAME_RE
from gateway.kit.params import AccountName
from gateway.kit.timeutil import as_utc

admin_router = APIRouter(prefix="/v1/admin/audit", tags=["admin"], dependencies=[Depends(require_admin)])
account_router = APIRouter(prefix="/v1/accounts/{account}/audit", tags=["accounts"])

ACTION = re.compile(r"[a-z_]+(\.[a-z_]+)*(\.\*)?")
Session_ = Annotated[Session, Depends(get_session, scope="function")]
Actions = Annotated[list[str] | None, Query(description="Repeatable; `account.*` matches every action under it.")]
Since = Annotated[datetime | None, Query(description="Records at or after (ISO 8601).")]
Until = Annotated[datetime | None, Query(description="Records before (ISO 8601).")]
Cursor = Annotated[str | None, Query(max_length=128)]
Limit = Annotated[int, Query(ge=1, le=1000)]


def _cursor(last_id: int) -> str:
    return base64.urlsafe_b64encode(f"au:{last_id}".encode()).decode().rstrip("=")


def _uncursor(cursor: str) -> int:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode("ascii")
        if not raw.startswith("au:"):
            raise ValueError
        return int(raw[3:])
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise Invalid("query.cursor", "not a cursor returned by this API") from None


def _page(session: Session, *, actions: list[str] | None, account: str | None, subject: str | None,
          since: datetime | None, until: datetime | None, cursor: str | None, limit: int) -> AuditPage:
    for a in actions or []:
        if len(a) > 64 or not ACTION.fullmatch(a):
            raise Invalid("query.action", "an action like account.quota.set, or a prefix like account.*")
    since, until = as_utc(since), as_utc(until)
    if since and until and until <= since:
        raise Invalid("query.until", "must be after `since`")
    rows = audit.list_(session, actions=actions, account=account, subject=subject, since=since, until=until,
                       before_id=_uncursor(cursor) if cursor else None, limit=limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    return AuditPage(items=[_out(r) for r in rows], next_cursor=_cursor(rows[-1].id) if more else None)


def _out(r) -> AuditRecordOut:
    return AuditRecordOut(id=r.id, at=as_utc(r.at), subject=r.subject, username=r.username, request_id=r.request_id,
                          action=r.action, target_kind=r.target_kind, target_name=r.target_name, account=r.account,
                          before=r.before, after=r.after, prev_hash=r.prev_hash, hash=r.hash)


@admin_router.get("", response_model=AuditPage, operation_id="listAuditRecords", summary="Read the audit log",
                  description="Every privileged change (accounts, quotas, members, credits, pools, windows, "
                              "reservations, webhook endpoints), newest first, filtered; follow `next_cursor` for "
                              "older records. docs/ledger.md, \"Audit log\".",
                  responses=problem_responses(401, 403, 422))
def list_audit(session: Session_, action: Actions = None,
               account: Annotated[str | None, Query(pattern=ACCOUNT_NAME_RE)] = None,
               subject: Annotated[str | None, Query(max_length=255)] = None,
               since: Since = None, until: Until = None, cursor: Cursor = None, limit: Limit = 100) -> AuditPage:
    return _page(session, actions=action, account=account, subject=subject, since=since, until=until, cursor=cursor,
                 limit=limit)


@admin_router.get("/verify", response_model=AuditVerifyOut, operation_id="verifyAuditLog",
                  summary="Check the audit log's hash chain",
                  description="Walks every kept record oldest first: each must hash to its `hash`, and carry the "
                              "hash of the record before it. A record changed or removed in the database shows as "
                              "`ok: false` with the first record that does not hold (`broken_id`).",
                  responses=problem_responses(401, 403))
def verify_audit(session: Session_) -> AuditVerifyOut:
    v = audit.verify(session)
    return AuditVerifyOut(ok=v.ok, checked=v.checked, first_id=v.first_id, last_id=v.last_id, broken_id=v.broken_id,
                          reason=v.reason, starts_after_prune=v.starts_after_prune)


@admin_router.post("/prune", response_model=AuditPruneOut, operation_id="pruneAuditLog",
                   summary="Delete audit records older than the retention",
                   description="Deletes the records older than `ISTHMUS_AUDIT_RETENTION_DAYS` (none when it is 0) "
                               "and records that it did; the chain stays verifiable from the oldest kept record.",
                   responses=problem_responses(401, 403))
def prune_audit(request: Request, session: Session_, principal: Principal = Depends(require_admin)) -> AuditPruneOut:
    days = request.app.state.settings.audit_retention_days
    return AuditPruneOut(deleted=audit.prune(session, retention_days=days, by=principal.who), retention_days=days)


@account_router.get("", response_model=AuditPage, operation_id="listAccountAuditRecords",
                    summary="An account's part of the audit log",
                    description="The privileged changes that concern the account (its quotas, members, credits, "
                                "reservations, webhook endpoints), newest first. For the account's coordinators "
                                "(and the coordinators of an account above it) and admins; other members get 403.",
                    responses=problem_responses(401, 403, 404, 422))
def list_account_audit(account: AccountName, session: Session_, principal: Principal = Depends(get_principal),
                       action: Actions = None, subject: Annotated[str | None, Query(max_length=255)] = None,
                       since: Since = None, until: Until = None, cursor: Cursor = None,
                       limit: Limit = 100) -> AuditPage:
    if not principal.is_admin:
        coordinated = accounts.visible_accounts(session, accounts=frozenset(), username=principal.username,
                                                is_admin=False)
        if account not in coordinated:
            visible = accounts.visible_accounts(session, accounts=principal.accounts, username=principal.username,
                                                is_admin=False)
            if account in visible:
                raise Forbidden(f"the audit log of {account!r} is for its coordinators")
            raise NotFound(f"no account {account!r} visible to you")
    elif not accounts.exists(session, account):
        raise NotFound(f"no account {account!r}")
    return _page(session, actions=action, account=account, subject=subject, since=since, until=until, cursor=cursor,
                 limit=limit)
