"""Queries over jobs. Tenancy is enforced here, once: ``readable_jobs``."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Select, and_, or_, select
from sqlalchemy.orm import Session

from gateway.identity.principal import Principal
from gateway.models.jobs import IdempotencyKey, Job, JobEvent


def readable_jobs(principal: Principal) -> Select[tuple[Job]]:
    """Every job this caller may see: admins all, others their accounts' jobs."""
    stmt = select(Job)
    if not principal.is_admin:
        stmt = stmt.where(Job.account_name.in_(sorted(principal.accounts)))
    return stmt


def get_readable(session: Session, principal: Principal, job_id: str, *, for_update: bool = False) -> Job | None:
    stmt = readable_jobs(principal).where(Job.id == job_id)
    if for_update:
        stmt = stmt.with_for_update()
    return session.scalars(stmt).first()


def get_for_update(session: Session, job_id: str) -> Job | None:
    """One job, locked, whoever may read it: for a caller the middleware has already bound to
    this very job (its job credential, gateway/jobs/checkpoints.py)."""
    return session.get(Job, job_id, with_for_update=True)


def list_readable(session: Session, principal: Principal, *, states: Sequence[str] = (),
                  account: str | None = None, pool: str | None = None,
                  after_id: str | None = None, limit: int = 50, job_set: str | None = None) -> list[Job]:
    stmt = readable_jobs(principal)
    if job_set:
        stmt = stmt.where(Job.job_set_id == job_set)
    if states:
        stmt = stmt.where(Job.state.in_(list(states)))
    if account:
        stmt = stmt.where(Job.account_name == account)
    if pool:
        stmt = stmt.where(or_(Job.pool == pool, and_(Job.pool.is_(None), Job.requested_pool == pool)))
    if after_id:
        stmt = stmt.where(Job.id < after_id)
    return list(session.scalars(stmt.order_by(Job.id.desc()).limit(limit)))


def list_events(session: Session, job_id: str, *, after_id: int = 0, limit: int = 500) -> list[JobEvent]:
    stmt = (select(JobEvent).where(JobEvent.job_id == job_id, JobEvent.id > after_id)
            .order_by(JobEvent.id).limit(limit))
    return list(session.scalars(stmt))


def get_idempotency(session: Session, subject: str, key: str) -> IdempotencyKey | None:
    return session.scalars(select(IdempotencyKey).where(
        IdempotencyKey.subject == subject, IdempotencyKey.key == key)).first()


def is_final(session: Session, job_id: str, final_states) -> bool:
    """Whether the job has reached one of ``final_states`` (read fresh: a log follow polls it)."""
    return session.scalar(select(Job.state).where(Job.id == job_id)) in final_states


def waiting_per_pool(session: Session, states: Sequence[str]) -> dict[str, int]:
    """How many jobs wait in ``states`` per pool: the pool they were routed to, else the one
    they asked for (``auto`` for the unrouted)."""
    from sqlalchemy import func

    where = func.coalesce(Job.pool, Job.requested_pool)
    return dict(session.execute(select(where, func.count()).where(Job.state.in_(list(states))).group_by(where)).all())
