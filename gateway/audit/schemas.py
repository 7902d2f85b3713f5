"""Wire models of the audit log (GET /v1/admin/audit, GET /v1/accounts/{account}/audit)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field


class AuditRecordOut(BaseModel):
    """One privileged change: who made it, when, what it changed from and to."""

    id: int
    at: datetime
    subject: str = Field(description="The caller's token subject, or `system:<what>` for the gateway's own changes.")
    username: str = Field(description="The caller's POSIX user (empty for the gateway's own changes).")
    request_id: str = Field(description="The request's `X-Request-ID` (empty outside a request).")
    action: str = Field(description="What was done, e.g. `account.quota.set`, `pool.update`, `ledger.adjust`.")
    target_kind: str = Field(description="account, member, pool, window, reservation, webhook, ledger_entry, audit.")
    target_name: str
    account: str | None = Field(description="The account the change concerns, if any.")
    before: Any = Field(description="The thing before the change (null: it did not exist). Secrets are never "
                                    "recorded.")
    after: Any = Field(description="The thing after the change (null: it was removed).")
    prev_hash: str = Field(description="The hash of the record before this one.")
    hash: str = Field(description="sha256 over this record's fields and `prev_hash` (docs/ledger.md).")


class AuditPage(BaseModel):
    items: list[AuditRecordOut] = Field(description="Newest first.")
    next_cursor: str | None = Field(description="Pass as `cursor` for the next (older) page; null: no more.")


class AuditVerifyOut(BaseModel):
    """The chain walked oldest first. `ok` false: `broken_id` is the first record that does not hold."""

    ok: bool
    checked: int = Field(description="Records that held, from the oldest kept one.")
    first_id: int | None
    last_id: int | None = Field(description="The last record that held.")
    broken_id: int | None = None
    reason: str = ""
    starts_after_prune: bool = Field(description="The oldest kept record follows records retention removed: its "
                                                 "`prev_hash` is trusted as the chain's start.")


class AuditPruneOut(BaseModel):
    deleted: int
    retention_days: int = Field(description="ISTHMUS_AUDIT_RETENTION_DAYS (0: records are kept forever).")
