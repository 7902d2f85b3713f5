"""Accounts: a tree (organisation -> team -> sub-team) with shares, members and quotas."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    DateTime,
    ForeignKey,
    Integer,
    PrimaryKeyConstraint,
    String,
    Text,
    func,
)
from sqlalchemy.orm import Mapped, mapped_column

from gateway.kit.db import Base
from gateway.kit.timeutil import utcnow

MEMBER_ROLES = ("member", "coordinator")
BUDGET_PERIODS = ("month", "rolling")


class Account(Base):
    """A chargeable account (organisation, team, sub-team). Its name is its id."""

    __tablename__ = "account"
    __table_args__ = (CheckConstraint("shares >= 0", name="shares_non_negative"),)

    name: Mapped[str] = mapped_column(String(63), primary_key=True)
    parent_name: Mapped[str | None] = mapped_column(
        String(63), ForeignKey("account.name", ondelete="RESTRICT"), index=True)
    shares: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    description: Mapped[str] = mapped_column(Text, default="", server_default="")
    # Kueue WorkloadPriorityClass of the account's jobs, set by an administrator only (a
    # user's job priority never picks it: the class decides whom the shared ClusterQueue
    # preempts). NULL: the backend's default class.
    priority_class: Mapped[str | None] = mapped_column(String(253))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class AccountMember(Base):
    """A user recorded as member or coordinator of an account.

    Request-time authorisation comes from the token's groups (``Principal.accounts``);
    these rows are the administrators' register (views, exports, coordinator role).
    """

    __tablename__ = "account_member"
    __table_args__ = (
        PrimaryKeyConstraint("account_name", "username", name="pk_account_member"),
        CheckConstraint("role IN ('member', 'coordinator')", name="role_known"),
    )

    account_name: Mapped[str] = mapped_column(String(63), ForeignKey("account.name", ondelete="CASCADE"))
    username: Mapped[str] = mapped_column(String(32), index=True)
    role: Mapped[str] = mapped_column(String(16), default="member")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class AccountQuota(Base):
    """Limits of one account; NULL means "not set here" (the nearest ancestor's applies).

    A limit set on an account caps the sum over its whole subtree.
    """

    __tablename__ = "account_quota"
    __table_args__ = (
        CheckConstraint("max_gpus IS NULL OR max_gpus >= 0", name="max_gpus_non_negative"),
        CheckConstraint("budget_gpu_seconds IS NULL OR budget_gpu_seconds >= 0", name="budget_non_negative"),
        CheckConstraint("budget_period IN ('month', 'rolling')", name="budget_period_known"),
        CheckConstraint("budget_window_days >= 1", name="budget_window_positive"),
        CheckConstraint("max_queued_jobs IS NULL OR max_queued_jobs >= 0", name="max_queued_non_negative"),
        CheckConstraint("max_queued_jobs_per_user IS NULL OR max_queued_jobs_per_user >= 0",
                        name="max_queued_per_user_non_negative"),
        CheckConstraint("guaranteed_gpus IS NULL OR guaranteed_gpus >= 0", name="guaranteed_gpus_non_negative"),
    )

    account_name: Mapped[str] = mapped_column(
        String(63), ForeignKey("account.name", ondelete="CASCADE"), primary_key=True)
    max_gpus: Mapped[int | None] = mapped_column(Integer)
    # GPUs the subtree's work may hold without ever being preempted by another account's
    # (docs/recovery.md, "Guaranteed and borrowed GPUs"); work beyond it runs borrowed.
    guaranteed_gpus: Mapped[int | None] = mapped_column(Integer)
    budget_gpu_seconds: Mapped[int | None] = mapped_column(BigInteger)
    budget_period: Mapped[str] = mapped_column(String(16), default="month", server_default="month")
    budget_window_days: Mapped[int] = mapped_column(Integer, default=30, server_default="30")
    max_queued_jobs: Mapped[int | None] = mapped_column(Integer)
    max_queued_jobs_per_user: Mapped[int | None] = mapped_column(Integer)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, onupdate=utcnow)
    updated_by: Mapped[str] = mapped_column(String(255), default="")


class AccountPoolQuota(Base):
    """Concurrent-GPU limit (on top of ``max_gpus``) and guarantee of one account (its whole
    subtree) in one pool."""

    __tablename__ = "account_pool_quota"
    __table_args__ = (
        PrimaryKeyConstraint("account_name", "pool", name="pk_account_pool_quota"),
        CheckConstraint("max_gpus IS NULL OR max_gpus >= 0", name="max_gpus_non_negative"),
        CheckConstraint("guaranteed_gpus IS NULL OR guaranteed_gpus >= 0", name="guaranteed_gpus_non_negative"),
    )

    account_name: Mapped[str] = mapped_column(String(63), ForeignKey("account.name", ondelete="CASCADE"))
    pool: Mapped[str] = mapped_column(String(63))
    max_gpus: Mapped[int | None] = mapped_column(Integer)
    guaranteed_gpus: Mapped[int | None] = mapped_column(Integer)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, onupdate=utcnow)
    updated_by: Mapped[str] = mapped_column(String(255), default="")
