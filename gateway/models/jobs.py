from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column, validates

from gateway.domain.states import JobState, check_transition
from gateway.kit.db import Base, BigIntPK
from gateway.kit.names import POOL_NAME_LEN
from gateway.kit.timeutil import utcnow

STATE_LEN = 16


class Job(Base):
    __tablename__ = "job"
    __table_args__ = (
        # The dispatcher's queue: pending jobs per account by priority then age
        # (gateway/dispatch/claim.py pending_order); also serves the distinct-account scan.
        Index("ix_job_queue", "state", "account_name", text("priority DESC"), "id"),
        Index("ix_job_account_id", "account_name", "id"),
        # A list filtered by state, newest first (jobs/repository.py list_readable; issue #32).
        Index("ix_job_account_state_id", "account_name", "state", "id"),
        # A set's tasks by state (summary, max_running, the next blocked task to release).
        Index("ix_job_set_state", "job_set_id", "state", "array_index"),
    )

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    name: Mapped[str] = mapped_column(String(63))
    account_name: Mapped[str] = mapped_column(String(63), ForeignKey("account.name", ondelete="RESTRICT"))
    submitted_by: Mapped[str] = mapped_column(String(255))  # principal subject
    username: Mapped[str] = mapped_column(String(32))  # POSIX user the job runs as
    requested_pool: Mapped[str] = mapped_column(String(63))  # auto | a pool name
    pool: Mapped[str | None] = mapped_column(String(63))  # the pool it was routed to
    state: Mapped[str] = mapped_column(String(STATE_LEN))
    state_reason: Mapped[str] = mapped_column(Text, default="")
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)  # the normalised JobSpec
    workers: Mapped[int] = mapped_column(Integer)
    gpus_per_worker: Mapped[int] = mapped_column(Integer)
    total_gpus: Mapped[int] = mapped_column(Integer)
    # GPUs the gang holds (and is charged for) on the pool it was routed to: on a node-exclusive
    # pool whole nodes x GPUs per node, whatever it asked for. NULL until dispatched.
    held_gpus: Mapped[int | None] = mapped_column(Integer)
    time_limit_s: Mapped[int] = mapped_column(Integer)
    priority: Mapped[int] = mapped_column(Integer, default=0)
    backend_job_id: Mapped[str | None] = mapped_column(String(128))
    routing_reason: Mapped[str] = mapped_column(Text, default="")
    exit_code: Mapped[int | None] = mapped_column(Integer)
    nodes: Mapped[list[str] | None] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, onupdate=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    ended_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    cancel_requested_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    dispatch_attempts: Mapped[int] = mapped_column(Integer, default=0)
    # Arrays and sweeps (gateway/flows): the set this job is a task of, and its index there.
    job_set_id: Mapped[str | None] = mapped_column(String(36), ForeignKey("job_set.id", ondelete="RESTRICT"))
    array_index: Mapped[int | None] = mapped_column(Integer)
    next_attempt_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # The dispatch worker holding the claim while ``dispatching`` (its liveness lock's key,
    # gateway/dispatch/liveness.py); NULL: unknown (SQLite, an older gateway): the lease decides.
    claim_owner: Mapped[int | None] = mapped_column(Integer)
    # A pending job's planned start from the last dispatch round (docs/dispatch.md,
    # "Reservations and backfill"); NULL start with a reason when there is none.
    estimated_start: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    estimated_pool: Mapped[str | None] = mapped_column(String(POOL_NAME_LEN))
    estimate_reason: Mapped[str | None] = mapped_column(Text)
    # A job resuming another's checkpoints (resume_from): the first job of that chain, whose
    # checkpoint directory it uses (docs/storage.md). NULL: the job's own (checkpoint_lineage).
    lineage: Mapped[str | None] = mapped_column(String(36))
    # The current attempt (1, then 2, ... after each retry; docs/recovery.md). Ended attempts
    # are rows of job_attempt.
    attempt: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    # Whether the current attempt runs on borrowed GPUs (beyond every guarantee of its account
    # chain: preemptible by work within a guarantee), decided at its claim; NULL before one.
    borrowed: Mapped[bool | None] = mapped_column(Boolean)
    # When the job last reported a committed checkpoint in its current attempt (POST
    # /v1/jobs/{id}/checkpoints); NULL: never, so all its run time is at risk.
    checkpoint_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # The backend's own reservation the current attempt runs in (an advance reservation the
    # gateway made there, docs/planning.md), set at its claim; NULL: the pool's open capacity.
    backend_reservation: Mapped[str | None] = mapped_column(String(80))

    @property
    def checkpoint_lineage(self) -> str:
        """The job whose checkpoint directory this job uses: its resume_from chain's first, or itself."""
        return self.lineage or self.id

    @validates("state")
    def _validate_state(self, _key: str, value: str) -> str:
        target = JobState(value)
        current = JobState(self.state) if self.state is not None else None
        if current is not target:
            check_transition(current, target)
        return target.value

    @property
    def job_state(self) -> JobState:
        return JobState(self.state)


