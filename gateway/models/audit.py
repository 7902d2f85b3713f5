"""The audit log (issue #49, item 4; docs/ledger.md "Audit log"): one row per privileged change,
written in the change's own transaction by gateway/audit/service.py, its one writer.

Append-only by rule, tamper-evident by construction: each row carries the hash of the row
before it (``prev_hash``) and its own (``hash``, sha256 over a canonical JSON of its fields and
``prev_hash``), so a row changed or removed in SQL breaks the chain that ``isthmus admin audit
verify`` walks. No foreign keys: a record outlives the account, pool or endpoint it names.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, DateTime, Index, String
from sqlalchemy.orm import Mapped, mapped_column

from gateway.kit.db import Base, BigIntPK


class AuditRecord(Base):
    __tablename__ = "audit_record"
    __table_args__ = (
        # A coordinator's read (their account's records, newest first) and the retention's cut.
        Index("ix_audit_record_account_id", "account", "id"),
        Index("ix_audit_record_at", "at"),
    )

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    subject: Mapped[str] = mapped_column(String(255))  # the token's subject, or "system:<what>"
    username: Mapped[str] = mapped_column(String(64), default="")  # the caller's POSIX user ("" for the system)
    request_id: Mapped[str] = mapped_column(String(64), default="")  # the X-Request-ID ("" outside a request)
    action: Mapped[str] = mapped_column(String(64))  # e.g. account.quota.set
    target_kind: Mapped[str] = mapped_column(String(32))  # account, pool, window, reservation, webhook, ledger
    target_name: Mapped[str] = mapped_column(String(255))
    account: Mapped[str | None] = mapped_column(String(63))  # the account it concerns (coordinators read by it)
    before: Mapped[Any] = mapped_column(JSON, nullable=True)
    after: Mapped[Any] = mapped_column(JSON, nullable=True)
    prev_hash: Mapped[str] = mapped_column(String(64), default="")  # "" for the first record ever
    hash: Mapped[str] = mapped_column(String(64))
