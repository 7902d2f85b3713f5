"""Webhook endpoints, the outbox cursor over ``job_event`` and one row per delivery."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column

from gateway.kit.db import Base, BigIntPK
from gateway.kit.timeutil import utcnow


class WebhookEndpoint(Base):
    """An HTTPS receiver of one account's job events (``account_name`` NULL: an admin's, all accounts)."""

    __tablename__ = "webhook_endpoint"
    __table_args__ = (Index("ix_webhook_endpoint_account", "account_name", "id"),)

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    account_name: Mapped[str | None] = mapped_column(String(63), ForeignKey("account.name", ondelete="CASCADE"))
    url: Mapped[str] = mapped_column(Text)
    description: Mapped[str] = mapped_column(Text, default="")
    # The signing secret ("whsec_" + base64). Needed in clear to sign; shown once, never logged.
    secret: Mapped[str] = mapped_column(String(128))
    created_by: Mapped[str] = mapped_column(String(255))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    enabled: Mapped[bool] = mapped_column(default=True)
    consecutive_failures: Mapped[int] = mapped_column(Integer, default=0)
    last_error: Mapped[str] = mapped_column(Text, default="")
    last_error_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    last_success_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    disabled_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    disabled_reason: Mapped[str] = mapped_column(Text, default="")
    # Nothing of this endpoint is claimed before this instant: the lease of the attempt in
    # flight (at most one per endpoint, across workers), or the backoff after a failure.
    blocked_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # The subject whose hold on the account keeps the endpoint alive: its creator, or whoever
    # re-enabled it last. When they no longer hold the account the endpoint is suspended.
    held_by: Mapped[str] = mapped_column(String(255), default="", server_default="")
    # Set (with enabled False) while suspended for that reason: a suspended endpoint is sent
    # nothing, not even queued; re-enabling clears it and makes the caller its holder.
    suspended_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # Events from before this instant are not sent to it: its creation, or its re-enabling
    # after a suspension (what happened while suspended is never sent).
    events_from_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

    def __repr__(self) -> str:  # never the secret
        return f"WebhookEndpoint(id={self.id}, account={self.account_name!r}, enabled={self.enabled})"


class WebhookCursor(Base):
    """How far the fan-out has read ``job_event`` (one row, locked while fanning out)."""

    __tablename__ = "webhook_cursor"

    name: Mapped[str] = mapped_column(String(32), primary_key=True)
    last_event_id: Mapped[int] = mapped_column(BigInteger)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class WebhookDelivery(Base):
    """One event for one endpoint: the exact body, its attempts and where it stands.

    ``next_attempt_at`` is also the claim lease: a worker that claims a delivery moves it
    ``webhook_lease_s`` ahead, so a worker that dies mid-send leaves it due again later.
    """

    __tablename__ = "webhook_delivery"
    __table_args__ = (
        UniqueConstraint("endpoint_id", "event_id", name="uq_webhook_delivery_endpoint_id"),
        Index("ix_webhook_delivery_due", "status", "next_attempt_at"),
        Index("ix_webhook_delivery_endpoint", "endpoint_id", "id"),
        Index("ix_webhook_delivery_endpoint_due", "endpoint_id", "status", "next_attempt_at"),
    )

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    endpoint_id: Mapped[int] = mapped_column(BigInteger, ForeignKey("webhook_endpoint.id", ondelete="CASCADE"))
    event_id: Mapped[int] = mapped_column(BigInteger)  # job_event.id (no foreign key: a delivery outlives its job)
    msg_id: Mapped[str] = mapped_column(String(64))  # the webhook-id header: the same on every retry
    event_type: Mapped[str] = mapped_column(String(64))
    job_id: Mapped[str] = mapped_column(String(36))
    payload: Mapped[str] = mapped_column(Text)  # the exact JSON body, so every retry signs the same bytes
    status: Mapped[str] = mapped_column(String(16), default="pending")  # pending | delivered
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    next_attempt_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    last_attempt_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    last_status_code: Mapped[int | None] = mapped_column(Integer)
    last_error: Mapped[str] = mapped_column(Text, default="")
    delivered_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
