"""Ledger tables.

``ledger_entry`` is the truth and is never updated in place. Everything else here is a
materialisation of it, written in the same transaction as the entry:

- ``account_balance``: running totals per account **including its subtree** (a reserve on
  ``team-a`` also adds to ``org``), so the admission check reads one row per ancestor.
- ``ledger_reservation``: the current state of each job's reservation (idempotency).
- ``usage_bucket``: net charges per account (own, not subtree) x pool x UTC day, for
  budgets over a period and usage reports.
- ``fairshare_usage``: decayed usage per account (own), kept current on each charge, so
  the fair-share recompute reads one row per account instead of scanning entries.
"""

from __future__ import annotations

from datetime import date, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    CheckConstraint,
    Date,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    PrimaryKeyConstraint,
    String,
    Text,
)
from sqlalchemy.orm import Mapped, mapped_column

from gateway.kit.db import Base, BigIntPK
from gateway.kit.timeutil import utcnow

ENTRY_KINDS = ("reserve", "start", "usage", "release", "refund", "credit", "debit")


class LedgerEntry(Base):
    """One append-only ledger line. Each numeric column is a signed delta.

    - ``gpus``: change of GPUs held (reserve +, release -).
    - ``committed_gpu_seconds``: change of outstanding commitment (reserve +C; at the end the
      used part moves to ``gpu_seconds`` and the rest is released).
    - ``gpu_seconds``: billing-weighted charge against the budget (usage/debit +, credit/refund -).
    """

    __tablename__ = "ledger_entry"
    __table_args__ = (
        Index("ix_ledger_entry_account_id", "account_name", "id"),
        Index("ix_ledger_entry_job_id", "job_id", "id"),
        Index("ix_ledger_entry_at", "at"),
        CheckConstraint("kind IN ('reserve', 'start', 'usage', 'release', 'refund', 'credit', 'debit')",
                        name="kind_known"),
    )

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    # No foreign keys: the ledger outlives what it talks about (an account renamed or
    # removed by an admin must not rewrite history).
    account_name: Mapped[str] = mapped_column(String(63))
    kind: Mapped[str] = mapped_column(String(16))
    job_id: Mapped[str | None] = mapped_column(String(36))
    pool: Mapped[str | None] = mapped_column(String(63))
    gpu_type: Mapped[str | None] = mapped_column(String(32))
    username: Mapped[str | None] = mapped_column(String(32))
    gpus: Mapped[int] = mapped_column(Integer, default=0)
    committed_gpu_seconds: Mapped[int] = mapped_column(BigInteger, default=0)
    gpu_seconds: Mapped[int] = mapped_column(BigInteger, default=0)
    billing_weight: Mapped[float] = mapped_column(Float, default=1.0)
    actor: Mapped[str] = mapped_column(String(255))
    reason: Mapped[str] = mapped_column(Text, default="")
    data: Mapped[dict[str, Any] | None] = mapped_column(JSON)


class AccountBalance(Base):
    """Running totals of an account and all its descendants."""

    __tablename__ = "account_balance"

    account_name: Mapped[str] = mapped_column(
        String(63), ForeignKey("account.name", ondelete="CASCADE"), primary_key=True)
    reserved_gpus: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    committed_gpu_seconds: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    charged_gpu_seconds: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    queued_jobs: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    updated_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class AccountPoolBalance(Base):
    """GPUs an account and all its descendants hold in one pool (a row per pool used).

    Written under the lock of the account's ``account_balance`` row, like it.
    """

    __tablename__ = "account_pool_balance"
    __table_args__ = (PrimaryKeyConstraint("account_name", "pool", name="pk_account_pool_balance"),)

    account_name: Mapped[str] = mapped_column(String(63), ForeignKey("account.name", ondelete="CASCADE"))
    pool: Mapped[str] = mapped_column(String(63))
    reserved_gpus: Mapped[int] = mapped_column(Integer, default=0, server_default="0")


class Reservation(Base):
    """Where a job's reservation stands: reserved -> started -> finished, or released."""

    __tablename__ = "ledger_reservation"
    __table_args__ = (
        Index("ix_ledger_reservation_account_status", "account_name", "status"),
        Index("ix_ledger_reservation_user_status", "username", "status"),
        CheckConstraint("status IN ('reserved', 'started', 'finished', 'released')", name="status_known"),
    )

    job_id: Mapped[str] = mapped_column(String(36), primary_key=True)
    account_name: Mapped[str] = mapped_column(String(63))
    username: Mapped[str] = mapped_column(String(32))
    pool: Mapped[str] = mapped_column(String(63))
    gpu_type: Mapped[str | None] = mapped_column(String(32))
    gpus: Mapped[int] = mapped_column(Integer)
    time_limit_s: Mapped[int] = mapped_column(Integer)
    billing_weight: Mapped[float] = mapped_column(Float, default=1.0)
    committed_gpu_seconds: Mapped[int] = mapped_column(BigInteger)
    status: Mapped[str] = mapped_column(String(16))
    reserved_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    ended_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    used_gpu_seconds: Mapped[int] = mapped_column(BigInteger, default=0)
    # Usage charged while the current run is still going (accrue_usage); the end charges the rest.
    accrued_gpu_seconds: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    accrued_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # When the backend last requeued the job (record_requeue); a later run never starts before it.
    requeued_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class UsageBucket(Base):
    """Net charge of one account (own jobs only) in one pool on one UTC day.

    ``pool`` is "" for admin credits/debits not tied to a pool.
    """

    __tablename__ = "usage_bucket"
    __table_args__ = (PrimaryKeyConstraint("account_name", "day", "pool", name="pk_usage_bucket"),)

    account_name: Mapped[str] = mapped_column(String(63))
    day: Mapped[date] = mapped_column(Date)
    pool: Mapped[str] = mapped_column(String(63))
    gpu_seconds: Mapped[int] = mapped_column(BigInteger, default=0)
    usage_gpu_seconds: Mapped[int] = mapped_column(BigInteger, default=0)  # job usage only
    adjustment_gpu_seconds: Mapped[int] = mapped_column(BigInteger, default=0)  # credit/debit/refund
    jobs: Mapped[int] = mapped_column(Integer, default=0)


class FairshareUsage(Base):
    """Decayed usage of one account's own jobs, valid at ``decayed_at``.

    value(T) = decayed_gpu_seconds * 2^(-(T - decayed_at) / half_life).
    """

    __tablename__ = "fairshare_usage"

    account_name: Mapped[str] = mapped_column(String(63), primary_key=True)
    decayed_gpu_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    decayed_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class GpuBillingWeight(Base):
    """Billing weight of a GPU type in a pool (``gpu_type`` "*" = the pool's default)."""

    __tablename__ = "gpu_billing_weight"
    __table_args__ = (
        PrimaryKeyConstraint("pool", "gpu_type", name="pk_gpu_billing_weight"),
        CheckConstraint("weight > 0 AND weight <= 1000", name="weight_range"),
    )

    pool: Mapped[str] = mapped_column(String(63))
    gpu_type: Mapped[str] = mapped_column(String(32))
    weight: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
