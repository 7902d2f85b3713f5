"""Job sets (arrays, sweeps) and dependencies between jobs (docs/jobs.md, "Workflows")."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    CheckConstraint,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    String,
)
from sqlalchemy.orm import Mapped, mapped_column

from gateway.kit.db import Base, BigIntPK
from gateway.kit.timeutil import utcnow


class JobSet(Base):
    """An array or a sweep: many tasks submitted in one request, each task a Job row."""

    __tablename__ = "job_set"
    __table_args__ = (Index("ix_job_set_account_id", "account_name", "id"),)

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    name: Mapped[str] = mapped_column(String(63))
    account_name: Mapped[str] = mapped_column(String(63), ForeignKey("account.name", ondelete="RESTRICT"))
    submitted_by: Mapped[str] = mapped_column(String(255))
    kind: Mapped[str] = mapped_column(String(16))  # array | sweep
    task_count: Mapped[int] = mapped_column(Integer)
    max_running: Mapped[int | None] = mapped_column(Integer)  # None: no gateway limit
    sweep: Mapped[dict[str, Any] | None] = mapped_column(JSON)  # the parameter lists as submitted
    # The tasks' spec, stored once (issue #27 finding 3): the normalised JobSpec with
    # ``command`` and ``env`` as templates. Each task's job.spec holds only its own values;
    # gateway/models/specs.py renders the whole. NULL for sets written before (their tasks
    # hold their full spec).
    spec: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class JobDependency(Base):
    """``job_id`` waits for one job, or for every task of one set, to reach ``condition``.

    Written once at submit and never changed: a dependency can only name a job or set that
    already existed then, so the graph has no cycles (docs/jobs.md).
    """

    __tablename__ = "job_dependency"
    __table_args__ = (
        Index("ix_job_dependency_job", "job_id"),
        Index("ix_job_dependency_on_job", "on_job_id"),
        Index("ix_job_dependency_on_set", "on_set_id"),
        CheckConstraint("(on_job_id IS NULL) <> (on_set_id IS NULL)", name="one_target"),
    )

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(String(36), ForeignKey("job.id", ondelete="CASCADE"))
    on_job_id: Mapped[str | None] = mapped_column(String(36), ForeignKey("job.id", ondelete="RESTRICT"))
    on_set_id: Mapped[str | None] = mapped_column(String(36), ForeignKey("job_set.id", ondelete="RESTRICT"))
    condition: Mapped[str] = mapped_column(String(16))  # succeeded | finished | failed | started