class JobEvent(Base):
    """Append-only history of a job: every state change and notable decision."""

    __tablename__ = "job_event"
    __table_args__ = (Index("ix_job_event_job", "job_id", "id"),)

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(String(36), ForeignKey("job.id", ondelete="CASCADE"))
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    actor: Mapped[str] = mapped_column(String(255))  # principal subject or "system:<component>"
    kind: Mapped[str] = mapped_column(String(32))  # "state" or an info kind ("routing", ...)
    from_state: Mapped[str | None] = mapped_column(String(STATE_LEN))
    to_state: Mapped[str | None] = mapped_column(String(STATE_LEN))
    reason: Mapped[str] = mapped_column(Text, default="")
    data: Mapped[dict[str, Any] | None] = mapped_column(JSON)


class JobAttempt(Base):
    """An attempt at a job that ended and was run again (docs/recovery.md): where it ran,
    why it ended, what its run was charged. The current attempt is the job itself."""

    __tablename__ = "job_attempt"

    job_id: Mapped[str] = mapped_column(String(36), ForeignKey("job.id", ondelete="CASCADE"), primary_key=True)
    number: Mapped[int] = mapped_column(Integer, primary_key=True)
    pool: Mapped[str | None] = mapped_column(String(POOL_NAME_LEN))
    backend_job_id: Mapped[str | None] = mapped_column(String(128))
    nodes: Mapped[list[str] | None] = mapped_column(JSON)
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    ended_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    outcome: Mapped[str] = mapped_column(String(32))  # why it ended: node_failure | exit_code | preempted
    exit_code: Mapped[int | None] = mapped_column(Integer)
    reason: Mapped[str] = mapped_column(Text, default="")
    charged_gpu_seconds: Mapped[int] = mapped_column(BigInteger, default=0)


class JobPreemption(Base):
    """One attempt of a job that the gateway chose to stop so that work within a guarantee
    can start (docs/recovery.md, "Reclaim"): who for, the deadline, what was sent when."""

    __tablename__ = "job_preemption"
    __table_args__ = (Index("ix_job_preemption_ended", "ended_at"),
                      Index("ix_job_preemption_chosen", "chosen_at"))

    job_id: Mapped[str] = mapped_column(String(36), ForeignKey("job.id", ondelete="CASCADE"), primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    pool: Mapped[str] = mapped_column(String(POOL_NAME_LEN))
    preemptor_id: Mapped[str | None] = mapped_column(String(36), ForeignKey("job.id", ondelete="SET NULL"))
    preemptor_account: Mapped[str] = mapped_column(String(63))
    gpus: Mapped[int] = mapped_column(Integer)
    gpu_hours_at_risk: Mapped[float] = mapped_column(Float)
    reason: Mapped[str] = mapped_column(Text)
    chosen_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    deadline: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    signalled_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    stopped_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))  # the backend was told to stop it
    ended_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))  # the attempt ended


class GatewaySecret(Base):
    """Secrets the gateway makes itself and every process shares (e.g. the key that signs the
    job-scoped checkpoint credentials): made once, by whichever process needs one first."""

    __tablename__ = "gateway_secret"

    name: Mapped[str] = mapped_column(String(63), primary_key=True)
    value: Mapped[str] = mapped_column(String(255))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class IdempotencyKey(Base):
    """``Idempotency-Key`` of a submission, scoped to the caller."""

    __tablename__ = "idempotency_key"
    __table_args__ = (UniqueConstraint("subject", "key", name="uq_idempotency_key_subject_key"),
                      # A caller's keys of the last day, counted (up to the cap) at each keyed submit.
                      Index("ix_idempotency_key_subject_created", "subject", "created_at"))

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    subject: Mapped[str] = mapped_column(String(255))
    key: Mapped[str] = mapped_column(String(255))
    request_hash: Mapped[str] = mapped_column(String(64))
    job_id: Mapped[str] = mapped_column(String(36), ForeignKey("job.id", ondelete="CASCADE"))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class WaitingCount(Base):
    """How many jobs of an account and POSIX user wait to start (``WAITING_STATES`` of
    gateway/jobs/service.py), kept by triggers on ``job`` in the same transaction as each
    change (migration 0014waiting). The submission caps read it instead of counting jobs."""

    __tablename__ = "waiting_count"
    __table_args__ = (Index("ix_waiting_count_username", "username"),)

    account_name: Mapped[str] = mapped_column(String(63), primary_key=True)
    username: Mapped[str] = mapped_column(String(32), primary_key=True)
    n: Mapped[int] = mapped_column(Integer, server_default=text("0"))


# The job table's foreign key to job_set needs that table in the same metadata.
from gateway.models import flows as _flows_models  # noqa: E402,F401
