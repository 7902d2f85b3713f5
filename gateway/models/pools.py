"""The ``pool`` table: every pool the gateway knows, configured now or in the past.

Written at start-up from the pools' configuration (gateway/pools/service.py ``reconcile``)
and by administrators (``PATCH /v1/admin/pools/{name}``: state and routing weight). An
admin's choice wins over the file's on later start-ups (``state_by`` / ``weight_by`` name
who set it; "" means the configuration did). Adapter settings are never stored here: they
may name credentials.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    JSON,
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    Index,
    Integer,
    String,
    true,
)
from sqlalchemy.orm import Mapped, mapped_column

from gateway.kit.db import Base
from gateway.kit.names import POOL_NAME_LEN
from gateway.kit.timeutil import utcnow


class Pool(Base):
    __tablename__ = "pool"
    __table_args__ = (
        CheckConstraint("kind IN ('slurm', 'kubernetes')", name="kind_known"),
        CheckConstraint("state IN ('active', 'draining', 'disabled')", name="state_known"),
        CheckConstraint("weight > 0", name="weight_positive"),
        CheckConstraint("cost > 0 AND cost <= 1000", name="cost_range"),
    )

    name: Mapped[str] = mapped_column(String(POOL_NAME_LEN), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))
    gpu_types: Mapped[list[str]] = mapped_column(JSON, default=list)
    weight: Mapped[float] = mapped_column(Float, default=1.0, server_default="1")
    cost: Mapped[float] = mapped_column(Float, default=1.0, server_default="1")
    state: Mapped[str] = mapped_column(String(16), default="active", server_default="active")
    state_by: Mapped[str] = mapped_column(String(255), default="", server_default="")
    weight_by: Mapped[str] = mapped_column(String(255), default="", server_default="")
    # False: no longer in the configuration (kept for history, quotas and reports).
    configured: Mapped[bool] = mapped_column(Boolean, default=True, server_default=true())
    # The pool's static limits as the dispatcher last saw them (gateway/domain/routing.py
    # PoolView.limits) and when: a process without a dispatcher checks never-fits on them.
    limits: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    limits_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, onupdate=utcnow)


class PoolWindow(Base):
    """A maintenance window an admin set on a pool (docs/planning.md): from ``starts_at`` to
    ``ends_at`` the pool, or only ``nodes`` of it, runs nothing of the gateway's. The planner
    never starts a gang whose time limit would cross it on the capacity it takes."""

    __tablename__ = "pool_window"
    __table_args__ = (
        CheckConstraint("ends_at > starts_at", name="ends_after_start"),
        Index("ix_pool_window_pool_end", "pool", "ends_at"),
    )

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    pool: Mapped[str] = mapped_column(String(POOL_NAME_LEN))  # checked on write (no FK, like quotas)
    starts_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    ends_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    reason: Mapped[str] = mapped_column(String(200))
    nodes: Mapped[list[str]] = mapped_column(JSON, default=list)  # [] = the whole pool
    created_by: Mapped[str] = mapped_column(String(255))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class AdvanceReservation(Base):
    """Capacity of a pool held for an account from ``starts_at`` to ``ends_at`` (docs/planning.md).

    ``gpus`` or ``nodes`` (exactly one). During it only the account's gangs use the held
    capacity (first); to everyone else it is a window. The gateway holds it in its own planner
    on every kind of pool, and where the backend can (Slurm) it also makes a reservation there:
    ``native`` is its name once the backend has it, ``native_note`` what became of it in words."""

    __tablename__ = "advance_reservation"
    __table_args__ = (
        CheckConstraint("ends_at > starts_at", name="ends_after_start"),
        CheckConstraint("(gpus IS NULL) <> (nodes IS NULL)", name="gpus_or_nodes"),
        CheckConstraint("COALESCE(gpus, nodes) > 0", name="positive"),
        Index("ix_advance_reservation_end", "ends_at"),
    )

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    pool: Mapped[str] = mapped_column(String(POOL_NAME_LEN))  # checked on write (no FK, like quotas)
    account: Mapped[str] = mapped_column(String(63))
    gpus: Mapped[int | None] = mapped_column(Integer, nullable=True)
    nodes: Mapped[int | None] = mapped_column(Integer, nullable=True)
    starts_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    ends_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    reason: Mapped[str] = mapped_column(String(200))
    created_by: Mapped[str] = mapped_column(String(255))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    native: Mapped[str | None] = mapped_column(String(80), nullable=True)
    native_note: Mapped[str] = mapped_column(String(500), default="", server_default="")
